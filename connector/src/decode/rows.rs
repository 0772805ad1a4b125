//! Rows of one batch of records: the values through the format, then the
//! columns it hands over → rows in the table schema (the `@key` or the
//! edge-id rule makes `id`, endpoints become `src`/`dst`, provenance from
//! the record's coordinates); tombstones → the ids they delete. Reads only
//! columns and Kafka keys, never a value's bytes.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{
    new_null_array, Array, ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray,
    TimestampMillisecondArray,
};
use arrow::compute::concat_batches;
use arrow_schema::{DataType, SchemaRef};

use crate::config::{KeyOrigin, KeySource};
use crate::error::{Context, Error, Result};
use crate::rejects::RejectCode;
use crate::schema::{canonical_ids, ID, SRC_OFFSET, SRC_PARTITION, SRC_TIMESTAMP, SRC_TOPIC};

use super::shape::{EdgeId, Endpoint, Shape};
use super::{bad, Fail, RecordDecoder, SourceRecord, Step};

/// Rows of one batch of records, before validation and last-write-wins.
#[derive(Default)]
pub(super) struct Part {
    /// One row per upsert record, in the table schema.
    pub(super) rows: Vec<RecordBatch>,
    /// Index (of the record) of each row of `rows`, concatenated.
    pub(super) up_idx: Vec<usize>,
    pub(super) del_ids: Vec<String>,
    pub(super) del_idx: Vec<usize>,
}

impl Part {
    /// `rows` as one batch, if any.
    pub(super) fn upserts(&mut self, schema: &SchemaRef) -> Result<Option<RecordBatch>> {
        Ok(match self.rows.len() {
            0 => None,
            1 => self.rows.pop(),
            _ => Some(concat_batches(schema, &self.rows).ctx("concat decoded rows")?),
        })
    }
}

impl RecordDecoder {
    /// Decodes `records` as one batch; any bad record fails all of them.
    pub(super) fn part(&mut self, records: &[SourceRecord<'_>]) -> Step<Part> {
        let mut part = Part::default();
        let mut ups: Vec<SourceRecord<'_>> = Vec::new();
        let mut values: Vec<&[u8]> = Vec::new();
        for (i, r) in records.iter().enumerate() {
            match r.value {
                Some(v) => {
                    part.up_idx.push(i);
                    ups.push(*r);
                    values.push(v);
                }
                None => {
                    part.del_ids.push(self.tombstone_id(r)?);
                    part.del_idx.push(i);
                }
            }
        }
        if !ups.is_empty() {
            let batch = self.format.decode(&values)?;
            let rows = match &self.shape {
                Shape::Node(_) => self.node_rows(&ups, batch)?,
                Shape::Edge { .. } => self.edge_rows(&ups, batch)?,
            };
            part.rows.push(rows);
        }
        Ok(part)
    }

    /// Fills the key properties, derives `id`, appends provenance, and
    /// orders the columns as the table declares them.
    fn node_rows(&self, recs: &[SourceRecord<'_>], batch: RecordBatch) -> Step<RecordBatch> {
        let Shape::Node(key) = &self.shape else {
            unreachable!("nodes only")
        };
        let mut cols = columns_by_name(&batch);
        let from_elsewhere = match key {
            KeySource::Named(KeyOrigin::Value) => None,
            KeySource::Named(KeyOrigin::Kafka) => Some(self.key_from_kafka(recs)?),
            KeySource::Field { field } if !self.ty.key.contains(field) => {
                let c = cols.remove(field).expect("decoded");
                Some(vec![c])
            }
            KeySource::Field { .. } => None,
        };
        if let Some(parts) = from_elsewhere {
            for (k, part) in self.ty.key.iter().zip(parts) {
                let decoded = &cols[k];
                for i in 0..recs.len() {
                    if part.is_null(i) {
                        return bad(RejectCode::MissingKey, format!("missing key for @key {k}"));
                    }
                    if decoded.is_valid(i) && !same_value(decoded, &part, i)? {
                        return bad(
                            RejectCode::KeyMismatch,
                            format!("value's {k} disagrees with the record key"),
                        );
                    }
                }
                cols.insert(k.clone(), part);
            }
        }
        let parts: Vec<ArrayRef> = self.ty.key.iter().map(|k| cols[k].clone()).collect();
        for (k, p) in self.ty.key.iter().zip(&parts) {
            if p.null_count() > 0 {
                return bad(RejectCode::MissingKey, format!("missing @key property {k}"));
            }
        }
        let ids = canonical_ids(&parts)?;
        cols.insert(ID.into(), Arc::new(ids));
        self.finish(recs, cols)
    }

    /// Edge rows: endpoints from their fields, the id by the mapping's rule.
    fn edge_rows(&self, recs: &[SourceRecord<'_>], batch: RecordBatch) -> Step<RecordBatch> {
        let Shape::Edge { id, src, dst } = &self.shape else {
            unreachable!("edges only")
        };
        let mut cols = columns_by_name(&batch);
        let src_ids = self.endpoint_ids(src, &mut cols)?;
        let dst_ids = self.endpoint_ids(dst, &mut cols)?;
        let ids: StringArray = match id {
            EdgeId::Kafka => {
                let mut v = Vec::with_capacity(recs.len());
                for r in recs {
                    match r.key.map(std::str::from_utf8) {
                        Some(Ok(k)) if !k.is_empty() => v.push(k),
                        _ => {
                            return bad(
                                RejectCode::MissingKey,
                                "the mapping takes edge ids from the Kafka key, and it is missing or not UTF-8",
                            )
                        }
                    }
                }
                StringArray::from(v)
            }
            EdgeId::Endpoints => src_ids
                .iter()
                .zip(&dst_ids)
                .map(|(s, d)| Some(serde_json::to_string(&[s, d]).expect("strings")))
                .collect(),
            EdgeId::Coordinates => recs
                .iter()
                .map(|r| Some(format!("{}/{}/{}", r.topic, r.partition, r.offset)))
                .collect(),
        };
        cols.insert(ID.into(), Arc::new(ids));
        cols.insert("src".into(), Arc::new(StringArray::from(src_ids)));
        cols.insert("dst".into(), Arc::new(StringArray::from(dst_ids)));
        self.finish(recs, cols)
    }

    /// Canonical node ids of one endpoint, per record. A composite
    /// endpoint's column holds its canonical text already (format.rs), and
    /// as one Utf8 part `canonical_ids` keeps it as it is.
    fn endpoint_ids(
        &self,
        e: &Endpoint,
        cols: &mut HashMap<String, ArrayRef>,
    ) -> Step<Vec<String>> {
        let col = cols.remove(&e.field).expect("decoded");
        if col.null_count() > 0 {
            return bad(
                RejectCode::MissingEndpoint,
                format!(
                    "edge {} needs field {:?} (its endpoint's key)",
                    self.ty.name, e.field
                ),
            );
        }
        let ids = canonical_ids(&[col])?;
        Ok(ids
            .iter()
            .map(|v| v.unwrap_or_default().to_string())
            .collect())
    }

    /// Appends provenance and orders the columns as the table declares them.
    fn finish(
        &self,
        recs: &[SourceRecord<'_>],
        mut cols: HashMap<String, ArrayRef>,
    ) -> Step<RecordBatch> {
        let n = recs.len();
        cols.insert(
            SRC_TOPIC.into(),
            Arc::new(StringArray::from_iter_values(recs.iter().map(|r| r.topic))),
        );
        cols.insert(
            SRC_PARTITION.into(),
            Arc::new(Int32Array::from_iter_values(
                recs.iter().map(|r| r.partition),
            )),
        );
        cols.insert(
            SRC_OFFSET.into(),
            Arc::new(Int64Array::from_iter_values(recs.iter().map(|r| r.offset))),
        );
        cols.insert(
            SRC_TIMESTAMP.into(),
            Arc::new(
                recs.iter()
                    .map(|r| r.timestamp)
                    .collect::<TimestampMillisecondArray>()
                    .with_timezone("UTC"),
            ),
        );
        let schema = self.ty.table_schema.clone();
        let columns: Vec<ArrayRef> = schema
            .fields()
            .iter()
            .map(|f| {
                cols.remove(f.name())
                    .unwrap_or_else(|| new_null_array(f.data_type(), n))
            })
            .collect();
        for (f, c) in schema.fields().iter().zip(&columns) {
            if !f.is_nullable() && c.null_count() > 0 {
                return bad(
                    RejectCode::MissingRequired,
                    format!("required property {} is missing or null", f.name()),
                );
            }
        }
        RecordBatch::try_new(schema, columns)
            .map_err(|e| Fail::System(Error::Bug(format!("{}: {e}", self.ty.name))))
    }
}

fn columns_by_name(batch: &RecordBatch) -> HashMap<String, ArrayRef> {
    batch
        .schema()
        .fields()
        .iter()
        .zip(batch.columns())
        .map(|(f, c)| (f.name().clone(), c.clone()))
        .collect()
}

/// Whether row `i` of two key columns holds the same value, compared as text.
fn same_value(a: &ArrayRef, b: &ArrayRef, i: usize) -> Result<bool> {
    let s = |x: &ArrayRef| -> Result<String> {
        let c = arrow::compute::cast(&x.slice(i, 1), &DataType::Utf8).ctx("compare key")?;
        Ok(c.as_any()
            .downcast_ref::<StringArray>()
            .map(|c| c.value(0).to_string())
            .unwrap_or_default())
    };
    Ok(s(a)? == s(b)?)
}
