//! The value-format seam: how the values of a batch of records become one
//! Arrow batch in the mapping's value schema. Everything about a format
//! (its parser, its screen, its error texts) lives behind `ValueFormat`;
//! everything after (ids, endpoints, provenance, constraints, keys,
//! last-write-wins) reads only the columns a format hands over.
//!
//! A new format is one file implementing `ValueFormat` and one variant of
//! `Format`. An enum rather than `Box<dyn ValueFormat>`: the screen runs
//! once per record on the run loop, and a static call there costs nothing,
//! while each `match` below names the place a new variant must be added.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use crate::config::{Mapping, ValueFormatName};
use crate::error::Result;
use crate::registry;
use crate::rejects::RejectCode;
use crate::schema::GraphType;

use super::avro::AvroFormat;
use super::json::JsonFormat;
use super::json_schema::JsonSchemaFormat;
use super::protobuf::ProtobufFormat;
use super::shape::Endpoint;
use super::Step;

/// What every format decodes values into, fixed by the mapping (shape.rs).
#[derive(Debug, Clone)]
pub(super) struct ValueSchema {
    /// The typed fields: the properties and each single-part endpoint,
    /// typed as its node's key.
    pub(super) fields: SchemaRef,
    /// Composite endpoints (an endpoint node type with a composite `@key`),
    /// src first: each a nullable Utf8 column after `fields`, holding the
    /// canonical text of the parts (`["acme","7"]`: a JSON array of each
    /// part's text, as `schema::canonical_ids` makes of a composite key),
    /// null where the value has no such endpoint. A present but malformed
    /// one (wrong number of parts, a part that is not a scalar) fails the
    /// decode as `missing_endpoint`, after the format's own checks.
    pub(super) composite: Vec<Endpoint>,
}

impl ValueSchema {
    /// The schema of a decoded batch: `fields`, then the composite
    /// endpoints' text columns.
    pub(super) fn decoded(&self) -> SchemaRef {
        if self.composite.is_empty() {
            return self.fields.clone();
        }
        let mut fields: Vec<Field> = self
            .fields
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        fields.extend(
            self.composite
                .iter()
                .map(|e| Field::new(&e.field, DataType::Utf8, true)),
        );
        Arc::new(Schema::new(fields))
    }
}

/// A value format: the values of one batch of records in, one Arrow batch
/// in the value schema out.
pub(super) trait ValueFormat: Send {
    /// A fault of one value found before any batch decode (JSON: syntax
    /// and, under strict coercion, the number rules).
    fn screen(&self, value: &[u8]) -> Option<(RejectCode, String)>;

    /// Decodes the values as one batch in the value schema
    /// (`ValueSchema::decoded`). Any bad value fails the call (the caller
    /// splits the batch and retries); a failed call leaves the format ready
    /// for the next.
    fn decode(&mut self, values: &[&[u8]]) -> Step<RecordBatch>;

    /// A precise code and message for one value the batch decode refused
    /// with a generic error (JSON: which field, a type or an overflow), if
    /// it can tell. Also the split search's test of a suspect: a value it
    /// finds fault with is decoded alone.
    fn classify(&self, value: &[u8]) -> Option<(RejectCode, String)>;

    /// Registry formats: the schema id framed in `value` when this format
    /// has not learned it yet. The caller fetches it from the registry and
    /// hands it to `learn` before `decode` sees the value.
    fn unlearned(&self, _value: &[u8]) -> Option<u32> {
        None
    }

    /// Registry formats: what the registry holds for `id` (`Err`: it has no
    /// such schema, and the id's records are `unknown_schema_id`).
    fn learn(&mut self, _id: u32, _schema: Learned) {}
}

/// A schema from the registry, or why it has none.
pub(crate) type Learned = std::result::Result<Arc<registry::Schema>, String>;

/// The formats a mapping can name.
pub(super) enum Format {
    Json(JsonFormat),
    Avro(AvroFormat),
    JsonSchema(JsonSchemaFormat),
    Protobuf(ProtobufFormat),
}

impl Format {
    /// The mapping's value format (`format`).
    pub(super) fn of(
        mapping: &Mapping,
        ty: &GraphType,
        values: ValueSchema,
        batch_size: usize,
    ) -> Result<Format> {
        Ok(match mapping.format {
            ValueFormatName::Json => {
                Format::Json(JsonFormat::new(mapping, ty, values, batch_size)?)
            }
            ValueFormatName::Avro => {
                Format::Avro(AvroFormat::new(mapping, ty, values, batch_size)?)
            }
            ValueFormatName::JsonSchema => {
                Format::JsonSchema(JsonSchemaFormat::new(mapping, ty, values, batch_size)?)
            }
            ValueFormatName::Protobuf => {
                Format::Protobuf(ProtobufFormat::new(mapping, ty, values, batch_size)?)
            }
        })
    }
}

impl Format {
    /// Why every record framed with schema `id` is refused, whatever its
    /// payload (the registry lacks the id, or its schema does not resolve
    /// to the type), if it is.
    pub(super) fn refused(&self, id: u32) -> Option<(RejectCode, String)> {
        self.screen(&registry::wire::framed(id, &[]))
            .filter(|(code, _)| {
                matches!(
                    code,
                    RejectCode::UnknownSchemaId
                        | RejectCode::SchemaMismatch
                        | RejectCode::UnknownField
                )
            })
    }
}

impl ValueFormat for Format {
    fn screen(&self, value: &[u8]) -> Option<(RejectCode, String)> {
        match self {
            Format::Json(f) => f.screen(value),
            Format::Avro(f) => f.screen(value),
            Format::JsonSchema(f) => f.screen(value),
            Format::Protobuf(f) => f.screen(value),
        }
    }

    fn decode(&mut self, values: &[&[u8]]) -> Step<RecordBatch> {
        match self {
            Format::Json(f) => f.decode(values),
            Format::Avro(f) => f.decode(values),
            Format::JsonSchema(f) => f.decode(values),
            Format::Protobuf(f) => f.decode(values),
        }
    }

    fn classify(&self, value: &[u8]) -> Option<(RejectCode, String)> {
        match self {
            Format::Json(f) => f.classify(value),
            Format::Avro(f) => f.classify(value),
            Format::JsonSchema(f) => f.classify(value),
            Format::Protobuf(f) => f.classify(value),
        }
    }

    fn unlearned(&self, value: &[u8]) -> Option<u32> {
        match self {
            Format::Json(f) => f.unlearned(value),
            Format::Avro(f) => f.unlearned(value),
            Format::JsonSchema(f) => f.unlearned(value),
            Format::Protobuf(f) => f.unlearned(value),
        }
    }

    fn learn(&mut self, id: u32, schema: Learned) {
        match self {
            Format::Json(f) => f.learn(id, schema),
            Format::Avro(f) => f.learn(id, schema),
            Format::JsonSchema(f) => f.learn(id, schema),
            Format::Protobuf(f) => f.learn(id, schema),
        }
    }
}
