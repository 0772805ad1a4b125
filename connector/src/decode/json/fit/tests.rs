//! The judge, row by row over the Arrow types a `.pg` schema maps to (the
//! properties of decode/tests/type_table.rs's `T`), strict and lenient.

use arrow_schema::{DataType, Field};
use std::sync::Arc;

use super::*;
// The type table's type: one property per `.pg` type.
use crate::decode::tests::type_table::PG;
use crate::schema::GraphSchema;

/// The code `v` (JSON text) gets against property `prop`'s type.
fn code(prop: &str, v: &str, strict: bool) -> Option<&'static str> {
    let s = GraphSchema::parse(PG, "t.pg").unwrap();
    let ty = s.get("T").unwrap();
    let field = ty.properties.field_with_name(prop).unwrap();
    let v: serde_json::Value = serde_json::from_str(v).unwrap();
    misfit(&Want::of(field.data_type()), &v, strict).map(|(c, _)| c.as_str())
}

/// Every property's type has its row in the table, Blob alone `Any`.
#[test]
fn every_pg_type_has_a_want() {
    let s = GraphSchema::parse(PG, "t.pg").unwrap();
    for f in s.get("T").unwrap().properties.fields() {
        let want = Want::of(f.data_type());
        assert_eq!(
            want == Want::Any,
            f.name() == "blob",
            "{}: {} is {want:?}",
            f.name(),
            f.data_type()
        );
    }
}

#[test]
fn each_type_takes_its_own_kind_of_value() {
    for (prop, v) in [
        ("s", r#""x""#),
        ("e", r#""red""#),
        ("b", "true"),
        ("i", "-2147483648"),
        ("i", "3.0"),
        ("l", "9223372036854775807"),
        ("u", "4294967295"),
        ("ul", "18446744073709551615"),
        ("f", "3.4e38"),
        ("d", "1e300"),
        ("day", r#""2024-01-02""#),
        ("at", r#""2024-01-02T03:04:05Z""#),
        ("tags", r#"["a","b"]"#),
        ("nums", "[1,2]"),
        ("v", "[0.5,1]"),
        ("blob", r#""AAEC""#),
    ] {
        for strict in [true, false] {
            assert_eq!(code(prop, v, strict), None, "{prop} {v} strict={strict}");
        }
    }
    for prop in ["s", "b", "i", "f", "day", "tags", "v", "blob"] {
        assert_eq!(
            code(prop, "null", true),
            None,
            "{prop}: nullability is not the judge's"
        );
    }
}

#[test]
fn a_value_of_another_kind_is_wrong_type() {
    for (prop, v) in [
        ("s", "1"),
        ("e", "true"),
        ("b", r#""true""#),
        ("i", "true"),
        ("i", "[1]"),
        ("l", r#"{"a":1}"#),
        ("d", "false"),
        ("tags", r#""a""#),
        ("tags", "[1]"),
        ("nums", "7"),
        ("nums", r#"[1,"x"]"#),
        ("v", "{}"),
    ] {
        for strict in [true, false] {
            assert_eq!(
                code(prop, v, strict),
                Some("wrong_type"),
                "{prop} {v} strict={strict}"
            );
        }
    }
}

#[test]
fn an_integer_out_of_its_range_overflows() {
    for (prop, v) in [
        ("i", "2147483648"),
        ("i", "1e15"),
        ("u", "-1"),
        ("ul", "-1"),
        ("l", "18446744073709551615"),
        ("nums", "[1,18446744073709551615]"),
    ] {
        for strict in [true, false] {
            assert_eq!(
                code(prop, v, strict),
                Some("overflow"),
                "{prop} {v} strict={strict}"
            );
        }
    }
}

/// What arrow-json coerces silently: refused strict, taken lenient.
#[test]
fn coercions_are_refused_only_strict() {
    for (prop, v, strict_code) in [
        ("i", "3.5", "wrong_type"),
        ("i", r#""12""#, "wrong_type"),
        ("l", "1e16", "overflow"),
        ("f", "3.5e38", "overflow"),
        ("d", r#""NaN""#, "wrong_type"),
        ("day", "19000", "wrong_type"),
        ("at", "1700000000000", "wrong_type"),
        ("nums", "[1,2.5]", "wrong_type"),
    ] {
        assert_eq!(code(prop, v, true), Some(strict_code), "{prop} {v}");
        assert_eq!(code(prop, v, false), None, "{prop} {v} lenient");
    }
    // Lenient, a string that is no number is still refused.
    assert_eq!(code("i", r#""old""#, false), Some("wrong_type"));
    assert_eq!(code("d", r#""old""#, false), Some("wrong_type"));
}

#[test]
fn the_messages_name_the_type_and_the_value() {
    let why = |t: DataType, v: &str, strict: bool| {
        let v: serde_json::Value = serde_json::from_str(v).unwrap();
        misfit(&Want::of(&t), &v, strict).unwrap().1
    };
    assert_eq!(
        why(DataType::Int32, "4294967296", true),
        "4294967296 does not fit Int32"
    );
    assert_eq!(
        why(DataType::Int32, r#""old""#, false),
        r#"expected Int32, got "old""#
    );
    assert!(why(DataType::Int64, "3.5", true).starts_with("3.5 is not an integer (set coerce"));
    assert_eq!(
        why(DataType::Float32, "3.5e38", true),
        "3.5e+38 does not fit F32"
    );
    let list = DataType::List(Arc::new(Field::new("item", DataType::Int64, true)));
    assert_eq!(why(list.clone(), "7", true), "expected a list, got 7");
    assert_eq!(
        why(list, r#""x""#, true),
        r#"expected a list, got a string "x""#
    );
    assert_eq!(
        why(DataType::Utf8, "[1]", true),
        "expected a string, got [1]"
    );
}
