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

use std::collections::{HashMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, FixedSizeBinaryArray, ListArray, RecordBatch, StringArray};
use arrow::compute::{cast_with_options, interleave, CastOptions};
use arrow_avro::reader::{Decoder, ReaderBuilder};
use arrow_avro::schema::{AvroSchema, Fingerprint, FingerprintAlgorithm, SchemaStore};
use arrow_schema::{DataType, Field, SchemaRef, TimeUnit};
use serde_json::{json, Map, Value};

use crate::config::{Mapping, UnknownFields};
use crate::error::{Error, Result};
use crate::registry::wire;
use crate::rejects::RejectCode;
use crate::schema::GraphType;

use super::format::{Learned, ValueFormat, ValueSchema};
use super::{bad, Fail, Step};

pub(super) struct AvroFormat {
    values: ValueSchema,
    /// What `decode` returns (`ValueSchema::decoded`).
    decoded: SchemaRef,
    /// `unknown_fields = "reject"`: a writer field the type does not
    /// declare refuses the writer.
    unknown_reject: bool,
    batch_size: usize,
    type_name: String,
    /// By schema id, looked up for every record: a fast hash of a u32.
    writers: HashMap<u32, Writer, foldhash::fast::RandomState>,
}

/// What is known of one writer schema id.
enum Writer {
    Ready {
        writer: String,
        reader: String,
        /// None after a failure, until the next decode rebuilds it. Boxed:
        /// arrow-avro's decoder is large, and refused ids are many.
        decoder: Option<Box<Decoder>>,
    },
    Refused(RejectCode, String),
}

impl AvroFormat {
    pub(super) fn new(
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
            writers: HashMap::default(),
        })
    }

    /// Decodes the values framed with one writer `id`, in order.
    fn decode_id(&mut self, id: u32, values: &[&[u8]]) -> Step<RecordBatch> {
        let batch_size = self.batch_size.max(values.len() + 1);
        let decoder = match self.writers.get_mut(&id) {
            Some(Writer::Ready {
                writer,
                reader,
                decoder,
            }) => {
                if decoder.as_ref().is_none_or(|d| d.batch_size() < batch_size) {
                    *decoder = Some(Box::new(build(id, writer, reader, batch_size).map_err(
                        |e| {
                            Fail::System(Error::Bug(format!(
                                "avro decoder of schema id {id}, which resolved before: {e}"
                            )))
                        },
                    )?));
                }
                decoder.as_mut().expect("just built")
            }
            Some(Writer::Refused(code, m)) => return bad(*code, m.clone()),
            None => {
                return Err(Fail::System(Error::Bug(format!(
                    "schema id {id} was not fetched before decoding"
                ))))
            }
        };
        let mut out = Vec::new();
        if let Err(e) = decode_values(decoder, values, &mut out) {
            self.drop_decoder(id);
            return Err(e);
        }
        match out.len() {
            1 => Ok(out.pop().expect("one")),
            _ => arrow::compute::concat_batches(&out[0].schema(), &out)
                .map_err(|e| Fail::System(Error::Bug(format!("concat avro rows: {e}")))),
        }
    }

    fn drop_decoder(&mut self, id: u32) {
        if let Some(Writer::Ready { decoder, .. }) = self.writers.get_mut(&id) {
            *decoder = None;
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
    fn screen(&self, value: &[u8]) -> Option<(RejectCode, String)> {
        match wire::frame(value) {
            Err(e) => Some((RejectCode::BadFraming, e.0)),
            Ok(f) => match self.writers.get(&f.schema_id) {
                Some(Writer::Refused(code, m)) => Some((*code, m.clone())),
                _ => None,
            },
        }
    }

    fn unlearned(&self, value: &[u8]) -> Option<u32> {
        let id = wire::frame(value).ok()?.schema_id;
        (!self.writers.contains_key(&id)).then_some(id)
    }

    fn learn(&mut self, id: u32, schema: Learned) {
        let writer = match schema {
            Err(m) => Writer::Refused(RejectCode::UnknownSchemaId, m),
            Ok(s) if s.schema_type != crate::registry::SchemaType::Avro => Writer::Refused(
                RejectCode::SchemaMismatch,
                format!(
                    "schema id {id} is a {:?} schema, and this mapping's format is avro",
                    s.schema_type
                ),
            ),
            Ok(s) if !s.references.is_empty() => Writer::Refused(
                RejectCode::SchemaMismatch,
                format!("schema id {id} imports other subjects' schemas; Avro references are not supported yet"),
            ),
            Ok(s) => match reader_for(&s.text, &self.values, self.unknown_reject) {
                Err((code, m)) => Writer::Refused(code, format!("schema id {id}: {m}")),
                // Build once now, so a writer arrow-avro cannot resolve is
                // refused here, by id, and not at every record.
                Ok(reader) => match build(id, &s.text, &reader, self.batch_size) {
                    Ok(d) => Writer::Ready {
                        writer: s.text.clone(),
                        reader,
                        decoder: Some(Box::new(d)),
                    },
                    Err(e) => Writer::Refused(
                        RejectCode::SchemaMismatch,
                        format!(
                            "schema id {id} cannot resolve to {}: {e}",
                            self.type_name
                        ),
                    ),
                },
            },
        };
        self.writers.insert(id, writer);
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

/// The reader schema for one writer schema: a record of the type's value
/// fields, each in the Avro form that reads the writer's field (see the
/// module doc), nullable (default null) where the property or the writer's
/// field is. Refuses a writer the type cannot take, with the code.
pub(super) fn reader_for(
    writer: &str,
    values: &ValueSchema,
    unknown_reject: bool,
) -> std::result::Result<String, (RejectCode, String)> {
    let mismatch = |m: String| (RejectCode::SchemaMismatch, m);
    let (names, record) = writer_record(writer).map_err(mismatch)?;
    let name = record
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("value")
        .to_string();
    let namespace = record.get("namespace").cloned();
    let wfields: Vec<&Value> = record
        .get("fields")
        .and_then(Value::as_array)
        .map(|f| f.iter().collect())
        .unwrap_or_default();
    let by_name: HashMap<&str, &Value> = wfields
        .iter()
        .filter_map(|f| Some((f.get("name")?.as_str()?, &f["type"])))
        .collect();
    let wanted = wanted_fields(values);
    if unknown_reject {
        let declared: HashSet<&str> = wanted.iter().map(|w| w.name.as_str()).collect();
        if let Some(extra) = by_name.keys().find(|k| !declared.contains(*k)) {
            return Err((
                RejectCode::UnknownField,
                format!("the writer schema has field {extra:?}, which the type does not declare (unknown_fields = \"reject\")"),
            ));
        }
    }
    let mut emitted = HashSet::new();
    let mut fields = Vec::with_capacity(wanted.len());
    for w in &wanted {
        let field = reader_field(
            w,
            by_name.get(w.name.as_str()).copied(),
            &names,
            &mut emitted,
        )
        .map_err(|m| mismatch(format!("field {}: {m}", w.name)))?;
        fields.push(field);
    }
    let mut reader = json!({"type": "record", "name": name, "fields": fields});
    if let Some(ns) = namespace {
        reader["namespace"] = ns;
    }
    Ok(reader.to_string())
}

/// The writer schema parsed, its named types collected, and its top-level
/// record resolved; or why it cannot be read.
fn writer_record(writer: &str) -> std::result::Result<(Named, Value), String> {
    let w: Value =
        serde_json::from_str(writer).map_err(|e| format!("the writer schema is not JSON: {e}"))?;
    let mut names = Named::default();
    names.collect(&w, None);
    if let Some(m) = endless_array(&w, &names, 0) {
        return Err(m);
    }
    let record = names.resolve(&w);
    if record.get("type").and_then(Value::as_str) != Some("record") {
        return Err("the writer schema is not a record".into());
    }
    Ok((names, record))
}

/// One field the reader schema has: a value field, or a composite
/// endpoint's (read as the writer's array of parts).
struct Wanted {
    name: String,
    target: DataType,
    nullable: bool,
    composite: bool,
}

/// The value schema's fields, then its composite endpoints.
fn wanted_fields(values: &ValueSchema) -> Vec<Wanted> {
    let mut wanted: Vec<Wanted> = values
        .fields
        .fields()
        .iter()
        .map(|f| Wanted {
            name: f.name().clone(),
            target: f.data_type().clone(),
            nullable: f.is_nullable(),
            composite: false,
        })
        .collect();
    wanted.extend(values.composite.iter().map(|e| Wanted {
        name: e.field.clone(),
        target: DataType::Utf8,
        nullable: true,
        composite: true,
    }));
    wanted
}

/// The reader schema's field for `w`, given the writer's type of the same
/// name (if the writer has it).
fn reader_field(
    w: &Wanted,
    wtype: Option<&Value>,
    names: &Named,
    emitted: &mut HashSet<String>,
) -> std::result::Result<Value, String> {
    let (wtype, wnull) = match wtype.map(|t| names.resolve(t)) {
        Some(t) => {
            let (inner, n) = strip_null(&t);
            (Some(names.resolve(&inner)), n)
        }
        None => (None, false),
    };
    let mut t = match (&wtype, w.composite) {
        (Some(wt), true) => wt.clone(),
        (None, true) => json!({"type": "array", "items": "string"}),
        (wt, false) => reader_type(&w.target, wt.as_ref(), emitted)?,
    };
    let mut field = Map::new();
    field.insert("name".into(), json!(w.name));
    if w.nullable || wnull || w.composite {
        t = json!(["null", t]);
        field.insert("default".into(), Value::Null);
    }
    field.insert("type".into(), t);
    Ok(Value::Object(field))
}

/// The Avro reader type of one property, in the writer's form where the
/// writer holds a richer type the property can take.
fn reader_type(
    target: &DataType,
    writer: Option<&Value>,
    emitted: &mut HashSet<String>,
) -> std::result::Result<Value, String> {
    let logical = writer
        .and_then(|w| w.get("logicalType"))
        .and_then(Value::as_str);
    let wtype = writer.and_then(|w| match w {
        Value::String(s) => Some(s.as_str()),
        Value::Object(o) => o.get("type").and_then(Value::as_str),
        _ => None,
    });
    // The writer's form, for the arms that keep it.
    let mut kept = || keep_writer(writer.expect("checked"), emitted);
    Ok(match target {
        DataType::Utf8 | DataType::LargeUtf8 => match (wtype, logical) {
            (Some("enum"), _) => kept(),
            (_, Some("uuid")) => kept(),
            (Some("bytes" | "fixed"), Some("decimal")) => kept(),
            _ => json!("string"),
        },
        DataType::Boolean => json!("boolean"),
        DataType::Int8 | DataType::Int16 | DataType::Int32 => json!("int"),
        DataType::Int64
        | DataType::UInt32
        | DataType::UInt64
        | DataType::UInt16
        | DataType::UInt8 => {
            json!("long")
        }
        DataType::Float32 => json!("float"),
        DataType::Float64 => match logical {
            Some("decimal") => kept(),
            _ => json!("double"),
        },
        DataType::Binary | DataType::LargeBinary => json!("bytes"),
        DataType::Date32 => json!({"type": "int", "logicalType": "date"}),
        // `.pg`'s DateTime is Arrow's Date64 (milliseconds since the epoch).
        DataType::Date64 => match logical {
            Some(l) if l.contains("timestamp") => kept(),
            _ => json!({"type": "long", "logicalType": "timestamp-millis"}),
        },
        DataType::Timestamp(unit, _) => match logical {
            Some(
                "timestamp-millis"
                | "timestamp-micros"
                | "timestamp-nanos"
                | "local-timestamp-millis"
                | "local-timestamp-micros"
                | "local-timestamp-nanos",
            ) => kept(),
            _ => json!({"type": "long", "logicalType": match unit {
                TimeUnit::Second | TimeUnit::Millisecond => "timestamp-millis",
                TimeUnit::Microsecond => "timestamp-micros",
                TimeUnit::Nanosecond => "timestamp-nanos",
            }}),
        },
        DataType::List(item) | DataType::LargeList(item) | DataType::FixedSizeList(item, _) => {
            list_reader_type(item.data_type(), writer, emitted)?
        }
        other => {
            return Err(format!(
                "a property of Arrow type {other} has no Avro form yet"
            ))
        }
    })
}

/// The writer's own named or logical form, kept whole; a named type the
/// reader schema already defines is referred to by its full name.
fn keep_writer(writer: &Value, emitted: &mut HashSet<String>) -> Value {
    let w = writer.clone();
    if let Some(name) = w.get("name").and_then(Value::as_str) {
        let full = match w.get("namespace").and_then(Value::as_str) {
            Some(ns) if !name.contains('.') => format!("{ns}.{name}"),
            _ => name.to_string(),
        };
        if !emitted.insert(full.clone()) {
            return json!(full);
        }
    }
    w
}

/// The Avro reader type of a list property: an array of its item's reader
/// type, in the writer's item form where it has one.
fn list_reader_type(
    item: &DataType,
    writer: Option<&Value>,
    emitted: &mut HashSet<String>,
) -> std::result::Result<Value, String> {
    let witems = writer.and_then(|w| w.get("items"));
    let (witems, _) = match witems {
        Some(i) => strip_null(i),
        None => (Value::Null, false),
    };
    let items = reader_type(item, (!witems.is_null()).then_some(&witems), emitted)?;
    Ok(json!({"type": "array", "items": items}))
}

/// A one-part key's writer schema as a record of one field named `field`,
/// when it is a bare type rather than a record: Avro encodes a record as
/// its fields in order, so a bare value's bytes read the same as that
/// record's. `None` for a record (or text that is not JSON).
pub(super) fn key_record(writer: &str, field: &str) -> Option<String> {
    let w: Value = serde_json::from_str(writer).ok()?;
    if w.get("type").and_then(Value::as_str) == Some("record") {
        return None;
    }
    let record = json!({"type": "record", "name": "graphsink_key",
        "fields": [{"name": field, "type": w}]});
    Some(record.to_string())
}

/// Nesting past this is not followed (a recursive writer, which
/// arrow-avro refuses anyway).
const MAX_DEPTH: usize = 64;

/// An array in the writer whose items take no bytes (`null`, a `fixed` of
/// size 0, a record of such fields). arrow-avro 58 reads, or skips, a
/// block item by item, so one such record with a block count of 2^62
/// holds the decoder in a loop for ever: the writer is refused by id.
fn endless_array(t: &Value, names: &Named, depth: usize) -> Option<String> {
    if depth > MAX_DEPTH {
        return None;
    }
    let inner = |t: &Value| endless_array(t, names, depth + 1);
    match t {
        Value::Array(branches) => branches.iter().find_map(inner),
        Value::Object(o) => match o.get("type") {
            Some(Value::String(k)) if k == "array" => {
                let items = o.get("items")?;
                if zero_size(items, names, depth + 1) {
                    return Some(format!(
                        "the writer has an array of {items}, whose items take no bytes: a block count alone could hold the decoder"
                    ));
                }
                inner(items)
            }
            Some(Value::String(k)) if k == "map" => inner(o.get("values")?),
            Some(Value::String(k)) if k == "record" => o
                .get("fields")
                .and_then(Value::as_array)?
                .iter()
                .find_map(|f| inner(f.get("type")?)),
            Some(other) if !other.is_string() => inner(other),
            _ => None,
        },
        // A named record's fields were walked where it was defined.
        _ => None,
    }
}

/// Whether a value of type `t` can take no bytes.
fn zero_size(t: &Value, names: &Named, depth: usize) -> bool {
    if depth > MAX_DEPTH {
        return false;
    }
    match names.resolve(t) {
        Value::String(s) => s == "null",
        Value::Object(o) => match o.get("type") {
            Some(Value::String(k)) if k == "fixed" => {
                o.get("size").and_then(Value::as_u64) == Some(0)
            }
            Some(Value::String(k)) if k == "record" => {
                o.get("fields").and_then(Value::as_array).is_none_or(|fs| {
                    fs.iter().all(|f| {
                        f.get("type")
                            .is_some_and(|ft| zero_size(ft, names, depth + 1))
                    })
                })
            }
            // Arrays end with a 0 byte, maps too, an enum or a union
            // writes an index.
            Some(Value::String(k)) if matches!(k.as_str(), "array" | "map" | "enum") => false,
            // {"type": "null"}, {"type": "SomeRecord"}, {"type": {...}}.
            Some(other) => zero_size(other, names, depth + 1),
            None => false,
        },
        _ => false,
    }
}

/// `["null", T]` (either order) → (T, true); anything else → (it, false).
fn strip_null(t: &Value) -> (Value, bool) {
    if let Value::Array(branches) = t {
        let rest: Vec<&Value> = branches
            .iter()
            .filter(|b| b.as_str() != Some("null"))
            .collect();
        if rest.len() == 1 && branches.len() == 2 {
            return (rest[0].clone(), true);
        }
    }
    (t.clone(), false)
}

/// Named types (records, enums, fixed) of a writer schema, by full name,
/// so a field that refers to one by name is read as its definition.
#[derive(Default)]
struct Named(HashMap<String, Value>);

impl Named {
    fn collect(&mut self, t: &Value, ns: Option<&str>) {
        match t {
            Value::Array(branches) => branches.iter().for_each(|b| self.collect(b, ns)),
            Value::Object(o) => {
                let ns = o.get("namespace").and_then(Value::as_str).or(ns);
                if let (Some(kind), Some(name)) = (
                    o.get("type").and_then(Value::as_str),
                    o.get("name").and_then(Value::as_str),
                ) {
                    if matches!(kind, "record" | "enum" | "fixed") {
                        let full = match ns {
                            Some(ns) if !name.contains('.') => format!("{ns}.{name}"),
                            _ => name.to_string(),
                        };
                        self.0.insert(name.to_string(), t.clone());
                        self.0.insert(full, t.clone());
                    }
                }
                if let Some(fields) = o.get("fields").and_then(Value::as_array) {
                    for f in fields {
                        if let Some(ft) = f.get("type") {
                            self.collect(ft, ns);
                        }
                    }
                }
                for k in ["items", "values", "type"] {
                    if let Some(inner) = o.get(k).filter(|v| !v.is_string()) {
                        self.collect(inner, ns);
                    }
                }
            }
            _ => {}
        }
    }

    /// A reference by name → its definition; anything else as is.
    fn resolve(&self, t: &Value) -> Value {
        match t {
            Value::String(s) => self.0.get(s).cloned().unwrap_or_else(|| t.clone()),
            _ => t.clone(),
        }
    }
}
