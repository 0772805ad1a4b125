//! Composite endpoints (an edge endpoint whose node type has a composite
//! `@key`) in the registry formats: an array of the key's parts, in Avro
//! and in Protobuf, names the row the JSON format's array names; a wrong
//! number of parts is one `missing_endpoint`.

use prost::Message as _;
use prost_reflect::{DynamicMessage, Value};

use super::codes;
use crate::decode::{Decoded, RecordDecoder, SourceRecord};
use crate::registry::{wire, SchemaType};
use crate::schema::GraphSchema;

const PG: &str = r#"
    node Person { id: String @key }
    node Pair { t: String  n: I64  @key(t, n) }
    edge In: Person -> Pair { w: I32? }
"#;

fn decoder(format: &str, schema_type: SchemaType, text: &str) -> RecordDecoder {
    let s = GraphSchema::parse(PG, "t.pg").unwrap();
    let m = super::mapping(&format!("topic = 't'\nedge = 'In'\nformat = '{format}'"));
    let mut d = RecordDecoder::new(&s, &m, 100, 1 << 20).unwrap();
    if format != "json" {
        d.learn(1, super::learned(schema_type, text));
    }
    d
}

fn rec(offset: i64, value: &[u8]) -> SourceRecord<'_> {
    super::raw(offset, None, Some(value))
}

/// The `dst` column: each row's endpoint as its node's canonical id.
fn dst(out: &Decoded) -> Vec<String> {
    super::col(out.upserts.as_ref().expect("rows"), "dst")
}

/// What the JSON format makes of the same endpoint.
fn json_dst() -> Vec<String> {
    let mut d = decoder("json", SchemaType::Json, "");
    let out = d
        .decode(&[rec(0, br#"{"src":"a","dst":["x", 7]}"#)])
        .unwrap();
    assert!(out.rejects.is_empty(), "{:?}", out.rejects);
    dst(&out)
}

fn avro_string(out: &mut Vec<u8>, s: &str) {
    wire::put_zigzag(out, s.len() as i64);
    out.extend_from_slice(s.as_bytes());
}

#[test]
fn an_avro_array_of_parts_is_a_composite_endpoint() {
    let writer = r#"{"type":"record","name":"In","fields":[{"name":"src","type":"string"},
        {"name":"dst","type":{"type":"array","items":"string"}}]}"#;
    let mut d = decoder("avro", SchemaType::Avro, writer);
    let value = |parts: &[&str]| {
        let mut b = Vec::new();
        avro_string(&mut b, "a");
        // One block of the parts, then the end of the array.
        wire::put_zigzag(&mut b, parts.len() as i64);
        for p in parts {
            avro_string(&mut b, p);
        }
        b.push(0);
        wire::framed(1, &b)
    };
    let (good, short) = (value(&["x", "7"]), value(&["x"]));
    let out = d.decode(&[rec(0, &good), rec(1, &short)]).unwrap();
    assert_eq!(codes(&out), [(1, "missing_endpoint")]);
    assert_eq!(dst(&out), json_dst());
}

#[test]
fn a_protobuf_repeated_field_of_parts_is_a_composite_endpoint() {
    const PROTO: &str =
        "syntax = \"proto3\";\npackage e;\nmessage In { string src = 1; repeated string dst = 2; }\n";
    let mut d = decoder("protobuf", SchemaType::Protobuf, PROTO);
    let pool = crate::decode::protobuf::compile_for_tests(PROTO);
    let value = |parts: &[&str]| {
        let mut m = DynamicMessage::new(pool.get_message_by_name("e.In").unwrap());
        m.set_field_by_name("src", Value::String("a".into()));
        m.set_field_by_name(
            "dst",
            Value::List(parts.iter().map(|p| Value::String(p.to_string())).collect()),
        );
        let mut payload = wire::encode_message_indexes(&[0]);
        payload.extend(m.encode_to_vec());
        wire::framed(1, &payload)
    };
    let (good, long) = (value(&["x", "7"]), value(&["x", "7", "z"]));
    let out = d.decode(&[rec(0, &good), rec(1, &long)]).unwrap();
    assert_eq!(codes(&out), [(1, "missing_endpoint")]);
    assert_eq!(dst(&out), json_dst());
}
