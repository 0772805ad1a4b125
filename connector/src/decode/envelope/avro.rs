//! Debezium envelopes in Avro (`format = "avro"`, `envelope = "debezium"`,
//! as Confluent's AvroConverter writes them): each event decoded by
//! arrow-avro under its writer schema from the registry, then written as
//! one JSON object by arrow-json, so the rest of the stage (op, paths,
//! encodings, ids) and the JSON format read it as any Debezium event.
//!
//! One JSON round trip per row, slower than the Avro format's straight-to-
//! Arrow path; chosen so one change stage serves both encodings
//! (docs/decisions/0010-change-streams.md).

use arrow::array::RecordBatch;
use arrow_avro::reader::Decoder;
use serde_json::{Map, Value};

use crate::registry::{wire, SchemaType};
use crate::rejects::RejectCode;

use super::super::avro::{build, decode_values};
use super::super::schema_ids::SchemaIds;
use super::super::{Fail, Learned};
use super::fields::Refusal;

/// A writer schema id that reads as Avro: the schema's text; its decoder
/// (reader = writer: every field kept), `None` after a failure until the
/// next record rebuilds it.
struct Writer {
    text: String,
    decoder: Option<Box<Decoder>>,
}

pub(in crate::decode) struct AvroEvents {
    writers: SchemaIds<Writer>,
}

impl Default for AvroEvents {
    fn default() -> Self {
        AvroEvents {
            writers: SchemaIds::new(SchemaType::Avro, "avro"),
        }
    }
}

impl AvroEvents {
    /// The schema id framed in `value`, when it must be fetched first.
    pub(in crate::decode) fn unlearned(&self, value: &[u8]) -> Option<u32> {
        self.writers.unlearned(value)
    }

    /// Why every event of schema `id` is refused, if it is.
    pub(in crate::decode) fn refused(&self, id: u32) -> Option<(RejectCode, String)> {
        self.writers.refusal(id)
    }

    pub(in crate::decode) fn learn(&mut self, id: u32, schema: Learned) {
        self.writers
            .learn(id, schema, |s| match build(id, &s.text, &s.text, 2) {
                Ok(d) => Ok(Writer {
                    text: s.text.clone(),
                    decoder: Some(Box::new(d)),
                }),
                Err(e) => Err((
                    RejectCode::SchemaMismatch,
                    format!("schema id {id} does not read as Avro: {e}"),
                )),
            });
    }

    /// One framed Avro event as a JSON object.
    pub(super) fn object(&mut self, value: &[u8]) -> Result<Map<String, Value>, Refusal> {
        let id = wire::frame(value)
            .map_err(|e| (RejectCode::BadFraming, e.0))?
            .schema_id;
        let (text, slot) = match self.writers.get_mut(id) {
            Some(Ok(Writer { text, decoder })) => (text, decoder),
            Some(Err((code, m))) => return Err((*code, m.clone())),
            None => {
                return Err((
                    RejectCode::UnknownSchemaId,
                    format!("schema id {id} was not fetched before decoding"),
                ))
            }
        };
        if slot.is_none() {
            let d = build(id, text, text, 2)
                .map_err(|e| (RejectCode::SchemaMismatch, format!("schema id {id}: {e}")))?;
            *slot = Some(Box::new(d));
        }
        let decoder = slot.as_mut().expect("just built");
        let mut out = Vec::new();
        if let Err(e) = decode_values(decoder, &[value], &mut out) {
            // It may hold half a record.
            *slot = None;
            return Err(match e {
                Fail::Record(code, m) => (code, m),
                Fail::System(e) => (RejectCode::MalformedAvro, e.to_string()),
            });
        }
        match out.as_slice() {
            [batch] => as_object(batch),
            _ => Err((
                RejectCode::MalformedAvro,
                "the payload is not one record".into(),
            )),
        }
    }
}

/// A one-row batch as a JSON object (arrow-json leaves null fields out, so
/// a null `after` is an absent one).
fn as_object(batch: &RecordBatch) -> Result<Map<String, Value>, Refusal> {
    let mut w = arrow_json::LineDelimitedWriter::new(Vec::new());
    w.write(batch).and_then(|_| w.finish()).map_err(|e| {
        (
            RejectCode::MalformedAvro,
            format!("the event does not read as JSON: {e}"),
        )
    })?;
    match serde_json::from_slice(&w.into_inner()) {
        Ok(Value::Object(o)) => Ok(o),
        _ => Err((
            RejectCode::MalformedAvro,
            "the event is not one record".into(),
        )),
    }
}
