//! What an operator watches: the Prometheus metrics of one connector
//! (docs/metrics.md is the contract: names, types, labels),
//! the state behind `/health` and `/ready`, and the run's totals. One
//! `Metrics` per connector, passed down (no global registry: tests run
//! several connectors in one process). It serves nothing itself (`http`
//! does) and decides nothing.
//!
//! Each stage reports through a method named for its event (`polled`,
//! `acked`, `folded`, ...), so call sites stay one line and label sets are
//! built here only: topic, partition, table, type, stage, code, result,
//! broker; never a key or an offset. The methods are grouped by who calls
//! them: `run` (the run loop), `fold` (the fold loop), `outlets` (the
//! dead-letter producer, the registry client, librdkafka's statistics);
//! `probes` reads the state they leave; `families` registers the series.

mod families;
mod fold;
mod format;
mod outlets;
mod probes;
mod run;
mod totals;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus_client::registry::Registry;

use crate::types::{now_ms, TopicPartition};
use families::{FoldFamilies, OutletFamilies, PartitionFamilies, RunLoopFamilies, TypeLabels};
pub use format::{Format, CONTENT_TYPE, TEXT_CONTENT_TYPE};
pub use probes::{Health, Readiness};
pub(crate) use totals::PollReport;
pub use totals::RunTotals;
use totals::Totals;

/// A per-partition gauge pair `lag` is derived from.
#[derive(Default, Clone, Copy)]
struct LagInputs {
    committed: Option<i64>,
    end: Option<i64>,
}

/// The metrics and probe state of one connector.
pub struct Metrics {
    registry: Registry,
    partitions: PartitionFamilies,
    run: RunLoopFamilies,
    fold: FoldFamilies,
    outlets: OutletFamilies,
    totals: Totals,
    lag_inputs: Mutex<BTreeMap<TopicPartition, LagInputs>>,
    /// Flush counts last read per shard writer, so the counter moves by
    /// the difference (a reopened writer starts again from 0).
    flushes_seen: Mutex<BTreeMap<(String, u32), u64>>,
    head_created_ms: AtomicI64,
    /// `_pending_since` of the oldest deferred edge per type (epoch ms).
    pending_oldest_ms: Mutex<BTreeMap<String, Option<i64>>>,

    stall_bound: Duration,
    clock: Instant,
    joined: AtomicBool,
    fenced: AtomicBool,
    dead_letters_retrying: AtomicU64,
    dead_letters_failing_since: AtomicU64,
    schema_registry_stalled: AtomicBool,
    /// Clock ms of the last durability progress while polls wait.
    durable_progress: AtomicU64,
    consecutive_fold_failures: AtomicU64,
    run_heartbeat: AtomicU64,
    fold_busy_since: AtomicU64,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new(Duration::from_secs(60))
    }
}

impl Metrics {
    /// `stall_bound`: how long a stall may last before `/ready` fails.
    pub fn new(stall_bound: Duration) -> Metrics {
        let mut registry = Registry::default();
        Metrics {
            partitions: PartitionFamilies::register(&mut registry),
            run: RunLoopFamilies::register(&mut registry),
            fold: FoldFamilies::register(&mut registry),
            outlets: OutletFamilies::register(&mut registry),
            registry,
            totals: Totals::default(),
            lag_inputs: Mutex::default(),
            flushes_seen: Mutex::default(),
            head_created_ms: AtomicI64::new(0),
            pending_oldest_ms: Mutex::default(),
            stall_bound,
            clock: Instant::now(),
            joined: AtomicBool::new(false),
            fenced: AtomicBool::new(false),
            dead_letters_retrying: AtomicU64::new(0),
            dead_letters_failing_since: AtomicU64::new(0),
            schema_registry_stalled: AtomicBool::new(false),
            durable_progress: AtomicU64::new(0),
            consecutive_fold_failures: AtomicU64::new(0),
            run_heartbeat: AtomicU64::new(0),
            fold_busy_since: AtomicU64::new(0),
        }
    }

    /// What the run has done so far, summed over its sessions.
    pub fn totals(&self) -> RunTotals {
        self.totals.snapshot()
    }

    /// Milliseconds on this connector's monotonic clock, from 1.
    fn tick(&self) -> u64 {
        self.clock.elapsed().as_millis() as u64 + 1
    }

    fn older_than(&self, since: u64, bound: Duration) -> bool {
        since != 0 && self.tick().saturating_sub(since) > bound.as_millis() as u64
    }

    /// The exposition in OpenMetrics text, with the scrape-time gauges
    /// (ages) brought up to date.
    pub fn encode(&self) -> String {
        self.encode_as(Format::OpenMetrics)
    }

    /// The exposition in `format`, with the scrape-time gauges brought up
    /// to date. Names are the same in both (counters end in `_total`).
    pub fn encode_as(&self, format: Format) -> String {
        let now = now_ms();
        let created = self.head_created_ms.load(Ordering::Relaxed);
        if created > 0 {
            self.fold.head_age.set(secs_since(created, now));
        }
        for (t, oldest) in self.pending_oldest_ms.lock().expect("pending").iter() {
            let age = oldest.map_or(0.0, |o| secs_since(o, now));
            self.fold
                .pending_edges_oldest
                .get_or_create(&TypeLabels { r#type: t.clone() })
                .set(age);
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = match format {
            Format::OpenMetrics => {
                prometheus_client::encoding::text::encode(&mut out, &self.registry)
            }
            Format::Text => {
                prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)
            }
        };
        out
    }
}

fn secs_since(ms: i64, now: i64) -> f64 {
    (now - ms).max(0) as f64 / 1000.0
}
