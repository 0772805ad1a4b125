//! The service sections: `[fold]`, `[offsets]`, `[retention]`, `[errors]`,
//! `[http]`, `[schema_registry]`, `[log]`, `[runtime]`, each a struct with one
//! `impl Default`.

use super::*;

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

    pub(super) fn validate(&self, needed_by: Option<&str>) -> Result<()> {
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
    pub(super) fn register_secrets(&self) {
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
    pub(super) fn validate(&self) -> Result<()> {
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
impl RetentionSettings {
    pub(super) fn validate(&self) -> Result<()> {
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
