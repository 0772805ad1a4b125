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
mod tests;
