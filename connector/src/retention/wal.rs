//! WAL entries: a shard's replay starts after its manifest's
//! `replay_after_wal_entry_position`, so entries strictly below it are
//! garbage — except the newest, which must stay: Lance finds the WAL tip by
//! listing, and in an emptied directory a new writer's fence sentinel and
//! appends would land below the replay mark, where replay never looks.

use futures::TryStreamExt;
use lance::Dataset;
use uuid::Uuid;

use super::Removed;
use crate::error::{Context, Result};
use crate::failpoints;
use crate::shards;

/// One file of `_mem_wal/<shard>/wal/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct WalFile {
    pub position: u64,
    /// A landed entry (`<pos>.arrow`), not a staging file a crashed put left.
    pub landed: bool,
    pub size: u64,
}

/// Deletes (or, dry, counts) the WAL entries of `shard` below its replay mark.
pub(super) async fn collect(ds: &Dataset, shard: Uuid, dry_run: bool) -> Result<Removed> {
    // The stored manifest, not a writer's cached view: the mark only grows,
    // so an older read deletes less, never more.
    let Some(manifest) = shards::latest_manifest(ds, shard).await? else {
        return Ok(Removed::default());
    };
    let store = ds.object_store(None).await.ctx("object store")?;
    let dir = shards::shard_dir(ds, shard).join("wal");
    let listed: Vec<_> = store
        .list(Some(dir))
        .try_collect()
        .await
        .ctx(format!("list the WAL of shard {shard}"))?;
    let files: Vec<(WalFile, object_store::path::Path)> = listed
        .into_iter()
        .filter_map(|m| Some((parse(m.location.filename()?, m.size)?, m.location)))
        .collect();
    let wal: Vec<WalFile> = files.iter().map(|(f, _)| f.clone()).collect();
    let doomed = doomed(&wal, manifest.replay_after_wal_entry_position);
    let mut removed = Removed::default();
    for i in doomed {
        let (file, path) = &files[i];
        if !dry_run {
            match store.delete(path).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e).ctx(format!("delete WAL entry {path}")),
            }
            if removed.count == 0 {
                failpoints::hit(failpoints::GC_WAL_PARTIAL)?;
            }
        }
        removed.count += 1;
        removed.bytes += file.size;
    }
    Ok(removed)
}

/// A WAL file name as Lance writes it: the position bit-reversed in 64
/// binary digits, `.arrow`, and for a staging file `.tmp.<uuid>` after it.
pub(super) fn parse(name: &str, size: u64) -> Option<WalFile> {
    let (stem, rest) = name.split_once('.')?;
    if stem.len() != 64 || !stem.bytes().all(|b| b == b'0' || b == b'1') {
        return None;
    }
    let position = u64::from_str_radix(stem, 2).ok()?.reverse_bits();
    Some(WalFile {
        position,
        landed: rest == "arrow",
        size,
    })
}

/// Indices of the files to delete: every one strictly below `replay_after`
/// except the newest landed entry.
pub(super) fn doomed(files: &[WalFile], replay_after: u64) -> Vec<usize> {
    let newest = files.iter().filter(|f| f.landed).map(|f| f.position).max();
    files
        .iter()
        .enumerate()
        .filter(|(_, f)| f.position < replay_after && !(f.landed && Some(f.position) == newest))
        .map(|(i, _)| i)
        .collect()
}
