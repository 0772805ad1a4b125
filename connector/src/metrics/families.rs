//! The metric families graphsink registers (docs/metrics.md
//! is the contract: names, types, labels), in four groups by who reports
//! them, and their label sets. prometheus-client appends `_total` to
//! counters itself.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Metric, Registry};

use crate::types::TopicPartition;

/// Registers `metric` under `name` and returns it (a handle to the same series).
fn reg<M: Metric + Clone>(r: &mut Registry, name: &str, help: &str, metric: M) -> M {
    r.register(name, help, metric.clone());
    metric
}

pub(super) type FloatGauge = Gauge<f64, AtomicU64>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct PartitionLabels {
    pub(super) topic: String,
    pub(super) partition: i32,
}

pub(super) fn part(tp: &TopicPartition) -> PartitionLabels {
    PartitionLabels {
        topic: tp.0.clone(),
        partition: tp.1,
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct TableLabels {
    pub(super) table: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct TableOpLabels {
    pub(super) table: String,
    pub(super) op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct PhaseLabels {
    pub(super) phase: &'static str,
}

/// A histogram family: every series gets the same buckets.
pub(super) type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct TypeLabels {
    pub(super) r#type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RejectLabels {
    pub(super) stage: &'static str,
    pub(super) code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ResultLabels {
    pub(super) result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct BrokerLabels {
    pub(super) broker: String,
}

/// Per-partition offsets, lag and consumption (labels: topic, partition).
pub(super) struct PartitionFamilies {
    pub(super) consumed_offset: Family<PartitionLabels, Gauge>,
    pub(super) durable_offset: Family<PartitionLabels, Gauge>,
    pub(super) committed_offset: Family<PartitionLabels, Gauge>,
    pub(super) folded_offset: Family<PartitionLabels, Gauge>,
    pub(super) end_offset: Family<PartitionLabels, Gauge>,
    pub(super) lag: Family<PartitionLabels, Gauge>,
    pub(super) records_consumed: Family<PartitionLabels, Counter>,
    pub(super) bytes_consumed: Family<PartitionLabels, Counter>,
    pub(super) assigned: Family<PartitionLabels, Gauge>,
    pub(super) kafka_consumer_lag: Family<PartitionLabels, Gauge>,
}

impl PartitionFamilies {
    pub(super) fn register(r: &mut Registry) -> Self {
        PartitionFamilies {
            consumed_offset: reg(
                r,
                "graphsink_consumed_offset",
                "Next offset the run loop took from Kafka",
                Family::default(),
            ),
            durable_offset: reg(
                r,
                "graphsink_durable_offset",
                "Durable watermark: every record below it is in the WAL (or a reject in both sinks)",
                Family::default(),
            ),
            committed_offset: reg(
                r,
                "graphsink_committed_offset",
                "Offset committed to the consumer group",
                Family::default(),
            ),
            folded_offset: reg(
                r,
                "graphsink_folded_offset",
                "One past the newest offset a published graph commit holds",
                Family::default(),
            ),
            end_offset: reg(
                r,
                "graphsink_end_offset",
                "The partition's high watermark (librdkafka statistics)",
                Family::default(),
            ),
            lag: reg(
                r,
                "graphsink_lag",
                "End offset minus committed offset, at least 0",
                Family::default(),
            ),
            records_consumed: reg(
                r,
                "graphsink_records_consumed",
                "Records taken from Kafka",
                Family::default(),
            ),
            bytes_consumed: reg(
                r,
                "graphsink_bytes_consumed",
                "Key and value bytes taken from Kafka",
                Family::default(),
            ),
            assigned: reg(
                r,
                "graphsink_assigned",
                "1 while this member holds the partition",
                Family::default(),
            ),
            kafka_consumer_lag: reg(
                r,
                "graphsink_kafka_consumer_lag",
                "librdkafka's consumer_lag",
                Family::default(),
            ),
        }
    }
}

/// The run loop: durable acks, polls in flight, memtables, the breaker, fencing, restarts and rejects.
pub(super) struct RunLoopFamilies {
    pub(super) durable_ack: Histogram,
    pub(super) rejects: Family<RejectLabels, Counter>,
    pub(super) polls_in_flight: Gauge,
    pub(super) memtable_rows: Family<TableLabels, Gauge>,
    pub(super) memtable_bytes: Family<TableLabels, Gauge>,
    pub(super) wal_flushes: Family<TableLabels, Counter>,
    pub(super) breaker_open: Gauge,
    pub(super) fenced_total: Counter,
    pub(super) session_restarts: Counter,
}

impl RunLoopFamilies {
    pub(super) fn register(r: &mut Registry) -> Self {
        RunLoopFamilies {
            durable_ack: reg(
                r,
                "graphsink_durable_ack_seconds",
                "A poll taken until its durable ack is applied",
                Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            ),
            rejects: reg(
                r,
                "graphsink_rejects",
                "Rejects recorded, by stage and code",
                Family::default(),
            ),
            polls_in_flight: reg(
                r,
                "graphsink_polls_in_flight",
                "Polls awaiting durability",
                Gauge::default(),
            ),
            memtable_rows: reg(
                r,
                "graphsink_memtable_rows",
                "Rows in the active memtables",
                Family::default(),
            ),
            memtable_bytes: reg(
                r,
                "graphsink_memtable_bytes",
                "Bytes held by the memtables (active and frozen)",
                Family::default(),
            ),
            wal_flushes: reg(
                r,
                "graphsink_wal_flushes",
                "Memtable flushes to generations",
                Family::default(),
            ),
            breaker_open: reg(
                r,
                "graphsink_breaker_open",
                "1 while the reject-rate breaker pauses fetching",
                Gauge::default(),
            ),
            fenced_total: reg(
                r,
                "graphsink_fenced",
                "Writers fenced by another writer",
                Counter::default(),
            ),
            session_restarts: reg(
                r,
                "graphsink_session_restarts",
                "Ingest sessions restarted in process",
                Counter::default(),
            ),
        }
    }
}

/// The fold loop and the head it publishes.
pub(super) struct FoldFamilies {
    pub(super) graph_visible: Histogram,
    pub(super) folds: Counter,
    pub(super) fold_failures: Counter,
    pub(super) fold_seconds: Histogram,
    pub(super) fold_phase_seconds: Histograms<PhaseLabels>,
    pub(super) fold_rows: Family<TableOpLabels, Counter>,
    pub(super) fold_last_success: FloatGauge,
    pub(super) head_seq: Gauge,
    pub(super) head_age: FloatGauge,
    pub(super) pending_edges: Family<TypeLabels, Gauge>,
    pub(super) pending_edges_oldest: Family<TypeLabels, FloatGauge>,
}

impl FoldFamilies {
    pub(super) fn register(r: &mut Registry) -> Self {
        FoldFamilies {
            graph_visible: reg(
                r,
                "graphsink_graph_visible_seconds",
                "The oldest record of a fold taken until the fold's graph commit is published",
                Histogram::new(exponential_buckets(0.01, 2.0, 16)),
            ),
            folds: reg(r, "graphsink_folds", "Published folds", Counter::default()),
            fold_failures: reg(
                r,
                "graphsink_fold_failures",
                "Folds that failed",
                Counter::default(),
            ),
            fold_seconds: reg(
                r,
                "graphsink_fold_seconds",
                "One fold, cut to publish",
                Histogram::new(exponential_buckets(0.01, 2.0, 16)),
            ),
            // From 1 ms: a fold's cheap phases (the checks, an index
            // delta) take a few; the same top as `fold_seconds`.
            fold_phase_seconds: reg(
                r,
                "graphsink_fold_phase_seconds",
                "One published fold's wall time by phase (cut, plan, read, view, check, write, compact, index, publish, dead_letters)",
                Histograms::new_with_constructor(|| {
                    Histogram::new(exponential_buckets(0.001, 2.0, 20))
                }),
            ),
            fold_rows: reg(
                r,
                "graphsink_fold_rows",
                "Rows folded into base tables, by op (upserted, deleted, rejected)",
                Family::default(),
            ),
            fold_last_success: reg(
                r,
                "graphsink_fold_last_success_timestamp_seconds",
                "Unix time of the last published fold",
                FloatGauge::default(),
            ),
            head_seq: reg(
                r,
                "graphsink_head_seq",
                "Sequence number of the head graph commit",
                Gauge::default(),
            ),
            head_age: reg(
                r,
                "graphsink_head_age_seconds",
                "Age of the head graph commit at scrape time",
                FloatGauge::default(),
            ),
            pending_edges: reg(
                r,
                "graphsink_pending_edges",
                "Deferred edges at the head, by edge type",
                Family::default(),
            ),
            pending_edges_oldest: reg(
                r,
                "graphsink_pending_edges_oldest_seconds",
                "Age of the oldest deferred edge, by edge type",
                Family::default(),
            ),
        }
    }
}

/// The dead-letter producer, the schema registry client and librdkafka.
pub(super) struct OutletFamilies {
    pub(super) dead_letters: Family<ResultLabels, Counter>,
    pub(super) dead_letters_pending: Gauge,
    pub(super) schema_registry_requests: Family<ResultLabels, Counter>,
    pub(super) kafka_broker_rtt: Family<BrokerLabels, FloatGauge>,
    pub(super) kafka_fetch_queue: Gauge,
}

impl OutletFamilies {
    pub(super) fn register(r: &mut Registry) -> Self {
        OutletFamilies {
            dead_letters: reg(
                r,
                "graphsink_dead_letters",
                "Dead-letter produce attempts, by result",
                Family::default(),
            ),
            dead_letters_pending: reg(
                r,
                "graphsink_dead_letters_pending",
                "Rejects waiting for the dead-letter topic",
                Gauge::default(),
            ),
            schema_registry_requests: reg(
                r,
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
                },
            ),
            kafka_broker_rtt: reg(
                r,
                "graphsink_kafka_broker_rtt_seconds",
                "librdkafka's average broker round trip",
                Family::default(),
            ),
            kafka_fetch_queue: reg(
                r,
                "graphsink_kafka_fetch_queue_messages",
                "Messages in librdkafka's pre-fetch queue",
                Gauge::default(),
            ),
        }
    }
}
