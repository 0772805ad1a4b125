//! `[[mapping]]`: what each topic's records become, and the policies a
//! mapping chooses (formats, keys, unknown fields, numbers, endpoints, deletes).

use super::*;

/// Fields of a JSON value that its type does not declare.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnknownFields {
    /// Reject the record as `unknown_field`: nothing is dropped silently.
    #[default]
    Reject,
    /// Ignore them.
    Ignore,
}
/// How strictly JSON numbers must match a numeric property.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Coerce {
    /// A numeric property takes a JSON number only; an integer property
    /// only an integral one (`3.5` and `"12"` are `wrong_type`).
    #[default]
    Strict,
    /// Numeric strings parse (`"12"` → 12, `"1.5"` → 1.5) and a fractional
    /// number for an integer property is truncated toward zero (3.5 → 3).
    Lenient,
}
/// A mapping's value encoding.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ValueFormatName {
    /// A JSON object per record (today's path).
    #[default]
    Json,
    /// Avro, framed with the registry's schema id.
    Avro,
    /// Protobuf, framed with the schema id and the message indexes.
    Protobuf,
    /// JSON, framed with the schema id of a JSON Schema.
    JsonSchema,
}
impl ValueFormatName {
    /// Whether records carry the Confluent wire format's schema id. Every
    /// name says so here: a new format decides.
    pub fn uses_registry(self) -> bool {
        match self {
            ValueFormatName::Json => false,
            ValueFormatName::Avro | ValueFormatName::Protobuf | ValueFormatName::JsonSchema => true,
        }
    }
}
/// A mapping's key encoding.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyFormatName {
    /// UTF-8 text, or a JSON string, or a JSON array for a composite key.
    #[default]
    Json,
    /// The key's UTF-8 bytes, verbatim.
    String,
    Avro,
    Protobuf,
    JsonSchema,
}
impl KeyFormatName {
    pub fn uses_registry(self) -> bool {
        matches!(
            self,
            KeyFormatName::Avro | KeyFormatName::Protobuf | KeyFormatName::JsonSchema
        )
    }
}
/// An edge whose endpoint node is not in the graph (yet).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EndpointPolicy {
    /// Keep it pending, retry at every fold, reject once older than
    /// `endpoint_deadline`.
    #[default]
    Defer,
    /// Reject it at the first fold that misses the endpoint.
    Reject,
}
/// A node delete while committed edges still reference the node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeletePolicy {
    /// Reject the delete (`referenced`); the node stays.
    #[default]
    Reject,
    /// Delete the referencing edges in the same graph commit.
    Cascade,
}
/// Where a node's `@key` comes from.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum KeySource {
    /// `"value"` (the type's `@key` properties in the JSON value) or `"kafka"`
    /// (the Kafka message key: a string, or a JSON array for a composite key).
    Named(KeyOrigin),
    /// `{ field = "name" }`: a named field of the JSON value (a scalar, or a
    /// JSON array for a composite key).
    Field { field: String },
}
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyOrigin {
    Value,
    Kafka,
}
impl Default for KeySource {
    fn default() -> Self {
        KeySource::Named(KeyOrigin::Value)
    }
}
/// One topic → one graph type (a node or an edge type).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mapping {
    pub topic: String,
    /// Node type name from the schema (exactly one of `node`, `edge`;
    /// `feeds` reads them as one).
    #[serde(default)]
    pub node: Option<String>,
    /// Edge type name from the schema.
    #[serde(default)]
    pub edge: Option<String>,
    /// Nodes: where the `@key` comes from (default `"value"`). Edges: only
    /// `"kafka"` (the Kafka key is the edge id); unset, the id is `(src,
    /// dst)` under `@unique(src, dst)`, else `topic/partition/offset`.
    pub key: Option<KeySource>,
    /// Edges: the value's field holding the source node's key (default
    /// `"src"`): a scalar, or a JSON array for a composite key.
    pub src: Option<String>,
    /// Edges: the value's field holding the destination node's key (default `"dst"`).
    pub dst: Option<String>,
    /// Buckets for this type, overriding `wal.buckets`.
    pub buckets: Option<u32>,
    #[serde(default)]
    pub unknown_fields: UnknownFields,
    /// Whether numeric properties take numeric strings and fractions.
    #[serde(default)]
    pub coerce: Coerce,
    /// How the record value is encoded: `"json"` (default), or a Schema
    /// Registry format in the Confluent wire format (docs/formats.md).
    #[serde(default)]
    pub format: ValueFormatName,
    /// How the record key is encoded, where a key is read (`key =
    /// "kafka"`, tombstones, partition sharding): `"json"` (default: text,
    /// a JSON string, or a JSON array for a composite key), `"string"`
    /// (the UTF-8 bytes verbatim), or a registry format.
    #[serde(default)]
    pub key_format: KeyFormatName,
    /// Protobuf: the fully qualified message type, when the subject's
    /// schema declares several; unset, the frame's message indexes decide.
    pub message: Option<String>,
    /// Edges: what a missing endpoint does.
    #[serde(default)]
    pub on_missing_endpoint: EndpointPolicy,
    /// Edges, under `defer`: how long a pending edge waits for its endpoints.
    #[serde(default = "default_endpoint_deadline", with = "humantime_serde")]
    pub endpoint_deadline: Duration,
    /// Nodes: what deleting a node that committed edges reference does.
    #[serde(default)]
    pub on_delete_referenced: DeletePolicy,
    /// Overrides `errors.dead_letter_topic` for this topic's rejects.
    pub dead_letter_topic: Option<String>,
    /// How the value carries its row: `"none"` (default), `"debezium"`,
    /// `"op_field"` (config/change.rs).
    #[serde(default)]
    pub envelope: EnvelopeName,
    /// `op_field`: the JSON Pointer of the operation.
    pub op_path: Option<String>,
    /// `op_field`: the op values that mean a delete.
    #[serde(default)]
    pub delete_when: Vec<OpValue>,
    /// `op_field`: the JSON Pointer of the row (unset: the whole value).
    pub data_path: Option<String>,
    /// `[mapping.fields]`: property → JSON Pointer (or `{ path, encoding,
    /// scale }`), read after the envelope is unwrapped.
    #[serde(default)]
    pub fields: BTreeMap<String, FieldSource>,
}
/// What a mapping's records become.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feeds<'a> {
    /// Nodes of this type.
    Node(&'a str),
    /// Edges of this type.
    Edge(&'a str),
}
impl Mapping {
    /// The graph type this mapping feeds.
    pub(super) fn validate(&self, i: usize) -> Result<()> {
        let m = self;
        if let Some(n) = m.buckets {
            check_buckets(&format!("mapping[{i}].buckets"), n)?;
        }
        match m.feeds() {
            None => {
                return Err(Error::config(format!(
                    "mapping[{i}]: set exactly one of node and edge"
                )))
            }
            Some(Feeds::Node(_)) if m.src.is_some() || m.dst.is_some() => {
                return Err(Error::config(format!(
                    "mapping[{i}]: src and dst are for edge mappings"
                )))
            }
            Some(Feeds::Edge(_)) => {
                if !matches!(m.key, None | Some(KeySource::Named(KeyOrigin::Kafka))) {
                    return Err(Error::config(format!(
                        "mapping[{i}].key: an edge's key can only be \"kafka\" (the Kafka key is the edge id)"
                    )));
                }
                if m.src_field() == m.dst_field() {
                    return Err(Error::config(format!(
                        "mapping[{i}]: src and dst name the same field"
                    )));
                }
            }
            _ => {}
        }
        if m.message.is_some()
            && m.format != ValueFormatName::Protobuf
            && m.key_format != KeyFormatName::Protobuf
        {
            return Err(Error::config(format!(
                "mapping[{i}].message names a Protobuf message type, but neither format nor key_format is \"protobuf\""
            )));
        }
        m.validate_change(i)?;
        if m.dead_letter_topic.as_deref() == Some("") {
            return Err(Error::config(format!(
                "mapping[{i}].dead_letter_topic must not be empty"
            )));
        }
        Ok(())
    }

    /// The type this mapping feeds: a node type or an edge type (`None`
    /// when the file sets neither or both, which `validate` refuses).
    pub fn feeds(&self) -> Option<Feeds<'_>> {
        match (self.node.as_deref(), self.edge.as_deref()) {
            (Some(n), None) if !n.is_empty() => Some(Feeds::Node(n)),
            (None, Some(e)) if !e.is_empty() => Some(Feeds::Edge(e)),
            _ => None,
        }
    }

    pub fn type_name(&self) -> &str {
        match self.feeds() {
            Some(Feeds::Node(t) | Feeds::Edge(t)) => t,
            None => "",
        }
    }

    pub fn is_edge(&self) -> bool {
        matches!(self.feeds(), Some(Feeds::Edge(_)))
    }

    /// The node key source (nodes only).
    pub fn node_key(&self) -> KeySource {
        self.key.clone().unwrap_or_default()
    }

    pub fn src_field(&self) -> &str {
        self.src.as_deref().unwrap_or("src")
    }

    pub fn dst_field(&self) -> &str {
        self.dst.as_deref().unwrap_or("dst")
    }
}
/// `Mapping::validate` for tests elsewhere in the crate.
#[cfg(test)]
pub(crate) fn validate_mapping_for_tests(m: &Mapping) -> Result<()> {
    m.validate(0)
}

pub(super) fn default_endpoint_deadline() -> Duration {
    Duration::from_secs(600)
}
