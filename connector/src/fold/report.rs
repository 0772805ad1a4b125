//! What the fold loop tells the operator after each fold: the metrics of a
//! published fold (rows per table, rejects, the head, folded offsets,
//! deferred edges per edge type) and its one summary log line.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{oldest_pending, StageTimes};
use crate::error::{Context, Result};
use crate::graph::{Graph, GraphCommit};
use crate::metrics::Metrics;
use crate::rejects::Reject;
use crate::schema::PENDING_PREFIX;

pub(crate) struct Report {
    metrics: Arc<Metrics>,
    /// `_pending/<Edge>` version last counted: an unchanged table is not
    /// read again (most folds leave them alone).
    pending_seen: HashMap<String, u64>,
}

impl Report {
    pub(crate) fn new(metrics: Arc<Metrics>) -> Report {
        Report {
            metrics,
            pending_seen: HashMap::new(),
        }
    }

    pub(crate) fn started(&self) {
        self.metrics.fold_started();
    }

    pub(crate) fn ended(&self, result: &Result<bool>) {
        match result {
            Ok(_) => self.metrics.fold_ended(),
            Err(e) => {
                self.metrics.fold_failed();
                tracing::warn!(event = "fold_failed", error = %e, "fold failed");
            }
        }
    }

    /// A fold was published (its rejects already handed to the dead-letter topic).
    pub(crate) async fn published(
        &mut self,
        graph: &Graph,
        commit: &GraphCommit,
        rejects: &[Reject],
        took: Duration,
        oldest_taken: Option<Instant>,
        stages: &StageTimes,
    ) {
        let m = &self.metrics;
        for r in rejects {
            m.rejected(r.stage.as_str(), r.code.as_str());
        }
        let rows = commit
            .stats
            .iter()
            .map(|(t, s)| (t.clone(), [s.upserted, s.deleted, s.rejected]));
        m.folded(took, oldest_taken, rows);
        m.fold_phases(stages.phases());
        m.head(commit.seq, commit.created_at);
        for r in &commit.offsets {
            m.folded_offset(&(r.topic.clone(), r.partition), r.last + 1);
        }
        let summary: Vec<String> = commit
            .stats
            .iter()
            .map(|(t, s)| format!("{t} +{} -{} !{}", s.upserted, s.deleted, s.rejected))
            .collect();
        tracing::info!(
            event = "folded",
            seq = commit.seq,
            rows = %summary.join(", "),
            rejects = rejects.len(),
            seconds = took.as_secs_f64(),
            cut_s = stages.cut,
            plan_s = stages.plan,
            read_s = stages.read,
            view_s = stages.view,
            check_s = stages.check,
            write_s = stages.write,
            compact_s = stages.compact,
            index_s = stages.index,
            publish_s = stages.publish,
            dead_letters_s = stages.dead_letters,
            "fold published"
        );
        if let Err(e) = self.pending_edges(graph, commit).await {
            tracing::debug!(error = %e, "cannot count deferred edges for metrics");
        }
    }

    /// Deferred edges per edge type at `commit`, reading only the
    /// `_pending/*` tables whose version moved.
    async fn pending_edges(&mut self, graph: &Graph, commit: &GraphCommit) -> Result<()> {
        let pending: BTreeMap<&String, &u64> = commit
            .tables
            .iter()
            .filter(|(t, _)| t.starts_with(PENDING_PREFIX))
            .collect();
        for (table, &version) in pending {
            if self.pending_seen.get(table) == Some(&version) {
                continue;
            }
            let ds = graph.open_table(table, Some(version)).await?;
            let count = ds.count_rows(None).await.ctx(table)?;
            let oldest = if count > 0 {
                oldest_pending(&ds).await?
            } else {
                None
            };
            let edge = table.trim_start_matches(PENDING_PREFIX);
            self.metrics.pending_edges(edge, count as u64, oldest);
            self.pending_seen.insert(table.clone(), version);
        }
        Ok(())
    }
}
