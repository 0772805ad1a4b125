//! Home partitions under `wal.sharding = "partition"`: an id committed
//! from one partition must keep arriving there (`view.homes` knows where
//! each id of the fold was committed from). `rehome` keeps the row from
//! the id's home when one fold read the id from several partitions;
//! `off_home` refuses rows from any other partition.

use std::collections::{HashMap, HashSet};

use arrow::array::{Array, RecordBatch};
use arrow::compute::{concat_batches, take_record_batch};

use super::Rejection;
use crate::error::{Context, Result};
use crate::fold::read::Read;
use crate::fold::rows::{drop_rows, strings};
use crate::rejects::{refuse_rows, RefusedRow, RejectCode};
use crate::schema::{GraphType, Provenance, ID};

/// The read keeps, per id, the newest row of the lowest partition it met
/// and hands the other partitions' rows over as conflicts. When the id's
/// committed row names another partition and a conflict came from there,
/// that conflict is the id's own row: it becomes the kept one and the
/// lowest partition's becomes a conflict, so the update from home goes on
/// and only the stray row is refused (as `shard_conflict`). `None` when
/// nothing moves.
pub(super) fn rehome(r: &Read, homes: &HashMap<String, u32>) -> Result<Option<Read>> {
    let conflict_rows = r.conflicts.upserts.as_ref();
    // Conflicts that came from their id's home, by id.
    let mut home_up: HashMap<&str, usize> = HashMap::new();
    if let Some(rows) = conflict_rows {
        let (ids, parts) = (strings(rows, ID)?, Provenance::partitions(rows)?);
        for i in 0..rows.num_rows() {
            let home = homes.get(ids.value(i));
            if parts.is_valid(i) && home == Some(&(parts.value(i) as u32)) {
                home_up.insert(ids.value(i), i);
            }
        }
    }
    let home_del: HashMap<&str, usize> = (r.conflicts.deletes.iter().enumerate())
        .filter(|(_, (id, shard))| homes.get(id) == Some(shard))
        .map(|(j, (id, _))| (id.as_str(), j))
        .collect();
    if home_up.is_empty() && home_del.is_empty() {
        return Ok(None);
    }
    let moves = |id: &str| home_up.contains_key(id) || home_del.contains_key(id);
    // The kept rows and deletes of those ids step down to conflicts.
    let down_up: Vec<usize> = match &r.upserts {
        Some(rows) => {
            let ids = strings(rows, ID)?;
            (0..rows.num_rows())
                .filter(|&i| moves(ids.value(i)))
                .collect()
        }
        None => vec![],
    };
    let down_del: HashSet<usize> = (0..r.deletes.len())
        .filter(|&i| moves(&r.deletes[i]))
        .collect();
    let up_idx: HashSet<usize> = home_up.values().copied().collect();
    let del_idx: HashSet<usize> = home_del.values().copied().collect();

    let mut out = r.clone();
    out.upserts = join(
        r.upserts
            .as_ref()
            .map(|b| drop_rows(b, down_up.iter().copied()))
            .transpose()?,
        conflict_rows.map(|b| pick(b, &up_idx)).transpose()?,
    )?;
    out.conflicts.upserts = join(
        conflict_rows
            .map(|b| drop_rows(b, up_idx.iter().copied()))
            .transpose()?,
        r.upserts
            .as_ref()
            .map(|b| pick(b, &down_up.iter().copied().collect()))
            .transpose()?,
    )?;
    swap_deletes(r, &mut out, down_del, &del_idx)?;
    Ok(Some(out))
}

/// The deletes of `rehome`: `r`'s kept deletes at `down` step down to
/// conflicts, its conflicting deletes at `up` (from their id's home) are
/// kept instead; into `out`.
fn swap_deletes(r: &Read, out: &mut Read, down: HashSet<usize>, up: &HashSet<usize>) -> Result<()> {
    if r.delete_shards.len() != r.deletes.len() {
        return Err(crate::error::Error::Corrupt(format!(
            "{} deletes with {} shards",
            r.deletes.len(),
            r.delete_shards.len()
        )));
    }
    let shard = |i: usize| r.delete_shards[i];
    let stay = |i: &usize| !down.contains(i);
    let (mut deletes, mut shards): (Vec<String>, Vec<u32>) = (0..r.deletes.len())
        .filter(stay)
        .map(|i| (r.deletes[i].clone(), shard(i)))
        .unzip();
    let mut conflicts = Vec::new();
    for (j, d) in r.conflicts.deletes.iter().enumerate() {
        if up.contains(&j) {
            deletes.push(d.0.clone());
            shards.push(d.1);
        } else {
            conflicts.push(d.clone());
        }
    }
    let mut down: Vec<usize> = down.into_iter().collect();
    down.sort_unstable();
    conflicts.extend(down.into_iter().map(|i| (r.deletes[i].clone(), shard(i))));
    out.deletes = deletes;
    out.delete_shards = shards;
    out.conflicts.deletes = conflicts;
    Ok(())
}

/// The rows of `rows` at `idx`, in row order.
fn pick(rows: &RecordBatch, idx: &HashSet<usize>) -> Result<RecordBatch> {
    let mut at: Vec<u32> = idx.iter().map(|&i| i as u32).collect();
    at.sort_unstable();
    take_record_batch(rows, &arrow::array::UInt32Array::from(at)).ctx("rehome rows")
}

/// `a` then `b`, leaving out empty batches.
fn join(a: Option<RecordBatch>, b: Option<RecordBatch>) -> Result<Option<RecordBatch>> {
    let parts: Vec<RecordBatch> = [a, b]
        .into_iter()
        .flatten()
        .filter(|b| b.num_rows() > 0)
        .collect();
    match parts.len() {
        0 => Ok(None),
        1 => Ok(parts.into_iter().next()),
        _ => concat_batches(&parts[0].schema(), &parts)
            .map(Some)
            .ctx("rehome rows"),
    }
}

/// Rows of ids whose committed row came from another partition
/// (`view.homes`, partition sharding): an id that moved partition
/// between folds (two partitioners, a resized topic) would otherwise
/// overwrite its row from another shard, in no Kafka order. The
/// committed row stays; returns the read without them, and the
/// refusals (`shard_conflict`), counted once the table's change exists.
pub(super) fn off_home(
    ty: &GraphType,
    r: &Read,
    homes: &HashMap<String, u32>,
) -> Result<Option<(Read, Vec<Rejection>)>> {
    const WHY: &str = "under wal.sharding = \"partition\" one id must always arrive on one \
        partition (producers key by the id, with one partitioner); the committed row stays";
    let mut upserts_off = Vec::new();
    if let Some(rows) = &r.upserts {
        let ids = strings(rows, ID)?;
        let parts = Provenance::partitions(rows)?;
        for i in 0..rows.num_rows() {
            let Some(&home) = homes.get(ids.value(i)) else {
                continue;
            };
            if parts.is_valid(i) && parts.value(i) as u32 != home {
                let m = format!(
                    "this id's committed row came from partition {home} and this row from \
                     partition {}; {WHY}",
                    parts.value(i)
                );
                upserts_off.push(RefusedRow {
                    row: i,
                    code: RejectCode::ShardConflict,
                    message: m,
                });
            }
        }
    }
    let (mut refused, mut left) = (Vec::new(), None);
    if let Some(rows) = r.upserts.as_ref().filter(|_| !upserts_off.is_empty()) {
        let off = refuse_rows(rows, upserts_off, |v| Rejection::of_row(ty, rows, v))?;
        refused = off.refused;
        left = Some((off.kept.num_rows() > 0).then_some(off.kept));
    }
    let mut deletes_off = HashSet::new();
    for (i, id) in r.deletes.iter().enumerate() {
        let (Some(&home), Some(&shard)) = (homes.get(id), r.delete_shards.get(i)) else {
            continue;
        };
        if shard != home {
            let m = format!(
                "this id's committed row came from partition {home} and its delete from \
                 partition {shard}; {WHY}"
            );
            let row = serde_json::json!({ ID: id, "_src_partition": shard });
            let code = RejectCode::ShardConflict;
            refused.push(Rejection::delete_from(ty, id, row, Some(shard), code, m));
            deletes_off.insert(i);
        }
    }
    if refused.is_empty() {
        return Ok(None);
    }
    let mut kept = r.clone();
    if let Some(left) = left {
        kept.upserts = left;
    }
    if !deletes_off.is_empty() {
        let keep = |i: &usize| !deletes_off.contains(i);
        kept.deletes = (0..r.deletes.len())
            .filter(keep)
            .map(|i| r.deletes[i].clone())
            .collect();
        kept.delete_shards = (0..r.delete_shards.len())
            .filter(keep)
            .map(|i| r.delete_shards[i])
            .collect();
    }
    Ok(Some((kept, refused)))
}
