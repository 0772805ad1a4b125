//! Settings: the TOML file, its defaults, `${ENV}` expansion and validation.
//! Owns nothing at run time; every other module receives a checked `Config`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::redact;

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

/// The operator's HTTP endpoint (`/metrics`, `/health`, `/ready`).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpSettings {
    /// Where to serve, e.g. `"127.0.0.1:9464"`; unset: no endpoint
    /// (`graphsink run --http ADDR` overrides it).
    pub listen: Option<std::net::SocketAddr>,
    /// `/ready` fails once a stall is older than this: the dead-letter
    /// topic retrying, durability not advancing while records wait.
    #[serde(with = "humantime_serde")]
    pub stall_bound: Duration,
    /// After the run stops on an error (a fenced writer, exit code 3), the
    /// endpoint keeps serving (`/ready` false, the last metrics) this long
    /// before the process exits, so scrapers and probes see why.
    #[serde(with = "humantime_serde")]
    pub linger: Duration,
}

impl Default for HttpSettings {
    fn default() -> Self {
        HttpSettings {
            listen: None,
            stall_bound: Duration::from_secs(60),
            linger: Duration::from_secs(15),
        }
    }
}

/// `[schema_registry]`: a Confluent-compatible Schema Registry, where the
/// registry formats resolve the schema id framed in each record
/// (docs/formats.md). `Debug` masks the credentials.
#[derive(Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchemaRegistrySettings {
    /// Base URLs, comma-separated, tried in turn (e.g.
    /// `"http://registry:8081"`). Required once a mapping uses a registry
    /// format.
    pub url: String,
    /// HTTP basic auth as `user:password` (Confluent's `basic.auth.user.info`).
    pub basic_auth_user_info: Option<String>,
    /// `Authorization: Bearer` token (Confluent's `bearer.auth.token`).
    pub bearer_token: Option<String>,
    /// PEM file of the CA that signs an `https://` registry's certificate,
    /// beside the system's roots.
    pub ssl_ca_location: Option<PathBuf>,
    /// One request's bound, across connect and reply.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Schemas kept in memory, by id. A record of an id not kept costs one
    /// request (ids are immutable, so a kept schema is never stale).
    pub cache_capacity: u64,
}

impl Default for SchemaRegistrySettings {
    fn default() -> Self {
        SchemaRegistrySettings {
            url: String::new(),
            basic_auth_user_info: None,
            bearer_token: None,
            ssl_ca_location: None,
            timeout: Duration::from_secs(10),
            cache_capacity: 1000,
        }
    }
}

impl std::fmt::Debug for SchemaRegistrySettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mask = |v: &Option<String>| v.as_ref().map(|_| redact::MASK);
        f.debug_struct("SchemaRegistrySettings")
            .field("url", &self.url)
            .field("basic_auth_user_info", &mask(&self.basic_auth_user_info))
            .field("bearer_token", &mask(&self.bearer_token))
            .field("ssl_ca_location", &self.ssl_ca_location)
            .field("timeout", &self.timeout)
            .field("cache_capacity", &self.cache_capacity)
            .finish()
    }
}

impl SchemaRegistrySettings {
    /// The base URLs, in the order they are tried.
    pub fn urls(&self) -> Vec<&str> {
        self.url
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(|u| u.trim_end_matches('/'))
            .collect()
    }

    fn validate(&self, needed_by: Option<&str>) -> Result<()> {
        let urls = self.urls();
        if let Some(topic) = needed_by {
            if urls.is_empty() {
                return Err(Error::config(format!(
                    "schema_registry.url is required: the mapping for topic {topic} uses a registry format"
                )));
            }
        }
        for u in &urls {
            if !(u.starts_with("http://") || u.starts_with("https://")) {
                return Err(Error::config(format!(
                    "schema_registry.url: {u:?} is not an http:// or https:// URL"
                )));
            }
        }
        if let Some(info) = &self.basic_auth_user_info {
            if !info.contains(':') {
                return Err(Error::config(
                    "schema_registry.basic_auth_user_info must be user:password",
                ));
            }
            if self.bearer_token.is_some() {
                return Err(Error::config(
                    "schema_registry: set one of basic_auth_user_info and bearer_token",
                ));
            }
        }
        if self.timeout.is_zero() {
            return Err(Error::config("schema_registry.timeout must be positive"));
        }
        if self.cache_capacity == 0 {
            return Err(Error::config(
                "schema_registry.cache_capacity must be at least 1",
            ));
        }
        Ok(())
    }

    /// The credentials are masked in logs and errors from now on.
    fn register_secrets(&self) {
        if let Some(info) = &self.basic_auth_user_info {
            redact::register(info);
            if let Some((_, password)) = info.split_once(':') {
                redact::register(password);
            }
        }
        if let Some(token) = &self.bearer_token {
            redact::register(token);
        }
    }
}

/// How the process logs.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    /// `text` (default) or `json` (one object per event; `--log-format`
    /// overrides it).
    #[serde(default)]
    pub format: LogFormat,
}

/// The process's threads (`graphsink run` only).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuntimeSettings {
    /// Nice levels (0..=19) by which the async workers and the blocking
    /// pool run below the main thread (capped at nice 19): MemWAL index
    /// apply, WAL and flush writes, the fold. The run loop
    /// (take, decode, put) stays on the main thread at the process's own
    /// priority, so bursts of background work do not keep it from a core
    /// (docs/decisions/0008-thread-priority.md). 0 turns it off. Linux only.
    pub background_nice: i32,
}

impl Default for RuntimeSettings {
    fn default() -> Self {
        RuntimeSettings {
            background_nice: 10,
        }
    }
}

impl RuntimeSettings {
    fn validate(&self) -> Result<()> {
        if !(0..=19).contains(&self.background_nice) {
            return Err(Error::config(format!(
                "runtime.background_nice must be 0..=19 (higher is lower priority), not {}",
                self.background_nice
            )));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
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
    /// Passed through to Lance's object store for `s3://`, `gs://` and
    /// `az://` roots (`aws_endpoint`, `aws_region`, `aws_allow_http`,
    /// credentials as `${VAR}`, `timeout`, `client_max_retries`, ...).
    /// Lance also reads the standard `AWS_*` variables itself.
    #[serde(default)]
    pub storage_options: StorageOptions,
    /// After a storage failure that passes (5xx or timeouts past the
    /// client's retries, an outage, a WAL writer that gave up), the run
    /// restarts its ingest session in-process, waiting 250 ms, doubling up
    /// to this. It never gives up on those; refusals stop the run.
    #[serde(default = "default_storage_backoff", with = "humantime_serde")]
    pub storage_retry_max_backoff: Duration,
    /// What a start does with a schema change the graph can take
    /// (docs/schema-evolution.md).
    #[serde(default)]
    pub evolve: Evolve,
}

/// Whether a start applies an allowed schema change itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Evolve {
    /// Apply every additive and loosening change (and tightened
    /// constraints) at start, as one schema commit.
    #[default]
    Additive,
    /// Refuse every schema change at start; `graphsink migrate` applies it.
    None,
    /// `additive`, and each new optional field of a mapped subject's writer
    /// schema becomes an optional property by itself (at start, and when a
    /// running session meets a writer schema that has one).
    #[serde(rename = "from_registry")]
    FromRegistry,
}

/// Object-store options. Their values may be credentials, so `Debug` shows
/// only the values of keys known to be harmless.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct StorageOptions(pub BTreeMap<String, String>);

impl StorageOptions {
    /// Keys whose values are shown in logs and errors; every other value is
    /// a possible secret (an allow-list: a new credential key stays hidden).
    const SHOWN: &'static [&'static str] = &[
        "aws_endpoint",
        "endpoint",
        "aws_region",
        "region",
        "aws_allow_http",
        "allow_http",
        "aws_virtual_hosted_style_request",
        "virtual_hosted_style_request",
        "timeout",
        "connect_timeout",
        "client_max_retries",
        "client_retry_timeout",
        "download_retry_count",
        "aws_conditional_put",
        "use_opendal",
    ];

    pub fn redacted(&self) -> BTreeMap<&str, &str> {
        self.0
            .iter()
            .map(|(k, v)| {
                let shown = Self::SHOWN.contains(&k.to_ascii_lowercase().as_str());
                (k.as_str(), if shown { v.as_str() } else { redact::MASK })
            })
            .collect()
    }
}

impl std::fmt::Debug for StorageOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.redacted()).finish()
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WalSettings {
    /// How a record finds its shard (docs/decisions/0007-scale-out.md). Fixed at graph
    /// creation, like N.
    pub sharding: Sharding,
    /// Default buckets N per type (`bucket(id, N)`), 1..=1024. Fixed at
    /// init. Refused under `sharding = "partition"`, where N is the
    /// partition count of the type's topics.
    pub buckets: Option<u32>,
    /// Under `sharding = "partition"`: the producers' partitioner, when
    /// known. Each keyed record is then checked to sit on the partition
    /// its key hashes to (`wrong_partition`), which catches a producer
    /// with another partitioner, or a resized topic, record by record.
    pub partitioner: Option<Partitioner>,
    /// Longest time a put waits for its WAL entry; bounds durable-ack latency.
    #[serde(with = "humantime_serde")]
    pub flush_interval: Duration,
    /// A memtable freezes (and flushes to a generation) past this many rows.
    pub max_memtable_rows: usize,
    /// ... or past this many bytes.
    pub max_memtable_bytes: usize,
    /// Polls whose durability is still pending before the consumer stops
    /// fetching (backpressure).
    pub max_in_flight_polls: usize,
    /// Most records taken from the consumer into one poll batch (one
    /// Arrow batch per mapping, one put per shard).
    pub max_poll_records: usize,
}

/// How rows are spread over a table's MemWAL shards.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Sharding {
    /// `bucket(id, N)`: any key order from producers; one process owns
    /// every shard (single instance).
    #[default]
    Bucket,
    /// The record's source partition: producers key by the row id with one
    /// partitioner, and the group's assignment is shard ownership.
    Partition,
}

impl Sharding {
    pub fn as_str(self) -> &'static str {
        match self {
            Sharding::Bucket => "bucket",
            Sharding::Partition => "partition",
        }
    }
}

/// librdkafka's key partitioners, by its `partitioner` property's names
/// (the `_random` forms differ only for records without a key, which
/// partition sharding refuses anyway).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Partitioner {
    /// Java's default (`murmur2_random` in librdkafka).
    #[serde(alias = "murmur2_random")]
    Murmur2,
    /// CRC32, librdkafka's default (`consistent_random`).
    #[serde(alias = "consistent_random")]
    Consistent,
    #[serde(alias = "fnv1a_random")]
    Fnv1a,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FoldSettings {
    /// Fold at least this often while records are pending. `0s` disables the timer.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Fold early once this many rows were written since the last fold.
    pub max_pending_rows: u64,
    /// Fold early once this many value bytes were written since the last fold.
    pub max_pending_bytes: u64,
    /// Fold once more on a graceful shutdown.
    pub on_shutdown: bool,
    /// Most ids the fold keeps in memory (over all tables), each with its
    /// row's address, to check edge endpoints and to replace rows without
    /// scanning the tables' keys: ~28–55 bytes each. A table past it is
    /// scanned at every fold that needs it instead.
    pub known_ids_max: usize,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OffsetSettings {
    /// How often durable watermarks are committed to the consumer group.
    #[serde(with = "humantime_serde")]
    pub commit_interval: Duration,
    /// How long a member may hold no partition while its topics have lag
    /// and nobody advances their committed offsets, before it rejoins the
    /// group (and, a second time, exits). Unset: twice `session.timeout.ms`.
    #[serde(with = "humantime_serde::option")]
    pub stall_timeout: Option<Duration>,
    /// `run --exit-at-end` also waits until nothing was fetched for this
    /// long. Apache Kafka reports a partition's end exactly, so the default
    /// is none; a broker whose high watermark can read low while producers
    /// batch (tansu 0.6) needs about a second (docs/kafka.md).
    #[serde(with = "humantime_serde")]
    pub exit_at_end_quiet: Duration,
}

/// What graphsink deletes once it is folded (docs/retention.md). A graph
/// commit stays readable while it is one of the `keep_commits` newest or
/// younger than `keep_for` (the union); the head always is.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionSettings {
    /// Whether the fold loop collects garbage. `graphsink gc` runs either way.
    pub enabled: bool,
    /// The fold loop collects after a publish at most this often; `0s`:
    /// after every publish.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// The newest graph commits that stay readable (1: the head only).
    pub keep_commits: usize,
    /// Graph commits younger than this stay readable, however many.
    #[serde(with = "humantime_serde")]
    pub keep_for: Duration,
}

/// What happens to records that cannot be ingested (Kafka Connect's terms).
/// `Debug` masks secret producer properties.
#[derive(Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ErrorSettings {
    /// `all`: route rejects to `_ingest_rejects` and the dead-letter topic
    /// and go on. `none`: stop at the first reject, committing nothing past it.
    pub tolerance: Tolerance,
    /// Dead-letter topic of every mapping that names none. Created at start
    /// if missing.
    pub dead_letter_topic: String,
    /// Values larger than this are rejected as `oversized`.
    pub max_record_bytes: usize,
    /// Deferred edges (missing endpoints) kept across folds, over all edge
    /// types; past it the oldest are rejected as `pending_overflow`.
    pub max_pending_edges: usize,
    /// Reject-rate breaker: past this many rejects in a minute, stop
    /// fetching for `breaker_pause` and log an error. 0 disables it.
    pub max_rejects_per_minute: u64,
    #[serde(with = "humantime_serde")]
    pub breaker_pause: Duration,
    /// librdkafka properties of the dead-letter producer, over the
    /// connection properties copied from `[kafka]`. A `transactional.id`
    /// here names the fold-reject producer's (see `dead_letter_transactions`);
    /// record rejects never use it.
    pub producer: BTreeMap<String, String>,
    /// Fold rejects go to the dead-letter topic in Kafka transactions, so a
    /// `read_committed` consumer sees each `reject_id` exactly once whatever
    /// crashes, freezes or timeouts hit the folder (docs/dead-letters.md).
    /// Off, or on a broker without transactions (said once, loudly), a
    /// folder reads the topic back before producing instead: exactly once
    /// across crashes, at least once across a frozen folder's late produce.
    pub dead_letter_transactions: bool,
}

impl std::fmt::Debug for ErrorSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ErrorSettings")
            .field("tolerance", &self.tolerance)
            .field("dead_letter_topic", &self.dead_letter_topic)
            .field("max_record_bytes", &self.max_record_bytes)
            .field("max_pending_edges", &self.max_pending_edges)
            .field("max_rejects_per_minute", &self.max_rejects_per_minute)
            .field("breaker_pause", &self.breaker_pause)
            .field("producer", &redact::props(&self.producer))
            .field("dead_letter_transactions", &self.dead_letter_transactions)
            .finish()
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tolerance {
    #[default]
    All,
    None,
}

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
    /// Whether records carry the Confluent wire format's schema id.
    pub fn uses_registry(self) -> bool {
        self != ValueFormatName::Json
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
    fn validate(&self, i: usize) -> Result<()> {
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

impl RetentionSettings {
    fn validate(&self) -> Result<()> {
        if self.keep_commits == 0 {
            return Err(Error::config(
                "retention.keep_commits must be at least 1 (the head is always kept)",
            ));
        }
        // A window chrono cannot subtract from now would keep nothing
        // by accident; refuse it instead.
        if chrono::Duration::from_std(self.keep_for).is_err()
            || self.keep_for > Duration::from_secs(100 * 365 * 24 * 3600)
        {
            return Err(Error::config("retention.keep_for is longer than 100 years"));
        }
        Ok(())
    }

    /// `keep_for` in milliseconds.
    pub fn keep_for_ms(&self) -> i64 {
        i64::try_from(self.keep_for.as_millis()).unwrap_or(i64::MAX)
    }
}

/// One section of a config file, read before the config itself is loaded
/// (for what start-up needs first); `None` when it cannot be read.
fn early_section(path: &Path, name: &str) -> Option<toml::Value> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut value: toml::Table = toml::from_str(&text).ok()?;
    value.remove(name)
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

pub(crate) fn resolve_uri(root: &str, base_dir: &Path) -> String {
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
        if redact::is_secret_var(name) {
            redact::register(&val);
        }
        out.push_str(&val);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Buckets N per type when `wal.buckets` is unset (bucket sharding).
const DEFAULT_BUCKETS: u32 = 4;

fn default_storage_backoff() -> Duration {
    Duration::from_secs(10)
}
fn default_actor() -> String {
    "graphsink".into()
}
fn default_endpoint_deadline() -> Duration {
    Duration::from_secs(600)
}

impl Default for RetentionSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            interval: Duration::from_secs(60),
            keep_commits: 10,
            keep_for: Duration::from_secs(3600),
        }
    }
}

impl Default for WalSettings {
    fn default() -> Self {
        Self {
            sharding: Sharding::default(),
            buckets: None,
            partitioner: None,
            flush_interval: Duration::from_millis(20),
            max_memtable_rows: 100_000,
            max_memtable_bytes: 64 * 1024 * 1024,
            max_in_flight_polls: 16,
            // 10,000 rather than 5,000: at ~100 B, +14 % throughput
            // (docs/perf/2026-12-03-larger-polls-wal-max-poll-records-10-000.md, "Larger polls"), with no change in peak RSS.
            max_poll_records: 10_000,
        }
    }
}

impl Default for FoldSettings {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(5),
            max_pending_rows: 200_000,
            max_pending_bytes: 128 * 1024 * 1024,
            on_shutdown: true,
            known_ids_max: 16_000_000,
        }
    }
}

impl Default for ErrorSettings {
    fn default() -> Self {
        Self {
            tolerance: Tolerance::All,
            dead_letter_topic: "graphsink-dead-letters".into(),
            max_record_bytes: 1_000_000,
            max_pending_edges: 1_000_000,
            max_rejects_per_minute: 0,
            breaker_pause: Duration::from_secs(60),
            producer: BTreeMap::new(),
            dead_letter_transactions: true,
        }
    }
}

impl Default for OffsetSettings {
    fn default() -> Self {
        Self {
            commit_interval: Duration::from_secs(1),
            stall_timeout: None,
            exit_at_end_quiet: Duration::ZERO,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/config.md lists, under each section's heading, exactly the keys
    /// that section accepts, as serde itself names them (its "expected one
    /// of" list for an unknown key).
    #[test]
    fn docs_config_lists_every_key() {
        let doc =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/config.md"))
                .expect("docs/config.md");
        let base = "[graph]\nroot = \"g\"\nschema = \"x.pg\"\n[kafka]\n\"bootstrap.servers\" = \"h:1\"\n\"group.id\" = \"g\"\n";
        let sections = [
            "graph",
            "wal",
            "fold",
            "offsets",
            "errors",
            "retention",
            "http",
            "schema_registry",
            "log",
            "runtime",
            "mapping",
        ];
        let ticked = |s: &str| -> std::collections::BTreeSet<String> {
            s.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect()
        };
        for section in sections {
            let toml = match section {
                "graph" => base.replace("[graph]\n", "[graph]\nzz_unknown = 1\n"),
                "mapping" => {
                    format!("{base}[[mapping]]\nzz_unknown = 1\ntopic = \"t\"\nnode = \"P\"\n")
                }
                s => format!("{base}[{s}]\nzz_unknown = 1\n"),
            };
            let err = Config::from_toml(&toml, Path::new("."))
                .unwrap_err()
                .to_string();
            let accepted = ticked(
                err.split("expected")
                    .nth(1)
                    .unwrap_or_else(|| panic!("{section}: {err}")),
            );
            let heading = match section {
                "mapping" => "### `[[mapping]]`".to_string(),
                s => format!("### `[{s}]`"),
            };
            let at = doc
                .find(&heading)
                .unwrap_or_else(|| panic!("docs/config.md has no {heading}"));
            let documented: std::collections::BTreeSet<String> = doc[at..]
                .lines()
                .skip_while(|l| !l.starts_with('|'))
                .take_while(|l| l.starts_with('|'))
                .skip(2)
                .flat_map(|l| ticked(l.split('|').nth(1).unwrap_or("")))
                .collect();
            assert_eq!(
                documented, accepted,
                "[{section}]: docs/config.md (left) against the struct (right)"
            );
        }
    }

    /// Each section's defaults live in one place, its `impl Default`: a
    /// config that omits the section, and one that names it empty, both
    /// read as exactly that.
    #[test]
    fn an_omitted_or_empty_section_is_its_default() {
        let dir = std::path::Path::new(".");
        let sections = [
            "wal",
            "fold",
            "offsets",
            "errors",
            "retention",
            "http",
            "log",
            "runtime",
            "schema_registry",
        ];
        let empty = sections
            .iter()
            .fold(MIN.to_string(), |t, s| format!("{t}\n[{s}]\n"));
        for text in [MIN.to_string(), empty] {
            let c = Config::from_toml(&text, dir).unwrap();
            let got = format!(
                "{:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?}",
                c.wal,
                c.fold,
                c.offsets,
                c.errors,
                c.retention,
                c.http,
                c.log,
                c.runtime,
                c.schema_registry
            );
            let want = format!(
                "{:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?}",
                WalSettings::default(),
                FoldSettings::default(),
                OffsetSettings::default(),
                ErrorSettings::default(),
                RetentionSettings::default(),
                HttpSettings::default(),
                LogSettings::default(),
                RuntimeSettings::default(),
                SchemaRegistrySettings::default()
            );
            assert_eq!(got, want, "{text}");
        }
    }

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

    /// `${VAR}` expands inside the storage options, and `Debug` (which is
    /// how config reaches logs) shows harmless values only.
    #[test]
    fn storage_options_expand_and_never_show_secrets() {
        std::env::set_var("GS_TEST_SECRET_KEY", "s3cr3t-value-42");
        let t = MIN.replace("data/graph", "s3://bucket/prefix").replace(
            "schema = \"social.pg\"",
            "schema = \"social.pg\"\n[graph.storage_options]\n\
             aws_endpoint = \"http://127.0.0.1:9000\"\n\
             aws_secret_access_key = \"${GS_TEST_SECRET_KEY}\"\n\
             aws_session_token = \"tok-123\"",
        );
        let c = Config::from_toml(&t, Path::new("/")).unwrap();
        assert_eq!(c.root_uri(), "s3://bucket/prefix");
        let opts = &c.graph.storage_options.0;
        assert_eq!(opts["aws_secret_access_key"], "s3cr3t-value-42");
        let shown = format!("{c:?}");
        assert!(shown.contains("http://127.0.0.1:9000"), "{shown}");
        assert!(!shown.contains("s3cr3t-value-42"), "{shown}");
        assert!(!shown.contains("tok-123"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }

    /// `[schema_registry]`: defaults, the URL list, `${VAR}` credentials
    /// kept out of `Debug` and out of every printed error.
    #[test]
    fn schema_registry_settings_default_list_urls_and_hide_credentials() {
        let c = Config::from_toml(MIN, Path::new("/")).unwrap();
        assert_eq!(c.mappings[0].format, ValueFormatName::Json);
        assert_eq!(c.mappings[0].key_format, KeyFormatName::Json);
        assert_eq!(c.schema_registry.timeout, Duration::from_secs(10));
        assert!(c.schema_registry.urls().is_empty());

        std::env::set_var("GS_TEST_REGISTRY_PASSWORD", "reg-pa55word");
        let t = format!(
            "{MIN}format = \"avro\"\nkey_format = \"string\"\n\
             [schema_registry]\nurl = \"http://a:8081/, https://b:8081\"\n\
             basic_auth_user_info = \"svc:${{GS_TEST_REGISTRY_PASSWORD}}\"\ntimeout = \"2s\"\n"
        );
        let c = Config::from_toml(&t, Path::new("/")).unwrap();
        assert_eq!(c.mappings[0].format, ValueFormatName::Avro);
        assert_eq!(c.mappings[0].key_format, KeyFormatName::String);
        assert_eq!(
            c.schema_registry.urls(),
            ["http://a:8081", "https://b:8081"]
        );
        assert_eq!(c.schema_registry.timeout, Duration::from_secs(2));
        let shown = format!("{c:?}");
        assert!(!shown.contains("reg-pa55word"), "{shown}");
        assert!(
            shown.contains("basic_auth_user_info: Some(\"<redacted>\")"),
            "{shown}"
        );
        assert_eq!(redact::text("auth svc:reg-pa55word"), "auth <redacted>");
    }

    #[test]
    fn registry_formats_need_a_registry_and_valid_settings() {
        let refused = |extra: &str, want: &str| {
            let t = format!("{MIN}{extra}");
            let e = Config::from_toml(&t, Path::new("/"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{extra:?}: {e}");
        };
        refused("format = \"protobuf\"\n", "schema_registry.url is required");
        refused(
            "key_format = \"avro\"\n",
            "topic people uses a registry format",
        );
        refused("format = \"xml\"\n", "unknown variant");
        refused("message = \"a.B\"\n", "neither format nor key_format");
        let with = |section: &str| format!("format = \"avro\"\n[schema_registry]\n{section}");
        refused(
            &with("url = \"registry:8081\"\n"),
            "not an http:// or https:// URL",
        );
        refused(
            &with("url = \"http://r\"\nbasic_auth_user_info = \"nopassword\"\n"),
            "user:password",
        );
        refused(
            &with("url = \"http://r\"\nbasic_auth_user_info = \"u:p\"\nbearer_token = \"t\"\n"),
            "one of basic_auth_user_info and bearer_token",
        );
        refused(
            &with("url = \"http://r\"\ncache_capacity = 0\n"),
            "cache_capacity",
        );
        refused(
            &with("url = \"http://r\"\nschema_url = \"x\"\n"),
            "unknown field",
        );
        // A registry named but unused is fine, and json_schema is a name.
        let t = format!("{MIN}format = \"json_schema\"\nmessage = \"x\"\n");
        assert!(Config::from_toml(&t, Path::new("/")).is_err());
        let t = format!("{MIN}[schema_registry]\nurl = \"http://r\"\n");
        Config::from_toml(&t, Path::new("/")).unwrap();
    }

    #[test]
    fn an_unknown_root_scheme_is_refused_at_load() {
        let t = MIN.replace("data/graph", "s4://bucket/x");
        let e = Config::from_toml(&t, Path::new("/")).unwrap_err();
        assert!(e.to_string().contains("s4://"), "{e}");
        for ok in ["s3://b/p", "gs://b/p", "az://c/p", "file:///tmp/g"] {
            let t = MIN.replace("data/graph", ok);
            Config::from_toml(&t, Path::new("/")).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
    }

    #[test]
    fn defaults_apply() {
        let c = Config::from_toml(MIN, Path::new("/etc/gs")).unwrap();
        assert_eq!(c.wal.buckets, None);
        assert_eq!(c.wal.sharding, Sharding::Bucket);
        assert_eq!(c.root_uri(), "/etc/gs/data/graph");
        assert_eq!(c.mappings[0].node_key(), KeySource::Named(KeyOrigin::Value));
        assert_eq!(c.mappings[0].unknown_fields, UnknownFields::Reject);
        assert_eq!(c.errors.tolerance, Tolerance::All);
        assert_eq!(c.dead_letter_topic("people"), "graphsink-dead-letters");
    }

    /// `[runtime]` is read twice: before the runtime exists (`runtime_of`,
    /// which falls back to the defaults) and in the full load (which refuses
    /// a bad value, so a typo is not silently the default).
    #[test]
    fn runtime_settings_default_read_early_and_refuse_out_of_range() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.toml");
        assert_eq!(
            Config::runtime_of(&path).background_nice,
            10,
            "unreadable: default"
        );
        std::fs::write(&path, format!("{MIN}\n[runtime]\nbackground_nice = 0\n")).unwrap();
        assert_eq!(Config::runtime_of(&path).background_nice, 0);
        let c = Config::load(&path).unwrap();
        assert_eq!(c.runtime.background_nice, 0);
        let bad = format!("{MIN}\n[runtime]\nbackground_nice = 20\n");
        let e = Config::from_toml(&bad, Path::new("/")).unwrap_err();
        assert!(e.to_string().contains("runtime.background_nice"), "{e}");
        std::fs::write(&path, bad).unwrap();
        assert_eq!(Config::runtime_of(&path).background_nice, 10);
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
            c.mappings[0].node_key(),
            KeySource::Field {
                field: "uid".into()
            }
        );
        let t = MIN.replace("node = \"Person\"", "node = \"Person\"\nkey = \"kafka\"");
        let c = Config::from_toml(&t, Path::new("/")).unwrap();
        assert_eq!(c.mappings[0].node_key(), KeySource::Named(KeyOrigin::Kafka));
    }

    #[test]
    fn edge_mappings_are_checked() {
        let edge = MIN.replace("node = \"Person\"", "edge = \"Knows\"\nsrc = \"from\"");
        let c = Config::from_toml(&edge, Path::new("/")).unwrap();
        assert!(c.mappings[0].is_edge());
        assert_eq!(c.mappings[0].src_field(), "from");
        assert_eq!(c.mappings[0].dst_field(), "dst");
        assert_eq!(c.mappings[0].on_missing_endpoint, EndpointPolicy::Defer);
        for bad in [
            MIN.replace("node = \"Person\"", "node = \"P\"\nedge = \"K\""),
            MIN.replace("node = \"Person\"", "edge = \"K\"\nkey = \"value\""),
            MIN.replace("node = \"Person\"", "node = \"P\"\nsrc = \"a\""),
            MIN.replace("node = \"Person\"", "edge = \"K\"\nsrc = \"dst\""),
        ] {
            assert!(Config::from_toml(&bad, Path::new("/")).is_err(), "{bad}");
        }
    }

    #[test]
    fn retention_defaults_are_on_and_keep_an_hour_and_ten_commits() {
        let c = Config::from_toml(MIN, Path::new("/")).unwrap();
        let r = &c.retention;
        assert!(r.enabled);
        assert_eq!(r.interval, Duration::from_secs(60));
        assert_eq!(r.keep_commits, 10);
        assert_eq!(r.keep_for, Duration::from_secs(3600));
        assert_eq!(r.keep_for_ms(), 3_600_000);
    }

    #[test]
    fn retention_keys_parse_and_are_checked() {
        let t = format!(
            "{MIN}[retention]\nenabled = false\ninterval = \"0s\"\nkeep_commits = 1\nkeep_for = \"2d\"\n"
        );
        let c = Config::from_toml(&t, Path::new("/")).unwrap();
        assert!(!c.retention.enabled);
        assert!(c.retention.interval.is_zero());
        assert_eq!(c.retention.keep_commits, 1);
        assert_eq!(c.retention.keep_for, Duration::from_secs(2 * 86_400));
        for (bad, says) in [
            ("keep_commits = 0", "keep_commits must be at least 1"),
            ("keep_for = \"200years\"", "longer than 100 years"),
            ("keep = 3", "keep"),
            ("keep_for = \"soon\"", "keep_for"),
        ] {
            let t = format!("{MIN}[retention]\n{bad}\n");
            let e = Config::from_toml(&t, Path::new("/")).unwrap_err();
            assert!(e.to_string().contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn partition_sharding_parses_and_refuses_buckets() {
        let t = format!("{MIN}[wal]\nsharding = \"partition\"\n");
        let c = Config::from_toml(&t, Path::new("/")).unwrap();
        assert_eq!(c.wal.sharding, Sharding::Partition);
        assert_eq!(c.wal.partitioner, None);
        let t = format!("{MIN}[wal]\nsharding = \"partition\"\npartitioner = \"murmur2_random\"\n");
        let c = Config::from_toml(&t, Path::new("/")).unwrap();
        assert_eq!(c.wal.partitioner, Some(Partitioner::Murmur2));
        let e = Config::from_toml(
            &format!("{MIN}[wal]\npartitioner = \"fnv1a\"\n"),
            Path::new("/"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("wal.partitioner is for"), "{e}");
        for bad in [
            format!("{MIN}[wal]\nsharding = \"partition\"\nbuckets = 4\n"),
            format!("{MIN}buckets = 2\n[wal]\nsharding = \"partition\"\n"),
        ] {
            let e = Config::from_toml(&bad, Path::new("/")).unwrap_err();
            assert!(
                e.to_string().contains("partition count") || e.to_string().contains("partitions"),
                "{e}"
            );
        }
        let e = Config::from_toml(
            &format!("{MIN}[wal]\nsharding = \"hash\"\n"),
            Path::new("/"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("sharding"), "{e}");
    }

    #[test]
    fn two_topics_of_one_type_must_agree_on_buckets() {
        let two = |a: &str, b: &str| {
            format!("{MIN}{a}\n[[mapping]]\ntopic = \"people2\"\nnode = \"Person\"\n{b}")
        };
        // Same count (explicit on one side, the default on the other): fine.
        let c = Config::from_toml(&two("buckets = 4", ""), Path::new("/")).unwrap();
        assert_eq!(c.mappings.len(), 2);
        let e = Config::from_toml(&two("buckets = 8", ""), Path::new("/")).unwrap_err();
        assert!(e.to_string().contains("different buckets (8 and 4)"), "{e}");
        let e = Config::from_toml(&two("", "buckets = 2"), Path::new("/")).unwrap_err();
        assert!(
            e.to_string().contains("feed Person with different buckets"),
            "{e}"
        );
    }

    #[test]
    fn co_partitioned_topics_refuse_an_assignor_that_splits_them() {
        let cfg = |strategy: &str, second: &str, sharding: &str| {
            format!(
                "[graph]\nroot = \"g\"\nschema = \"social.pg\"\n[kafka]\n\"bootstrap.servers\" = \"b\"\n\
                 \"group.id\" = \"g\"\n{strategy}\n[wal]\nsharding = \"{sharding}\"\n\
                 [[mapping]]\ntopic = \"people\"\nnode = \"Person\"\n\
                 [[mapping]]\ntopic = \"people2\"\nnode = \"{second}\"\n"
            )
        };
        let sticky = "\"partition.assignment.strategy\" = \"cooperative-sticky\"";
        let e = Config::from_toml(&cfg(sticky, "Person", "partition"), Path::new("/")).unwrap_err();
        assert!(
            e.to_string()
                .contains("people and people2 both feed Person")
                && e.to_string().contains("only \"range\""),
            "{e}"
        );
        let rr = "\"partition.assignment.strategy\" = \"roundrobin\"";
        assert!(Config::from_toml(&cfg(rr, "Person", "partition"), Path::new("/")).is_err());
        // `range` (set or by default), one topic per type, or bucket
        // sharding: nothing to keep together.
        let range = "\"partition.assignment.strategy\" = \"range\"";
        let uniform = "\"group.protocol\" = \"consumer\"\n\"group.remote.assignor\" = \"uniform\"";
        let e =
            Config::from_toml(&cfg(uniform, "Person", "partition"), Path::new("/")).unwrap_err();
        assert!(e.to_string().contains("group.remote.assignor"), "{e}");
        let next_gen = "\"group.protocol\" = \"consumer\"";
        for ok in [
            cfg(next_gen, "Person", "partition"),
            cfg(range, "Person", "partition"),
            cfg("", "Person", "partition"),
            cfg(sticky, "Company", "partition"),
            cfg(sticky, "Person", "bucket"),
        ] {
            Config::from_toml(&ok, Path::new("/")).unwrap();
        }
    }
}
