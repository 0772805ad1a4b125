//! The independent checker. It knows graphsink only through what a user
//! sees: the topics (read back with a plain consumer, so it judges what
//! Kafka holds, duplicates from producer retries included), the group's
//! committed offsets, the dead-letter topic, and the graph read with plain
//! Lance at the versions the head graph commit in `__manifest` pins.
//!
//! The parts: `kafka` (the topics read back, the group's committed
//! offsets), `graph` (the graph read with Lance), `stream` (what the
//! stream says must hold), `judge` (the checks) and `rejects` (the reject
//! table and the dead-letter topic); `judge` calls `rejects`, never back,
//! and both fill the `Tally` kept here.

mod graph;
mod judge;
mod kafka;
mod rejects;
mod stream;

use std::collections::BTreeMap;

use rdkafka::config::ClientConfig;
use serde_json::Value;

use crate::reach::Reach;
use crate::workload::EXPECT;

pub(crate) use graph::{schema_version, snapshot, GraphRoot};
pub(crate) use judge::{check_committed, check_final};
pub(crate) use kafka::{committed, CommitSampler, Tail};
pub(crate) use stream::expected;

pub(crate) type Res<T> = Result<T, String>;

/// Tallies of one check, for the report: `judge` counts rows, `rejects`
/// the rejects and dead letters.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub(crate) struct Tally {
    /// Sequence number of the head graph commit.
    pub head_seq: u64,
    pub nodes: usize,
    pub edges: usize,
    pub rejects: usize,
    pub dead_letters: usize,
    /// Record rejects produced again after a crash (at least once, as
    /// Kafka Connect's): their offsets were not committed yet.
    pub dead_letter_duplicates: usize,
}

/// One message as Kafka holds it.
#[derive(Debug, Clone)]
pub(crate) struct Msg {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: BTreeMap<String, String>,
}

impl Msg {
    fn expect(&self) -> &str {
        self.headers.get(EXPECT).map_or("", String::as_str)
    }
    fn key_str(&self) -> Option<String> {
        self.key
            .as_ref()
            .map(|k| String::from_utf8_lossy(k).into_owned())
    }
    fn json(&self) -> Option<Value> {
        self.value
            .as_ref()
            .and_then(|v| serde_json::from_slice(v).ok())
    }
    fn coords(&self) -> (String, i32, i64) {
        (self.topic.clone(), self.partition, self.offset)
    }
}

fn client(kafka: &Reach) -> ClientConfig {
    let mut c = kafka.config();
    c.set("enable.auto.commit", "false").set("log_level", "3");
    c
}
