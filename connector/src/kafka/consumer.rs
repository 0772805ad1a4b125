//! The consumer group: joining (cooperative-sticky, no auto commit),
//! rebalance events, committing durable watermarks, and the bounded close.
//! It never decides what is durable; `offsets` does.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::mpsc;

use super::client_log::ClientLog;
use super::{blocking, client};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::failpoints;
use crate::metrics::Metrics;
use crate::types::TopicPartition;

/// What librdkafka's rebalance callbacks tell the run loop.
#[derive(Debug)]
pub(crate) enum GroupEvent {
    Assigned(Vec<TopicPartition>),
    Revoked(Vec<TopicPartition>),
}

/// Committable offsets, written by the run loop after each durable ack and
/// only read by the revoke callback, which commits them before giving the
/// partitions up.
pub(crate) type Committable = Arc<Mutex<BTreeMap<TopicPartition, i64>>>;

pub(crate) struct GroupContext {
    events: mpsc::UnboundedSender<GroupEvent>,
    committable: Committable,
    log: ClientLog,
    metrics: Arc<Metrics>,
}

/// librdkafka's statistics interval when graphsink's metrics are served
/// and `[kafka]` sets none.
const STATISTICS_INTERVAL_MS: &str = "5000";

impl ClientContext for GroupContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        self.log.log(level, fac, message)
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        self.log.error(&error, reason)
    }

    /// librdkafka's statistics, mapped to a few gauges (docs/metrics.md).
    fn stats(&self, s: rdkafka::Statistics) {
        let mut fetch_queue = 0;
        for (topic, t) in &s.topics {
            for (&p, part) in &t.partitions {
                if p < 0 {
                    continue; // librdkafka's internal "unassigned" partition
                }
                fetch_queue += part.fetchq_cnt.max(0);
                let tp = (topic.clone(), p);
                self.metrics
                    .kafka_partition(&tp, part.consumer_lag, part.hi_offset);
            }
        }
        self.metrics.kafka_fetch_queue(fetch_queue);
        for b in s.brokers.values().filter(|b| b.nodeid >= 0) {
            if let Some(rtt) = &b.rtt {
                self.metrics.kafka_broker_rtt(&b.nodename, rtt.avg);
            }
        }
    }
}

impl ConsumerContext for GroupContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let revoked = tp_list(tpl);
            let commit = self.revoked_marks(&revoked);
            // Only `abort` means anything in a callback (chaos runs).
            let _ = failpoints::hit(failpoints::REVOKE_BEFORE_COMMIT);
            if commit.count() > 0 {
                // This callback runs inside `recv`, on a runtime worker.
                match blocking(|| consumer.commit(&commit, CommitMode::Sync)) {
                    Ok(()) => tracing::info!(partitions = commit.count(), "committed on revoke"),
                    Err(e) => {
                        tracing::warn!(error = %e, "commit on revoke failed; the next owner re-reads (idempotent)")
                    }
                }
            }
            let _ = failpoints::hit(failpoints::REVOKE_AFTER_COMMIT);
            let _ = self.events.send(GroupEvent::Revoked(revoked));
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                let _ = self.events.send(GroupEvent::Assigned(tp_list(tpl)));
            }
            Rebalance::Error(e) => tracing::warn!(error = %e, "rebalance error"),
            Rebalance::Revoke(_) => {}
        }
    }

    fn commit_callback(
        &self,
        result: rdkafka::error::KafkaResult<()>,
        _offsets: &TopicPartitionList,
    ) {
        if let Err(e) = result {
            tracing::warn!(error = %e, "offset commit failed; it is retried at the next cadence");
        }
    }
}

impl GroupContext {
    /// The committable offsets of the partitions being revoked.
    fn revoked_marks(&self, revoked: &[TopicPartition]) -> TopicPartitionList {
        // A poisoned lock still holds valid marks: the writer only inserts
        // and removes whole entries.
        let marks = self
            .committable
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut commit = TopicPartitionList::new();
        for tp in revoked {
            if let Some(&next) = marks.get(tp) {
                let _ = commit.add_partition_offset(&tp.0, tp.1, Offset::Offset(next));
            }
        }
        commit
    }
}

fn tp_list(tpl: &TopicPartitionList) -> Vec<TopicPartition> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_string(), e.partition()))
        .collect()
}

pub(crate) type GroupConsumer = StreamConsumer<GroupContext>;

/// The consumer's messages as one stream, kept for a whole session:
/// `StreamConsumer::recv` builds (and drops) a stream per message, which
/// registers and removes a waker under a mutex every time.
pub(crate) type GroupStream<'c> = rdkafka::consumer::MessageStream<'c, GroupContext>;

/// Joins the group and subscribes to every mapped topic.
/// With `kafka_stats`, librdkafka reports statistics into `metrics`.
pub(crate) fn subscribe(
    config: &Config,
    committable: Committable,
    metrics: Arc<Metrics>,
    kafka_stats: bool,
) -> Result<(GroupConsumer, mpsc::UnboundedReceiver<GroupEvent>)> {
    let (tx, rx) = mpsc::unbounded_channel();
    let ctx = GroupContext {
        events: tx,
        committable,
        log: ClientLog::default(),
        metrics,
    };
    let mut cc = client::consumer_config(config);
    if kafka_stats && !config.kafka.contains_key("statistics.interval.ms") {
        cc.set("statistics.interval.ms", STATISTICS_INTERVAL_MS);
    }
    let consumer: GroupConsumer = cc.create_with_context(ctx)?;
    consumer.subscribe(&mapped_topics(config))?;
    Ok((consumer, rx))
}

/// Every topic the config maps, in order.
pub(crate) fn mapped_topics(config: &Config) -> Vec<&str> {
    config.mappings.iter().map(|m| m.topic.as_str()).collect()
}

/// Leaves and rejoins the group (the stall watch's remedy for a member
/// the coordinator forgot to assign).
pub(crate) fn resubscribe(consumer: &GroupConsumer, config: &Config) -> Result<()> {
    consumer.unsubscribe();
    consumer.subscribe(&mapped_topics(config))?;
    Ok(())
}

/// Stops fetching `tp` and rewinds it to `offset`, so the records from
/// there on are read again once it is released (a record waiting for its
/// schema; the records after it in the poll were dropped). The seek is
/// asynchronous (timeout 0): it lands before the partition fetches again.
pub(crate) fn hold(consumer: &GroupConsumer, tp: &TopicPartition, offset: i64) -> Result<()> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(&tp.0, tp.1);
    consumer.pause(&tpl)?;
    consumer.seek(&tp.0, tp.1, Offset::Offset(offset), Duration::ZERO)?;
    Ok(())
}

/// Fetches `tp` again after a `hold`.
pub(crate) fn release(consumer: &GroupConsumer, tp: &TopicPartition) -> Result<()> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(&tp.0, tp.1);
    consumer.resume(&tpl)?;
    Ok(())
}

/// Commits `offsets` (next offsets to read). A sync commit waits for the
/// broker, off the async workers.
pub(crate) fn commit(
    consumer: &GroupConsumer,
    offsets: &[(TopicPartition, i64)],
    mode: CommitMode,
) -> Result<()> {
    if offsets.is_empty() {
        return Ok(());
    }
    let mut tpl = TopicPartitionList::new();
    for ((t, p), n) in offsets {
        tpl.add_partition_offset(t, *p, Offset::Offset(*n))?;
    }
    match mode {
        CommitMode::Sync => blocking(|| consumer.commit(&tpl, mode)),
        CommitMode::Async => consumer.commit(&tpl, mode),
    }
    .map_err(Error::from)
}

/// Closes the consumer (leaving the group) off the runtime, bounded: a
/// rebalance that lands during librdkafka's close can block the closing
/// thread for good (its rebalance callback asks the main thread for the
/// rebalance protocol, which is itself closing). Offsets are already
/// committed by then, so past the bound the consumer is left behind and
/// the group drops it after `session.timeout.ms`.
pub(crate) async fn close(kafka: GroupConsumer) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        drop(kafka);
        let _ = tx.send(());
    });
    if tokio::time::timeout(Duration::from_secs(10), rx)
        .await
        .is_err()
    {
        tracing::warn!("consumer close did not finish in 10 s (a rebalance during close); leaving it to the session timeout");
    }
}
