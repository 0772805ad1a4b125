//! What graphsink reads of an Avro writer schema: the reader schema made
//! for it from the type's layout (`reader_for`, see `avro.rs`), a one-part
//! key's bare type as a record (`key_record`), and its top-level fields
//! for `[graph] evolve = "from_registry"` (`writer_fields`).

use std::collections::{HashMap, HashSet};

use arrow_schema::{DataType, TimeUnit};
use serde_json::{json, Map, Value};

use crate::registry::Schema;
use crate::rejects::RejectCode;

use super::super::format::{ValueSchema, WriterField};

/// The reader schema for one writer schema: a record of the type's value
/// fields, each in the Avro form that reads the writer's field (see
/// avro.rs's module doc), nullable (default null) where the property or the writer's
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
pub(in crate::decode) fn key_record(writer: &str, field: &str) -> Option<String> {
    let w: Value = serde_json::from_str(writer).ok()?;
    if w.get("type").and_then(Value::as_str) == Some("record") {
        return None;
    }
    let record = json!({"type": "record", "name": "graphsink_key",
        "fields": [{"name": field, "type": w}]});
    Some(record.to_string())
}

/// The top-level fields of a writer schema, each with the `.pg` type it
/// would be declared as; a union with `null` may be absent.
pub(super) fn writer_fields(
    schema: &Schema,
) -> std::result::Result<Vec<WriterField>, String> {
    let v: Value = serde_json::from_str(&schema.text)
        .map_err(|e| format!("the schema is not JSON: {e}"))?;
    let fields = v["fields"]
        .as_array()
        .ok_or("the Avro schema is not a record")?;
    Ok(fields
        .iter()
        .filter_map(|f| {
            let name = f["name"].as_str()?.to_string();
            let (optional, t) = match &f["type"] {
                Value::Array(branches) => {
                    let rest: Vec<&Value> = branches.iter().filter(|b| *b != "null").collect();
                    let t = (rest.len() == 1).then(|| rest[0]);
                    (rest.len() < branches.len(), t)
                }
                t => (false, Some(t)),
            };
            Some(WriterField {
                name,
                pg_type: t.and_then(avro_type),
                optional,
            })
        })
        .collect())
}

/// The `.pg` type of an Avro field type, if graphsink has one.
fn avro_type(t: &Value) -> Option<&'static str> {
    let (base, logical) = match t {
        Value::String(s) => (s.as_str(), None),
        Value::Object(o) => (
            o.get("type")?.as_str()?,
            o.get("logicalType").and_then(Value::as_str),
        ),
        _ => return None,
    };
    Some(match (base, logical) {
        ("int", Some("date")) => "Date",
        ("long", Some("timestamp-millis" | "timestamp-micros")) => "DateTime",
        (_, Some(_)) => return None,
        ("string", None) => "String",
        ("int", None) => "I32",
        ("long", None) => "I64",
        ("float", None) => "F32",
        ("double", None) => "F64",
        ("boolean", None) => "Bool",
        _ => return None,
    })
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
