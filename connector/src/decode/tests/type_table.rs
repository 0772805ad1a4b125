//! docs/formats.md's type table, row by row, in both directions: for each
//! `.pg` type, every Avro and Protobuf writer type the table says it takes
//! decodes to it (and a value out of its range is the table's reject); for
//! each writer type, every `.pg` type it maps to is a case, and a pairing
//! the table does not list is refused by id (`schema_mismatch`). Values are
//! encoded by hand (Avro's binary encoding, Protobuf's wire format), one
//! writer schema per case.

use std::sync::Arc;

use arrow::array::Array;
use arrow::util::display::array_value_to_string;

use crate::decode::{Decoded, RecordDecoder, SourceRecord};
use crate::registry::{wire, Schema, SchemaType};
use crate::schema::GraphSchema;

/// One property per `.pg` type, every one optional, so a case sets one
/// (the JSON fit table, `decode/json/fit/tests.rs`, reads it too).
pub(in crate::decode) const PG: &str = r#"
    node T { k: String @key
             s: String?  blob: Blob?  b: Bool?  i: I32?  l: I64?  u: U32?  ul: U64?
             f: F32?  d: F64?  day: Date?  at: DateTime?  tags: [String]?  nums: [I64]?
             v: Vector(2)?  e: enum(red, green)? }
"#;

/// What a case must give: the property's value as Arrow displays it (a
/// prefix, for timestamps), or the one reject's code.
#[derive(Debug, Clone, Copy)]
enum Want {
    Row(&'static str),
    /// A row, the property null.
    Null,
    Reject(&'static str),
}
use Want::{Null, Reject, Row};

const MISMATCH: Want = Reject("schema_mismatch");

fn decoder(format: &str) -> RecordDecoder {
    let s = GraphSchema::parse(PG, "t.pg").unwrap();
    let m = super::mapping(&format!("topic = 't'\nnode = 'T'\nformat = '{format}'"));
    RecordDecoder::new(&s, &m, 10, 1 << 20).unwrap()
}

fn rec(value: &[u8]) -> SourceRecord<'_> {
    SourceRecord {
        topic: "t",
        partition: 0,
        offset: 0,
        timestamp: Some(1),
        key: None,
        value: Some(value),
        message: None,
    }
}

/// Whether `out` is what `want` says for property `prop`.
fn check(out: &Decoded, prop: &str, want: Want) -> Result<(), String> {
    let codes: Vec<&str> = out.rejects.iter().map(|r| r.code.as_str()).collect();
    let got = out.upserts.as_ref().and_then(|b| {
        let c = b.column_by_name(prop)?;
        (b.num_rows() == 1).then(|| {
            c.is_valid(0)
                .then(|| array_value_to_string(c, 0).unwrap_or_default())
        })
    });
    match want {
        Row(v)
            if codes.is_empty()
                && got
                    .as_ref()
                    .is_some_and(|g| g.as_deref().is_some_and(|g| g.starts_with(v))) =>
        {
            Ok(())
        }
        Null if codes.is_empty() && got == Some(None) => Ok(()),
        Reject(code) if codes == [code] && got.is_none() => Ok(()),
        _ => Err(format!(
            "want {want:?}, got row {got:?}, rejects {:?}",
            out.rejects
                .iter()
                .map(|r| format!("{}: {}", r.code.as_str(), r.message))
                .collect::<Vec<_>>()
        )),
    }
}

// Avro's binary encoding.

fn long(v: i64) -> Vec<u8> {
    let mut out = Vec::new();
    wire::put_zigzag(&mut out, v);
    out
}

fn avro_str(s: &[u8]) -> Vec<u8> {
    let mut out = long(s.len() as i64);
    out.extend_from_slice(s);
    out
}

fn avro_array(items: &[Vec<u8>]) -> Vec<u8> {
    let mut out = long(items.len() as i64);
    items.iter().for_each(|i| out.extend_from_slice(i));
    out.push(0);
    out
}

const UUID: &str = "5f0c7a3e-8d6b-4b8e-9a57-1c2d3e4f5a6b";
/// 12.30 as a decimal of scale 2: the unscaled 1230, big-endian.
const DECIMAL: [u8; 2] = [0x04, 0xce];
/// 2024-02-29 in days, and 2024-02-29T12:34:56.123Z in ms, µs, ns.
const DAY: i64 = 19_782;
const MS: i64 = 1_709_210_096_123;
const AT: &str = "2024-02-29T12:34:56.123";

fn uuid_bytes() -> Vec<u8> {
    uuid::Uuid::parse_str(UUID).unwrap().as_bytes().to_vec()
}

/// Each Avro case: the property, the writer's field type, the field's
/// encoded value, and what the table says comes of it.
fn avro_cases() -> Vec<(&'static str, String, Vec<u8>, Want)> {
    let t = |s: &str| s.to_string();
    let f32b = |x: f32| x.to_le_bytes().to_vec();
    let f64b = |x: f64| x.to_le_bytes().to_vec();
    let color = t(r#"{"type":"enum","name":"C","symbols":["red","green","blue"]}"#);
    let dec_bytes = t(r#"{"type":"bytes","logicalType":"decimal","precision":4,"scale":2}"#);
    let dec_fixed = t(
        r#"{"type":"fixed","name":"D","size":2,"logicalType":"decimal","precision":4,"scale":2}"#,
    );
    let ts = |unit: &str| format!(r#"{{"type":"long","logicalType":"{unit}"}}"#);
    let arr = |items: &str| format!(r#"{{"type":"array","items":{items}}}"#);
    vec![
        // String ← string, bytes, enum, uuid (string, fixed), decimal.
        ("s", t("\"string\""), avro_str(b"abc"), Row("abc")),
        ("s", t("\"bytes\""), avro_str(b"abc"), Row("abc")),
        ("s", color.clone(), long(1), Row("green")),
        (
            "s",
            t(r#"{"type":"string","logicalType":"uuid"}"#),
            avro_str(UUID.as_bytes()),
            Row(UUID),
        ),
        (
            "s",
            t(r#"{"type":"fixed","name":"U","size":16,"logicalType":"uuid"}"#),
            uuid_bytes(),
            Row(UUID),
        ),
        ("s", dec_bytes.clone(), avro_str(&DECIMAL), Row("12.30")),
        ("s", dec_fixed.clone(), DECIMAL.to_vec(), Row("12.30")),
        ("s", t("\"int\""), long(1), MISMATCH),
        (
            "s",
            t(r#"{"type":"record","name":"R","fields":[{"name":"x","type":"int"}]}"#),
            long(1),
            MISMATCH,
        ),
        // Blob ← bytes, string.
        ("blob", t("\"bytes\""), avro_str(b"\x01\x02"), Row("0102")),
        ("blob", t("\"string\""), avro_str(b"ab"), Row("6162")),
        ("blob", t("\"int\""), long(1), MISMATCH),
        // Bool ← boolean.
        ("b", t("\"boolean\""), vec![1], Row("true")),
        ("b", t("\"int\""), long(1), MISMATCH),
        // I32 ← int only.
        ("i", t("\"int\""), long(-5), Row("-5")),
        ("i", t("\"long\""), long(-5), MISMATCH),
        // I64 ← long, int.
        ("l", t("\"long\""), long(5_000_000_000), Row("5000000000")),
        ("l", t("\"int\""), long(-5), Row("-5")),
        ("l", t("\"float\""), f32b(1.0), MISMATCH),
        // U32 ← long, int, checked.
        ("u", t("\"long\""), long(4_294_967_295), Row("4294967295")),
        ("u", t("\"int\""), long(7), Row("7")),
        ("u", t("\"long\""), long(-1), Reject("wrong_type")),
        ("u", t("\"long\""), long(1 << 32), Reject("wrong_type")),
        ("u", t("\"int\""), long(-1), Reject("wrong_type")),
        ("u", t("\"string\""), avro_str(b"7"), MISMATCH),
        // U64 ← long, int, checked.
        (
            "ul",
            t("\"long\""),
            long(i64::MAX),
            Row("9223372036854775807"),
        ),
        ("ul", t("\"int\""), long(7), Row("7")),
        ("ul", t("\"long\""), long(-1), Reject("wrong_type")),
        // F32 ← float, int, long.
        ("f", t("\"float\""), f32b(1.5), Row("1.5")),
        ("f", t("\"int\""), long(3), Row("3")),
        ("f", t("\"long\""), long(3), Row("3")),
        ("f", t("\"double\""), f64b(1.5), MISMATCH),
        // F64 ← double, float, int, long, decimal.
        ("d", t("\"double\""), f64b(0.25), Row("0.25")),
        ("d", t("\"float\""), f32b(1.5), Row("1.5")),
        ("d", t("\"int\""), long(3), Row("3")),
        ("d", t("\"long\""), long(3), Row("3")),
        ("d", dec_bytes, avro_str(&DECIMAL), Row("12.3")),
        ("d", dec_fixed, DECIMAL.to_vec(), Row("12.3")),
        ("d", t("\"string\""), avro_str(b"1"), MISMATCH),
        // Date ← int with logicalType date.
        (
            "day",
            t(r#"{"type":"int","logicalType":"date"}"#),
            long(DAY),
            Row("2024-02-29"),
        ),
        ("day", t("\"string\""), avro_str(b"2024-02-29"), MISMATCH),
        // Schema resolution matches the underlying type: a plain int is
        // days, a plain long milliseconds.
        ("day", t("\"int\""), long(DAY), Row("2024-02-29")),
        ("at", t("\"long\""), long(MS), Row(AT)),
        // DateTime ← long timestamp-{millis,micros,nanos}, local- forms.
        ("at", ts("timestamp-millis"), long(MS), Row(AT)),
        ("at", ts("timestamp-micros"), long(MS * 1000 + 456), Row(AT)),
        (
            "at",
            ts("timestamp-nanos"),
            long(MS * 1_000_000 + 456_789),
            Row(AT),
        ),
        ("at", ts("local-timestamp-millis"), long(MS), Row(AT)),
        ("at", ts("local-timestamp-micros"), long(MS * 1000), Row(AT)),
        (
            "at",
            ts("local-timestamp-nanos"),
            long(MS * 1_000_000),
            Row(AT),
        ),
        ("at", t("\"string\""), avro_str(b"2024"), MISMATCH),
        // [T] ← array of T's forms.
        (
            "tags",
            arr("\"string\""),
            avro_array(&[avro_str(b"a"), avro_str(b"b")]),
            Row("[a, b]"),
        ),
        (
            "nums",
            arr("\"int\""),
            avro_array(&[long(1), long(-2)]),
            Row("[1, -2]"),
        ),
        (
            "nums",
            arr("\"long\""),
            avro_array(&[long(1 << 40)]),
            Row("[1099511627776]"),
        ),
        ("tags", t("\"string\""), avro_str(b"a"), MISMATCH),
        (
            "nums",
            arr("\"string\""),
            avro_array(&[avro_str(b"1")]),
            MISMATCH,
        ),
        // Vector(n) ← array of float, int, long; exactly n items.
        (
            "v",
            arr("\"float\""),
            avro_array(&[f32b(1.5), f32b(-2.0)]),
            Row("[1.5, -2.0]"),
        ),
        (
            "v",
            arr("\"int\""),
            avro_array(&[long(1), long(2)]),
            Row("[1.0, 2.0]"),
        ),
        (
            "v",
            arr("\"long\""),
            avro_array(&[long(1), long(2)]),
            Row("[1.0, 2.0]"),
        ),
        (
            "v",
            arr("\"float\""),
            avro_array(&[f32b(1.0)]),
            Reject("wrong_type"),
        ),
        (
            "v",
            arr("\"string\""),
            avro_array(&[avro_str(b"1")]),
            MISMATCH,
        ),
        // enum(a, b) ← enum or string; a symbol outside the .pg enum is `enum`.
        ("e", color.clone(), long(0), Row("red")),
        ("e", t("\"string\""), avro_str(b"green"), Row("green")),
        ("e", color, long(2), Reject("enum")),
        ("e", t("\"string\""), avro_str(b"blue"), Reject("enum")),
        ("e", t("\"int\""), long(0), MISMATCH),
        // Any property as a nullable union, null first or second.
        ("i", t(r#"["null","int"]"#), vec![0], Null),
        (
            "i",
            t(r#"["int","null"]"#),
            [&[0u8][..], &long(9)].concat(),
            Row("9"),
        ),
    ]
}

#[test]
fn every_avro_row_of_the_type_table() {
    let mut wrong = Vec::new();
    let mut d = decoder("avro");
    for (n, (prop, wtype, value, want)) in avro_cases().into_iter().enumerate() {
        let id = 100 + n as u32;
        let writer = format!(
            r#"{{"type":"record","name":"W","fields":[{{"name":"k","type":"string"}},{{"name":"{prop}","type":{wtype}}}]}}"#
        );
        d.learn(
            id,
            Ok(Arc::new(Schema {
                schema_type: SchemaType::Avro,
                text: writer,
                descriptor: None,
                references: vec![],
                imports: vec![],
            })),
        );
        let mut payload = avro_str(format!("k{n}").as_bytes());
        payload.extend(value);
        let v = wire::framed(id, &payload);
        let out = d.decode(&[rec(&v)]).expect("decode never fails the poll");
        if let Err(e) = check(&out, prop, want) {
            wrong.push(format!("{prop} ← {wtype}: {e}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

// Protobuf's wire format.

fn varint(out: &mut Vec<u8>, mut u: u64) {
    while u >= 0x80 {
        out.push((u as u8) | 0x80);
        u >>= 7;
    }
    out.push(u as u8);
}

/// Field 2 (every case's property) with wire type `wt` and `body` after
/// the tag.
fn f2(wt: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![2 << 3 | wt];
    out.extend_from_slice(body);
    out
}

fn pv(v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    varint(&mut out, v);
    out
}

/// Length-delimited field 2.
fn pld(body: &[u8]) -> Vec<u8> {
    let mut b = pv(body.len() as u64);
    b.extend_from_slice(body);
    f2(2, &b)
}

const GOOGLE_DATE: &str = r#"syntax = "proto3";
package google.type;
message Date { int32 year = 1; int32 month = 2; int32 day = 3; }
"#;

/// Each Protobuf case: the property, its field's declaration in message W
/// (field number 2), the field's encoded bytes, what the table says.
fn protobuf_cases() -> Vec<(&'static str, &'static str, Vec<u8>, Want)> {
    let int = |v: i64| f2(0, &pv(v as u64));
    let zz = |v: i64| f2(0, &long(v));
    let fixed32 = |v: u32| f2(5, &v.to_le_bytes());
    let fixed64 = |v: u64| f2(1, &v.to_le_bytes());
    let float = |x: f32| f2(5, &x.to_le_bytes());
    let double = |x: f64| f2(1, &x.to_le_bytes());
    let floats = |xs: &[f32]| pld(&xs.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<_>>());
    let packed = |xs: &[u64]| {
        let mut b = Vec::new();
        xs.iter().for_each(|&x| varint(&mut b, x));
        pld(&b)
    };
    // A Timestamp (seconds 1, nanos 2) or a google.type.Date (1, 2, 3).
    let ts = {
        let mut b = vec![0x08];
        varint(&mut b, (MS / 1000) as u64);
        b.push(0x10);
        varint(&mut b, 123_000_000);
        pld(&b)
    };
    let date = pld(&[0x08, 0xe8, 0x0f, 0x10, 2, 0x18, 29]);
    vec![
        // String ← string, an enum (its value's name).
        ("s", "optional string s", pld(b"abc"), Row("abc")),
        ("s", "optional Color s", int(1), Row("green")),
        ("s", "optional bytes s", pld(b"abc"), MISMATCH),
        ("s", "optional int32 s", int(1), MISMATCH),
        ("s", "Sub s", pld(&[]), MISMATCH),
        // Blob ← bytes, string.
        ("blob", "optional bytes blob", pld(b"\x01\x02"), Row("0102")),
        ("blob", "optional string blob", pld(b"ab"), Row("6162")),
        ("blob", "optional int32 blob", int(1), MISMATCH),
        // Bool ← bool.
        ("b", "optional bool b", int(1), Row("true")),
        ("b", "optional int32 b", int(1), MISMATCH),
        // The integer types ← the ten integer kinds, checked.
        ("i", "optional int32 i", int(-5), Row("-5")),
        ("i", "optional sint32 i", zz(-5), Row("-5")),
        ("i", "optional sfixed32 i", fixed32(-5i32 as u32), Row("-5")),
        ("i", "optional int64 i", int(-5), Row("-5")),
        ("i", "optional sint64 i", zz(-5), Row("-5")),
        ("i", "optional sfixed64 i", fixed64(-5i64 as u64), Row("-5")),
        ("i", "optional uint32 i", int(5), Row("5")),
        ("i", "optional fixed32 i", fixed32(5), Row("5")),
        ("i", "optional uint64 i", int(5), Row("5")),
        ("i", "optional fixed64 i", fixed64(5), Row("5")),
        ("i", "optional int64 i", int(1 << 31), Reject("wrong_type")),
        ("i", "optional uint32 i", int(1 << 31), Reject("wrong_type")),
        ("i", "optional float i", float(1.0), MISMATCH),
        ("i", "optional string i", pld(b"1"), MISMATCH),
        (
            "l",
            "optional int64 l",
            int(i64::MIN),
            Row("-9223372036854775808"),
        ),
        ("l", "optional uint64 l", int(-1), Reject("wrong_type")),
        (
            "u",
            "optional uint32 u",
            int(u32::MAX.into()),
            Row("4294967295"),
        ),
        ("u", "optional int32 u", int(-1), Reject("wrong_type")),
        ("u", "optional int64 u", int(1 << 32), Reject("wrong_type")),
        (
            "ul",
            "optional uint64 ul",
            int(-1),
            Row("18446744073709551615"),
        ),
        (
            "ul",
            "optional fixed64 ul",
            fixed64(u64::MAX),
            Row("18446744073709551615"),
        ),
        ("ul", "optional sint64 ul", zz(-1), Reject("wrong_type")),
        // F32/F64 ← float, double, integers.
        ("f", "optional float f", float(1.5), Row("1.5")),
        ("f", "optional double f", double(1.5), Row("1.5")),
        ("f", "optional int32 f", int(3), Row("3")),
        ("f", "optional string f", pld(b"1"), MISMATCH),
        ("d", "optional double d", double(0.25), Row("0.25")),
        ("d", "optional float d", float(1.5), Row("1.5")),
        ("d", "optional uint64 d", int(3), Row("3")),
        ("d", "optional bool d", int(1), MISMATCH),
        // Date ← int32 kinds (days), google.type.Date.
        ("day", "optional int32 day", int(DAY), Row("2024-02-29")),
        ("day", "optional sint32 day", zz(DAY), Row("2024-02-29")),
        (
            "day",
            "optional sfixed32 day",
            fixed32(DAY as u32),
            Row("2024-02-29"),
        ),
        ("day", "google.type.Date day", date, Row("2024-02-29")),
        ("day", "optional int64 day", int(DAY), MISMATCH),
        ("day", "optional string day", pld(b"2024-02-29"), MISMATCH),
        // DateTime ← google.protobuf.Timestamp.
        ("at", "google.protobuf.Timestamp at", ts, Row(AT)),
        ("at", "optional int64 at", int(MS), MISMATCH),
        // [T] and Vector(n) ← repeated T's kinds.
        (
            "tags",
            "repeated string tags",
            [pld(b"a"), pld(b"b")].concat(),
            Row("[a, b]"),
        ),
        (
            "nums",
            "repeated int32 nums",
            packed(&[1, 2]),
            Row("[1, 2]"),
        ),
        (
            "nums",
            "repeated uint64 nums",
            packed(&[u64::MAX]),
            Reject("wrong_type"),
        ),
        ("tags", "optional string tags", pld(b"a"), MISMATCH),
        ("nums", "repeated string nums", pld(b"1"), MISMATCH),
        ("s", "repeated string s", pld(b"a"), MISMATCH),
        ("tags", "map<string, string> tags", pld(&[]), MISMATCH),
        (
            "v",
            "repeated float v",
            floats(&[1.5, -2.0]),
            Row("[1.5, -2.0]"),
        ),
        (
            "v",
            "repeated double v",
            pld(&[1.5f64.to_le_bytes(), 2f64.to_le_bytes()].concat()),
            Row("[1.5, 2.0]"),
        ),
        ("v", "repeated int32 v", packed(&[1, 2]), Row("[1.0, 2.0]")),
        (
            "v",
            "repeated float v",
            floats(&[1.0]),
            Reject("wrong_type"),
        ),
        ("v", "repeated string v", pld(b"1"), MISMATCH),
        // enum(a, b) ← enum or string; outside the .pg enum is `enum`.
        ("e", "optional Color e", int(0), Row("red")),
        ("e", "optional string e", pld(b"green"), Row("green")),
        ("e", "optional Color e", int(2), Reject("enum")),
        ("e", "optional int32 e", int(0), MISMATCH),
    ]
}

#[test]
fn every_protobuf_row_of_the_type_table() {
    let mut wrong = Vec::new();
    let mut d = decoder("protobuf");
    let date = Arc::new(Schema {
        schema_type: SchemaType::Protobuf,
        text: GOOGLE_DATE.into(),
        descriptor: None,
        references: vec![],
        imports: vec![],
    });
    for (n, (prop, decl, value, want)) in protobuf_cases().into_iter().enumerate() {
        let id = 100 + n as u32;
        // W first: message index [0] names it.
        let text = format!(
            r#"syntax = "proto3";
package t;
import "google/protobuf/timestamp.proto";
import "google/type/date.proto";
message W {{ string k = 1; {decl} = 2; }}
message Sub {{ int32 x = 1; }}
enum Color {{ red = 0; green = 1; blue = 2; }}
"#
        );
        d.learn(
            id,
            Ok(Arc::new(Schema {
                schema_type: SchemaType::Protobuf,
                text,
                descriptor: None,
                references: vec![],
                imports: vec![("google/type/date.proto".into(), date.clone())],
            })),
        );
        let k = format!("k{n}");
        let mut payload = vec![0, 0x0a, k.len() as u8];
        payload.extend_from_slice(k.as_bytes());
        payload.extend(value);
        let v = wire::framed(id, &payload);
        let out = d.decode(&[rec(&v)]).expect("decode never fails the poll");
        if let Err(e) = check(&out, prop, want) {
            wrong.push(format!("{prop} ← {decl}: {e}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
