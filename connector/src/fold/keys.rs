//! The known ids of a base table, kept between folds (`known_ids`): each id with
//! its row's address, filled by one scan of the table's key column and its
//! row addresses, then moved forward by the fold's own writes. The checks
//! ask it which endpoints exist; the write replaces and deletes rows by
//! their addresses instead of a merge-insert, whose hash join reads every
//! key of the table (docs/perf/2026-12-02-fold-cost-against-graph-size.md, "Fold cost against graph size").

use std::collections::HashSet;
use std::sync::Arc;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::UInt64Type;
use futures::TryStreamExt;
use lance::Dataset;
use lance_table::format::Fragment;

use crate::config::Sharding;
use crate::error::{Context, Error, Result};
use crate::fold::rows::strings;
use crate::graph::Graph;
use crate::known_ids::{IdSet, Kind, KnownIds};
use crate::schema::{Provenance, ID, SRC_PARTITION};

/// An edge's source column.
const SRC: &str = "src";
/// Lance's row address column (fragment id << 32 | offset).
const ROW_ADDR: &str = "_rowaddr";

/// What `table`'s known ids keep with each id: the source partition for
/// node tables under partition sharding (`shard_conflict`,
/// docs/decisions/0007-scale-out.md), a hash of `src` for edge tables with `@card` or
/// `@unique` (their checks read the committed edges of the fold's `src`s).
pub(crate) fn kind(graph: &Graph, table: &str) -> Kind {
    let Some(ty) = graph.schema.types.iter().find(|t| t.table == table) else {
        return Kind::Plain;
    };
    match &ty.ends {
        Some(ends) => {
            let checked =
                ends.card_max.is_some() || ends.card_min > 0 || !ty.constraints.uniques.is_empty();
            if checked {
                Kind::Sourced
            } else {
                Kind::Plain
            }
        }
        None if graph.layout().sharding == Sharding::Partition => Kind::Homed,
        None => Kind::Plain,
    }
}

/// Whether `table`'s known ids keep each row's source partition.
pub(crate) fn homed(graph: &Graph, table: &str) -> bool {
    kind(graph, table) == Kind::Homed
}

/// The ids of `table` at version `v`: the known set, else one scan of the
/// table fills it; `None` when the table does not fit `fold.known_ids_max`
/// (the caller then scans for what it needs).
pub(crate) async fn known_ids_at(
    graph: &Graph,
    known: &KnownIds,
    table: &str,
    v: u64,
) -> Result<Option<Arc<IdSet>>> {
    let kind = kind(graph, table);
    if let Some(set) = known.at(table, v).filter(|s| s.kind() == kind) {
        return Ok(Some(set));
    }
    let ds = graph.open_table(table, Some(v)).await?;
    let rows = ds.count_rows(None).await.ctx(table)?;
    let Some(mut fill) = known.filling(table, rows, kind) else {
        return Ok(None);
    };
    scan_keys(&ds, known, kind, None, |id, tag, addr| {
        known.add(&mut fill, id, tag, addr)
    })
    .await?;
    known.keep(table, v, fill);
    Ok(known.at(table, v))
}

/// The tag a set of `kind` keeps for each row of `rows` (0 for none).
pub(crate) fn tags(known: &KnownIds, kind: Kind, rows: &RecordBatch) -> Result<Vec<u64>> {
    let n = rows.num_rows();
    Ok(match kind {
        Kind::Plain => vec![0; n],
        Kind::Homed => {
            let p = Provenance::partitions(rows)?;
            (0..n)
                .map(|i| {
                    if p.is_valid(i) {
                        u64::from(p.value(i) as u32)
                    } else {
                        0
                    }
                })
                .collect()
        }
        Kind::Sourced => {
            let src = strings(rows, SRC)?;
            (0..n)
                .map(|i| {
                    if src.is_valid(i) {
                        known.src_tag(src.value(i))
                    } else {
                        0
                    }
                })
                .collect()
        }
    })
}

/// Every id of `ds` (of `fragments`, else all) with its tag for a set of
/// `kind` and its row's address, in one scan of the key column (and the
/// tag's column).
async fn scan_keys(
    ds: &Dataset,
    known: &KnownIds,
    kind: Kind,
    fragments: Option<Vec<Fragment>>,
    mut f: impl FnMut(&str, u64, u64),
) -> Result<()> {
    let what = || format!("scan {} for its keys", ds.uri());
    let mut scan = ds.scan();
    if let Some(fragments) = fragments {
        scan.with_fragments(fragments);
    }
    let cols: &[&str] = match kind {
        Kind::Plain => &[ID],
        Kind::Homed => &[ID, SRC_PARTITION],
        Kind::Sourced => &[ID, SRC],
    };
    scan.project(cols).ctx(what())?;
    scan.with_row_address();
    let mut stream = scan.try_into_stream().await.ctx(what())?;
    while let Some(b) = stream.try_next().await.ctx(what())? {
        let tags = tags(known, kind, &b)?;
        let addrs = b
            .column_by_name(ROW_ADDR)
            .and_then(|a| a.as_primitive_opt::<UInt64Type>())
            .ok_or_else(|| Error::Corrupt(format!("{}: scan without {ROW_ADDR}", ds.uri())))?;
        for (i, id) in strings(&b, ID)?.iter().enumerate() {
            let Some(id) = id else { continue };
            f(id, tags[i], addrs.value(i));
        }
    }
    Ok(())
}

/// Moves `table`'s known ids from `before` over the fold's own compaction
/// to `after`: every live row of the fragments it rewrote is in the
/// fragments it added, so one scan of those alone gives each moved id its
/// new address (compaction runs once per ~16 folds; a full rescan of a
/// 10M-row table would cost ~0.8 s each time).
pub(crate) async fn follow_compaction(
    graph: &Graph,
    known: &KnownIds,
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
        let kind = kind(graph, table);
        scan_keys(after, known, kind, Some(added), |id, tag, addr| {
            moved.push((id.to_string(), tag, addr))
        })
        .await?;
    }
    known.advance(
        table,
        before.version().version,
        after.version().version,
        moved.iter().map(|(id, tag, a)| (id.as_str(), *tag, *a)),
        std::iter::empty(),
    );
    Ok(())
}

/// Whether the known ids of `table` are exactly its rows at their version,
/// each at its row's address (`None`: none kept). For tests.
pub(crate) async fn known_ids_agree(
    graph: &Graph,
    known: &KnownIds,
    table: &str,
) -> Result<Option<bool>> {
    let Some(set) = known
        .held(table)
        .and_then(|(v, _)| Some((v, known.at(table, v)?)))
    else {
        return Ok(None);
    };
    let (v, set) = set;
    let ds = graph.open_table(table, Some(v)).await?;
    let (mut rows, mut agree) = (0usize, true);
    scan_keys(&ds, known, set.kind(), None, |id, _, addr| {
        rows += 1;
        agree &= known.addr(&set, id) == Some(addr);
    })
    .await?;
    Ok(Some(agree && rows == set.len()))
}
