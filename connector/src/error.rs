//! Errors in SlateDB's shape: inside the crate, one enum (`Error`) with
//! context in its fields; what leaves it is `PublicError` (the crate's
//! `graphsink::Error`): a `#[non_exhaustive]` `ErrorKind` a caller acts
//! on, one readable message, and the library error under it. `shown` is
//! the one door from a library's error text to a message a user reads.

use thiserror::Error;

/// What the caller should do about an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The config or schema is wrong: fix it and start again.
    BadConfig,
    /// A record cannot be ingested (until rejects land, this stops the connector).
    BadInput,
    /// Another writer claimed a shard: this instance must stop acking.
    Fenced,
    /// Passing trouble (broker, storage): retrying may help.
    Retry,
    /// Another writer committed first (the graph's head or a table moved
    /// under this one): nothing this one acknowledged depends on the lost
    /// commit; read again and retry.
    Conflict,
    /// On-disk state is not what graphsink wrote or expects.
    Corrupt,
    /// What the caller asked for does not exist (e.g. a graph commit id).
    NotFound,
    /// The cluster refused graphsink a permission (an ACL) or its
    /// credentials: an operator must grant it; waiting does not help.
    NotAuthorized,
    /// graphsink itself failed (a panic): a bug to report; retrying the
    /// same input is unlikely to help.
    Bug,
}

/// The crate's own error: one variant per failure, with context in its
/// fields. It never leaves the crate: public functions return
/// `PublicError`, which keeps it for the crate's own use.
#[derive(Debug, Error)]
pub(crate) enum Error {
    #[error("config: {0}")]
    Config(String),
    #[error("schema {path}: {message}")]
    Schema { path: String, message: String },
    #[error("incompatible graph at {root}: {message} (graphsink never migrates silently)")]
    Incompatible { root: String, message: String },
    /// Schema changes a start refuses, one plan line each (`graph::evolve`);
    /// the CLI prints each on a line of its own before the error.
    #[error("incompatible graph at {root}: the schema changed in ways graphsink does not apply to an existing graph: {}; keep the graph's schema, or rebuild into a new root (docs/schema-evolution.md)", changes.join("; "))]
    SchemaChanges { root: String, changes: Vec<String> },
    /// `evolve = "from_registry"`: a writer schema the session met has
    /// optional fields the type lacks; the next session adds them.
    #[error("the schema registry's writer schema {id} for topic {topic} has new optional fields ({}): restarting the session to add them as properties (evolve = \"from_registry\")", fields.join(", "))]
    RegistrySchemaGrew {
        topic: String,
        id: u32,
        fields: Vec<String>,
    },
    #[error("shard {shard} of {table} (bucket {bucket}) was fenced: {reason}")]
    Fenced {
        table: String,
        bucket: u32,
        shard: uuid::Uuid,
        reason: String,
    },
    /// The writer gave up on its WAL store (Lance's persistence failure):
    /// a write may or may not have landed, nothing of it was acked. The
    /// shard must be reopened under a new epoch, which replays what landed.
    #[error("shard {shard} of {table} (bucket {bucket}) stopped: its WAL writes kept failing ({reason})")]
    WalUnavailable {
        table: String,
        bucket: u32,
        shard: uuid::Uuid,
        reason: String,
    },
    #[error("graph commit conflict: head moved from {expected} to {found}")]
    CommitConflict { expected: String, found: String },
    #[error("kafka: {}", shown(.0))]
    Kafka(rdkafka::error::KafkaError),
    #[error("lance ({context}): {}", shown(source))]
    Lance {
        context: String,
        #[source]
        source: lance::Error,
    },
    #[error("arrow ({context}): {}", shown(source))]
    Arrow {
        context: String,
        #[source]
        source: arrow_schema::ArrowError,
    },
    #[error("dead-letter topic {topic}: {reason}")]
    DeadLetter { topic: String, reason: String },
    /// Another process became the graph's folder: its fold-reject
    /// producer's init fenced this one's (docs/dead-letters.md).
    #[error("the fold-reject producer {transactional_id} was fenced by a newer folder: {reason}")]
    ProducerFenced {
        transactional_id: String,
        reason: String,
    },
    #[error("record {topic}/{partition}@{offset} rejected ({code}) and errors.tolerance is \"none\": {message}")]
    Intolerable {
        topic: String,
        partition: i32,
        offset: i64,
        code: &'static str,
        message: String,
    },
    #[error("corrupt graph state: {0}")]
    Corrupt(String),
    #[error("{0} not found")]
    NotFound(String),
    #[error("graph commit {commit} has expired: version {version} of {table} was removed by retention (it keeps retention.keep_commits commits and those younger than retention.keep_for)")]
    CommitExpired {
        commit: String,
        table: String,
        version: u64,
    },
    #[error("no partition assigned for {waited:?} (a rejoin included) while {lag} records of the mapped topics wait and no member of group {group} advances their offsets: the group coordinator is stuck; exiting so the process is restarted")]
    Unassigned {
        group: String,
        lag: i64,
        waited: std::time::Duration,
    },
    #[error("--exit-at-end waited {waited:?} (a rejoin included) for {partitions}, held by another member of group {group}, while {lag} records wait and no member advances their offsets; exiting without reaching the end, so the job is not taken for done")]
    EndUnreached {
        group: String,
        partitions: String,
        lag: i64,
        waited: std::time::Duration,
    },
    /// A permission the cluster refused, in graphsink's words (`needs`:
    /// the operation and resource) and Kafka's (`code`); docs/security.md.
    #[error("not authorized: graphsink needs {needs} ({code}); grant it (docs/security.md lists every ACL graphsink needs) and start again")]
    NotAuthorized { needs: String, code: String },
    #[error("{task} panicked: {message}")]
    Panic { task: &'static str, message: String },
    #[error("failpoint {0} fired")]
    Failpoint(&'static str),
    /// A broken invariant inside graphsink: a bug to report, never
    /// retried as if it were passing trouble.
    #[error("internal error (a bug in graphsink, please report it): {0}")]
    Bug(String),
    /// A Kafka operation that failed past librdkafka's own retries
    /// (metadata, admin, a produce or read of graphsink's own tools).
    #[error("{0}")]
    Broker(String),
}

pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

/// graphsink's public error (re-exported as `graphsink::Error`): what a
/// caller does about it (`kind`), one line a user can read (`message`,
/// without the source locations some libraries append), and the library
/// error under it (`source`: Lance, Arrow, librdkafka), if any. Callers
/// match on the kind; the variants behind it are the crate's own.
pub struct PublicError {
    kind: ErrorKind,
    message: String,
    /// The crate's error, kept whole so a public function called inside
    /// the crate loses nothing (`From<PublicError> for Error`).
    inner: Box<Error>,
}

/// The public `Result` (re-exported as `graphsink::Result`).
pub type PublicResult<T, E = PublicError> = std::result::Result<T, E>;

impl PublicError {
    /// What the caller should do about it.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// What happened, on one line a user can read.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl From<Error> for PublicError {
    fn from(e: Error) -> Self {
        PublicError {
            kind: e.kind(),
            message: e.to_string(),
            inner: Box::new(e),
        }
    }
}

impl From<PublicError> for Error {
    fn from(e: PublicError) -> Self {
        *e.inner
    }
}

impl std::fmt::Display for PublicError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::fmt::Debug for PublicError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Error")
            .field("kind", &self.kind)
            .field("message", &self.message)
            .field("source", &std::error::Error::source(self))
            .finish()
    }
}

impl std::error::Error for PublicError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(self.inner.as_ref())
    }
}

/// librdkafka's config errors carry the property's value (a typo'd
/// `sasl.pasword` would print the password): the value is masked.
impl From<rdkafka::error::KafkaError> for Error {
    fn from(e: rdkafka::error::KafkaError) -> Self {
        use rdkafka::error::KafkaError;
        match e {
            KafkaError::ClientConfig(res, desc, key, _) => Error::Kafka(KafkaError::ClientConfig(
                res,
                crate::redact::text(&desc).into_owned(),
                key,
                crate::redact::MASK.to_string(),
            )),
            e => Error::Kafka(e),
        }
    }
}

impl Error {
    /// Config errors may quote a value: registered secrets are masked.
    pub(crate) fn config(msg: impl Into<String>) -> Self {
        let msg = msg.into();
        Error::Config(crate::redact::text(&msg).into_owned())
    }

    pub(crate) fn kind(&self) -> ErrorKind {
        match self {
            Error::Config(_)
            | Error::Schema { .. }
            | Error::Incompatible { .. }
            | Error::SchemaChanges { .. } => ErrorKind::BadConfig,
            Error::Intolerable { .. } => ErrorKind::BadInput,
            Error::DeadLetter { .. }
            | Error::Unassigned { .. }
            | Error::EndUnreached { .. }
            | Error::RegistrySchemaGrew { .. } => ErrorKind::Retry,
            Error::Fenced { .. } | Error::ProducerFenced { .. } => ErrorKind::Fenced,
            Error::WalUnavailable { .. } => ErrorKind::Retry,
            Error::CommitConflict { .. } => ErrorKind::Conflict,
            Error::NotAuthorized { .. } => ErrorKind::NotAuthorized,
            Error::Kafka(_) | Error::Failpoint(_) => ErrorKind::Retry,
            Error::Lance { .. } if self.is_commit_race() => ErrorKind::Conflict,
            Error::Lance { source, .. } if passing_lance_failure(source) => ErrorKind::Retry,
            Error::Lance { source, .. } if source.fence_reason().is_some() => ErrorKind::Fenced,
            Error::Lance { .. } | Error::Arrow { .. } | Error::Broker(_) => ErrorKind::Retry,
            Error::Bug(_) => ErrorKind::Bug,
            Error::Corrupt(_) => ErrorKind::Corrupt,
            Error::NotFound(_) | Error::CommitExpired { .. } => ErrorKind::NotFound,
            Error::Panic { .. } => ErrorKind::Bug,
        }
    }

    /// Storage trouble that passes: the object store or disk failed after
    /// its own retries (5xx, timeouts, a refused or reset connection, an
    /// outage), or a shard writer gave up on its WAL. The run restarts its
    /// ingest session for these; a refusal (credentials, permissions, a
    /// missing table) is not one of them and stops the run.
    pub(crate) fn is_passing_storage_failure(&self) -> bool {
        match self {
            Error::WalUnavailable { .. } => true,
            Error::Lance { source, .. } => passing_lance_failure(source),
            _ => false,
        }
    }

    /// The librdkafka error code of a Kafka error, if this is one.
    pub(crate) fn kafka_code(&self) -> Option<rdkafka::types::RDKafkaErrorCode> {
        match self {
            Error::Kafka(k) => k.rdkafka_error_code(),
            _ => None,
        }
    }

    /// Another writer committed first: the graph's head or a table moved
    /// under this one (with several members, two folding during a
    /// hand-off). Nothing it acknowledged depends on the lost commit.
    pub(crate) fn is_commit_race(&self) -> bool {
        use lance::Error as L;
        match self {
            Error::CommitConflict { .. } => true,
            Error::Lance { source, .. } => {
                matches!(
                    source,
                    L::CommitConflict { .. }
                        | L::RetryableCommitConflict { .. }
                        | L::IncompatibleTransaction { .. }
                        | L::TooMuchWriteContention { .. }
                )
                // Another folder marked these generations folded first;
                // Lance reports it as invalid input (lance-table
                // `system_index/mem_wal.rs`), with no variant of its own.
                || (matches!(source, L::InvalidInput { .. })
                    && source.to_string().contains("Stale SSTable compaction"))
            }
            _ => false,
        }
    }

    /// A task that ended by panicking (or was cancelled) becomes `Panic`,
    /// never a retryable error.
    pub(crate) fn joined(task: &'static str, e: tokio::task::JoinError) -> Error {
        let message = match e.try_into_panic() {
            Ok(p) => p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-string panic".into()),
            Err(e) => e.to_string(),
        };
        Error::Panic { task, message }
    }
}

fn passing_lance_failure(e: &lance::Error) -> bool {
    use lance::Error as L;
    if matches!(
        e.fence_reason(),
        Some(lance_core::FenceReason::PersistenceFailure)
    ) {
        return true;
    }
    match e {
        L::Timeout { .. } | L::TooMuchWriteContention { .. } => true,
        L::IO { source, .. } => typed_io_failure(source.as_ref())
            .unwrap_or_else(|| stringified_store_failure(&e.to_string())),
        _ => e.is_backpressure(),
    }
}

/// Walks the source chain to the object-store or OS error at its root, if
/// it is still typed there.
fn typed_io_failure(mut e: &(dyn std::error::Error + 'static)) -> Option<bool> {
    loop {
        if let Some(os) = e.downcast_ref::<object_store::Error>() {
            return Some(matches!(
                os,
                object_store::Error::Generic { .. } | object_store::Error::JoinError { .. }
            ));
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return Some(
                io.kind() != std::io::ErrorKind::PermissionDenied
                    && io.kind() != std::io::ErrorKind::NotFound,
            );
        }
        if let Some(l) = e.downcast_ref::<lance::Error>() {
            return Some(passing_lance_failure(l));
        }
        e = e.source()?;
    }
}

/// Parts of Lance (the MemWAL manifest store, for one) format the store's
/// error into their message, dropping its type. object_store's `Display`
/// is stable: `Generic <store> error: ...` for request failures after its
/// retries, distinct wording for refusals.
fn stringified_store_failure(text: &str) -> bool {
    static GENERIC: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let generic = GENERIC.get_or_init(|| regex::Regex::new(r"Generic \w+ error:").expect("regex"));
    generic.is_match(text)
        && !text.contains("lacked the necessary privileges")
        && !text.contains("lacked valid authentication")
}

/// The text a user reads of a library's error (Lance, object_store,
/// librdkafka, Arrow, DataFusion): its message without the Rust source
/// locations some of them append. Every message or log line at INFO and
/// above that quotes a library's error takes its text from here; the full
/// text goes to the debug log.
pub(crate) fn shown(e: &(impl std::fmt::Display + ?Sized)) -> String {
    let full = e.to_string();
    let text = without_locations(&full);
    if text != full {
        tracing::debug!(error = %full, "a library error, with its source locations");
    }
    text
}

/// Lance's messages end with the source location that raised them (a
/// path in the Cargo registry and a line number): noise to a user, who
/// needs what happened and what to do.
fn without_locations(text: &str) -> String {
    static LOCATION: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let location = LOCATION.get_or_init(|| {
        regex::Regex::new(r",?\s*(location:\s*)?[^\s,]+\.rs:\d+:\d+").expect("regex")
    });
    location.replace_all(text, "").into_owned()
}

/// Adds context to Lance and Arrow results without a closure at every call.
pub(crate) trait Context<T> {
    fn ctx(self, context: impl std::fmt::Display) -> Result<T>;
}

impl<T> Context<T> for std::result::Result<T, lance::Error> {
    fn ctx(self, context: impl std::fmt::Display) -> Result<T> {
        self.map_err(|source| Error::Lance {
            context: context.to_string(),
            source,
        })
    }
}

impl<T> Context<T> for std::result::Result<T, arrow_schema::ArrowError> {
    fn ctx(self, context: impl std::fmt::Display) -> Result<T> {
        self.map_err(|source| Error::Arrow {
            context: context.to_string(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A broken invariant is a bug, not passing trouble; a failed Kafka
    /// operation of graphsink's own tools is.
    #[test]
    fn a_bug_is_not_retried_and_a_broker_failure_is() {
        let bug = Error::Bug("decoder produced no rows".into());
        assert_eq!(bug.kind(), ErrorKind::Bug);
        assert!(
            bug.to_string()
                .starts_with("internal error (a bug in graphsink"),
            "{bug}"
        );
        assert_eq!(
            Error::Broker("kafka: cannot list groups".into()).kind(),
            ErrorKind::Retry
        );
    }

    #[test]
    fn lance_errors_are_shown_without_source_locations() {
        let e = Error::Lance {
            context: "create /g/nodes/Item".into(),
            source: lance::Error::dataset_already_exists("/g/nodes/Item"),
        };
        let text = e.to_string();
        assert!(!text.contains(".rs:"), "{text}");
        assert!(
            text.contains("Dataset already exists: /g/nodes/Item"),
            "{text}"
        );
        assert_eq!(
            without_locations(
                "Append with different schema: x, location: /root/.cargo/registry/src/index/lance-14.0.2/src/dataset.rs:12:7 (then more)"
            ),
            "Append with different schema: x (then more)"
        );
    }

    /// A second folder's marker pass over generations another folder
    /// marked first is a race lost (e2e `two_folders_at_once_overlap…`);
    /// any other invalid input is not.
    #[test]
    fn a_stale_compaction_marker_is_a_commit_race() {
        let lance = |m: &str| Error::Lance {
            context: "commit fold".into(),
            source: lance::Error::invalid_input(m.to_string()),
        };
        assert!(lance("Stale SSTable compaction for shard s: proposed generation 1 is not greater than the recorded generation 1").is_commit_race());
        assert!(!lance("Append with different schema").is_commit_race());
    }

    /// What leaves the crate is a kind, a message and a source, and
    /// comes back into the crate whole: a commit race stays one.
    #[test]
    fn the_public_error_is_a_kind_a_message_and_a_source() {
        let race = Error::Lance {
            context: "commit fold".into(),
            source: lance::Error::invalid_input("Stale SSTable compaction for shard s"),
        };
        let public = PublicError::from(race);
        assert_eq!(public.kind(), ErrorKind::Conflict);
        assert_eq!(public.to_string(), public.message());
        assert!(!public.message().contains(".rs:"), "{public}");
        let source = std::error::Error::source(&public).expect("Lance's error");
        assert!(source.downcast_ref::<lance::Error>().is_some());
        assert!(Error::from(public).is_commit_race());
        let conflict = Error::CommitConflict {
            expected: "a".into(),
            found: "b".into(),
        };
        assert_eq!(PublicError::from(conflict).kind(), ErrorKind::Conflict);
        let plain = PublicError::from(Error::Corrupt("x".into()));
        assert_eq!(plain.kind(), ErrorKind::Corrupt);
        assert!(std::error::Error::source(&plain).is_none());
    }

    fn lance_io(e: impl std::error::Error + Send + Sync + 'static) -> Error {
        Error::Lance {
            context: "test".into(),
            source: lance::Error::io_source(Box::new(e)),
        }
    }

    /// Only failures that pass restart the ingest session; a refusal must
    /// stop the run, or a wrong credential would retry forever.
    #[test]
    fn passing_storage_failures_are_told_from_refusals() {
        let generic = object_store::Error::Generic {
            store: "S3",
            source: "HTTP 503 after 3 retries".into(),
        };
        assert!(lance_io(generic).is_passing_storage_failure());
        let denied = object_store::Error::PermissionDenied {
            path: "k".into(),
            source: "403".into(),
        };
        assert!(!lance_io(denied).is_passing_storage_failure());
        let unauth = object_store::Error::Unauthenticated {
            path: "k".into(),
            source: "401".into(),
        };
        assert!(!lance_io(unauth).is_passing_storage_failure());
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(lance_io(reset).is_passing_storage_failure());
        let eacces = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        assert!(!lance_io(eacces).is_passing_storage_failure());
        let wal = Error::WalUnavailable {
            table: "nodes/A".into(),
            bucket: 0,
            shard: uuid::Uuid::nil(),
            reason: "persistence failure".into(),
        };
        assert!(wal.is_passing_storage_failure());
        assert!(!Error::Corrupt("x".into()).is_passing_storage_failure());
        // As the MemWAL manifest store reports a list that failed: the
        // store's error only as text.
        let text = lance::Error::io(
            "Failed to list manifest versions for shard s: Generic S3 error: Error \
             performing list request: ... after 3 retries - HTTP error: error sending request",
        );
        let text = Error::Lance {
            context: "freeze".into(),
            source: text,
        };
        assert!(text.is_passing_storage_failure());
        let refused = lance::Error::io(
            "Failed to list: The operation lacked valid authentication credentials for path p",
        );
        let refused = Error::Lance {
            context: "freeze".into(),
            source: refused,
        };
        assert!(!refused.is_passing_storage_failure());
        let fenced = Error::Fenced {
            table: "nodes/A".into(),
            bucket: 0,
            shard: uuid::Uuid::nil(),
            reason: "peer claimed epoch".into(),
        };
        assert!(
            !fenced.is_passing_storage_failure(),
            "a peer's fence stops the run"
        );
    }

    #[tokio::test]
    async fn a_panicking_task_is_a_bug_not_a_retry() {
        let joined = tokio::spawn(async { panic!("boom") }).await.unwrap_err();
        let e = Error::joined("fold loop", joined);
        assert_eq!(e.kind(), ErrorKind::Bug);
        assert_eq!(e.to_string(), "fold loop panicked: boom");
        assert_eq!(
            Error::NotFound("graph commit x".into()).kind(),
            ErrorKind::NotFound
        );
    }
}
