//! The value-format seam: how the values of a batch of records become one
//! Arrow batch in the mapping's value schema. Everything about a format
//! (its parser, its screen, its error texts, what it reads of a writer
//! schema) lives behind `ValueFormat`, in the format's own file;
//! everything after (ids, endpoints, provenance, constraints, keys,
//! last-write-wins) reads only the columns a format hands over.
//!
//! This file names no format: each format imports it, and the list of
//! formats (`value_formats!` in `decode/mod.rs`) imports the formats.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use crate::config::Mapping;
use crate::error::Result;
use crate::registry;
use crate::rejects::RejectCode;
use crate::schema::GraphType;

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
/// in the value schema out (kafka-delta-ingest's `MessageDeserializer`,
/// by the batch).
///
/// A decoder holds its format as a `Box<dyn ValueFormat>`: one dynamic
/// call per value (`screen`, `unlearned`) and one per batch (`decode`),
/// as many as a `match` over the formats would make; a format's own loops
/// over rows and fields make static calls only.
pub(super) trait ValueFormat: Send {
    /// The format for a mapping's values, decoding into `values`, at most
    /// `batch_size` values a call.
    fn new(
        mapping: &Mapping,
        ty: &GraphType,
        values: ValueSchema,
        batch_size: usize,
    ) -> Result<Self>
    where
        Self: Sized;

    /// `[graph] evolve = "from_registry"`: the top-level fields of a
    /// writer schema of this format (`message`: the mapping's Protobuf
    /// message). A format without writer schemas has none.
    fn writer_fields(
        _schema: &registry::Schema,
        _message: Option<&str>,
    ) -> std::result::Result<Vec<WriterField>, String>
    where
        Self: Sized,
    {
        Ok(vec![])
    }

    /// A fault of one value found before any batch decode (JSON: syntax
    /// and, under strict coercion, the number rules; registry formats: the
    /// frame, and an id refused when it was learned).
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

    /// Registry formats: whether to ask the registry for the serialized
    /// descriptor (`format=serialized`) rather than the schema's text.
    fn wants_descriptor(&self) -> bool {
        false
    }

    /// Why every record framed with schema `id` is refused, whatever its
    /// payload (the registry lacks the id, or its schema does not resolve
    /// to the type), if it is.
    fn refused(&self, id: u32) -> Option<(RejectCode, String)> {
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

/// A schema from the registry, or why it has none.
pub(crate) type Learned = std::result::Result<Arc<registry::Schema>, String>;

/// One field of a writer schema (`ValueFormat::writer_fields`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WriterField {
    pub(crate) name: String,
    /// The `.pg` scalar type, if the field has one.
    pub(crate) pg_type: Option<&'static str>,
    /// Avro: a union with `null`; Protobuf: a field with presence;
    /// JSON Schema: not `required`, or a type that admits `null`.
    pub(crate) optional: bool,
}
