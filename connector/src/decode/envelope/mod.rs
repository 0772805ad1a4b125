//! Change envelopes and field mapping: the stage before the format, for a
//! mapping with `envelope` set or with paths (`[mapping.fields]`, pointer
//! keys and endpoints). Each record becomes a `Change`: an upsert of a flat
//! JSON object in the value schema's names (the JSON format then reads it
//! as any value), a delete of the id it names (as a tombstone would), a
//! no-op (the tombstone after a change event's delete), or a reject.
//!
//! A mapping with neither never builds this stage: its values go to the
//! format untouched (docs/decisions/0010-change-streams.md).

mod avro;
mod encodings;
mod events;
mod fields;

use arrow_schema::Schema;
use serde_json::{Map, Value};

use crate::config::{pointer_tokens, EnvelopeName, KeyOrigin, KeySource, Mapping, ValueFormatName};
use crate::error::{Error, Result};
use crate::rejects::RejectCode;
use crate::schema::GraphType;

use super::keys::scalar_text;
use super::shape::{EdgeId, Shape};
use super::SourceRecord;
pub(super) use avro::AvroEvents;
use events::Event;
use fields::{get, Fields, Refusal};

/// What one record asks of the graph.
#[derive(Debug, PartialEq)]
pub(super) enum Change {
    /// Upsert this row (a JSON object in the value schema's names); `key`
    /// is the Kafka key as plain text (keys.rs), when there is one.
    Upsert {
        value: Vec<u8>,
        key: Option<Vec<u8>>,
    },
    /// Delete the row this plain-text key names, as a tombstone does
    /// (`None`: a tombstone without a key, refused as such).
    Delete {
        key: Option<Vec<u8>>,
    },
    /// Nothing: a tombstone after a change event (the event deleted).
    Skip,
    Refuse(RejectCode, String),
}

enum Envelope {
    None,
    Debezium,
    /// Debezium events in Avro, as JSON objects (avro.rs).
    DebeziumAvro(AvroEvents),
    OpField {
        op: Vec<String>,
        deletes: Vec<String>,
        data: Vec<String>,
    },
}

/// How a row (or a Kafka key object) names its id: the tokens of each
/// `@key` part, or of the endpoints, or the Kafka key alone.
enum Ids {
    Node(Vec<Vec<String>>),
    /// The node's key is the Kafka key (`key = "kafka"`).
    NodeFromKafka,
    Endpoints {
        src: Vec<String>,
        dst: Vec<String>,
    },
    EdgeFromKafka,
    /// `topic/partition/offset`: nothing a delete can name.
    Coordinates,
}

pub(super) struct Unwrap {
    envelope: Envelope,
    fields: Fields,
    ids: Ids,
    type_name: String,
}

impl Unwrap {
    /// The stage for `mapping`, or `None` when its values go to the format
    /// as they are.
    pub(super) fn new(
        mapping: &Mapping,
        ty: &GraphType,
        shape: &Shape,
        values: &Schema,
    ) -> Result<Option<Unwrap>> {
        if mapping.envelope == EnvelopeName::None && !mapping.maps_fields() {
            return Ok(None);
        }
        let tokens = |p: &str| pointer_tokens(p).map_err(Error::config);
        let envelope = match mapping.envelope {
            EnvelopeName::None => Envelope::None,
            EnvelopeName::Debezium if mapping.format == ValueFormatName::Avro => {
                Envelope::DebeziumAvro(AvroEvents::default())
            }
            EnvelopeName::Debezium => Envelope::Debezium,
            EnvelopeName::OpField => Envelope::OpField {
                op: tokens(mapping.op_path.as_deref().unwrap_or_default())?,
                deletes: mapping.delete_when.iter().map(|v| v.text()).collect(),
                data: match mapping.data_path.as_deref() {
                    None | Some("") => vec![],
                    Some(d) => tokens(d)?,
                },
            },
        };
        let pointer = |name: &str| -> Result<Vec<String>> {
            let p = mapping.fields.get(name).map_or_else(
                || crate::config::as_pointer(name),
                |source| source.pointer(name),
            );
            tokens(&p)
        };
        let ids = match shape {
            Shape::Node(KeySource::Named(KeyOrigin::Kafka)) => Ids::NodeFromKafka,
            Shape::Node(KeySource::Field { field }) => {
                Ids::Node(vec![tokens(&crate::config::as_pointer(field))?])
            }
            Shape::Node(_) => Ids::Node(ty.key.iter().map(|k| pointer(k)).collect::<Result<_>>()?),
            Shape::Edge {
                id: EdgeId::Kafka, ..
            } => Ids::EdgeFromKafka,
            Shape::Edge {
                id: EdgeId::Endpoints,
                src,
                dst,
            } => Ids::Endpoints {
                src: tokens(&crate::config::as_pointer(&src.field))?,
                dst: tokens(&crate::config::as_pointer(&dst.field))?,
            },
            Shape::Edge { .. } => Ids::Coordinates,
        };
        Ok(Some(Unwrap {
            envelope,
            fields: Fields::new(mapping, ty, shape, values)?,
            ids,
            type_name: ty.name.clone(),
        }))
    }

    /// What `r` asks.
    pub(super) fn change(&mut self, r: &SourceRecord<'_>) -> Change {
        match self.try_change(r) {
            Ok(c) => c,
            Err((code, m)) => Change::Refuse(code, m),
        }
    }

    fn try_change(&mut self, r: &SourceRecord<'_>) -> std::result::Result<Change, Refusal> {
        let key = self.plain_key(r.key);
        let Some(value) = r.value else {
            return Ok(match (&self.envelope, key) {
                (Envelope::None, key) => Change::Delete { key },
                // The event before it carried the delete (docs/cdc.md).
                _ => Change::Skip,
            });
        };
        let event = match &mut self.envelope {
            Envelope::None => Event::Upsert(events::object(value)?),
            Envelope::Debezium => events::debezium(value)?,
            Envelope::DebeziumAvro(avro) => events::debezium_event(avro.object(value)?)?,
            Envelope::OpField { op, deletes, data } => events::op_field(value, op, deletes, data)?,
        };
        match event {
            Event::Upsert(row) => {
                let row = self.fields.rewrite(row)?;
                let value = serde_json::to_vec(&Value::Object(row)).expect("JSON serializes");
                Ok(Change::Upsert { value, key })
            }
            Event::Delete(row) => {
                let from_row = row.as_ref().and_then(|row| self.id_text(row));
                match (from_row, key) {
                    (Some(id), _) => Ok(Change::Delete {
                        key: Some(id.into_bytes()),
                    }),
                    (None, Some(key)) => Ok(Change::Delete { key: Some(key) }),
                    (None, None) => Err(self.unnamed_delete(row.is_some())),
                }
            }
        }
    }

    /// Why a delete names no row.
    fn unnamed_delete(&self, had_row: bool) -> Refusal {
        if matches!(self.ids, Ids::Coordinates) {
            return (
                RejectCode::MissingKey,
                format!(
                    "edges of {} are named by topic/partition/offset, which a delete cannot name: \
                     give the type @unique(src, dst) or the mapping key = \"kafka\"",
                    self.type_name
                ),
            );
        }
        let what = if had_row {
            "before lacks the key fields"
        } else {
            "the delete has no before"
        };
        (
            RejectCode::MissingBefore,
            format!("{what}, and the record has no Kafka key naming the row"),
        )
    }

    /// A change stream's Kafka key (an object of the key columns, perhaps
    /// in the converter's wrapper) as plain key text (keys.rs): the id's
    /// parts by the same paths as the row's. Any other key stays as it is.
    fn plain_key(&self, key: Option<&[u8]>) -> Option<Vec<u8>> {
        let key = key?;
        // Keys in a registry format become plain text after this stage.
        if matches!(self.envelope, Envelope::None) || key.first() != Some(&b'{') {
            return Some(key.to_vec());
        }
        let Ok(Value::Object(o)) = serde_json::from_slice::<Value>(key) else {
            return Some(key.to_vec());
        };
        let o = events::payload(o).ok()?;
        let text = self.id_text(&o).or_else(|| in_order(&o));
        Some(text.map_or_else(|| key.to_vec(), String::into_bytes))
    }

    /// The plain key text naming the row `o` holds the id fields of, if it
    /// holds them all.
    fn id_text(&self, o: &Map<String, Value>) -> Option<String> {
        let text = |tokens: &Vec<String>| match get(o, tokens)? {
            Value::Array(parts) => {
                let parts: Vec<String> = parts
                    .iter()
                    .map(scalar_text)
                    .collect::<std::result::Result<_, _>>()
                    .ok()?;
                Some(serde_json::to_string(&parts).expect("strings"))
            }
            Value::Null => None,
            v => scalar_text(v).ok(),
        };
        match &self.ids {
            Ids::Node(parts) if parts.len() == 1 => text(&parts[0]),
            Ids::Node(parts) => {
                let parts: Vec<String> = parts.iter().map(text).collect::<Option<_>>()?;
                Some(serde_json::to_string(&parts).expect("strings"))
            }
            Ids::Endpoints { src, dst } => {
                Some(serde_json::to_string(&[text(src)?, text(dst)?]).expect("strings"))
            }
            Ids::NodeFromKafka | Ids::EdgeFromKafka | Ids::Coordinates => None,
        }
    }

    /// Debezium events in Avro: the registry's part (the format's, for
    /// other mappings).
    pub(super) fn avro(&self) -> Option<&AvroEvents> {
        match &self.envelope {
            Envelope::DebeziumAvro(a) => Some(a),
            _ => None,
        }
    }

    pub(super) fn avro_mut(&mut self) -> Option<&mut AvroEvents> {
        match &mut self.envelope {
            Envelope::DebeziumAvro(a) => Some(a),
            _ => None,
        }
    }

    /// A later stage's reject message, naming a mapped column's path.
    pub(super) fn explain(&self, message: String) -> String {
        self.fields.explain(message)
    }
}

/// A key object's values in order, as plain key text: one scalar as its
/// text, several as a JSON array (a join table's key as an edge id).
fn in_order(o: &Map<String, Value>) -> Option<String> {
    let parts: Vec<String> = o
        .values()
        .map(scalar_text)
        .collect::<std::result::Result<_, _>>()
        .ok()?;
    match parts.len() {
        0 => None,
        1 => parts.into_iter().next(),
        _ => Some(serde_json::to_string(&parts).expect("strings")),
    }
}
