//! Key formats (`key_format`): how a Kafka key's bytes become the key's
//! plain text, which every stage after the screen reads (keys.rs): a
//! node's key as text (one part) or a JSON array of its parts' text, an
//! edge's id as text.
//!
//! - `json` keys are that plain text already, and are left as they are.
//! - A `string` key is its UTF-8 bytes verbatim, one part: never unquoted
//!   or split, whatever it looks like.
//! - A key in a registry format (`avro`, `protobuf`, `json_schema`) is
//!   framed as values are and decoded by the same value format (format.rs),
//!   over a schema of the key's fields: the node's `@key` properties, or
//!   `id` (a string, or an integer read as its text) for an edge id. An Avro key is a record holding those
//!   fields, or for a one-part key a bare primitive (`avro::key_record`). A
//!   JSON Schema key is a JSON scalar, array (a composite key) or object
//!   holding the fields, after the prefix.
//!
//! A key that cannot be read is the record's one reject, with the code a
//! value would get (`bad_framing`, `unknown_schema_id`, `schema_mismatch`,
//! `malformed_avro`, `malformed_protobuf`; `missing_key` for a null part),
//! and the reject keeps the key's original bytes.

use std::sync::Arc;

use arrow::array::{Array, StringArray};
use arrow::compute::cast;
use arrow_schema::{DataType, Field, Schema};

use crate::config::{KeyFormatName, Mapping, UnknownFields, ValueFormatName};
use crate::error::{Error, Result};
use crate::registry::wire;
use crate::rejects::RejectCode;
use crate::schema::GraphType;

use super::avro;
use super::format::{Learned, ValueFormat, ValueSchema};
use super::keys::scalar_text;
use super::shape::Shape;
use super::{value_format, Fail, SourceRecord};

/// The field an edge id's framed key is read into.
const EDGE_ID: &str = "id";

pub(super) enum KeyFormat {
    /// Text, a JSON string, or a JSON array: what keys.rs reads.
    Json,
    String {
        node: bool,
    },
    Framed(Box<Framed>),
}

pub(super) struct Framed {
    name: KeyFormatName,
    format: Box<dyn ValueFormat>,
    /// For an edge id: the same format over a numeric `id`, for a key
    /// schema that holds a `long` or an `int` (the id is then its text).
    numeric: Option<Box<dyn ValueFormat>>,
    /// The key's fields, in `@key` order (`id` for an edge).
    fields: Vec<String>,
    node: bool,
}

/// One record's key in plain form.
pub(super) enum PlainKey {
    /// No key, or a key already in plain form.
    Same,
    Text(Vec<u8>),
    Bad(RejectCode, String),
}

impl KeyFormat {
    pub(super) fn new(
        mapping: &Mapping,
        ty: &GraphType,
        shape: &Shape,
        batch_size: usize,
    ) -> Result<KeyFormat> {
        let node = matches!(shape, Shape::Node(_));
        let read_as = match mapping.key_format {
            KeyFormatName::Json => return Ok(KeyFormat::Json),
            KeyFormatName::String if node && ty.key.len() > 1 => {
                return Err(Error::config(format!(
                    "mapping for topic {}: key_format = \"string\" holds one part, and {}'s @key has {}; use \"json\" (a JSON array) or a registry format",
                    mapping.topic,
                    ty.name,
                    ty.key.len()
                )))
            }
            KeyFormatName::String => return Ok(KeyFormat::String { node }),
            KeyFormatName::Avro => ValueFormatName::Avro,
            KeyFormatName::Protobuf => ValueFormatName::Protobuf,
            KeyFormatName::JsonSchema => ValueFormatName::JsonSchema,
        };
        let fields: Vec<Field> = if node {
            ty.key
                .iter()
                // Not nullable: a key schema without the field is refused
                // by id (`schema_mismatch`), not key by key.
                .map(|k| {
                    let f = ty.properties.field_with_name(k).expect("a key property");
                    f.as_ref().clone().with_nullable(false)
                })
                .collect()
        } else {
            vec![Field::new(EDGE_ID, DataType::Utf8, false)]
        };
        let names = fields.iter().map(|f| f.name().clone()).collect();
        // The key's own mapping: its format, and a key record may hold more
        // than the key (the value's `message` names the value's type unless
        // only the key is Protobuf).
        let key_mapping = Mapping {
            format: read_as,
            unknown_fields: UnknownFields::Ignore,
            message: mapping
                .message
                .clone()
                .filter(|_| mapping.format != ValueFormatName::Protobuf),
            ..mapping.clone()
        };
        let values = ValueSchema {
            fields: Arc::new(Schema::new(fields)),
            composite: vec![],
        };
        let numeric = if node {
            None
        } else {
            let values = ValueSchema {
                fields: Arc::new(Schema::new(vec![Field::new(
                    EDGE_ID,
                    DataType::Int64,
                    false,
                )])),
                composite: vec![],
            };
            Some(value_format(&key_mapping, ty, values, batch_size)?)
        };
        Ok(KeyFormat::Framed(Box::new(Framed {
            name: mapping.key_format,
            format: value_format(&key_mapping, ty, values, batch_size)?,
            numeric,
            fields: names,
            node,
        })))
    }

    /// The schema id framed in `key` when it must be fetched (`learn`).
    pub(super) fn unlearned(&self, key: &[u8]) -> Option<u32> {
        match self {
            KeyFormat::Framed(f) => f.format.unlearned(key),
            _ => None,
        }
    }

    pub(super) fn wants_descriptor(&self) -> bool {
        matches!(self, KeyFormat::Framed(f) if f.name == KeyFormatName::Protobuf)
    }

    pub(super) fn learn(&mut self, id: u32, schema: Learned) {
        if let KeyFormat::Framed(f) = self {
            let schema = match (f.name, schema, f.fields.as_slice()) {
                (KeyFormatName::Avro, Ok(s), [field]) => match avro::key_record(&s.text, field) {
                    Some(text) => Ok(Arc::new(crate::registry::Schema {
                        text,
                        ..(*s).clone()
                    })),
                    None => Ok(s),
                },
                (_, s, _) => s,
            };
            if let Some(numeric) = &mut f.numeric {
                numeric.learn(id, schema.clone());
            }
            f.format.learn(id, schema);
        }
    }

    /// Each record's key in plain form; `None` when no key changes (`json`).
    pub(super) fn plain(&mut self, records: &[SourceRecord<'_>]) -> Option<Vec<PlainKey>> {
        match self {
            KeyFormat::Json => None,
            KeyFormat::String { node } => Some(
                records
                    .iter()
                    .map(|r| match r.key.map(std::str::from_utf8) {
                        None => PlainKey::Same,
                        Some(Err(_)) => {
                            PlainKey::Bad(RejectCode::MissingKey, "the key is not UTF-8".into())
                        }
                        // A node key as a JSON string, so keys.rs takes it
                        // whole; an edge id is read verbatim already.
                        Some(Ok(t)) if *node => {
                            PlainKey::Text(serde_json::to_vec(t).expect("a string serializes"))
                        }
                        Some(Ok(_)) => PlainKey::Same,
                    })
                    .collect(),
            ),
            KeyFormat::Framed(f) => Some(f.plain(records)),
        }
    }
}

impl Framed {
    fn plain(&mut self, records: &[SourceRecord<'_>]) -> Vec<PlainKey> {
        let mut out: Vec<PlainKey> = Vec::with_capacity(records.len());
        let mut todo: Vec<(usize, &[u8])> = Vec::new();
        let mut numeric: Vec<(usize, &[u8])> = Vec::new();
        for (i, r) in records.iter().enumerate() {
            out.push(PlainKey::Same);
            let Some(key) = r.key else { continue };
            // A JSON Schema key's payload is not a value's object, so only
            // its frame and id are screened here.
            let screened = match self.name {
                KeyFormatName::JsonSchema => match wire::frame(key) {
                    Err(e) => Some((RejectCode::BadFraming, e.0)),
                    Ok(f) => self.format.refused(f.schema_id),
                },
                _ => self.format.screen(key),
            };
            let takes_numeric = || {
                self.numeric
                    .as_ref()
                    .is_some_and(|n| n.screen(key).is_none())
            };
            if screened.is_some() && self.name != KeyFormatName::JsonSchema && takes_numeric() {
                numeric.push((i, key));
            } else if let Some((code, m)) = screened {
                out[i] = PlainKey::Bad(code, format!("key: {m}"));
            } else if self.name == KeyFormatName::JsonSchema {
                out[i] = self.json_key(key);
            } else {
                todo.push((i, key));
            }
        }
        self.decode_into(&mut out, &todo, false);
        self.decode_into(&mut out, &numeric, true);
        out
    }

    /// Decodes `todo`'s keys (by the numeric edge-id format if `numeric`)
    /// into `out`, each as its plain form or its reject.
    fn decode_into(&mut self, out: &mut [PlainKey], todo: &[(usize, &[u8])], numeric: bool) {
        if todo.is_empty() {
            return;
        }
        let keys: Vec<&[u8]> = todo.iter().map(|(_, k)| *k).collect();
        match self.parts(&keys, numeric) {
            Ok(parts) => {
                for ((i, _), p) in todo.iter().zip(parts) {
                    out[*i] = p;
                }
            }
            // One bad key fails the batch: read each alone to name it.
            Err(_) => {
                for (i, k) in todo {
                    out[*i] = match self.parts(&[k], numeric) {
                        Ok(mut p) => p.pop().expect("one key"),
                        Err(Fail::Record(code, m)) => PlainKey::Bad(code, format!("key: {m}")),
                        Err(Fail::System(e)) => {
                            PlainKey::Bad(RejectCode::MissingKey, format!("key: {e}"))
                        }
                    }
                }
            }
        }
    }

    /// Keys decoded by the format, each as its plain form.
    fn parts(&mut self, keys: &[&[u8]], numeric: bool) -> std::result::Result<Vec<PlainKey>, Fail> {
        let format = match (numeric, &mut self.numeric) {
            (true, Some(n)) => n,
            _ => &mut self.format,
        };
        let batch = format.decode(keys)?;
        let mut texts: Vec<StringArray> = Vec::with_capacity(self.fields.len());
        for c in batch.columns() {
            let t = cast(c, &DataType::Utf8)
                .map_err(|e| Fail::System(Error::Bug(format!("key text: {e}"))))?;
            texts.push(
                t.as_any()
                    .downcast_ref::<StringArray>()
                    .expect("utf8")
                    .clone(),
            );
        }
        Ok((0..batch.num_rows())
            .map(|row| {
                let mut parts = Vec::with_capacity(texts.len());
                for (name, t) in self.fields.iter().zip(&texts) {
                    if t.is_null(row) {
                        return PlainKey::Bad(
                            RejectCode::MissingKey,
                            format!("key: the key has no {name}"),
                        );
                    }
                    parts.push(t.value(row).to_string());
                }
                self.plain_of(parts)
            })
            .collect())
    }

    /// A JSON Schema key: the JSON after the prefix.
    fn json_key(&self, key: &[u8]) -> PlainKey {
        let payload = match wire::frame(key) {
            Ok(f) => f.rest,
            Err(e) => return PlainKey::Bad(RejectCode::BadFraming, format!("key: {}", e.0)),
        };
        let bad = |m: String| PlainKey::Bad(RejectCode::MissingKey, format!("key: {m}"));
        let v: serde_json::Value = match serde_json::from_slice(payload) {
            Ok(v) => v,
            Err(e) => return PlainKey::Bad(RejectCode::MalformedJson, format!("key: {e}")),
        };
        let items: Vec<serde_json::Value> = match v {
            serde_json::Value::Object(mut o) => {
                let mut items = Vec::with_capacity(self.fields.len());
                for name in &self.fields {
                    match o.remove(name) {
                        Some(v) if !v.is_null() => items.push(v),
                        _ => return bad(format!("the key object has no {name}")),
                    }
                }
                items
            }
            serde_json::Value::Array(items) => items,
            scalar => vec![scalar],
        };
        if items.len() != self.fields.len() {
            return bad(format!(
                "the key needs {} parts, got {}",
                self.fields.len(),
                items.len()
            ));
        }
        match items
            .iter()
            .map(scalar_text)
            .collect::<std::result::Result<Vec<_>, _>>()
        {
            Ok(parts) => self.plain_of(parts),
            Err(m) => bad(m),
        }
    }

    /// The parts' plain form: a node's one part as a JSON string (keys.rs
    /// unquotes it whole), several as a JSON array; an edge id as text.
    fn plain_of(&self, mut parts: Vec<String>) -> PlainKey {
        let bytes = match (self.node, parts.len()) {
            (false, _) => parts.pop().expect("one part").into_bytes(),
            (true, 1) => serde_json::to_vec(&parts[0]).expect("a string serializes"),
            (true, _) => serde_json::to_vec(&parts).expect("strings serialize"),
        };
        PlainKey::Text(bytes)
    }
}
