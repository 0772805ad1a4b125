//! The JSON value format: each value one JSON object. `screen` (serde_json,
//! per value) refuses what arrow-json would take wrongly; arrow-json then
//! decodes a whole batch at once, the fast path; `classify` re-reads a
//! value arrow-json refused with serde_json to name the field and tell a
//! type from an overflow. Both ask `fit` whether a value fits its column
//! type.
//!
//! Composite endpoints are JSON arrays, which arrow-json cannot read into
//! a key: each value loses them before arrow-json and they come back as
//! Utf8 columns of their canonical text (`ValueSchema::composite`).

mod fit;
mod screen;

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, StringArray};
use arrow_json::reader::Decoder;
use arrow_schema::SchemaRef;

use crate::config::{Coerce, Mapping, UnknownFields};
use crate::error::{Context, Error, Result};
use crate::rejects::RejectCode;
use crate::schema::GraphType;

use super::format::{ValueFormat, ValueSchema};
use super::keys::scalar_text;
use super::shape::Endpoint;
use super::{bad, Fail, Step};
use fit::Want;
use screen::ValueScreen;

pub(super) struct JsonFormat {
    /// What arrow-json decodes into: the value schema's typed fields.
    fields: SchemaRef,
    composite: Vec<Endpoint>,
    /// `fields` and the composite endpoints' columns: what `decode` returns.
    decoded: SchemaRef,
    decoder: Decoder,
    batch_size: usize,
    /// `unknown_fields = "reject"`.
    strict: bool,
    /// `coerce = "strict"`: `classify` judges as the screen does.
    strict_numbers: bool,
    /// What each of `fields` takes, for `classify`.
    wants: Vec<Want>,
    /// Checks each value before decoding: JSON syntax, and (`coerce =
    /// "strict"`) numbers arrow-json would coerce silently.
    screen: ValueScreen,
    /// For `classify`'s messages: the type's name, and its `@key`
    /// properties (a missing one is `missing_key`, not `missing_required`).
    type_name: String,
    key: Vec<String>,
}

impl JsonFormat {
    /// arrow-json over the values; each value must be exactly one JSON
    /// object.
    fn decode_batch(&mut self, values: &[&[u8]]) -> Step<RecordBatch> {
        let mut ends = Composite::new(self.composite.len(), values.len());
        for &raw in values {
            let stripped;
            let value = if self.composite.is_empty() {
                raw
            } else {
                stripped = self.strip_composite_endpoints(raw, &mut ends)?;
                stripped.as_slice()
            };
            let before = self.decoder.len();
            let read = self
                .decoder
                .decode(value)
                .map_err(|e| Fail::Record(RejectCode::WrongType, e.to_string()))?;
            if read != value.len()
                || self.decoder.has_partial_record()
                || self.decoder.len() != before + 1
            {
                return bad(
                    RejectCode::NotAnObject,
                    "value is not exactly one JSON object",
                );
            }
        }
        let batch = match self.decoder.flush() {
            Ok(Some(b)) => b,
            Ok(None) => return Err(Fail::System(Error::Bug("decoder produced no rows".into()))),
            Err(e) => return bad(RejectCode::WrongType, e.to_string()),
        };
        self.with_composite(batch, ends)
    }

    /// Takes the composite endpoints out of a value (arrow-json cannot read
    /// an array into a key) into `ends`, and returns the rest.
    fn strip_composite_endpoints(&self, raw: &[u8], ends: &mut Composite) -> Step<Vec<u8>> {
        let mut v = parse_object(raw)?;
        for (e, texts) in self.composite.iter().zip(&mut ends.texts) {
            let text = match v.get(&e.field) {
                Some(serde_json::Value::Array(items)) => match composite_text(e, items) {
                    Ok(t) => Some(t),
                    Err(m) => {
                        ends.fault.get_or_insert(m);
                        None
                    }
                },
                // Absent or not an array: the rows say the endpoint is missing.
                _ => None,
            };
            texts.push(text);
        }
        for e in &self.composite {
            v.remove(&e.field);
        }
        Ok(serde_json::to_vec(&v).expect("re-serializes"))
    }

    /// The decoded batch with the composite endpoints' columns after it.
    /// A malformed endpoint fails here, after arrow-json has had its say,
    /// so a value arrow-json refuses keeps arrow-json's code.
    fn with_composite(&self, batch: RecordBatch, ends: Composite) -> Step<RecordBatch> {
        if let Some(m) = ends.fault {
            return bad(RejectCode::MissingEndpoint, m);
        }
        if self.composite.is_empty() {
            return Ok(batch);
        }
        let mut columns = batch.columns().to_vec();
        columns.extend(
            ends.texts
                .into_iter()
                .map(|t| Arc::new(StringArray::from(t)) as ArrayRef),
        );
        RecordBatch::try_new(self.decoded.clone(), columns)
            .map_err(|e| Fail::System(Error::Bug(format!("{}: {e}", self.type_name))))
    }
}

impl ValueFormat for JsonFormat {
    fn new(
        mapping: &Mapping,
        ty: &GraphType,
        values: ValueSchema,
        batch_size: usize,
    ) -> Result<JsonFormat> {
        let strict_numbers = mapping.coerce == Coerce::Strict;
        let screen = ValueScreen::new(&values.fields, strict_numbers);
        let wants = values
            .fields
            .fields()
            .iter()
            .map(|f| Want::of(f.data_type()))
            .collect();
        // A spare row: a decoder at its batch size reads nothing more.
        let batch_size = batch_size + 1;
        let strict = mapping.unknown_fields == UnknownFields::Reject;
        Ok(JsonFormat {
            decoder: build_decoder(&values.fields, batch_size, strict)?,
            decoded: values.decoded(),
            fields: values.fields,
            composite: values.composite,
            batch_size,
            strict,
            strict_numbers,
            wants,
            screen,
            type_name: ty.name.clone(),
            key: ty.key.clone(),
        })
    }

    fn screen(&self, value: &[u8]) -> Option<(RejectCode, String)> {
        self.screen.check(value)
    }

    fn decode(&mut self, values: &[&[u8]]) -> Step<RecordBatch> {
        let out = self.decode_batch(values);
        if out.is_err() {
            // A failed decoder may hold half a record, or the rows of the
            // values before the bad one.
            self.decoder = build_decoder(&self.fields, self.batch_size, self.strict)?;
        }
        out
    }

    fn classify(&self, raw: &[u8]) -> Option<(RejectCode, String)> {
        let text = match std::str::from_utf8(raw) {
            Ok(t) => t,
            Err(e) => return Some((RejectCode::NotUtf8, format!("value is not UTF-8: {e}"))),
        };
        let v: serde_json::Value = match serde_json::from_str(text) {
            Ok(v) => v,
            Err(e) => return Some((RejectCode::MalformedJson, format!("value is not JSON: {e}"))),
        };
        let Some(obj) = v.as_object() else {
            return Some((RejectCode::NotAnObject, "value is not a JSON object".into()));
        };
        if self.strict {
            if let Some(k) = obj.keys().find(|k| {
                self.fields.field_with_name(k).is_err()
                    && !self.composite.iter().any(|e| &e.field == *k)
            }) {
                return Some((
                    RejectCode::UnknownField,
                    format!("field {k:?} is not a property of {}", self.type_name),
                ));
            }
        }
        for (f, want) in self.fields.fields().iter().zip(&self.wants) {
            match obj.get(f.name()) {
                None | Some(serde_json::Value::Null) if !f.is_nullable() => {
                    return Some(if self.key.contains(f.name()) {
                        (
                            RejectCode::MissingKey,
                            format!("missing @key property {}", f.name()),
                        )
                    } else {
                        (
                            RejectCode::MissingRequired,
                            format!("required property {} is missing or null", f.name()),
                        )
                    });
                }
                None | Some(serde_json::Value::Null) => {}
                Some(v) => {
                    if let Some((code, why)) = fit::misfit(want, v, self.strict_numbers) {
                        return Some((code, format!("{}: {why}", f.name())));
                    }
                }
            }
        }
        None
    }
}

/// The composite endpoints of one batch: per endpoint, per value, its
/// canonical text; and the first malformed one's message.
struct Composite {
    texts: Vec<Vec<Option<String>>>,
    fault: Option<String>,
}

impl Composite {
    fn new(endpoints: usize, values: usize) -> Composite {
        Composite {
            texts: (0..endpoints).map(|_| Vec::with_capacity(values)).collect(),
            fault: None,
        }
    }
}

/// The canonical text of a composite endpoint's parts, or why it has none.
fn composite_text(
    e: &Endpoint,
    items: &[serde_json::Value],
) -> std::result::Result<String, String> {
    if items.len() != e.width {
        return Err(format!(
            "{}: a composite endpoint key needs {} parts",
            e.field, e.width
        ));
    }
    let parts: Vec<String> = items
        .iter()
        .map(scalar_text)
        .collect::<std::result::Result<_, String>>()?;
    Ok(serde_json::to_string(&parts).expect("strings"))
}

fn parse_object(raw: &[u8]) -> Step<serde_json::Map<String, serde_json::Value>> {
    json_object(raw).map_err(|(code, m)| Fail::Record(code, m))
}

/// A value as one JSON object, or its fault (the change stage reads
/// envelopes with it too).
pub(super) fn json_object(
    raw: &[u8],
) -> std::result::Result<serde_json::Map<String, serde_json::Value>, (RejectCode, String)> {
    let text = std::str::from_utf8(raw)
        .map_err(|e| (RejectCode::NotUtf8, format!("value is not UTF-8: {e}")))?;
    match serde_json::from_str(text) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        Ok(_) => Err((RejectCode::NotAnObject, "value is not a JSON object".into())),
        Err(e) => Err((RejectCode::MalformedJson, format!("value is not JSON: {e}"))),
    }
}

fn build_decoder(schema: &SchemaRef, batch_size: usize, strict: bool) -> Result<Decoder> {
    arrow_json::ReaderBuilder::new(schema.clone())
        .with_batch_size(batch_size)
        .with_strict_mode(strict)
        .build_decoder()
        .ctx("build JSON decoder")
}
