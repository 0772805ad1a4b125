//! Flushed generations (`_mem_wal/<shard>/<8hex>_gen_<g>/`). Generation `g`
//! is garbage once `g` is at or below the shard's compacted marker in the
//! table version the *published* head pins: an unpublished fold's plan
//! names generations above it, and recovery reads them again. Lance never
//! reopens a flushed generation, and graphsink's planner reads only those
//! above the marker of the latest version (which is at least the head's).
//!
//! The shard manifest is trimmed first, the directories deleted after, so
//! no manifest ever names a directory that is gone; directories are found
//! by listing, so a crash between the two leaves nothing behind for good.

use futures::TryStreamExt;
use lance::dataset::mem_wal::ShardManifestStore;
use lance::Dataset;
use lance_index::mem_wal::ShardManifest;
use uuid::Uuid;

use super::Removed;
use crate::error::{shown, Context, Result};
use crate::failpoints;
use crate::shards::{self, LiveShard};

/// Drops generations `<= marker` from the shard manifest; returns how many
/// it named (dry: would drop), or `None` when it could not trim, and so
/// the shard's directories must stay this time. Through the live writer's own store at its
/// epoch when this process holds one; otherwise a compare-and-swap at the
/// stored epoch, which fences nobody: a writer that commits meanwhile
/// loses the version race, re-reads and rebuilds on the trimmed list.
pub(super) async fn trim(
    ds: &Dataset,
    shard: Uuid,
    marker: u64,
    live: Option<&LiveShard>,
    dry_run: bool,
) -> Result<Option<u64>> {
    let offline;
    let (store, current): (&ShardManifestStore, _) = match live {
        Some(l) => (l.store.as_ref(), l.store.latest().await),
        None => {
            offline = shards::manifest_store(ds, shard).await?;
            (&offline, offline.refresh_latest().await)
        }
    };
    let Some(current) = current.ctx(format!("read manifest of shard {shard}"))? else {
        return Ok(Some(0));
    };
    let n = covered(&current, marker);
    if n == 0 || dry_run {
        return Ok(Some(n));
    }
    let epoch = live.map_or(current.writer_epoch, |l| l.epoch);
    match store.commit_update(epoch, |cur| trimmed(cur, marker)).await {
        Ok(_) => Ok(Some(n)),
        // A newer writer owns the shard now, and its manifest still names
        // the folded generations (the planner skips them by the marker).
        // The next run, or that writer's own, trims and deletes them.
        Err(e) if e.fence_reason().is_some() => {
            tracing::warn!(%shard, error = %shown(&e), "shard manifest not trimmed: a newer writer claimed it");
            Ok(None)
        }
        Err(e) => Err(e).ctx(format!("trim manifest of shard {shard}")),
    }
}

/// Deletes shard manifest versions older than the latest that Lance lets
/// go: only those a day old, so a stale writer's next version still
/// collides (Lance's `prune_versions_before`). Keeps their count bounded
/// by a day's commits.
pub(super) async fn prune(ds: &Dataset, shard: Uuid, live: Option<&LiveShard>) -> Result<u64> {
    let offline;
    let store: &ShardManifestStore = match live {
        Some(l) => l.store.as_ref(),
        None => {
            offline = shards::manifest_store(ds, shard).await?;
            &offline
        }
    };
    let what = || format!("prune manifests of shard {shard}");
    let Some(latest) = store.latest().await.ctx(what())? else {
        return Ok(0);
    };
    let n = store
        .prune_versions_before(latest.version)
        .await
        .ctx(what())?;
    Ok(n as u64)
}

fn covered(m: &ShardManifest, marker: u64) -> u64 {
    m.sstables.iter().filter(|s| s.generation <= marker).count() as u64
}

/// `cur` without the generations `<= marker`, as its successor version.
fn trimmed(cur: &ShardManifest, marker: u64) -> ShardManifest {
    ShardManifest {
        version: cur.next_version(),
        sstables: cur
            .sstables
            .iter()
            .filter(|s| s.generation > marker)
            .cloned()
            .collect(),
        ..cur.clone()
    }
}

/// Deletes (or, dry, measures) the generation directories `<= marker`.
pub(super) async fn collect(
    ds: &Dataset,
    shard: Uuid,
    marker: u64,
    dry_run: bool,
) -> Result<Removed> {
    let store = ds.object_store(None).await.ctx("object store")?;
    let dir = shards::shard_dir(ds, shard);
    let what = || format!("list generations of shard {shard}");
    let listing = match store.list_with_delimiter(Some(&dir)).await {
        Ok(l) => l,
        Err(e) if e.is_not_found() => return Ok(Removed::default()),
        Err(e) => return Err(e).ctx(what()),
    };
    let mut removed = Removed::default();
    for gen_dir in listing.common_prefixes {
        let Some(g) = gen_dir.filename().and_then(parse_generation) else {
            continue;
        };
        if g > marker {
            continue;
        }
        let files: Vec<_> = store
            .list(Some(gen_dir.clone()))
            .try_collect()
            .await
            .ctx(what())?;
        removed.count += 1;
        removed.bytes += files.iter().map(|f| f.size).sum::<u64>();
        if dry_run {
            continue;
        }
        if let Some(first) = files.first() {
            delete_quietly(&store, &first.location).await?;
            failpoints::hit(failpoints::GC_GENERATION_PARTIAL)?;
        }
        match store.remove_dir_all(gen_dir.clone()).await {
            Ok(()) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e).ctx(format!("delete generation {gen_dir}")),
        }
    }
    Ok(removed)
}

async fn delete_quietly(
    store: &lance::io::ObjectStore,
    path: &object_store::path::Path,
) -> Result<()> {
    match store.delete(path).await {
        Ok(()) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e).ctx(format!("delete {path}")),
    }
}

/// `<8hex>_gen_<g>` → `g`.
pub(super) fn parse_generation(name: &str) -> Option<u64> {
    let (hash, g) = name.split_once("_gen_")?;
    if hash.len() != 8 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    if g.is_empty() || !g.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    g.parse().ok()
}
