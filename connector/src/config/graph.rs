//! `[graph]`: the root, the schema, the actor, how the root's store is
//! reached, and what a start does with a schema change.

use super::*;

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
pub(super) fn default_storage_backoff() -> Duration {
    Duration::from_secs(10)
}
pub(super) fn default_actor() -> String {
    "graphsink".into()
}
