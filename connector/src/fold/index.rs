//! The id index: a B-tree on each node and edge table's primary key, so a
//! lookup by id (`graphsink read --id`, the other ends of `neighbors`, a
//! fresh read's base arm) probes index pages instead of scanning the
//! table's `id` column (~30–40 ms per million rows here, warm).
//!
//! The fold keeps it, in commits of its plan, so recovery knows them as
//! the fold's own (as it does the fold's compaction): created by the first
//! fold that leaves the table with rows; after that each fold indexes only
//! the fragments it added, as a delta segment (cost: its own rows). At
//! `MAX_SEGMENTS` segments it merges the newest ones, tiered by size
//! (`to_merge`), so a merge costs about the rows it merges, not the table
//! (a merge of all at 10M rows took 1.1 s here, a delta 10–15 ms).
//! Merge-insert runs with `use_index(false)`, so the fold's own join does
//! not take the index path (lance-memwal.md §12). The MemWAL keeps its
//! own primary-key index in every generation; docs/decisions/0012.

use std::collections::HashMap;
use std::sync::Arc;

use lance::index::{DatasetIndexExt, DatasetIndexInternalExt};
use lance::Dataset;
use lance_index::optimize::OptimizeOptions;
use lance_index::scalar::ScalarIndexParams;
use lance_index::IndexType;
use lance_table::format::IndexMetadata;

use crate::error::{Context, Result};
use crate::schema::ID;

/// The index's name in every node and edge table.
pub(crate) const ID_INDEX: &str = "id_idx";

/// Delta segments a lookup probes before a fold merges them: each is one
/// more B-tree to search, and a merge rewrites the whole index.
const MAX_SEGMENTS: usize = 8;

/// Indexes what `ds` holds unindexed, in a commit carrying `properties`
/// (the fold's plan). Returns `ds` itself when there is nothing to do.
pub(crate) async fn keep(
    ds: Arc<Dataset>,
    table: &str,
    properties: HashMap<String, String>,
) -> Result<Arc<Dataset>> {
    if ds.get_fragments().is_empty() {
        return Ok(ds);
    }
    let segs = ds
        .load_indices_by_name(ID_INDEX)
        .await
        .ctx(format!("indexes of {table}"))?;
    let segments = segs.len();
    if segments > 0
        && ds
            .unindexed_fragments(ID_INDEX)
            .await
            .ctx(format!("unindexed fragments of {table}"))?
            .is_empty()
    {
        return Ok(ds);
    }
    let mut d = Arc::try_unwrap(ds).unwrap_or_else(|a| (*a).clone());
    if segments == 0 {
        d.create_index_builder(&[ID], IndexType::BTree, &ScalarIndexParams::default())
            .name(ID_INDEX.to_string())
            .replace(false)
            .transaction_properties(properties)
            .await
            .ctx(format!("create the id index of {table}"))?;
    } else {
        let options = if segments >= MAX_SEGMENTS {
            OptimizeOptions::merge(to_merge(&d, &segs))
        } else {
            OptimizeOptions::append()
        };
        let options = options
            .index_names(vec![ID_INDEX.to_string()])
            .transaction_properties(properties);
        d.optimize_indices(&options)
            .await
            .ctx(format!("index the new rows of {table}"))?;
    }
    Ok(Arc::new(d))
}

/// How many trailing segments a merge takes: the newest ones, reaching
/// back over each older segment no larger than what is merged so far
/// (at least two). Segments then grow in size with age, as an LSM's
/// levels do, and a merge costs about the rows it merges, not the table.
fn to_merge(ds: &Dataset, segs: &[IndexMetadata]) -> usize {
    let rows: HashMap<u32, u64> = ds
        .get_fragments()
        .iter()
        .map(|f| {
            (
                f.id() as u32,
                f.metadata().physical_rows.unwrap_or(0) as u64,
            )
        })
        .collect();
    let covered = |s: &IndexMetadata| -> u64 {
        s.fragment_bitmap
            .iter()
            .flat_map(|b| b.iter())
            .map(|f| rows.get(&f).copied().unwrap_or(0))
            .sum()
    };
    let (mut n, mut merged) = (0, 0);
    for s in segs.iter().rev() {
        let size = covered(s);
        if n >= 2 && size > merged {
            break;
        }
        merged += size;
        n += 1;
    }
    n
}
