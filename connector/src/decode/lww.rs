//! Last write wins within a poll: of the accepted records of one id (of
//! one id and partition, under partition sharding), only the last in Kafka
//! order leaves the decoder, as an upsert row or a tombstone key.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Int32Array, RecordBatch, StringArray, UInt32Array};
use arrow::compute::take;
use arrow_schema::{DataType, Field, Schema};

use crate::error::{Context, Result};
use crate::schema::{ID, SRC_PARTITION};

use super::{Decoded, RecordDecoder, SourceRecord};

impl RecordDecoder {
    /// Within the poll, the last record per id wins (Kafka order). Deletes
    /// carry their record's partition (`_src_partition`): what
    /// partition sharding routes them by (Lance reads only their key).
    pub(super) fn last_write_wins(
        &self,
        records: &[SourceRecord<'_>],
        upserts: Option<RecordBatch>,
        up_idx: &[usize],
        del_ids: Vec<String>,
        del_idx: &[usize],
    ) -> Result<Decoded> {
        let up_ids = upserts.as_ref().map(|rows| {
            rows.column(0)
                .as_any()
                .downcast_ref::<StringArray>()
                .expect("id is the first column")
                .clone()
        });
        // Under partition sharding a row's shard is its partition, so the
        // last write wins per (partition, id): rows of one id from two
        // partitions both reach their shards, where the fold refuses the
        // breach (`shard_conflict`) instead of this merge hiding it.
        let per_partition = self.per_partition;
        let part = |r: usize| {
            if per_partition {
                records[r].partition
            } else {
                0
            }
        };
        // foldhash, not SipHash: one probe per record on the hot path, keys
        // from the poll itself.
        let mut last: HashMap<(&str, i32), usize, foldhash::fast::RandomState> =
            HashMap::with_capacity_and_hasher(up_idx.len() + del_idx.len(), Default::default());
        if let Some(ids) = &up_ids {
            for (i, &r) in up_idx.iter().enumerate() {
                let e = last.entry((ids.value(i), part(r))).or_insert(r);
                *e = (*e).max(r);
            }
        }
        for (id, &r) in del_ids.iter().zip(del_idx) {
            let e = last.entry((id.as_str(), part(r))).or_insert(r);
            *e = (*e).max(r);
        }
        let mut out = Decoded::default();
        if let (Some(rows), Some(ids)) = (upserts, &up_ids) {
            let k: UInt32Array = (0..ids.len())
                .filter(|&i| last[&(ids.value(i), part(up_idx[i]))] == up_idx[i])
                .map(|i| i as u32)
                .collect();
            if !k.is_empty() {
                out.upserts = Some(if k.len() == rows.num_rows() {
                    rows
                } else {
                    take_rows(&rows, &k)?
                });
            }
        }
        let (kept, partitions): (Vec<&str>, Vec<i32>) = del_ids
            .iter()
            .zip(del_idx)
            .filter(|(id, &r)| last[&(id.as_str(), part(r))] == r)
            .map(|(id, &r)| (id.as_str(), records[r].partition))
            .unzip();
        if !kept.is_empty() {
            let schema = Arc::new(Schema::new(vec![
                Field::new(ID, DataType::Utf8, false),
                Field::new(SRC_PARTITION, DataType::Int32, false),
            ]));
            let cols: Vec<ArrayRef> = vec![
                Arc::new(StringArray::from(kept)),
                Arc::new(Int32Array::from(partitions)),
            ];
            out.deletes = Some(RecordBatch::try_new(schema, cols).ctx("tombstones")?);
        }
        Ok(out)
    }
}

fn take_rows(batch: &RecordBatch, idx: &UInt32Array) -> Result<RecordBatch> {
    let cols = batch
        .columns()
        .iter()
        .map(|c| take(c, idx, None))
        .collect::<std::result::Result<Vec<_>, _>>()
        .ctx("select rows")?;
    RecordBatch::try_new(batch.schema(), cols).ctx("select rows")
}
