//! The JSON Schema value format: a JSON object in the Confluent wire
//! format. The prefix names a JSON Schema in the registry; the payload
//! after it takes the JSON path unchanged (`json.rs`: the screen, the
//! number rules, arrow-json).
//!
//! The JSON Schema itself is not enforced: the `.pg` type is the contract
//! a record must meet, and the JSON path already checks every property's
//! presence, type and range against it, with typed rejects. A JSON Schema
//! check on top would refuse records the graph can take (a producer's
//! schema stricter than the type) or repeat the type's checks with less
//! precise codes. The id must still exist and be a JSON Schema: a record
//! framed with an id the registry lacks is `unknown_schema_id`, and one
//! framed with an Avro or Protobuf schema's id is `schema_mismatch`.

use arrow::array::RecordBatch;
use serde_json::Value;

use crate::config::Mapping;
use crate::error::Result;
use crate::registry::{wire, Schema, SchemaType};
use crate::rejects::RejectCode;
use crate::schema::GraphType;

use super::format::{Learned, ValueFormat, ValueSchema, WriterField};
use super::json::JsonFormat;
use super::schema_ids::SchemaIds;
use super::{bad, Step};

pub(super) struct JsonSchemaFormat {
    json: JsonFormat,
    /// Ids learned; none needs more than being a JSON Schema.
    ids: SchemaIds<()>,
}

/// The JSON after the prefix.
fn payload(value: &[u8]) -> std::result::Result<&[u8], (RejectCode, String)> {
    wire::frame(value)
        .map(|f| f.rest)
        .map_err(|e| (RejectCode::BadFraming, e.0))
}

impl ValueFormat for JsonSchemaFormat {
    fn new(
        mapping: &Mapping,
        ty: &GraphType,
        values: ValueSchema,
        batch_size: usize,
    ) -> Result<JsonSchemaFormat> {
        Ok(JsonSchemaFormat {
            json: JsonFormat::new(mapping, ty, values, batch_size)?,
            ids: SchemaIds::new(SchemaType::Json, "json_schema"),
        })
    }

    fn writer_fields(
        schema: &Schema,
        _message: Option<&str>,
    ) -> std::result::Result<Vec<WriterField>, String> {
        properties(schema)
    }

    fn screen(&self, value: &[u8]) -> Option<(RejectCode, String)> {
        match self.ids.screen(value) {
            Err(refused) => Some(refused),
            Ok((f, _)) => self.json.screen(f.rest),
        }
    }

    fn decode(&mut self, values: &[&[u8]]) -> Step<RecordBatch> {
        let mut payloads = Vec::with_capacity(values.len());
        for v in values {
            match payload(v) {
                Ok(p) => payloads.push(p),
                Err((code, m)) => return bad(code, m),
            }
        }
        self.json.decode(&payloads)
    }

    fn classify(&self, value: &[u8]) -> Option<(RejectCode, String)> {
        match payload(value) {
            Ok(p) => self.json.classify(p),
            Err(refused) => Some(refused),
        }
    }

    fn unlearned(&self, value: &[u8]) -> Option<u32> {
        self.ids.unlearned(value)
    }

    fn learn(&mut self, id: u32, schema: Learned) {
        self.ids.learn(id, schema, |_| Ok(()));
    }
}

/// The top-level properties of a JSON Schema, each with the `.pg` type
/// it would be declared as; one not `required`, or whose type admits
/// `null`, may be absent.
fn properties(schema: &Schema) -> std::result::Result<Vec<WriterField>, String> {
    let v: Value = serde_json::from_str(&schema.text)
        .map_err(|e| format!("the schema is not JSON: {e}"))?;
    let props = v["properties"]
        .as_object()
        .ok_or("the JSON Schema has no properties")?;
    let required: Vec<&str> = v["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    Ok(props
        .iter()
        .map(|(name, p)| {
            let types: Vec<&str> = match &p["type"] {
                Value::String(s) => vec![s.as_str()],
                Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
                _ => vec![],
            };
            let rest: Vec<&str> = types.iter().copied().filter(|t| *t != "null").collect();
            let pg_type = match (rest.as_slice(), p["format"].as_str()) {
                (["string"], Some("date-time")) => Some("DateTime"),
                (["string"], Some("date")) => Some("Date"),
                (["string"], _) => Some("String"),
                (["integer"], _) => Some("I64"),
                (["number"], _) => Some("F64"),
                (["boolean"], _) => Some("Bool"),
                _ => None,
            };
            WriterField {
                name: name.clone(),
                pg_type,
                optional: !required.contains(&name.as_str()) || rest.len() < types.len(),
            }
        })
        .collect())
}
