//! The `ShardPool`: every writer this process holds, by table; claims,
//! releases and parking across a rebalance, freeze cuts, close.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use lance::dataset::mem_wal::{
    DatasetMemWalExt, FreezeFence, ShardManifestStore, ShardWriterConfig,
};
use lance::Dataset;
use uuid::Uuid;

use crate::config::{Sharding, WalSettings};
use crate::error::{shown, Context, Error, PublicResult, Result};
use crate::graph::Graph;
use crate::schema::REJECTS_TABLE;

use super::owners::note_owners;
use super::table::{fenced_or, single_pk, Router, Shard, TableShards};
use super::{initialize_shards, shard_count, shard_id};

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
    pub async fn open(
        graph: &Graph,
        wal: &WalSettings,
        tables: &[String],
    ) -> PublicResult<ShardPool> {
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
    pub(crate) async fn open_unclaimed(
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
    pub(crate) async fn claim(&mut self, wanted: &[(String, u32)]) -> Result<()> {
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
    pub async fn freeze_all(&self) -> PublicResult<Vec<FrozenShard>> {
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
                    Err(e) => return Err(e.into()),
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
    pub async fn close(mut self) -> PublicResult<()> {
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
                        ))
                        .into())
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
                tracing::warn!(%id, error = %shown(&e), "released shard did not close; its next owner replays it")
            }
            Err(_) => tracing::warn!(
                %id,
                "released shard did not close within {BOUND:?}; its next owner replays it"
            ),
        }
    });
}
