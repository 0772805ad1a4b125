//! The Avro value format: Avro binary in the Confluent wire format, decoded
//! straight to Arrow by arrow-avro, with no JSON between.
//!
//! Each writer schema id gets its own arrow-avro decoder, built once from
//! the writer schema (the registry's, by id) and a reader schema made for
//! that writer from the type's layout (`reader_for`). Avro's schema
//! resolution then maps every writer version onto the table: field
//! defaults, int→long and float→double promotions, nullable unions. A
//! writer that cannot resolve is refused once, by id, and each of its
//! records is a `schema_mismatch` (or `unknown_field`, for a field the type
//! does not declare under `unknown_fields = "reject"`).
//!
//! The reader schema takes the writer's own form where a property reads a
//! richer Avro type (an enum, a uuid, a decimal, a timestamp in another
//! unit); `to_property` converts those columns to the property's type.
//!
//! A decoder that failed may hold half a record (arrow-avro appends field
//! by field), so it is dropped and rebuilt from its schemas.
//!
//! What is read of a writer schema's JSON (the reader schema, a key's
//! record, the fields for `from_registry`) is in `avro/schema.rs`.

mod schema;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, FixedSizeBinaryArray, ListArray, RecordBatch, StringArray};
use arrow::compute::{cast_with_options, interleave, CastOptions};
use arrow_avro::reader::{Decoder, ReaderBuilder};
use arrow_avro::schema::{AvroSchema, Fingerprint, FingerprintAlgorithm, SchemaStore};
use arrow_schema::{DataType, Field, SchemaRef};

use crate::config::{Mapping, UnknownFields};
use crate::error::{Error, Result};
use crate::registry::{wire, Schema, SchemaType};
use crate::rejects::RejectCode;
use crate::schema::GraphType;

use super::format::{Learned, ValueFormat, ValueSchema, WriterField};
use super::schema_ids::SchemaIds;
use super::{bad, Fail, Step};
pub(super) use schema::key_record;
use schema::reader_for;

pub(super) struct AvroFormat {
    values: ValueSchema,
    /// What `decode` returns (`ValueSchema::decoded`).
    decoded: SchemaRef,
    /// `unknown_fields = "reject"`: a writer field the type does not
    /// declare refuses the writer.
    unknown_reject: bool,
    batch_size: usize,
    type_name: String,
    writers: SchemaIds<Writer>,
}

/// A writer schema id that resolves to the type.
struct Writer {
    writer: String,
    reader: String,
    /// None after a failure, until the next decode rebuilds it. Boxed:
    /// arrow-avro's decoder is large, and refused ids are many.
    decoder: Option<Box<Decoder>>,
}

impl AvroFormat {
    /// Decodes the values framed with one writer `id`, in order.
    fn decode_id(&mut self, id: u32, values: &[&[u8]]) -> Step<RecordBatch> {
        let batch_size = self.batch_size.max(values.len() + 1);
        let Writer {
            writer,
            reader,
            decoder,
        } = self.writers.ready_mut(id)?;
        if decoder.as_ref().is_none_or(|d| d.batch_size() < batch_size) {
            *decoder = Some(Box::new(build(id, writer, reader, batch_size).map_err(
                |e| {
                    Fail::System(Error::Bug(format!(
                        "avro decoder of schema id {id}, which resolved before: {e}"
                    )))
                },
            )?));
        }
        let mut out = Vec::new();
        if let Err(e) = decode_values(decoder.as_mut().expect("just built"), values, &mut out) {
            *decoder = None;
            return Err(e);
        }
        match out.len() {
            1 => Ok(out.pop().expect("one")),
            _ => arrow::compute::concat_batches(&out[0].schema(), &out)
                .map_err(|e| Fail::System(Error::Bug(format!("concat avro rows: {e}")))),
        }
    }

    /// The decoded columns in the value schema's types, and the composite
    /// endpoints' canonical text.
    fn to_values(&self, batch: &RecordBatch) -> Step<Vec<ArrayRef>> {
        let mut cols = Vec::with_capacity(self.decoded.fields().len());
        for f in self.values.fields.fields() {
            let c = batch
                .column_by_name(f.name())
                .expect("the reader schema has every field");
            let col = to_property(c, f)
                .map_err(|m| Fail::Record(RejectCode::WrongType, format!("{}: {m}", f.name())))?;
            // A nullable writer union may carry null into a required
            // property: the record's reject, not a batch that cannot be built.
            if !f.is_nullable() && col.null_count() > 0 {
                return bad(
                    RejectCode::MissingRequired,
                    format!("required property {} is null", f.name()),
                );
            }
            cols.push(col);
        }
        for e in &self.values.composite {
            let c = batch
                .column_by_name(&e.field)
                .expect("the reader schema has every endpoint");
            cols.push(composite_text(c, e.width).map_err(|m| {
                Fail::Record(RejectCode::MissingEndpoint, format!("{}: {m}", e.field))
            })?);
        }
        Ok(cols)
    }
}

impl ValueFormat for AvroFormat {
    fn new(
        mapping: &Mapping,
        ty: &GraphType,
        values: ValueSchema,
        batch_size: usize,
    ) -> Result<AvroFormat> {
        Ok(AvroFormat {
            decoded: values.decoded(),
            values,
            unknown_reject: mapping.unknown_fields == UnknownFields::Reject,
            batch_size: batch_size + 1,
            type_name: ty.name.clone(),
            writers: SchemaIds::new(SchemaType::Avro, "avro"),
        })
    }

    fn writer_fields(
        schema: &Schema,
        _message: Option<&str>,
    ) -> std::result::Result<Vec<WriterField>, String> {
        schema::writer_fields(schema)
    }

    fn screen(&self, value: &[u8]) -> Option<(RejectCode, String)> {
        self.writers.screen(value).err()
    }

    fn unlearned(&self, value: &[u8]) -> Option<u32> {
        self.writers.unlearned(value)
    }

    fn learn(&mut self, id: u32, schema: Learned) {
        let (values, unknown_reject) = (&self.values, self.unknown_reject);
        let (batch_size, type_name) = (self.batch_size, &self.type_name);
        self.writers.learn(id, schema, |s| {
            if !s.references.is_empty() {
                return Err((
                    RejectCode::SchemaMismatch,
                    format!("schema id {id} imports other subjects' schemas; Avro references are not supported yet"),
                ));
            }
            let reader = reader_for(&s.text, values, unknown_reject)
                .map_err(|(code, m)| (code, format!("schema id {id}: {m}")))?;
            // Build once now, so a writer arrow-avro cannot resolve is
            // refused here, by id, and not at every record.
            match build(id, &s.text, &reader, batch_size) {
                Ok(d) => Ok(Writer {
                    writer: s.text.clone(),
                    reader,
                    decoder: Some(Box::new(d)),
                }),
                Err(e) => Err((
                    RejectCode::SchemaMismatch,
                    format!("schema id {id} cannot resolve to {type_name}: {e}"),
                )),
            }
        });
    }

    fn decode(&mut self, values: &[&[u8]]) -> Step<RecordBatch> {
        // Group by writer id, keeping each value's place. A poll is most
        // often of one writer: groups are found by a scan of the few ids,
        // not by hashing each value's.
        let mut ids: Vec<u32> = Vec::new();
        let mut groups: Vec<Vec<&[u8]>> = Vec::new();
        let mut place: Vec<(usize, usize)> = Vec::with_capacity(values.len());
        for v in values {
            let id = match wire::frame(v) {
                Ok(f) => f.schema_id,
                Err(e) => return bad(RejectCode::BadFraming, e.0),
            };
            let group = match ids.iter().position(|&i| i == id) {
                Some(g) => g,
                None => {
                    ids.push(id);
                    groups.push(Vec::new());
                    ids.len() - 1
                }
            };
            place.push((group, groups[group].len()));
            groups[group].push(v);
        }
        let mut parts: Vec<Vec<ArrayRef>> = Vec::with_capacity(ids.len());
        for (id, group) in ids.iter().zip(&groups) {
            let batch = self.decode_id(*id, group)?;
            parts.push(self.to_values(&batch)?);
        }
        let columns = if parts.len() == 1 {
            parts.pop().expect("one")
        } else {
            (0..self.decoded.fields().len())
                .map(|c| {
                    let arrays: Vec<&dyn Array> = parts.iter().map(|p| p[c].as_ref()).collect();
                    interleave(&arrays, &place)
                })
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| Fail::System(Error::Bug(format!("interleave avro rows: {e}"))))?
        };
        RecordBatch::try_new(self.decoded.clone(), columns)
            .map_err(|e| Fail::System(Error::Bug(format!("avro rows: {e}"))))
    }

    /// arrow-avro's errors already say what is wrong with the payload.
    fn classify(&self, _value: &[u8]) -> Option<(RejectCode, String)> {
        None
    }
}

pub(super) fn build(
    id: u32,
    writer: &str,
    reader: &str,
    batch_size: usize,
) -> std::result::Result<Decoder, arrow_schema::ArrowError> {
    let mut store = SchemaStore::new_with_type(FingerprintAlgorithm::Id);
    store.set(Fingerprint::Id(id), AvroSchema::new(writer.to_string()))?;
    ReaderBuilder::new()
        .with_writer_schema_store(store)
        .with_reader_schema(AvroSchema::new(reader.to_string()))
        .with_batch_size(batch_size)
        .build_decoder()
}

/// Feeds each value to `decoder` as exactly one record; flushed batches go
/// to `out`. A value that does not hold exactly one whole record fails.
pub(super) fn decode_values(
    decoder: &mut Decoder,
    values: &[&[u8]],
    out: &mut Vec<RecordBatch>,
) -> Step<()> {
    let malformed = |m: String| Fail::Record(RejectCode::MalformedAvro, m);
    for value in values {
        let mut at = 0;
        let mut rows = 0;
        while at < value.len() {
            if decoder.batch_is_full() {
                flush(decoder, out)?;
            }
            let room = decoder.capacity();
            // arrow-avro 58 panics on some hostile bytes (a block count of
            // i64::MIN overflows its negation): the record's reject, and
            // the decoder, which may hold half a record, is rebuilt.
            let decoded =
                catch_unwind(AssertUnwindSafe(|| decoder.decode(&value[at..]))).map_err(|_| {
                    malformed("the payload does not decode (the Avro reader panicked)".into())
                })?;
            // A record decoded before the error (in this call or an
            // earlier one) means the error is in bytes after it.
            let n = match decoded {
                Ok(n) => n,
                Err(e) if rows + room - decoder.capacity() >= 1 => {
                    return Err(malformed(format!("trailing bytes after the record ({e})")))
                }
                Err(e) => return Err(malformed(format!("the payload does not decode: {e}"))),
            };
            rows += room - decoder.capacity();
            at += n;
            if rows > 1 {
                return Err(malformed("trailing bytes after the record".into()));
            }
            if n == 0 && !decoder.batch_is_full() {
                return Err(malformed(if rows == 1 {
                    "trailing bytes after the record".into()
                } else {
                    "the payload is truncated".into()
                }));
            }
        }
        if rows != 1 {
            return Err(malformed("the payload is truncated".into()));
        }
    }
    flush(decoder, out)
}

fn flush(decoder: &mut Decoder, out: &mut Vec<RecordBatch>) -> Step<()> {
    let flushed = catch_unwind(AssertUnwindSafe(|| decoder.flush())).map_err(|_| {
        Fail::Record(
            RejectCode::MalformedAvro,
            "the payload does not decode (the Avro reader panicked)".into(),
        )
    })?;
    match flushed {
        Ok(Some(b)) => {
            out.push(b);
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(e) => Err(Fail::Record(
            RejectCode::MalformedAvro,
            format!("the payload does not decode: {e}"),
        )),
    }
}

/// One decoded column as the property's type.
fn to_property(c: &ArrayRef, f: &Field) -> std::result::Result<ArrayRef, String> {
    let want = f.data_type();
    if c.data_type() == want {
        return Ok(c.clone());
    }
    // A uuid (16 bytes) reads as its canonical text.
    if let (DataType::FixedSizeBinary(16), DataType::Utf8) = (c.data_type(), want) {
        let b = c
            .as_any()
            .downcast_ref::<FixedSizeBinaryArray>()
            .expect("fixed");
        let text: StringArray = (0..b.len())
            .map(|i| {
                b.is_valid(i).then(|| {
                    uuid::Uuid::from_slice(b.value(i))
                        .map(|u| u.hyphenated().to_string())
                        .unwrap_or_default()
                })
            })
            .collect();
        return Ok(Arc::new(text));
    }
    // Checked casts: an out-of-range number fails the record, never wraps
    // or becomes null.
    let opts = CastOptions {
        safe: false,
        ..Default::default()
    };
    let cast = cast_with_options(c, want, &opts).map_err(|e| e.to_string())?;
    Ok(cast)
}

/// A composite endpoint (an array of the key's parts) as its canonical
/// text, the JSON array of each part's text.
fn composite_text(c: &ArrayRef, width: usize) -> std::result::Result<ArrayRef, String> {
    let Some(list) = c.as_any().downcast_ref::<ListArray>() else {
        return Err(format!(
            "a composite endpoint must be an array, got {}",
            c.data_type()
        ));
    };
    let mut out = Vec::with_capacity(list.len());
    for i in 0..list.len() {
        if list.is_null(i) {
            out.push(None);
            continue;
        }
        let items = list.value(i);
        if items.len() != width {
            return Err(format!("a composite endpoint key needs {width} parts"));
        }
        // Each part's text as `keys::scalar_text` gives a JSON scalar's.
        let text = arrow::compute::cast(&items, &DataType::Utf8).map_err(|e| e.to_string())?;
        let text = text.as_any().downcast_ref::<StringArray>().expect("utf8");
        if text.null_count() > 0 {
            return Err("a composite endpoint key part is null".into());
        }
        let parts: Vec<&str> = text.iter().map(|p| p.expect("no nulls")).collect();
        out.push(Some(serde_json::to_string(&parts).expect("strings")));
    }
    Ok(Arc::new(StringArray::from(out)))
}

