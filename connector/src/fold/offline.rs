//! The offline fold (`graphsink fold`): one fold outside a running
//! connector. It fences a running connector's writers; the CLI refuses
//! while the consumer group has members unless `--force`.

use super::{execute, plan, Policies};
use crate::error::PublicResult;
use crate::graph::{Graph, GraphCommit};
use crate::offsets::WrittenSpans;
use crate::shards;

/// Claims every shard (replaying its WAL), closes it so everything durable
/// is flushed, then folds all flushed generations.
pub async fn fold_offline(
    graph: &Graph,
    policies: &Policies,
    wal: &crate::config::WalSettings,
    actor: &str,
) -> PublicResult<Option<GraphCommit>> {
    super::recover(graph, policies).await?;
    let pool = shards::ShardPool::open(graph, wal, &graph.wal_tables()).await?;
    pool.close().await?;
    let head = graph.head().await?;
    // Its fold rejects reach the dead-letter topic when the connector next
    // starts (`undelivered`): this tool has no producer.
    match plan(
        graph,
        policies,
        &head,
        &None,
        &WrittenSpans::default(),
        actor,
    )
    .await?
    {
        Some(p) => execute(graph, policies, &p).await.map(|f| Some(f.commit)),
        None => Ok(None),
    }
}
