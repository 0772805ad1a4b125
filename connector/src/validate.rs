//! Sync validation of decoded rows against the `.pg` constraints that need
//! no graph state: enum membership, `@range`, `@check`.
//!
//! A [`Validator`] is compiled once per type (regexes included) and checks
//! whole decoded batches column by column. Nulls are exempt from all three
//! constraints: whether a value may be missing is the decoder's
//! `missing_required` concern, not a value constraint.

use std::cmp::Ordering;
use std::ops::Range;

use arrow::array::{Array, ArrowPrimitiveType, AsArray, PrimitiveArray, RecordBatch};
use arrow::datatypes::{
    DataType, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type,
    UInt32Type, UInt64Type, UInt8Type,
};
use regex::Regex;

use crate::error::{Error, Result};
use crate::rejects::{RefusedRow, RejectCode};
use crate::schema::{Bound, GraphType};

/// Longest string value (in bytes) quoted whole in a message; longer ones are
/// cut, so one huge value cannot bloat `_ingest_rejects`.
const MAX_SHOWN: usize = 120;

/// A type's enum, `@range` and `@check` constraints, compiled.
#[derive(Debug, Clone)]
pub(crate) struct Validator {
    enums: Vec<EnumRule>,
    ranges: Vec<RangeRule>,
    checks: Vec<CheckRule>,
}

#[derive(Debug, Clone)]
struct EnumRule {
    property: String,
    /// Sorted, for binary search.
    values: Vec<String>,
    /// `enum(a, b)`, as in messages.
    shown: String,
}

#[derive(Debug, Clone)]
struct RangeRule {
    property: String,
    min: Option<Bound>,
    max: Option<Bound>,
    /// `@range(p, 0..200)`, as in messages.
    shown: String,
}

#[derive(Debug, Clone)]
struct CheckRule {
    property: String,
    regex: Regex,
    /// `@check(p, "regex")`, as in messages.
    shown: String,
}

impl Validator {
    /// Compiles the type's constraints. An invalid `@check` regex is a schema
    /// error (the `.pg` compiler accepts any string as a pattern).
    pub(crate) fn new(ty: &GraphType) -> Result<Validator> {
        let c = &ty.constraints;
        let enums = c
            .enums
            .iter()
            .map(|(property, values)| {
                let mut sorted = values.clone();
                sorted.sort();
                sorted.dedup();
                EnumRule {
                    property: property.clone(),
                    values: sorted,
                    shown: format!("enum({})", values.join(", ")),
                }
            })
            .collect();
        let ranges = c
            .ranges
            .iter()
            .map(|r| RangeRule {
                property: r.property.clone(),
                min: r.min,
                max: r.max,
                shown: format!(
                    "@range({}, {}..{})",
                    r.property,
                    show_bound(r.min),
                    show_bound(r.max)
                ),
            })
            .collect();
        let checks = c
            .checks
            .iter()
            .map(|(property, pattern)| {
                let regex = Regex::new(pattern).map_err(|e| Error::Schema {
                    path: "<schema>".into(),
                    message: format!(
                        "{}.{}: @check pattern {pattern:?} is not a valid regex: {}",
                        ty.name,
                        property,
                        // The syntax error repeats the pattern with a caret
                        // over lines; its last line is the verdict.
                        e.to_string().lines().last().unwrap_or_default().trim()
                    ),
                })?;
                Ok(CheckRule {
                    property: property.clone(),
                    regex,
                    shown: format!("@check({property}, {pattern:?})"),
                })
            })
            .collect::<Result<_>>()?;
        Ok(Validator {
            enums,
            ranges,
            checks,
        })
    }

    /// True when the type has no enum, range or check constraint (callers
    /// skip [`Validator::check`]).
    pub(crate) fn is_empty(&self) -> bool {
        self.enums.is_empty() && self.ranges.is_empty() && self.checks.is_empty()
    }

    /// Checks `rows`, whose columns are found by name: it may hold more than
    /// the type's properties (id, provenance), and a constrained column that
    /// is absent, or of a type the constraint does not apply to, is skipped.
    /// Returns at most one violation per row, the first found in the order
    /// enums, ranges, checks (each in declaration order), sorted by row.
    ///
    /// - enum: every non-null value of a Utf8 column, or element of a list
    ///   of Utf8, must be one of the values.
    /// - `@range`: both bounds inclusive, either may be open; integer
    ///   columns against integer bounds compare exactly, anything involving
    ///   a float compares as f64, and NaN is always out of range. Lists are
    ///   checked per element; non-numeric columns (dates) are skipped.
    /// - `@check`: `Regex::is_match`, so the pattern's own anchors decide
    ///   whether the whole string must match. Lists are checked per element.
    pub(crate) fn check(&self, rows: &RecordBatch) -> Vec<RefusedRow> {
        let mut out = Vec::new();
        if self.is_empty() || rows.num_rows() == 0 {
            return out;
        }
        // Rows already refused: later constraints skip them, which keeps
        // the first violation and saves their regex work.
        let mut done = vec![false; rows.num_rows()];

        for rule in &self.enums {
            let Some(col) = rows.column_by_name(&rule.property) else {
                continue;
            };
            scan_strs(
                &Spans::of(col.as_ref()),
                RejectCode::Enum,
                &mut done,
                &mut out,
                |s| rule.values.binary_search_by(|v| v.as_str().cmp(s)).is_err(),
                |elem, s| {
                    format!(
                        "{} = {} is not one of {}",
                        at(&rule.property, elem),
                        show_str(s),
                        rule.shown
                    )
                },
            );
        }

        for rule in &self.ranges {
            let Some(col) = rows.column_by_name(&rule.property) else {
                continue;
            };
            scan_nums(
                &Spans::of(col.as_ref()),
                &mut done,
                &mut out,
                |v| outside(v, rule.min, rule.max),
                |elem, v| {
                    format!(
                        "{} = {} is outside {}",
                        at(&rule.property, elem),
                        v,
                        rule.shown
                    )
                },
            );
        }

        for rule in &self.checks {
            let Some(col) = rows.column_by_name(&rule.property) else {
                continue;
            };
            scan_strs(
                &Spans::of(col.as_ref()),
                RejectCode::Check,
                &mut done,
                &mut out,
                |s| !rule.regex.is_match(s),
                |elem, s| {
                    format!(
                        "{} = {} does not match {}",
                        at(&rule.property, elem),
                        show_str(s),
                        rule.shown
                    )
                },
            );
        }

        // Each rule appends in row order, but a later rule can flag earlier rows.
        out.sort_unstable_by_key(|v| v.row);
        out
    }
}

/// A column as the checks see it: each row is a span of slots in `values`,
/// one slot for a scalar column, its elements for a list. Lets one scan
/// serve both without copying.
struct Spans<'a> {
    outer: &'a dyn Array,
    values: &'a dyn Array,
    offsets: Offsets<'a>,
}

enum Offsets<'a> {
    Scalar,
    List(&'a [i32]),
    LargeList(&'a [i64]),
}

impl<'a> Spans<'a> {
    fn of(col: &'a dyn Array) -> Spans<'a> {
        if let Some(l) = col.as_list_opt::<i32>() {
            Spans {
                outer: col,
                values: l.values().as_ref(),
                offsets: Offsets::List(l.value_offsets()),
            }
        } else if let Some(l) = col.as_list_opt::<i64>() {
            Spans {
                outer: col,
                values: l.values().as_ref(),
                offsets: Offsets::LargeList(l.value_offsets()),
            }
        } else {
            Spans {
                outer: col,
                values: col,
                offsets: Offsets::Scalar,
            }
        }
    }

    /// The slots of `row` (none for a null list; a null scalar is left to
    /// the slot's own validity).
    fn span(&self, row: usize) -> Option<Range<usize>> {
        match self.offsets {
            Offsets::Scalar => Some(row..row + 1),
            _ if self.outer.is_null(row) => None,
            Offsets::List(o) => Some(o[row] as usize..o[row + 1] as usize),
            Offsets::LargeList(o) => Some(o[row] as usize..o[row + 1] as usize),
        }
    }

    fn is_list(&self) -> bool {
        !matches!(self.offsets, Offsets::Scalar)
    }
}

/// Visits the non-null values of every row not yet `done`; the first value
/// `bad` flags settles its row with `message(element index if a list, value)`.
#[allow(clippy::too_many_arguments)]
fn scan<T: Copy>(
    spans: &Spans<'_>,
    get: impl Fn(usize) -> Option<T>,
    code: RejectCode,
    done: &mut [bool],
    out: &mut Vec<RefusedRow>,
    bad: impl Fn(T) -> bool,
    message: impl Fn(Option<usize>, T) -> String,
) {
    for (row, settled) in done.iter_mut().enumerate() {
        if *settled {
            continue;
        }
        let Some(span) = spans.span(row) else {
            continue;
        };
        let start = span.start;
        for slot in span {
            let Some(v) = get(slot) else { continue };
            if bad(v) {
                let elem = spans.is_list().then(|| slot - start);
                out.push(RefusedRow {
                    row,
                    code,
                    message: message(elem, v),
                });
                *settled = true;
                break;
            }
        }
    }
}

/// [`scan`] over a Utf8 (or LargeUtf8, Utf8View) column or list; other
/// types are skipped.
fn scan_strs(
    spans: &Spans<'_>,
    code: RejectCode,
    done: &mut [bool],
    out: &mut Vec<RefusedRow>,
    bad: impl Fn(&str) -> bool,
    message: impl Fn(Option<usize>, &str) -> String,
) {
    let v = spans.values;
    if let Some(a) = v.as_string_opt::<i32>() {
        let get = |i| a.is_valid(i).then(|| a.value(i));
        scan(spans, get, code, done, out, &bad, &message);
    } else if let Some(a) = v.as_string_opt::<i64>() {
        let get = |i| a.is_valid(i).then(|| a.value(i));
        scan(spans, get, code, done, out, &bad, &message);
    } else if let Some(a) = v.as_string_view_opt() {
        let get = |i| a.is_valid(i).then(|| a.value(i));
        scan(spans, get, code, done, out, &bad, &message);
    }
}

/// A number as `@range` compares it: integers widened exactly.
#[derive(Debug, Clone, Copy)]
enum Num {
    Int(i128),
    F32(f32),
    F64(f64),
}

impl std::fmt::Display for Num {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Num::Int(x) => write!(f, "{x}"),
            // Debug keeps the `.0` of whole floats and the f32's own digits.
            Num::F32(x) => write!(f, "{x:?}"),
            Num::F64(x) => write!(f, "{x:?}"),
        }
    }
}

/// [`scan`] over a primitive numeric column or list; other types (dates,
/// decimals) are skipped. Monomorphised per Arrow type so the per-value
/// work is a plain load and compare.
fn scan_nums(
    spans: &Spans<'_>,
    done: &mut [bool],
    out: &mut Vec<RefusedRow>,
    bad: impl Fn(Num) -> bool,
    message: impl Fn(Option<usize>, Num) -> String,
) {
    fn slots<'a, T: ArrowPrimitiveType>(
        a: &'a PrimitiveArray<T>,
        conv: impl Fn(T::Native) -> Num + 'a,
    ) -> impl Fn(usize) -> Option<Num> + 'a {
        move |i| a.is_valid(i).then(|| conv(a.value(i)))
    }
    let v = spans.values;
    let code = RejectCode::Range;
    macro_rules! go {
        ($t:ty, $conv:expr) => {
            scan(
                spans,
                slots(v.as_primitive::<$t>(), $conv),
                code,
                done,
                out,
                &bad,
                &message,
            )
        };
    }
    match v.data_type() {
        DataType::Int8 => go!(Int8Type, |x| Num::Int(x.into())),
        DataType::Int16 => go!(Int16Type, |x| Num::Int(x.into())),
        DataType::Int32 => go!(Int32Type, |x| Num::Int(x.into())),
        DataType::Int64 => go!(Int64Type, |x| Num::Int(x.into())),
        DataType::UInt8 => go!(UInt8Type, |x| Num::Int(x.into())),
        DataType::UInt16 => go!(UInt16Type, |x| Num::Int(x.into())),
        DataType::UInt32 => go!(UInt32Type, |x| Num::Int(x.into())),
        DataType::UInt64 => go!(UInt64Type, |x| Num::Int(x.into())),
        DataType::Float32 => go!(Float32Type, Num::F32),
        DataType::Float64 => go!(Float64Type, Num::F64),
        _ => {}
    }
}

/// Whether `v` lies outside `min..max` (inclusive, `None` open). NaN is
/// outside any range: it compares to nothing.
fn outside(v: Num, min: Option<Bound>, max: Option<Bound>) -> bool {
    let cmp = |b: Bound| -> Option<Ordering> {
        let b64 = match b {
            Bound::Int(i) => i as f64,
            Bound::Float(f) => f,
        };
        match (v, b) {
            (Num::Int(x), Bound::Int(i)) => Some(x.cmp(&i128::from(i))),
            (Num::Int(x), Bound::Float(f)) => (x as f64).partial_cmp(&f),
            (Num::F32(x), _) => f64::from(x).partial_cmp(&b64),
            (Num::F64(x), _) => x.partial_cmp(&b64),
        }
    };
    let nan = match v {
        Num::Int(_) => false,
        Num::F32(x) => x.is_nan(),
        Num::F64(x) => x.is_nan(),
    };
    nan || min.is_some_and(|m| cmp(m) == Some(Ordering::Less))
        || max.is_some_and(|m| cmp(m) == Some(Ordering::Greater))
}

/// A bound as written in `.pg` (an open end shows as nothing).
fn show_bound(b: Option<Bound>) -> String {
    match b {
        None => String::new(),
        Some(Bound::Int(i)) => i.to_string(),
        Some(Bound::Float(f)) => format!("{f:?}"),
    }
}

/// `p` for a scalar, `p[i]` for element `i` of a list.
fn at(property: &str, elem: Option<usize>) -> String {
    match elem {
        None => property.to_string(),
        Some(i) => format!("{property}[{i}]"),
    }
}

/// A string value quoted (escaped), cut after [`MAX_SHOWN`] bytes.
fn show_str(s: &str) -> String {
    if s.len() <= MAX_SHOWN {
        return format!("{s:?}");
    }
    let mut cut = MAX_SHOWN;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{:?}… ({} bytes)", &s[..cut], s.len())
}

#[cfg(test)]
mod tests {
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
}
