//! The consumer group: joining (cooperative-sticky, no auto commit),
//! rebalance events, sending the commits `offsets` names and telling it
//! which the broker took, what a refusal of the group's permissions comes
//! to (`refusal`), and the bounded close. It never decides what is
//! durable or what may be committed; `offsets::OffsetBook` does.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::mpsc;

use super::client_log::ClientLog;
use super::denied::{self, Refused};
use super::queries::OffsetQueries;
use super::{blocking, client};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::failpoints;
use crate::metrics::Metrics;
use crate::offsets::OffsetBook;
use crate::types::TopicPartition;

/// What librdkafka's rebalance and commit callbacks tell the run loop.
#[derive(Debug)]
pub(crate) enum GroupEvent {
    Assigned(Vec<TopicPartition>),
    Revoked(Vec<TopicPartition>),
    /// The cluster refused a commit or a rebalance: the session stops
    /// (`denied`). `topics`: those a commit named with the refusal.
    Refused {
        refused: Refused,
        topics: Vec<String>,
    },
}

pub(crate) struct GroupContext {
    events: mpsc::UnboundedSender<GroupEvent>,
    /// What the revoke callback may commit, and where confirmed commits go.
    offsets: OffsetBook,
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
            let commit = self.offsets.to_commit_on_revoke(&revoked);
            // Only `abort` means anything in a callback (chaos runs).
            let _ = failpoints::hit(failpoints::REVOKE_BEFORE_COMMIT);
            // A lost assignment (the session expired, as in a broker
            // freeze) can no longer be committed: the coordinator has
            // dropped this member. The sync commit would wait for a
            // coordinator with no bound, inside the run loop's poll, where
            // even SIGTERM cannot reach it (docs/kafka.md, "Commits before
            // a freeze"). The next owner re-reads; writes are idempotent.
            if !commit.is_empty() && consumer.assignment_lost() {
                tracing::warn!(
                    partitions = commit.len(),
                    "assignment lost (this member's session expired): not committing on revoke; the next owner re-reads (idempotent)"
                );
            } else if !commit.is_empty() {
                // This callback runs inside `recv`, on a runtime worker.
                match offset_list(&commit)
                    .and_then(|tpl| blocking(|| consumer.commit(&tpl, CommitMode::Sync)))
                {
                    Ok(()) => {
                        self.offsets.committed(&commit);
                        self.metrics.committed(&commit);
                        tracing::info!(partitions = commit.len(), "committed on revoke")
                    }
                    Err(e) => {
                        if let Some(refused) = Refused::of(&e) {
                            let topics = commit.iter().map(|((t, _), _)| t.clone()).collect();
                            let _ = self.events.send(GroupEvent::Refused { refused, topics });
                        }
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
            Rebalance::Error(e) => {
                if let Some(refused) = Refused::of(e) {
                    let topics = Vec::new();
                    let _ = self.events.send(GroupEvent::Refused { refused, topics });
                }
                tracing::warn!(error = %e, "rebalance error")
            }
            Rebalance::Revoke(_) => {}
        }
    }

    /// An async commit's reply: what the broker took becomes committed;
    /// what it refused stays to commit, and the next commit sends it again.
    fn commit_callback(
        &self,
        result: rdkafka::error::KafkaResult<()>,
        offsets: &TopicPartitionList,
    ) {
        let mut took = Vec::new();
        let mut refused_topics = Vec::new();
        for e in offsets.elements() {
            match (e.offset(), e.error()) {
                (Offset::Offset(n), Ok(())) => {
                    took.push(((e.topic().to_string(), e.partition()), n))
                }
                (_, Err(k)) if Refused::of(&k) == Some(Refused::Topic) => {
                    refused_topics.push(e.topic().to_string())
                }
                _ => {}
            }
        }
        if !took.is_empty() {
            self.offsets.committed(&took);
            self.metrics.committed(&took);
        }
        let refused = match &result {
            Err(e) => Refused::of(e),
            Ok(()) => None,
        };
        if let Some(refused) = refused.or((!refused_topics.is_empty()).then_some(Refused::Topic)) {
            refused_topics.dedup();
            let topics = refused_topics;
            let _ = self.events.send(GroupEvent::Refused { refused, topics });
        } else if let Err(e) = result {
            tracing::warn!(error = %e, "offset commit failed; it is sent again at the next commit");
        }
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

/// Joins the group and subscribes to every mapped topic; `offsets` is
/// the session's record the revoke and commit callbacks ask and tell.
/// With `kafka_stats`, librdkafka reports statistics into `metrics`.
pub(crate) fn subscribe(
    config: &Config,
    offsets: OffsetBook,
    metrics: Arc<Metrics>,
    kafka_stats: bool,
) -> Result<(GroupConsumer, mpsc::UnboundedReceiver<GroupEvent>)> {
    let (tx, rx) = mpsc::unbounded_channel();
    let ctx = GroupContext {
        events: tx,
        offsets,
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

/// The NotAuthorized a refusal of the group consumer comes to. Its errors
/// name no topic: a topic refusal is found in the metadata of each mapped
/// topic; where the metadata shows none (DESCRIBE allowed, READ not), the
/// topics this member holds are named, or every mapped one.
pub(crate) async fn refusal(
    r: Refused,
    config: &Config,
    queries: &OffsetQueries,
    held: &BTreeSet<TopicPartition>,
) -> Error {
    let group = queries.group().to_string();
    match r {
        Refused::Group => r.needs(denied::read_group(&group)),
        Refused::Topic => {
            let topics = refused_topics(config, queries, held).await;
            r.needs(denied::read_topics(&topics))
        }
        Refused::Credentials => r.needs(denied::credentials(
            config.kafka.get("sasl.username").map(String::as_str),
        )),
        Refused::Cluster | Refused::TransactionalId => {
            r.needs(format!("a permission for group {group}'s consumer"))
        }
    }
}

/// The mapped topics whose metadata is refused; else those held; else all.
async fn refused_topics(
    config: &Config,
    queries: &OffsetQueries,
    held: &BTreeSet<TopicPartition>,
) -> Vec<String> {
    let mapped: BTreeSet<String> = mapped_topics(config)
        .into_iter()
        .map(String::from)
        .collect();
    if let Ok(found) = queries.partitions(mapped.iter().cloned().collect()).await {
        let refused: Vec<String> = found
            .missing
            .into_iter()
            .filter(|m| m.refused)
            .map(|m| m.topic)
            .collect();
        if !refused.is_empty() {
            return refused;
        }
    }
    let held: BTreeSet<String> = held.iter().map(|(t, _)| t.clone()).collect();
    match held.is_empty() {
        true => mapped.into_iter().collect(),
        false => held.into_iter().collect(),
    }
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

/// Sends a commit of `offsets` (next offsets to read). A sync commit waits
/// for the broker, off the async workers; an async one's reply reaches the
/// book through the commit callback.
pub(crate) fn commit(
    consumer: &GroupConsumer,
    offsets: &[(TopicPartition, i64)],
    mode: CommitMode,
) -> Result<()> {
    if offsets.is_empty() {
        return Ok(());
    }
    let tpl = offset_list(offsets)?;
    match mode {
        CommitMode::Sync => blocking(|| consumer.commit(&tpl, mode)),
        CommitMode::Async => commit_async(consumer, &tpl),
    }
    .map_err(Error::from)
}

/// An async commit whose reply comes back through the consumer's queue,
/// so `commit_callback` sees it. `Consumer::commit` (`rd_kafka_commit`)
/// posts no reply for a manual async commit unless a C `offset_commit_cb`
/// is configured, which rust-rdkafka never sets (librdkafka's
/// `rd_kafka_cgrp_propagate_commit_result`): the offset book would never
/// learn that the broker took it. `rd_kafka_commit_queue` with the
/// consumer queue and no callback delivers the reply as an
/// `OffsetCommit` event, which the stream's poll hands to the context.
fn commit_async(
    consumer: &GroupConsumer,
    tpl: &TopicPartitionList,
) -> rdkafka::error::KafkaResult<()> {
    use rdkafka::bindings as rd;
    use rdkafka::error::{KafkaError, RDKafkaErrorCode};
    let rk = consumer.client().native_ptr();
    // SAFETY: `rk` is this live consumer's handle. `rd_kafka_queue_get_consumer`
    // returns a new reference to its consumer queue (non-null for a
    // consumer with a group.id, which every group consumer has);
    // `rd_kafka_commit_queue` copies `tpl` and keeps its own reference to
    // the queue for the reply, so ours is released right after. With a
    // queue given it does not wait, and a null callback makes the reply
    // an event rather than a call.
    let err = unsafe {
        let queue = rd::rd_kafka_queue_get_consumer(rk);
        if queue.is_null() {
            return Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::UnknownGroup));
        }
        let err = rd::rd_kafka_commit_queue(rk, tpl.ptr(), queue, None, std::ptr::null_mut());
        rd::rd_kafka_queue_destroy(queue);
        err
    };
    match RDKafkaErrorCode::from(err) {
        RDKafkaErrorCode::NoError => Ok(()),
        code => Err(KafkaError::ConsumerCommit(code)),
    }
}

fn offset_list(
    offsets: &[(TopicPartition, i64)],
) -> rdkafka::error::KafkaResult<TopicPartitionList> {
    let mut tpl = TopicPartitionList::new();
    for ((t, p), n) in offsets {
        tpl.add_partition_offset(t, *p, Offset::Offset(*n))?;
    }
    Ok(tpl)
}

/// Whether a commit failed because the group no longer counts this
/// member at the generation it committed with: its partitions are another
/// member's now.
pub(crate) fn no_longer_member(e: &Error) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(
        e.kafka_code(),
        Some(
            C::UnknownMemberId
                | C::IllegalGeneration
                | C::RebalanceInProgress
                | C::FencedInstanceId
        )
    )
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

#[cfg(test)]
mod tests {
    use rdkafka::error::KafkaError;
    use rdkafka::types::RDKafkaErrorCode as C;

    use super::no_longer_member;
    use crate::error::Error;

    #[test]
    fn a_commit_the_group_refuses_for_a_gone_member_is_a_hand_off() {
        for code in [
            C::UnknownMemberId,
            C::IllegalGeneration,
            C::RebalanceInProgress,
        ] {
            assert!(no_longer_member(&Error::Kafka(KafkaError::ConsumerCommit(
                code
            ))));
        }
        // Trouble that passes, or a refusal, is not a hand-off.
        for code in [C::CoordinatorNotAvailable, C::GroupAuthorizationFailed] {
            assert!(!no_longer_member(&Error::Kafka(
                KafkaError::ConsumerCommit(code)
            )));
        }
        assert!(!no_longer_member(&Error::Config("x".into())));
    }
}
