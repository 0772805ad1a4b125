//! Arrow helpers the fold's stages share: typed column reads (a missing or
//! mistyped column is `Corrupt`, never a default), picking and dropping rows,
//! and scanning a table.

use std::collections::HashSet;

use arrow::array::{Array, BooleanArray, RecordBatch, StringArray, TimestampMillisecondArray};
use arrow::compute::{concat_batches, filter_record_batch};
use arrow_schema::SchemaRef;
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

/// Selected rows (each batch holding `schema`'s columns first), as one batch.
pub(crate) fn rows_of<'a>(
    schema: &SchemaRef,
    picks: impl IntoIterator<Item = &'a RowRef>,
) -> Result<Option<RecordBatch>> {
    let cols = (0..schema.fields().len()).collect::<Vec<_>>();
    let parts: Vec<RecordBatch> = picks
        .into_iter()
        .map(|p| p.rows.project(&cols).map(|b| b.slice(p.index, 1)))
        .collect::<std::result::Result<_, _>>()
        .ctx("pick rows")?;
    if parts.is_empty() {
        return Ok(None);
    }
    let one = concat_batches(&parts[0].schema(), &parts).ctx("pick rows")?;
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
