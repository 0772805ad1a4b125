//! Every `.pg` type through the decoder, strict and lenient.

use super::*;
use crate::schema::GraphSchema;

/// Every `.pg` type decodes from the JSON a producer would naturally send.
#[test]
fn every_schema_type_decodes() {
    let s = GraphSchema::parse(
        r#"node T {
            k: I64 @key
            s: String  b: Bool  i: I32  u: U32  ul: U64  f: F32  d: F64
            day: Date  at: DateTime  tags: [String]  v: Vector(3)?  blob: Blob?
            e: enum(red, green)
        }"#,
        "t.pg",
    )
    .unwrap();
    let m = super::mapping("topic = 't'\nnode = 'T'");
    let mut d = RecordDecoder::new(&s, &m, 10, 1 << 20).unwrap();
    let v = r#"{"k": 9007199254740993, "s": "x", "b": true, "i": -5, "u": 7, "ul": 18446744073709551615,
                "f": 1.5, "d": 2.25, "day": "2024-02-29", "at": "2024-02-29T12:34:56Z",
                "tags": ["a", "b"], "v": [1.0, 2.0, 3.0], "e": "red"}"#;
    let r = SourceRecord {
        topic: "t",
        partition: 0,
        offset: 0,
        timestamp: None,
        key: None,
        value: Some(v.as_bytes()),
        message: None,
    };
    let out = d.decode(&[r]).unwrap();
    let rows = out.upserts.unwrap();
    assert_eq!(rows.num_rows(), 1);
    let id = rows
        .column(0)
        .as_any()
        .downcast_ref::<StringArray>()
        .unwrap();
    assert_eq!(id.value(0), "9007199254740993");
}

/// What `coerce = "lenient"` does with float strings (README lists it).
#[test]
fn lenient_floats_take_numeric_strings_nan_and_infinity() {
    let s = GraphSchema::parse("node F { k: String @key  d: F64?  f: F32? }", "t.pg").unwrap();
    let values = [
        r#"{"k":"a","d":"1.5"}"#,
        r#"{"k":"b","d":"NaN"}"#,
        r#"{"k":"c","d":"inf","f":"-inf"}"#,
    ];
    let recs: Vec<_> = values
        .iter()
        .enumerate()
        .map(|(i, v)| SourceRecord {
            topic: "t",
            partition: 0,
            offset: i as i64,
            timestamp: None,
            key: None,
            value: Some(v.as_bytes()),
            message: None,
        })
        .collect();
    let lenient = super::mapping("topic = 't'\nnode = 'F'\ncoerce = 'lenient'");
    let out = RecordDecoder::new(&s, &lenient, 10, 1 << 20)
        .unwrap()
        .decode(&recs)
        .unwrap();
    assert!(out.rejects.is_empty(), "{:?}", out.rejects);
    let rows = out.upserts.unwrap();
    let d = rows
        .column_by_name("d")
        .unwrap()
        .as_any()
        .downcast_ref::<arrow::array::Float64Array>()
        .unwrap();
    assert_eq!(d.value(0), 1.5);
    assert!(d.value(1).is_nan());
    assert_eq!(d.value(2), f64::INFINITY);
    let strict = super::mapping("topic = 't'\nnode = 'F'");
    let out = RecordDecoder::new(&s, &strict, 10, 1 << 20)
        .unwrap()
        .decode(&recs)
        .unwrap();
    assert!(out.upserts.is_none());
    assert!(out.rejects.iter().all(|r| r.code == RejectCode::WrongType));
    assert_eq!(out.rejects.len(), 3);
}
