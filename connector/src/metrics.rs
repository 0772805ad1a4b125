//! What an operator watches: the Prometheus metrics of one connector
//! (docs/decisions/0006-metrics.md is the contract: names, types, labels) and the state
//! behind `/health` and `/ready`. One `Metrics` per connector, passed down
//! (no global registry: tests run several connectors in one process). It
//! serves nothing itself (`http` does) and decides nothing.
//!
//! Each stage reports through a method named for its event (`polled`,
//! `acked`, `folded`, ...), so call sites stay one line and label sets are
//! built here only: topic, partition, table, type, stage, code, result,
//! broker; never a key or an offset.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::types::{now_ms, TopicPartition};

/// The Content-Type of `/metrics` for a scraper that asks for OpenMetrics
/// (Prometheus 2 and 3 do; Prometheus 3 refuses a scrape without a valid one).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The Content-Type of `/metrics` otherwise: the Prometheus text format
/// 0.0.4, which `curl … | promtool check metrics` lints (promtool reads no
/// OpenMetrics: it would take each counter's `_total` sample for a metric
/// of its own).
pub const TEXT_CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Which exposition format `/metrics` answers in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    OpenMetrics,
    Text,
}

impl Format {
    /// The format an `Accept` header asks for: OpenMetrics when it names
    /// it, the Prometheus text format otherwise.
    pub fn accepted(accept: Option<&str>) -> Format {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Text,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => CONTENT_TYPE,
            Format::Text => TEXT_CONTENT_TYPE,
        }
    }
}

/// Consecutive failed folds after which `/ready` reports `folds_failing`.
pub(crate) const FOLD_FAILURES_NOT_READY: u64 = 3;

/// A loop whose heartbeat is older than this fails `/health`.
pub(crate) const HEARTBEAT_BOUND: Duration = Duration::from_secs(30);

/// One fold longer than this fails `/health` (the fold histogram's top
/// bucket is ~5 min; twice that is a stuck fold, not a big one).
pub(crate) const FOLD_BOUND: Duration = Duration::from_secs(600);

type FloatGauge = Gauge<f64, AtomicU64>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PartitionLabels {
    topic: String,
    partition: i32,
}

fn part(tp: &TopicPartition) -> PartitionLabels {
    PartitionLabels {
        topic: tp.0.clone(),
        partition: tp.1,
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TableLabels {
    table: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TableOpLabels {
    table: String,
    op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TypeLabels {
    r#type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RejectLabels {
    stage: &'static str,
    code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BrokerLabels {
    broker: String,
}

/// What `/ready` answers, with the condition that failed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Readiness {
    pub ready: bool,
    pub joined: bool,
    pub fenced: bool,
    pub dead_letters_stalled: bool,
    /// A partition holds at a record whose schema the registry has not
    /// answered for (down, slow, 5xx): nothing past it is ingested.
    pub schema_registry_stalled: bool,
    pub durability_stalled: bool,
    pub folds_failing: bool,
}

/// What `/health` answers.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Health {
    pub healthy: bool,
    /// Seconds since the run loop last ticked (absent before it started).
    pub run_loop_age_seconds: Option<u64>,
    /// Seconds the fold loop has been inside its current fold (absent: idle).
    pub fold_busy_seconds: Option<u64>,
}

/// A per-partition gauge pair `lag` is derived from.
#[derive(Default, Clone, Copy)]
struct LagInputs {
    committed: Option<i64>,
    end: Option<i64>,
}

/// The metrics and probe state of one connector.
pub struct Metrics {
    registry: Registry,
    consumed_offset: Family<PartitionLabels, Gauge>,
    durable_offset: Family<PartitionLabels, Gauge>,
    committed_offset: Family<PartitionLabels, Gauge>,
    folded_offset: Family<PartitionLabels, Gauge>,
    end_offset: Family<PartitionLabels, Gauge>,
    lag: Family<PartitionLabels, Gauge>,
    records_consumed: Family<PartitionLabels, Counter>,
    bytes_consumed: Family<PartitionLabels, Counter>,
    assigned: Family<PartitionLabels, Gauge>,
    durable_ack: Histogram,
    graph_visible: Histogram,
    folds: Counter,
    fold_failures: Counter,
    fold_seconds: Histogram,
    fold_rows: Family<TableOpLabels, Counter>,
    fold_last_success: FloatGauge,
    head_seq: Gauge,
    head_age: FloatGauge,
    rejects: Family<RejectLabels, Counter>,
    dead_letters: Family<ResultLabels, Counter>,
    dead_letters_pending: Gauge,
    schema_registry_requests: Family<ResultLabels, Counter>,
    pending_edges: Family<TypeLabels, Gauge>,
    pending_edges_oldest: Family<TypeLabels, FloatGauge>,
    polls_in_flight: Gauge,
    memtable_rows: Family<TableLabels, Gauge>,
    memtable_bytes: Family<TableLabels, Gauge>,
    wal_flushes: Family<TableLabels, Counter>,
    breaker_open: Gauge,
    fenced_total: Counter,
    session_restarts: Counter,
    kafka_consumer_lag: Family<PartitionLabels, Gauge>,
    kafka_broker_rtt: Family<BrokerLabels, FloatGauge>,
    kafka_fetch_queue: Gauge,

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
        let mut r = Registry::default();
        macro_rules! reg {
            ($name:literal, $help:literal, $m:expr) => {{
                let m = $m;
                r.register($name, $help, m.clone());
                m
            }};
        }
        // prometheus-client appends `_total` to counters itself.
        Metrics {
            consumed_offset: reg!(
                "graphsink_consumed_offset",
                "Next offset the run loop took from Kafka",
                Family::default()
            ),
            durable_offset: reg!(
                "graphsink_durable_offset",
                "Durable watermark: every record below it is in the WAL (or a reject in both sinks)",
                Family::default()
            ),
            committed_offset: reg!(
                "graphsink_committed_offset",
                "Offset committed to the consumer group",
                Family::default()
            ),
            folded_offset: reg!(
                "graphsink_folded_offset",
                "One past the newest offset a published graph commit holds",
                Family::default()
            ),
            end_offset: reg!(
                "graphsink_end_offset",
                "The partition's high watermark (librdkafka statistics)",
                Family::default()
            ),
            lag: reg!(
                "graphsink_lag",
                "End offset minus committed offset, at least 0",
                Family::default()
            ),
            records_consumed: reg!(
                "graphsink_records_consumed",
                "Records taken from Kafka",
                Family::default()
            ),
            bytes_consumed: reg!(
                "graphsink_bytes_consumed",
                "Key and value bytes taken from Kafka",
                Family::default()
            ),
            assigned: reg!(
                "graphsink_assigned",
                "1 while this member holds the partition",
                Family::default()
            ),
            durable_ack: reg!(
                "graphsink_durable_ack_seconds",
                "A poll taken until its durable ack is applied",
                Histogram::new(exponential_buckets(0.001, 2.0, 15))
            ),
            graph_visible: reg!(
                "graphsink_graph_visible_seconds",
                "The oldest record of a fold taken until the fold's graph commit is published",
                Histogram::new(exponential_buckets(0.01, 2.0, 16))
            ),
            folds: reg!("graphsink_folds", "Published folds", Counter::default()),
            fold_failures: reg!(
                "graphsink_fold_failures",
                "Folds that failed",
                Counter::default()
            ),
            fold_seconds: reg!(
                "graphsink_fold_seconds",
                "One fold, cut to publish",
                Histogram::new(exponential_buckets(0.01, 2.0, 16))
            ),
            fold_rows: reg!(
                "graphsink_fold_rows",
                "Rows folded into base tables, by op (upserted, deleted, rejected)",
                Family::default()
            ),
            fold_last_success: reg!(
                "graphsink_fold_last_success_timestamp_seconds",
                "Unix time of the last published fold",
                FloatGauge::default()
            ),
            head_seq: reg!(
                "graphsink_head_seq",
                "Sequence number of the head graph commit",
                Gauge::default()
            ),
            head_age: reg!(
                "graphsink_head_age_seconds",
                "Age of the head graph commit at scrape time",
                FloatGauge::default()
            ),
            rejects: reg!(
                "graphsink_rejects",
                "Rejects recorded, by stage and code",
                Family::default()
            ),
            dead_letters: reg!(
                "graphsink_dead_letters",
                "Dead-letter produce attempts, by result",
                Family::default()
            ),
            dead_letters_pending: reg!(
                "graphsink_dead_letters_pending",
                "Rejects waiting for the dead-letter topic",
                Gauge::default()
            ),
            schema_registry_requests: reg!(
                "graphsink_schema_registry_requests",
                "Schema Registry requests, by result (ok, not_found, refused, unavailable)",
                {
                    // Every result from the start, at 0: a rate over a
                    // series that appears only at its first failure misses
                    // that failure.
                    let f = Family::<ResultLabels, Counter>::default();
                    for result in ["ok", "not_found", "refused", "unavailable"] {
                        drop(f.get_or_create(&ResultLabels { result }));
                    }
                    f
                }
            ),
            pending_edges: reg!(
                "graphsink_pending_edges",
                "Deferred edges at the head, by edge type",
                Family::default()
            ),
            pending_edges_oldest: reg!(
                "graphsink_pending_edges_oldest_seconds",
                "Age of the oldest deferred edge, by edge type",
                Family::default()
            ),
            polls_in_flight: reg!(
                "graphsink_polls_in_flight",
                "Polls awaiting durability",
                Gauge::default()
            ),
            memtable_rows: reg!(
                "graphsink_memtable_rows",
                "Rows in the active memtables",
                Family::default()
            ),
            memtable_bytes: reg!(
                "graphsink_memtable_bytes",
                "Bytes held by the memtables (active and frozen)",
                Family::default()
            ),
            wal_flushes: reg!(
                "graphsink_wal_flushes",
                "Memtable flushes to generations",
                Family::default()
            ),
            breaker_open: reg!(
                "graphsink_breaker_open",
                "1 while the reject-rate breaker pauses fetching",
                Gauge::default()
            ),
            fenced_total: reg!(
                "graphsink_fenced",
                "Writers fenced by another writer",
                Counter::default()
            ),
            session_restarts: reg!(
                "graphsink_session_restarts",
                "Ingest sessions restarted in process",
                Counter::default()
            ),
            kafka_consumer_lag: reg!(
                "graphsink_kafka_consumer_lag",
                "librdkafka's consumer_lag",
                Family::default()
            ),
            kafka_broker_rtt: reg!(
                "graphsink_kafka_broker_rtt_seconds",
                "librdkafka's average broker round trip",
                Family::default()
            ),
            kafka_fetch_queue: reg!(
                "graphsink_kafka_fetch_queue_messages",
                "Messages in librdkafka's pre-fetch queue",
                Gauge::default()
            ),
            registry: r,
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
            self.head_age.set(secs_since(created, now));
        }
        for (t, oldest) in self.pending_oldest_ms.lock().expect("pending").iter() {
            let age = oldest.map_or(0.0, |o| secs_since(o, now));
            self.pending_edges_oldest
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

    // ---- the run loop ----

    /// A new ingest session starts: it has not joined yet, and its writers
    /// are not (yet) fenced.
    pub fn session_started(&self) {
        self.joined.store(false, Ordering::Relaxed);
        self.fenced.store(false, Ordering::Relaxed);
        self.polls_in_flight.set(0);
    }

    pub fn session_restarted(&self) {
        self.session_restarts.inc();
    }

    /// The run loop is alive (stamped at every turn of its loop).
    pub fn run_loop_tick(&self) {
        self.run_heartbeat.store(self.tick(), Ordering::Relaxed);
    }

    /// The run loop ended (its probes report it until the process exits).
    pub fn run_loop_stopped(&self) {
        self.run_heartbeat.store(0, Ordering::Relaxed);
        self.joined.store(false, Ordering::Relaxed);
    }

    /// One poll's records of one partition: `next` is one past its newest.
    pub fn polled(&self, tp: &TopicPartition, records: u64, bytes: u64, next: i64) {
        let l = part(tp);
        self.records_consumed.get_or_create(&l).inc_by(records);
        self.bytes_consumed.get_or_create(&l).inc_by(bytes);
        self.consumed_offset.get_or_create(&l).set(next);
    }

    /// Polls awaiting durability; a wait that starts restarts the stall clock.
    pub fn polls_in_flight(&self, n: usize) {
        let before = self.polls_in_flight.set(n as i64);
        if before == 0 && n > 0 {
            self.durable_progress.store(self.tick(), Ordering::Relaxed);
        }
    }

    /// A poll's durable ack was applied, `taken` after it was taken.
    pub fn acked(&self, taken: Duration) {
        self.durable_ack.observe(taken.as_secs_f64());
        self.durable_progress.store(self.tick(), Ordering::Relaxed);
    }

    pub fn durable(&self, tp: &TopicPartition, next: i64) {
        self.durable_offset.get_or_create(&part(tp)).set(next);
    }

    pub fn committed(&self, tp: &TopicPartition, next: i64) {
        self.committed_offset.get_or_create(&part(tp)).set(next);
        self.lag_input(tp, |l| l.committed = Some(next));
    }

    pub fn assigned(&self, tps: &[TopicPartition]) {
        self.joined.store(true, Ordering::Relaxed);
        for tp in tps {
            self.assigned.get_or_create(&part(tp)).set(1);
        }
    }

    pub fn revoked(&self, tps: &[TopicPartition]) {
        for tp in tps {
            self.assigned.get_or_create(&part(tp)).set(0);
        }
    }

    pub fn rejected(&self, stage: &'static str, code: &'static str) {
        self.rejects
            .get_or_create(&RejectLabels { stage, code })
            .inc();
    }

    pub fn breaker(&self, open: bool) {
        self.breaker_open.set(open as i64);
    }

    /// A writer of this connector was fenced by another writer.
    pub fn fenced(&self) {
        self.fenced_total.inc();
        self.fenced.store(true, Ordering::Relaxed);
    }

    /// One shard writer's memtable: rows, bytes, and its flush count so far.
    pub fn memtable(&self, table: &str, bucket: u32, rows: u64, bytes: u64, flushes: u64) {
        let l = TableLabels {
            table: table.to_string(),
        };
        let mut seen = self.flushes_seen.lock().expect("flushes");
        let before = seen
            .insert((table.to_string(), bucket), flushes)
            .unwrap_or(0);
        self.wal_flushes
            .get_or_create(&l)
            .inc_by(flushes.saturating_sub(before));
        drop(seen);
        // Gauges per table: summed over buckets by the caller's order (bucket 0 first).
        let rows_g = self.memtable_rows.get_or_create(&l);
        let bytes_g = self.memtable_bytes.get_or_create(&l);
        if bucket == 0 {
            rows_g.set(rows as i64);
            bytes_g.set(bytes as i64);
        } else {
            rows_g.inc_by(rows as i64);
            bytes_g.inc_by(bytes as i64);
        }
    }

    /// A reopened writer counts its flushes from 0 again.
    pub fn writers_reopened(&self) {
        self.flushes_seen.lock().expect("flushes").clear();
    }

    // ---- the fold loop ----

    pub fn fold_started(&self) {
        self.fold_busy_since.store(self.tick(), Ordering::Relaxed);
    }

    pub fn fold_failed(&self) {
        self.fold_busy_since.store(0, Ordering::Relaxed);
        self.fold_failures.inc();
        self.consecutive_fold_failures
            .fetch_add(1, Ordering::Relaxed);
    }

    /// A fold ended without failing (published, or nothing to fold).
    pub fn fold_ended(&self) {
        self.fold_busy_since.store(0, Ordering::Relaxed);
        self.consecutive_fold_failures.store(0, Ordering::Relaxed);
    }

    /// A published fold: its duration, rows per table, and the oldest of
    /// its records' age.
    pub fn folded(
        &self,
        took: Duration,
        oldest_taken: Option<Instant>,
        rows: impl IntoIterator<Item = (String, [u64; 3])>,
    ) {
        self.folds.inc();
        self.fold_seconds.observe(took.as_secs_f64());
        if let Some(t) = oldest_taken {
            self.graph_visible.observe(t.elapsed().as_secs_f64());
        }
        for (table, [upserted, deleted, rejected]) in rows {
            for (op, n) in [
                ("upserted", upserted),
                ("deleted", deleted),
                ("rejected", rejected),
            ] {
                let l = TableOpLabels {
                    table: table.clone(),
                    op,
                };
                self.fold_rows.get_or_create(&l).inc_by(n);
            }
        }
        self.fold_last_success.set(now_ms() as f64 / 1000.0);
    }

    /// The head graph commit (at start and after each publish).
    pub fn head(&self, seq: u64, created_at_ms: i64) {
        self.head_seq.set(seq as i64);
        self.head_created_ms.store(created_at_ms, Ordering::Relaxed);
    }

    /// One past the newest offset a published commit holds of `tp`.
    pub fn folded_offset(&self, tp: &TopicPartition, next: i64) {
        let g = self.folded_offset.get_or_create(&part(tp));
        if next > g.get() {
            g.set(next);
        }
    }

    /// Deferred edges of one edge type at the head.
    pub fn pending_edges(&self, edge_type: &str, count: u64, oldest_ms: Option<i64>) {
        let l = TypeLabels {
            r#type: edge_type.to_string(),
        };
        self.pending_edges.get_or_create(&l).set(count as i64);
        self.pending_oldest_ms
            .lock()
            .expect("pending")
            .insert(edge_type.to_string(), oldest_ms);
    }

    // ---- the dead-letter producer ----

    /// Rejects queued for the dead-letter topic.
    pub fn dead_letters_queued(&self, n: usize) {
        self.dead_letters_pending.inc_by(n as i64);
    }

    /// One round of produce attempts: `ok` acknowledged, `failed` not.
    pub fn dead_letters_sent(&self, ok: usize, failed: usize) {
        let c = |result| self.dead_letters.get_or_create(&ResultLabels { result });
        c("succeeded").inc_by(ok as u64);
        c("failed").inc_by(failed as u64);
        self.dead_letters_pending.dec_by(ok as i64);
    }

    /// Rejects found on the dead-letter topic already (produced before a
    /// crash): not produced again.
    pub fn dead_letters_skipped(&self, n: usize) {
        if n > 0 {
            let c = self
                .dead_letters
                .get_or_create(&ResultLabels { result: "skipped" });
            c.inc_by(n as u64);
            self.dead_letters_pending.dec_by(n as i64);
        }
    }

    /// Rejects no longer waiting without being delivered (a stop).
    pub fn dead_letters_abandoned(&self, n: usize) {
        self.dead_letters_pending.dec_by(n as i64);
    }

    /// A delivery started retrying (`true`) or stopped (`false`).
    pub fn dead_letters_retrying(&self, retrying: bool) {
        if retrying {
            if self.dead_letters_retrying.fetch_add(1, Ordering::Relaxed) == 0 {
                self.dead_letters_failing_since
                    .store(self.tick(), Ordering::Relaxed);
            }
        } else if self.dead_letters_retrying.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.dead_letters_failing_since.store(0, Ordering::Relaxed);
        }
    }

    // ---- the schema registry ----

    /// Whether a partition waits on a schema the registry does not give.
    pub fn schema_registry_stalled(&self, stalled: bool) {
        self.schema_registry_stalled
            .store(stalled, Ordering::Relaxed);
    }

    /// One registry request ended with `result` (`registry::Outcome`).
    pub fn schema_registry_request(&self, result: &'static str) {
        self.schema_registry_requests
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    // ---- librdkafka statistics ----

    pub fn kafka_partition(&self, tp: &TopicPartition, consumer_lag: i64, end: i64) {
        let l = part(tp);
        if consumer_lag >= 0 {
            self.kafka_consumer_lag.get_or_create(&l).set(consumer_lag);
        }
        if end >= 0 {
            self.end_offset.get_or_create(&l).set(end);
            self.lag_input(tp, |li| li.end = Some(end));
        }
    }

    pub fn kafka_broker_rtt(&self, broker: &str, avg_micros: i64) {
        let l = BrokerLabels {
            broker: broker.to_string(),
        };
        self.kafka_broker_rtt
            .get_or_create(&l)
            .set(avg_micros.max(0) as f64 / 1e6);
    }

    pub fn kafka_fetch_queue(&self, messages: i64) {
        self.kafka_fetch_queue.set(messages);
    }

    fn lag_input(&self, tp: &TopicPartition, f: impl FnOnce(&mut LagInputs)) {
        let mut all = self.lag_inputs.lock().expect("lag");
        let l = all.entry(tp.clone()).or_default();
        f(l);
        if let (Some(c), Some(e)) = (l.committed, l.end) {
            self.lag.get_or_create(&part(tp)).set((e - c).max(0));
        }
    }

    // ---- probes ----

    pub fn readiness(&self) -> Readiness {
        let joined = self.joined.load(Ordering::Relaxed);
        let fenced = self.fenced.load(Ordering::Relaxed);
        let bound = self.stall_bound;
        let dead_letters_stalled = self.dead_letters_retrying.load(Ordering::Relaxed) > 0
            && self.older_than(
                self.dead_letters_failing_since.load(Ordering::Relaxed),
                bound,
            );
        let durability_stalled = self.polls_in_flight.get() > 0
            && self.older_than(self.durable_progress.load(Ordering::Relaxed), bound);
        let folds_failing =
            self.consecutive_fold_failures.load(Ordering::Relaxed) >= FOLD_FAILURES_NOT_READY;
        let schema_registry_stalled = self.schema_registry_stalled.load(Ordering::Relaxed);
        Readiness {
            ready: joined
                && !fenced
                && !dead_letters_stalled
                && !schema_registry_stalled
                && !durability_stalled
                && !folds_failing,
            joined,
            fenced,
            dead_letters_stalled,
            schema_registry_stalled,
            durability_stalled,
            folds_failing,
        }
    }

    pub fn health(&self) -> Health {
        let now = self.tick();
        let age = |t: u64| (t != 0).then(|| now.saturating_sub(t) / 1000);
        let run = self.run_heartbeat.load(Ordering::Relaxed);
        let fold = self.fold_busy_since.load(Ordering::Relaxed);
        // Before the run loop starts (opening, recovering) the process is
        // alive; `/ready` says it is not serving yet.
        let healthy = !self.older_than(run, HEARTBEAT_BOUND) && !self.older_than(fold, FOLD_BOUND);
        Health {
            healthy,
            run_loop_age_seconds: age(run),
            fold_busy_seconds: age(fold),
        }
    }
}

fn secs_since(ms: i64, now: i64) -> f64 {
    (now - ms).max(0) as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(p: i32) -> TopicPartition {
        ("t".to_string(), p)
    }

    #[test]
    fn counters_get_total_and_labels_stay_bounded() {
        let m = Metrics::default();
        m.polled(&tp(0), 3, 30, 3);
        m.rejected("decode", "not_json");
        let text = m.encode();
        assert!(
            text.contains("graphsink_records_consumed_total{topic=\"t\",partition=\"0\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("graphsink_rejects_total{stage=\"decode\",code=\"not_json\"} 1"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
        // The Prometheus text format names the counter family `_total` too.
        let text = m.encode_as(Format::Text);
        assert!(
            text.contains("# TYPE graphsink_records_consumed_total counter"),
            "{text}"
        );
        assert!(!text.contains("# EOF"), "{text}");
    }

    #[test]
    fn accept_header_picks_the_format() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::accepted(Some(prometheus)), Format::OpenMetrics);
        assert_eq!(Format::accepted(Some("*/*")), Format::Text);
        assert_eq!(Format::accepted(None), Format::Text);
    }

    #[test]
    fn lag_is_end_minus_committed() {
        let m = Metrics::default();
        m.kafka_partition(&tp(1), 7, 10);
        assert!(!m.encode().contains("graphsink_lag{"));
        m.committed(&tp(1), 4);
        assert!(m
            .encode()
            .contains("graphsink_lag{topic=\"t\",partition=\"1\"} 6"));
    }

    #[test]
    fn readiness_names_what_fails() {
        let m = Metrics::new(Duration::ZERO);
        assert!(!m.readiness().ready && !m.readiness().joined);
        m.assigned(&[]);
        assert!(m.readiness().ready);
        for _ in 0..FOLD_FAILURES_NOT_READY {
            m.fold_failed();
        }
        assert!(m.readiness().folds_failing);
        m.fold_ended();
        m.dead_letters_retrying(true);
        std::thread::sleep(Duration::from_millis(5));
        assert!(m.readiness().dead_letters_stalled);
        m.dead_letters_retrying(false);
        m.polls_in_flight(1);
        std::thread::sleep(Duration::from_millis(5));
        assert!(m.readiness().durability_stalled);
        m.acked(Duration::from_millis(1));
        m.polls_in_flight(0);
        assert!(m.readiness().ready);
        m.schema_registry_stalled(true);
        assert!(!m.readiness().ready && m.readiness().schema_registry_stalled);
        m.schema_registry_stalled(false);
        assert!(m.readiness().ready);
        m.fenced();
        assert_eq!(
            m.readiness(),
            Readiness {
                ready: false,
                joined: true,
                fenced: true,
                dead_letters_stalled: false,
                schema_registry_stalled: false,
                durability_stalled: false,
                folds_failing: false
            }
        );
    }

    #[test]
    fn flush_counts_move_by_difference() {
        let m = Metrics::default();
        m.memtable("nodes/P", 0, 5, 100, 2);
        m.memtable("nodes/P", 1, 1, 10, 1);
        m.memtable("nodes/P", 0, 0, 0, 3);
        let text = m.encode();
        assert!(
            text.contains("graphsink_wal_flushes_total{table=\"nodes/P\"} 4"),
            "{text}"
        );
    }
}
