//! Canonical text of values: a row as JSON (a reject's `row`), and the `id`
//! of key parts. Decode and fold both use these, so an id or a tuple is
//! spelled one way everywhere.

use arrow::array::{Array, ArrayRef, RecordBatch, StringArray};
use arrow_schema::DataType;

use crate::error::{Context, Result};

/// One row as a JSON object (for a reject's `row`).
pub(crate) fn row_json(batch: &RecordBatch, i: usize) -> Option<String> {
    let mut w = arrow_json::LineDelimitedWriter::new(Vec::new());
    w.write(&batch.slice(i, 1)).ok()?;
    w.finish().ok()?;
    String::from_utf8(w.into_inner())
        .ok()
        .map(|s| s.trim_end().to_string())
}

/// `id` from the key parts: the canonical string of a single key, the JSON
/// array of canonical strings of a composite one.
pub(crate) fn canonical_ids(parts: &[ArrayRef]) -> Result<StringArray> {
    let texts: Vec<ArrayRef> = parts
        .iter()
        .map(|p| arrow::compute::cast(p, &DataType::Utf8).ctx("key to text"))
        .collect::<Result<_>>()?;
    let texts: Vec<&StringArray> = texts
        .iter()
        .map(|t| t.as_any().downcast_ref::<StringArray>().expect("utf8"))
        .collect();
    if texts.len() == 1 {
        return Ok(texts[0].clone());
    }
    let n = texts.first().map(|t| t.len()).unwrap_or(0);
    Ok((0..n)
        .map(|i| {
            let v: Vec<&str> = texts.iter().map(|t| t.value(i)).collect();
            Some(serde_json::to_string(&v).expect("strings serialize"))
        })
        .collect())
}
