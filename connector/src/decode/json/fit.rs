//! Whether a JSON value fits a column type: the one judge both JSON paths
//! ask. The screen (`screen.rs`, under `coerce = "strict"`) asks it of each
//! number and string before arrow-json decodes a poll; `classify`
//! (`json.rs`) asks it of each property of a value arrow-json refused, to
//! name the field and tell a type from an overflow.
//!
//! A null always fits here: whether a property may be null is the
//! schema's nullability, which `classify` checks before it asks.

use std::fmt;

use arrow_schema::DataType;

use crate::rejects::RejectCode;

/// Why a value does not fit its property: the code and the message, the
/// caller prefixes the field's name.
pub(super) type Misfit = (RejectCode, String);

/// What a column takes from JSON. `of` is the table: every Arrow type a
/// `.pg` schema maps to has its row.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Want {
    /// An integral number within `lo..=hi`; `ty` names the column type in
    /// messages.
    Int { lo: i128, hi: i128, ty: DataType },
    /// Any number; `f32_range` also refuses one beyond ±f32::MAX.
    Float { f32_range: bool },
    /// A string.
    Text,
    /// `true` or `false`.
    Bool,
    /// A date or time: a string (arrow-json would also read a number as
    /// days or epoch units, silently). The string itself is arrow-json's
    /// to parse.
    Temporal,
    /// A JSON array of such values.
    List(Box<Want>),
    /// A type whose values arrow-json alone judges (Blob).
    Any,
}

impl Want {
    pub(super) fn of(t: &DataType) -> Want {
        let int = |lo: i128, hi: i128| Want::Int {
            lo,
            hi,
            ty: t.clone(),
        };
        match t {
            DataType::Int8 => int(i8::MIN.into(), i8::MAX.into()),
            DataType::Int16 => int(i16::MIN.into(), i16::MAX.into()),
            DataType::Int32 => int(i32::MIN.into(), i32::MAX.into()),
            DataType::Int64 => int(i64::MIN.into(), i64::MAX.into()),
            DataType::UInt8 => int(0, u8::MAX.into()),
            DataType::UInt16 => int(0, u16::MAX.into()),
            DataType::UInt32 => int(0, u32::MAX.into()),
            DataType::UInt64 => int(0, u64::MAX.into()),
            DataType::Float16 | DataType::Float32 => Want::Float { f32_range: true },
            DataType::Float64 => Want::Float { f32_range: false },
            DataType::Utf8 | DataType::LargeUtf8 => Want::Text,
            DataType::Boolean => Want::Bool,
            DataType::Date32 | DataType::Date64 | DataType::Timestamp(..) => Want::Temporal,
            DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
                Want::List(Box::new(Want::of(f.data_type())))
            }
            _ => Want::Any,
        }
    }

    /// Whether the screen looks at a property of this type: numbers and
    /// dates (and lists of them), the types arrow-json coerces into.
    pub(super) fn screened(&self) -> bool {
        match self {
            Want::Int { .. } | Want::Float { .. } | Want::Temporal => true,
            Want::List(item) => item.screened(),
            Want::Text | Want::Bool | Want::Any => false,
        }
    }
}

/// A JSON value as the judge sees it; `shown` is how a message prints it.
#[derive(Clone, Copy)]
pub(super) enum Seen<'a> {
    Null,
    Bool(bool),
    /// `exact`: the integer, when serde read one (written without a
    /// fraction or exponent, within 64 bits); `f` its value as f64.
    Number {
        shown: &'a dyn fmt::Display,
        f: f64,
        exact: Option<i128>,
    },
    Str(&'a str),
    /// An array: the caller judges its items against the list's item.
    Array(&'a dyn fmt::Display),
    Object(&'a dyn fmt::Display),
}

/// The judge's answer.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Fit {
    /// Taken as written, or left to arrow-json to judge (a date string,
    /// an array's items, a Blob).
    Fits,
    /// arrow-json would take it, but not as written (a numeric string
    /// parsed, a fraction truncated, a number read as days, an integer
    /// past 2^53 rounded, an F32 overflow read as infinity), and any
    /// string where a number is wanted. Only under `coerce = "strict"`,
    /// where it is refused.
    Coerced(Misfit),
    /// arrow-json refuses it.
    Refused(Misfit),
}

/// The largest magnitude below which every integer is an exact f64.
const MAX_EXACT: f64 = 9_007_199_254_740_992.0;

/// Whether `v` fits `want`; `strict` is `coerce = "strict"`.
pub(super) fn judge(want: &Want, v: Seen<'_>, strict: bool) -> Fit {
    match (want, v) {
        (_, Seen::Null) | (Want::Any, _) => Fit::Fits,
        (Want::Int { lo, hi, ty }, v) => int(*lo, *hi, ty, v, strict),
        (Want::Float { f32_range }, v) => float(*f32_range, v, strict),
        (Want::Text, Seen::Str(_)) | (Want::Bool, Seen::Bool(_)) => Fit::Fits,
        (Want::Text, v) => refused(format!("expected a string, got {}", shown(&v))),
        (Want::Bool, v) => refused(format!("expected true or false, got {}", shown(&v))),
        (Want::Temporal, Seen::Number { shown, .. }) if strict => coerced(format!(
            "expected a date or time string, got {shown} (set coerce = \"lenient\" to read epoch numbers)"
        )),
        (Want::Temporal, _) => Fit::Fits,
        (Want::List(_), Seen::Array(_)) => Fit::Fits,
        (Want::List(_), Seen::Str(s)) => {
            refused(format!("expected a list, got a string {:?}", clip(s)))
        }
        (Want::List(_), v) => refused(format!("expected a list, got {}", shown(&v))),
    }
}

/// An integer column: integral numbers within its range.
fn int(lo: i128, hi: i128, ty: &DataType, v: Seen<'_>, strict: bool) -> Fit {
    let (shown, f, exact) = match v {
        Seen::Number { shown, f, exact } => (shown, f, exact),
        Seen::Str(s) if strict => {
            return coerced(format!(
                "expected a number, got the string {:?} (set coerce = \"lenient\" to parse numeric strings)",
                clip(s)
            ))
        }
        // Lenient: arrow-json parses an integer string.
        Seen::Str(s) if s.parse::<i128>().is_ok_and(|x| (lo..=hi).contains(&x)) => {
            return Fit::Fits
        }
        v => return refused(format!("expected {ty}, got {}", shown(&v))),
    };
    let overflow = || Fit::Refused((RejectCode::Overflow, format!("{shown} does not fit {ty}")));
    if let Some(x) = exact {
        return if (lo..=hi).contains(&x) {
            Fit::Fits
        } else {
            overflow()
        };
    }
    if strict && f.fract() != 0.0 {
        return coerced(format!(
            "{shown} is not an integer (set coerce = \"lenient\" to truncate)"
        ));
    }
    // serde reads an integer as f64 only when it is written as one (`3.0`,
    // `1e3`) or lies beyond 64 bits; past 2^53 it is not exact, and
    // arrow-json would round it into range (2^63 + 1 as I64::MIN) silently.
    if strict && f.abs() > MAX_EXACT {
        return Fit::Coerced((
            RejectCode::Overflow,
            format!("{shown} is beyond ±2^53 and not an exact integer (write it without a fraction or exponent, within the type)"),
        ));
    }
    // `3.0` is 3; lenient, arrow-json truncates a fraction.
    if (lo as f64..=hi as f64).contains(&f.trunc()) {
        Fit::Fits
    } else {
        overflow()
    }
}

/// A float column: any number.
fn float(f32_range: bool, v: Seen<'_>, strict: bool) -> Fit {
    match v {
        Seen::Number { shown, f, .. } => {
            if strict && f32_range && f.is_finite() && f.abs() > f32::MAX as f64 {
                Fit::Coerced((RejectCode::Overflow, format!("{shown} does not fit F32")))
            } else {
                Fit::Fits
            }
        }
        Seen::Str(s) if strict => coerced(format!(
            "expected a number, got the string {:?} (set coerce = \"lenient\" to parse numeric strings)",
            clip(s)
        )),
        // Lenient: arrow-json parses a numeric string (and "NaN", "inf").
        Seen::Str(s) if s.parse::<f64>().is_ok() => Fit::Fits,
        v => refused(format!("expected a number, got {}", shown(&v))),
    }
}

fn coerced(why: String) -> Fit {
    Fit::Coerced((RejectCode::WrongType, why))
}

fn refused(why: String) -> Fit {
    Fit::Refused((RejectCode::WrongType, why))
}

/// A value as a message prints it; a string quoted and cut to 40
/// characters.
fn shown(v: &Seen<'_>) -> String {
    match v {
        Seen::Null => "null".into(),
        Seen::Bool(b) => b.to_string(),
        Seen::Number { shown, .. } | Seen::Array(shown) | Seen::Object(shown) => shown.to_string(),
        Seen::Str(s) => format!("{:?}", clip(s)),
    }
}

fn clip(s: &str) -> String {
    s.chars().take(40).collect()
}

/// Whether a parsed value fits `want`, its list items included: the
/// first misfit.
pub(super) fn misfit(want: &Want, v: &serde_json::Value, strict: bool) -> Option<Misfit> {
    use serde_json::Value as J;
    let seen = match v {
        J::Null => Seen::Null,
        J::Bool(b) => Seen::Bool(*b),
        J::Number(n) => Seen::Number {
            shown: n,
            f: n.as_f64().unwrap_or(f64::NAN),
            exact: n.as_i64().map(i128::from).or(n.as_u64().map(i128::from)),
        },
        J::String(s) => Seen::Str(s),
        J::Array(_) => Seen::Array(v),
        J::Object(_) => Seen::Object(v),
    };
    match (judge(want, seen, strict), want, v) {
        (Fit::Coerced(m) | Fit::Refused(m), ..) => Some(m),
        (Fit::Fits, Want::List(item), J::Array(items)) => {
            items.iter().find_map(|x| misfit(item, x, strict))
        }
        (Fit::Fits, ..) => None,
    }
}

#[cfg(test)]
mod tests;
