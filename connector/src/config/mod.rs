//! Settings: the TOML file, its defaults, `${ENV}` expansion and validation.
//! Owns nothing at run time; every other module receives a checked `Config`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::error::{Error, PublicResult, Result};
use crate::redact;

mod change;
mod env;
mod graph;
mod mapping;
mod sections;
#[cfg(test)]
mod tests;
mod wal;

pub use change::*;
pub(crate) use env::*;
pub use graph::*;
pub use mapping::*;
pub use sections::*;
pub use wal::*;

/// The whole config file. Unknown keys anywhere are errors. `Debug` masks
/// secret values (`redact`).
#[derive(Clone, Deserialize)]
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
    #[serde(default)]
    pub errors: ErrorSettings,
    #[serde(default)]
    pub retention: RetentionSettings,
    #[serde(default)]
    pub http: HttpSettings,
    #[serde(default)]
    pub log: LogSettings,
    #[serde(default)]
    pub runtime: RuntimeSettings,
    /// Where registry formats (`format = "avro"`, ...) resolve schema ids.
    #[serde(default)]
    pub schema_registry: SchemaRegistrySettings,
    /// One entry per topic.
    #[serde(default, rename = "mapping")]
    pub mappings: Vec<Mapping>,
    /// Directory the config file lives in; relative paths resolve against it.
    #[serde(skip)]
    pub base_dir: PathBuf,
}
impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("graph", &self.graph)
            .field("kafka", &redact::props(&self.kafka))
            .field("wal", &self.wal)
            .field("fold", &self.fold)
            .field("offsets", &self.offsets)
            .field("errors", &self.errors)
            .field("retention", &self.retention)
            .field("http", &self.http)
            .field("log", &self.log)
            .field("runtime", &self.runtime)
            .field("schema_registry", &self.schema_registry)
            .field("mappings", &self.mappings)
            .field("base_dir", &self.base_dir)
            .finish()
    }
}
impl Config {
    /// `[log] format` of a config file, read before anything else (logging
    /// starts before the config is loaded); `None` when it cannot be read.
    pub fn log_format_of(path: &Path) -> Option<LogFormat> {
        early_section(path, "log")?
            .get("format")?
            .clone()
            .try_into()
            .ok()
    }

    /// `[runtime]` of a config file, read before the runtime is built;
    /// the defaults when it cannot be read (the full load then says why).
    pub fn runtime_of(path: &Path) -> RuntimeSettings {
        early_section(path, "runtime")
            .and_then(|v| v.try_into::<RuntimeSettings>().ok())
            .filter(|s| s.validate().is_ok())
            .unwrap_or_default()
    }

    /// Reads, expands `${VAR}` in string values, parses and validates.
    pub fn load(path: &Path) -> PublicResult<Config> {
        let (text, base_dir) = read_file(path)?;
        Self::from_toml(&text, &base_dir)
    }

    /// `[graph]` alone, for the commands that only read the graph (`read`,
    /// `neighbors`, `log`, `show`, `rejects`): no other section is resolved
    /// or checked, so a `${VAR}` that only Kafka's settings use need not be
    /// set where the graph is read. Every other section is its default,
    /// with no `[kafka]` and no mapping: not a config to run with.
    pub(crate) fn load_for_reads(path: &Path) -> Result<Config> {
        let (text, base_dir) = read_file(path)?;
        Self::graph_of_toml(&text, &base_dir)
    }

    fn graph_of_toml(text: &str, base_dir: &Path) -> Result<Config> {
        let mut file: toml::Table =
            toml::from_str(text).map_err(|e| Error::config(one_line(&e.to_string())))?;
        let mut graph = file
            .remove("graph")
            .ok_or_else(|| Error::config("missing section [graph]"))?;
        expand_env(&mut graph, "graph")?;
        let graph: GraphSettings = graph.try_into().map_err(|e: toml::de::Error| {
            Error::config(format!("graph: {}", one_line(&e.to_string())))
        })?;
        let config = Config {
            graph,
            kafka: BTreeMap::new(),
            wal: WalSettings::default(),
            fold: FoldSettings::default(),
            offsets: OffsetSettings::default(),
            errors: ErrorSettings::default(),
            retention: RetentionSettings::default(),
            http: HttpSettings::default(),
            log: LogSettings::default(),
            runtime: RuntimeSettings::default(),
            schema_registry: SchemaRegistrySettings::default(),
            mappings: Vec::new(),
            base_dir: base_dir.to_path_buf(),
        };
        config.register_secrets();
        config.validate_root()?;
        Ok(config)
    }

    pub fn from_toml(text: &str, base_dir: &Path) -> PublicResult<Config> {
        let mut value: toml::Value =
            toml::from_str(text).map_err(|e| Error::config(one_line(&e.to_string())))?;
        expand_env(&mut value, "")?;
        let mut config: Config = value.try_into().map_err(|e: toml::de::Error| {
            // Parsing the raw text again gives the same error with its line.
            let located = toml::from_str::<Config>(text).err().map(|e| e.to_string());
            Error::config(one_line(&located.unwrap_or_else(|| e.to_string())))
        })?;
        config.base_dir = base_dir.to_path_buf();
        config.register_secrets();
        config.validate()?;
        Ok(config)
    }

    /// Values of secret keys are masked in logs and errors from now on.
    fn register_secrets(&self) {
        for (k, v) in self.kafka.iter().chain(&self.errors.producer) {
            if redact::is_secret_key(k) {
                redact::register(v);
            }
        }
        self.schema_registry.register_secrets();
        let shown = self.graph.storage_options.redacted();
        for (k, v) in &self.graph.storage_options.0 {
            if shown.get(k.as_str()) == Some(&redact::MASK) {
                redact::register(v);
            }
        }
    }

    fn validate(&self) -> Result<()> {
        self.validate_root()?;
        self.validate_kafka()?;
        self.validate_wal()?;
        self.runtime.validate()?;
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
            m.validate(i)?;
        }
        self.validate_shared_types()?;
        let registry_user = self
            .mappings
            .iter()
            .find(|m| m.format.uses_registry() || m.key_format.uses_registry());
        self.schema_registry
            .validate(registry_user.map(|m| m.topic.as_str()))?;
        if self.errors.dead_letter_topic.is_empty() {
            return Err(Error::config("errors.dead_letter_topic must not be empty"));
        }
        if self.errors.max_record_bytes == 0 {
            return Err(Error::config("errors.max_record_bytes must be positive"));
        }
        self.retention.validate()?;
        Ok(())
    }

    /// Schemes Lance's object stores serve in this build; anything else is
    /// a typo that would otherwise fail deep inside the first open.
    fn validate_root(&self) -> Result<()> {
        let root = &self.graph.root;
        if let Some((scheme, _)) = root.split_once("://") {
            const SCHEMES: &[&str] = &[
                "file",
                "file-object-store",
                "s3",
                "gs",
                "az",
                "abfss",
                "memory",
            ];
            if !SCHEMES.contains(&scheme) {
                return Err(Error::config(format!(
                    "graph.root: scheme {scheme}:// is not supported (use a local path, {})",
                    SCHEMES
                        .iter()
                        .map(|s| format!("{s}://"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        }
        Ok(())
    }

    fn validate_kafka(&self) -> Result<()> {
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
        Ok(())
    }

    fn validate_wal(&self) -> Result<()> {
        if let Some(n) = self.wal.buckets {
            check_buckets("wal.buckets", n)?;
        }
        if self.wal.partitioner.is_some() && self.wal.sharding != Sharding::Partition {
            return Err(Error::config(
                "wal.partitioner is for wal.sharding = \"partition\" (it checks that each record \
                 sits on its key's partition)",
            ));
        }
        if self.wal.sharding == Sharding::Partition {
            let set =
                self.wal.buckets.is_some() || self.mappings.iter().any(|m| m.buckets.is_some());
            if set {
                return Err(Error::config(
                    "buckets cannot be set under wal.sharding = \"partition\": a type's shards \
                     are its topics' partitions",
                ));
            }
            self.validate_copartitioned_assignor()?;
        }
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
        Ok(())
    }

    /// Under partition sharding, shard (type, p) needs partition p of every
    /// topic feeding the type on one member. Of librdkafka's assignors only
    /// `range` keeps them together (docs/decisions/0007-scale-out.md, "Several topics on
    /// one type"); `cooperative-sticky` and `roundrobin` would split them,
    /// and two members would claim one shard and fence each other in turn.
    fn validate_copartitioned_assignor(&self) -> Result<()> {
        // KIP-848's protocol names its (server-side) assignor elsewhere.
        let key = match self.kafka.get("group.protocol").map(|p| p.trim()) {
            Some("consumer") => "group.remote.assignor",
            _ => "partition.assignment.strategy",
        };
        let Some(strategy) = self.kafka.get(key) else {
            return Ok(()); // graphsink sets `range` under partition sharding
        };
        let Some((a, b)) = self.mappings.iter().enumerate().find_map(|(i, a)| {
            self.mappings[..i]
                .iter()
                .find(|b| b.type_name() == a.type_name() && b.topic != a.topic)
                .map(|b| (b, a))
        }) else {
            return Ok(());
        };
        if strategy.trim() == "range" {
            return Ok(());
        }
        Err(Error::config(format!(
            "kafka.\"{key}\" = \"{strategy}\": topics {} and {} both feed \
             {}, and under wal.sharding = \"partition\" partition p of both must go to one member; \
             only \"range\" (graphsink's default here) assigns them so",
            a.topic,
            b.topic,
            a.type_name()
        )))
    }

    /// Bucket counts and fold-time policies belong to the type (one table,
    /// one MemWAL): every topic that feeds a type must agree on them.
    fn validate_shared_types(&self) -> Result<()> {
        for (i, a) in self.mappings.iter().enumerate() {
            for b in &self.mappings[..i] {
                if a.type_name() != b.type_name() {
                    continue;
                }
                let what = if self.buckets_for(a) != self.buckets_for(b) {
                    format!(
                        "different buckets ({} and {})",
                        self.buckets_for(b),
                        self.buckets_for(a)
                    )
                } else if a.on_missing_endpoint != b.on_missing_endpoint
                    || a.endpoint_deadline != b.endpoint_deadline
                    || a.on_delete_referenced != b.on_delete_referenced
                {
                    "different fold policies".to_string()
                } else {
                    continue;
                };
                return Err(Error::config(format!(
                    "mapping[{i}]: topics {} and {} feed {} with {what}",
                    b.topic,
                    a.topic,
                    a.type_name()
                )));
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

    /// Buckets N of a type no mapping overrides.
    pub fn buckets_for_type(&self) -> u32 {
        self.wal.buckets.unwrap_or(DEFAULT_BUCKETS)
    }

    pub fn buckets_for(&self, mapping: &Mapping) -> u32 {
        mapping
            .buckets
            .or(self.wal.buckets)
            .unwrap_or(DEFAULT_BUCKETS)
    }

    /// The mappings feeding a graph type.
    pub fn mappings_of<'a>(&'a self, type_name: &'a str) -> impl Iterator<Item = &'a Mapping> + 'a {
        self.mappings
            .iter()
            .filter(move |m| m.type_name() == type_name)
    }

    /// The dead-letter topic of records from `topic`.
    pub fn dead_letter_topic(&self, topic: &str) -> &str {
        self.mappings
            .iter()
            .find(|m| m.topic == topic)
            .and_then(|m| m.dead_letter_topic.as_deref())
            .unwrap_or(&self.errors.dead_letter_topic)
    }
}
