//! Shards: deterministic shard ids, routing rows with Lance's own sharding
//! spec, and the pool of one `ShardWriter` per (table, bucket). Does not
//! decide when anything is acknowledged; it hands back durability watchers.
//!
//! One part per file: this outline holds the ids, the shard manifests and
//! the one walk over a commit's shards (`of_commit`); `pool` the
//! `ShardPool` (claims, releases, freeze cuts, close) over `table` (one
//! table's writers, routing and WAL writes; it imports no `pool`),
//! `owners` the claimant notes, `unfolded` what the WAL holds that no fold
//! has published.

mod owners;
mod pool;
mod table;
mod unfolded;

use std::collections::HashMap;

use lance::dataset::mem_wal::{DatasetMemWalExt, ShardManifestStore};
use lance::Dataset;
use lance_index::mem_wal::{MemWalIndexDetails, ShardManifest};
use uuid::Uuid;

use crate::error::{Context, Error, Result};
use crate::graph::{Graph, GraphCommit};

pub(crate) use owners::shard_owner;
pub use owners::{holder, ShardOwner};
pub use pool::ShardPool;
pub(crate) use pool::{FrozenShard, LiveShard, LiveShards};
pub(crate) use table::fenced_or;
pub(crate) use table::PendingWrite;
pub(crate) use unfolded::unfolded;

/// Shards N of a MemWAL table as the graph was created with, or as its
/// index lists them when the layout has no count for it (identity
/// sharding under `partition` lists 0 shards).
pub(crate) fn shard_count_or(graph: &Graph, table: &str, listed: u32) -> u32 {
    graph.layout().counts.get(table).copied().unwrap_or(listed)
}

/// Shards N of a MemWAL table, as the graph was created with.
pub(crate) fn shard_count(graph: &Graph, table: &str) -> Result<u32> {
    graph
        .layout()
        .counts
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
pub(super) async fn initialize_shards(ds: &Dataset, table: &str, buckets: u32) -> Result<()> {
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
fn markers_of(details: &MemWalIndexDetails) -> HashMap<Uuid, u64> {
    details
        .compacted_sstables
        .iter()
        .map(|c| (c.shard_id, c.generation))
        .collect()
}

/// One MemWAL table of a graph commit: the table at the version the
/// commit pins, and how far the commit has folded each of its shards.
pub(crate) struct WalTable {
    pub table: String,
    /// The table at the commit's version.
    pub ds: Dataset,
    /// Shards N, as created (or as the index lists them: `shard_count_or`).
    buckets: u32,
    markers: HashMap<Uuid, u64>,
}

/// One shard of a `WalTable`.
pub(crate) struct WalShard {
    pub bucket: u32,
    pub id: Uuid,
    /// The commit's compacted generation marker: generations up to this
    /// one are folded (`None`: nothing of the shard is).
    pub folded_upto: Option<u64>,
}

impl WalTable {
    /// Each shard of the table, by bucket.
    pub(crate) fn shards(&self) -> impl Iterator<Item = WalShard> + '_ {
        (0..self.buckets).map(|bucket| {
            let id = shard_id(&self.table, bucket);
            let folded_upto = self.markers.get(&id).copied();
            WalShard {
                bucket,
                id,
                folded_upto,
            }
        })
    }
}

/// The one walk over the shards of a commit (`status`, retention,
/// `unfolded`): every table it pins that has a MemWAL, in name order, each
/// opened at its pinned version with the compacted markers there.
pub(crate) async fn of_commit(graph: &Graph, commit: &GraphCommit) -> Result<Vec<WalTable>> {
    let mut out = Vec::new();
    for (table, &version) in &commit.tables {
        let ds = graph.open_table(table, Some(version)).await?;
        let Some(details) = ds.mem_wal_index_details().await.ctx(table)? else {
            continue;
        };
        out.push(WalTable {
            table: table.clone(),
            buckets: shard_count_or(graph, table, details.num_shards),
            markers: markers_of(&details),
            ds,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
