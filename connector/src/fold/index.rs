//! The id index: a B-tree on each node and edge table's primary key, so a
//! lookup by id (`graphsink read --id`, the other ends of `neighbors`, a
//! fresh read's base arm) probes index pages instead of scanning the
//! table's `id` column (~30–40 ms per million rows here, warm).
//!
//! The fold keeps it, in commits of its plan, so recovery knows them as
//! the fold's own (as it does the fold's compaction): created by the first
//! fold that leaves the table with rows; after that each fold indexes only
//! the fragments it added, as a delta segment (cost: its own rows), and
//! merges the segments into one when there are more than `MAX_SEGMENTS`.
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
    let segments = ds
        .load_indices_by_name(ID_INDEX)
        .await
        .ctx(format!("indexes of {table}"))?
        .len();
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
            OptimizeOptions::merge(segments)
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
