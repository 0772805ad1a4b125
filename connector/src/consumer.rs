//! The Kafka side: the consumer group (cooperative-sticky, no auto commit),
//! rebalance events, and committing durable watermarks. It never decides
//! what is durable; `offsets` does.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::mpsc;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::offsets::TopicPartition;

/// What librdkafka's rebalance callbacks tell the run loop.
#[derive(Debug)]
pub enum GroupEvent {
    Assigned(Vec<TopicPartition>),
    Revoked(Vec<TopicPartition>),
}

/// Committable offsets, written by the run loop after each durable ack and
/// only read by the revoke callback, which commits them before giving the
/// partitions up.
pub type Committable = Arc<Mutex<BTreeMap<TopicPartition, i64>>>;

pub struct GroupContext {
    events: mpsc::UnboundedSender<GroupEvent>,
    committable: Committable,
}

impl ClientContext for GroupContext {}

impl ConsumerContext for GroupContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let revoked = tp_list(tpl);
            let marks = self.committable.lock().expect("committable");
            let mut commit = TopicPartitionList::new();
            for tp in &revoked {
                if let Some(&next) = marks.get(tp) {
                    let _ = commit.add_partition_offset(&tp.0, tp.1, Offset::Offset(next));
                }
            }
            drop(marks);
            if commit.count() > 0 {
                match consumer.commit(&commit, CommitMode::Sync) {
                    Ok(()) => tracing::info!(partitions = commit.count(), "committed on revoke"),
                    Err(e) => {
                        tracing::warn!(error = %e, "commit on revoke failed; the next owner re-reads (idempotent)")
                    }
                }
            }
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

fn tp_list(tpl: &TopicPartitionList) -> Vec<TopicPartition> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_string(), e.partition()))
        .collect()
}

pub type GroupConsumer = StreamConsumer<GroupContext>;

/// The librdkafka settings graphsink needs, over the user's pass-through ones.
pub fn client_config(config: &Config) -> ClientConfig {
    let mut cc = ClientConfig::new();
    cc.set("auto.offset.reset", "earliest");
    cc.set("partition.assignment.strategy", "cooperative-sticky");
    for (k, v) in &config.kafka {
        cc.set(k, v);
    }
    // Only graphsink stores and commits offsets, after durability.
    cc.set("enable.auto.commit", "false");
    cc.set("enable.auto.offset.store", "false");
    cc
}

/// Joins the group and subscribes to every mapped topic.
pub fn subscribe(
    config: &Config,
    committable: Committable,
) -> Result<(GroupConsumer, mpsc::UnboundedReceiver<GroupEvent>)> {
    let (tx, rx) = mpsc::unbounded_channel();
    let ctx = GroupContext {
        events: tx,
        committable,
    };
    let consumer: GroupConsumer = client_config(config).create_with_context(ctx)?;
    let topics: Vec<&str> = config.mappings.iter().map(|m| m.topic.as_str()).collect();
    consumer.subscribe(&topics)?;
    Ok((consumer, rx))
}

pub fn commit(
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
    consumer.commit(&tpl, mode).map_err(Error::from)
}

/// High watermarks (end offsets) of `partitions`; a blocking broker call.
pub fn end_offsets(
    consumer: &GroupConsumer,
    partitions: &[TopicPartition],
) -> Result<BTreeMap<TopicPartition, i64>> {
    let mut out = BTreeMap::new();
    for (t, p) in partitions {
        let (_, high) = consumer.fetch_watermarks(t, *p, Duration::from_secs(10))?;
        out.insert((t.clone(), *p), high);
    }
    Ok(out)
}

/// The group's committed offsets for `partitions` (missing = none yet).
pub fn committed(
    consumer: &GroupConsumer,
    partitions: &[TopicPartition],
) -> Result<BTreeMap<TopicPartition, i64>> {
    let mut tpl = TopicPartitionList::new();
    for (t, p) in partitions {
        tpl.add_partition(t, *p);
    }
    let got = consumer.committed_offsets(tpl, Duration::from_secs(10))?;
    Ok(got
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(n) => Some(((e.topic().to_string(), e.partition()), n)),
            _ => None,
        })
        .collect())
}
