//! `key_format`: keys framed in a registry format (Avro by hand, Protobuf
//! by prost-reflect, JSON Schema), and `string` keys, through
//! `RecordDecoder::decode`. Each framed key must name the same row a
//! `json` key of the same parts names.

use prost::Message as _;
use prost_reflect::{DynamicMessage, Value};

use super::{codes, ids, learned, raw as rec};
use crate::decode::{Decoded, RecordDecoder, Subject};
use crate::registry::{wire, SchemaType};
use crate::schema::GraphSchema;

const PG: &str = r#"
    node Person { id: String @key  name: String? }
    node Pair { t: String  n: I64  label: String?  @key(t, n) }
    edge Knows: Person -> Person { since: I32? }
"#;

fn decoder(m: &str) -> RecordDecoder {
    let s = GraphSchema::parse(PG, "t.pg").unwrap();
    RecordDecoder::new(
        &s,
        &super::mapping(&format!("topic = 't'\n{m}")),
        100,
        1 << 20,
    )
    .unwrap()
}

/// An Avro string: a zigzag length, then the bytes.
fn avro_string(s: &str) -> Vec<u8> {
    let mut b = Vec::new();
    wire::put_zigzag(&mut b, s.len() as i64);
    b.extend_from_slice(s.as_bytes());
    b
}

fn deleted(out: &Decoded) -> Vec<String> {
    out.deletes.as_ref().map(ids).unwrap_or_default()
}

#[test]
fn avro_keys_bare_or_records_name_the_node_and_bad_ones_are_one_typed_reject() {
    let mut d = decoder("node = 'Person'\nkey = 'kafka'\nkey_format = 'avro'");
    let bare = wire::framed(10, &avro_string("ann"));
    // A record holding the key and more (ignored).
    let mut rec_key = avro_string("bob");
    wire::put_zigzag(&mut rec_key, 7);
    let record = wire::framed(11, &rec_key);
    let unknown = wire::framed(12, &avro_string("x"));
    let mut truncated = bare.clone();
    truncated.pop();
    let value = br#"{"name":"N"}"#.as_slice();
    let records = [
        rec(0, Some(&bare), Some(value)),
        rec(1, Some(&record), Some(value)),
        rec(2, Some(b"plain"), Some(value)),
        rec(3, Some(&unknown), Some(value)),
        rec(4, Some(&truncated), Some(value)),
        rec(5, Some(&bare), None),
        rec(6, Some(&record), Some(value)),
    ];
    // Keys first: a record is decoded only once both of its ids are known.
    assert_eq!(
        d.unlearned_subject(Some(&bare), Some(value)),
        Some((Subject::Key, 10))
    );
    d.learn_subject(Subject::Key, 10, learned(SchemaType::Avro, r#""string""#));
    d.learn_subject(
        Subject::Key,
        11,
        learned(
            SchemaType::Avro,
            r#"{"type":"record","name":"K","fields":[{"name":"id","type":"string"},{"name":"x","type":"int"}]}"#,
        ),
    );
    d.learn_subject(Subject::Key, 12, Err("40403".into()));
    assert_eq!(d.unlearned_subject(Some(&bare), Some(value)), None);
    let out = d.decode(&records).unwrap();
    assert_eq!(
        codes(&out),
        [
            (2, "bad_framing"),
            (3, "unknown_schema_id"),
            (4, "malformed_avro")
        ]
    );
    // The reject keeps the key's bytes as they came.
    assert_eq!(out.rejects[2].key.as_deref(), Some(truncated.as_slice()));
    // ann is deleted by the tombstone after her upsert; bob's last write wins.
    assert_eq!(ids(out.upserts.as_ref().unwrap()), ["bob"]);
    assert_eq!(deleted(&out), ["ann"]);
}

#[test]
fn an_avro_key_that_cannot_resolve_to_the_key_is_schema_mismatch() {
    let mut d = decoder("node = 'Person'\nkey = 'kafka'\nkey_format = 'avro'");
    d.learn_subject(
        Subject::Key,
        1,
        learned(
            SchemaType::Avro,
            r#"{"type":"record","name":"K","fields":[{"name":"other","type":"string"}]}"#,
        ),
    );
    d.learn_subject(
        Subject::Key,
        2,
        learned(SchemaType::Protobuf, "syntax = \"proto3\";"),
    );
    let k1 = wire::framed(1, &avro_string("a"));
    let k2 = wire::framed(2, &avro_string("a"));
    let v = br#"{"name":"N"}"#.as_slice();
    let out = d
        .decode(&[rec(0, Some(&k1), Some(v)), rec(1, Some(&k2), Some(v))])
        .unwrap();
    assert_eq!(
        codes(&out),
        [(0, "schema_mismatch"), (1, "schema_mismatch")]
    );
    assert!(
        out.rejects[0].message.starts_with("key: "),
        "{}",
        out.rejects[0].message
    );
}

#[test]
fn a_composite_avro_key_names_the_row_a_json_array_key_names() {
    let mut d = decoder("node = 'Pair'\nkey = 'kafka'\nkey_format = 'avro'");
    d.learn_subject(
        Subject::Key,
        1,
        learned(
            SchemaType::Avro,
            r#"{"type":"record","name":"K","fields":[{"name":"t","type":"string"},{"name":"n","type":"int"}]}"#,
        ),
    );
    let mut k = avro_string("x");
    wire::put_zigzag(&mut k, 7);
    let framed = wire::framed(1, &k);
    let v = br#"{"label":"L"}"#.as_slice();
    let out = d.decode(&[rec(0, Some(&framed), Some(v))]).unwrap();
    assert!(out.rejects.is_empty(), "{:?}", out.rejects);
    let mut j = decoder("node = 'Pair'\nkey = 'kafka'");
    let want = j.decode(&[rec(0, Some(br#"["x", 7]"#), Some(v))]).unwrap();
    assert_eq!(
        ids(out.upserts.as_ref().unwrap()),
        ids(want.upserts.as_ref().unwrap())
    );
}

#[test]
fn an_edge_id_from_a_framed_key() {
    let mut d = decoder("edge = 'Knows'\nkey = 'kafka'\nkey_format = 'avro'");
    d.learn_subject(Subject::Key, 1, learned(SchemaType::Avro, r#""string""#));
    let k = wire::framed(1, &avro_string("e1"));
    let v = br#"{"src":"a","dst":"b"}"#.as_slice();
    let out = d.decode(&[rec(0, Some(&k), Some(v))]).unwrap();
    assert!(out.rejects.is_empty(), "{:?}", out.rejects);
    assert_eq!(ids(out.upserts.as_ref().unwrap()), ["e1"]);
    // Its tombstone deletes the same id.
    let out = d.decode(&[rec(1, Some(&k), None)]).unwrap();
    assert_eq!(deleted(&out), ["e1"]);
    // A `long` key gives the id as its text, beside string keys in one poll.
    d.learn_subject(Subject::Key, 2, learned(SchemaType::Avro, r#""long""#));
    let mut seven = Vec::new();
    wire::put_zigzag(&mut seven, 7);
    let n = wire::framed(2, &seven);
    let out = d
        .decode(&[rec(2, Some(&n), Some(v)), rec(3, Some(&k), Some(v))])
        .unwrap();
    assert!(out.rejects.is_empty(), "{:?}", out.rejects);
    assert_eq!(ids(out.upserts.as_ref().unwrap()), ["7", "e1"]);
}

#[test]
fn protobuf_keys_take_the_key_fields_by_name() {
    const PROTO: &str =
        "syntax = \"proto3\";\npackage k;\nmessage Key { string t = 1; int64 n = 2; }\n";
    let mut d = decoder("node = 'Pair'\nkey = 'kafka'\nkey_format = 'protobuf'");
    d.learn_subject(Subject::Key, 4, learned(SchemaType::Protobuf, PROTO));
    let pool = crate::decode::protobuf::compile_for_tests(PROTO);
    let mut m = DynamicMessage::new(pool.get_message_by_name("k.Key").unwrap());
    m.set_field_by_name("t", Value::String("x".into()));
    m.set_field_by_name("n", Value::I64(7));
    let mut payload = wire::encode_message_indexes(&[0]);
    payload.extend(m.encode_to_vec());
    let k = wire::framed(4, &payload);
    let mut garbage = wire::framed(4, &wire::encode_message_indexes(&[0]));
    garbage.extend_from_slice(&[0x0a, 0xff, 0xff, 0xff, 0x0f]);
    let v = br#"{"label":"L"}"#.as_slice();
    let out = d
        .decode(&[rec(0, Some(&k), Some(v)), rec(1, Some(&garbage), Some(v))])
        .unwrap();
    assert_eq!(codes(&out), [(1, "malformed_protobuf")]);
    assert_eq!(ids(out.upserts.as_ref().unwrap()), [r#"["x","7"]"#]);
}

#[test]
fn json_schema_keys_are_a_scalar_an_array_or_an_object_after_the_prefix() {
    let mut d = decoder("node = 'Pair'\nkey = 'kafka'\nkey_format = 'json_schema'");
    d.learn_subject(
        Subject::Key,
        5,
        learned(SchemaType::Json, r#"{"type":"object"}"#),
    );
    let obj = wire::framed(5, br#"{"t":"x","n":7,"more":true}"#);
    let arr = wire::framed(5, br#"["y", 8]"#);
    let short = wire::framed(5, br#"{"t":"z"}"#);
    let v = br#"{"label":"L"}"#.as_slice();
    let out = d
        .decode(&[
            rec(0, Some(&obj), Some(v)),
            rec(1, Some(&arr), Some(v)),
            rec(2, Some(&short), Some(v)),
        ])
        .unwrap();
    assert_eq!(codes(&out), [(2, "missing_key")]);
    assert_eq!(
        ids(out.upserts.as_ref().unwrap()),
        [r#"["x","7"]"#, r#"["y","8"]"#]
    );
    let mut one = decoder("node = 'Person'\nkey = 'kafka'\nkey_format = 'json_schema'");
    one.learn_subject(Subject::Key, 5, learned(SchemaType::Json, "{}"));
    let k = wire::framed(5, br#""ann""#);
    let out = one
        .decode(&[rec(0, Some(&k), Some(br#"{"name":"A"}"#))])
        .unwrap();
    assert_eq!(ids(out.upserts.as_ref().unwrap()), ["ann"]);
}

#[test]
fn string_keys_are_taken_verbatim() {
    let mut d = decoder("node = 'Person'\nkey = 'kafka'\nkey_format = 'string'");
    let out = d
        .decode(&[rec(0, Some(br#""quoted""#), Some(br#"{"name":"Q"}"#))])
        .unwrap();
    assert_eq!(ids(out.upserts.as_ref().unwrap()), [r#""quoted""#]);
    // `json` reads the same bytes as a JSON string.
    let mut j = decoder("node = 'Person'\nkey = 'kafka'");
    let out = j
        .decode(&[rec(0, Some(br#""quoted""#), Some(br#"{"name":"Q"}"#))])
        .unwrap();
    assert_eq!(ids(out.upserts.as_ref().unwrap()), ["quoted"]);
    // One part only.
    let s = GraphSchema::parse(PG, "t.pg").unwrap();
    let m = super::mapping("topic = 't'\nnode = 'Pair'\nkey = 'kafka'\nkey_format = 'string'");
    let err = RecordDecoder::new(&s, &m, 100, 1 << 20).err().unwrap();
    assert!(err.to_string().contains("holds one part"), "{err}");
}

/// `refusal` (what `check` asks of a subject's latest schema) names only
/// what refuses an id, never a fault of an empty payload: a JSON Schema id
/// was refused as `malformed_json` before.
#[test]
fn refusal_is_about_the_id_alone() {
    let mut d = decoder("node = 'Person'\nformat = 'json_schema'");
    d.learn(1, learned(SchemaType::Json, r#"{"type":"object"}"#));
    d.learn(2, learned(SchemaType::Avro, r#""string""#));
    d.learn(3, Err("40403".into()));
    assert_eq!(d.refusal(1), None);
    assert_eq!(d.refusal(2).map(|r| r.0.as_str()), Some("schema_mismatch"));
    assert_eq!(
        d.refusal(3).map(|r| r.0.as_str()),
        Some("unknown_schema_id")
    );
}
