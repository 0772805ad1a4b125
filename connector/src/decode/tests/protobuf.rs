//! The Protobuf format on values encoded here with prost-reflect from a
//! schema compiled by protox (the e2e tests use Confluent's serializer).

use std::sync::Arc;

use prost::Message as _;
use prost_reflect::{DynamicMessage, ReflectMessage, Value};

use super::{col, ids};
use crate::decode::{RecordDecoder, SourceRecord};
use crate::registry::{wire, Schema, SchemaType};
use crate::schema::GraphSchema;

const PG: &str = r#"
    node Person { id: String @key  name: String  age: I64?  color: enum(RED, GREEN)?
                  seen: DateTime?  v: Vector(2)?  tags: [String]? }
"#;

const PROTO: &str = r#"
syntax = "proto3";
package gs.test;
import "google/protobuf/timestamp.proto";
enum Color { RED = 0; GREEN = 1; }
message Person {
  string id = 1;
  string name = 2;
  optional int64 age = 3;
  optional Color color = 4;
  google.protobuf.Timestamp seen = 5;
  repeated float v = 6;
  repeated string tags = 7;
}
message Other { string x = 1; }
"#;

fn schema() -> super::super::Learned {
    Ok(Arc::new(Schema {
        schema_type: SchemaType::Protobuf,
        text: PROTO.to_string(),
        descriptor: None,
        references: vec![],
        imports: vec![],
    }))
}

fn decoder() -> RecordDecoder {
    let s = GraphSchema::parse(PG, "t.pg").unwrap();
    let m = super::mapping("topic = 't'\nnode = 'Person'\nformat = 'protobuf'");
    let mut d = RecordDecoder::new(&s, &m, 100, 1 << 20).unwrap();
    d.learn(3, schema());
    d
}

/// A Person message, framed with id 3 and message index [0].
fn person(f: impl FnOnce(&mut DynamicMessage)) -> Vec<u8> {
    let pool = super::super::protobuf::compile_for_tests(PROTO);
    let desc = pool.get_message_by_name("gs.test.Person").unwrap();
    let mut m = DynamicMessage::new(desc);
    f(&mut m);
    let mut payload = wire::encode_message_indexes(&[0]);
    payload.extend(m.encode_to_vec());
    wire::framed(3, &payload)
}

fn rec(offset: i64, value: &[u8]) -> SourceRecord<'_> {
    SourceRecord {
        topic: "t",
        partition: 0,
        offset,
        timestamp: Some(1),
        key: None,
        value: Some(value),
        message: None,
    }
}

#[test]
fn messages_read_into_their_properties() {
    let mut d = decoder();
    let a = person(|m| {
        m.set_field_by_name("id", Value::String("a".into()));
        m.set_field_by_name("name", Value::String("Ann".into()));
        m.set_field_by_name("age", Value::I64(5_000_000_000));
        m.set_field_by_name("color", Value::EnumNumber(1));
        let ts = m.descriptor().get_field_by_name("seen").unwrap();
        let mut t = DynamicMessage::new(ts.kind().as_message().unwrap().clone());
        t.set_field_by_name("seconds", Value::I64(1_709_210_096));
        t.set_field_by_name("nanos", Value::I32(123_000_000));
        m.set_field_by_name("seen", Value::Message(t));
        m.set_field_by_name("v", Value::List(vec![Value::F32(1.5), Value::F32(-2.0)]));
        m.set_field_by_name("tags", Value::List(vec![Value::String("x".into())]));
    });
    // Only the required fields: optional ones are null, proto3's plain
    // repeated ones empty.
    let b = person(|m| {
        m.set_field_by_name("id", Value::String("b".into()));
        m.set_field_by_name("name", Value::String("Bo".into()));
    });
    let out = d.decode(&[rec(0, &a), rec(1, &b)]).unwrap();
    assert!(out.rejects.is_empty(), "{:?}", out.rejects);
    let rows = out.upserts.unwrap();
    assert_eq!(ids(&rows), ["a", "b"]);
    assert_eq!(col(&rows, "age"), ["5000000000", "null"]);
    assert_eq!(col(&rows, "color"), ["GREEN", "null"]);
    assert!(
        col(&rows, "seen")[0].starts_with("2024-02-29T12:34:56.123"),
        "{:?}",
        col(&rows, "seen")
    );
    assert_eq!(col(&rows, "tags"), ["[x]", "[]"]);
}

#[test]
fn bad_values_are_typed_rejects_and_the_rest_land() {
    let mut d = decoder();
    let good = person(|m| {
        m.set_field_by_name("id", Value::String("a".into()));
        m.set_field_by_name("name", Value::String("Ann".into()));
    });
    let mut garbage = wire::framed(3, &[0]);
    garbage.extend_from_slice(&[0x0a, 0xff, 0xff, 0xff, 0x0f]); // a string longer than the value
                                                                // Message index [1]: Other, which lacks the required name.
    let mut other = wire::framed(3, &wire::encode_message_indexes(&[1]));
    other.extend_from_slice(&[0x0a, 0x01, b'x']);
    let mut past = wire::framed(3, &wire::encode_message_indexes(&[7]));
    past.push(0);
    let short_vector = person(|m| {
        m.set_field_by_name("id", Value::String("c".into()));
        m.set_field_by_name("name", Value::String("Cy".into()));
        m.set_field_by_name("v", Value::List(vec![Value::F32(1.0)]));
    });
    let mut unknown = wire::framed(4, &[0]);
    unknown.push(0);
    d.learn(4, Err("/schemas/ids/4: error_code 40403".into()));
    let values = [
        good.clone(),
        garbage,
        other,
        past,
        short_vector,
        unknown,
        vec![0, 0],
        good,
    ];
    let records: Vec<SourceRecord<'_>> = values
        .iter()
        .enumerate()
        .map(|(i, v)| rec(i as i64, v))
        .collect();
    let out = d.decode(&records).unwrap();
    let codes: Vec<(i64, &str)> = out
        .rejects
        .iter()
        .map(|r| (r.offset.unwrap(), r.code.as_str()))
        .collect();
    assert_eq!(
        codes,
        [
            (1, "malformed_protobuf"),
            (2, "schema_mismatch"),
            (3, "schema_mismatch"),
            (4, "wrong_type"),
            (5, "unknown_schema_id"),
            (6, "bad_framing"),
        ]
    );
    assert!(
        out.rejects[1].message.contains("\"id\""),
        "{}",
        out.rejects[1].message
    );
    assert_eq!(ids(&out.upserts.unwrap()), ["a"]);
}
