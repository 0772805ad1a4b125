//! Shards: deterministic shard ids, routing rows with Lance's own sharding
//! spec, and the pool of one `ShardWriter` per (table, bucket). Does not
//! decide when anything is acknowledged; it hands back durability watchers.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow::array::{Array, AsArray, Int32Array, RecordBatch, StringArray, UInt32Array};
use arrow::datatypes::Int32Type;
use lance::dataset::mem_wal::{
    evaluate_sharding_spec, BatchDurableWatcher, DatasetMemWalExt, FreezeFence, ShardManifestStore,
    ShardWriter, ShardWriterConfig, WalTailer,
};
use lance::Dataset;
use lance_index::mem_wal::{MemWalIndexDetails, ShardManifest, ShardingSpec};
use uuid::Uuid;

use crate::config::{Sharding, WalSettings};
use crate::error::{Context, Error, Result};
use crate::graph::{Graph, ShardLayout};
use crate::schema::{REJECTS_TABLE, SRC_PARTITION};

/// Shards N of a MemWAL table, as the graph was created with.
pub(crate) fn shard_count(graph: &Graph, table: &str) -> Result<u32> {
    graph
        .buckets
        .get(table)
        .copied()
        .ok_or_else(|| Error::Corrupt(format!("{table}: no shard count in the schema record")))
}

/// Namespace of graphsink's name-based shard ids.
const SHARD_NAMESPACE: Uuid = Uuid::from_u128(0x6772_6170_6873_696e_6b00_0000_0000_0001);
const MANIFEST_SCAN_BATCH: usize = 2;

/// The shard id of `bucket` of `table`: the same on every machine and start,
/// so a key keeps its shard for life (README, Guarantees: one key, one
/// shard).
pub fn shard_id(table: &str, bucket: u32) -> Uuid {
    Uuid::new_v5(
        &SHARD_NAMESPACE,
        format!("graphsink:{table}:{bucket}").as_bytes(),
    )
}

pub(crate) async fn manifest_store(ds: &Dataset, shard: Uuid) -> Result<ShardManifestStore> {
    let store = ds.object_store(None).await.ctx("object store")?;
    Ok(ShardManifestStore::new(
        store,
        &ds.branch_location().path,
        shard,
        MANIFEST_SCAN_BATCH,
    ))
}

/// Records each shard's bucket in its manifest before any writer opens it.
async fn initialize_shards(ds: &Dataset, table: &str, buckets: u32) -> Result<()> {
    for b in 0..buckets {
        let id = shard_id(table, b);
        let store = manifest_store(ds, id).await?;
        if store.latest().await.ctx(table)?.is_none() {
            let values = HashMap::from([("bucket".to_string(), (b as i32).to_le_bytes().to_vec())]);
            store
                .initialize_shard(1, values)
                .await
                .ctx(format!("initialise shard {b} of {table}"))?;
        }
    }
    Ok(())
}

/// `_mem_wal/<shard>/` of a table, as its object store names it (MemWAL's
/// layout: `wal/`, `manifest/`, and one `<8hex>_gen_<g>/` per generation).
pub(crate) fn shard_dir(ds: &Dataset, shard: Uuid) -> object_store::path::Path {
    ds.branch_location()
        .path
        .join("_mem_wal")
        .join(shard.as_hyphenated().to_string().as_str())
}

/// The latest manifest of a shard as stored (not a writer's cached view).
pub(crate) async fn latest_manifest(ds: &Dataset, shard: Uuid) -> Result<Option<ShardManifest>> {
    manifest_store(ds, shard)
        .await?
        .refresh_latest()
        .await
        .ctx(format!("read manifest of shard {shard}"))
}

/// The compacted generation marker of each shard of a table version: the
/// fold writes it, the planner and retention read it.
pub(crate) async fn compacted_markers(ds: &Dataset) -> Result<HashMap<Uuid, u64>> {
    let details = ds.mem_wal_index_details().await.ctx(ds.uri())?;
    Ok(details.as_ref().map(markers_of).unwrap_or_default())
}

/// The compacted generation marker of each shard in a MemWAL index's details.
pub(crate) fn markers_of(details: &MemWalIndexDetails) -> HashMap<Uuid, u64> {
    details
        .compacted_sstables
        .iter()
        .map(|c| (c.shard_id, c.generation))
        .collect()
}

/// What is durable in the MemWAL tier but not in the published graph.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unfolded {
    /// Flushed generations past the head's compacted markers.
    pub generations: usize,
    /// Shards with rows in WAL entries past their replay mark (a live
    /// memtable, or a crashed writer's, that no flush has covered yet).
    pub wal_shards: usize,
}

impl Unfolded {
    pub(crate) fn is_empty(&self) -> bool {
        self.generations == 0 && self.wal_shards == 0
    }
}

/// Everything durable the head commit has not folded, over every shard of
/// every table it pins. WAL entries are read with Lance's `WalTailer` (no
/// claim, nothing written); a fence sentinel has no rows and does not count.
pub(crate) async fn unfolded(graph: &Graph) -> Result<Unfolded> {
    let head = graph.head().await?;
    let mut out = Unfolded::default();
    for (table, &version) in &head.tables {
        let ds = graph.open_table(table, Some(version)).await?;
        let Some(details) = ds.mem_wal_index_details().await.ctx(table)? else {
            continue;
        };
        let markers = markers_of(&details);
        let store = ds.object_store(None).await.ctx("object store")?;
        for bucket in 0..shard_count(graph, table)? {
            let shard = shard_id(table, bucket);
            let Some(m) = latest_manifest(&ds, shard).await? else {
                continue;
            };
            let upto = markers.get(&shard).copied().unwrap_or(0);
            out.generations += m.sstables.iter().filter(|g| g.generation > upto).count();
            let tail = WalTailer::new(store.clone(), ds.branch_location().path, shard);
            let end = tail
                .next_position()
                .await
                .ctx(format!("WAL tip of {shard}"))?;
            for pos in m.replay_after_wal_entry_position + 1..end {
                let entry = tail.read_entry(pos).await.ctx(format!("WAL of {shard}"))?;
                if entry.is_some_and(|e| e.batches.iter().any(|b| b.num_rows() > 0)) {
                    out.wal_shards += 1;
                    break;
                }
            }
        }
    }
    Ok(out)
}

/// Who claimed a shard last, as that process noted it beside the graph
/// (`_graphsink_owners/<shard>.json`): MemWAL's manifest keeps the epoch
/// but not who holds it, and tansu's group description names no member's
/// host or partitions. A note whose epoch is not the manifest's is stale.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ShardOwner {
    pub epoch: u64,
    /// `<host> pid <pid>` of the claiming process.
    pub holder: String,
    /// Epoch ms of the claim.
    pub claimed_at: i64,
}

fn owner_uri(graph: &Graph, shard: Uuid) -> String {
    format!("{}/_graphsink_owners/{shard}.json", graph.root())
}

/// This process as a shard owner names it.
pub fn holder() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into the buffer.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let host = match ok {
        true => String::from_utf8_lossy(&buf[..end]).into_owned(),
        false => "unknown-host".to_string(),
    };
    format!("{host} pid {}", std::process::id())
}

/// Notes this process as the claimant of each `(shard, epoch)`, all at
/// once. Informational (`status`), so a failure is logged, not fatal, and
/// a slow store cannot hold a session's start for more than a few seconds.
async fn note_owners(graph: &Graph, claimed: &[(Uuid, u64)]) {
    const BOUND: std::time::Duration = std::time::Duration::from_secs(5);
    let (me, at) = (holder(), crate::types::now_ms());
    let writes = claimed.iter().map(|&(shard, epoch)| {
        let owner = ShardOwner {
            epoch,
            holder: me.clone(),
            claimed_at: at,
        };
        let body = serde_json::to_vec(&owner).expect("serializable");
        async move {
            if let Err(e) = graph.store().put(&owner_uri(graph, shard), &body).await {
                tracing::warn!(%shard, error = %e, "could not note this process as the shard's claimant");
            }
        }
    });
    if tokio::time::timeout(BOUND, futures::future::join_all(writes))
        .await
        .is_err()
    {
        tracing::warn!(
            "shard claimant notes not written within {BOUND:?}; status may not name this process"
        );
    }
}

/// The last owner note of `shard`, if any (and readable).
pub(crate) async fn shard_owner(graph: &Graph, shard: Uuid) -> Result<Option<ShardOwner>> {
    let uri = owner_uri(graph, shard);
    let got = graph.store().get(&uri).await.ctx(format!("read {uri}"))?;
    Ok(got.and_then(|b| serde_json::from_slice(&b).ok()))
}

/// One open writer and where it belongs.
pub struct Shard {
    pub table: String,
    pub bucket: u32,
    pub writer: Arc<ShardWriter>,
}

/// How a table's rows find their shard.
enum Router {
    /// `bucket(id, N)`, by Lance's own sharding spec.
    Spec {
        spec: ShardingSpec,
        lance_schema: lance_core::datatypes::Schema,
    },
    /// The row's source partition (`partition` sharding of a type table).
    Partition,
    /// The row's (topic, partition), numbered by the layout (`partition`
    /// sharding of the rejects table).
    Source(Arc<ShardLayout>),
}

/// The writers of one table plus what routing needs.
pub struct TableShards {
    pub table: String,
    router: Router,
    /// The primary-key column each put is sorted by (see `route`).
    pk: Option<String>,
    /// Shards N, as the graph was created with.
    n: u32,
    /// The writers this process holds, by bucket.
    pub shards: BTreeMap<u32, Shard>,
}

/// A live writer's own manifest store and epoch: what lets another task
/// (retention) commit to the shard manifest without fencing the writer.
#[derive(Clone)]
pub struct LiveShard {
    pub store: Arc<ShardManifestStore>,
    pub epoch: u64,
}

/// The live shards of a process, by shard id (empty in offline tools).
pub(crate) type LiveShards = HashMap<Uuid, LiveShard>;

/// Every writer this process holds, by table.
pub struct ShardPool {
    pub tables: BTreeMap<String, TableShards>,
    graph: Graph,
    wal: WalSettings,
    /// Writers of revoked partitions, kept until the assignment that ends
    /// the rebalance: an eager rebalance revokes everything and often
    /// assigns the same partitions back, which then reuse their writer
    /// instead of fencing it (and failing its in-flight acks).
    parked: BTreeMap<(String, u32), Shard>,
}

/// One writer's memory and flush count (for metrics).
pub struct MemtableSample {
    pub table: String,
    pub bucket: u32,
    /// Rows of the active memtable.
    pub rows: u64,
    /// Resident bytes of the active and frozen memtables.
    pub bytes: u64,
    /// Memtable flushes to generations since the writer opened.
    pub flushes: u64,
}

/// What a freeze left to fold in one shard: generations up to `upto`.
pub struct FrozenShard {
    pub table: String,
    pub bucket: u32,
    pub shard: Uuid,
    pub upto_generation: u64,
    pub fence: FreezeFence,
}

impl ShardPool {
    /// Opens (claims) a writer for every bucket of every table. Opening
    /// replays the shard's WAL under a new epoch, fencing any older writer.
    pub async fn open(graph: &Graph, wal: &WalSettings, tables: &[String]) -> Result<ShardPool> {
        let mut pool = ShardPool::open_unclaimed(graph, wal, tables).await?;
        let all: Vec<(String, u32)> = pool
            .tables
            .values()
            .flat_map(|t| (0..t.n).map(|b| (t.table.clone(), b)))
            .collect();
        pool.claim(&all).await?;
        Ok(pool)
    }

    /// The pool of `tables` with no writer yet: partition sharding claims
    /// a shard when the group assigns its partition (`claim_partitions`).
    pub async fn open_unclaimed(
        graph: &Graph,
        wal: &WalSettings,
        tables: &[String],
    ) -> Result<ShardPool> {
        let mut out = BTreeMap::new();
        for table in tables {
            let ds = graph.open_table(table, None).await?;
            let details = ds
                .mem_wal_index_details()
                .await
                .ctx(table)?
                .ok_or_else(|| Error::Corrupt(format!("{table} has no MemWAL")))?;
            let layout = graph.layout();
            let router =
                match layout.sharding {
                    Sharding::Bucket => Router::Spec {
                        spec: details.sharding_specs.first().cloned().ok_or_else(|| {
                            Error::Corrupt(format!("{table} has no sharding spec"))
                        })?,
                        lance_schema: ds.schema().clone(),
                    },
                    Sharding::Partition if table == REJECTS_TABLE => {
                        Router::Source(Arc::new(layout.clone()))
                    }
                    Sharding::Partition => Router::Partition,
                };
            // N as the graph was created with: Lance reports 0 shards for
            // identity sharding.
            let n = shard_count(graph, table)?;
            // Idempotent: a graph whose init crashed after `__manifest`, or a
            // first start, gets its shard manifests here, before any writer.
            initialize_shards(&ds, table, n).await?;
            out.insert(
                table.clone(),
                TableShards {
                    table: table.clone(),
                    router,
                    pk: single_pk(ds.schema()),
                    n,
                    shards: BTreeMap::new(),
                },
            );
        }
        Ok(ShardPool {
            tables: out,
            graph: graph.clone(),
            wal: wal.clone(),
            parked: BTreeMap::new(),
        })
    }

    /// The graph the pool writes.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Claims each (table, bucket) not held yet: opens its writer, which
    /// replays the shard's WAL under a new epoch, fencing any older writer.
    pub async fn claim(&mut self, wanted: &[(String, u32)]) -> Result<()> {
        let mut claimed = Vec::new();
        // Each table as it is now, once per call: a claim may come long
        // after the pool opened.
        let mut fresh: HashMap<String, Dataset> = HashMap::new();
        for (table, bucket) in wanted {
            let bucket = *bucket;
            let t = self
                .tables
                .get_mut(table)
                .ok_or_else(|| Error::Bug(format!("no MemWAL table {table} to claim")))?;
            if t.shards.contains_key(&bucket) {
                continue;
            }
            let id = shard_id(table, bucket);
            if let Some(s) = self.parked.remove(&(table.clone(), bucket)) {
                match s.writer.check_fenced().await {
                    Ok(()) => {
                        tracing::debug!(table, bucket, "shard back before its writer closed: kept");
                        t.shards.insert(bucket, s);
                        continue;
                    }
                    Err(e) => {
                        tracing::debug!(table, bucket, error = %e, "parked shard writer was fenced");
                        close_in_background(s);
                    }
                }
            }
            let wal = &self.wal;
            let config = ShardWriterConfig {
                durable_write: true,
                max_wal_flush_interval: Some(wal.flush_interval),
                max_memtable_rows: wal.max_memtable_rows,
                max_memtable_size: wal.max_memtable_bytes,
                max_unflushed_memtable_bytes: wal.max_memtable_bytes * 4,
                ..Default::default()
            };
            if !fresh.contains_key(table) {
                fresh.insert(table.clone(), self.graph.open_table(table, None).await?);
            }
            let writer = fresh[table]
                .mem_wal_writer(id, config)
                .await
                .map_err(|e| fenced_or(e, table, bucket, id, "open writer"))?;
            tracing::debug!(table, bucket, epoch = writer.epoch(), "shard writer open");
            claimed.push((id, writer.epoch()));
            t.shards.insert(
                bucket,
                Shard {
                    table: table.clone(),
                    bucket,
                    writer: Arc::new(writer),
                },
            );
        }
        note_owners(&self.graph, &claimed).await;
        Ok(())
    }

    /// Under partition sharding, the shards of source partitions `tps`:
    /// bucket p of each type table `feeds` maps the topic to, and the
    /// rejects shard of (topic, p).
    pub fn shards_of(
        &self,
        tps: &[(String, i32)],
        feeds: &BTreeMap<String, Vec<String>>,
    ) -> Vec<(String, u32)> {
        let layout = self.graph.layout();
        let mut out = Vec::new();
        for (topic, p) in tps {
            let Ok(bucket) = u32::try_from(*p) else {
                continue;
            };
            for table in feeds.get(topic).into_iter().flatten() {
                out.push((table.clone(), bucket));
            }
            if let Some(r) = layout.source_shard(topic, *p) {
                out.push((REJECTS_TABLE.to_string(), r));
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// Gives up the writers of `shards` (a revoke): they leave the pool
    /// and are parked until `close_parked`, at the next assignment.
    pub fn release(&mut self, shards: &[(String, u32)]) {
        for (table, bucket) in shards {
            if let Some(s) = self
                .tables
                .get_mut(table)
                .and_then(|t| t.shards.remove(bucket))
            {
                self.parked.insert((table.clone(), *bucket), s);
            }
        }
    }

    /// Closes, in the background and bounded, the parked writers no
    /// assignment took back, so their memtables flush to generations any
    /// member's fold can read. The next owner's claim replays whatever a
    /// close did not finish.
    pub fn close_parked(&mut self) {
        for (_, s) in std::mem::take(&mut self.parked) {
            close_in_background(s);
        }
    }

    /// Whether `table`'s `bucket` was released by this process and not
    /// claimed back (its in-flight writes may fail once another member
    /// claims it).
    pub fn released(&self, table: &str, bucket: u32) -> bool {
        !self.holds(table, bucket)
    }

    /// Whether this process holds the writer of `table`'s `bucket`.
    pub fn holds(&self, table: &str, bucket: u32) -> bool {
        self.tables
            .get(table)
            .is_some_and(|t| t.shards.contains_key(&bucket))
    }

    /// Each writer's manifest store and epoch.
    pub fn live_shards(&self) -> LiveShards {
        self.tables
            .values()
            .flat_map(|t| t.shards.values())
            .map(|s| {
                let live = LiveShard {
                    store: s.writer.manifest_store(),
                    epoch: s.writer.epoch(),
                };
                (s.writer.shard_id(), live)
            })
            .collect()
    }

    /// Freezes every active memtable. Called between polls, so the cut is
    /// exact: everything put before it is in a generation `<= upto`.
    pub async fn freeze_all(&self) -> Result<Vec<FrozenShard>> {
        let mut out = Vec::new();
        for t in self.tables.values() {
            for s in t.shards.values() {
                let id = s.writer.shard_id();
                let err = |e| fenced_or(e, &s.table, s.bucket, id, "freeze");
                let frozen = async {
                    let active = s.writer.memtable_stats().await.map_err(err)?.generation;
                    let fence = s.writer.force_freeze_active().await.map_err(err)?;
                    Ok::<_, Error>((active, fence))
                };
                let (active, fence) = match frozen.await {
                    Ok(f) => f,
                    // Partition sharding: the group gave the shard's
                    // partition to another member, which claimed it before
                    // this one handled the revoke. Left out of the cut; its
                    // flushed generations are folded like any other
                    // member's, and a later write to it fails the session.
                    Err(e)
                        if e.kind() == crate::error::ErrorKind::Fenced
                            && self.graph.layout().sharding == Sharding::Partition =>
                    {
                        tracing::info!(table = %s.table, bucket = s.bucket, "a shard moved to another member before this one's revoke; not in this cut");
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                let upto = fence
                    .frozen_generation()
                    .unwrap_or(active.saturating_sub(1));
                out.push(FrozenShard {
                    table: s.table.clone(),
                    bucket: s.bucket,
                    shard: id,
                    upto_generation: upto,
                    fence,
                });
            }
        }
        Ok(out)
    }

    /// What every writer holds in memory and how often it flushed, in
    /// table then bucket order. A writer that cannot answer is skipped.
    pub async fn memtables(&self) -> Vec<MemtableSample> {
        let mut out = Vec::new();
        for t in self.tables.values() {
            for s in t.shards.values() {
                let Ok(stats) = s.writer.memtable_stats().await else {
                    continue;
                };
                let memory = s.writer.memory();
                out.push(MemtableSample {
                    table: s.table.clone(),
                    bucket: s.bucket,
                    rows: stats.row_count as u64,
                    bytes: (memory.active_bytes() + memory.frozen_bytes()) as u64,
                    flushes: s.writer.stats().memtable_flush_count,
                });
            }
        }
        out
    }

    /// Flushes and closes every writer (drain on shutdown).
    pub async fn close(mut self) -> Result<()> {
        self.close_parked();
        for t in self.tables.into_values() {
            for s in t.shards.into_values() {
                let id = s.writer.shard_id();
                match Arc::try_unwrap(s.writer) {
                    Ok(w) => w
                        .close()
                        .await
                        .map_err(|e| fenced_or(e, &s.table, s.bucket, id, "close"))?,
                    Err(_) => {
                        return Err(Error::Bug(format!(
                            "shard {id} of {} is still in use at close",
                            s.table
                        )))
                    }
                }
            }
        }
        Ok(())
    }
}

/// Closes a writer that left the pool, in the background, bounded.
fn close_in_background(s: Shard) {
    const BOUND: std::time::Duration = std::time::Duration::from_secs(10);
    let id = s.writer.shard_id();
    tokio::spawn(async move {
        let Ok(w) = Arc::try_unwrap(s.writer) else {
            tracing::warn!(%id, table = %s.table, "released shard still in use; its next owner replays it");
            return;
        };
        match tokio::time::timeout(BOUND, w.close()).await {
            Ok(Ok(())) => {
                tracing::debug!(%id, table = %s.table, bucket = s.bucket, "released shard closed")
            }
            Ok(Err(e)) => {
                tracing::warn!(%id, error = %e, "released shard did not close; its next owner replays it")
            }
            Err(_) => tracing::warn!(
                %id,
                "released shard did not close within {BOUND:?}; its next owner replays it"
            ),
        }
    });
}

/// Durability of one put or delete, with where it went (for error messages).
pub struct PendingWrite {
    pub table: String,
    pub bucket: u32,
    pub shard: Uuid,
    pub watcher: Option<BatchDurableWatcher>,
}

impl PendingWrite {
    pub async fn wait(self) -> Result<()> {
        if let Some(mut w) = self.watcher {
            w.wait()
                .await
                .map_err(|e| fenced_or(e, &self.table, self.bucket, self.shard, "WAL write"))?;
        }
        Ok(())
    }
}

impl TableShards {
    /// Splits `batch` by `bucket(id, N)` as Lance computes it, each part
    /// sorted by its key. MemWAL indexes every put row by key (a skiplist,
    /// a bloom filter, at flush a B-tree): inserting keys in order is the
    /// cheapest way in (lance-memwal.md §12 measured ~40 % less CPU per
    /// row). The sort is stable, so if a batch held one key twice its later
    /// row would stay last and still win.
    pub fn route(&self, batch: &RecordBatch) -> Result<Vec<(usize, RecordBatch)>> {
        if batch.num_rows() == 0 {
            return Ok(vec![]);
        }
        let col = self.shard_of_rows(batch)?;
        let keys = self
            .pk
            .as_deref()
            .and_then(|pk| batch.column_by_name(pk))
            .and_then(|c| c.as_string_opt::<i32>());
        split_by_bucket(batch, &col, self.n as usize, keys)
    }

    /// Each row's shard index, by the table's router.
    fn shard_of_rows(&self, batch: &RecordBatch) -> Result<Int32Array> {
        let column = |name: &str| {
            batch.column_by_name(name).ok_or_else(|| {
                Error::Corrupt(format!("rows of {} lack {name} to route by", self.table))
            })
        };
        match &self.router {
            Router::Spec { spec, lance_schema } => {
                let buckets = evaluate_sharding_spec(batch, spec, lance_schema)
                    .ctx(format!("route rows of {}", self.table))?;
                buckets
                    .column(0)
                    .as_any()
                    .downcast_ref::<Int32Array>()
                    .cloned()
                    .ok_or_else(|| Error::Corrupt("sharding spec did not yield Int32".into()))
            }
            Router::Partition => column(SRC_PARTITION)?
                .as_primitive_opt::<Int32Type>()
                .cloned()
                .ok_or_else(|| Error::Corrupt(format!("{SRC_PARTITION} is not Int32"))),
            Router::Source(layout) => {
                let topics = column("topic")?.as_string_opt::<i32>().cloned();
                let parts = column("partition")?
                    .as_primitive_opt::<Int32Type>()
                    .cloned();
                let (Some(topics), Some(parts)) = (topics, parts) else {
                    return Err(Error::Corrupt("rejects' topic/partition columns".into()));
                };
                Ok((0..batch.num_rows())
                    .map(|i| {
                        let (t, p) = (topics.is_valid(i), parts.is_valid(i));
                        (t && p)
                            .then(|| layout.source_shard(topics.value(i), parts.value(i)))
                            .flatten()
                            .map(|s| s as i32)
                    })
                    .collect())
            }
        }
    }

    /// Starts the WAL write of `batch` (rows) without waiting for durability.
    pub async fn put(&self, batch: RecordBatch) -> Result<Vec<PendingWrite>> {
        self.write(batch, Write::Put).await
    }

    /// Starts the WAL write of tombstones for the keys in `keys` (an `id` column).
    pub async fn delete(&self, keys: RecordBatch) -> Result<Vec<PendingWrite>> {
        self.write(keys, Write::Delete).await
    }

    async fn write(&self, batch: RecordBatch, kind: Write) -> Result<Vec<PendingWrite>> {
        let mut out = Vec::new();
        for (b, part) in self.route(&batch)? {
            let s = self.shards.get(&(b as u32)).ok_or_else(|| {
                Error::Bug(format!(
                    "rows of {} for shard {b}, which this process does not hold",
                    self.table
                ))
            })?;
            let id = s.writer.shard_id();
            let started = match kind {
                Write::Put => s.writer.put_no_wait(vec![part]).await,
                Write::Delete => s.writer.delete_no_wait(vec![part]).await,
            };
            let (_, watcher) =
                started.map_err(|e| fenced_or(e, &self.table, s.bucket, id, kind.name()))?;
            out.push(PendingWrite {
                table: self.table.clone(),
                bucket: s.bucket,
                shard: id,
                watcher,
            });
        }
        Ok(out)
    }
}

/// One pass over the bucket column collects each bucket's row indices,
/// sorted (stably) by `keys` when given; one `take` per non-empty bucket
/// then builds its batch. A part already in order is not copied.
fn split_by_bucket(
    batch: &RecordBatch,
    buckets: &Int32Array,
    n: usize,
    keys: Option<&StringArray>,
) -> Result<Vec<(usize, RecordBatch)>> {
    let mut rows: Vec<Vec<u32>> = vec![Vec::new(); n];
    for (i, b) in buckets.iter().enumerate() {
        let b = b
            .and_then(|b| usize::try_from(b).ok())
            .filter(|&b| b < n)
            .ok_or_else(|| Error::Corrupt(format!("row {i} routed to bucket {b:?} of {n}")))?;
        rows[b].push(i as u32);
    }
    rows.into_iter()
        .enumerate()
        .filter(|(_, idx)| !idx.is_empty())
        .map(|(b, mut idx)| {
            if let Some(k) = keys {
                let key = |i: u32| k.value(i as usize);
                if !idx.windows(2).all(|w| key(w[0]) <= key(w[1])) {
                    idx.sort_by(|&x, &y| key(x).cmp(key(y)));
                }
            }
            if idx.len() == batch.num_rows() && idx.iter().enumerate().all(|(i, &r)| r == i as u32)
            {
                return Ok((b, batch.clone()));
            }
            let idx = UInt32Array::from(idx);
            let part = arrow::compute::take_record_batch(batch, &idx).ctx("split by bucket")?;
            Ok((b, part))
        })
        .collect()
}

/// The table's primary key column, when it is one string column (every
/// graphsink table's is).
fn single_pk(schema: &lance_core::datatypes::Schema) -> Option<String> {
    match schema.unenforced_primary_key()[..] {
        [f] if f.data_type() == arrow_schema::DataType::Utf8 => Some(f.name.clone()),
        _ => None,
    }
}

#[derive(Clone, Copy)]
enum Write {
    Put,
    Delete,
}

impl Write {
    fn name(self) -> &'static str {
        match self {
            Write::Put => "put",
            Write::Delete => "delete",
        }
    }
}

/// A writer fenced by a peer becomes `Error::Fenced` naming the shard and
/// epochs; one that gave up on its own WAL store, `Error::WalUnavailable`
/// (reopening it replays whatever landed).
pub(crate) fn fenced_or(
    e: lance::Error,
    table: &str,
    bucket: u32,
    shard: Uuid,
    what: &str,
) -> Error {
    match e.fence_reason().or_else(|| stringified_fence(&e)) {
        Some(lance_core::FenceReason::PersistenceFailure) => Error::WalUnavailable {
            table: table.to_string(),
            bucket,
            shard,
            reason: e.to_string(),
        },
        Some(_) => Error::Fenced {
            table: table.to_string(),
            bucket,
            shard,
            reason: e.to_string(),
        },
        None => Error::Lance {
            context: format!("{what} on shard {shard} ({table} bucket {bucket})"),
            source: e,
        },
    }
}

/// A fence that reached us as text: a memtable flush runs in Lance's
/// background task, and its error comes back as an IO error carrying the
/// fence's message (seen in the chaos `members` phase: a member frozen past
/// its session exited on "LanceError(IO): Writer fenced (peer claimed
/// epoch)" instead of rejoining). Lance keeps the `Writer fenced (<reason>)`
/// prefix for such readers.
fn stringified_fence(e: &lance::Error) -> Option<lance_core::FenceReason> {
    let text = e.to_string();
    if text.contains("Writer fenced (peer claimed epoch)") {
        Some(lance_core::FenceReason::PeerClaimedEpoch)
    } else if text.contains("Writer fenced (persistence failure)") {
        Some(lance_core::FenceReason::PersistenceFailure)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_stringified_into_an_io_error_is_still_a_fence() {
        let shard = Uuid::nil();
        let io =
            |text: &str| lance::Error::io_source(Box::new(std::io::Error::other(text.to_string())));
        let peer =
            io("Writer fenced (peer claimed epoch): local epoch 6 < stored epoch 7 for shard x");
        assert!(matches!(
            fenced_or(peer, "t", 3, shard, "flush"),
            Error::Fenced { .. }
        ));
        let lost = io("Writer fenced (persistence failure): wal write failed");
        assert!(matches!(
            fenced_or(lost, "t", 3, shard, "flush"),
            Error::WalUnavailable { .. }
        ));
        let other = io("connection reset");
        assert!(matches!(
            fenced_or(other, "t", 3, shard, "flush"),
            Error::Lance { .. }
        ));
    }

    #[test]
    fn one_pass_split_keeps_every_row_once_in_order() {
        use arrow::array::StringArray;
        use arrow_schema::{DataType, Field, Schema};
        let ids = StringArray::from(vec!["a", "b", "c", "d", "e"]);
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Utf8, false)]));
        let batch = RecordBatch::try_new(schema, vec![Arc::new(ids)]).unwrap();
        let buckets = Int32Array::from(vec![2, 0, 2, 2, 0]);
        let parts = split_by_bucket(&batch, &buckets, 3, None).unwrap();
        let got: Vec<(usize, Vec<String>)> = parts
            .iter()
            .map(|(b, p)| {
                let c = p.column(0).as_any().downcast_ref::<StringArray>().unwrap();
                (*b, c.iter().map(|v| v.unwrap().to_string()).collect())
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (0, vec!["b".to_string(), "e".to_string()]),
                (2, vec!["a".to_string(), "c".to_string(), "d".to_string()]),
            ]
        );
        // A bucket outside the shard count is corrupt state, not a panic.
        assert!(split_by_bucket(&batch, &Int32Array::from(vec![0, 3, 0, 0, 0]), 3, None).is_err());
    }

    #[test]
    fn each_part_is_sorted_by_key_and_keeps_equal_keys_in_order() {
        use arrow::array::{Int64Array, StringArray};
        use arrow_schema::{DataType, Field, Schema};
        let ids = StringArray::from(vec!["d", "b", "c", "a", "b", "e"]);
        let seq = Int64Array::from(vec![0, 1, 2, 3, 4, 5]);
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, false),
            Field::new("seq", DataType::Int64, false),
        ]));
        let batch =
            RecordBatch::try_new(schema, vec![Arc::new(ids.clone()), Arc::new(seq)]).unwrap();
        let rows = |p: &RecordBatch| -> Vec<(String, i64)> {
            let k = p.column(0).as_string::<i32>();
            let s = p.column(1).as_primitive::<arrow::datatypes::Int64Type>();
            (0..p.num_rows())
                .map(|i| (k.value(i).to_string(), s.value(i)))
                .collect()
        };
        let one = split_by_bucket(&batch, &Int32Array::from(vec![0; 6]), 1, Some(&ids)).unwrap();
        assert_eq!(
            rows(&one[0].1),
            [("a", 3), ("b", 1), ("b", 4), ("c", 2), ("d", 0), ("e", 5)]
                .map(|(k, s)| (k.to_string(), s))
        );
        let two = split_by_bucket(
            &batch,
            &Int32Array::from(vec![1, 0, 1, 1, 0, 0]),
            2,
            Some(&ids),
        )
        .unwrap();
        assert_eq!(two[0].0, 0);
        assert_eq!(
            rows(&two[0].1),
            [("b", 1), ("b", 4), ("e", 5)].map(|(k, s)| (k.to_string(), s))
        );
        assert_eq!(
            rows(&two[1].1),
            [("a", 3), ("c", 2), ("d", 0)].map(|(k, s)| (k.to_string(), s))
        );
    }

    #[test]
    fn shard_ids_are_deterministic_and_distinct() {
        assert_eq!(shard_id("nodes/A", 0), shard_id("nodes/A", 0));
        assert_ne!(shard_id("nodes/A", 0), shard_id("nodes/A", 1));
        assert_ne!(shard_id("nodes/A", 0), shard_id("nodes/B", 0));
    }
}
