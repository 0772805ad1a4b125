//! `[wal]`: the MemWAL shards (how many, how rows find them) and their writers.

use super::*;

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
pub(super) fn check_buckets(field: &str, n: u32) -> Result<()> {
    if !(1..=1024).contains(&n) {
        return Err(Error::config(format!(
            "{field} must be in 1..=1024, got {n}"
        )));
    }
    Ok(())
}
/// Buckets N per type when `wal.buckets` is unset (bucket sharding).
pub(super) const DEFAULT_BUCKETS: u32 = 4;
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
