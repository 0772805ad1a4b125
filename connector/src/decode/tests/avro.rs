//! The Avro format on values framed and encoded here by hand (Avro's binary
//! encoding is small: zigzag varints, length-prefixed strings, a branch
//! index per union), so each case holds exactly the bytes it means. The
//! e2e tests use Confluent's own serializers.

use std::sync::Arc;

use arrow::array::{Array, RecordBatch};

use super::{col, ids};
use crate::decode::{RecordDecoder, SourceRecord};
use crate::registry::{wire, Schema, SchemaType};
use crate::rejects::RejectCode;
use crate::schema::GraphSchema;

const PG: &str = r#"
    node Person { id: String @key  name: String  age: I64?  email: String?  color: enum(red, green)?
                  born: Date?  seen: DateTime?  v: Vector(2)?  tags: [String]? }
    edge Knows: Person -> Person { since: I32? }
"#;

/// Writer v1: id, name, age as an int.
const V1: &str = r#"{"type":"record","name":"Person","namespace":"t","fields":[
    {"name":"id","type":"string"},{"name":"name","type":"string"},{"name":"age","type":"int"}]}"#;
/// Writer v2: age widened to long, and an optional email with a default.
const V2: &str = r#"{"type":"record","name":"Person","namespace":"t","fields":[
    {"name":"id","type":"string"},{"name":"name","type":"string"},{"name":"age","type":"long"},
    {"name":"email","type":["null","string"],"default":null}]}"#;

/// An Avro `long` (or `int`): a zigzag varint.
fn long(out: &mut Vec<u8>, v: i64) {
    wire::put_zigzag(out, v);
}

fn string(out: &mut Vec<u8>, s: &str) {
    long(out, s.len() as i64);
    out.extend_from_slice(s.as_bytes());
}

/// id, name, age (v1 and v2 encode an int and a long alike).
fn person(id: &str, name: &str, age: i64) -> Vec<u8> {
    let mut b = Vec::new();
    string(&mut b, id);
    string(&mut b, name);
    long(&mut b, age);
    b
}

fn decoder(extra: &str) -> RecordDecoder {
    let s = GraphSchema::parse(PG, "t.pg").unwrap();
    let m = super::mapping(&format!(
        "topic = 't'\nnode = 'Person'\nformat = 'avro'\n{extra}"
    ));
    RecordDecoder::new(&s, &m, 100, 1 << 20).unwrap()
}

fn avro(text: &str) -> super::super::Learned {
    Ok(Arc::new(Schema {
        schema_type: SchemaType::Avro,
        text: text.to_string(),
        descriptor: None,
        references: vec![],
        imports: vec![],
    }))
}

fn rec(offset: i64, value: Option<&[u8]>) -> SourceRecord<'_> {
    SourceRecord {
        topic: "t",
        partition: 0,
        offset,
        timestamp: Some(1),
        key: Some(b"k"),
        value,
        message: None,
    }
}

fn codes(out: &crate::decode::Decoded) -> Vec<(i64, &'static str)> {
    out.rejects
        .iter()
        .map(|r| (r.offset.unwrap(), r.code.as_str()))
        .collect()
}

fn upserts(out: &crate::decode::Decoded) -> &RecordBatch {
    out.upserts.as_ref().expect("rows")
}

#[test]
fn two_writer_versions_land_in_one_batch_in_poll_order() {
    let mut d = decoder("");
    let values = [
        wire::framed(1, &person("a", "Ann", 30)),
        wire::framed(2, &{
            let mut b = person("b", "Bob", 5_000_000_000);
            b.push(2); // email: branch 1 (string)
            string(&mut b, "bob@x");
            b
        }),
        wire::framed(1, &person("c", "Cy", 7)),
        wire::framed(2, &{
            let mut b = person("d", "Di", -1);
            b.push(0); // email: null
            b
        }),
    ];
    let records: Vec<SourceRecord<'_>> = values
        .iter()
        .enumerate()
        .map(|(i, v)| rec(i as i64, Some(v)))
        .collect();
    assert_eq!(d.unlearned(&records), [(1, 0), (2, 1)]);
    d.learn(1, avro(V1));
    d.learn(2, avro(V2));
    assert!(d.unlearned(&records).is_empty());
    let out = d.decode(&records).unwrap();
    assert!(out.rejects.is_empty(), "{:?}", out.rejects);
    let rows = upserts(&out);
    assert_eq!(ids(rows), ["a", "b", "c", "d"]);
    assert_eq!(col(rows, "name"), ["Ann", "Bob", "Cy", "Di"]);
    // int (v1) promoted to long; a long beyond i32 from v2.
    assert_eq!(col(rows, "age"), ["30", "5000000000", "7", "-1"]);
    assert_eq!(col(rows, "email"), ["null", "bob@x", "null", "null"]);
    assert_eq!(col(rows, "_src_offset"), ["0", "1", "2", "3"]);
}

#[test]
fn each_bad_value_is_one_typed_reject_and_the_rest_land() {
    let mut d = decoder("");
    // v3 lacks the required name and has no default for it.
    let v3 = r#"{"type":"record","name":"P","fields":[{"name":"id","type":"string"}]}"#;
    // v4 has name as a boolean: no promotion to string.
    let v4 = r#"{"type":"record","name":"P","fields":[{"name":"id","type":"string"},{"name":"name","type":"boolean"}]}"#;
    let good = wire::framed(1, &person("a", "Ann", 1));
    let truncated = {
        let mut v = wire::framed(1, &person("b", "Bob", 1));
        v.truncate(v.len() - 2);
        v
    };
    let trailing = {
        let mut v = wire::framed(1, &person("c", "Cy", 1));
        v.extend_from_slice(&[7, 7, 7]);
        v
    };
    // A string length far beyond the value.
    let huge = {
        let mut b = Vec::new();
        long(&mut b, 1 << 40);
        wire::framed(1, &b)
    };
    let values: Vec<Vec<u8>> = vec![
        good.clone(),
        b"{\"id\":1}".to_vec(),        // JSON, no magic byte
        vec![0, 0, 0],                 // shorter than the prefix
        wire::framed(9, b"x"),         // an id the registry does not have
        wire::framed(3, b"\x02a"),     // v3
        wire::framed(4, b"\x02a\x01"), // v4
        truncated,
        trailing,
        huge,
        wire::framed(1, &person("z", "Zed", 2)),
    ];
    let records: Vec<SourceRecord<'_>> = values
        .iter()
        .enumerate()
        .map(|(i, v)| rec(i as i64, Some(v)))
        .collect();
    let wanted: Vec<u32> = d.unlearned(&records).iter().map(|(id, _)| *id).collect();
    assert_eq!(wanted, [1, 9, 3, 4]);
    d.learn(1, avro(V1));
    d.learn(
        9,
        Err("/schemas/ids/9: error_code 40403: Schema not found".into()),
    );
    d.learn(3, avro(v3));
    d.learn(4, avro(v4));
    let out = d.decode(&records).unwrap();
    assert_eq!(
        codes(&out),
        [
            (1, "bad_framing"),
            (2, "bad_framing"),
            (3, "unknown_schema_id"),
            (4, "schema_mismatch"),
            (5, "schema_mismatch"),
            (6, "malformed_avro"),
            (7, "malformed_avro"),
            (8, "malformed_avro"),
        ]
    );
    for r in &out.rejects {
        assert_eq!(
            r.value.as_deref(),
            Some(&values[r.offset.unwrap() as usize][..])
        );
    }
    let m: Vec<&str> = out.rejects.iter().map(|r| r.message.as_str()).collect();
    assert!(m[0].contains("magic"), "{m:?}");
    assert!(m[3].contains("name"), "{m:?}");
    assert!(m[5].contains("truncated"), "{m:?}");
    assert!(m[6].contains("trailing"), "{m:?}");
    // One bad record does not poison the decoder for those after it.
    assert_eq!(ids(upserts(&out)), ["a", "z"]);
    // And a later poll decodes on the rebuilt decoder.
    let again = [wire::framed(1, &person("y", "Yu", 3))];
    let out = d.decode(&[rec(20, Some(&again[0]))]).unwrap();
    assert_eq!(ids(upserts(&out)), ["y"]);
}

#[test]
fn an_undeclared_writer_field_follows_unknown_fields() {
    let extra = r#"{"type":"record","name":"P","fields":[{"name":"id","type":"string"},
        {"name":"name","type":"string"},{"name":"shoe","type":"int"}]}"#;
    let v = {
        let mut b = Vec::new();
        string(&mut b, "a");
        string(&mut b, "Ann");
        long(&mut b, 44);
        wire::framed(5, &b)
    };
    let mut strict = decoder("");
    strict.learn(5, avro(extra));
    let out = strict.decode(&[rec(0, Some(&v))]).unwrap();
    assert_eq!(codes(&out), [(0, "unknown_field")]);
    assert!(
        out.rejects[0].message.contains("shoe"),
        "{}",
        out.rejects[0].message
    );
    let mut lax = decoder("unknown_fields = 'ignore'");
    lax.learn(5, avro(extra));
    let out = lax.decode(&[rec(0, Some(&v))]).unwrap();
    assert_eq!(ids(upserts(&out)), ["a"]);
}

#[test]
fn richer_avro_types_read_as_their_properties() {
    // An Avro enum for the enum property, a uuid string for a String, a
    // date, timestamp-micros for a DateTime, a float array for a Vector(2)
    // and a string array.
    let w = r#"{"type":"record","name":"P","fields":[
        {"name":"id","type":{"type":"string","logicalType":"uuid"}},
        {"name":"name","type":"string"},
        {"name":"color","type":["null",{"type":"enum","name":"Color","symbols":["red","green","blue"]}]},
        {"name":"born","type":{"type":"int","logicalType":"date"}},
        {"name":"seen","type":{"type":"long","logicalType":"timestamp-micros"}},
        {"name":"v","type":{"type":"array","items":"float"}},
        {"name":"tags","type":{"type":"array","items":"string"}}]}"#;
    let mut b = Vec::new();
    string(&mut b, "5f0c7a3e-8d6b-4b8e-9a57-1c2d3e4f5a6b");
    string(&mut b, "Ann");
    b.push(2); // color: branch 1
    long(&mut b, 1); // "green"
    long(&mut b, 19_782); // 2024-02-29
    long(&mut b, 1_709_210_096_123_456); // 2024-02-29T12:34:56.123456Z
    long(&mut b, 2); // v: one block of 2
    b.extend_from_slice(&1.5f32.to_le_bytes());
    b.extend_from_slice(&(-2.0f32).to_le_bytes());
    long(&mut b, 0);
    long(&mut b, 1); // tags: one block of 1
    string(&mut b, "x");
    long(&mut b, 0);
    let v = wire::framed(7, &b);
    let mut d = decoder("");
    d.learn(7, avro(w));
    let out = d.decode(&[rec(0, Some(&v))]).unwrap();
    assert!(out.rejects.is_empty(), "{:?}", out.rejects);
    let rows = upserts(&out);
    assert_eq!(ids(rows), ["5f0c7a3e-8d6b-4b8e-9a57-1c2d3e4f5a6b"]);
    assert_eq!(col(rows, "color"), ["green"]);
    assert_eq!(col(rows, "born"), ["2024-02-29"]);
    assert!(
        col(rows, "seen")[0].starts_with("2024-02-29T12:34:56.123"),
        "{:?}",
        col(rows, "seen")
    );
    let vcol = rows.column_by_name("v").unwrap();
    assert_eq!(
        vcol.data_type(),
        &rows
            .schema()
            .field_with_name("v")
            .unwrap()
            .data_type()
            .clone()
    );
    assert_eq!(col(rows, "tags"), ["[x]"]);
    // A Vector of the wrong length is refused, not truncated.
    let mut short = Vec::new();
    string(&mut short, "5f0c7a3e-8d6b-4b8e-9a57-1c2d3e4f5a6c");
    string(&mut short, "Bo");
    short.push(0);
    long(&mut short, 1);
    long(&mut short, 1);
    long(&mut short, 1);
    short.extend_from_slice(&1.0f32.to_le_bytes());
    long(&mut short, 0);
    long(&mut short, 0);
    let v = wire::framed(7, &short);
    let out = d.decode(&[rec(1, Some(&v))]).unwrap();
    assert_eq!(codes(&out), [(1, "wrong_type")]);
}

#[test]
fn a_tombstone_is_still_a_delete() {
    let mut d = decoder("key = 'kafka'");
    let out = d.decode(&[rec(0, None)]).unwrap();
    let dels = out.deletes.expect("a delete");
    assert_eq!(dels.num_rows(), 1);
    assert!(out.rejects.is_empty());
    let _ = RejectCode::BadFraming;
}

/// A Debezium envelope as Confluent's AvroConverter registers it for the
/// PostgreSQL connector (Debezium's docs give no whole one; this follows
/// the shape they describe: `before` and `after` as `["null", Value]` with
/// `after` naming the same record, Connect's types as `connect.name`).
const ENVELOPE: &str = r#"{"type":"record","name":"Envelope","namespace":"dbserver1.public.customers",
 "connect.name":"dbserver1.public.customers.Envelope","fields":[
 {"name":"before","default":null,"type":["null",{"type":"record","name":"Value",
   "connect.name":"dbserver1.public.customers.Value","fields":[
   {"name":"id","type":"string"},{"name":"name","type":"string"},
   {"name":"seen","type":["null",{"type":"long","connect.version":1,"connect.name":"io.debezium.time.MicroTimestamp"}],"default":null}]}]},
 {"name":"after","default":null,"type":["null","Value"]},
 {"name":"source","type":{"type":"record","name":"Source","namespace":"io.debezium.connector.postgresql",
   "fields":[{"name":"connector","type":"string"},{"name":"ts_ms","type":"long"},
   {"name":"lsn","type":["null","long"],"default":null}]}},
 {"name":"op","type":"string"},
 {"name":"ts_ms","type":["null","long"],"default":null}]}"#;

/// One Debezium event in Avro: `row` is `(id, name, seen µs)`.
fn change(op: &str, before: Option<(&str, &str)>, after: Option<(&str, &str, i64)>) -> Vec<u8> {
    let mut b = Vec::new();
    match before {
        None => long(&mut b, 0),
        Some((id, name)) => {
            long(&mut b, 1);
            string(&mut b, id);
            string(&mut b, name);
            long(&mut b, 0);
        }
    }
    match after {
        None => long(&mut b, 0),
        Some((id, name, seen)) => {
            long(&mut b, 1);
            string(&mut b, id);
            string(&mut b, name);
            long(&mut b, 1);
            long(&mut b, seen);
        }
    }
    string(&mut b, "postgresql");
    long(&mut b, 1_559_033_904_863);
    long(&mut b, 1);
    long(&mut b, 24_023_128);
    string(&mut b, op);
    long(&mut b, 0);
    wire::framed(5, &b)
}

#[test]
fn debezium_envelopes_in_avro_upsert_after_and_delete_before() {
    let s = GraphSchema::parse(PG, "t.pg").unwrap();
    let m = super::mapping(
        "topic = 't'\nnode = 'Person'\nformat = 'avro'\nenvelope = 'debezium'\n\
         [fields]\nseen = { encoding = 'epoch_micros' }",
    );
    let mut d = RecordDecoder::new(&s, &m, 100, 1 << 20).unwrap();
    let values = [
        change("c", None, Some(("1", "Ann", 1_559_033_904_863_123))),
        change("r", None, Some(("2", "Bo", 0))),
        change("d", Some(("2", "Bo")), None),
        change("u", Some(("1", "Ann")), None),
        change("t", None, None),
    ];
    let records: Vec<SourceRecord<'_>> = values
        .iter()
        .enumerate()
        .map(|(i, v)| rec(i as i64, Some(v)))
        .collect();
    assert_eq!(d.unlearned(&records), [(5, 0)]);
    d.learn(5, avro(ENVELOPE));
    let out = d.decode(&records).unwrap();
    assert_eq!(codes(&out), [(3, "missing_after"), (4, "unsupported_op")]);
    let up = upserts(&out);
    assert_eq!(ids(up), ["1"]);
    assert_eq!(col(up, "seen"), ["2019-05-28T08:58:24.863"]);
    assert_eq!(ids(out.deletes.as_ref().unwrap()), ["2"]);
    // The reject carries the Avro bytes as they came.
    assert_eq!(out.rejects[0].value.as_deref(), Some(&values[3][..]));
}
