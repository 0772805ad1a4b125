//! Dead-letter re-delivery: the fold rejects of published commits that a
//! crash between a publish and its dead-letter produce left undelivered.
//! Finding them is the fold's (it knows which commits rejected what);
//! producing them is `kafka::DeadLetters`'.

use crate::error::Result;
use crate::graph::{Graph, GraphCommit};
use crate::kafka::DeadLetters;
use crate::rejects::{self, Reject};
use crate::schema::REJECTS_TABLE;
use crate::types::PartitionOffsets;

/// Fold rejects a crash kept from the dead-letter topic go out first.
/// Returns the newest commit whose fold rejects are all delivered.
pub(crate) async fn redeliver(
    graph: &Graph,
    dead_letters: &DeadLetters,
    shutdown: &tokio_util::sync::CancellationToken,
) -> Result<u64> {
    // First fence whichever folder came before (its open transaction is
    // aborted): what the read-back then finds is final.
    dead_letters.fence_older_folders();
    let Undelivered {
        head_seq: delivered,
        rejects: late,
        since,
    } = undelivered(graph).await?;
    if !late.is_empty() {
        tracing::warn!(
            rejects = late.len(),
            "re-delivering fold rejects of published commits"
        );
        dead_letters.deliver(&late, Some(&since), shutdown).await?;
        graph.set_dead_letters_delivered(delivered).await?;
    }
    Ok(delivered)
}

/// Fold rejects not yet on the dead-letter topic.
#[derive(Debug, Default)]
pub(crate) struct Undelivered {
    /// The head's seq: the delivery mark once `rejects` are produced.
    pub head_seq: u64,
    /// By `reject_id`.
    pub rejects: Vec<Reject>,
    /// Dead-letter offsets from before the oldest of their commits was
    /// published: whatever of them a crashed folder produced is past these.
    pub since: PartitionOffsets,
}

/// Fold rejects of published commits newer than the head's delivery mark.
pub(crate) async fn undelivered(graph: &Graph) -> Result<Undelivered> {
    let head = graph.head().await?;
    let mark = graph.dead_letters_delivered().await?;
    let none = Undelivered {
        head_seq: head.seq,
        ..Default::default()
    };
    if head.seq <= mark {
        return Ok(none);
    }
    let commits: Vec<GraphCommit> = graph
        .commits()
        .await?
        .into_iter()
        .filter(|c| c.seq > mark)
        .filter(|c| c.stats.values().any(|s| s.rejected > 0))
        .collect();
    if commits.is_empty() {
        return Ok(none);
    }
    let ds = graph
        .open_table(REJECTS_TABLE, head.tables.get(REJECTS_TABLE).copied())
        .await?;
    let ids: Vec<String> = commits.iter().map(|c| format!("'{}'", c.id)).collect();
    let filter = format!("stage = 'fold' AND graph_commit IN ({})", ids.join(", "));
    let batches = crate::graph::scan(&ds, Some(&filter), None).await?;
    let mut out = Vec::new();
    for b in &batches {
        out.extend(rejects::from_batch(b)?);
    }
    out.sort_by(|a, b| a.reject_id.cmp(&b.reject_id));
    // Newest first: the last is the oldest commit, and its bound holds
    // for every later one.
    let since = commits
        .last()
        .map(|c| c.dead_letter_since.clone())
        .unwrap_or_default();
    Ok(Undelivered {
        head_seq: head.seq,
        rejects: out,
        since,
    })
}
