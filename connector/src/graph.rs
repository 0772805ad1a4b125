//! Storage of the graph root: opening tables, first-start init,
//! compatibility checks, and the `__manifest` commit log (head, immutable
//! commits, table versions). Publishing is a compare-and-swap on the head.
//! Imports only layouts (`schema`) and plain types: it folds nothing, owns
//! no writer and knows no policy.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{
    Array, ArrayRef, Int64Array, RecordBatch, RecordBatchIterator, StringArray,
    TimestampMillisecondArray, UInt64Array,
};
use arrow_schema::Schema;
use futures::TryStreamExt;
use lance::dataset::mem_wal::DatasetMemWalExt;
use lance::dataset::{MergeInsertBuilder, WhenMatched, WhenNotMatched, WriteMode};
use lance::Dataset;
use serde::{Deserialize, Serialize};

use crate::config::{Config, Sharding};
use crate::error::{Context, Error, Result};
use crate::known_ids::KnownIds;
use crate::schema::{
    manifest_schema, same_columns, GraphSchema, TableLayout, MANIFEST_PK, MANIFEST_TABLE,
    REJECTS_TABLE, SRC_PARTITION,
};
use crate::store::Store;
pub use crate::types::OffsetRange;
use crate::types::{now_ms, PartitionOffsets};

const HEAD_ID: &str = "graph_head:main";
const SCHEMA_ID: &str = "graph_schema";
/// Newest commit whose fold rejects all reached the dead-letter topic.
const DELIVERED_ID: &str = "dead_letters:main";

/// One published graph commit: a version of every table, and what the fold
/// that produced it folded.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GraphCommit {
    pub id: String,
    pub seq: u64,
    pub parent: Option<String>,
    pub actor: String,
    /// Milliseconds since the Unix epoch.
    pub created_at: i64,
    /// Table path → pinned Lance version (every table of the graph).
    pub tables: BTreeMap<String, u64>,
    #[serde(default)]
    pub folded: Vec<FoldedShard>,
    #[serde(default)]
    pub offsets: Vec<OffsetRange>,
    #[serde(default)]
    pub stats: BTreeMap<String, TableStats>,
    /// Newest commit (seq) whose fold rejects all reached the dead-letter topic.
    #[serde(default)]
    pub dead_letters_delivered: u64,
    /// The process that folded it (`<host> pid <pid>`): with several
    /// members, which one folded (`graphsink status`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub folder: Option<String>,
    /// Dead-letter offsets known before this commit was published: every
    /// produce of its fold rejects lands at or past them, so a re-delivery
    /// reads from here to skip what a crashed folder already produced.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub dead_letter_since: PartitionOffsets,
}

/// Generations `(after, upto]` of one shard merged by a commit.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FoldedShard {
    pub table: String,
    pub bucket: u32,
    pub shard: uuid::Uuid,
    pub after_generation: u64,
    pub upto_generation: u64,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct TableStats {
    pub upserted: u64,
    pub deleted: u64,
    /// Rows this commit refused at fold time (fold rejects).
    #[serde(default)]
    pub rejected: u64,
}

/// Schema facts recorded at init, so later starts can explain a mismatch.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SchemaRecord {
    source: String,
    /// Shards per MemWAL table.
    buckets: BTreeMap<String, u32>,
    /// Absent in graphs from before partition sharding: `bucket`.
    #[serde(default)]
    sharding: Sharding,
    /// Under `partition`: each mapped topic's partition count at creation.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    partitions: BTreeMap<String, u32>,
}

/// How a graph's MemWAL tables are sharded, fixed at its creation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardLayout {
    pub sharding: Sharding,
    /// Shards N per MemWAL table path (graph types and `_ingest_rejects`).
    pub counts: BTreeMap<String, u32>,
    /// Under `partition`: partition count per mapped topic. The rejects
    /// table has one shard per (topic, partition), topics in name order.
    pub partitions: BTreeMap<String, u32>,
}

impl ShardLayout {
    /// Under `partition`: the rejects shard of `(topic, partition)`.
    pub fn source_shard(&self, topic: &str, partition: i32) -> Option<u32> {
        let mut base = 0;
        for (t, &n) in &self.partitions {
            if t == topic {
                return u32::try_from(partition)
                    .ok()
                    .filter(|&p| p < n)
                    .map(|p| base + p);
            }
            base += n;
        }
        None
    }

    /// Under `partition`: the (topic, partition) of rejects shard `shard`.
    pub fn shard_source(&self, shard: u32) -> Option<(&str, i32)> {
        let mut base = 0;
        for (t, &n) in &self.partitions {
            if shard < base + n {
                return Some((t.as_str(), (shard - base) as i32));
            }
            base += n;
        }
        None
    }
}

/// An open graph root.
#[derive(Clone)]
pub struct Graph {
    root: String,
    store: Store,
    pub(crate) schema: Arc<GraphSchema>,
    /// Buckets N per MemWAL table path (graph types and `_ingest_rejects`),
    /// as the graph was created with.
    pub(crate) buckets: BTreeMap<String, u32>,
    /// The mode, and the topics' partition counts under `partition`.
    pub(crate) layout: Arc<ShardLayout>,
    /// Node ids the fold keeps between folds (shared by clones).
    pub(crate) known_ids: Arc<KnownIds>,
}

impl Graph {
    /// Opens the graph, creating it on first start; refuses an incompatible
    /// one. Under `wal.sharding = "partition"` a new graph needs its
    /// topics' partition counts: see `open_or_init_with`.
    pub async fn open_or_init(config: &Config, schema: GraphSchema) -> Result<Graph> {
        Graph::open_or_init_with(config, schema, None).await
    }

    /// `open_or_init`, with the mapped topics' partition counts (topic →
    /// count) as the broker reports them, which partition sharding fixes
    /// at creation and checks at every start.
    pub async fn open_or_init_with(
        config: &Config,
        schema: GraphSchema,
        partitions: Option<&BTreeMap<String, u32>>,
    ) -> Result<Graph> {
        let layout = shard_layout(config, &schema, partitions)?;
        // Debug of the options shows harmless values only (no credentials).
        tracing::info!(root = %config.root_uri(), storage_options = ?config.graph.storage_options, sharding = layout.sharding.as_str(), "opening graph");
        let mut graph = Graph {
            root: config.root_uri(),
            store: Store::new(&config.graph.storage_options),
            schema: Arc::new(schema),
            buckets: layout.counts.clone(),
            layout: Arc::new(layout),
            known_ids: Arc::new(KnownIds::new(config.fold.known_ids_max)),
        };
        match graph.open_manifest().await {
            Ok(_) => graph.check_compatible().await?,
            Err(e) if is_not_found(&e) => graph.init_once().await?,
            Err(e) => return Err(e),
        }
        graph.adopt_record().await?;
        Ok(graph)
    }

    /// Takes the shard layout from the stored schema record: what the
    /// graph was created with is what routing and folds must follow.
    async fn adopt_record(&mut self) -> Result<()> {
        let Some(record) = self.record().await? else {
            return Ok(());
        };
        self.buckets = record.buckets.clone();
        self.layout = Arc::new(ShardLayout {
            sharding: record.sharding,
            counts: record.buckets,
            partitions: record.partitions,
        });
        Ok(())
    }

    /// The schema record written at init (absent only in a graph whose
    /// init is not finished, which has no `__manifest` either).
    async fn record(&self) -> Result<Option<SchemaRecord>> {
        let ds = self.open_manifest().await?;
        let rows = read_rows(&ds, &format!("object_id = '{SCHEMA_ID}'")).await?;
        let Some(payload) = rows.first().and_then(|r| r.payload.as_deref()) else {
            return Ok(None);
        };
        serde_json::from_str(payload)
            .map(Some)
            .map_err(|e| Error::Corrupt(format!("{}: schema record: {e}", self.root)))
    }

    /// How this graph's tables are sharded.
    pub fn layout(&self) -> &ShardLayout {
        &self.layout
    }

    /// Initialises a new graph once, however many processes start on it
    /// together. Two Lance creates racing on one path do not both fail:
    /// the loser's lands as an overwrite at the next version and drops what
    /// the winner built (its MemWAL index). So a process first claims the
    /// root with an atomic create of `_graphsink_init/<n>`; the one that
    /// gets it initialises, the others wait for its `__manifest` and open
    /// it. A claim older than `INIT_WAIT` with no manifest is a claimant
    /// that died: the next claim number takes over (init is idempotent).
    async fn init_once(&self) -> Result<()> {
        const INIT_WAIT: Duration = Duration::from_secs(60);
        let me = new_commit_id();
        for n in 0u32.. {
            let claim = format!("{}/_graphsink_init/{n}", self.root);
            if self
                .store
                .create_if_absent(&claim, me.as_bytes())
                .await
                .ctx(format!("claim {claim}"))?
            {
                return self.init().await;
            }
            loop {
                match self.open_manifest().await {
                    Ok(_) => {
                        tracing::info!(root = %self.root, "another process initialised the graph; using it");
                        return self.check_compatible().await;
                    }
                    Err(e) if is_not_found(&e) => {}
                    Err(e) => return Err(e),
                }
                match self.store.age(&claim).await.ctx(format!("read {claim}"))? {
                    Some(age) if age < INIT_WAIT => {
                        tokio::time::sleep(Duration::from_millis(200)).await
                    }
                    _ => {
                        tracing::warn!(root = %self.root, %claim, "a claim to initialise the graph is older than {INIT_WAIT:?} with no graph: its process died; taking over");
                        break;
                    }
                }
            }
        }
        unreachable!("claim numbers do not run out")
    }

    /// Opens an existing graph for reading (log, show) without a schema file.
    pub async fn open_readonly(root: String, store: Store) -> Result<Graph> {
        let graph = Graph {
            root,
            store,
            schema: Arc::new(GraphSchema {
                types: vec![],
                source: String::new(),
            }),
            buckets: BTreeMap::new(),
            layout: Default::default(),
            known_ids: Arc::new(KnownIds::new(0)),
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
    pub async fn open_configured(config: &Config) -> Result<Graph> {
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

    pub async fn open_table(&self, table: &str, version: Option<u64>) -> Result<Dataset> {
        let uri = self.table_uri(table);
        let ds = self.store.open(&uri).await.ctx(format!("open {uri}"))?;
        match version {
            Some(v) if v != ds.version().version => ds
                .checkout_version(v)
                .await
                .ctx(format!("open {uri} at version {v}")),
            _ => Ok(ds),
        }
    }

    async fn open_manifest(&self) -> Result<Dataset> {
        self.open_table(MANIFEST_TABLE, None).await
    }

    /// Creates tables, MemWAL and shard manifests, then the init commit.
    /// Each step tolerates having run before, so a crash mid-init is redone
    /// on the next start; `__manifest` is written last and marks completion.
    async fn init(&self) -> Result<()> {
        if self.layout.sharding == Sharding::Partition && self.layout.partitions.is_empty() {
            return Err(Error::config(format!(
                "no graph at {} yet, and creating one with wal.sharding = \"partition\" needs \
                 the mapped topics' partition counts: start it with graphsink run",
                self.root
            )));
        }
        tracing::info!(root = %self.root, sharding = self.layout.sharding.as_str(), "initialising graph");
        let mut tables = BTreeMap::new();
        for layout in self.schema.tables() {
            let n = self.buckets.get(&layout.name).copied();
            let ds = self.init_table(&layout, n).await?;
            tables.insert(layout.name, ds.version().version);
        }
        let record = SchemaRecord {
            source: self.schema.source.clone(),
            buckets: self.buckets.clone(),
            sharding: self.layout.sharding,
            partitions: self.layout.partitions.clone(),
        };
        let commit = GraphCommit {
            id: new_commit_id(),
            seq: 0,
            parent: None,
            actor: "graphsink init".into(),
            created_at: now_ms(),
            tables,
            folded: vec![],
            offsets: vec![],
            stats: BTreeMap::new(),
            dead_letters_delivered: 0,
            folder: None,
            dead_letter_since: PartitionOffsets::new(),
        };
        let mut rows = ManifestRows::default();
        rows.push_commit(&commit);
        rows.push(ManifestRow {
            object_id: SCHEMA_ID.into(),
            kind: "graph_schema",
            payload: Some(serde_json::to_string(&record).expect("serializable")),
            ..Default::default()
        });
        let batch = rows.into_batch();
        let schema = batch.schema();
        let uri = self.table_uri(MANIFEST_TABLE);
        let params = self.store.write_params(WriteMode::Create);
        Dataset::write(
            RecordBatchIterator::new(vec![Ok(batch)], schema),
            &uri,
            Some(params),
        )
        .await
        .ctx(format!("create {uri}"))?;
        Ok(())
    }

    /// Creates one table; with `buckets`, also its MemWAL index. Shard
    /// manifests are the writers' (`shards`), created when a pool opens.
    async fn init_table(&self, layout: &TableLayout, buckets: Option<u32>) -> Result<Dataset> {
        let (schema, pk) = (&layout.schema, layout.pk);
        let uri = self.table_uri(&layout.name);
        let mut ds = match self.store.open(&uri).await {
            Ok(ds) => ds,
            Err(e) if is_lance_not_found(&e) => {
                let empty = RecordBatchIterator::new(vec![], schema.clone());
                let params = self.store.write_params(WriteMode::Create);
                Dataset::write(empty, &uri, Some(params))
                    .await
                    .ctx(format!("create {uri}"))?
            }
            Err(e) => return Err(e).ctx(format!("open {uri}")),
        };
        let Some(buckets) = buckets else {
            return Ok(ds);
        };
        if ds.mem_wal_index_details().await.ctx(&uri)?.is_none() {
            // The spec describes the routing to readers; graphsink routes
            // (`shards`). Under `partition` a type's rows go by their source
            // partition (identity; Lance then reports 0 shards, so N is the
            // schema record's), and rejects by their (topic, partition),
            // which no spec expresses: none is recorded for them.
            let builder = ds.initialize_mem_wal();
            let builder = match (self.layout.sharding, layout.name == REJECTS_TABLE) {
                (Sharding::Bucket, _) => builder.bucket_sharding(pk, buckets),
                (Sharding::Partition, false) => builder.identity_sharding(SRC_PARTITION),
                (Sharding::Partition, true) => builder,
            };
            builder
                .execute()
                .await
                .ctx(format!("initialise MemWAL on {uri}"))?;
        }
        Ok(ds)
    }

    /// Refuses a graph whose tables, columns or bucket counts differ from
    /// what the schema and config now ask for.
    async fn check_compatible(&self) -> Result<()> {
        let head = self.head().await?;
        let incompatible = |message: String| Error::Incompatible {
            root: self.root.clone(),
            message,
        };
        let all = self.schema.tables();
        let want: Vec<&str> = all.iter().map(|t| t.name.as_str()).collect();
        let have: Vec<&str> = head.tables.keys().map(String::as_str).collect();
        let mut want_sorted = want.clone();
        want_sorted.sort();
        if want_sorted != have {
            return Err(incompatible(format!(
                "schema declares tables [{}] but the graph has [{}]",
                want_sorted.join(", "),
                have.join(", ")
            )));
        }
        for TableLayout {
            name: table,
            schema,
            ..
        } in &all
        {
            let ds = self.open_table(table, Some(head.tables[table])).await?;
            let actual: Schema = ds.schema().into();
            same_columns(schema, &actual)
                .map_err(|m| incompatible(format!("{table}: schema wants {m}")))?;
            if self.buckets.contains_key(table)
                && ds.mem_wal_index_details().await.ctx(table)?.is_none()
            {
                return Err(incompatible(format!("{table} has no MemWAL")));
            }
        }
        let Some(record) = self.record().await? else {
            return Ok(());
        };
        let want = &self.layout;
        if record.sharding != want.sharding {
            return Err(incompatible(format!(
                "the graph was created with wal.sharding = \"{}\", config asks for \"{}\"",
                record.sharding.as_str(),
                want.sharding.as_str()
            )));
        }
        if record.sharding == Sharding::Partition {
            for (topic, &n) in &want.partitions {
                match record.partitions.get(topic) {
                    Some(&was) if was == n => {}
                    Some(&was) => return Err(incompatible(format!(
                        "topic {topic} had {was} partitions when the graph was created and has {n} now; \
                         under partition sharding a topic's partitions are its shards and cannot change"
                    ))),
                    None => return Err(incompatible(format!(
                        "topic {topic} was not mapped when the graph was created (topics: {}); \
                         under partition sharding the mapped topics are fixed at creation",
                        record.partitions.keys().cloned().collect::<Vec<_>>().join(", ")
                    ))),
                }
            }
            // With the broker's counts (a run), the config must also map
            // every recorded topic: a member mapping fewer would be given
            // partition p of one topic without partition p of a topic
            // co-partitioned with it, and claiming shard p would fence the
            // member that holds the other (it stops on the split).
            let missing: Vec<&str> = (record.partitions.keys())
                .filter(|t| !want.partitions.is_empty() && !want.partitions.contains_key(*t))
                .map(String::as_str)
                .collect();
            if !missing.is_empty() {
                return Err(incompatible(format!(
                    "topics [{}] were mapped when the graph was created and are not in this \
                     config; under partition sharding every member maps every topic the graph \
                     was created with (the set is fixed: to drop a topic, create a new graph)",
                    missing.join(", ")
                )));
            }
            return Ok(());
        }
        for (table, &n) in &want.counts {
            match record.buckets.get(table) {
                Some(&was) if was != n => {
                    return Err(incompatible(format!(
                        "{table} was created with {was} buckets, config asks for {n}"
                    )))
                }
                _ => {}
            }
        }
        Ok(())
    }

    pub async fn head(&self) -> Result<GraphCommit> {
        let ds = self.open_manifest().await?;
        self.head_at(&ds).await
    }

    async fn head_at(&self, ds: &Dataset) -> Result<GraphCommit> {
        let head = read_rows(ds, &format!("object_id = '{HEAD_ID}'")).await?;
        let row = head
            .first()
            .ok_or_else(|| Error::Corrupt(format!("{}: no graph head", self.root)))?;
        if row.payload.is_some() {
            return parse_commit(row);
        }
        let id = row
            .commit_id
            .clone()
            .ok_or_else(|| Error::Corrupt(format!("{}: graph head names no commit", self.root)))?;
        self.commit_at(ds, &id).await
    }

    pub async fn commit(&self, id: &str) -> Result<GraphCommit> {
        let ds = self.open_manifest().await?;
        self.commit_at(&ds, id).await
    }

    async fn commit_at(&self, ds: &Dataset, id: &str) -> Result<GraphCommit> {
        let id = id.replace('\'', "");
        let rows = read_rows(ds, &format!("object_id = 'graph_commit:{id}'")).await?;
        let row = rows
            .first()
            .ok_or_else(|| Error::NotFound(format!("graph commit {id}")))?;
        parse_commit(row)
    }

    /// The dead-letter delivery mark: every fold reject of commits up to
    /// this seq was produced.
    pub async fn dead_letters_delivered(&self) -> Result<u64> {
        let ds = self.open_manifest().await?;
        let head = self.head_at(&ds).await?;
        let rows = read_rows(&ds, &format!("object_id = '{DELIVERED_ID}'")).await?;
        let mark = rows
            .first()
            .and_then(|r| r.payload.as_deref())
            .and_then(|p| p.parse::<u64>().ok())
            .unwrap_or(0);
        Ok(mark.max(head.dead_letters_delivered))
    }

    /// Records the delivery mark (not a graph commit: readers never see it).
    pub(crate) async fn set_dead_letters_delivered(&self, seq: u64) -> Result<()> {
        let ds = self.open_manifest().await?;
        let mut rows = ManifestRows::default();
        rows.push(ManifestRow {
            object_id: DELIVERED_ID.into(),
            kind: "dead_letters",
            seq: Some(seq as i64),
            created_at: Some(now_ms()),
            payload: Some(seq.to_string()),
            ..Default::default()
        });
        let batch = rows.into_batch();
        let mut b = MergeInsertBuilder::try_new(Arc::new(ds), vec![MANIFEST_PK.into()])
            .ctx("dead-letter mark")?;
        b.when_matched(WhenMatched::UpdateAll)
            .when_not_matched(WhenNotMatched::InsertAll);
        b.try_build()
            .ctx("dead-letter mark")?
            .execute_reader(RecordBatchIterator::new(
                vec![Ok(batch.clone())],
                batch.schema(),
            ))
            .await
            .ctx("record dead-letter mark")?;
        Ok(())
    }

    /// All commits, newest first.
    pub async fn commits(&self) -> Result<Vec<GraphCommit>> {
        let ds = self.open_manifest().await?;
        let mut out: Vec<GraphCommit> = read_rows(&ds, "kind = 'graph_commit'")
            .await?
            .iter()
            .map(parse_commit)
            .collect::<Result<_>>()?;
        out.sort_by_key(|c| std::cmp::Reverse(c.seq));
        Ok(out)
    }

    /// Publishes `commit` as the new head if the head is still its parent.
    /// Lance's merge-insert runs with no conflict retries, so a publisher
    /// racing on the head row loses with a conflict instead of overwriting.
    pub(crate) async fn publish(&self, commit: &GraphCommit) -> Result<()> {
        let ds = self.open_manifest().await?;
        self.publish_on(ds, commit).await
    }

    /// `publish` against `__manifest` as of `version`, as a publisher that
    /// read the head there would. Lets tests race two publishers exactly
    /// (`testing::publish_from_version`).
    pub(crate) async fn publish_from_version(
        &self,
        version: u64,
        commit: &GraphCommit,
    ) -> Result<()> {
        let ds = self.open_table(MANIFEST_TABLE, Some(version)).await?;
        self.publish_on(ds, commit).await
    }

    /// Merges `__manifest`'s small fragments once there are more than
    /// `over`. Only the fold loop calls it, right after its own publish, so
    /// it never races a publisher of this process; another publisher that
    /// loses to it rebases like any lost race.
    pub(crate) async fn compact_manifest(&self, over: usize) -> Result<()> {
        let mut ds = self.open_manifest().await?;
        if ds.get_fragments().len() <= over {
            return Ok(());
        }
        lance::dataset::optimize::compact_files(
            &mut ds,
            lance::dataset::optimize::CompactionOptions::default(),
            None,
        )
        .await
        .ctx("compact __manifest")?;
        Ok(())
    }

    /// The manifest's current version (`testing::manifest_version`).
    pub(crate) async fn manifest_version(&self) -> Result<u64> {
        Ok(self.open_manifest().await?.version().version)
    }

    async fn publish_on(&self, ds: Dataset, commit: &GraphCommit) -> Result<()> {
        let head = self.head_at(&ds).await?;
        if Some(&head.id) != commit.parent.as_ref() {
            return Err(Error::CommitConflict {
                expected: commit.parent.clone().unwrap_or_default(),
                found: head.id,
            });
        }
        let mut rows = ManifestRows::default();
        rows.push_commit(commit);
        let batch = rows.into_batch();
        let mut b =
            MergeInsertBuilder::try_new(Arc::new(ds), vec![MANIFEST_PK.into()]).ctx("publish")?;
        b.when_matched(WhenMatched::UpdateAll)
            .when_not_matched(WhenNotMatched::InsertAll)
            .conflict_retries(0);
        let job = b.try_build().ctx("publish")?;
        job.execute_reader(RecordBatchIterator::new(
            vec![Ok(batch.clone())],
            batch.schema(),
        ))
        .await
        .map_err(|e| {
            if is_commit_conflict(&e) {
                Error::CommitConflict {
                    expected: head.id.clone(),
                    found: "a concurrent publish".into(),
                }
            } else {
                Error::Lance {
                    context: "publish graph commit".into(),
                    source: e,
                }
            }
        })?;
        Ok(())
    }
}

/// The shard layout a config asks for. Under `partition`, a mapped type's
/// N is its topics' partition count (they must agree: co-partitioned), an
/// unmapped type's 1, and the rejects table has one shard per mapped
/// (topic, partition).
fn shard_layout(
    config: &Config,
    schema: &GraphSchema,
    partitions: Option<&BTreeMap<String, u32>>,
) -> Result<ShardLayout> {
    let mut counts = buckets_per_table(config, schema)?;
    let sharding = config.wal.sharding;
    if sharding == Sharding::Bucket {
        return Ok(ShardLayout {
            sharding,
            counts,
            partitions: BTreeMap::new(),
        });
    }
    let Some(partitions) = partitions else {
        // An existing graph brings its own (`adopt_record`); a new one
        // cannot be created without them (`init` refuses).
        return Ok(ShardLayout {
            sharding,
            counts: BTreeMap::new(),
            partitions: BTreeMap::new(),
        });
    };
    let mut mapped = BTreeMap::new();
    for t in &schema.types {
        counts.insert(t.table.clone(), 1);
    }
    for m in &config.mappings {
        let n = *partitions.get(&m.topic).ok_or_else(|| {
            Error::config(format!(
                "topic {} has no partition count (does it exist?); partition sharding needs \
                 every mapped topic created first, with its final partition count",
                m.topic
            ))
        })?;
        mapped.insert(m.topic.clone(), n);
        let table = &schema.get(m.type_name()).expect("checked above").table;
        let other = config
            .mappings
            .iter()
            .filter(|o| o.type_name() == m.type_name() && o.topic != m.topic)
            .find(|o| partitions.get(&o.topic).is_some_and(|&k| k != n));
        if let Some(o) = other {
            return Err(Error::config(format!(
                "topics {} ({n} partitions) and {} ({} partitions) both feed {}: under partition \
                 sharding they must be co-partitioned (equal partition counts, one key, one \
                 partitioner)",
                m.topic,
                o.topic,
                partitions[&o.topic],
                m.type_name()
            )));
        }
        counts.insert(table.clone(), n);
    }
    counts.insert(
        REJECTS_TABLE.to_string(),
        mapped.values().sum::<u32>().max(1),
    );
    Ok(ShardLayout {
        sharding,
        counts,
        partitions: mapped,
    })
}

fn buckets_per_table(config: &Config, schema: &GraphSchema) -> Result<BTreeMap<String, u32>> {
    let mut out = BTreeMap::new();
    for t in &schema.types {
        out.insert(t.table.clone(), config.buckets_for_type());
    }
    // Rejects are few: one shard keeps their WAL small.
    out.insert(REJECTS_TABLE.to_string(), 1);
    for (i, m) in config.mappings.iter().enumerate() {
        let t = schema.get(m.type_name()).ok_or_else(|| {
            Error::config(format!(
                "mapping[{i}]: type {:?} is not in the schema (types: {})",
                m.type_name(),
                schema
                    .types
                    .iter()
                    .map(|t| t.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
        out.insert(t.table.clone(), config.buckets_for(m));
    }
    Ok(out)
}

pub fn new_commit_id() -> String {
    uuid::Uuid::now_v7().to_string()
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

fn is_commit_conflict(e: &lance::Error) -> bool {
    matches!(
        e,
        lance::Error::CommitConflict { .. }
            | lance::Error::RetryableCommitConflict { .. }
            | lance::Error::TooMuchWriteContention { .. }
    )
}

#[derive(Debug, Default, Clone)]
struct ManifestRow {
    object_id: String,
    kind: &'static str,
    commit_id: Option<String>,
    seq: Option<i64>,
    table_name: Option<String>,
    table_version: Option<u64>,
    created_at: Option<i64>,
    payload: Option<String>,
}

#[derive(Debug, Default)]
struct ManifestRows(Vec<ManifestRow>);

impl ManifestRows {
    fn push(&mut self, r: ManifestRow) {
        self.0.push(r);
    }

    /// The head pointer, the immutable commit row, and one row per table version.
    fn push_commit(&mut self, c: &GraphCommit) {
        let base = ManifestRow {
            commit_id: Some(c.id.clone()),
            seq: Some(c.seq as i64),
            created_at: Some(c.created_at),
            ..Default::default()
        };
        // The head carries a copy of its commit, so reading it is one lookup.
        let payload = Some(serde_json::to_string(c).expect("serializable"));
        self.push(ManifestRow {
            object_id: HEAD_ID.into(),
            kind: "graph_head",
            payload: payload.clone(),
            ..base.clone()
        });
        self.push(ManifestRow {
            object_id: format!("graph_commit:{}", c.id),
            kind: "graph_commit",
            payload,
            ..base.clone()
        });
        for (table, version) in &c.tables {
            self.push(ManifestRow {
                object_id: format!("table_version:{table}:{version}"),
                kind: "table_version",
                table_name: Some(table.clone()),
                table_version: Some(*version),
                ..base.clone()
            });
        }
    }

    fn into_batch(self) -> RecordBatch {
        let r = &self.0;
        let strs = |f: &dyn Fn(&ManifestRow) -> Option<&str>| -> ArrayRef {
            Arc::new(r.iter().map(f).collect::<StringArray>())
        };
        let cols: Vec<ArrayRef> = vec![
            strs(&|x| Some(x.object_id.as_str())),
            strs(&|x| Some(x.kind)),
            strs(&|x| x.commit_id.as_deref()),
            Arc::new(r.iter().map(|x| x.seq).collect::<Int64Array>()),
            strs(&|x| x.table_name.as_deref()),
            Arc::new(r.iter().map(|x| x.table_version).collect::<UInt64Array>()),
            Arc::new(
                r.iter()
                    .map(|x| x.created_at)
                    .collect::<TimestampMillisecondArray>()
                    .with_timezone("UTC"),
            ),
            strs(&|x| x.payload.as_deref()),
        ];
        RecordBatch::try_new(manifest_schema(), cols).expect("manifest columns match")
    }
}

/// Every row of `ds` that passes `filter` (SQL, pushed into the scan),
/// with only `columns` when given.
pub(crate) async fn scan(
    ds: &Dataset,
    filter: Option<&str>,
    columns: Option<&[&str]>,
) -> Result<Vec<RecordBatch>> {
    let what = || format!("scan {} where {}", ds.uri(), filter.unwrap_or("true"));
    let mut scan = ds.scan();
    if let Some(f) = filter {
        scan.filter(f).ctx(what())?;
    }
    if let Some(c) = columns {
        scan.project(c).ctx(what())?;
    }
    scan.try_into_stream()
        .await
        .ctx(what())?
        .try_collect()
        .await
        .ctx(what())
}

async fn read_rows(ds: &Dataset, filter: &str) -> Result<Vec<ManifestRow>> {
    let columns = [MANIFEST_PK, "commit_id", "payload"];
    let batches = scan(ds, Some(filter), Some(&columns)).await?;
    let mut out = Vec::new();
    for b in batches {
        let col = |name: &str| -> Result<&StringArray> {
            b.column_by_name(name)
                .and_then(|c| c.as_any().downcast_ref::<StringArray>())
                .ok_or_else(|| Error::Corrupt(format!("__manifest lacks column {name}")))
        };
        let (ids, commits, payloads) = (col(MANIFEST_PK)?, col("commit_id")?, col("payload")?);
        for i in 0..b.num_rows() {
            let opt = |a: &StringArray| (!a.is_null(i)).then(|| a.value(i).to_string());
            out.push(ManifestRow {
                object_id: ids.value(i).to_string(),
                commit_id: opt(commits),
                payload: opt(payloads),
                ..Default::default()
            });
        }
    }
    Ok(out)
}

fn parse_commit(row: &ManifestRow) -> Result<GraphCommit> {
    let payload = row
        .payload
        .as_deref()
        .ok_or_else(|| Error::Corrupt(format!("{} has no payload", row.object_id)))?;
    serde_json::from_str(payload)
        .map_err(|e| Error::Corrupt(format!("{}: unreadable commit: {e}", row.object_id)))
}

/// `table` at the version `commit` pins. A version that retention removed
/// is `CommitExpired`, not Lance's not-found.
pub async fn open_pinned(graph: &Graph, commit: &GraphCommit, table: &str) -> Result<Dataset> {
    let version = *commit
        .tables
        .get(table)
        .ok_or_else(|| Error::NotFound(format!("table {table} in graph commit {}", commit.id)))?;
    graph
        .open_table(table, Some(version))
        .await
        .map_err(|e| match e {
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
pub async fn row_counts(graph: &Graph, commit: &GraphCommit) -> Result<HashMap<String, usize>> {
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
