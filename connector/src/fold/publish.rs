//! Publish: one graph commit per fold, a compare-and-swap on the graph head
//! in `__manifest`. A lost race against a head that did not move (another
//! write to `__manifest`, such as its compaction) is retried; a head that
//! moved to another commit is reported, so `execute` re-checks the fold
//! against the new parent before it rebases (see `execute`).

use std::collections::BTreeMap;

use super::plan::FoldPlan;
use super::write::{Outcomes, COMPACT_FRAGMENTS};
use crate::error::{Error, Result};
use crate::graph::{FoldedShard, Graph, GraphCommit};
use crate::offsets::WrittenSpans;
use crate::types::OffsetRange;

const PUBLISH_ATTEMPTS: usize = 8;

/// How a publish attempt ended.
#[derive(Debug)]
pub(crate) enum Published {
    /// The fold's commit is the head (now, or before a crash).
    Done(GraphCommit),
    /// The head is neither the commit the fold was checked against nor the
    /// fold's own: the checks must be re-run against it before a rebase.
    Moved(GraphCommit),
}

/// Publishes the fold's commit on top of `checked_on`, the commit whose
/// tables the fold's checks read.
pub(crate) async fn publish(
    graph: &Graph,
    plan: &FoldPlan,
    outcomes: &Outcomes,
    checked_on: &str,
) -> Result<Published> {
    let mut last_err = None;
    for attempt in 0..PUBLISH_ATTEMPTS {
        let head = graph.head().await?;
        if head.id == plan.commit_id {
            return Ok(Published::Done(head)); // published before a crash
        }
        if head.schema_version != graph.schema_version() {
            // A member with a newer schema changed the graph (and fenced
            // this one's writers): nothing of this fold may land under it.
            return Err(graph.schema_moved(head.schema_version));
        }
        if head.id != checked_on {
            return Ok(Published::Moved(head));
        }
        let commit = commit_on(plan, outcomes, &head);
        match graph.publish(&commit).await {
            Ok(()) => {
                tracing::info!(commit = %commit.id, seq = commit.seq, "published graph commit");
                // Reading the head scans __manifest: keep its fragments few.
                if let Err(e) = graph.compact_manifest(COMPACT_FRAGMENTS).await {
                    tracing::warn!(error = %e, "could not compact __manifest; the next fold retries");
                }
                return Ok(Published::Done(commit));
            }
            Err(e @ Error::CommitConflict { .. }) => {
                tracing::info!(error = %e, "publish lost a race; retrying from the new head");
                last_err = Some(e);
                tokio::time::sleep(std::time::Duration::from_millis(20 << attempt.min(5))).await;
            }
            Err(e) => return Err(e),
        }
    }
    Err(last_err.expect("at least one attempt"))
}

/// The fold's graph commit as a child of `head`: the head's tables, with
/// the fold's versions where it wrote.
pub(crate) fn commit_on(plan: &FoldPlan, outcomes: &Outcomes, head: &GraphCommit) -> GraphCommit {
    let mut tables = head.tables.clone();
    for (t, o) in outcomes {
        let v = tables.entry(t.clone()).or_insert(o.version);
        *v = (*v).max(o.version);
    }
    let folded = plan
        .tables
        .iter()
        .flat_map(|tp| {
            tp.shards.iter().map(|s| FoldedShard {
                table: tp.table.clone(),
                bucket: s.bucket,
                shard: s.shard,
                after_generation: s.after,
                upto_generation: s.upto,
            })
        })
        .collect();
    GraphCommit {
        id: plan.commit_id.clone(),
        seq: head.seq + 1,
        parent: Some(head.id.clone()),
        actor: plan.actor.clone(),
        created_at: plan.created_at,
        tables,
        folded,
        offsets: merged_offsets(plan, outcomes),
        stats: outcomes
            .iter()
            .map(|(t, o)| (t.clone(), o.stats))
            .collect::<BTreeMap<_, _>>(),
        dead_letters_delivered: plan.dead_letters_delivered,
        folder: plan.folder.clone(),
        dead_letter_since: plan.dead_letter_since.clone(),
        schema_version: head.schema_version,
        schema_change: None,
    }
}

/// The plan's written spans united with the folded rows' provenance.
fn merged_offsets(plan: &FoldPlan, outcomes: &Outcomes) -> Vec<OffsetRange> {
    let mut spans = WrittenSpans::default();
    for r in plan
        .offsets
        .iter()
        .chain(outcomes.values().flat_map(|o| o.offsets.iter()))
    {
        spans.record(&r.topic, r.partition, r.first);
        spans.record(&r.topic, r.partition, r.last);
    }
    spans.ranges()
}
