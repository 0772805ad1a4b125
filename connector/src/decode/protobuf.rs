//! The Protobuf value format: Protobuf in the Confluent wire format, read
//! by reflection (prost-reflect) and written straight into Arrow columns.
//!
//! A schema id's descriptors come from the registry's serialized
//! `FileDescriptorProto` when it serves one, else from its `.proto` text
//! compiled by protox, with the subjects it imports (fetched by the
//! registry client, transitively) and Google's well-known types. The
//! message is the mapping's `message`, else the one the frame's message
//! indexes name. Each message is checked against the type once, when first
//! seen: a required property it lacks, a field kind the property cannot
//! take, or (under `unknown_fields = "reject"`) a field the type does not
//! declare refuses it, by id and message.
//!
//! Proto3 scalars without `optional` have no presence: an absent one reads
//! as its default (0, "", false), as every Protobuf reader sees it. A
//! field with presence (`optional`, a message, proto2) reads as null when
//! absent.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{
    new_null_array, Array, ArrayRef, BinaryArray, BooleanArray, Date32Array, Date64Array,
    Float32Array, Float64Array, Int32Array, Int64Array, ListArray, RecordBatch, StringArray,
    UInt32Array, UInt64Array,
};
use arrow::buffer::{NullBuffer, OffsetBuffer};
use arrow::compute::{cast_with_options, CastOptions};
use arrow_schema::{DataType, Field, FieldRef, SchemaRef};
use prost::Message as _;
use prost_reflect::{
    DescriptorPool, DynamicMessage, FieldDescriptor, FileDescriptor, Kind, MessageDescriptor, Value,
};

use crate::config::{Mapping, UnknownFields};
use crate::error::{Error, Result};
use crate::registry::{wire, Schema, SchemaType};
use crate::rejects::RejectCode;
use crate::schema::GraphType;

use super::format::{Learned, ValueFormat, ValueSchema, WriterField};
use super::schema_ids::{Refusal, SchemaIds};
use super::{bad, Fail, Step};

pub(super) struct ProtobufFormat {
    values: ValueSchema,
    decoded: SchemaRef,
    /// The mapping's `message`: the fully qualified message type.
    message: Option<String>,
    unknown_reject: bool,
    type_name: String,
    writers: SchemaIds<Writer>,
}

/// A schema id whose descriptors compiled.
struct Writer {
    file: FileDescriptor,
    /// By message index path: the message, and the plan to read it, or
    /// why it is refused.
    messages: HashMap<Vec<usize>, std::result::Result<Arc<Plan>, Refusal>>,
}

/// How one message becomes the value schema's columns: per column, the
/// message field that fills it (None: the message lacks it; null).
struct Plan {
    desc: MessageDescriptor,
    fields: Vec<Option<FieldDescriptor>>,
}

impl ProtobufFormat {
    /// The plan for a value's message: its id's writer, its indexes (or
    /// the configured message), checked once.
    fn plan_of<'v>(&mut self, value: &'v [u8]) -> Step<(Arc<Plan>, &'v [u8])> {
        let f = wire::frame(value).map_err(|e| Fail::Record(RejectCode::BadFraming, e.0))?;
        let (path, payload) = wire::message_indexes(f.rest)
            .map_err(|e| Fail::Record(RejectCode::MalformedProtobuf, e.0))?;
        let key = if self.message.is_some() {
            Vec::new()
        } else {
            path
        };
        let (values, message, unknown_reject) = (&self.values, &self.message, self.unknown_reject);
        let type_name = self.type_name.clone();
        let Writer { file, messages } = self.writers.ready_mut(f.schema_id)?;
        let plan = messages
            .entry(key.clone())
            .or_insert_with(|| {
                let desc = pick(file, message.as_deref(), &key)?;
                plan(desc, values, unknown_reject, &type_name).map(Arc::new)
            })
            .clone();
        match plan {
            Ok(p) => Ok((p, payload)),
            Err((code, m)) => bad(code, format!("schema id {}: {m}", f.schema_id)),
        }
    }
}

impl ValueFormat for ProtobufFormat {
    fn new(
        mapping: &Mapping,
        ty: &GraphType,
        values: ValueSchema,
        _batch_size: usize,
    ) -> Result<ProtobufFormat> {
        Ok(ProtobufFormat {
            decoded: values.decoded(),
            values,
            message: mapping.message.clone(),
            unknown_reject: mapping.unknown_fields == UnknownFields::Reject,
            type_name: ty.name.clone(),
            writers: SchemaIds::new(SchemaType::Protobuf, "protobuf"),
        })
    }

    fn writer_fields(
        schema: &Schema,
        message: Option<&str>,
    ) -> std::result::Result<Vec<WriterField>, String> {
        message_fields(schema, message)
    }

    fn screen(&self, value: &[u8]) -> Option<(RejectCode, String)> {
        match self.writers.screen(value) {
            Err(refused) => Some(refused),
            Ok((f, Some(Writer { file, .. }))) if f.rest.is_empty() => {
                // `refusal` asks with an empty payload: the message a
                // start-up check sees is the configured or the first.
                let desc = match pick(file, self.message.as_deref(), &[0]) {
                    Ok(d) => d,
                    Err(r) => return Some(r),
                };
                plan(desc, &self.values, self.unknown_reject, &self.type_name).err()
            }
            Ok(_) => None,
        }
    }

    fn unlearned(&self, value: &[u8]) -> Option<u32> {
        self.writers.unlearned(value)
    }

    fn learn(&mut self, id: u32, schema: Learned) {
        self.writers.learn(id, schema, |s| match descriptors(&s) {
            Ok(file) => Ok(Writer {
                file,
                messages: HashMap::new(),
            }),
            Err(m) => Err((RejectCode::SchemaMismatch, format!("schema id {id}: {m}"))),
        });
    }

    fn wants_descriptor(&self) -> bool {
        true
    }

    fn decode(&mut self, values: &[&[u8]]) -> Step<RecordBatch> {
        let ncols = self.values.fields.fields().len() + self.values.composite.len();
        let mut cells: Vec<Vec<Option<Value>>> = vec![Vec::with_capacity(values.len()); ncols];
        for v in values {
            let (plan, payload) = self.plan_of(v)?;
            let msg = DynamicMessage::decode(plan.desc.clone(), payload).map_err(|e| {
                Fail::Record(
                    RejectCode::MalformedProtobuf,
                    format!(
                        "the payload does not decode as {}: {e}",
                        plan.desc.full_name()
                    ),
                )
            })?;
            for (col, fd) in cells.iter_mut().zip(&plan.fields) {
                col.push(fd.as_ref().and_then(|fd| read(&msg, fd)));
            }
        }
        let mut columns = Vec::with_capacity(ncols);
        let targets: Vec<FieldRef> = self.decoded.fields().iter().cloned().collect();
        let composite_from = self.values.fields.fields().len();
        for (i, (col, f)) in cells.into_iter().zip(&targets).enumerate() {
            // A malformed composite endpoint is `missing_endpoint`, as in
            // every format (format.rs, `ValueSchema::composite`).
            let (built, code) = if i >= composite_from {
                let width = self.values.composite[i - composite_from].width;
                (composite_column(col, width), RejectCode::MissingEndpoint)
            } else {
                (column(col, f.data_type()), RejectCode::WrongType)
            };
            let built = built.map_err(|m| Fail::Record(code, format!("{}: {m}", f.name())))?;
            // A field with presence (`optional`, proto2) may be absent for
            // a required property: the record's reject, not a batch that
            // cannot be built.
            if !f.is_nullable() && built.null_count() > 0 {
                return bad(
                    RejectCode::MissingRequired,
                    format!("required property {} is absent", f.name()),
                );
            }
            columns.push(built);
        }
        RecordBatch::try_new(self.decoded.clone(), columns)
            .map_err(|e| Fail::System(Error::Bug(format!("protobuf rows: {e}"))))
    }

    fn classify(&self, _value: &[u8]) -> Option<(RejectCode, String)> {
        None
    }
}

/// The top-level fields of the message `message` (else the file's first)
/// of a writer schema (`writer_fields`): a field with presence (proto3
/// `optional`, a message) may be absent; a repeated one has no `.pg` type.
fn message_fields(
    s: &Schema,
    message: Option<&str>,
) -> std::result::Result<Vec<WriterField>, String> {
    let file = descriptors(s)?;
    let desc = pick(&file, message, &[0]).map_err(|(_, why)| why)?;
    Ok(desc
        .fields()
        .map(|fd| {
            let pg_type = match fd.kind() {
                _ if fd.is_list() || fd.is_map() => None,
                Kind::String => Some("String"),
                Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => Some("I32"),
                Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => Some("I64"),
                Kind::Uint32 | Kind::Fixed32 => Some("U32"),
                Kind::Uint64 | Kind::Fixed64 => Some("U64"),
                Kind::Float => Some("F32"),
                Kind::Double => Some("F64"),
                Kind::Bool => Some("Bool"),
                Kind::Message(m) if m.full_name() == "google.protobuf.Timestamp" => {
                    Some("DateTime")
                }
                _ => None,
            };
            WriterField {
                name: fd.name().to_string(),
                pg_type,
                optional: fd.supports_presence(),
            }
        })
        .collect())
}

/// The root file of a schema: its serialized descriptor when served (its
/// imports compiled first), else its text compiled with its imports.
fn descriptors(s: &Schema) -> std::result::Result<FileDescriptor, String> {
    let mut files: HashMap<String, String> = s
        .imports
        .iter()
        .map(|(name, dep)| (name.clone(), dep.text.clone()))
        .collect();
    const ROOT: &str = "graphsink_registry_root.proto";
    if let Some(bytes) = &s.descriptor {
        let proto = prost_types::FileDescriptorProto::decode(bytes.as_slice())
            .map_err(|e| format!("the serialized descriptor does not decode: {e}"))?;
        return from_descriptor(&files, proto);
    }
    // Some registries answer a schema registered in the serialized form
    // (as Confluent's Python serializer registers it) with that same
    // base64 text: take it as the descriptor it is.
    if let Some(proto) = serialized_text(&s.text) {
        return from_descriptor(&files, proto);
    }
    files.insert(ROOT.into(), s.text.clone());
    let pool = compile(&files, &[ROOT.to_string()])?;
    pool.get_file_by_name(ROOT)
        .ok_or_else(|| "the schema compiled to no file".into())
}

/// The file of a serialized descriptor, its imports compiled from `files`.
fn from_descriptor(
    files: &HashMap<String, String>,
    proto: prost_types::FileDescriptorProto,
) -> std::result::Result<FileDescriptor, String> {
    let mut pool = compile(files, &proto.dependency)?;
    let name = proto.name().to_string();
    pool.add_file_descriptor_proto(proto)
        .map_err(|e| format!("the serialized descriptor does not resolve: {e}"))?;
    pool.get_file_by_name(&name)
        .ok_or_else(|| "the serialized descriptor names no file".into())
}

/// A schema text that is a base64 `FileDescriptorProto` (`.proto` source
/// never is: it holds spaces and `;`).
fn serialized_text(text: &str) -> Option<prost_types::FileDescriptorProto> {
    use base64::Engine;
    let t = text.trim();
    if t.is_empty() || t.contains(|c: char| c.is_whitespace() || c == ';') {
        return None;
    }
    let bytes = base64::engine::general_purpose::STANDARD.decode(t).ok()?;
    prost_types::FileDescriptorProto::decode(bytes.as_slice()).ok()
}

/// Compiles `roots` from the in-memory `files` and Google's well-known types.
fn compile(
    files: &HashMap<String, String>,
    roots: &[String],
) -> std::result::Result<DescriptorPool, String> {
    struct Memory(HashMap<String, String>);
    impl protox::file::FileResolver for Memory {
        fn open_file(&self, name: &str) -> std::result::Result<protox::file::File, protox::Error> {
            match self.0.get(name) {
                Some(src) => protox::file::File::from_source(name, src),
                None => Err(protox::Error::file_not_found(name)),
            }
        }
    }
    let mut resolver = protox::file::ChainFileResolver::new();
    resolver.add(Memory(files.clone()));
    resolver.add(protox::file::GoogleFileResolver::new());
    let mut compiler = protox::Compiler::with_file_resolver(resolver);
    compiler.include_imports(true);
    for r in roots {
        compiler
            .open_file(r)
            .map_err(|e| format!("the .proto does not compile: {e}"))?;
    }
    Ok(compiler.descriptor_pool())
}

/// The message a value names: the configured one, else the index path
/// into the file's messages.
fn pick(
    file: &FileDescriptor,
    message: Option<&str>,
    path: &[usize],
) -> std::result::Result<MessageDescriptor, Refusal> {
    let mismatch = |m: String| (RejectCode::SchemaMismatch, m);
    if let Some(name) = message {
        return file.parent_pool().get_message_by_name(name).ok_or_else(|| {
            mismatch(format!(
                "the schema has no message {name:?} (mapping.message)"
            ))
        });
    }
    let mut it = path.iter();
    let first = *it.next().unwrap_or(&0);
    let mut desc = file.messages().nth(first).ok_or_else(|| {
        mismatch(format!(
            "message index {first} is past the schema's messages"
        ))
    })?;
    for &i in it {
        let child = desc.child_messages().nth(i);
        desc = child.ok_or_else(|| {
            mismatch(format!(
                "nested message index {i} is past {}'s",
                desc.full_name()
            ))
        })?;
    }
    Ok(desc)
}

/// Checks a message against the value schema and maps each column to its
/// field.
fn plan(
    desc: MessageDescriptor,
    values: &ValueSchema,
    unknown_reject: bool,
    type_name: &str,
) -> std::result::Result<Plan, Refusal> {
    let mismatch = |m: String| (RejectCode::SchemaMismatch, m);
    let mut fields = Vec::new();
    for f in values.fields.fields() {
        match desc.get_field_by_name(f.name()) {
            None if f.is_nullable() => fields.push(None),
            None => {
                return Err(mismatch(format!(
                    "message {} has no field {:?}, which {type_name} requires",
                    desc.full_name(),
                    f.name()
                )))
            }
            Some(fd) => {
                if !takes(&fd, f.data_type()) {
                    return Err(mismatch(format!(
                        "field {} of {} is {}{:?}, which property {} ({}) cannot take",
                        f.name(),
                        desc.full_name(),
                        if fd.is_list() { "repeated " } else { "" },
                        fd.kind(),
                        f.name(),
                        f.data_type()
                    )));
                }
                fields.push(Some(fd));
            }
        }
    }
    for e in &values.composite {
        match desc.get_field_by_name(&e.field) {
            Some(fd) if fd.is_list() => fields.push(Some(fd)),
            Some(_) => {
                return Err(mismatch(format!(
                    "endpoint field {:?} must be repeated (a composite key)",
                    e.field
                )))
            }
            None => fields.push(None),
        }
    }
    if unknown_reject {
        let declared = |n: &str| {
            values.fields.field_with_name(n).is_ok()
                || values.composite.iter().any(|e| e.field == n)
        };
        if let Some(extra) = desc.fields().find(|fd| !declared(fd.name())) {
            return Err((
                RejectCode::UnknownField,
                format!(
                    "message {} has field {:?}, which {type_name} does not declare (unknown_fields = \"reject\")",
                    desc.full_name(),
                    extra.name()
                ),
            ));
        }
    }
    Ok(Plan { desc, fields })
}

/// Whether a field of this kind can fill a column of type `t`.
fn takes(fd: &FieldDescriptor, t: &DataType) -> bool {
    if fd.is_map() {
        return false;
    }
    match t {
        DataType::List(item) | DataType::LargeList(item) | DataType::FixedSizeList(item, _) => {
            fd.is_list() && kind_takes(&fd.kind(), item.data_type())
        }
        _ => !fd.is_list() && kind_takes(&fd.kind(), t),
    }
}

fn kind_takes(k: &Kind, t: &DataType) -> bool {
    use Kind::*;
    let int = matches!(
        k,
        Int32 | Sint32 | Sfixed32 | Int64 | Sint64 | Sfixed64 | Uint32 | Fixed32 | Uint64 | Fixed64
    );
    match t {
        DataType::Utf8 | DataType::LargeUtf8 => matches!(k, String | Enum(_)),
        DataType::Binary | DataType::LargeBinary => matches!(k, Bytes | String),
        DataType::Boolean => matches!(k, Bool),
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => int,
        DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64 => int,
        DataType::Float32 | DataType::Float64 => int || matches!(k, Float | Double),
        DataType::Date32 => {
            matches!(k, Int32 | Sint32 | Sfixed32)
                || matches!(k, Message(m) if m.full_name() == "google.type.Date")
        }
        DataType::Date64 | DataType::Timestamp(..) => {
            matches!(k, Message(m) if m.full_name() == "google.protobuf.Timestamp")
        }
        _ => false,
    }
}

/// A field's value in a message: None when absent and the field has
/// presence; enums as their names.
fn read(msg: &DynamicMessage, fd: &FieldDescriptor) -> Option<Value> {
    if fd.supports_presence() && !msg.has_field(fd) {
        return None;
    }
    let v = msg.get_field(fd).into_owned();
    Some(match fd.kind() {
        Kind::Enum(e) => {
            let name = |n: i32| {
                e.get_value(n)
                    .map(|ev| ev.name().to_string())
                    .unwrap_or_else(|| n.to_string())
            };
            match v {
                Value::EnumNumber(n) => Value::String(name(n)),
                Value::List(items) => Value::List(
                    items
                        .into_iter()
                        .map(|i| match i {
                            Value::EnumNumber(n) => Value::String(name(n)),
                            other => other,
                        })
                        .collect(),
                ),
                other => other,
            }
        }
        _ => v,
    })
}

fn int_of(v: &Value) -> Option<i128> {
    match v {
        Value::I32(x) => Some(i128::from(*x)),
        Value::I64(x) => Some(i128::from(*x)),
        Value::U32(x) => Some(i128::from(*x)),
        Value::U64(x) => Some(i128::from(*x)),
        _ => None,
    }
}

fn float_of(v: &Value) -> Option<f64> {
    match v {
        Value::F32(x) => Some(f64::from(*x)),
        Value::F64(x) => Some(*x),
        other => int_of(other).map(|i| i as f64),
    }
}

/// Milliseconds since the epoch of a google.protobuf.Timestamp.
fn timestamp_ms(v: &Value) -> Option<i64> {
    let m = v.as_message()?;
    let secs = m.get_field_by_name("seconds")?.as_i64()?;
    let nanos = m.get_field_by_name("nanos")?.as_i32()?;
    secs.checked_mul(1000)?
        .checked_add(i64::from(nanos) / 1_000_000)
}

/// Days since the epoch of an int32 or a google.type.Date.
fn days(v: &Value) -> Option<i32> {
    if let Value::I32(d) = v {
        return Some(*d);
    }
    let m = v.as_message()?;
    let part = |n: &str| m.get_field_by_name(n).and_then(|x| x.as_i32());
    let date =
        chrono::NaiveDate::from_ymd_opt(part("year")?, part("month")? as u32, part("day")? as u32)?;
    let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1)?;
    i32::try_from((date - epoch).num_days()).ok()
}

/// Each value through `f`, nulls kept.
fn each<T>(
    vals: &[Option<Value>],
    f: impl Fn(&Value) -> Option<T>,
    what: &str,
) -> std::result::Result<Vec<Option<T>>, String> {
    vals.iter()
        .map(|v| match v {
            None => Ok(None),
            Some(x) => f(x)
                .map(Some)
                .ok_or_else(|| format!("expected {what}, got {x:?}")),
        })
        .collect()
}

/// One column of values as Arrow type `t`; a value that does not fit
/// (out of range, another kind) fails the batch.
fn column(vals: Vec<Option<Value>>, t: &DataType) -> std::result::Result<ArrayRef, String> {
    let n = vals.len();
    if vals.iter().all(Option::is_none) {
        return Ok(new_null_array(t, n));
    }
    // An integer of any kind, checked into the property's type.
    macro_rules! ints {
        ($arr:ty, $native:ty) => {{
            let wide = each(&vals, int_of, "an integer")?;
            let out: std::result::Result<Vec<Option<$native>>, String> = wide
                .into_iter()
                .map(|i| {
                    i.map(|i| <$native>::try_from(i).map_err(|_| format!("{i} does not fit {t}")))
                        .transpose()
                })
                .collect();
            Ok(Arc::new(<$arr>::from(out?)) as ArrayRef)
        }};
    }
    let text = |v: &Value| match v {
        Value::String(s) => Some(s.clone()),
        _ => None,
    };
    match t {
        DataType::Utf8 => Ok(Arc::new(StringArray::from(each(&vals, text, "a string")?))),
        // `.pg`'s Blob is LargeBinary.
        DataType::Binary | DataType::LargeBinary => {
            let bytes = |v: &Value| match v {
                Value::Bytes(b) => Some(b.to_vec()),
                Value::String(s) => Some(s.clone().into_bytes()),
                _ => None,
            };
            let b: ArrayRef = Arc::new(BinaryArray::from_iter(each(&vals, bytes, "bytes")?));
            arrow::compute::cast(&b, t).map_err(|e| e.to_string())
        }
        DataType::Boolean => Ok(Arc::new(BooleanArray::from(each(
            &vals,
            Value::as_bool,
            "a bool",
        )?))),
        DataType::Int32 => ints!(Int32Array, i32),
        DataType::Int64 => ints!(Int64Array, i64),
        DataType::UInt32 => ints!(UInt32Array, u32),
        DataType::UInt64 => ints!(UInt64Array, u64),
        DataType::Float64 => Ok(Arc::new(Float64Array::from(each(
            &vals, float_of, "a number",
        )?))),
        DataType::Float32 => {
            let f = |v: &Value| float_of(v).map(|x| x as f32);
            Ok(Arc::new(Float32Array::from(each(&vals, f, "a number")?)))
        }
        DataType::Date32 => Ok(Arc::new(Date32Array::from(each(&vals, days, "a date")?))),
        DataType::Date64 => Ok(Arc::new(Date64Array::from(each(
            &vals,
            timestamp_ms,
            "a timestamp",
        )?))),
        DataType::List(item) | DataType::FixedSizeList(item, _) => list_column(vals, t, item),
        other => Err(format!(
            "a property of Arrow type {other} has no Protobuf form yet"
        )),
    }
}

/// A repeated field's values as list column `t` of `item`s (a Vector(n) is
/// a list cast to its fixed size).
fn list_column(
    vals: Vec<Option<Value>>,
    t: &DataType,
    item: &FieldRef,
) -> std::result::Result<ArrayRef, String> {
    let n = vals.len();
    // A repeated field cannot tell absent from empty: for a
    // Vector(n), empty reads as absent (null), not as a 0-vector.
    let vals: Vec<Option<Value>> = if matches!(t, DataType::FixedSizeList(..)) {
        vals.into_iter()
            .map(|v| v.filter(|x| !matches!(x, Value::List(items) if items.is_empty())))
            .collect()
    } else {
        vals
    };
    let mut offsets = vec![0i32];
    let mut valid = Vec::with_capacity(n);
    let mut flat = Vec::new();
    for v in vals {
        match v {
            None => valid.push(false),
            Some(Value::List(items)) => {
                flat.extend(items.into_iter().map(Some));
                valid.push(true);
            }
            Some(other) => return Err(format!("expected a repeated field, got {other:?}")),
        }
        offsets.push(i32::try_from(flat.len()).map_err(|_| "too many items")?);
    }
    let child = column(flat, item.data_type())?;
    let field = Arc::new(Field::new("item", item.data_type().clone(), true));
    let list: ArrayRef = Arc::new(
        ListArray::try_new(
            field,
            OffsetBuffer::new(offsets.into()),
            child,
            Some(NullBuffer::from(valid)),
        )
        .map_err(|e| e.to_string())?,
    );
    if list.data_type() == t {
        return Ok(list);
    }
    // A Vector(n): exactly n items, or the record fails.
    let opts = CastOptions {
        safe: false,
        ..Default::default()
    };
    cast_with_options(&list, t, &opts).map_err(|e| e.to_string())
}

/// A composite endpoint (a repeated field of the key's parts) as its
/// canonical text, the JSON array of each part's text.
fn composite_column(
    vals: Vec<Option<Value>>,
    width: usize,
) -> std::result::Result<ArrayRef, String> {
    let mut out = Vec::with_capacity(vals.len());
    for v in vals {
        let Some(Value::List(items)) = v else {
            out.push(None);
            continue;
        };
        if items.len() != width {
            return Err(format!("a composite endpoint key needs {width} parts"));
        }
        let parts: std::result::Result<Vec<String>, String> = items
            .iter()
            .map(|i| match i {
                Value::String(s) => Ok(s.clone()),
                Value::Bool(b) => Ok(b.to_string()),
                other => int_of(other)
                    .map(|x| x.to_string())
                    .ok_or_else(|| format!("key part {other:?} is not a scalar")),
            })
            .collect();
        out.push(Some(serde_json::to_string(&parts?).expect("strings")));
    }
    Ok(Arc::new(StringArray::from(out)))
}

/// A pool compiled from one `.proto` text (the tests encode with it).
#[cfg(test)]
pub(super) fn compile_for_tests(proto: &str) -> DescriptorPool {
    let files = HashMap::from([("t.proto".to_string(), proto.to_string())]);
    compile(&files, &["t.proto".to_string()]).expect("compiles")
}
