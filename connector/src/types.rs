//! Plain values every layer shares: a topic partition, an offset range, the
//! clock. A leaf: it imports nothing from the crate.

use serde::{Deserialize, Serialize};

/// A Kafka topic partition.
pub type TopicPartition = (String, i32);

/// Source records a commit folded, per topic partition (inclusive bounds).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct OffsetRange {
    pub topic: String,
    pub partition: i32,
    pub first: i64,
    pub last: i64,
}

/// Wall-clock milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}
