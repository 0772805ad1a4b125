//! A mapping's change-stream settings: the `envelope` its values arrive in
//! (`none`, `debezium`, `op_field`), and `[mapping.fields]`, which property
//! comes from which JSON Pointer and in which encoding (docs/cdc.md).

use super::*;

/// How a record's value carries its row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EnvelopeName {
    /// The value is the row; a tombstone deletes (today's behaviour).
    #[default]
    None,
    /// A Debezium change event, `{before, after, op, source, ts_ms}`, with
    /// or without the JSON converter's `{schema, payload}` wrapper.
    Debezium,
    /// A generic change event: `op_path` names the operation,
    /// `delete_when` the values that mean a delete, `data_path` the row.
    OpField,
}

/// A value of `delete_when`: compared with the op's JSON value (a string
/// with its text, `true` with `true` or `"true"`, a number likewise).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum OpValue {
    Text(String),
    Flag(bool),
    Number(i64),
}

impl OpValue {
    /// The text an op value matches.
    pub fn text(&self) -> String {
        match self {
            OpValue::Text(s) => s.clone(),
            OpValue::Flag(b) => b.to_string(),
            OpValue::Number(n) => n.to_string(),
        }
    }
}

/// How a property's value is written in the source, where it differs from
/// graphsink's JSON (docs/cdc.md, the encodings table). Debezium's and
/// Kafka Connect's logical type names are accepted as aliases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    /// An integer count of days since 1970-01-01.
    #[serde(
        alias = "io.debezium.time.Date",
        alias = "org.apache.kafka.connect.data.Date"
    )]
    EpochDays,
    /// An integer count of milliseconds since the epoch.
    #[serde(
        alias = "io.debezium.time.Timestamp",
        alias = "org.apache.kafka.connect.data.Timestamp"
    )]
    EpochMillis,
    /// Microseconds since the epoch (sub-millisecond digits are floored off).
    #[serde(alias = "io.debezium.time.MicroTimestamp")]
    EpochMicros,
    /// Nanoseconds since the epoch (floored to milliseconds).
    #[serde(alias = "io.debezium.time.NanoTimestamp")]
    EpochNanos,
    /// Kafka Connect's `Decimal`: the big-endian two's-complement unscaled
    /// integer as base64 (the JSON converter's bytes), with `scale`; or
    /// Debezium's `VariableScaleDecimal` object `{scale, value}`.
    #[serde(
        alias = "org.apache.kafka.connect.data.Decimal",
        alias = "io.debezium.data.VariableScaleDecimal"
    )]
    Decimal,
    /// A decimal as text (`decimal.handling.mode = "string"`): kept exact
    /// for a String property, parsed for a numeric one.
    DecimalString,
}

/// Where one property comes from: a JSON Pointer, or a table with an
/// encoding.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum FieldSource {
    /// `name = "/customer/full_name"` (a bare name is a top-level field).
    Path(String),
    /// `created = { path = "/created_at", encoding = "epoch_micros" }`.
    Spec(FieldSpec),
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FieldSpec {
    /// Unset: the property's own name at the top level.
    pub path: Option<String>,
    pub encoding: Option<Encoding>,
    /// `encoding = "decimal"`: digits after the point (Connect's
    /// `parameters.scale`).
    pub scale: Option<u32>,
}

impl FieldSource {
    /// The pointer, given the property's name.
    pub fn pointer(&self, property: &str) -> String {
        match self {
            FieldSource::Path(p) => as_pointer(p),
            FieldSource::Spec(s) => s
                .path
                .as_deref()
                .map_or_else(|| escaped(property), as_pointer),
        }
    }

    pub fn encoding(&self) -> Option<(Encoding, Option<u32>)> {
        match self {
            FieldSource::Path(_) => None,
            FieldSource::Spec(s) => s.encoding.map(|e| (e, s.scale)),
        }
    }
}

/// A path as a JSON Pointer: one starting with `/` as it is, a bare name
/// as the top-level field of that name.
pub(crate) fn as_pointer(path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else {
        escaped(path)
    }
}

/// Whether a mapping's `key` field, `src` or `dst` is a pointer rather
/// than a field name.
pub(crate) fn is_pointer(path: &str) -> bool {
    path.starts_with('/')
}

fn escaped(name: &str) -> String {
    format!("/{}", name.replace('~', "~0").replace('/', "~1"))
}

/// The reference tokens of a pointer (RFC 6901), or why it is not one.
pub(crate) fn pointer_tokens(pointer: &str) -> std::result::Result<Vec<String>, String> {
    let Some(rest) = pointer.strip_prefix('/') else {
        return Err(format!(
            "{pointer:?} is not a JSON Pointer (it must start with /)"
        ));
    };
    rest.split('/')
        .map(|t| {
            let mut out = String::with_capacity(t.len());
            let mut chars = t.chars();
            while let Some(c) = chars.next() {
                match c {
                    '~' => match chars.next() {
                        Some('0') => out.push('~'),
                        Some('1') => out.push('/'),
                        _ => return Err(format!("{pointer:?}: ~ must be followed by 0 or 1")),
                    },
                    c => out.push(c),
                }
            }
            Ok(out)
        })
        .collect()
}

impl Mapping {
    /// The envelope settings and `[mapping.fields]`, checked on their own
    /// (against the type at decoder build: `decode::envelope`).
    pub(super) fn validate_change(&self, i: usize) -> Result<()> {
        let at = |what: &str| format!("mapping[{i}].{what}");
        let op_settings =
            self.op_path.is_some() || !self.delete_when.is_empty() || self.data_path.is_some();
        match self.envelope {
            EnvelopeName::OpField => {
                let Some(op) = &self.op_path else {
                    return Err(Error::config(format!(
                        "{}: envelope = \"op_field\" needs op_path (where the operation is)",
                        at("op_path")
                    )));
                };
                check_pointer(&at("op_path"), op)?;
                if self.delete_when.is_empty() {
                    return Err(Error::config(format!(
                        "{}: envelope = \"op_field\" needs the op values that mean a delete",
                        at("delete_when")
                    )));
                }
                if let Some(d) = self.data_path.as_deref().filter(|d| !d.is_empty()) {
                    check_pointer(&at("data_path"), d)?;
                }
            }
            _ if op_settings => {
                return Err(Error::config(format!(
                    "{}: op_path, delete_when and data_path are for envelope = \"op_field\"",
                    at("envelope")
                )))
            }
            _ => {}
        }
        let changes = self.envelope != EnvelopeName::None || self.maps_fields();
        if changes && !matches!(self.format, ValueFormatName::Json) {
            let allowed =
                self.envelope == EnvelopeName::Debezium && self.format == ValueFormatName::Avro;
            if !allowed {
                return Err(Error::config(format!(
                    "{}: envelopes and field paths read JSON values (format = \"json\"), \
                     or Debezium events in Avro (format = \"avro\", envelope = \"debezium\")",
                    at("format")
                )));
            }
        }
        if self.envelope != EnvelopeName::None
            && !matches!(self.key_format, KeyFormatName::Json)
            && self.format == ValueFormatName::Json
        {
            return Err(Error::config(format!(
                "{}: a change stream's JSON keys are read as key_format = \"json\"",
                at("key_format")
            )));
        }
        self.validate_paths(i)
    }

    /// `[mapping.fields]` and pointer keys and endpoints: each a pointer,
    /// `scale` only with `decimal`, and no two paths where one holds the
    /// other.
    fn validate_paths(&self, i: usize) -> Result<()> {
        let at = |what: &str| format!("mapping[{i}].{what}");
        let mut pointers: Vec<(String, String)> = Vec::new();
        for (p, source) in &self.fields {
            let ptr = source.pointer(p);
            check_pointer(&at(&format!("fields.{p}")), &ptr)?;
            match source.encoding() {
                Some((Encoding::Decimal, None)) => {
                    // Debezium's VariableScaleDecimal carries its own scale.
                }
                Some((e, Some(_))) if e != Encoding::Decimal => {
                    return Err(Error::config(format!(
                        "{}: scale is for encoding = \"decimal\"",
                        at(&format!("fields.{p}"))
                    )))
                }
                _ => {}
            }
            pointers.push((format!("fields.{p}"), ptr));
        }
        for (what, path) in [
            ("key.field", self.key_field()),
            ("src", self.src.as_deref()),
            ("dst", self.dst.as_deref()),
        ] {
            if let Some(p) = path.filter(|p| is_pointer(p)) {
                check_pointer(&at(what), p)?;
                pointers.push((what.to_string(), p.to_string()));
            }
        }
        for (a, (wa, pa)) in pointers.iter().enumerate() {
            for (wb, pb) in &pointers[..a] {
                let nested = |x: &str, y: &str| x == y || y.starts_with(&format!("{x}/"));
                if nested(pa, pb) || nested(pb, pa) {
                    return Err(Error::config(format!(
                        "mapping[{i}]: {wa} ({pa}) and {wb} ({pb}) take the same value, or one holds the other"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Whether any property, key or endpoint is taken by a path or decoded
    /// from an encoding (the value is rewritten before decoding).
    pub fn maps_fields(&self) -> bool {
        !self.fields.is_empty()
            || [self.key_field(), self.src.as_deref(), self.dst.as_deref()]
                .into_iter()
                .flatten()
                .any(is_pointer)
    }

    /// `key = { field = ... }`'s field, if set.
    pub fn key_field(&self) -> Option<&str> {
        match &self.key {
            Some(KeySource::Field { field }) => Some(field),
            _ => None,
        }
    }
}

fn check_pointer(at: &str, pointer: &str) -> Result<()> {
    match pointer_tokens(pointer) {
        Ok(tokens) if tokens.iter().all(|t| !t.is_empty()) => Ok(()),
        Ok(_) => Err(Error::config(format!(
            "{at}: {pointer:?} has an empty step"
        ))),
        Err(m) => Err(Error::config(format!("{at}: {m}"))),
    }
}
