//! Storage of the graph root, one part per file:
//! - here: the handle (`Graph`), its opens, and reads at a commit;
//! - `init`: first-start creation, once however many processes start;
//! - `compat`: what a start checks against the graph it opens;
//! - `evolve`: the schema plan, what changed and how it is classed (pure);
//! - `migrate`: applying a plan (columns, new tables, the schema commit);
//! - `layout`: the shard layout and the schema record written at init;
//! - `manifest`: the `__manifest` commit log (head, immutable commits,
//!   table versions), the publish compare-and-swap, the dead-letter mark.
//!
//! Imports only layouts (`schema`) and plain types: it folds nothing, owns
//! no writer and knows no policy.

mod compat;
pub(crate) mod evolve;
mod init;
mod layout;
mod manifest;
mod migrate;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use lance::Dataset;

use crate::config::Config;
use crate::error::{Context, Error, PublicResult, Result};
use crate::schema::{GraphSchema, MANIFEST_TABLE};
use crate::store::Store;

pub(crate) use compat::{refusal, SchemaPlan};
use layout::shard_layout;
pub(crate) use layout::ShardLayout;
pub(crate) use manifest::scan;
pub use manifest::{new_commit_id, FoldedShard, GraphCommit, SchemaChange, TableStats};

/// An open graph root.
#[derive(Clone)]
pub struct Graph {
    root: String,
    store: Store,
    pub(crate) schema: Arc<GraphSchema>,
    /// The mode, the shards of each MemWAL table (graph types and
    /// `_ingest_rejects`, as the graph was created with), and the topics'
    /// partition counts under `partition`.
    pub(crate) layout: Arc<ShardLayout>,
    /// The schema version `schema` is (0: the one the graph was created
    /// with; each schema commit adds one).
    pub(crate) schema_version: u32,
    /// A schema change the config asks for and the graph takes, not yet
    /// applied: `schema` is then still the graph's own, for the fold to
    /// quiescence that comes first (`fold::migrate`), and `evolve` applies it.
    pub(crate) evolving: Option<Arc<Evolution>>,
}

/// A schema change waiting to be applied.
#[derive(Debug)]
pub(crate) struct Evolution {
    /// The config's schema.
    pub(crate) schema: GraphSchema,
    pub(crate) plan: SchemaPlan,
    /// The shard layout the config asks for (new tables' counts, and under
    /// `partition` new topics' partition counts).
    pub(crate) layout: ShardLayout,
}

impl Graph {
    /// Opens the graph, creating it on first start; refuses an incompatible
    /// one. Under `wal.sharding = "partition"` a new graph needs its
    /// topics' partition counts: see `open_or_init_with`.
    pub async fn open_or_init(config: &Config, schema: GraphSchema) -> PublicResult<Graph> {
        Graph::open_or_init_with(config, schema, None).await
    }

    /// `open_or_init`, with the mapped topics' partition counts (topic →
    /// count) as the broker reports them, which partition sharding fixes
    /// at creation and checks at every start.
    pub async fn open_or_init_with(
        config: &Config,
        schema: GraphSchema,
        partitions: Option<&BTreeMap<String, u32>>,
    ) -> PublicResult<Graph> {
        let layout = shard_layout(config, &schema, partitions)?;
        // Debug of the options shows harmless values only (no credentials).
        tracing::info!(root = %config.root_uri(), storage_options = ?config.graph.storage_options, sharding = layout.sharding.as_str(), "opening graph");
        let mut graph = Graph {
            root: config.root_uri(),
            store: Store::new(&config.graph.storage_options),
            schema: Arc::new(schema),
            layout: Arc::new(layout),
            schema_version: 0,
            evolving: None,
        };
        match graph.open_manifest().await {
            Ok(_) => graph.check_compatible(config).await?,
            Err(e) if is_not_found(&e) => graph.init_once(config).await?,
            Err(e) => return Err(e.into()),
        }
        graph.adopt_record().await?;
        Ok(graph)
    }

    /// The schema change this graph waits to apply, if any.
    pub fn pending_plan(&self) -> Option<&SchemaPlan> {
        self.evolving.as_ref().map(|e| &e.plan)
    }

    /// The schema version the graph is at.
    pub fn schema_version(&self) -> u32 {
        self.schema_version
    }

    /// How this graph's tables are sharded.
    pub fn layout(&self) -> &ShardLayout {
        &self.layout
    }

    /// Opens an existing graph for reading (log, show) without a schema file.
    pub async fn open_readonly(root: String, store: Store) -> PublicResult<Graph> {
        let graph = Graph {
            root,
            store,
            schema: Arc::new(GraphSchema {
                types: vec![],
                source: String::new(),
            }),
            layout: Default::default(),
            schema_version: 0,
            evolving: None,
        };
        let mut graph = graph;
        graph.open_manifest().await.map_err(|e| {
            if is_not_found(&e) {
                Error::config(format!("no graph at {} (run graphsink first)", graph.root))
            } else {
                e
            }
        })?;
        graph.adopt_record().await?;
        Ok(graph)
    }

    /// Opens the existing graph a config names, for reading.
    pub async fn open_configured(config: &Config) -> PublicResult<Graph> {
        Graph::open_readonly(config.root_uri(), Store::new(&config.graph.storage_options)).await
    }

    /// The schema the graph was opened with (empty for `open_readonly`).
    pub fn schema(&self) -> &GraphSchema {
        &self.schema
    }

    pub fn root(&self) -> &str {
        &self.root
    }

    /// How the root's object store is reached.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Tables with MemWAL shards, in fold order: nodes, edges, rejects.
    pub fn wal_tables(&self) -> Vec<String> {
        self.schema.wal_tables()
    }

    pub fn table_uri(&self, table: &str) -> String {
        format!("{}/{}", self.root, table)
    }

    pub async fn open_table(&self, table: &str, version: Option<u64>) -> PublicResult<Dataset> {
        let uri = self.table_uri(table);
        let ds = self.store.open(&uri).await.ctx(format!("open {uri}"))?;
        Ok(match version {
            Some(v) if v != ds.version().version => ds
                .checkout_version(v)
                .await
                .ctx(format!("open {uri} at version {v}"))?,
            _ => ds,
        })
    }

    async fn open_manifest(&self) -> Result<Dataset> {
        Ok(self.open_table(MANIFEST_TABLE, None).await?)
    }
}

fn is_not_found(e: &Error) -> bool {
    matches!(e, Error::Lance { source, .. } if is_lance_not_found(source))
}

fn is_lance_not_found(e: &lance::Error) -> bool {
    matches!(
        e,
        lance::Error::DatasetNotFound { .. } | lance::Error::NotFound { .. }
    )
}

/// `table` at the version `commit` pins. A version that retention removed
/// is `CommitExpired`, not Lance's not-found.
pub(crate) async fn open_pinned(
    graph: &Graph,
    commit: &GraphCommit,
    table: &str,
) -> Result<Dataset> {
    let version = *commit
        .tables
        .get(table)
        .ok_or_else(|| Error::NotFound(format!("table {table} in graph commit {}", commit.id)))?;
    graph
        .open_table(table, Some(version))
        .await
        .map_err(|e| match Error::from(e) {
            Error::Lance { source, .. } if is_version_gone(&source) => Error::CommitExpired {
                commit: commit.id.clone(),
                table: table.to_string(),
                version,
            },
            e => e,
        })
}

fn is_version_gone(e: &lance::Error) -> bool {
    is_lance_not_found(e) || matches!(e, lance::Error::VersionNotFound { .. })
}

/// Row counts of every table at a commit (for `graphsink show`).
pub async fn row_counts(
    graph: &Graph,
    commit: &GraphCommit,
) -> PublicResult<HashMap<String, usize>> {
    let mut out = HashMap::new();
    for table in commit.tables.keys() {
        let ds = open_pinned(graph, commit, table).await?;
        out.insert(table.clone(), ds.count_rows(None).await.ctx(table)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[tokio::test]
    async fn an_unknown_commit_id_is_not_found_not_bad_config() {
        let dir = tempfile::tempdir().unwrap();
        let toml = r#"
[graph]
root = "g"
schema = "x.pg"
[kafka]
"bootstrap.servers" = "127.0.0.1:1"
"group.id" = "g"
[[mapping]]
topic = "t"
node = "P"
"#;
        let cfg = Config::from_toml(toml, dir.path()).unwrap();
        let schema = GraphSchema::parse("node P { name: String @key }", "x.pg").unwrap();
        let g = Graph::open_or_init(&cfg, schema).await.unwrap();
        let head = g.head().await.unwrap();
        assert_eq!(g.commit(&head.id).await.unwrap(), head);
        let e = g.commit("nope").await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    }
}
