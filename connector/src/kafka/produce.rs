//! One-shot producers of the CLI's commands: records from a file
//! (`produce`) and rejects' original records (`replay-rejects`). Every
//! delivery is awaited; any failure is an error. It reads no graph.

use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;

use super::client::{self, QuietContext};
use super::record::{reject_record, Purpose};
use super::{admin, blocking, denied};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::rejects::Reject;

/// One record to produce: UTF-8 key and value (`None` value = tombstone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyValue {
    pub key: Option<String>,
    pub value: Option<String>,
}

/// Creates `topic` with `partitions` when it is missing.
pub(crate) async fn ensure_topic(config: &Config, topic: &str, partitions: i32) -> Result<()> {
    let cc = client::producer_config(&config.kafka);
    for o in admin::create_topics(&cc, &[topic], partitions).await? {
        match o.outcome {
            admin::TopicCreation::Created => tracing::info!(topic, partitions, "created topic"),
            admin::TopicCreation::Exists => {}
            admin::TopicCreation::Refused { refused, looked } => {
                let needs = match looked {
                    true => denied::write_topic(&o.topic),
                    false => denied::create_topic(&o.topic),
                };
                return Err(refused.needs(needs));
            }
            admin::TopicCreation::Failed(e) => {
                return Err(Error::Broker(format!("create topic {}: {e}", o.topic)))
            }
        }
    }
    Ok(())
}

/// Produces `records` to `topic` in order and waits for every delivery.
pub(crate) async fn produce(config: &Config, topic: &str, records: &[KeyValue]) -> Result<()> {
    let producer: FutureProducer = client::producer_config(&config.kafka)
        .set("enable.idempotence", "true")
        .create()?;
    let mut pending = std::collections::VecDeque::with_capacity(records.len().min(100_000));
    let delivered = |p: rdkafka::producer::DeliveryFuture| async move {
        p.await
            .map_err(|_| Error::Broker("producer dropped a delivery".into()))?
            .map_err(|(e, _)| Error::Kafka(e))
    };
    for r in records {
        loop {
            let mut rec: FutureRecord<'_, String, String> = FutureRecord::to(topic);
            if let Some(k) = &r.key {
                rec = rec.key(k);
            }
            if let Some(v) = &r.value {
                rec = rec.payload(v);
            }
            match producer.send_result(rec) {
                Ok(p) => {
                    pending.push_back(p);
                    break;
                }
                // librdkafka's local queue is full (a large file): wait for
                // the oldest delivery, then try again.
                Err((
                    rdkafka::error::KafkaError::MessageProduction(
                        rdkafka::types::RDKafkaErrorCode::QueueFull,
                    ),
                    _,
                )) => match pending.pop_front() {
                    Some(p) => {
                        delivered(p).await?;
                    }
                    None => tokio::time::sleep(Duration::from_millis(10)).await,
                },
                Err((e, _)) => return Err(Error::Kafka(e)),
            }
        }
    }
    for p in pending {
        delivered(p).await?;
    }
    blocking(|| producer.flush(Duration::from_secs(30)))?;
    Ok(())
}

/// Produces the original records of `rejects` to `topic` in order, with
/// `acks=all`, and waits for every delivery; any failure is an error.
pub(crate) async fn replay(config: &Config, topic: &str, rejects: &[Reject]) -> Result<()> {
    let producer: FutureProducer<QuietContext> = client::producer_config(&config.kafka)
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("message.timeout.ms", "30000")
        .create_with_context(QuietContext::default())?;
    require_topic(&producer, client::servers(config), topic)?;
    let deliveries = queue_replays(&producer, topic, rejects).await?;
    await_replays(topic, deliveries).await
}

/// A missing topic would only show as a delivery timeout: refuse it first.
fn require_topic(
    producer: &FutureProducer<QuietContext>,
    servers: &str,
    topic: &str,
) -> Result<()> {
    let md = blocking(|| {
        producer
            .client()
            .fetch_metadata(Some(topic), Duration::from_secs(10))
    })
    .map_err(|e| {
        Error::Broker(format!(
            "kafka at {servers}: cannot fetch metadata of {topic}: {e}"
        ))
    })?;
    let unknown = md.topics().iter().any(|t| {
        t.name() == topic
            && t.error().map(RDKafkaErrorCode::from)
                == Some(RDKafkaErrorCode::UnknownTopicOrPartition)
    });
    if unknown {
        return Err(Error::config(format!(
            "topic {topic} does not exist at {servers} (create it first)"
        )));
    }
    Ok(())
}

/// Queues every replay, waiting while librdkafka's queue is full.
async fn queue_replays<'r>(
    producer: &FutureProducer<QuietContext>,
    topic: &str,
    rejects: &'r [Reject],
) -> Result<Vec<(&'r Reject, DeliveryFuture)>> {
    let mut deliveries = Vec::with_capacity(rejects.len());
    for r in rejects {
        let mut rec = reject_record(r, topic, &Purpose::Replay);
        loop {
            match producer.send_result(rec) {
                Ok(d) => {
                    deliveries.push((r, d));
                    break;
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    rec = back;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err((e, _)) => {
                    return Err(Error::Broker(format!(
                        "replay to {topic}: cannot queue reject {} ({} queued before): {e}",
                        r.reject_id,
                        deliveries.len()
                    )))
                }
            }
        }
    }
    Ok(deliveries)
}

/// Awaits every delivery; the first failure names the reject.
async fn await_replays(topic: &str, deliveries: Vec<(&Reject, DeliveryFuture)>) -> Result<()> {
    let total = deliveries.len();
    let mut failed = 0usize;
    let mut first = None;
    for (r, d) in deliveries {
        let err = match d.await {
            Ok(Ok(_)) => continue,
            Ok(Err((e, _))) => e.to_string(),
            Err(_) => "the producer dropped the delivery".to_string(),
        };
        failed += 1;
        first.get_or_insert(format!("reject {}: {err}", r.reject_id));
    }
    match first {
        None => Ok(()),
        Some(first) => Err(Error::Broker(format!(
            "replay to {topic}: {failed} of {total} deliveries failed (first: {first})"
        ))),
    }
}
