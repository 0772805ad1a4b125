//! What a mapping makes of a record's value: the value schema (the typed
//! fields a format decodes into) and its `Shape` (where the id and the
//! endpoints come from). Fixed when the decoder is built; read by every
//! stage after.

use arrow_schema::Field;

use crate::config::{KeyOrigin, KeySource, Mapping};
use crate::error::{Error, Result};
use crate::schema::{GraphSchema, GraphType};

/// How an edge record's id is made: never random, so a replayed record
/// upserts the row it made before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum EdgeId {
    /// The Kafka key, verbatim.
    Kafka,
    /// `[src, dst]` as a JSON array, under `@unique(src, dst)`.
    Endpoints,
    /// `topic/partition/offset`.
    Coordinates,
}

/// Where one edge endpoint comes from in the value.
#[derive(Debug, Clone)]
pub(super) struct Endpoint {
    pub(super) field: String,
    /// Parts of the endpoint node type's `@key`; >1 is a composite endpoint,
    /// which the format hands over as a Utf8 column of its canonical text
    /// (format.rs).
    pub(super) width: usize,
}

#[derive(Debug, Clone)]
pub(super) enum Shape {
    Node(KeySource),
    Edge {
        id: EdgeId,
        src: Endpoint,
        dst: Endpoint,
    },
}

impl Shape {
    /// The endpoints whose node type has a composite `@key` (src first):
    /// not in the value schema, each a Utf8 column of canonical text in
    /// what the format decodes.
    pub(super) fn composite_endpoints(&self) -> Vec<Endpoint> {
        match self {
            Shape::Node(_) => vec![],
            Shape::Edge { src, dst, .. } => [src, dst]
                .into_iter()
                .filter(|e| e.width > 1)
                .cloned()
                .collect(),
        }
    }
}

/// The value schema of a node mapping: the properties, key ones relaxed to
/// nullable when the key comes from elsewhere.
pub(super) fn node_fields(ty: &GraphType, mapping: &Mapping) -> Result<(Vec<Field>, Shape)> {
    let key = mapping.node_key();
    let relax = !matches!(key, KeySource::Named(KeyOrigin::Value));
    let mut fields: Vec<Field> = ty
        .properties
        .fields()
        .iter()
        .map(|f| {
            let f = f.as_ref().clone();
            if relax && ty.key.contains(f.name()) {
                f.with_nullable(true)
            } else {
                f
            }
        })
        .collect();
    if let KeySource::Field { field } = &key {
        if ty.properties.field_with_name(field).is_err() {
            if ty.key.len() != 1 {
                return Err(Error::config(format!(
                    "mapping for topic {}: key field {field:?} must name a property when {} has a composite @key",
                    mapping.topic, ty.name
                )));
            }
            let kt = ty
                .properties
                .field_with_name(&ty.key[0])
                .expect("key is a property");
            fields.push(Field::new(field, kt.data_type().clone(), true));
        } else if ty.key.len() != 1 || &ty.key[0] != field {
            return Err(Error::config(format!(
                "mapping for topic {}: key field {field:?} is a property but not the @key of {}",
                mapping.topic, ty.name
            )));
        }
    }
    Ok((fields, Shape::Node(key)))
}

/// The value schema of an edge mapping: the properties plus each single-part
/// endpoint field, typed as its node's key.
pub(super) fn edge_fields(
    schema: &GraphSchema,
    ty: &GraphType,
    mapping: &Mapping,
) -> Result<(Vec<Field>, Shape)> {
    let ends = ty.ends.as_ref().expect("edges have ends");
    let mut fields: Vec<Field> = ty
        .properties
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    let mut endpoint = |field: &str, node: &str| -> Result<Endpoint> {
        if ty.properties.field_with_name(field).is_ok() {
            return Err(Error::config(format!(
                "mapping for topic {}: endpoint field {field:?} is also a property of {}",
                mapping.topic, ty.name
            )));
        }
        let n = schema.get(node).expect("catalog checked endpoint types");
        if n.key.len() == 1 {
            let kt = n
                .properties
                .field_with_name(&n.key[0])
                .expect("key is a property");
            fields.push(Field::new(field, kt.data_type().clone(), true));
        }
        Ok(Endpoint {
            field: field.to_string(),
            width: n.key.len(),
        })
    };
    let src = endpoint(mapping.src_field(), &ends.from)?;
    let dst = endpoint(mapping.dst_field(), &ends.to)?;
    let id = match mapping.key {
        Some(KeySource::Named(KeyOrigin::Kafka)) => EdgeId::Kafka,
        _ if ty.unique_endpoints() => EdgeId::Endpoints,
        _ => EdgeId::Coordinates,
    };
    Ok((fields, Shape::Edge { id, src, dst }))
}
