//! A typed reader of the provenance columns (`_src_topic`, `_src_partition`,
//! `_src_offset`, `_src_timestamp`) of a type table's rows: where each row's
//! record sits in Kafka. One reader, so a missing or mistyped column is one
//! error (`Corrupt`), never a silent default.

use arrow::array::{
    Array, Int32Array, Int64Array, RecordBatch, StringArray, TimestampMillisecondArray,
};

use super::{SRC_OFFSET, SRC_PARTITION, SRC_TIMESTAMP, SRC_TOPIC};
use crate::error::{Error, Result};

/// A record's coordinates in Kafka.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub timestamp: Option<i64>,
}

/// The provenance columns of one batch, typed.
pub(crate) struct Provenance<'a> {
    topic: &'a StringArray,
    partition: &'a Int32Array,
    offset: &'a Int64Array,
    timestamp: &'a TimestampMillisecondArray,
}

impl<'a> Provenance<'a> {
    /// The batch's provenance columns; `Corrupt` when one is missing or mistyped.
    pub(crate) fn of(rows: &'a RecordBatch) -> Result<Provenance<'a>> {
        Ok(Provenance {
            topic: column(rows, SRC_TOPIC)?,
            partition: column(rows, SRC_PARTITION)?,
            offset: column(rows, SRC_OFFSET)?,
            timestamp: column(rows, SRC_TIMESTAMP)?,
        })
    }

    /// The batch's `_src_partition` column alone (a scan that reads only it).
    pub(crate) fn partitions(rows: &'a RecordBatch) -> Result<&'a Int32Array> {
        column(rows, SRC_PARTITION)
    }

    /// Row `i`'s record, when topic, partition and offset are all set.
    pub(crate) fn source(&self, i: usize) -> Option<Source> {
        let set = self.topic.is_valid(i) && self.partition.is_valid(i) && self.offset.is_valid(i);
        set.then(|| Source {
            topic: self.topic.value(i).to_string(),
            partition: self.partition.value(i),
            offset: self.offset.value(i),
            timestamp: self.timestamp.is_valid(i).then(|| self.timestamp.value(i)),
        })
    }

    /// Row `i`'s place in Kafka order within its partition (unset parts
    /// sort first), for "the earliest record wins".
    pub(crate) fn order_key(&self, i: usize) -> (String, i32, i64) {
        let topic = if self.topic.is_valid(i) {
            self.topic.value(i)
        } else {
            ""
        };
        let partition = if self.partition.is_valid(i) {
            self.partition.value(i)
        } else {
            -1
        };
        let offset = if self.offset.is_valid(i) {
            self.offset.value(i)
        } else {
            -1
        };
        (topic.to_string(), partition, offset)
    }
}

fn column<'a, T: 'static>(rows: &'a RecordBatch, name: &str) -> Result<&'a T> {
    rows.column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<T>())
        .ok_or_else(|| Error::Corrupt(format!("rows lack a well-typed provenance column {name}")))
}
