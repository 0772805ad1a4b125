//! Decode: Kafka records of one mapping → one Arrow batch of upserts in the
//! table's schema, one batch of tombstone keys, and a typed reject for every
//! record that cannot become a row (bad bytes, JSON, types, keys, endpoints,
//! enum, `@range`, `@check`). Ids come from the `@key` (nodes) or the
//! mapping's edge-id rule; provenance comes from the record's coordinates.
//! It knows nothing of shards or offsets.
//!
//! The stages of `RecordDecoder::decode`, in order:
//! 1. screen (here) — what one record shows on its own, before any batch
//!    work: oversized, on another partition than its key's
//!    (`keys::misplaced`), a key its `key_format` cannot read (keys in a
//!    registry format become plain text here, `key_format`), or a value
//!    its format refuses outright;
//! 2. `split` — the rest as one batch, split around bad records so each
//!    fails alone; a batch goes through
//!    - `format` — the seam: the values → one Arrow batch in the value
//!      schema (`shape`), by the mapping's format (`json`, `avro`,
//!      `json_schema`, `protobuf`), and
//!    - `rows` — that batch → rows in the table schema (id, endpoints,
//!      provenance), tombstones → the ids they delete (`keys`);
//! 3. `checks` — the `.pg` constraints (enum, `@range`, `@check`);
//! 4. `keys` — under partition sharding, the Kafka key must name the row;
//! 5. `lww` — the last write per id wins within the poll.
//!
//! A record refused at any stage leaves the batch as a reject; the others
//! go on. `partitioner` gives the partition a producer's partitioner picks.
//!
//! The value formats, one file each, listed once in `value_formats!`
//! below, each a type implementing `ValueFormat` (format.rs):
//! - `json` — arrow-json; `json/screen.rs` parses each value with
//!   serde_json first (JSON syntax, and the number rules under `coerce =
//!   "strict"`); `json/fit.rs` is the one judge of whether a JSON value
//!   fits a column type, which the screen and `classify` both ask;
//! - `avro` — arrow-avro, a decoder per writer schema id with a reader
//!   schema made from the type (`avro/schema.rs`);
//! - `json_schema` — the JSON path after the wire prefix;
//! - `protobuf` — prost-reflect over descriptors from the registry,
//!   compiled by protox when it gives text.
//!
//! The registry formats `learn` each schema id before `decode` sees its
//! records, and keep what they learned in `schema_ids`. Framed keys are
//! read by the same formats (`key_format`). `shape` is a mapping's value
//! schema, id and endpoint rules; `rows` reads the columns a format hands
//! over, never a value's bytes. Under a change envelope or field paths,
//! `envelope/` turns each record into an upsert of a flat JSON object, a
//! delete of the key it names, a no-op, or a reject, before the stages
//! (`events`: Debezium and `op_field` events; `avro`: Debezium events in
//! Avro; `fields`: the JSON Pointer paths; `encodings`: Debezium's epoch
//! and decimal encodings; docs/cdc.md).

mod checks;
mod envelope;
mod format;
mod key_format;
mod keys;
mod lww;
mod partitioner;
mod rows;
mod schema_ids;
mod shape;
mod split;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow_schema::Schema;
use rdkafka::message::BorrowedMessage;
use rdkafka::Message;

use crate::config::{KeyOrigin, KeySource, Mapping, Partitioner, ValueFormatName};
use crate::error::{Error, PublicResult, Result};
use crate::registry;
use crate::rejects::{owned_headers, Origin, Reject, RejectCode};
use crate::schema::{GraphSchema, GraphType, TypeKind};
use crate::validate::Validator;

use envelope::{Change, Unwrap};
pub(crate) use format::{Learned, WriterField};
use format::{ValueFormat, ValueSchema};
use key_format::{KeyFormat, PlainKey};
#[cfg(test)]
use partitioner::partition_of;
use shape::{EdgeId, Shape};

/// The value formats, one line each: `ValueFormatName` variant => its
/// file :: the type there that implements `ValueFormat` (format.rs). The
/// line declares the file's module and routes `value_format` and
/// `writer_fields` to the type; the `match`es it makes are exhaustive, so
/// a name without a line does not compile.
macro_rules! value_formats {
    ($($name:ident => $file:ident :: $ty:ident,)+) => {
        $(mod $file;)+

        /// The value format a mapping names (`format`).
        fn value_format(
            mapping: &Mapping,
            ty: &GraphType,
            values: ValueSchema,
            batch_size: usize,
        ) -> Result<Box<dyn ValueFormat>> {
            Ok(match mapping.format {
                $(ValueFormatName::$name => {
                    Box::new($file::$ty::new(mapping, ty, values, batch_size)?)
                })+
            })
        }

        /// `[graph] evolve = "from_registry"`: the top-level fields of
        /// `schema`, a writer schema of `format` (`message`: the mapping's
        /// Protobuf message, else the file's first).
        pub(crate) fn writer_fields(
            format: ValueFormatName,
            schema: &registry::Schema,
            message: Option<&str>,
        ) -> std::result::Result<Vec<WriterField>, String> {
            match format {
                $(ValueFormatName::$name => {
                    <$file::$ty as ValueFormat>::writer_fields(schema, message)
                })+
            }
        }
    };
}

value_formats! {
    Json => json::JsonFormat,
    Avro => avro::AvroFormat,
    JsonSchema => json_schema::JsonSchemaFormat,
    Protobuf => protobuf::ProtobufFormat,
}

/// One consumed record, borrowed from the poll.
#[derive(Clone, Copy)]
pub struct SourceRecord<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub timestamp: Option<i64>,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    /// The Kafka message, read for its headers only when the record is
    /// rejected: librdkafka parses (and frees) a message's headers on the
    /// first `headers()` call, a cost every record paid before.
    pub message: Option<&'a BorrowedMessage<'a>>,
}

impl SourceRecord<'_> {
    /// The record's coordinates and bytes, owned, for a reject.
    pub fn origin(&self) -> Origin {
        Origin {
            topic: self.topic.to_string(),
            partition: self.partition,
            offset: self.offset,
            timestamp: self.timestamp,
            key: self.key.map(<[u8]>::to_vec),
            value: self.value.map(<[u8]>::to_vec),
            headers: owned_headers(self.message.and_then(|m| m.headers())),
        }
    }
}

/// What one poll of one mapping becomes. A key appears in at most one of
/// the two batches: within a poll the last accepted record per key wins.
#[derive(Debug, Default)]
pub struct Decoded {
    /// Rows in the table schema.
    pub upserts: Option<RecordBatch>,
    /// `id` and the record's `_src_partition` (what partition sharding routes by).
    pub deletes: Option<RecordBatch>,
    /// Records refused, in poll order.
    pub rejects: Vec<Reject>,
}

/// Which subject a schema id belongs to: the key's or the value's
/// (TopicNameStrategy: `<topic>-key`, `<topic>-value`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Subject {
    Key,
    Value,
}

/// Why one record cannot become a row, or a failure of graphsink itself.
#[derive(Debug)]
enum Fail {
    Record(RejectCode, String),
    System(Error),
}

impl From<Error> for Fail {
    fn from(e: Error) -> Self {
        Fail::System(e)
    }
}

type Step<T> = std::result::Result<T, Fail>;

/// Rejects by the index of their record in the poll.
type Indexed = Vec<(usize, Reject)>;

fn bad<T>(code: RejectCode, message: impl Into<String>) -> Step<T> {
    Err(Fail::Record(code, message.into()))
}

/// Turns records of one topic into rows of its graph type.
pub struct RecordDecoder {
    ty: GraphType,
    shape: Shape,
    /// The values → Arrow: everything format-specific (format.rs).
    format: Box<dyn ValueFormat>,
    /// The Kafka keys → their plain text (key_format.rs).
    keys: KeyFormat,
    /// Under an envelope or field paths: each record's change, before the
    /// format (envelope/); `None` for plain values.
    unwrap: Option<Unwrap>,
    max_record_bytes: usize,
    validator: Validator,
    /// Under `partition` sharding, whether each row's id must be the one its
    /// Kafka key names (not when the id is made from the key or the
    /// record's coordinates, which agree by construction).
    check_partition_key: bool,
    /// Under `wal.partitioner`: the producers' partitioner and the topic's
    /// partition count, to check each keyed record's partition.
    placement: Option<(Partitioner, i32)>,
    /// Under partition sharding: last write wins per (partition, id).
    per_partition: bool,
    /// Batch decodes run (see `split`).
    decodes: u64,
}

impl RecordDecoder {
    pub fn new(
        schema: &GraphSchema,
        mapping: &Mapping,
        batch_size: usize,
        max_record_bytes: usize,
    ) -> PublicResult<RecordDecoder> {
        let ty = schema.get(mapping.type_name()).ok_or_else(|| {
            Error::config(format!(
                "mapping for topic {}: type {:?} is not in the schema",
                mapping.topic,
                mapping.type_name()
            ))
        })?;
        let (fields, shape) = match ty.kind {
            TypeKind::Node if mapping.is_edge() => {
                return Err(Error::config(format!(
                    "mapping for topic {}: {} is a node type; use node = ...",
                    mapping.topic, ty.name
                ))
                .into())
            }
            TypeKind::Edge if !mapping.is_edge() => {
                return Err(Error::config(format!(
                    "mapping for topic {}: {} is an edge type; use edge = ...",
                    mapping.topic, ty.name
                ))
                .into())
            }
            TypeKind::Node => shape::node_fields(ty, mapping)?,
            TypeKind::Edge => shape::edge_fields(schema, ty, mapping)?,
        };
        let values = ValueSchema {
            fields: Arc::new(Schema::new(fields)),
            composite: shape.composite_endpoints(),
        };
        let unwrap = Unwrap::new(mapping, ty, &shape, &values.fields)?;
        // Under an Avro envelope the stage hands on JSON rows.
        let rows = match &unwrap {
            Some(u) if u.avro().is_some() => &Mapping {
                format: ValueFormatName::Json,
                ..mapping.clone()
            },
            _ => mapping,
        };
        Ok(RecordDecoder {
            format: value_format(rows, ty, values, batch_size)?,
            unwrap,
            keys: KeyFormat::new(mapping, ty, &shape, batch_size)?,
            ty: ty.clone(),
            shape,
            max_record_bytes,
            validator: Validator::new(ty)?,
            check_partition_key: false,
            placement: None,
            per_partition: false,
            decodes: 0,
        })
    }

    /// Under `wal.sharding = "partition"`: the shard of a row is its source
    /// partition, which the producer chose by the Kafka key, so a key that
    /// names another id than the row's (or none) is refused as
    /// `partition_key_mismatch` before the WAL.
    ///
    /// With `placement` (the producers' partitioner and the topic's
    /// partition count), each keyed record must also sit on the partition
    /// its key hashes to, or it is refused as `wrong_partition`, before
    /// decoding (ids made of a record's coordinates excepted: any
    /// partition is theirs).
    pub fn partition_keyed(mut self, on: bool, placement: Option<(Partitioner, i32)>) -> Self {
        let coordinates = matches!(
            self.shape,
            Shape::Edge {
                id: EdgeId::Coordinates,
                ..
            }
        );
        self.placement = placement.filter(|_| on && !coordinates);
        self.per_partition = on;
        let by_construction = matches!(
            self.shape,
            Shape::Node(KeySource::Named(KeyOrigin::Kafka))
                | Shape::Edge {
                    id: EdgeId::Kafka | EdgeId::Coordinates,
                    ..
                }
        );
        self.check_partition_key = on && !by_construction;
        self
    }

    pub fn graph_type(&self) -> &GraphType {
        &self.ty
    }

    /// Registry formats: the schema ids framed in `records` that must be
    /// fetched (`learn`) before `decode`, each once, in poll order with the
    /// index of its first record.
    pub fn unlearned(&self, records: &[SourceRecord<'_>]) -> Vec<(u32, usize)> {
        let mut out: Vec<(u32, usize)> = Vec::new();
        for (i, r) in records.iter().enumerate() {
            if let Some(id) = r.value.and_then(|v| self.unlearned_id(v)) {
                if !out.iter().any(|(seen, _)| *seen == id) {
                    out.push((id, i));
                }
            }
        }
        out
    }

    /// Registry formats: the schema id framed in `value`, if it must be
    /// fetched (`learn`) before `decode`.
    pub fn unlearned_id(&self, value: &[u8]) -> Option<u32> {
        match self.unwrap.as_ref().and_then(Unwrap::avro) {
            Some(events) => events.unlearned(value),
            None => self.format.unlearned(value),
        }
    }

    /// The first schema id a record's key or value is framed with that
    /// must be fetched (`learn_subject`) before `decode`, key first.
    pub fn unlearned_subject(
        &self,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
    ) -> Option<(Subject, u32)> {
        key.and_then(|k| self.keys.unlearned(k))
            .map(|id| (Subject::Key, id))
            .or_else(|| {
                value
                    .and_then(|v| self.unlearned_id(v))
                    .map(|id| (Subject::Value, id))
            })
    }

    /// Whether the registry should be asked for Protobuf's serialized
    /// descriptor (`format=serialized`) rather than the text.
    pub fn wants_descriptor(&self, subject: Subject) -> bool {
        match subject {
            Subject::Key => self.keys.wants_descriptor(),
            Subject::Value => self.format.wants_descriptor(),
        }
    }

    /// Registry formats: why values of schema `id` are refused, if they
    /// are (it does not resolve to the type, or the registry lacks it).
    pub fn refusal(&self, id: u32) -> Option<(RejectCode, String)> {
        match self.unwrap.as_ref().and_then(Unwrap::avro) {
            Some(events) => events.refused(id),
            None => self.format.refused(id),
        }
    }

    /// Registry formats: what the registry holds for the values' schema `id`.
    pub fn learn(&mut self, id: u32, schema: Learned) {
        self.learn_subject(Subject::Value, id, schema);
    }

    /// Registry formats: what the registry holds for schema `id` of a key
    /// or a value.
    pub fn learn_subject(&mut self, subject: Subject, id: u32, schema: Learned) {
        match subject {
            Subject::Key => self.keys.learn(id, schema),
            Subject::Value => match self.unwrap.as_mut().and_then(Unwrap::avro_mut) {
                Some(events) => events.learn(id, schema),
                None => self.format.learn(id, schema),
            },
        }
    }

    /// Decodes a whole poll. Records that cannot become rows are returned as
    /// rejects; the rest still go out as one batch.
    pub fn decode(&mut self, records: &[SourceRecord<'_>]) -> PublicResult<Decoded> {
        let (mut out, rejects) = match self.unwrap.take() {
            None => self.decode_records(records)?,
            Some(mut unwrap) => {
                let out = self.decode_changes(&mut unwrap, records);
                self.unwrap = Some(unwrap);
                out?
            }
        };
        out.rejects = rejects.into_iter().map(|(_, r)| r).collect();
        Ok(out)
    }

    /// The stages after the envelope; rejects by record index, in poll order.
    fn decode_records(&mut self, records: &[SourceRecord<'_>]) -> Result<(Decoded, Indexed)> {
        // Keys in plain form from here on (`key_format`); rejects keep the
        // original bytes.
        let plain = self.keys.plain(records);
        let original = records;
        let (ok, mut rejects) = self.screen(records, plain.as_deref());
        let translated: Vec<SourceRecord<'_>>;
        let records = match &plain {
            None => records,
            Some(plain) => {
                translated = records
                    .iter()
                    .zip(plain)
                    .map(|(r, p)| match p {
                        PlainKey::Text(t) => SourceRecord { key: Some(t), ..*r },
                        _ => *r,
                    })
                    .collect();
                &translated
            }
        };
        // Values (the format) → rows, split around bad records.
        let mut sorted = self.rows_of(records, &ok)?;
        rejects.append(&mut sorted.rejects);
        let mut part = sorted.part;
        let upserts = part.upserts(&self.ty.table_schema)?;
        let checked = self.check_constraints(records, upserts, part.up_idx)?;
        rejects.extend(checked.rejects);
        let checked = self.check_partition_keys(records, checked.rows, checked.up_idx)?;
        rejects.extend(checked.rejects);
        // Poll order, whichever stage refused them.
        rejects.sort_by_key(|(i, _)| *i);
        if let Some(plain) = &plain {
            for (i, r) in rejects.iter_mut() {
                if matches!(plain[*i], PlainKey::Text(_)) {
                    r.key = original[*i].key.map(<[u8]>::to_vec);
                }
            }
        }
        let out = self.last_write_wins(
            records,
            checked.rows,
            &checked.up_idx,
            part.del_ids,
            &part.del_idx,
        )?;
        Ok((out, rejects))
    }

    /// Under an envelope or field paths (envelope/): each record's change
    /// first, on the record as it arrived (its size and partition too);
    /// the upserts and deletes then go through the stages as plain records,
    /// and every reject carries the record as it arrived.
    fn decode_changes(
        &mut self,
        unwrap: &mut Unwrap,
        records: &[SourceRecord<'_>],
    ) -> Result<(Decoded, Indexed)> {
        let mut rejects = Vec::new();
        let mut changes = Vec::with_capacity(records.len());
        for (i, r) in records.iter().enumerate() {
            let change = match self.arrival_fault(r) {
                Some((code, m)) => Change::Refuse(code, m),
                None => unwrap.change(r),
            };
            match change {
                Change::Skip => {}
                Change::Refuse(code, m) => rejects.push((i, self.reject(r, code, m, None))),
                c => changes.push((i, c)),
            }
        }
        let rewritten: Vec<SourceRecord<'_>> = changes
            .iter()
            .map(|(i, c)| match c {
                Change::Upsert { value, key } => SourceRecord {
                    value: Some(value),
                    key: key.as_deref(),
                    ..records[*i]
                },
                Change::Delete { key } => SourceRecord {
                    value: None,
                    key: key.as_deref(),
                    ..records[*i]
                },
                Change::Skip | Change::Refuse(..) => unreachable!("kept out above"),
            })
            .collect();
        // Placement was judged on the key as it arrived.
        let placement = self.placement.take();
        let out = self.decode_records(&rewritten);
        self.placement = placement;
        let (out, later) = out?;
        for (j, mut r) in later {
            let i = changes[j].0;
            r.key = records[i].key.map(<[u8]>::to_vec);
            r.value = records[i].value.map(<[u8]>::to_vec);
            r.message = unwrap.explain(r.message);
            rejects.push((i, r));
        }
        rejects.sort_by_key(|(i, _)| *i);
        Ok((out, rejects))
    }

    /// What a record shows as it arrived, before any parsing: oversized,
    /// or (by the key's bytes as the producer hashed them) misplaced.
    fn arrival_fault(&self, r: &SourceRecord<'_>) -> Option<(RejectCode, String)> {
        let size = r.key.map_or(0, <[u8]>::len) + r.value.map_or(0, <[u8]>::len);
        if size > self.max_record_bytes {
            return Some((
                RejectCode::Oversized,
                format!(
                    "key and value are {size} bytes, over errors.max_record_bytes = {}",
                    self.max_record_bytes
                ),
            ));
        }
        self.misplaced(r).map(|m| (RejectCode::WrongPartition, m))
    }

    /// Oversized records are refused before any parsing, then misplaced
    /// ones (by the key's bytes as the producer hashed them), then keys
    /// their format cannot read, then values the format's screen refuses.
    /// Returns the indices of the others, and the rejects.
    fn screen(
        &self,
        records: &[SourceRecord<'_>],
        plain: Option<&[PlainKey]>,
    ) -> (Vec<usize>, Vec<(usize, Reject)>) {
        let mut rejects = Vec::new();
        let mut ok = Vec::with_capacity(records.len());
        for (i, r) in records.iter().enumerate() {
            match r.value {
                _ if self.arrival_fault(r).is_some() => {
                    let (code, m) = self.arrival_fault(r).expect("just seen");
                    rejects.push((i, self.reject(r, code, m, None)));
                }
                _ if matches!(plain.map(|p| &p[i]), Some(PlainKey::Bad(..))) => {
                    let Some(PlainKey::Bad(code, m)) = plain.map(|p| &p[i]) else {
                        unreachable!("just matched")
                    };
                    rejects.push((i, self.reject(r, *code, m.clone(), None)));
                }
                Some(v) => match self.format.screen(v) {
                    Some((code, m)) => rejects.push((i, self.reject(r, code, m, None))),
                    None => ok.push(i),
                },
                None => ok.push(i),
            }
        }
        (ok, rejects)
    }

    fn reject(
        &self,
        r: &SourceRecord<'_>,
        code: RejectCode,
        message: String,
        row: Option<String>,
    ) -> Reject {
        Reject::of_record(r.origin(), &self.ty.name, code, message, row)
    }
}
