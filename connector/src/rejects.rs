//! Rejects: every record graphsink does not ingest becomes one typed
//! `Reject`, one row of `_ingest_rejects` and one dead-letter message. This
//! module owns the reject's shape, its codes and its table rows; it decides
//! nothing about what is rejected, and produces nothing (`kafka` does).

use std::sync::Arc;

use arrow::array::{
    ArrayRef, BinaryArray, BooleanArray, Int32Array, Int64Array, RecordBatch, StringArray,
    TimestampMillisecondArray,
};
use arrow::compute::filter_record_batch;
use rdkafka::message::Headers;
use serde::{Deserialize, Serialize};

use crate::error::{Context, Error, Result};
use crate::schema::{rejects_schema, Source, REJECTS_TABLE, REJECT_ID};
use crate::types::now_ms;

const NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x6772_6170_6873_696e_6b00_0000_0000_0002);

/// An enum whose variants have one stable string each: `as_str`, `FromStr`
/// and serde all use the same table, so no name is mapped twice by hand.
macro_rules! named_enum {
    ($(#[$meta:meta])* $vis:vis enum $name:ident {
        $($(#[$vmeta:meta])* $variant:ident => $text:literal,)+
    }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        $vis enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }
        }

        impl std::str::FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> std::result::Result<Self, String> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err(format!("unknown {} {s:?}", stringify!($name))),
                }
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

named_enum! {
    /// Where in the pipeline a record was refused.
    pub enum Stage {
        /// Bytes → JSON → Arrow: shape, types, keys, endpoints.
        Decode => "decode",
        /// Decoded rows against `.pg` constraints (enum, `@range`, `@check`).
        Validate => "validate",
        /// Against the graph at fold time: endpoints, `@card`, `@unique`, deletes.
        Fold => "fold",
    }
}

named_enum! {
    /// Why a record was refused. The string forms are stable: users filter on
    /// them in `_ingest_rejects.code` and the `graphsink.code` header.
    pub enum RejectCode {
        /// The value is not UTF-8.
        NotUtf8 => "not_utf8",
        /// The value is not valid JSON.
        MalformedJson => "malformed_json",
        /// The value is JSON but not exactly one object.
        NotAnObject => "not_an_object",
        /// The value is larger than `errors.max_record_bytes`.
        Oversized => "oversized",
        /// A field the type does not declare (`unknown_fields = "reject"`).
        UnknownField => "unknown_field",
        /// A field of the wrong JSON type, or an unparsable date, time or vector.
        WrongType => "wrong_type",
        /// A number outside its integer type.
        Overflow => "overflow",
        /// A required (non-`?`) property is missing or null.
        MissingRequired => "missing_required",
        /// The key (or a key part) is missing or unusable.
        MissingKey => "missing_key",
        /// The key in the value disagrees with the Kafka key.
        KeyMismatch => "key_mismatch",
        /// An edge record lacks a usable `src` or `dst`.
        MissingEndpoint => "missing_endpoint",
        /// A tombstone whose Kafka key names nothing to delete.
        BadTombstone => "bad_tombstone",
        /// Not one of the `enum(...)` values.
        Enum => "enum",
        /// Outside `@range`, or NaN.
        Range => "range",
        /// Does not match `@check`.
        Check => "check",
        /// An edge endpoint is not a node of the declared type (fold).
        EndpointNotFound => "endpoint_not_found",
        /// More edges per `src` than `@card` allows, or a delete below its min.
        Cardinality => "cardinality",
        /// Another row already holds this `@unique` tuple.
        Unique => "unique",
        /// A node delete while committed edges still reference it.
        Referenced => "referenced",
        /// More deferred edges than `max_pending_edges`.
        PendingOverflow => "pending_overflow",
        /// Under `wal.sharding = "partition"`: the Kafka key is missing or
        /// names another id than the row's, so the producer's partitioner
        /// did not place the row by its id.
        PartitionKeyMismatch => "partition_key_mismatch",
        /// Under `wal.partitioner`: the record is not on the partition its
        /// key hashes to (another partitioner, or a resized topic).
        WrongPartition => "wrong_partition",
        /// Under `wal.sharding = "partition"`: one fold read rows of one id
        /// from two shards (source partitions); the row from the id's
        /// committed partition (a new id's: the lowest) stays, the others
        /// are refused (fold).
        ShardConflict => "shard_conflict",
        /// A registry format's value without the Confluent wire format's
        /// prefix: no magic byte 0, or shorter than 5 bytes.
        BadFraming => "bad_framing",
        /// The registry has no schema of the value's schema id (HTTP 404).
        UnknownSchemaId => "unknown_schema_id",
        /// The value's writer schema cannot resolve to the type: a required
        /// property it lacks with no default, or a type that cannot be
        /// promoted to the property's.
        SchemaMismatch => "schema_mismatch",
        /// An Avro payload that does not decode under its writer schema, is
        /// truncated, or leaves trailing bytes.
        MalformedAvro => "malformed_avro",
        /// A Protobuf payload that does not decode as its message type.
        MalformedProtobuf => "malformed_protobuf",
        /// A change event that upserts (Debezium `c`, `r`, `u`; an
        /// `op_field` event that is not a delete) without its row.
        MissingAfter => "missing_after",
        /// A delete whose event names no row (no `before` with the key
        /// fields) and whose record has no Kafka key.
        MissingBefore => "missing_before",
        /// A change event without an op, or with an op it does not define.
        UnknownOp => "unknown_op",
        /// A change event's op graphsink does not apply: Debezium's
        /// truncate (`t`), which names no rows (docs/cdc.md).
        UnsupportedOp => "unsupported_op",
    }
}

impl RejectCode {
    /// The stage that raises the code. Every code is named, so a new one
    /// has to be placed (docs/rejects.md lists each with its stage, which
    /// a test checks).
    pub fn stage(self) -> Stage {
        use RejectCode::*;
        match self {
            NotUtf8 | MalformedJson | NotAnObject | Oversized | UnknownField | WrongType
            | Overflow | MissingRequired | MissingKey | KeyMismatch | MissingEndpoint
            | BadTombstone | PartitionKeyMismatch | WrongPartition | BadFraming
            | UnknownSchemaId | SchemaMismatch | MalformedAvro | MalformedProtobuf
            | MissingAfter | MissingBefore | UnknownOp | UnsupportedOp => Stage::Decode,
            Enum | Range | Check => Stage::Validate,
            EndpointNotFound | Cardinality | Unique | Referenced | PendingOverflow
            | ShardConflict => Stage::Fold,
        }
    }
}

/// One row of a checked batch that a check refuses: its index in the
/// batch, the code and a message naming what it breaks. The decoder's
/// checks (`validate`, the partition keys) and the fold's graph checks
/// make them; `refuse_rows` turns them into their stage's rejects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RefusedRow {
    pub row: usize,
    pub code: RejectCode,
    pub message: String,
}

/// A batch after `refuse_rows`.
pub(crate) struct Refusals<T> {
    /// The rows left, in order (possibly none).
    pub kept: RecordBatch,
    /// Per row of the checked batch: whether it was left (for what runs
    /// beside the rows, such as their poll indices).
    pub keep: Vec<bool>,
    /// What each refused row became, in the order refused: its count is
    /// the rows refused.
    pub refused: Vec<T>,
}

/// Refuses rows of `rows`: each of `refused` becomes a `T` by `to` (a
/// decoder's `Reject`, a fold check's `Rejection`) and leaves the batch.
/// The one way a checked batch sheds rows, in both stages.
pub(crate) fn refuse_rows<T>(
    rows: &RecordBatch,
    refused: impl IntoIterator<Item = RefusedRow>,
    mut to: impl FnMut(RefusedRow) -> T,
) -> Result<Refusals<T>> {
    let mut keep = vec![true; rows.num_rows()];
    let refused: Vec<T> = (refused.into_iter())
        .map(|r| {
            keep[r.row] = false;
            to(r)
        })
        .collect();
    let mask = BooleanArray::from(keep.clone());
    let kept = filter_record_batch(rows, &mask).ctx("drop refused rows")?;
    Ok(Refusals {
        kept,
        keep,
        refused,
    })
}

/// One refused record, with everything needed to find, explain and replay it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reject {
    pub reject_id: String,
    pub stage: Stage,
    pub code: RejectCode,
    pub message: String,
    /// The target graph type, when the mapping names one.
    pub type_name: Option<String>,
    pub topic: Option<String>,
    pub partition: Option<i32>,
    pub offset: Option<i64>,
    pub timestamp: Option<i64>,
    #[serde(default)]
    pub key: Option<Vec<u8>>,
    #[serde(default)]
    pub value: Option<Vec<u8>>,
    /// Original headers, in order.
    #[serde(default)]
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// The decoded row as JSON, when there is one.
    pub row: Option<String>,
    /// The graph commit that recorded this reject in `_ingest_rejects`.
    pub graph_commit: Option<String>,
    pub rejected_at: i64,
}

/// What a fold refused, for `Reject::of_fold`.
#[derive(Debug, Clone)]
pub struct FoldRefusal<'a> {
    pub commit_id: &'a str,
    /// The refused row within the fold (table, upsert or delete, row id).
    pub what: &'a str,
    pub type_name: &'a str,
    pub code: RejectCode,
    pub message: String,
    /// The row as JSON, when there is one.
    pub row: Option<String>,
    /// Where the row came from (upserts; MemWAL tombstones carry none).
    pub source: Option<Source>,
    pub created_at: i64,
}

/// The source coordinates and bytes of a record, owned.
#[derive(Debug, Clone, Default)]
pub struct Origin {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub timestamp: Option<i64>,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl Reject {
    /// The error that stops the connector on this reject under
    /// `errors.tolerance = "none"`.
    pub(crate) fn intolerable(&self) -> crate::error::Error {
        crate::error::Error::Intolerable {
            topic: self.topic.clone().unwrap_or_default(),
            partition: self.partition.unwrap_or(-1),
            offset: self.offset.unwrap_or(-1),
            code: self.code.as_str(),
            message: self.message.clone(),
        }
    }

    /// A sync (decode or validate) reject of a consumed record. Its id is a
    /// function of the record's coordinates, so a replay rejects it again
    /// under the same id.
    pub fn of_record(
        origin: Origin,
        type_name: &str,
        code: RejectCode,
        message: impl Into<String>,
        row: Option<String>,
    ) -> Reject {
        let reject_id = reject_id(&format!(
            "record:{}:{}:{}",
            origin.topic, origin.partition, origin.offset
        ));
        Reject {
            reject_id,
            stage: code.stage(),
            code,
            message: message.into(),
            type_name: Some(type_name.to_string()),
            topic: Some(origin.topic),
            partition: Some(origin.partition),
            offset: Some(origin.offset),
            timestamp: origin.timestamp,
            key: origin.key,
            value: origin.value,
            headers: origin.headers,
            row,
            graph_commit: None,
            rejected_at: now_ms(),
        }
    }

    /// A fold reject. A refused record's id is a function of its source
    /// coordinates and the code: a record read again after a crash (its
    /// offset was durable, not yet committed) and refused by a later fold
    /// is the same reject, not a second one. A refusal without a record
    /// (a delete replayed from the WAL) is keyed by the fold's commit and
    /// what was refused, so a rolled-forward fold rejects under the same id.
    pub fn of_fold(f: FoldRefusal<'_>) -> Reject {
        let code = f.code;
        let id = match &f.source {
            Some(s) => format!(
                "fold:{}:{}:{}:{}",
                s.topic,
                s.partition,
                s.offset,
                code.as_str()
            ),
            None => format!("fold:{}:{}:{}", f.commit_id, f.what, code.as_str()),
        };
        let (topic, partition, offset, timestamp) = match f.source {
            Some(s) => (
                Some(s.topic),
                Some(s.partition),
                Some(s.offset),
                s.timestamp,
            ),
            None => (None, None, None, None),
        };
        Reject {
            reject_id: reject_id(&id),
            stage: Stage::Fold,
            code,
            message: f.message,
            type_name: Some(f.type_name.to_string()),
            topic,
            partition,
            offset,
            timestamp,
            key: None,
            value: None,
            headers: vec![],
            row: f.row,
            graph_commit: Some(f.commit_id.to_string()),
            rejected_at: f.created_at,
        }
    }
}

fn reject_id(s: &str) -> String {
    uuid::Uuid::new_v5(&NAMESPACE, s.as_bytes()).to_string()
}

/// Rejects as one batch of `_ingest_rejects` rows.
pub(crate) fn to_batch(rejects: &[Reject]) -> RecordBatch {
    let r = rejects;
    let s = |f: &dyn Fn(&Reject) -> Option<&str>| -> ArrayRef {
        Arc::new(r.iter().map(f).collect::<StringArray>())
    };
    let b = |f: &dyn Fn(&Reject) -> Option<&[u8]>| -> ArrayRef {
        Arc::new(r.iter().map(f).collect::<BinaryArray>())
    };
    let headers: Vec<Option<String>> = r
        .iter()
        .map(|x| (!x.headers.is_empty()).then(|| encode_headers(&x.headers)))
        .collect();
    let cols: Vec<ArrayRef> = vec![
        s(&|x| Some(&x.reject_id)),
        s(&|x| Some(x.stage.as_str())),
        s(&|x| Some(x.code.as_str())),
        s(&|x| Some(&x.message)),
        s(&|x| x.type_name.as_deref()),
        s(&|x| x.topic.as_deref()),
        Arc::new(r.iter().map(|x| x.partition).collect::<Int32Array>()),
        Arc::new(r.iter().map(|x| x.offset).collect::<Int64Array>()),
        Arc::new(
            r.iter()
                .map(|x| x.timestamp)
                .collect::<TimestampMillisecondArray>()
                .with_timezone("UTC"),
        ),
        b(&|x| x.key.as_deref()),
        b(&|x| x.value.as_deref()),
        Arc::new(headers.into_iter().collect::<StringArray>()),
        s(&|x| x.row.as_deref()),
        s(&|x| x.graph_commit.as_deref()),
        Arc::new(
            r.iter()
                .map(|x| Some(x.rejected_at))
                .collect::<TimestampMillisecondArray>()
                .with_timezone("UTC"),
        ),
    ];
    RecordBatch::try_new(rejects_schema(), cols).expect("reject columns match")
}

/// Rows of `_ingest_rejects` back into rejects (CLI, re-delivery).
pub(crate) fn from_batch(batch: &RecordBatch) -> Result<Vec<Reject>> {
    use arrow::array::Array;
    let col = |n: &str| {
        batch
            .column_by_name(n)
            .ok_or_else(|| Error::Corrupt(format!("{REJECTS_TABLE} lacks column {n}")))
    };
    macro_rules! typed {
        ($n:expr, $t:ty) => {
            col($n)?.as_any().downcast_ref::<$t>().ok_or_else(|| {
                Error::Corrupt(format!("{REJECTS_TABLE}.{} has an unexpected type", $n))
            })?
        };
    }
    let id = typed!(REJECT_ID, StringArray);
    let stage = typed!("stage", StringArray);
    let code = typed!("code", StringArray);
    let message = typed!("message", StringArray);
    let ty = typed!("type_name", StringArray);
    let topic = typed!("topic", StringArray);
    let part = typed!("partition", Int32Array);
    let off = typed!("offset", Int64Array);
    let ts = typed!("timestamp", TimestampMillisecondArray);
    let key = typed!("key", BinaryArray);
    let value = typed!("value", BinaryArray);
    let headers = typed!("headers", StringArray);
    let row = typed!("row", StringArray);
    let commit = typed!("graph_commit", StringArray);
    let at = typed!("rejected_at", TimestampMillisecondArray);
    let mut out = Vec::with_capacity(batch.num_rows());
    for i in 0..batch.num_rows() {
        let os = |a: &StringArray| a.is_valid(i).then(|| a.value(i).to_string());
        let ob = |a: &BinaryArray| a.is_valid(i).then(|| a.value(i).to_vec());
        out.push(Reject {
            reject_id: id.value(i).to_string(),
            stage: parse_name("stage", stage.value(i))?,
            code: parse_name("code", code.value(i))?,
            message: message.value(i).to_string(),
            type_name: os(ty),
            topic: os(topic),
            partition: part.is_valid(i).then(|| part.value(i)),
            offset: off.is_valid(i).then(|| off.value(i)),
            timestamp: ts.is_valid(i).then(|| ts.value(i)),
            key: ob(key),
            value: ob(value),
            headers: os(headers)
                .map(|h| decode_headers(&h))
                .transpose()?
                .unwrap_or_default(),
            row: os(row),
            graph_commit: os(commit),
            rejected_at: at.value(i),
        });
    }
    Ok(out)
}

fn parse_name<T: std::str::FromStr<Err = String>>(what: &str, v: &str) -> Result<T> {
    v.parse()
        .map_err(|e| Error::Corrupt(format!("{REJECTS_TABLE}: {what}: {e}")))
}

fn encode_headers(h: &[(String, Option<Vec<u8>>)]) -> String {
    use base64::Engine;
    let v: Vec<(String, Option<String>)> = h
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v.as_ref()
                    .map(|b| base64::engine::general_purpose::STANDARD.encode(b)),
            )
        })
        .collect();
    serde_json::to_string(&v).expect("serializable")
}

fn decode_headers(s: &str) -> Result<Vec<(String, Option<Vec<u8>>)>> {
    use base64::Engine;
    let v: Vec<(String, Option<String>)> = serde_json::from_str(s)
        .map_err(|e| Error::Corrupt(format!("{REJECTS_TABLE}.headers: {e}")))?;
    v.into_iter()
        .map(|(k, b)| {
            let bytes = b
                .map(|b| base64::engine::general_purpose::STANDARD.decode(b))
                .transpose()
                .map_err(|e| Error::Corrupt(format!("{REJECTS_TABLE}.headers: {e}")))?;
            Ok((k, bytes))
        })
        .collect()
}

/// Copies a message's headers, for a reject.
pub(crate) fn owned_headers<H: Headers>(h: Option<&H>) -> Vec<(String, Option<Vec<u8>>)> {
    let Some(h) = h else { return vec![] };
    h.iter()
        .map(|x| (x.key.to_string(), x.value.map(<[u8]>::to_vec)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record read again after a crash and refused by another fold is
    /// the same reject; a refusal without a record is keyed by its fold.
    #[test]
    fn a_refused_record_keeps_its_reject_id_across_folds() {
        let refusal = |commit_id, source: Option<Source>| {
            Reject::of_fold(FoldRefusal {
                commit_id,
                what: "edges/E:upsert:e1",
                type_name: "E",
                code: RejectCode::EndpointNotFound,
                message: "m".into(),
                row: None,
                source,
                created_at: 0,
            })
        };
        let src = || {
            Some(Source {
                topic: "t".into(),
                partition: 1,
                offset: 7,
                timestamp: None,
            })
        };
        assert_eq!(
            refusal("c1", src()).reject_id,
            refusal("c2", src()).reject_id
        );
        assert_ne!(refusal("c1", None).reject_id, refusal("c2", None).reject_id);
    }

    #[test]
    fn rejects_round_trip_through_their_table_layout() {
        let r = Reject::of_record(
            Origin {
                topic: "t".into(),
                partition: 2,
                offset: 7,
                timestamp: Some(5),
                key: Some(b"k".to_vec()),
                value: Some(vec![0xff, 0xfe]),
                headers: vec![("h".into(), Some(vec![0, 1])), ("n".into(), None)],
            },
            "Person",
            RejectCode::NotUtf8,
            "value is not UTF-8",
            None,
        );
        let back = from_batch(&to_batch(std::slice::from_ref(&r))).unwrap();
        assert_eq!(back, vec![r.clone()]);
        // Same coordinates, same id: replays reject under the same id.
        let again = Reject::of_record(
            Origin {
                topic: "t".into(),
                partition: 2,
                offset: 7,
                ..Default::default()
            },
            "Person",
            RejectCode::MalformedJson,
            "x",
            None,
        );
        assert_eq!(again.reject_id, r.reject_id);
        assert_eq!(RejectCode::Range.stage(), Stage::Validate);
        assert_eq!(
            serde_json::to_value(RejectCode::EndpointNotFound).unwrap(),
            "endpoint_not_found"
        );
        // One table of names: every code and stage survives text and serde.
        for &c in RejectCode::ALL {
            assert_eq!(c.as_str().parse::<RejectCode>(), Ok(c));
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(serde_json::from_str::<RejectCode>(&json).unwrap(), c);
        }
        for &st in Stage::ALL {
            assert_eq!(st.as_str().parse::<Stage>(), Ok(st));
        }
        assert!("nope".parse::<RejectCode>().is_err());
    }

    /// docs/rejects.md's table lists every code, once, under the stage
    /// `stage()` gives it, and no code the enum lacks.
    #[test]
    fn docs_rejects_lists_every_code_with_its_stage() {
        let doc =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/rejects.md"))
                .expect("docs/rejects.md");
        let ticked = |s: &str| -> Vec<String> {
            s.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect()
        };
        let at = doc
            .find("| stage | code | when |")
            .expect("docs/rejects.md has the table of codes");
        let mut documented = std::collections::BTreeMap::new();
        for row in doc[at..].lines().skip(2).take_while(|l| l.starts_with('|')) {
            let cells: Vec<&str> = row.split('|').collect();
            let stage = ticked(cells[1]).concat();
            for code in ticked(cells[2]) {
                let again = documented.insert(code.clone(), stage.clone());
                assert!(again.is_none(), "docs/rejects.md lists {code} twice");
            }
        }
        let enumerated: std::collections::BTreeMap<String, String> = RejectCode::ALL
            .iter()
            .map(|c| (c.as_str().to_string(), c.stage().as_str().to_string()))
            .collect();
        assert_eq!(
            documented, enumerated,
            "docs/rejects.md (left) against RejectCode and its stage() (right)"
        );
    }
}
