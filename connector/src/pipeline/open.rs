//! Opening a session: the graph under the config's schema (a schema change
//! the config brings is applied before any writer opens), recovery, the
//! shard writers and the decoders.

use std::collections::HashMap;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::from_registry;
use super::role::FoldRole;
use crate::config::{Config, Evolve, Sharding};
use crate::decode::RecordDecoder;
use crate::error::Result;
use crate::fold::{self, Policies};
use crate::graph::Graph;
use crate::kafka::DeadLetters;
use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::retention;
use crate::schema::GraphSchema;
use crate::shards::ShardPool;

/// The graph, at the config's schema, and the fold's policies. Under
/// bucket sharding an interrupted fold is rolled forward here; under
/// partition sharding only the member holding the fold partition recovers,
/// when it becomes that member (the fold task).
pub(super) async fn graph(config: &Config) -> Result<(Graph, Policies)> {
    let schema = GraphSchema::load(&config.schema_path())?;
    let schema = match config.graph.evolve {
        Evolve::FromRegistry => from_registry::schema(config, schema).await?,
        _ => schema,
    };
    let partitions = match config.wal.sharding {
        Sharding::Partition => Some(crate::kafka::partition_counts(config).await?),
        Sharding::Bucket => None,
    };
    let graph = Graph::open_or_init_with(config, schema, partitions.as_ref()).await?;
    let policies = Policies::from_config(config);
    // Boxed: its future nests a whole fold, too deep to inline here.
    let migrating = fold::migrate(&graph, &policies, &config.wal, &config.graph.actor);
    let graph = match Box::pin(migrating).await? {
        Some(m) => m.graph,
        None => graph,
    };
    if graph.layout().sharding != Sharding::Partition {
        fold::recover(&graph, &policies).await?;
    }
    Ok((graph, policies))
}

/// The shard writers of a session and what comes with them.
pub(super) struct Writers {
    pub(super) pool: ShardPool,
    /// Under partition sharding: this member's role (who folds).
    pub(super) role: Option<FoldRole>,
    /// The newest commit whose fold rejects are on the dead-letter topic.
    pub(super) delivered: u64,
    pub(super) retention: Option<retention::Scheduled>,
}

/// Opens the shard writers. Under bucket sharding this process claims
/// every shard, after re-delivering the fold rejects a crash kept from the
/// dead-letter topic; under partition sharding shards are claimed as the
/// group assigns their partitions (`RunLoop::on_group_event`).
pub(super) async fn writers(
    config: &Config,
    graph: &Graph,
    dead_letters: &DeadLetters,
    shutdown: &CancellationToken,
) -> Result<Writers> {
    let (pool, delivered, role) = if graph.layout().sharding == Sharding::Partition {
        let pool = ShardPool::open_unclaimed(graph, &config.wal, &graph.wal_tables()).await?;
        (pool, 0, Some(FoldRole::new(config, graph)))
    } else {
        let delivered = fold::redeliver(graph, dead_letters, shutdown).await?;
        let pool = ShardPool::open(graph, &config.wal, &graph.wal_tables()).await?;
        (pool, delivered, None)
    };
    let retention = retention::Scheduled::new(&config.retention, pool.live_shards());
    Ok(Writers {
        pool,
        role,
        delivered,
        retention,
    })
}

/// What the run loop decodes with: a decoder per mapped topic, and the
/// registry client when a mapping uses a registry format. Built before any
/// shard is claimed, so a mapping the graph cannot take stops the start
/// before it fences anyone.
pub(super) struct Decoding {
    pub(super) decoders: HashMap<String, RecordDecoder>,
    pub(super) registry: Option<Registry>,
}

pub(super) fn decoding(config: &Config, graph: &Graph, metrics: &Arc<Metrics>) -> Result<Decoding> {
    let decoders = decoders(config, graph)?;
    let registry = config
        .mappings
        .iter()
        .any(|m| m.format.uses_registry())
        .then(|| Registry::new(&config.schema_registry))
        .transpose()?
        .map(|r| r.metered(metrics.clone()));
    Ok(Decoding { decoders, registry })
}

/// One decoder per mapped topic.
fn decoders(config: &Config, graph: &Graph) -> Result<HashMap<String, RecordDecoder>> {
    let mut decoders = HashMap::new();
    for m in &config.mappings {
        let decoder = RecordDecoder::new(
            &graph.schema,
            m,
            config.wal.max_poll_records,
            config.errors.max_record_bytes,
        )?
        .partition_keyed(
            graph.layout().sharding == Sharding::Partition,
            config
                .wal
                .partitioner
                .zip(graph.layout().partitions.get(&m.topic).map(|&n| n as i32)),
        );
        decoders.insert(m.topic.clone(), decoder);
    }
    Ok(decoders)
}
