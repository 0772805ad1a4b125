//! Arrow helpers the fold's stages share: typed column reads (a missing or
//! mistyped column is `Corrupt`, never a default), picking and dropping rows,
//! and scanning a table.

use std::collections::HashSet;

use arrow::array::{Array, BooleanArray, RecordBatch, StringArray, TimestampMillisecondArray};
use arrow::compute::{concat_batches, filter_record_batch};
use arrow_schema::SchemaRef;
use futures::TryStreamExt;
use lance::Dataset;

use crate::error::{Context, Error, Result};
use crate::schema::{GraphSchema, ID, PENDING_SINCE};

/// One row of a batch.
#[derive(Debug, Clone)]
pub(crate) struct RowRef {
    pub rows: RecordBatch,
    pub index: usize,
}

/// A Utf8 column of `rows`.
pub(crate) fn strings<'a>(rows: &'a RecordBatch, col: &str) -> Result<&'a StringArray> {
    rows.column_by_name(col)
        .and_then(|c| c.as_any().downcast_ref::<StringArray>())
        .ok_or_else(|| Error::Corrupt(format!("rows lack a Utf8 column {col}")))
}

/// The Utf8 value of `col` at row `i`.
pub(crate) fn str_at(rows: &RecordBatch, col: &str, i: usize) -> Result<String> {
    Ok(strings(rows, col)?.value(i).to_string())
}

/// The `_pending_since` column of a `_pending/<Edge>` batch.
pub(crate) fn pending_since(rows: &RecordBatch) -> Result<&TimestampMillisecondArray> {
    rows.column_by_name(PENDING_SINCE)
        .and_then(|c| c.as_any().downcast_ref::<TimestampMillisecondArray>())
        .ok_or_else(|| Error::Corrupt(format!("pending rows lack {PENDING_SINCE}")))
}

/// The primary key of a table the graph commit pins.
pub(crate) fn pk_of(schema: &GraphSchema, table: &str) -> Result<&'static str> {
    schema
        .tables()
        .into_iter()
        .find(|t| t.name == table)
        .map(|t| t.pk)
        .ok_or_else(|| Error::Corrupt(format!("{table} is not a table of the graph")))
}

/// The ids of `rows` (none for no rows).
pub(crate) fn id_set(rows: Option<&RecordBatch>) -> Result<HashSet<String>> {
    let Some(rows) = rows else {
        return Ok(HashSet::new());
    };
    Ok(strings(rows, ID)?
        .iter()
        .flatten()
        .map(str::to_string)
        .collect())
}

/// Selected rows (each batch holding `schema`'s columns first), as one
/// batch. One `interleave` over the distinct source batches (the same
/// column arrays: the same batch), not a slice and a copy per row.
pub(crate) fn rows_of<'a>(
    schema: &SchemaRef,
    picks: impl IntoIterator<Item = &'a RowRef>,
) -> Result<Option<RecordBatch>> {
    let cols = (0..schema.fields().len()).collect::<Vec<_>>();
    let same = |a: &RecordBatch, b: &RecordBatch| {
        cols.iter()
            .all(|&i| std::sync::Arc::ptr_eq(a.column(i), b.column(i)))
    };
    let mut sources: Vec<RecordBatch> = Vec::new();
    let mut at: Vec<(usize, usize)> = Vec::new();
    for p in picks {
        let b = match sources.iter().position(|s| same(s, &p.rows)) {
            Some(b) => b,
            None => {
                sources.push(p.rows.project(&cols).ctx("pick rows")?);
                sources.len() - 1
            }
        };
        at.push((b, p.index));
    }
    if at.is_empty() {
        return Ok(None);
    }
    let batches: Vec<&RecordBatch> = sources.iter().collect();
    let one = arrow::compute::interleave_record_batch(&batches, &at).ctx("pick rows")?;
    RecordBatch::try_new(schema.clone(), one.columns().to_vec())
        .map(Some)
        .ctx("pick rows")
}

/// `rows` without the rows at `bad`.
pub(crate) fn drop_rows(
    rows: &RecordBatch,
    bad: impl Iterator<Item = usize>,
) -> Result<RecordBatch> {
    let mut keep = vec![true; rows.num_rows()];
    for i in bad {
        keep[i] = false;
    }
    filter_record_batch(rows, &BooleanArray::from(keep)).ctx("drop rejected rows")
}

/// Every row of `ds` (at its checked-out version), optionally projected.
pub(crate) async fn read_all(ds: &Dataset, cols: Option<&[&str]>) -> Result<Vec<RecordBatch>> {
    crate::graph::scan(ds, None, cols).await
}

/// Calls `f` on each batch of `ds` (at its checked-out version), projected
/// to `cols`, as the scan yields it: memory follows a batch, not the table.
pub(crate) async fn scan_each(
    ds: &Dataset,
    cols: &[&str],
    mut f: impl FnMut(&RecordBatch) -> Result<()>,
) -> Result<()> {
    let what = || format!("scan {} for {cols:?}", ds.uri());
    let mut scan = ds.scan();
    scan.project(cols).ctx(what())?;
    let mut stream = scan.try_into_stream().await.ctx(what())?;
    while let Some(b) = stream.try_next().await.ctx(what())? {
        f(&b)?;
    }
    Ok(())
}

/// A hash set for per-row probes of base columns (foldhash, not SipHash:
/// the keys are ours and the probes run once per base row).
pub(crate) type FastSet<T> = HashSet<T, foldhash::fast::RandomState>;

/// The non-empty batches as one, or `None`.
pub(crate) fn concat_all(batches: Vec<RecordBatch>) -> Result<Option<RecordBatch>> {
    let batches: Vec<RecordBatch> = batches.into_iter().filter(|b| b.num_rows() > 0).collect();
    if batches.is_empty() {
        return Ok(None);
    }
    concat_batches(&batches[0].schema(), &batches)
        .map(Some)
        .ctx("concat")
}

/// The fold rejects whose id `_ingest_rejects` does not hold at `base` (the
/// parent commit's pins): the others were recorded, and delivered, by an
/// earlier commit.
pub(crate) async fn unrecorded(
    graph: &crate::graph::Graph,
    base: &std::collections::BTreeMap<String, u64>,
    rejects: Vec<crate::rejects::Reject>,
) -> Result<Vec<crate::rejects::Reject>> {
    use crate::schema::REJECTS_TABLE;
    let (false, Some(&version)) = (rejects.is_empty(), base.get(REJECTS_TABLE)) else {
        return Ok(rejects);
    };
    let ds = graph.open_table(REJECTS_TABLE, Some(version)).await?;
    let ids: Vec<String> = rejects
        .iter()
        .map(|r| format!("'{}'", r.reject_id.replace('\'', "''")))
        .collect();
    let filter = format!("reject_id IN ({})", ids.join(", "));
    let mut held = HashSet::new();
    for b in crate::graph::scan(&ds, Some(&filter), Some(&["reject_id"])).await? {
        for i in 0..b.num_rows() {
            held.insert(str_at(&b, "reject_id", i)?);
        }
    }
    if held.is_empty() {
        return Ok(rejects);
    }
    tracing::info!(
        again = held.len(),
        "fold rejects an earlier commit recorded (records read again after a crash); its row and delivery stand"
    );
    Ok(rejects
        .into_iter()
        .filter(|r| !held.contains(&r.reject_id))
        .collect())
}
