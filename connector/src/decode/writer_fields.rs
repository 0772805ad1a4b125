//! `[graph] evolve = "from_registry"`: the top-level fields of a writer
//! schema, each with the `.pg` type it would be declared as (none for a
//! type graphsink has no property for) and whether the writer lets it be
//! absent. Only such optional fields become properties: a required one
//! would be a destructive change (rows already committed lack it).

use serde_json::Value;

use crate::config::ValueFormatName;
use crate::registry::Schema;

/// One field of a writer schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WriterField {
    pub(crate) name: String,
    /// The `.pg` scalar type, if the field has one.
    pub(crate) pg_type: Option<&'static str>,
    /// Avro: a union with `null`; Protobuf: a field with presence;
    /// JSON Schema: not `required`, or a type that admits `null`.
    pub(crate) optional: bool,
}

/// The fields of `schema`, a writer schema of `format` (`message`: the
/// mapping's Protobuf message, else the file's first).
pub(crate) fn writer_fields(
    format: ValueFormatName,
    schema: &Schema,
    message: Option<&str>,
) -> Result<Vec<WriterField>, String> {
    match format {
        ValueFormatName::Json => Ok(vec![]),
        ValueFormatName::Avro => avro(schema),
        ValueFormatName::JsonSchema => json_schema(schema),
        ValueFormatName::Protobuf => super::protobuf::writer_fields(schema, message),
    }
}

fn parse(schema: &Schema) -> Result<Value, String> {
    serde_json::from_str(&schema.text).map_err(|e| format!("the schema is not JSON: {e}"))
}

fn avro(schema: &Schema) -> Result<Vec<WriterField>, String> {
    let v = parse(schema)?;
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

fn json_schema(schema: &Schema) -> Result<Vec<WriterField>, String> {
    let v = parse(schema)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::SchemaType;

    fn schema(t: SchemaType, text: &str) -> Schema {
        Schema {
            schema_type: t,
            text: text.into(),
            descriptor: None,
            references: vec![],
            imports: vec![],
        }
    }

    fn field(name: &str, pg_type: Option<&'static str>, optional: bool) -> WriterField {
        WriterField {
            name: name.into(),
            pg_type,
            optional,
        }
    }

    #[test]
    fn avro_fields_their_types_and_which_may_be_absent() {
        let s = schema(
            SchemaType::Avro,
            r#"{"type":"record","name":"P","fields":[
                {"name":"name","type":"string"},
                {"name":"nick","type":["null","string"],"default":null},
                {"name":"born","type":["null",{"type":"int","logicalType":"date"}]},
                {"name":"tags","type":["null",{"type":"array","items":"string"}]},
                {"name":"n","type":["null","long","string"]}]}"#,
        );
        assert_eq!(
            writer_fields(ValueFormatName::Avro, &s, None).unwrap(),
            [
                field("name", Some("String"), false),
                field("nick", Some("String"), true),
                field("born", Some("Date"), true),
                field("tags", None, true),
                field("n", None, true),
            ]
        );
    }

    #[test]
    fn json_schema_fields_are_optional_unless_required_and_not_null() {
        let s = schema(
            SchemaType::Json,
            r#"{"type":"object","required":["name","score"],"properties":{
                "name":{"type":"string"},
                "score":{"type":["number","null"]},
                "at":{"type":"string","format":"date-time"},
                "n":{"type":"integer"}}}"#,
        );
        let mut got = writer_fields(ValueFormatName::JsonSchema, &s, None).unwrap();
        got.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(
            got,
            [
                field("at", Some("DateTime"), true),
                field("n", Some("I64"), true),
                field("name", Some("String"), false),
                field("score", Some("F64"), true),
            ]
        );
    }

    #[test]
    fn protobuf_fields_with_presence_are_optional() {
        let s = schema(
            SchemaType::Protobuf,
            "syntax = \"proto3\";\nmessage P { string name = 1; optional string nick = 2; \
             optional int64 n = 3; repeated string tags = 4; optional uint32 u = 5; }",
        );
        assert_eq!(
            writer_fields(ValueFormatName::Protobuf, &s, None).unwrap(),
            [
                field("name", Some("String"), false),
                field("nick", Some("String"), true),
                field("n", Some("I64"), true),
                field("tags", None, false),
                field("u", Some("U32"), true),
            ]
        );
    }
}
