//! `--format`: the bench's records as JSON (as before), or Avro or
//! Protobuf in the Confluent wire format, with their schemas registered in
//! the testkit's in-process registry. The same fields and values in every
//! format (workload.rs's `Fields`); only the encoding differs.
//! Owns the schemas and the encoders; measures nothing.

use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_avro::schema::{FingerprintStrategy, SCHEMA_METADATA_KEY};
use arrow_avro::writer::{format::AvroSoeFormat, WriterBuilder};
use arrow_schema::{DataType, Field, Schema};
use prost::Message;
use prost_reflect::{DynamicMessage, MessageDescriptor, Value};

use crate::broker::BoxError;
use crate::workload::{Fields, Kind, Seq};

#[derive(
    Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Format {
    Json,
    Avro,
    Protobuf,
}

impl Format {
    /// The mapping's `format` in graphsink's config.
    pub(crate) fn config_name(self) -> &'static str {
        match self {
            Format::Json => "json",
            Format::Avro => "avro",
            Format::Protobuf => "protobuf",
        }
    }
}

/// `--envelope`: JSON values as they are, or wrapped as Debezium change
/// events (`c` with `after` the same object), bare or in the JSON
/// converter's `{schema, payload}` (`schemas.enable = true`).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Envelope {
    #[default]
    None,
    Debezium,
    DebeziumSchema,
}

/// The `source` block of the bench's Debezium events, as Debezium's
/// PostgreSQL connector writes it (docs/cdc.md).
const SOURCE: &str = r#""source":{"version":"2.7.4.Final","connector":"postgresql","name":"bench","ts_ms":1733500000000,"snapshot":"false","db":"bench","sequence":"[\"24023119\",\"24023128\"]","schema":"public","table":"items","txId":555,"lsn":24023128,"xmin":null}"#;

/// A compact Connect schema part of the size Debezium writes for a
/// three-column table (its `before`, `after` and `source` structs).
const SCHEMA: &str = r#"{"type":"struct","fields":[{"type":"struct","fields":[{"type":"string","optional":false,"field":"sku"},{"type":"int64","optional":false,"field":"seq"},{"type":"string","optional":true,"field":"pad"}],"optional":true,"name":"bench.public.items.Value","field":"before"},{"type":"struct","fields":[{"type":"string","optional":false,"field":"sku"},{"type":"int64","optional":false,"field":"seq"},{"type":"string","optional":true,"field":"pad"}],"optional":true,"name":"bench.public.items.Value","field":"after"},{"type":"struct","fields":[{"type":"string","optional":false,"field":"version"},{"type":"string","optional":false,"field":"connector"},{"type":"string","optional":false,"field":"name"},{"type":"int64","optional":false,"field":"ts_ms"},{"type":"string","optional":true,"name":"io.debezium.data.Enum","version":1,"parameters":{"allowed":"true,last,false,incremental"},"default":"false","field":"snapshot"},{"type":"string","optional":false,"field":"db"},{"type":"string","optional":true,"field":"sequence"},{"type":"string","optional":false,"field":"schema"},{"type":"string","optional":false,"field":"table"},{"type":"int64","optional":true,"field":"txId"},{"type":"int64","optional":true,"field":"lsn"},{"type":"int64","optional":true,"field":"xmin"}],"optional":false,"name":"io.debezium.connector.postgresql.Source","field":"source"},{"type":"string","optional":false,"field":"op"},{"type":"int64","optional":true,"field":"ts_ms"}],"optional":false,"name":"bench.public.items.Envelope","version":1}"#;

impl Envelope {
    /// The mapping's lines: the envelope, and one path (`seq`), so the
    /// stage's path step is measured too.
    pub(crate) fn config_lines(self) -> &'static str {
        match self {
            Envelope::None => "",
            _ => "envelope = \"debezium\"\nfields = { seq = \"/seq\" }\n",
        }
    }

    fn wrap(self, json: String) -> String {
        match self {
            Envelope::None => json,
            Envelope::Debezium => event(&json),
            Envelope::DebeziumSchema => {
                format!(r#"{{"schema":{SCHEMA},"payload":{}}}"#, event(&json))
            }
        }
    }
}

fn event(after: &str) -> String {
    format!(r#"{{"before":null,"after":{after},{SOURCE},"op":"c","ts_ms":1733500000100}}"#)
}

/// The writer schemas, one per topic: the fields of workload.rs's records,
/// with the types the `.pg` schema declares (`I64` ← Avro `long`, Protobuf
/// `int64`).
pub(crate) const AVRO_ITEM: &str = r#"{"type":"record","name":"Item","namespace":"bench","fields":[{"name":"sku","type":"string"},{"name":"seq","type":"long"},{"name":"pad","type":"string"}]}"#;
pub(crate) const AVRO_LINK: &str = r#"{"type":"record","name":"Link","namespace":"bench","fields":[{"name":"src","type":"string"},{"name":"dst","type":"string"},{"name":"seq","type":"long"},{"name":"pad","type":"string"}]}"#;
/// One file per subject, each with its one message first, so every frame's
/// message indexes are the single 0.
pub(crate) const PROTO_ITEM: &str =
    "syntax = \"proto3\";\npackage bench;\nmessage Item {\n  string sku = 1;\n  int64 seq = 2;\n  string pad = 3;\n}\n";
pub(crate) const PROTO_LINK: &str = "syntax = \"proto3\";\npackage bench;\nmessage Link {\n  string src = 1;\n  string dst = 2;\n  int64 seq = 3;\n  string pad = 4;\n}\n";

/// What a producer needs to encode values: serializable, so a child
/// process gets it with its spec.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Values {
    pub format: Format,
    /// `schema_registry.url` (registry formats only).
    pub registry_url: Option<String>,
    /// The registered schema ids of the node and the edge topic's subject.
    pub ids: [u32; 2],
    /// JSON only: the change envelope around each value (`--envelope`).
    #[serde(default)]
    pub envelope: Envelope,
}

impl Values {
    pub(crate) fn json() -> Values {
        Values {
            format: Format::Json,
            registry_url: None,
            ids: [0, 0],
            envelope: Envelope::None,
        }
    }

    /// Registers the node (and edge) topic's writer schema under
    /// `<topic>-value` (TopicNameStrategy, what graphsink's start-up check
    /// reads).
    pub(crate) fn register(
        format: Format,
        registry: &graphsink_testkit::TestRegistry,
        nodes_topic: &str,
        edges_topic: Option<&str>,
    ) -> Values {
        let (ty, item, link) = match format {
            Format::Json => return Values::json(),
            Format::Avro => ("AVRO", AVRO_ITEM, AVRO_LINK),
            Format::Protobuf => ("PROTOBUF", PROTO_ITEM, PROTO_LINK),
        };
        let refs = serde_json::json!([]);
        let node = registry.register(&format!("{nodes_topic}-value"), ty, item, refs.clone());
        let edge = edges_topic.map_or(0, |t| {
            registry.register(&format!("{t}-value"), ty, link, refs.clone())
        });
        Values {
            format,
            registry_url: Some(registry.url()),
            ids: [node, edge],
            envelope: Envelope::None,
        }
    }
}

/// Encodes records' fields as the run's format.
#[derive(Clone)]
pub(crate) enum Codec {
    Json(Envelope),
    Avro {
        ids: [u32; 2],
    },
    Protobuf {
        ids: [u32; 2],
        messages: Arc<[MessageDescriptor; 2]>,
    },
}

impl Codec {
    pub(crate) fn of(v: &Values) -> Result<Codec, BoxError> {
        Ok(match v.format {
            Format::Json => Codec::Json(v.envelope),
            Format::Avro => Codec::Avro { ids: v.ids },
            Format::Protobuf => Codec::Protobuf {
                ids: v.ids,
                messages: Arc::new([
                    message(PROTO_ITEM, "bench.Item")?,
                    message(PROTO_LINK, "bench.Link")?,
                ]),
            },
        })
    }

    /// The values of `recs`, in order, framed for the registry formats.
    pub(crate) fn encode(&self, recs: &[(Kind, Fields)]) -> Result<Vec<Vec<u8>>, BoxError> {
        match self {
            Codec::Json(e) => Ok(recs
                .iter()
                .map(|(_, f)| e.wrap(f.json()).into_bytes())
                .collect()),
            Codec::Avro { ids } => avro(recs, ids),
            Codec::Protobuf { ids, messages } => recs
                .iter()
                .map(|(kind, f)| {
                    let k = *kind as usize;
                    let m = proto_message(&messages[k], f)?;
                    // The message indexes: a single 0, the file's first message.
                    let mut payload = vec![0u8];
                    m.encode(&mut payload)?;
                    Ok(graphsink::testing::framed(ids[k], &payload))
                })
                .collect(),
        }
    }
}

fn seq_of(seq: Seq) -> Result<i64, BoxError> {
    match seq {
        Seq::N(n) => Ok(n),
        Seq::Text => Err("a text seq (--bad-fraction) is JSON only".into()),
    }
}

/// Avro through arrow-avro's row encoder, which writes the Confluent
/// prefix itself (`FingerprintStrategy::Id`): one Arrow batch per kind,
/// then the rows put back in the records' order.
fn avro(recs: &[(Kind, Fields)], ids: &[u32; 2]) -> Result<Vec<Vec<u8>>, BoxError> {
    let mut out: Vec<Vec<u8>> = vec![Vec::new(); recs.len()];
    for kind in [Kind::Node, Kind::Edge] {
        let at: Vec<usize> = (0..recs.len()).filter(|&i| recs[i].0 == kind).collect();
        if at.is_empty() {
            continue;
        }
        let batch = avro_batch(kind, at.iter().map(|&i| &recs[i].1))?;
        let mut enc = WriterBuilder::new(batch.schema().as_ref().clone())
            .with_fingerprint_strategy(FingerprintStrategy::Id(ids[kind as usize]))
            .build_encoder::<AvroSoeFormat>()?;
        enc.encode(&batch)?;
        let rows = enc.flush();
        for (&i, row) in at.iter().zip(rows.iter()) {
            out[i] = row.to_vec();
        }
    }
    Ok(out)
}

/// The records of one kind as an Arrow batch whose schema carries the
/// registered Avro schema, so the encoder writes exactly that schema.
fn avro_batch<'a>(
    kind: Kind,
    fields: impl Iterator<Item = &'a Fields>,
) -> Result<RecordBatch, BoxError> {
    let s = |n: &str| Field::new(n, DataType::Utf8, false);
    let (names, avro_schema) = match kind {
        Kind::Node => (
            vec![
                s("sku"),
                Field::new("seq", DataType::Int64, false),
                s("pad"),
            ],
            AVRO_ITEM,
        ),
        Kind::Edge => (
            vec![
                s("src"),
                s("dst"),
                Field::new("seq", DataType::Int64, false),
                s("pad"),
            ],
            AVRO_LINK,
        ),
    };
    let (mut a, mut b, mut seqs, mut pads) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for f in fields {
        match f {
            Fields::Node { sku, seq, pad } => {
                a.push(sku.as_str());
                seqs.push(seq_of(*seq)?);
                pads.push(pad.as_str());
            }
            Fields::Edge { src, dst, seq, pad } => {
                a.push(src.as_str());
                b.push(dst.as_str());
                seqs.push(*seq);
                pads.push(pad.as_str());
            }
        }
    }
    let text = |v: Vec<&str>| Arc::new(StringArray::from(v)) as ArrayRef;
    let mut cols = vec![text(a)];
    if kind == Kind::Edge {
        cols.push(text(b));
    }
    cols.push(Arc::new(Int64Array::from(seqs)));
    cols.push(text(pads));
    let md = [(SCHEMA_METADATA_KEY.to_string(), avro_schema.to_string())].into();
    let schema = Arc::new(Schema::new_with_metadata(names, md));
    Ok(RecordBatch::try_new(schema, cols)?)
}

/// The message of a one-file `.proto` source, compiled by protox.
fn message(proto: &str, name: &str) -> Result<MessageDescriptor, BoxError> {
    struct One(String);
    impl protox::file::FileResolver for One {
        fn open_file(&self, name: &str) -> Result<protox::file::File, protox::Error> {
            match name {
                "bench.proto" => protox::file::File::from_source(name, &self.0),
                _ => Err(protox::Error::file_not_found(name)),
            }
        }
    }
    let mut c = protox::Compiler::with_file_resolver(One(proto.to_string()));
    c.open_file("bench.proto")?;
    c.descriptor_pool()
        .get_message_by_name(name)
        .ok_or_else(|| format!("no message {name}").into())
}

fn proto_message(desc: &MessageDescriptor, f: &Fields) -> Result<DynamicMessage, BoxError> {
    let mut m = DynamicMessage::new(desc.clone());
    let text = |s: &str| Value::String(s.to_string());
    match f {
        Fields::Node { sku, seq, pad } => {
            m.set_field_by_name("sku", text(sku));
            m.set_field_by_name("seq", Value::I64(seq_of(*seq)?));
            m.set_field_by_name("pad", text(pad));
        }
        Fields::Edge { src, dst, seq, pad } => {
            m.set_field_by_name("src", text(src));
            m.set_field_by_name("dst", text(dst));
            m.set_field_by_name("seq", Value::I64(*seq));
            m.set_field_by_name("pad", text(pad));
        }
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{edge_fields, node_fields, Shape};

    fn recs() -> Vec<(Kind, Fields)> {
        let shape = Shape {
            edge_keys: 10,
            endpoints: 50,
            ..Shape::nodes_only(50, 100)
        };
        (0..6)
            .map(|i| match i % 3 {
                2 => (Kind::Edge, edge_fields(shape, 1, i).1),
                _ => (Kind::Node, node_fields(shape, 1, i).1),
            })
            .collect()
    }

    fn values() -> Values {
        Values {
            format: Format::Json,
            registry_url: None,
            ids: [7, 9],
            envelope: Envelope::None,
        }
    }

    #[test]
    fn debezium_envelopes_wrap_the_same_row() {
        let recs = recs();
        let plain = Codec::Json(Envelope::None).encode(&recs).unwrap();
        for e in [Envelope::Debezium, Envelope::DebeziumSchema] {
            for (wrapped, plain) in Codec::Json(e).encode(&recs).unwrap().iter().zip(&plain) {
                let mut v: serde_json::Value = serde_json::from_slice(wrapped).unwrap();
                if e == Envelope::DebeziumSchema {
                    v = v["payload"].take();
                }
                assert_eq!(v["op"], "c");
                let row: serde_json::Value = serde_json::from_slice(plain).unwrap();
                assert_eq!(v["after"], row);
            }
        }
    }

    fn json_of(f: &Fields) -> serde_json::Value {
        serde_json::from_str(&f.json()).unwrap()
    }

    /// Every Avro value is the Confluent frame of its topic's id, and reads
    /// back (arrow-avro's decoder, the connector's) as the JSON record's values.
    #[test]
    fn avro_values_read_back_as_the_json_records() {
        use arrow_array::Array;
        use arrow_avro::reader::ReaderBuilder;
        use arrow_avro::schema::{AvroSchema, Fingerprint, FingerprintAlgorithm, SchemaStore};
        let recs = recs();
        let codec = Codec::of(&Values {
            format: Format::Avro,
            ..values()
        })
        .unwrap();
        let out = codec.encode(&recs).unwrap();
        for ((kind, f), v) in recs.iter().zip(&out) {
            let (id, schema) = match kind {
                Kind::Node => (7, AVRO_ITEM),
                Kind::Edge => (9, AVRO_LINK),
            };
            assert_eq!(&v[..5], &graphsink::testing::framed(id, &[])[..]);
            let mut store = SchemaStore::new_with_type(FingerprintAlgorithm::Id);
            store
                .set(Fingerprint::Id(id), AvroSchema::new(schema.to_string()))
                .unwrap();
            let mut dec = ReaderBuilder::new()
                .with_writer_schema_store(store)
                .build_decoder()
                .unwrap();
            let mut at = 0;
            while at < v.len() {
                let n = dec.decode(&v[at..]).unwrap();
                assert!(n > 0, "the decoder took the whole value");
                at += n;
            }
            let batch = dec.flush().unwrap().unwrap();
            assert_eq!(batch.num_rows(), 1);
            let mut got = serde_json::Map::new();
            for (field, col) in batch.schema().fields().iter().zip(batch.columns()) {
                let j = if let Some(s) = col.as_any().downcast_ref::<StringArray>() {
                    serde_json::json!(s.value(0))
                } else {
                    let n = col.as_any().downcast_ref::<Int64Array>().expect("long");
                    serde_json::json!(n.value(0))
                };
                got.insert(field.name().clone(), j);
            }
            let got = serde_json::Value::Object(got);
            assert_eq!(got, json_of(f));
        }
    }

    /// Every Protobuf value is the frame of its topic's id with the single
    /// message index 0, and decodes (prost-reflect, as the connector does)
    /// to the JSON record's values.
    #[test]
    fn protobuf_values_read_back_as_the_json_records() {
        let recs = recs();
        let codec = Codec::of(&Values {
            format: Format::Protobuf,
            ..values()
        })
        .unwrap();
        let Codec::Protobuf { messages, .. } = &codec else {
            unreachable!()
        };
        let out = codec.encode(&recs).unwrap();
        for ((kind, f), v) in recs.iter().zip(&out) {
            let id = [7, 9][*kind as usize];
            assert_eq!(
                &v[..6],
                &[&graphsink::testing::framed(id, &[])[..], &[0]].concat()[..]
            );
            let m = DynamicMessage::decode(messages[*kind as usize].clone(), &v[6..]).unwrap();
            let mut got = serde_json::Map::new();
            // Every field, as proto3 reads it: a 0 `seq` is not on the wire.
            for field in messages[*kind as usize].fields() {
                let j = match &*m.get_field(&field) {
                    Value::String(s) => serde_json::json!(s),
                    Value::I64(n) => serde_json::json!(n),
                    other => panic!("unexpected {other:?}"),
                };
                got.insert(field.name().to_string(), j);
            }
            assert_eq!(serde_json::Value::Object(got), json_of(f));
        }
    }

    #[test]
    fn json_is_the_bench_s_old_value() {
        let recs = recs();
        let out = Codec::Json(Envelope::None).encode(&recs).unwrap();
        assert_eq!(out[0], recs[0].1.json().into_bytes());
        assert_eq!(out[0].len(), 100);
    }
}
