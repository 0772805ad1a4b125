//! The constraint checks on small batches: rows, codes and messages.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, Float32Array, Float64Array, Int32Array, Int64Array, ListArray, ListBuilder,
    StringArray, StringBuilder, UInt64Array,
};
use arrow::datatypes::Int64Type;

use super::*;
use crate::error::ErrorKind;
use crate::schema::{GraphSchema, RangeCheck};

const PG: &str = r#"
    node P {
        name: String @key
        age: I32?
        score: F64?
        ratio: F32?
        big: U64?
        nums: [I64]?
        color: enum(red, green)?
        tags: [String]?
        code: String?
        codes: [String]?
        @range(age, 0..200)
        @range(score, 0.5..)
        @range(ratio, 0..1)
        @range(big, 0..9223372036854775807)
        @range(nums, -5..)
        @check(code, "^[A-Z]{3}-[0-9]+$")
        @check(codes, "^[a-z]+$")
    }
    node Q { k: String @key  n: I64? }
"#;

/// Type P; `[enum(...)]` is not `.pg` syntax (a list holds a base type
/// only), so the list enum on `tags` is added by hand.
fn p() -> GraphType {
    let mut ty = GraphSchema::parse(PG, "t.pg")
        .unwrap()
        .get("P")
        .unwrap()
        .clone();
    ty.constraints
        .enums
        .push(("tags".into(), vec!["a".into(), "b".into()]));
    ty
}

fn validator() -> Validator {
    Validator::new(&p()).unwrap()
}

fn batch(cols: Vec<(&str, ArrayRef)>) -> RecordBatch {
    RecordBatch::try_from_iter(cols).unwrap()
}

fn rows(v: &[RefusedRow]) -> Vec<usize> {
    v.iter().map(|v| v.row).collect()
}

fn strs(v: Vec<Option<&str>>) -> ArrayRef {
    Arc::new(StringArray::from(v))
}

fn str_lists(v: Vec<Option<Vec<Option<&str>>>>) -> ArrayRef {
    let mut b = ListBuilder::new(StringBuilder::new());
    for row in v {
        match row {
            Some(items) => {
                for s in items {
                    b.values().append_option(s);
                }
                b.append(true);
            }
            None => b.append(false),
        }
    }
    Arc::new(b.finish())
}

#[test]
fn empty_only_without_constraints() {
    let s = GraphSchema::parse(PG, "t.pg").unwrap();
    assert!(Validator::new(s.get("Q").unwrap()).unwrap().is_empty());
    assert!(!validator().is_empty());
}

#[test]
fn enum_values_must_be_listed() {
    let b = batch(vec![(
        "color",
        strs(vec![Some("red"), Some("blue"), None, Some("green")]),
    )]);
    let v = validator().check(&b);
    assert_eq!(
        v,
        [RefusedRow {
            row: 1,
            code: RejectCode::Enum,
            // The compiler sorts enum values.
            message: r#"color = "blue" is not one of enum(green, red)"#.into(),
        }]
    );
}

#[test]
fn range_bounds_are_inclusive() {
    let b = batch(vec![(
        "age",
        Arc::new(Int32Array::from(vec![
            Some(0),
            Some(200),
            Some(201),
            Some(-1),
            None,
        ])) as ArrayRef,
    )]);
    let v = validator().check(&b);
    assert_eq!(rows(&v), [2, 3]);
    assert!(v.iter().all(|v| v.code == RejectCode::Range));
    assert_eq!(v[0].message, "age = 201 is outside @range(age, 0..200)");
    assert_eq!(v[1].message, "age = -1 is outside @range(age, 0..200)");
}

#[test]
fn open_bounds_and_nan() {
    // `0.5..` as parsed from .pg: no upper bound.
    let b = batch(vec![(
        "score",
        Arc::new(Float64Array::from(vec![
            Some(0.5),
            Some(1e300),
            Some(f64::INFINITY),
            Some(0.4),
            Some(f64::NAN),
            None,
        ])) as ArrayRef,
    )]);
    let v = validator().check(&b);
    assert_eq!(rows(&v), [3, 4]);
    assert_eq!(v[0].message, "score = 0.4 is outside @range(score, 0.5..)");
    assert_eq!(v[1].message, "score = NaN is outside @range(score, 0.5..)");

    // An open lower end (built by hand: see the report on `..max`).
    let mut ty = p();
    ty.constraints.ranges = vec![RangeCheck {
        property: "score".into(),
        min: None,
        max: Some(Bound::Float(1.5)),
    }];
    let b = batch(vec![(
        "score",
        Arc::new(Float64Array::from(vec![-1e300, 1.5, 1.6, f64::NAN])) as ArrayRef,
    )]);
    let v = Validator::new(&ty).unwrap().check(&b);
    assert_eq!(rows(&v), [2, 3]);
    assert_eq!(v[0].message, "score = 1.6 is outside @range(score, ..1.5)");
}

#[test]
fn float_column_against_int_bounds() {
    let b = batch(vec![(
        "ratio",
        Arc::new(Float32Array::from(vec![
            0.0,
            1.0,
            -0.0,
            1.000_000_1,
            f32::NAN,
        ])) as ArrayRef,
    )]);
    let v = validator().check(&b);
    assert_eq!(rows(&v), [3, 4]);
    assert_eq!(
        v[0].message,
        "ratio = 1.0000001 is outside @range(ratio, 0..1)"
    );
}

#[test]
fn u64_above_i64_max_is_compared_exactly() {
    let max = i64::MAX as u64;
    let b = batch(vec![(
        "big",
        Arc::new(UInt64Array::from(vec![0, max, max + 1, u64::MAX])) as ArrayRef,
    )]);
    let v = validator().check(&b);
    // As f64, max + 1 would equal the bound and pass.
    assert_eq!(rows(&v), [2, 3]);
    assert_eq!(
        v[0].message,
        "big = 9223372036854775808 is outside @range(big, 0..9223372036854775807)"
    );
}

#[test]
fn check_uses_the_patterns_anchors() {
    let b = batch(vec![(
        "code",
        strs(vec![Some("ABC-1"), Some("abc"), Some("xABC-1"), None]),
    )]);
    let v = validator().check(&b);
    assert_eq!(rows(&v), [1, 2]);
    assert_eq!(v[0].code, RejectCode::Check);
    assert_eq!(
        v[0].message,
        r#"code = "abc" does not match @check(code, "^[A-Z]{3}-[0-9]+$")"#
    );

    // Unanchored: a substring match is enough.
    let mut ty = p();
    ty.constraints.checks = vec![("code".into(), "[0-9]".into())];
    let v = Validator::new(&ty).unwrap().check(&b);
    assert_eq!(rows(&v), [1]);
}

#[test]
fn nulls_are_exempt() {
    let b = batch(vec![
        (
            "age",
            Arc::new(Int32Array::from(vec![None::<i32>; 2])) as ArrayRef,
        ),
        (
            "score",
            Arc::new(Float64Array::from(vec![None::<f64>; 2])) as ArrayRef,
        ),
        ("color", strs(vec![None, None])),
        ("code", strs(vec![None, None])),
        ("tags", str_lists(vec![None, Some(vec![None, Some("a")])])),
    ]);
    assert!(validator().check(&b).is_empty());
}

#[test]
fn list_elements_are_checked_each() {
    let tags = str_lists(vec![
        Some(vec![Some("a"), Some("b")]),
        Some(vec![Some("a"), Some("c"), Some("d")]),
        None,
        Some(vec![None, Some("b")]),
        Some(vec![]),
        Some(vec![Some("x")]),
    ]);
    let nums = Arc::new(ListArray::from_iter_primitive::<Int64Type, _, _>(vec![
        Some(vec![Some(-5), Some(0)]),
        Some(vec![]),
        Some(vec![Some(1), Some(-6)]),
        Some(vec![None]),
        None,
        Some(vec![Some(i64::MIN)]),
    ])) as ArrayRef;
    let codes = str_lists(vec![
        Some(vec![Some("ok")]),
        None,
        None,
        Some(vec![Some("ok"), Some("NO")]),
        None,
        None,
    ]);
    let b = batch(vec![("tags", tags), ("nums", nums), ("codes", codes)]);
    let v = validator().check(&b);
    assert_eq!(rows(&v), [1, 2, 3, 5]);
    assert_eq!(v[0].message, r#"tags[1] = "c" is not one of enum(a, b)"#);
    assert_eq!(v[1].message, "nums[1] = -6 is outside @range(nums, -5..)");
    assert_eq!(
        v[2].message,
        r#"codes[1] = "NO" does not match @check(codes, "^[a-z]+$")"#
    );
    // Row 5 breaks both the enum and the range: the enum comes first.
    assert_eq!(v[3].code, RejectCode::Enum);

    // Slicing keeps list offsets and row numbers relative to the slice.
    let v = validator().check(&b.slice(2, 4));
    assert_eq!(rows(&v), [0, 1, 3]);
    assert_eq!(v[0].message, "nums[1] = -6 is outside @range(nums, -5..)");
}

#[test]
fn first_violation_per_row_sorted_by_row() {
    let b = batch(vec![
        ("id", strs(vec![Some("x"), Some("y"), Some("z"), Some("w")])),
        (
            "color",
            strs(vec![None, Some("blue"), Some("red"), Some("red")]),
        ),
        (
            "age",
            Arc::new(Int32Array::from(vec![None, Some(-1), Some(300), Some(1)])) as ArrayRef,
        ),
        (
            "code",
            strs(vec![Some("bad"), Some("bad"), Some("bad"), Some("ABC-9")]),
        ),
    ]);
    let v = validator().check(&b);
    let got: Vec<_> = v.iter().map(|v| (v.row, v.code)).collect();
    assert_eq!(
        got,
        [
            (0, RejectCode::Check),
            (1, RejectCode::Enum),
            (2, RejectCode::Range),
        ]
    );
}

#[test]
fn absent_and_other_columns_are_skipped() {
    let b = batch(vec![
        ("id", strs(vec![Some("x")])),
        (
            "_src_offset",
            Arc::new(Int64Array::from(vec![7])) as ArrayRef,
        ),
    ]);
    assert!(validator().check(&b).is_empty());
    // A constrained column of another type (here age as Utf8) is skipped.
    let b = batch(vec![("age", strs(vec![Some("999")]))]);
    assert!(validator().check(&b).is_empty());
}

#[test]
fn long_values_are_cut_in_messages() {
    let long = "é".repeat(100);
    let b = batch(vec![("color", strs(vec![Some(&long)]))]);
    let v = validator().check(&b);
    assert!(
        v[0].message.contains("… (200 bytes) is not one of"),
        "{}",
        v[0].message
    );
}

#[test]
fn invalid_regex_is_a_schema_error() {
    let s = GraphSchema::parse(
        r#"node R { k: String @key  code: String?  @check(code, "[A-Z") }"#,
        "t.pg",
    )
    .unwrap();
    let e = Validator::new(s.get("R").unwrap()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::BadConfig);
    let m = e.to_string();
    assert!(m.contains("R.code") && m.contains("[A-Z"), "{m}");
    assert!(m.contains("unclosed character class"), "{m}");
    assert!(!m.contains('\n'), "{m}");
}
