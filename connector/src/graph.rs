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

use crate::config::Config;
use crate::error::{Context, Error, Result};
use crate::known_ids::KnownIds;
use crate::schema::{
    manifest_schema, same_columns, GraphSchema, TableLayout, MANIFEST_PK, MANIFEST_TABLE,
    REJECTS_TABLE,
};
use crate::store::Store;
use crate::types::now_ms;
pub use crate::types::OffsetRange;

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
    buckets: BTreeMap<String, u32>,
}

/// An open graph root.
#[derive(Clone)]
pub struct Graph {
    root: String,
    store: Store,
    pub(crate) schema: Arc<GraphSchema>,
    /// Buckets N per MemWAL table path (graph types and `_ingest_rejects`).
    pub(crate) buckets: BTreeMap<String, u32>,
    /// Node ids the fold keeps between folds (shared by clones).
    pub(crate) known_ids: Arc<KnownIds>,
}

impl Graph {
    /// Opens the graph, creating it on first start; refuses an incompatible one.
    pub async fn open_or_init(config: &Config, schema: GraphSchema) -> Result<Graph> {
        let buckets = buckets_per_table(config, &schema)?;
        // Debug of the options shows harmless values only (no credentials).
        tracing::info!(root = %config.root_uri(), storage_options = ?config.graph.storage_options, "opening graph");
        let graph = Graph {
            root: config.root_uri(),
            store: Store::new(&config.graph.storage_options),
            schema: Arc::new(schema),
            buckets,
            known_ids: Arc::new(KnownIds::new(config.fold.known_ids_max)),
        };
        match graph.open_manifest().await {
            Ok(_) => graph.check_compatible().await?,
            Err(e) if is_not_found(&e) => graph.init_once().await?,
            Err(e) => return Err(e),
        }
        Ok(graph)
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
            known_ids: Arc::new(KnownIds::new(0)),
        };
        graph.open_manifest().await.map_err(|e| {
            if is_not_found(&e) {
                Error::config(format!("no graph at {} (run graphsink first)", graph.root))
            } else {
                e
            }
        })?;
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
        tracing::info!(root = %self.root, "initialising graph");
        let mut tables = BTreeMap::new();
        for layout in self.schema.tables() {
            let n = self.buckets.get(&layout.name).copied();
            let ds = self.init_table(&layout, n).await?;
            tables.insert(layout.name, ds.version().version);
        }
        let record = SchemaRecord {
            source: self.schema.source.clone(),
            buckets: self.buckets.clone(),
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
            ds.initialize_mem_wal()
                .bucket_sharding(pk, buckets)
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
            let Some(&n) = self.buckets.get(table) else {
                continue;
            };
            let details = ds
                .mem_wal_index_details()
                .await
                .ctx(table)?
                .ok_or_else(|| incompatible(format!("{table} has no MemWAL")))?;
            if details.num_shards != n {
                return Err(incompatible(format!(
                    "{table} was created with {} buckets, config asks for {n}",
                    details.num_shards
                )));
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

fn buckets_per_table(config: &Config, schema: &GraphSchema) -> Result<BTreeMap<String, u32>> {
    let mut out = BTreeMap::new();
    for t in &schema.types {
        out.insert(t.table.clone(), config.wal.buckets);
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
