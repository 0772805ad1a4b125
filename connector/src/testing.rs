//! Support for graphsink's own end-to-end tests and benchmark: internals
//! they drive directly (WAL writes without a consumer, a fold of a chosen
//! cut, racing publishers). Not part of the stable API: anything here
//! changes with the internals it exposes.

use crate::error::PublicResult as Result;
use crate::graph::{Graph, GraphCommit};

pub use crate::decode::{Decoded, RecordDecoder, SourceRecord};
pub use crate::failpoints::{arm, disarm, Action as FailpointAction};
pub use crate::fold::{
    execute, fold_offline, plan, FoldPlan, Folded, Policies, StageTimes, COMPACT_FRAGMENTS,
};
pub use crate::graph::new_commit_id;
pub use crate::offsets::WrittenSpans;
pub use crate::registry::wire::framed;
pub use crate::retention::{graph_storage, Window};
pub use crate::shards::{shard_id, ShardPool};

/// A schema change applied as a start applies it (a fold to quiescence,
/// then the schema commit).
pub struct Migration {
    /// The graph under its new schema.
    pub graph: Graph,
    pub commit: GraphCommit,
    /// Folds it took to reach quiescence.
    pub folds: usize,
    /// How long writes paused: the whole migration.
    pub paused: std::time::Duration,
}

/// Applies the schema change `graph` waits for (opened with a config whose
/// schema differs from the graph's), as `run` does at start; `None` when
/// it waits for none.
pub async fn migrate(graph: &Graph, config: &crate::config::Config) -> Result<Option<Migration>> {
    let policies = Policies::from_config(config);
    let m = Box::pin(crate::fold::migrate(
        graph,
        &policies,
        &config.wal,
        &config.graph.actor,
    ))
    .await?;
    Ok(m.map(|m| Migration {
        graph: m.graph,
        commit: m.commit,
        folds: m.folds,
        paused: m.paused,
    }))
}

/// Retention as the fold loop runs it, with `pool`'s writers live (their
/// own manifest stores trim).
pub async fn collect_garbage(
    graph: &Graph,
    window: &Window,
    pool: &ShardPool,
) -> Result<crate::retention::GcReport> {
    Ok(crate::retention::collect(graph, window, &pool.live_shards(), false).await?)
}

/// Publishes `commit` as the new head if the head is still its parent (the
/// compare-and-swap a fold's publish makes).
pub async fn publish(graph: &Graph, commit: &GraphCommit) -> Result<()> {
    Ok(graph.publish(commit).await?)
}

/// `publish` against `__manifest` as of `version`, as a publisher
/// that read the head there would: races two publishers exactly.
pub async fn publish_from_version(graph: &Graph, version: u64, commit: &GraphCommit) -> Result<()> {
    Ok(graph.publish_from_version(version, commit).await?)
}

/// The current version of `__manifest`.
pub async fn manifest_version(graph: &Graph) -> Result<u64> {
    Ok(graph.manifest_version().await?)
}

/// Whether the known ids of `table` (those the folds under `policies`
/// keep) are exactly its rows at their version, each at its row's address
/// (`None`: none kept).
pub async fn known_ids_agree(
    graph: &Graph,
    policies: &Policies,
    table: &str,
) -> Result<Option<bool>> {
    Ok(crate::fold::known_ids_agree(graph, &policies.known_ids, table).await?)
}

/// Swaps the row addresses known for ids `a` and `b` of `table`.
pub fn swap_known_addresses(policies: &Policies, table: &str, a: &str, b: &str) {
    policies.known_ids.swap_addresses(table, a, b)
}

/// The version and size of the ids the folds under `policies` keep for
/// `table`, if any.
pub fn known_ids(policies: &Policies, table: &str) -> Option<(u64, usize)> {
    policies.known_ids.held(table)
}

/// What a fold does to a table's id index (`fold/index.rs`): create it,
/// index new fragments as a delta segment, or merge the segments. For the
/// bench.
pub async fn keep_id_index(
    ds: std::sync::Arc<lance::Dataset>,
) -> Result<std::sync::Arc<lance::Dataset>> {
    Ok(crate::fold::keep_id_index(ds, "bench", Default::default()).await?)
}
