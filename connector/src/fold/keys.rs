//! The keys of a base table kept between folds (`known_ids`): each id with
//! its row's address, filled by one scan of the table's key column and its
//! row addresses, then moved forward by the fold's own writes. The checks
//! ask it which endpoints exist; the write replaces and deletes rows by
//! their addresses instead of a merge-insert, whose hash join reads every
//! key of the table (BENCHMARKS.md, "Fold cost against graph size").

use std::collections::HashSet;
use std::sync::Arc;

use arrow::array::{Array, AsArray};
use arrow::datatypes::UInt64Type;
use futures::TryStreamExt;
use lance::Dataset;
use lance_table::format::Fragment;

use crate::config::Sharding;
use crate::error::{Context, Error, Result};
use crate::fold::rows::strings;
use crate::graph::Graph;
use crate::known_ids::IdSet;
use crate::schema::{Provenance, ID, SRC_PARTITION};

/// Lance's row address column (fragment id << 32 | offset).
const ROW_ADDR: &str = "_rowaddr";

/// Whether `table`'s kept ids keep each row's source partition: node
/// tables under partition sharding (`shard_conflict`, docs/scale-out.md).
pub(crate) fn homed(graph: &Graph, table: &str) -> bool {
    graph.layout().sharding == Sharding::Partition && graph.schema.nodes().any(|t| t.table == table)
}

/// The ids of `table` at version `v`: the kept set, else one scan of the
/// table fills it; `None` when the table does not fit `fold.known_ids_max`
/// (the caller then scans for what it needs).
pub(crate) async fn kept_ids(graph: &Graph, table: &str, v: u64) -> Result<Option<Arc<IdSet>>> {
    let known = &graph.known_ids;
    let homed = homed(graph, table);
    if let Some(set) = known.at(table, v).filter(|s| s.is_homed() == homed) {
        return Ok(Some(set));
    }
    let ds = graph.open_table(table, Some(v)).await?;
    let rows = ds.count_rows(None).await.ctx(table)?;
    let Some(mut fill) = known.filling(table, rows, homed) else {
        return Ok(None);
    };
    scan_keys(&ds, homed, None, |id, home, addr| {
        known.add(&mut fill, id, home, addr)
    })
    .await?;
    known.keep(table, v, fill);
    Ok(known.at(table, v))
}

/// Every id of `ds` (of `fragments`, else all) with its row's source
/// partition (when `homed`) and address, in one scan of the key column.
async fn scan_keys(
    ds: &Dataset,
    homed: bool,
    fragments: Option<Vec<Fragment>>,
    mut f: impl FnMut(&str, Option<u32>, u64),
) -> Result<()> {
    let what = || format!("scan {} for its keys", ds.uri());
    let mut scan = ds.scan();
    if let Some(fragments) = fragments {
        scan.with_fragments(fragments);
    }
    let cols: &[&str] = if homed { &[ID, SRC_PARTITION] } else { &[ID] };
    scan.project(cols).ctx(what())?;
    scan.with_row_address();
    let mut stream = scan.try_into_stream().await.ctx(what())?;
    while let Some(b) = stream.try_next().await.ctx(what())? {
        let homes = homed.then(|| Provenance::partitions(&b)).transpose()?;
        let addrs = b
            .column_by_name(ROW_ADDR)
            .and_then(|a| a.as_primitive_opt::<UInt64Type>())
            .ok_or_else(|| Error::Corrupt(format!("{}: scan without {ROW_ADDR}", ds.uri())))?;
        for (i, id) in strings(&b, ID)?.iter().enumerate() {
            let Some(id) = id else { continue };
            let home = homes.and_then(|h| h.is_valid(i).then(|| h.value(i) as u32));
            f(id, home, addrs.value(i));
        }
    }
    Ok(())
}

/// Moves `table`'s kept ids from `before` over the fold's own compaction
/// to `after`: every live row of the fragments it rewrote is in the
/// fragments it added, so one scan of those alone gives each moved id its
/// new address (compaction runs once per ~16 folds; a full rescan of a
/// 10M-row table would cost ~0.8 s each time).
pub(crate) async fn follow_compaction(
    graph: &Graph,
    table: &str,
    before: &Dataset,
    after: &Dataset,
) -> Result<()> {
    let old: HashSet<usize> = before.get_fragments().iter().map(|f| f.id()).collect();
    let added: Vec<Fragment> = after
        .get_fragments()
        .iter()
        .filter(|f| !old.contains(&f.id()))
        .map(|f| f.metadata().clone())
        .collect();
    let mut moved = Vec::new();
    if !added.is_empty() {
        let homed = homed(graph, table);
        scan_keys(after, homed, Some(added), |id, home, addr| {
            moved.push((id.to_string(), home, addr))
        })
        .await?;
    }
    graph.known_ids.advance(
        table,
        before.version().version,
        after.version().version,
        moved.iter().map(|(id, home, a)| (id.as_str(), *home, *a)),
        std::iter::empty(),
    );
    Ok(())
}

/// Whether the ids kept for `table` are exactly its rows at their version,
/// each at its row's address (`None`: none kept). For tests.
pub(crate) async fn kept_ids_agree(graph: &Graph, table: &str) -> Result<Option<bool>> {
    let known = &graph.known_ids;
    let Some(set) = known
        .held(table)
        .and_then(|(v, _)| Some((v, known.at(table, v)?)))
    else {
        return Ok(None);
    };
    let (v, set) = set;
    let ds = graph.open_table(table, Some(v)).await?;
    let (mut rows, mut agree) = (0usize, true);
    scan_keys(&ds, set.is_homed(), None, |id, _, addr| {
        rows += 1;
        agree &= known.addr(&set, id) == Some(addr);
    })
    .await?;
    Ok(Some(agree && rows == set.len()))
}
