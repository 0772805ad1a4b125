//! Settings: the TOML file, its defaults, `${ENV}` expansion and validation.
//! Owns nothing at run time; every other module receives a checked `Config`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::error::{Error, Result};

/// The whole config file. Unknown keys anywhere are errors.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub graph: GraphSettings,
    /// librdkafka properties, passed through verbatim (`bootstrap.servers`,
    /// `group.id`, `security.protocol`, `sasl.*`, `ssl.*`, ...).
    pub kafka: BTreeMap<String, String>,
    #[serde(default)]
    pub wal: WalSettings,
    #[serde(default)]
    pub fold: FoldSettings,
    #[serde(default)]
    pub offsets: OffsetSettings,
    /// One entry per topic.
    #[serde(default, rename = "mapping")]
    pub mappings: Vec<Mapping>,
    /// Directory the config file lives in; relative paths resolve against it.
    #[serde(skip)]
    pub base_dir: PathBuf,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GraphSettings {
    /// Graph root: a local path (relative to the config file) or a URI.
    pub root: String,
    /// Path of the `.pg` schema file (relative to the config file).
    pub schema: PathBuf,
    /// Name recorded as the actor of every graph commit.
    #[serde(default = "default_actor")]
    pub actor: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WalSettings {
    /// Default buckets N per type (`bucket(id, N)`), 1..=1024. Fixed at init.
    #[serde(default = "default_buckets")]
    pub buckets: u32,
    /// Longest time a put waits for its WAL entry; bounds durable-ack latency.
    #[serde(default = "default_flush_interval", with = "humantime_serde")]
    pub flush_interval: Duration,
    /// A memtable freezes (and flushes to a generation) past this many rows.
    #[serde(default = "default_memtable_rows")]
    pub max_memtable_rows: usize,
    /// ... or past this many bytes.
    #[serde(default = "default_memtable_bytes")]
    pub max_memtable_bytes: usize,
    /// Polls whose durability is still pending before the consumer stops
    /// fetching (backpressure).
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight_polls: usize,
    /// Most records taken from the consumer into one poll batch.
    #[serde(default = "default_poll_records")]
    pub max_poll_records: usize,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FoldSettings {
    /// Fold at least this often while records are pending. `0s` disables the timer.
    #[serde(default = "default_fold_interval", with = "humantime_serde")]
    pub interval: Duration,
    /// Fold early once this many rows were written since the last fold.
    #[serde(default = "default_fold_rows")]
    pub max_pending_rows: u64,
    /// Fold early once this many value bytes were written since the last fold.
    #[serde(default = "default_fold_bytes")]
    pub max_pending_bytes: u64,
    /// Fold once more on a graceful shutdown.
    #[serde(default = "default_true")]
    pub on_shutdown: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OffsetSettings {
    /// How often durable watermarks are committed to the consumer group.
    #[serde(default = "default_commit_interval", with = "humantime_serde")]
    pub commit_interval: Duration,
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

/// One topic → one graph type.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mapping {
    pub topic: String,
    /// Node type name from the schema.
    pub node: String,
    #[serde(default)]
    pub key: KeySource,
    /// Buckets for this type, overriding `wal.buckets`.
    pub buckets: Option<u32>,
}

impl Config {
    /// Reads, expands `${VAR}` in string values, parses and validates.
    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::config(format!("cannot read {}: {e}", path.display())))?;
        let base_dir = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        Self::from_toml(&text, &base_dir)
    }

    pub fn from_toml(text: &str, base_dir: &Path) -> Result<Config> {
        let mut value: toml::Value =
            toml::from_str(text).map_err(|e| Error::config(one_line(&e.to_string())))?;
        expand_env(&mut value, "")?;
        let mut config: Config = value.try_into().map_err(|e: toml::de::Error| {
            // Parsing the raw text again gives the same error with its line.
            let located = toml::from_str::<Config>(text).err().map(|e| e.to_string());
            Error::config(one_line(&located.unwrap_or_else(|| e.to_string())))
        })?;
        config.base_dir = base_dir.to_path_buf();
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<()> {
        for key in ["bootstrap.servers", "group.id"] {
            if !self.kafka.contains_key(key) {
                return Err(Error::config(format!("kafka.\"{key}\" is required")));
            }
        }
        if let Some(v) = self.kafka.get("enable.auto.commit") {
            if v != "false" {
                return Err(Error::config(
                    "kafka.\"enable.auto.commit\" must be false: graphsink commits offsets only after durability",
                ));
            }
        }
        check_buckets("wal.buckets", self.wal.buckets)?;
        if self.wal.flush_interval.is_zero() {
            return Err(Error::config("wal.flush_interval must be positive"));
        }
        if self.wal.max_in_flight_polls == 0 || self.wal.max_poll_records == 0 {
            return Err(Error::config(
                "wal.max_in_flight_polls and wal.max_poll_records must be positive",
            ));
        }
        if self.offsets.commit_interval.is_zero() {
            return Err(Error::config("offsets.commit_interval must be positive"));
        }
        if self.mappings.is_empty() {
            return Err(Error::config("at least one [[mapping]] is required"));
        }
        let mut topics = std::collections::HashSet::new();
        for (i, m) in self.mappings.iter().enumerate() {
            if !topics.insert(m.topic.as_str()) {
                return Err(Error::config(format!(
                    "mapping[{i}].topic: topic {:?} is mapped twice",
                    m.topic
                )));
            }
            if let Some(n) = m.buckets {
                check_buckets(&format!("mapping[{i}].buckets"), n)?;
            }
        }
        Ok(())
    }

    /// The graph root as a URI Lance understands. Local paths are made
    /// absolute against the config file's directory (no filesystem access).
    pub fn root_uri(&self) -> String {
        resolve_uri(&self.graph.root, &self.base_dir)
    }

    pub fn schema_path(&self) -> PathBuf {
        if self.graph.schema.is_absolute() {
            self.graph.schema.clone()
        } else {
            self.base_dir.join(&self.graph.schema)
        }
    }

    pub fn buckets_for(&self, mapping: &Mapping) -> u32 {
        mapping.buckets.unwrap_or(self.wal.buckets)
    }
}

pub fn resolve_uri(root: &str, base_dir: &Path) -> String {
    if root.contains("://") {
        return root.trim_end_matches('/').to_string();
    }
    let p = Path::new(root);
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        let base = if base_dir.is_absolute() {
            base_dir.to_path_buf()
        } else {
            std::env::current_dir()
                .unwrap_or_else(|_| PathBuf::from("/"))
                .join(base_dir)
        };
        base.join(p)
    };
    normalize(&abs)
        .to_string_lossy()
        .trim_end_matches('/')
        .to_string()
}

/// Lexical `.`/`..` removal, so URIs stay stable without touching the disk.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}

fn check_buckets(field: &str, n: u32) -> Result<()> {
    if !(1..=1024).contains(&n) {
        return Err(Error::config(format!(
            "{field} must be in 1..=1024, got {n}"
        )));
    }
    Ok(())
}

/// Replaces `${NAME}` in every string value; a missing variable is an error
/// naming the field, so secrets never silently become empty strings.
fn expand_env(value: &mut toml::Value, path: &str) -> Result<()> {
    match value {
        toml::Value::String(s) if s.contains("${") => *s = expand_str(s, path)?,
        toml::Value::Array(items) => {
            for (i, v) in items.iter_mut().enumerate() {
                expand_env(v, &format!("{path}[{i}]"))?;
            }
        }
        toml::Value::Table(t) => {
            for (k, v) in t.iter_mut() {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                expand_env(v, &p)?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn expand_str(s: &str, field: &str) -> Result<String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| Error::config(format!("{field}: unterminated ${{ in {s:?}")))?;
        let name = &after[..end];
        let val = std::env::var(name).map_err(|_| {
            Error::config(format!("{field}: environment variable {name} is not set"))
        })?;
        out.push_str(&val);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn default_actor() -> String {
    "graphsink".into()
}
fn default_buckets() -> u32 {
    4
}
fn default_flush_interval() -> Duration {
    Duration::from_millis(20)
}
fn default_memtable_rows() -> usize {
    100_000
}
fn default_memtable_bytes() -> usize {
    64 * 1024 * 1024
}
fn default_max_in_flight() -> usize {
    16
}
fn default_poll_records() -> usize {
    5_000
}
fn default_fold_interval() -> Duration {
    Duration::from_secs(5)
}
fn default_fold_rows() -> u64 {
    200_000
}
fn default_fold_bytes() -> u64 {
    128 * 1024 * 1024
}
fn default_true() -> bool {
    true
}
fn default_commit_interval() -> Duration {
    Duration::from_secs(1)
}

impl Default for WalSettings {
    fn default() -> Self {
        Self {
            buckets: default_buckets(),
            flush_interval: default_flush_interval(),
            max_memtable_rows: default_memtable_rows(),
            max_memtable_bytes: default_memtable_bytes(),
            max_in_flight_polls: default_max_in_flight(),
            max_poll_records: default_poll_records(),
        }
    }
}

impl Default for FoldSettings {
    fn default() -> Self {
        Self {
            interval: default_fold_interval(),
            max_pending_rows: default_fold_rows(),
            max_pending_bytes: default_fold_bytes(),
            on_shutdown: true,
        }
    }
}

impl Default for OffsetSettings {
    fn default() -> Self {
        Self {
            commit_interval: default_commit_interval(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: &str = r#"
[graph]
root = "data/graph"
schema = "social.pg"
[kafka]
"bootstrap.servers" = "127.0.0.1:9092"
"group.id" = "g"
[[mapping]]
topic = "people"
node = "Person"
"#;

    #[test]
    fn defaults_apply() {
        let c = Config::from_toml(MIN, Path::new("/etc/gs")).unwrap();
        assert_eq!(c.wal.buckets, 4);
        assert_eq!(c.root_uri(), "/etc/gs/data/graph");
        assert_eq!(c.mappings[0].key, KeySource::Named(KeyOrigin::Value));
    }

    #[test]
    fn unknown_key_is_an_error() {
        let text = MIN.replace("[graph]", "[graph]\nroots = 1");
        let e = Config::from_toml(&text, Path::new("/")).unwrap_err();
        assert!(e.to_string().contains("roots"), "{e}");
    }

    #[test]
    fn env_expansion_and_missing_var() {
        std::env::set_var("GS_TEST_SECRET", "s3cr3t");
        let text = format!("{MIN}\n[kafka.x]\n");
        let _ = text;
        let t = MIN.replace("\"g\"", "\"${GS_TEST_SECRET}\"");
        let c = Config::from_toml(&t, Path::new("/")).unwrap();
        assert_eq!(c.kafka["group.id"], "s3cr3t");
        let t = MIN.replace("\"g\"", "\"${GS_TEST_NOPE_UNSET}\"");
        let e = Config::from_toml(&t, Path::new("/")).unwrap_err();
        assert!(e.to_string().contains("GS_TEST_NOPE_UNSET"), "{e}");
    }

    #[test]
    fn key_forms_parse() {
        let t = MIN.replace(
            "node = \"Person\"",
            "node = \"Person\"\nkey = { field = \"uid\" }",
        );
        let c = Config::from_toml(&t, Path::new("/")).unwrap();
        assert_eq!(
            c.mappings[0].key,
            KeySource::Field {
                field: "uid".into()
            }
        );
        let t = MIN.replace("node = \"Person\"", "node = \"Person\"\nkey = \"kafka\"");
        let c = Config::from_toml(&t, Path::new("/")).unwrap();
        assert_eq!(c.mappings[0].key, KeySource::Named(KeyOrigin::Kafka));
    }
}
