//! `[mapping.fields]` and pointer keys and endpoints: a row (the value, or
//! an envelope's `after`) → the flat JSON object of the value schema's
//! names that the JSON format decodes. Each mapped path is taken out of
//! the row; what is left keeps its names, and `unknown_fields` judges it
//! as for any value.

use std::collections::HashMap;

use arrow_schema::{DataType, Schema};
use serde_json::{Map, Value};

use crate::config::{pointer_tokens, Encoding, Mapping};
use crate::error::{Error, Result};
use crate::rejects::RejectCode;
use crate::schema::GraphType;

use super::super::shape::Shape;
use super::encodings;

/// One value-schema column taken from a path.
struct Mapped {
    /// The value schema's name: the property's, or the pointer itself for
    /// a key field or an endpoint given as a pointer.
    column: String,
    pointer: String,
    tokens: Vec<String>,
    encoding: Option<(Encoding, Option<u32>)>,
    target: DataType,
    /// The reject when the path holds nothing, if the column is required.
    missing: Option<RejectCode>,
}

pub(super) struct Fields {
    mapped: Vec<Mapped>,
    /// Mapped properties by name: a top-level field of the same name is
    /// not read (it is unknown), and reject messages name the path.
    by_column: HashMap<String, usize>,
    reject_unknown: bool,
}

/// A record's fault: its code and message.
pub(super) type Refusal = (RejectCode, String);

impl Fields {
    /// The mapping's paths, checked against the type and the value schema
    /// the format decodes (shape.rs).
    pub(super) fn new(
        mapping: &Mapping,
        ty: &GraphType,
        shape: &Shape,
        values: &Schema,
    ) -> Result<Fields> {
        let mut mapped = Vec::new();
        for (p, source) in &mapping.fields {
            if ty.properties.field_with_name(p).is_err() {
                return Err(Error::config(format!(
                    "mapping for topic {}: fields.{p} is not a property of {}",
                    mapping.topic, ty.name
                )));
            }
            mapped.push((p.clone(), source.pointer(p), source.encoding()));
        }
        let pointed = [
            mapping.key_field(),
            mapping.src.as_deref(),
            mapping.dst.as_deref(),
        ];
        for p in pointed.into_iter().flatten().filter(|p| p.starts_with('/')) {
            mapped.push((p.to_string(), p.to_string(), None));
        }
        let mapped = mapped
            .into_iter()
            .map(|(column, pointer, encoding)| {
                let f = values.field_with_name(&column).map_err(|_| {
                    Error::Bug(format!(
                        "{column} is not in the value schema of {}",
                        ty.name
                    ))
                })?;
                let missing = (!f.is_nullable()).then(|| {
                    if ty.key.contains(&column) {
                        RejectCode::MissingKey
                    } else {
                        RejectCode::MissingRequired
                    }
                });
                let missing = match shape {
                    Shape::Edge { src, dst, .. } if column == src.field || column == dst.field => {
                        Some(RejectCode::MissingEndpoint)
                    }
                    // Nullable in the value schema (the key may come from
                    // elsewhere), but this mapping takes it from here.
                    Shape::Node(_) if mapping.key_field() == Some(column.as_str()) => {
                        Some(RejectCode::MissingKey)
                    }
                    _ => missing,
                };
                Ok(Mapped {
                    tokens: pointer_tokens(&pointer).map_err(Error::config)?,
                    column,
                    pointer,
                    encoding,
                    target: f.data_type().clone(),
                    missing,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let by_column = mapped
            .iter()
            .enumerate()
            .map(|(i, m)| (m.column.clone(), i))
            .collect();
        Ok(Fields {
            mapped,
            by_column,
            reject_unknown: mapping.unknown_fields == crate::config::UnknownFields::Reject,
        })
    }

    /// The row with every mapped path taken to its column and decoded from
    /// its encoding, and the rest under its own names.
    pub(super) fn rewrite(
        &self,
        mut row: Map<String, Value>,
    ) -> Result<Map<String, Value>, Refusal> {
        if self.mapped.is_empty() {
            return Ok(row);
        }
        let mut out = Map::with_capacity(row.len());
        for m in &self.mapped {
            match take(&mut row, &m.tokens) {
                None | Some(Value::Null) => {
                    if let Some(code) = m.missing {
                        return Err((
                            code,
                            format!("{} (from {}) is missing or null", m.column, m.pointer),
                        ));
                    }
                }
                Some(v) => {
                    let v = match m.encoding {
                        Some((e, scale)) => {
                            encodings::decode(v, e, scale, &m.target).map_err(|why| {
                                (RejectCode::WrongType, format!("{}: {why}", m.pointer))
                            })?
                        }
                        None => v,
                    };
                    out.insert(m.column.clone(), v);
                }
            }
        }
        for (k, v) in row {
            if let Some(&i) = self.by_column.get(&k) {
                if self.reject_unknown {
                    return Err((
                        RejectCode::UnknownField,
                        format!(
                            "field {k:?} is not read: property {k} comes from {}",
                            self.mapped[i].pointer
                        ),
                    ));
                }
                continue;
            }
            out.insert(k, v);
        }
        Ok(out)
    }

    /// A later stage's message about a mapped column, naming its path too
    /// (`name: expected a string` → `name (from /customer/full_name): …`).
    pub(super) fn explain(&self, message: String) -> String {
        let Some((column, rest)) = message.split_once(": ") else {
            return message;
        };
        match self.by_column.get(column) {
            Some(&i) if self.mapped[i].column != self.mapped[i].pointer => {
                format!("{column} (from {}): {rest}", self.mapped[i].pointer)
            }
            _ => message,
        }
    }
}

/// Takes the value at `tokens` out of `row`, dropping objects it leaves
/// empty. Through an array the element is copied, and the array stays (so
/// under `unknown_fields = "reject"` a path into an array needs the rest
/// of that array mapped or ignored).
pub(super) fn take(row: &mut Map<String, Value>, tokens: &[String]) -> Option<Value> {
    let (first, rest) = tokens.split_first()?;
    if rest.is_empty() {
        return row.remove(first);
    }
    match row.get_mut(first)? {
        Value::Object(child) => {
            let v = take(child, rest);
            if child.is_empty() {
                row.remove(first);
            }
            v
        }
        Value::Array(items) => {
            let (index, rest) = rest.split_first()?;
            walk(items.get(index.parse::<usize>().ok()?)?, rest).cloned()
        }
        _ => None,
    }
}

/// The value at `tokens` in `row`, read (for ids of deletes and keys).
pub(super) fn get<'a>(row: &'a Map<String, Value>, tokens: &[String]) -> Option<&'a Value> {
    let (first, rest) = tokens.split_first()?;
    walk(row.get(first)?, rest)
}

/// The value at `tokens` below `v`.
fn walk<'a>(mut v: &'a Value, tokens: &[String]) -> Option<&'a Value> {
    for t in tokens {
        v = match v {
            Value::Object(o) => o.get(t)?,
            Value::Array(a) => a.get(t.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(v)
}
