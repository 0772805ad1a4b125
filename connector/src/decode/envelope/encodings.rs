//! Source encodings → graphsink's JSON: Debezium's and Kafka Connect's
//! epoch numbers and decimals, rewritten into the text or number the JSON
//! path reads for the property's type (docs/cdc.md, the encodings table).
//! A value that does not convert is the caller's `wrong_type`, naming the
//! path.

use arrow_schema::DataType;
use base64::Engine;
use chrono::{DateTime, NaiveDate, SecondsFormat, TimeDelta};
use serde_json::Value;

use crate::config::Encoding;

/// PostgreSQL's `infinity` and `-infinity` as Debezium writes them in
/// every epoch unit: refused, never clamped to a date.
const PG_INFINITY: [i64; 2] = [9_223_372_036_825_200_000, -9_223_372_036_832_400_000];

/// `v` written in `encoding`, as the JSON the property's type reads.
pub(super) fn decode(
    v: Value,
    encoding: Encoding,
    scale: Option<u32>,
    target: &DataType,
) -> Result<Value, String> {
    match encoding {
        Encoding::EpochDays => {
            let days = epoch(&v, "days")?;
            match target {
                DataType::Date32 => date_text(days),
                DataType::Date64 | DataType::Timestamp(..) => {
                    millis_text(days.checked_mul(86_400_000))
                }
                t if is_integer(t) => Ok(v),
                t => Err(format!("epoch days do not fit a {t} property")),
            }
        }
        Encoding::EpochMillis | Encoding::EpochMicros | Encoding::EpochNanos => {
            let n = epoch(&v, "epoch units")?;
            let per_ms = match encoding {
                Encoding::EpochMillis => 1,
                Encoding::EpochMicros => 1_000,
                _ => 1_000_000,
            };
            match target {
                // Floor, not truncation: -1 µs is 1969-12-31T23:59:59.999.
                DataType::Date64 | DataType::Timestamp(..) => {
                    millis_text(Some(n.div_euclid(per_ms)))
                }
                t if is_integer(t) => Ok(v),
                t => Err(format!(
                    "a timestamp does not fit a {t} property (map it to a DateTime or an integer)"
                )),
            }
        }
        Encoding::Decimal => {
            let text = decimal_text(&v, scale)?;
            number_or_text(text, target)
        }
        Encoding::DecimalString => match v {
            Value::String(s) => number_or_text(s, target),
            Value::Number(_) => Ok(v),
            other => Err(format!("expected a decimal string, got {other}")),
        },
    }
}

fn is_integer(t: &DataType) -> bool {
    t.is_integer()
}

/// An integer epoch count, refusing PostgreSQL's infinities.
fn epoch(v: &Value, unit: &str) -> Result<i64, String> {
    let n = v
        .as_i64()
        .ok_or_else(|| format!("expected an integer count of {unit}, got {v}"))?;
    if PG_INFINITY.contains(&n) {
        return Err(format!(
            "{n} is PostgreSQL's infinity as Debezium writes it, which no date holds"
        ));
    }
    Ok(n)
}

fn date_text(days: i64) -> Result<Value, String> {
    NaiveDate::from_ymd_opt(1970, 1, 1)
        .and_then(|e| e.checked_add_signed(TimeDelta::try_days(days)?))
        .map(|d| Value::String(d.format("%Y-%m-%d").to_string()))
        .ok_or_else(|| format!("{days} days from 1970-01-01 is out of range"))
}

fn millis_text(ms: Option<i64>) -> Result<Value, String> {
    ms.and_then(DateTime::from_timestamp_millis)
        .map(|t| Value::String(t.to_rfc3339_opts(SecondsFormat::Millis, true)))
        .ok_or_else(|| "the timestamp is out of range".to_string())
}

/// The exact text of a Connect `Decimal` (base64 of the big-endian two's
/// complement unscaled integer, with `scale`) or of Debezium's
/// `VariableScaleDecimal` (`{"scale": n, "value": base64}`).
fn decimal_text(v: &Value, scale: Option<u32>) -> Result<String, String> {
    let (bytes, scale) = match v {
        Value::String(b) => {
            let scale = scale.ok_or("encoding = \"decimal\" needs scale for base64 bytes")?;
            (b.as_str(), scale)
        }
        Value::Object(o) => {
            let b = o.get("value").and_then(Value::as_str);
            let s = o.get("scale").and_then(Value::as_u64);
            match (b, s) {
                (Some(b), Some(s)) => (b, u32::try_from(s).map_err(|_| "scale is too large")?),
                _ => return Err(format!("expected a {{scale, value}} decimal, got {v}")),
            }
        }
        other => return Err(format!("expected a base64 decimal, got {other}")),
    };
    let raw = base64::engine::general_purpose::STANDARD
        .decode(bytes)
        .map_err(|e| format!("decimal {bytes:?} is not base64: {e}"))?;
    if raw.is_empty() || raw.len() > 16 {
        return Err(format!(
            "decimal of {} bytes: graphsink reads up to 38 digits (16 bytes)",
            raw.len()
        ));
    }
    // Sign-extend the big-endian two's complement into an i128.
    let fill = if raw[0] & 0x80 != 0 { 0xff } else { 0 };
    let mut wide = [fill; 16];
    wide[16 - raw.len()..].copy_from_slice(&raw);
    Ok(scaled(i128::from_be_bytes(wide), scale))
}

/// `unscaled × 10^-scale` as exact decimal text.
fn scaled(unscaled: i128, scale: u32) -> String {
    let digits = unscaled.unsigned_abs().to_string();
    let sign = if unscaled < 0 { "-" } else { "" };
    let scale = scale as usize;
    if scale == 0 {
        return format!("{sign}{digits}");
    }
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = padded.split_at(padded.len() - scale);
    format!("{sign}{int}.{frac}")
}

/// Decimal text as the property's type reads it: the text itself for a
/// String, the nearest f64 for a float, the integer for an integer one
/// when the text has no fraction.
fn number_or_text(text: String, target: &DataType) -> Result<Value, String> {
    match target {
        DataType::Utf8 | DataType::LargeUtf8 => Ok(Value::String(text)),
        DataType::Float16 | DataType::Float32 | DataType::Float64 => text
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map(Value::Number)
            .ok_or_else(|| format!("decimal {text} is not a finite number")),
        t if t.is_integer() => {
            let whole = match text.split_once('.') {
                Some((int, frac)) if frac.bytes().all(|b| b == b'0') => int,
                Some(_) => return Err(format!("decimal {text} has a fraction, and {t} does not")),
                None => &text,
            };
            whole
                .parse::<i64>()
                .map(Value::from)
                .map_err(|_| format!("decimal {text} is not an integer that fits {t}"))
        }
        t => Err(format!("a decimal does not fit a {t} property")),
    }
}

#[cfg(test)]
mod tests {
    use arrow_schema::TimeUnit;
    use serde_json::json;

    use super::*;

    fn ts() -> DataType {
        DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()))
    }

    #[test]
    fn epochs_become_dates_and_times() {
        assert_eq!(
            decode(json!(19_000), Encoding::EpochDays, None, &DataType::Date32),
            Ok(json!("2022-01-08"))
        );
        assert_eq!(
            decode(json!(1), Encoding::EpochDays, None, &ts()),
            Ok(json!("1970-01-02T00:00:00.000Z"))
        );
        assert_eq!(
            decode(
                json!(1_559_033_904_863_123_i64),
                Encoding::EpochMicros,
                None,
                &ts()
            ),
            Ok(json!("2019-05-28T08:58:24.863Z"))
        );
        // Floored before 1970, not truncated toward zero.
        assert_eq!(
            decode(json!(-1), Encoding::EpochMicros, None, &ts()),
            Ok(json!("1969-12-31T23:59:59.999Z"))
        );
        assert_eq!(
            decode(json!(1_500_000_000), Encoding::EpochNanos, None, &ts()),
            Ok(json!("1970-01-01T00:00:01.500Z"))
        );
        assert_eq!(
            decode(json!(7), Encoding::EpochMillis, None, &DataType::Int64),
            Ok(json!(7))
        );
    }

    #[test]
    fn refused_epochs_say_why() {
        let inf = json!(9_223_372_036_825_200_000_i64);
        assert!(decode(inf, Encoding::EpochMicros, None, &ts())
            .unwrap_err()
            .contains("infinity"));
        assert!(decode(json!("x"), Encoding::EpochDays, None, &DataType::Date32).is_err());
        assert!(decode(json!(1), Encoding::EpochMillis, None, &DataType::Date32).is_err());
        assert!(decode(json!(1), Encoding::EpochDays, None, &DataType::Utf8).is_err());
    }

    #[test]
    fn decimals_keep_their_digits() {
        // SQL Server's `sal` in Debezium's docs: 0x77359400, scale 4.
        let sal = json!("dzWUAA==");
        assert_eq!(
            decode(sal.clone(), Encoding::Decimal, Some(4), &DataType::Utf8),
            Ok(json!("200000.0000"))
        );
        assert_eq!(
            decode(sal, Encoding::Decimal, Some(4), &DataType::Float64),
            Ok(json!(200000.0))
        );
        // -1 as one byte, scale 2.
        assert_eq!(
            decode(json!("/w=="), Encoding::Decimal, Some(2), &DataType::Utf8),
            Ok(json!("-0.01"))
        );
        assert_eq!(
            decode(
                json!({"scale": 0, "value": "AQ=="}),
                Encoding::Decimal,
                None,
                &DataType::Int64
            ),
            Ok(json!(1))
        );
        assert!(decode(json!("AQ=="), Encoding::Decimal, Some(1), &DataType::Int64).is_err());
        assert_eq!(
            decode(
                json!("100.00"),
                Encoding::DecimalString,
                None,
                &DataType::Int64
            ),
            Ok(json!(100))
        );
        assert!(decode(
            json!("not base64!"),
            Encoding::Decimal,
            Some(1),
            &DataType::Utf8
        )
        .is_err());
        assert_eq!(
            decode(
                json!("12.50"),
                Encoding::DecimalString,
                None,
                &DataType::Float64
            ),
            Ok(json!(12.5))
        );
        assert_eq!(
            decode(
                json!("12.50"),
                Encoding::DecimalString,
                None,
                &DataType::Utf8
            ),
            Ok(json!("12.50"))
        );
    }
}
