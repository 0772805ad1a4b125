//! graphsink: a Kafka sink connector for typed property graphs on Lance.
//!
//! Data flows one way: `kafka::consumer` → `decode` → `validate` →
//! `shards` (WAL) → `offsets` → commits to Kafka; `fold` reads flushed WAL
//! generations and writes graph commits through `graph`. `run` is the whole
//! connector; `commands` holds what the CLI's commands do, and `cli` parses
//! and prints. docs/ARCHITECTURE.md maps every module.
//!
//! Every module is private; what a user (or the binary) needs is re-exported
//! here. graphsink's own tests and bench reach internals through `testing`.

mod cli;
mod commands;
mod config;
mod decode;
mod error;
mod failpoints;
mod fold;
mod graph;
mod http;
mod kafka;
mod known_ids;
#[cfg(test)]
mod layers;
mod metrics;
mod offsets;
mod pipeline;
mod read;
mod redact;
mod registry;
mod rejects;
mod retention;
mod runtime;
mod schema;
mod shards;
mod store;
pub mod testing;
mod types;
mod validate;

/// The `graphsink` command line (the binary is this one call).
pub use cli::main as cli_main;
/// What the CLI's commands do, as library calls.
pub use commands::produce::produce_file;
pub use commands::read::{neighbors as read_neighbors, read as read_rows};
pub use commands::rejects::{
    replay as replay_rejects, select as select_rejects, select_replay, RejectFilter,
    ReplaySelection,
};
pub use commands::status::{
    graph_status, kafka_status, GraphStatus, KafkaStatus, LastFold, PartitionStatus, PendingStatus,
    ShardState,
};
pub use commands::{
    check, commits, fold_offline, gc, migrate, snapshot, CheckSummary, MigrateReport, Snapshot,
    TableRows,
};
pub use config::{
    Coerce, Config, DeletePolicy, Encoding, EndpointPolicy, EnvelopeName, ErrorSettings, Evolve,
    FieldSource, FieldSpec, FoldSettings, GraphSettings, HttpSettings, KeyOrigin, KeySource,
    LogFormat, LogSettings, Mapping, OffsetSettings, OpValue, RetentionSettings, RuntimeSettings,
    StorageOptions, Tolerance, UnknownFields, WalSettings,
};
/// The public error: a kind a caller acts on, a message, a source.
pub use error::{ErrorKind, PublicError as Error, PublicResult as Result};
/// Reading a graph: its commits, and each table at the version a commit pins.
pub use graph::{row_counts, FoldedShard, Graph, GraphCommit, SchemaChange, TableStats};
/// The operator's endpoint: `/metrics`, `/health`, `/ready`.
pub use http::serve as serve_http;
pub use kafka::client::CONSUMER_DEFAULTS;
pub use kafka::queries::{GroupMember, GroupMembers, MissingTopic};
/// Metrics and probe state of one connector (docs/metrics.md).
pub use metrics::{
    Format as MetricsFormat, Health, Metrics, Readiness, RunTotals,
    CONTENT_TYPE as METRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE as METRICS_TEXT_CONTENT_TYPE,
};
pub use pipeline::{run, run_with, RunOptions, RunSummary};
/// Reading rows of a type at the head, at a commit, or fresh from the
/// MemWAL tier; one hop over edges (docs/reads.md).
pub use read::{
    one_hop, Direction, Hop, Neighbors, NeighborsRequest, ReadAt, ReadRequest, Rows, TIER,
};
pub use rejects::{Reject, RejectCode, Stage};
/// What retention removed, and storage per table.
pub use retention::{GcReport, Removed, TableGc, TableStorage};
pub use runtime::build as build_runtime;
pub use schema::GraphSchema;
pub use shards::{holder as shard_holder, ShardOwner};
pub use store::Store;
pub use types::{now_ms, OffsetRange, TopicPartition};
