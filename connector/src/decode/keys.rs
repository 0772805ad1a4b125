//! Kafka keys: the `@key` parts a key holds (`key = "kafka"`, node
//! tombstones), the id a tombstone deletes, and under partition sharding
//! the checks that a keyed record sits on its key's partition (`misplaced`)
//! and that its key names its row (`check_partition_keys`). A key is text,
//! a JSON string, or a JSON array for a composite key, whatever the value's
//! format.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, StringArray};
use arrow::compute::{cast_with_options, CastOptions};

use crate::error::{Context, Result};
use crate::rejects::RejectCode;
use crate::schema::canonical_ids;

use super::checks::Checked;
use super::partitioner::partition_of;
use super::shape::Shape;
use super::{bad, Fail, RecordDecoder, SourceRecord, Step};

impl RecordDecoder {
    /// The typed `@key` parts from Kafka keys: a string (optionally a JSON
    /// string) for a single key, a JSON array for a composite one.
    pub(super) fn key_from_kafka(&self, recs: &[SourceRecord<'_>]) -> Step<Vec<ArrayRef>> {
        let width = self.ty.key.len();
        let mut texts: Vec<Vec<String>> = vec![Vec::with_capacity(recs.len()); width];
        for r in recs {
            let Some(key) = r.key else {
                return bad(
                    RejectCode::MissingKey,
                    "record has no Kafka key, and the key is needed",
                );
            };
            let parts =
                split_key(key, width).map_err(|m| Fail::Record(RejectCode::MissingKey, m))?;
            for (t, p) in texts.iter_mut().zip(parts) {
                t.push(p);
            }
        }
        let mut out = Vec::with_capacity(width);
        for (k, t) in self.ty.key.iter().zip(texts) {
            let target = self
                .ty
                .properties
                .field_with_name(k)
                .expect("key")
                .data_type();
            let strings: ArrayRef = Arc::new(StringArray::from(t));
            let typed = cast_with_options(&strings, target, &CastOptions::default())
                .ctx(format!("cast key {k}"))?;
            if typed.null_count() > 0 {
                return bad(
                    RejectCode::MissingKey,
                    format!("key part {k} is not a valid {target}"),
                );
            }
            out.push(typed);
        }
        Ok(out)
    }

    /// The id a tombstone deletes: the node's key from the Kafka key, or
    /// the edge id itself.
    pub(super) fn tombstone_id(&self, r: &SourceRecord<'_>) -> Step<String> {
        let Some(key) = r.key else {
            return bad(
                RejectCode::BadTombstone,
                "a tombstone (null value) needs a Kafka key naming what to delete",
            );
        };
        match &self.shape {
            Shape::Node(_) => {
                let parts = self.key_from_kafka(std::slice::from_ref(r))?;
                let ids = canonical_ids(&parts)?;
                Ok(ids.value(0).to_string())
            }
            Shape::Edge { .. } => match std::str::from_utf8(key) {
                Ok(k) if !k.is_empty() => Ok(k.to_string()),
                _ => bad(
                    RejectCode::BadTombstone,
                    "an edge tombstone's Kafka key must be the edge id (non-empty UTF-8)",
                ),
            },
        }
    }

    /// Under `wal.partitioner`, why a keyed record is not on its key's
    /// partition (a record without a key is left to the key checks).
    pub(super) fn misplaced(&self, r: &SourceRecord<'_>) -> Option<String> {
        let (p, n) = self.placement?;
        let key = r.key?;
        let want = partition_of(p, key, n);
        (want != r.partition).then(|| {
            format!(
                "the Kafka key {:?} hashes to partition {want} of {n} under wal.partitioner = {p:?}, \
                 but the record is on partition {}: its producer used another partitioner, or \
                 the topic was resized",
                String::from_utf8_lossy(key),
                r.partition
            )
        })
    }

    /// Under partition sharding, rows whose Kafka key does not name their
    /// id leave the batch as `partition_key_mismatch`.
    pub(super) fn check_partition_keys(
        &self,
        records: &[SourceRecord<'_>],
        upserts: Option<RecordBatch>,
        up_idx: Vec<usize>,
    ) -> Result<Checked> {
        let Some(rows) = upserts.as_ref().filter(|_| self.check_partition_key) else {
            return Ok(Checked::unchanged(upserts, up_idx));
        };
        let ids = rows
            .column(0)
            .as_any()
            .downcast_ref::<StringArray>()
            .expect("id is the first column");
        let refused: Vec<(usize, RejectCode, String)> = (0..rows.num_rows())
            .filter_map(|row| {
                let r = &records[up_idx[row]];
                let id = ids.value(row);
                self.key_names(r, id).err().map(|m| {
                    let m = format!("{m}; under wal.sharding = \"partition\" the Kafka key must be the row id {id:?}, so that one id always lands on one partition");
                    (row, RejectCode::PartitionKeyMismatch, m)
                })
            })
            .collect();
        if refused.is_empty() {
            return Ok(Checked::unchanged(upserts, up_idx));
        }
        self.refuse_rows(records, rows, up_idx, refused)
    }

    /// Whether the record's Kafka key names `id` (the same canonical id
    /// the mapping would make of it), else what is wrong.
    fn key_names(&self, r: &SourceRecord<'_>, id: &str) -> std::result::Result<(), String> {
        let Some(key) = r.key else {
            return Err("the record has no Kafka key".into());
        };
        if key == id.as_bytes() {
            return Ok(());
        }
        let named = match &self.shape {
            Shape::Node(_) => self
                .key_from_kafka(std::slice::from_ref(r))
                .ok()
                .and_then(|parts| canonical_ids(&parts).ok())
                .map(|ids| ids.value(0).to_string()),
            // `[src, dst]`: the key as a JSON array of the same scalars.
            Shape::Edge { .. } => match serde_json::from_slice::<serde_json::Value>(key) {
                Ok(serde_json::Value::Array(items)) => items
                    .iter()
                    .map(scalar_text)
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .ok()
                    .map(|v| serde_json::to_string(&v).expect("strings serialize")),
                _ => None,
            },
        };
        match named {
            Some(k) if k == id => Ok(()),
            _ => Err(format!(
                "the Kafka key {:?} names another id",
                String::from_utf8_lossy(key)
            )),
        }
    }
}

/// Splits a Kafka key into `width` textual parts.
pub(super) fn split_key(key: &[u8], width: usize) -> std::result::Result<Vec<String>, String> {
    let text = std::str::from_utf8(key).map_err(|_| "record key is not UTF-8".to_string())?;
    if width == 1 {
        if text.starts_with('"') {
            if let Ok(serde_json::Value::String(s)) = serde_json::from_str(text) {
                return Ok(vec![s]);
            }
        }
        return Ok(vec![text.to_string()]);
    }
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Array(items)) if items.len() == width => {
            items.iter().map(scalar_text).collect()
        }
        _ => Err(format!(
            "composite key must be a JSON array of {width} values, got {text:?}"
        )),
    }
}

/// The canonical text of a JSON scalar key part.
pub(super) fn scalar_text(v: &serde_json::Value) -> std::result::Result<String, String> {
    match v {
        serde_json::Value::String(s) => Ok(s.clone()),
        serde_json::Value::Number(n) => Ok(n.to_string()),
        serde_json::Value::Bool(b) => Ok(b.to_string()),
        other => Err(format!("key part {other} is not a scalar")),
    }
}
