//! graphsink: a Kafka sink connector for typed property graphs on Lance.
//!
//! Data flows one way: `kafka::consumer` → `decode` → `shards` (WAL) →
//! `offsets` → commits to Kafka; `fold` reads flushed WAL generations and
//! writes graph commits through `graph`. `pipeline::run` is the whole
//! connector; all librdkafka plumbing is in `kafka`; `query` holds the
//! operations behind the CLI's commands, and `cli` parses and prints.

pub mod cli;
pub mod config;
pub mod decode;
pub mod error;
pub mod failpoints;
pub mod fold;
pub mod graph;
pub(crate) mod kafka;
#[cfg(test)]
mod layers;
pub mod offsets;
pub mod pipeline;
pub(crate) mod query;
pub mod rejects;
pub mod schema;
pub mod shards;
pub mod types;
pub mod validate;

pub use config::Config;
pub use error::{Error, ErrorKind, Result};
pub use pipeline::{run, run_with, RunOptions, RunStats, RunSummary};
