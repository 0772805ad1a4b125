//! A schema change, applied by a start with the new schema or by
//! `graphsink migrate`: a fold to quiescence under a claim of every shard,
//! then the tables and the schema commit (`Graph::evolve`). The claim
//! fences every writer still running the old schema; their next start is
//! refused by name (docs/schema-evolution.md, docs/decisions/0009-schema-change-by-quiescence.md).

use std::time::Instant;

use super::{execute, plan, recover, Policies};
use crate::config::WalSettings;
use crate::error::Result;
use crate::graph::{Graph, GraphCommit};
use crate::offsets::WrittenSpans;
use crate::shards;

/// What applying a schema change did.
pub(crate) struct Migrated {
    /// The graph under its new schema.
    pub(crate) graph: Graph,
    pub(crate) commit: GraphCommit,
    /// Folds it took to reach quiescence.
    pub(crate) folds: usize,
    /// How long ingest paused: the whole of this call.
    pub(crate) paused: std::time::Duration,
}

/// Applies the schema change `graph` waits for (`Graph::pending_plan`),
/// `None` when there is none. Rows durable under the old schema are
/// folded first, so no WAL entry or generation is read under the new one.
pub(crate) async fn migrate(
    graph: &Graph,
    policies: &Policies,
    wal: &WalSettings,
    actor: &str,
) -> Result<Option<Migrated>> {
    if graph.pending_plan().is_none() {
        return Ok(None);
    }
    let started = Instant::now();
    recover(graph, policies).await?;
    // Claims every shard (replaying its WAL) and closes it, so everything
    // durable is in flushed generations.
    let pool = shards::ShardPool::open(graph, wal, &graph.wal_tables()).await?;
    pool.close().await?;
    let mut folds = 0;
    loop {
        let head = graph.head().await?;
        let spans = WrittenSpans::default();
        // Its fold rejects reach the dead-letter topic with the next
        // session's re-delivery (`undelivered`), as an offline fold's do.
        match plan(graph, policies, &head, &None, &spans, actor).await? {
            Some(p) => {
                // A plan that only retries deferred edges is the last:
                // they may wait for endpoints that never come.
                let last = p.tables.is_empty();
                execute(graph, policies, &p).await?;
                folds += 1;
                if last {
                    break;
                }
            }
            None => break,
        }
    }
    let (graph, commit) = graph.evolve(actor).await?;
    let paused = started.elapsed();
    let change = commit.schema_change.as_ref().expect("a schema commit");
    tracing::info!(
        event = "schema_evolved", commit = %commit.id, seq = commit.seq,
        version = commit.schema_version, folds, paused_ms = paused.as_millis() as u64,
        "applied {} schema change(s): {}",
        change.changes.len(),
        change.changes.join("; ")
    );
    Ok(Some(Migrated {
        graph,
        commit,
        folds,
        paused,
    }))
}
