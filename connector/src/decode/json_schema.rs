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

use std::collections::HashMap;

use arrow::array::RecordBatch;

use crate::config::Mapping;
use crate::error::Result;
use crate::registry::{wire, SchemaType};
use crate::rejects::RejectCode;
use crate::schema::GraphType;

use super::format::{Learned, ValueFormat, ValueSchema};
use super::json::JsonFormat;
use super::{bad, Step};

pub(super) struct JsonSchemaFormat {
    json: JsonFormat,
    /// Ids learned: `None` if the id's records are taken, else why not.
    ids: HashMap<u32, Option<(RejectCode, String)>>,
}

impl JsonSchemaFormat {
    pub(super) fn new(
        mapping: &Mapping,
        ty: &GraphType,
        values: ValueSchema,
        batch_size: usize,
    ) -> Result<JsonSchemaFormat> {
        Ok(JsonSchemaFormat {
            json: JsonFormat::new(mapping, ty, values, batch_size)?,
            ids: HashMap::new(),
        })
    }
}

/// The JSON after the prefix.
fn payload(value: &[u8]) -> std::result::Result<&[u8], (RejectCode, String)> {
    wire::frame(value)
        .map(|f| f.rest)
        .map_err(|e| (RejectCode::BadFraming, e.0))
}

impl ValueFormat for JsonSchemaFormat {
    fn screen(&self, value: &[u8]) -> Option<(RejectCode, String)> {
        let f = match wire::frame(value) {
            Ok(f) => f,
            Err(e) => return Some((RejectCode::BadFraming, e.0)),
        };
        if let Some(Some(refused)) = self.ids.get(&f.schema_id) {
            return Some(refused.clone());
        }
        self.json.screen(f.rest)
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
        let id = wire::frame(value).ok()?.schema_id;
        (!self.ids.contains_key(&id)).then_some(id)
    }

    fn learn(&mut self, id: u32, schema: Learned) {
        let refused = match schema {
            Err(m) => Some((RejectCode::UnknownSchemaId, m)),
            Ok(s) if s.schema_type != SchemaType::Json => Some((
                RejectCode::SchemaMismatch,
                format!(
                    "schema id {id} is a {:?} schema, and this mapping's format is json_schema",
                    s.schema_type
                ),
            )),
            Ok(_) => None,
        };
        self.ids.insert(id, refused);
    }
}
