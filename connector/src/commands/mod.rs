//! The operations behind the CLI's commands, as library functions that
//! return plain structs: config check, the offline fold and migration,
//! gc, commit log, snapshots, status, reject selection and replay,
//! reading rows and neighbours, producing sample records. It parses no
//! arguments and prints nothing (`cli` does).

pub(crate) mod produce;
pub(crate) mod read;
pub(crate) mod rejects;
pub(crate) mod status;

use crate::config::Config;
use crate::error::{Error, PublicResult, Result};
use crate::graph::{self, Graph, GraphCommit};
use crate::retention;
pub(crate) use crate::retention::{GcReport, TableGc};
use crate::schema::GraphSchema;

/// What `check` found valid.
#[derive(Debug, Clone)]
pub struct CheckSummary {
    pub mappings: usize,
    pub types: usize,
    pub root: String,
    /// Against an existing graph: what changed since its recorded schema
    /// (all allowed, or `check` fails naming the refused ones).
    pub plan: graph::SchemaPlan,
}

/// Validates the config and the schema: every mapping must build its
/// decoder, and a registry format's subject must resolve to its type.
pub async fn check(config: &Config) -> PublicResult<CheckSummary> {
    let schema = load_schema(config).await?;
    for m in &config.mappings {
        crate::decode::RecordDecoder::new(&schema, m, 1, config.errors.max_record_bytes)?;
    }
    check_subjects(config, &schema).await?;
    let plan = match Graph::open_configured(config).await.map_err(Error::from) {
        Ok(g) => g.schema_plan(&schema).await?,
        // No graph yet: the first run creates it from this schema.
        Err(Error::Config(_)) => graph::SchemaPlan::default(),
        Err(e) => return Err(e.into()),
    };
    // What graphsink applies at all (`run` under `evolve = "none"`
    // leaves it to `graphsink migrate`).
    let refused = plan.refused(crate::config::Evolve::Additive);
    if !refused.is_empty() {
        return Err(graph::refusal(&config.root_uri(), &refused).into());
    }
    Ok(CheckSummary {
        mappings: config.mappings.len(),
        types: schema.types.len(),
        root: config.root_uri(),
        plan,
    })
}

/// The schema a start runs with: the config's `.pg`, and under
/// `evolve = "from_registry"` the properties the registry adds.
async fn load_schema(config: &Config) -> Result<GraphSchema> {
    let schema = GraphSchema::load(&config.schema_path())?;
    match config.graph.evolve {
        crate::config::Evolve::FromRegistry => {
            crate::pipeline::from_registry::schema(config, schema).await
        }
        _ => Ok(schema),
    }
}

/// Each registry-format mapping's subject (TopicNameStrategy:
/// `<topic>-value`) must resolve, at its latest version, to the mapping's
/// type, or the config is refused naming the topic, the field and why. A
/// registry that cannot be asked, or a subject with no schema yet, is a
/// WARN: records are then checked as they come.
async fn check_subjects(config: &Config, schema: &GraphSchema) -> Result<()> {
    use crate::registry::{Lookup, Registry};
    let mappings: Vec<_> = config
        .mappings
        .iter()
        .filter(|m| m.format.uses_registry())
        .collect();
    if mappings.is_empty() {
        return Ok(());
    }
    let registry = Registry::new(&config.schema_registry)?;
    for m in mappings {
        let subject = format!("{}-value", m.topic);
        let latest = match registry.version(&subject, "latest").await {
            Ok(v) => v,
            Err(Lookup::NotFound(why)) => {
                tracing::warn!(topic = %m.topic, %subject, "the registry has no schema for the subject yet ({why}); records are checked as they come");
                continue;
            }
            Err(Lookup::Unavailable(why)) => {
                tracing::warn!(topic = %m.topic, %subject, "cannot read the subject from the schema registry ({why}); records are checked as they come");
                continue;
            }
        };
        let mut d =
            crate::decode::RecordDecoder::new(schema, m, 1, config.errors.max_record_bytes)?;
        let learned = match registry.with_imports(latest.schema.clone()).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(topic = %m.topic, %subject, "cannot read the schemas the subject imports ({e}); records are checked as they come");
                continue;
            }
        };
        d.learn(latest.id, Ok(learned));
        if let Some((code, why)) = d.refusal(latest.id) {
            return Err(Error::config(format!(
                "topic {}: the latest schema of subject {subject} (version {}, id {}) cannot be read as {} ({}): {why}",
                m.topic,
                latest.version,
                latest.id,
                m.type_name(),
                code.as_str()
            )));
        }
    }
    Ok(())
}

/// Refuses an offline fold while the config's consumer group has members:
/// the fold claims every shard, which fences their writers. A broker that
/// cannot be asked is a WARN, not a refusal: the offline fold is also the
/// tool for when Kafka is down.
pub(crate) async fn refuse_if_members(config: &Config) -> Result<()> {
    let members = match crate::kafka::OffsetQueries::connect(config) {
        Ok(q) => q.members().await,
        Err(e) => Err(e),
    };
    match members {
        Ok(g) if !g.members.is_empty() => {
            let names: Vec<String> = g
                .members
                .iter()
                .map(|m| format!("{} on {}", m.client_id, m.host))
                .collect();
            Err(Error::config(format!(
                "consumer group {} has {} member(s) ({}): graphsink fold claims every shard and \
                 would fence their writers. Stop them first (a member that died leaves the group \
                 after session.timeout.ms), or pass --force",
                config
                    .kafka
                    .get("group.id")
                    .map(String::as_str)
                    .unwrap_or_default(),
                g.members.len(),
                names.join(", ")
            )))
        }
        Ok(_) => Ok(()),
        Err(e) => {
            tracing::warn!(error = %e, "cannot list the consumer group's members; folding anyway (a running member's writers would be fenced)");
            Ok(())
        }
    }
}

/// Folds everything durable into one graph commit, offline; `None` when
/// there was nothing to fold.
pub async fn fold_offline(config: &Config) -> PublicResult<Option<GraphCommit>> {
    let schema = GraphSchema::load(&config.schema_path())?;
    let graph = Graph::open_or_init(config, schema).await?;
    let policies = crate::fold::Policies::from_config(config);
    crate::fold::fold_offline(&graph, &policies, &config.wal, &config.graph.actor).await
}

/// Collects garbage now by the config's `[retention]` window (whether or
/// not the fold loop's retention is enabled); with `dry_run`, deletes
/// nothing and reports what it would delete. Safe against a running
/// connector: it claims no shard (docs/retention.md).
pub async fn gc(config: &Config, dry_run: bool) -> PublicResult<GcReport> {
    let graph = Graph::open_configured(config).await?;
    let window = (&config.retention).into();
    Ok(retention::collect(&graph, &window, &Default::default(), dry_run).await?)
}

/// What `graphsink migrate` did, or with `dry_run` would do.
#[derive(Debug, Clone)]
pub struct MigrateReport {
    /// Every change, in plan order (empty: nothing to migrate).
    pub plan: graph::SchemaPlan,
    /// The schema version the graph is at now.
    pub version: u32,
    /// The schema commit, unless a dry run or nothing to do.
    pub applied: Option<GraphCommit>,
    /// Folds it took to reach quiescence first.
    pub folds: usize,
    /// How long the graph took no writes.
    pub paused: std::time::Duration,
}

/// Applies the config's schema change to the graph offline, as a start
/// does (a fold to quiescence, then the schema commit), whatever
/// `[graph] evolve` says; with `dry_run`, only the plan. It claims every
/// shard: the CLI refuses while the group has members unless `--force`.
pub async fn migrate(config: &Config, dry_run: bool) -> PublicResult<MigrateReport> {
    Graph::open_configured(config).await?; // an existing graph, not a new one
    let mut config = config.clone();
    let schema = load_schema(&config).await?;
    if config.graph.evolve == crate::config::Evolve::None {
        config.graph.evolve = crate::config::Evolve::Additive;
    }
    let partitions = match config.wal.sharding {
        crate::config::Sharding::Partition => Some(crate::kafka::partition_counts(&config).await?),
        crate::config::Sharding::Bucket => None,
    };
    let graph = Graph::open_or_init_with(&config, schema, partitions.as_ref()).await?;
    let plan = graph.pending_plan().cloned().unwrap_or_default();
    let mut report = MigrateReport {
        plan,
        version: graph.schema_version(),
        applied: None,
        folds: 0,
        paused: Default::default(),
    };
    if dry_run {
        return Ok(report);
    }
    let policies = crate::fold::Policies::from_config(&config);
    if let Some(m) = Box::pin(crate::fold::migrate(
        &graph,
        &policies,
        &config.wal,
        &config.graph.actor,
    ))
    .await?
    {
        report.version = m.graph.schema_version();
        report.applied = Some(m.commit);
        report.folds = m.folds;
        report.paused = m.paused;
    }
    Ok(report)
}

/// Graph commits, newest first, at most `limit`.
pub async fn commits(config: &Config, limit: usize) -> PublicResult<Vec<GraphCommit>> {
    let graph = Graph::open_configured(config).await?;
    Ok(graph.commits().await?.into_iter().take(limit).collect())
}

/// One table of a snapshot.
#[derive(Debug, Clone)]
pub struct TableRows {
    pub table: String,
    pub version: u64,
    pub rows: usize,
}

/// Row counts per table at one commit.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub commit: GraphCommit,
    /// In the commit's table order.
    pub tables: Vec<TableRows>,
}

/// Row counts per table at the head, or at `commit`.
pub async fn snapshot(config: &Config, commit: Option<&str>) -> PublicResult<Snapshot> {
    let graph = Graph::open_configured(config).await?;
    let commit = match commit {
        Some(id) => graph.commit(id).await?,
        None => graph.head().await?,
    };
    let counts = graph::row_counts(&graph, &commit).await?;
    let tables = commit
        .tables
        .iter()
        .map(|(table, &version)| TableRows {
            table: table.clone(),
            version,
            rows: counts.get(table).copied().unwrap_or(0),
        })
        .collect();
    Ok(Snapshot { commit, tables })
}
