//! `writer_fields` (`[graph] evolve = "from_registry"`), through the
//! registration in `decode/mod.rs`: each registry format's file reads its
//! writer schema's top-level fields.

use crate::config::ValueFormatName;
use crate::decode::{writer_fields, WriterField};
use crate::registry::{Schema, SchemaType};

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

#[test]
fn json_values_have_no_writer_fields() {
    let s = schema(
        SchemaType::Json,
        r#"{"properties":{"a":{"type":"string"}}}"#,
    );
    assert_eq!(writer_fields(ValueFormatName::Json, &s, None).unwrap(), []);
}
