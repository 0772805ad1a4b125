//! Reading one change event: what it does (upsert a row, delete one) and
//! the row, from a Debezium envelope (with or without the JSON converter's
//! `{schema, payload}` wrapper, decided per record by looking) or from a
//! generic event whose op and row sit at configured paths.

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::rejects::RejectCode;

use super::fields::{get, take, Refusal};

/// What one event asks.
#[derive(Debug, PartialEq)]
pub(super) enum Event {
    /// Create, snapshot read or update: upsert this row.
    Upsert(Map<String, Value>),
    /// Delete the row these fields name (Debezium's `before`; `None` when
    /// the event carries no usable row, and the Kafka key must name it).
    Delete(Option<Map<String, Value>>),
}

/// A value as a JSON object, or the record's fault.
pub(super) fn object(value: &[u8]) -> Result<Map<String, Value>, Refusal> {
    super::super::json::json_object(value)
}

/// The JSON converter's `schemas.enable = true` form, `{schema, payload}`,
/// unwrapped; any other object is the payload itself.
pub(super) fn payload(mut o: Map<String, Value>) -> Result<Map<String, Value>, Refusal> {
    if o.len() == 2 && o.contains_key("schema") && o.contains_key("payload") {
        return match o.remove("payload") {
            Some(Value::Object(p)) => Ok(p),
            _ => Err((
                RejectCode::NotAnObject,
                "the converter's payload is not a JSON object".into(),
            )),
        };
    }
    Ok(o)
}

/// The parts of a Debezium event graphsink reads, taken in one serde pass
/// that skips the rest (`source`, `ts_*`, `transaction`, the converter's
/// `schema`) without building it.
#[derive(Deserialize)]
struct Parts {
    op: Option<Value>,
    before: Option<Value>,
    after: Option<Value>,
    /// The JSON converter's `schemas.enable = true` wrapper: the event.
    payload: Option<Box<Parts>>,
    #[allow(dead_code)]
    schema: Option<IgnoredAny>,
}

/// A Debezium change event (docs/cdc.md): `op` c, r, u upsert `after`;
/// d deletes what `before` names; t (truncate) is refused, as is any other
/// op. With or without the converter's `{schema, payload}`.
pub(super) fn debezium(value: &[u8]) -> Result<Event, Refusal> {
    let text = std::str::from_utf8(value)
        .map_err(|e| (RejectCode::NotUtf8, format!("value is not UTF-8: {e}")))?;
    let mut parts: Parts = serde_json::from_str(text).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => (
            RejectCode::NotAnObject,
            format!("value is not a JSON object (or its converter payload is not): {e}"),
        ),
        _ => (RejectCode::MalformedJson, format!("value is not JSON: {e}")),
    })?;
    if parts.op.is_none() && parts.before.is_none() && parts.after.is_none() {
        if let Some(inner) = parts.payload.take() {
            parts = *inner;
        }
    }
    op_event(parts.op, parts.before, parts.after)
}

/// A Debezium event's payload as a JSON object (from Avro).
pub(super) fn debezium_event(mut p: Map<String, Value>) -> Result<Event, Refusal> {
    op_event(p.remove("op"), p.remove("before"), p.remove("after"))
}

/// What a Debezium op asks of its `before` and `after`.
fn op_event(
    op: Option<Value>,
    before: Option<Value>,
    after: Option<Value>,
) -> Result<Event, Refusal> {
    let op = match op {
        Some(Value::String(op)) => op,
        Some(Value::Null) | None => {
            return Err((
                RejectCode::UnknownOp,
                "the value has no op: it is not a Debezium change event".into(),
            ))
        }
        Some(other) => {
            return Err((
                RejectCode::UnknownOp,
                format!("op {other} is not a Debezium op"),
            ))
        }
    };
    match op.as_str() {
        "c" | "r" | "u" => match after {
            Some(Value::Object(after)) => Ok(Event::Upsert(after)),
            Some(Value::Null) | None => Err((
                RejectCode::MissingAfter,
                format!("op {op:?} has no after (the row it writes)"),
            )),
            Some(other) => Err((
                RejectCode::MissingAfter,
                format!("op {op:?}: after is not an object but {}", kind(&other)),
            )),
        },
        "d" => Ok(Event::Delete(match before {
            Some(Value::Object(before)) => Some(before),
            _ => None,
        })),
        "t" => Err((
            RejectCode::UnsupportedOp,
            "op \"t\" (truncate) names no rows: graphsink does not empty a type from one \
             topic's event (docs/cdc.md)"
                .into(),
        )),
        other => Err((
            RejectCode::UnknownOp,
            format!("op {other:?} is not one of c, r, u, d"),
        )),
    }
}

/// A generic change event: the op at `op` (tokens), a delete when its text
/// is one of `deletes`, the row at `data` (empty: the whole value, less
/// the op field).
pub(super) fn op_field(
    value: &[u8],
    op: &[String],
    deletes: &[String],
    data: &[String],
) -> Result<Event, Refusal> {
    let mut o = payload(object(value)?)?;
    let pointer = || format!("/{}", op.join("/"));
    let op_text = match get(&o, op) {
        Some(Value::String(s)) => s.clone(),
        Some(v @ (Value::Bool(_) | Value::Number(_))) => v.to_string(),
        Some(Value::Null) | None => {
            return Err((RejectCode::UnknownOp, format!("no op at {}", pointer())))
        }
        Some(other) => {
            return Err((
                RejectCode::UnknownOp,
                format!("the op at {} is {}, not a scalar", pointer(), kind(other)),
            ))
        }
    };
    // The op is not a property of the row it sits in.
    if op.starts_with(data) {
        take(&mut o, op);
    }
    let row = if data.is_empty() {
        Some(o)
    } else {
        match take(&mut o, data) {
            Some(Value::Object(row)) => Some(row),
            _ => None,
        }
    };
    if deletes.contains(&op_text) {
        return Ok(Event::Delete(row));
    }
    row.map(Event::Upsert).ok_or_else(|| {
        (
            RejectCode::MissingAfter,
            format!("op {op_text:?} has no row at /{}", data.join("/")),
        )
    })
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
