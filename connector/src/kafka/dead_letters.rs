//! The dead-letter producer: produces rejects to their dead-letter topic and
//! waits for the broker's acknowledgements, retrying with backoff while the
//! topic is unavailable. A reject is never dropped, and its offset waits
//! until it is delivered. Asked to, it first skips the rejects the topic
//! already holds (`delivered`). It decides nothing about what is rejected.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::join_all;
use rdkafka::producer::FutureProducer;
use tokio_util::sync::CancellationToken;

use super::admin::{self, TopicCreation};
use super::client;
use super::client_log::ClientLog;
use super::delivered::DeliveredReader;
use super::record::{reject_record, Purpose};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::rejects::Reject;
use crate::types::{raise_offsets, PartitionOffsets};

/// librdkafka's default `message.max.bytes`.
const LIBRDKAFKA_MESSAGE_MAX_BYTES: usize = 1_000_000;

/// How long one produce may wait for room in librdkafka's queue.
const QUEUE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub(crate) struct DeadLetters {
    producer: FutureProducer<ClientLog>,
    /// Dead-letter topic by source topic, and by graph type (fold rejects
    /// without source coordinates).
    by_topic: HashMap<String, String>,
    by_type: HashMap<String, String>,
    default_topic: String,
    connector: String,
    /// The producer's `message.max.bytes`: a dead letter is cut to fit it.
    max_bytes: usize,
    metrics: Arc<Metrics>,
    /// The producer's client config, for creating the topics again.
    client: rdkafka::ClientConfig,
    /// Every dead-letter topic was created or found. Until then a failed
    /// delivery tries to create them again: a broker that was down when
    /// the connector started (and does not auto-create topics) would
    /// otherwise time out every produce for ever.
    topics_ready: Arc<AtomicBool>,
    /// Reads what the topics hold, for deliveries that must not repeat.
    reader: DeliveredReader,
    /// The dead-letter offsets this process has seen (its acknowledgements,
    /// its reads): every later produce lands at or past them.
    seen: Arc<Mutex<PartitionOffsets>>,
}

/// One delivery as the metrics see it: rejects still pending, and whether
/// it is retrying. Dropping it (done, failed or cancelled) settles both.
struct Delivery<'a> {
    metrics: &'a Metrics,
    pending: usize,
    retrying: bool,
}

impl<'a> Delivery<'a> {
    fn new(metrics: &'a Metrics, n: usize) -> Self {
        metrics.dead_letters_queued(n);
        Delivery {
            metrics,
            pending: n,
            retrying: false,
        }
    }

    /// Rejects found on the topic already: not produced again.
    fn skipped(&mut self, n: usize) {
        self.metrics.dead_letters_skipped(n);
        self.pending -= n;
    }

    /// One round of produces; `attempted = false`: the round could not
    /// start (the topics could not be read), and failed all the same.
    fn round(&mut self, ok: usize, failed: usize, attempted: bool) {
        if attempted {
            self.metrics.dead_letters_sent(ok, failed);
        }
        self.pending -= ok;
        if failed > 0 && !self.retrying {
            self.retrying = true;
            self.metrics.dead_letters_retrying(true);
        }
    }
}

impl Drop for Delivery<'_> {
    fn drop(&mut self) {
        self.metrics.dead_letters_abandoned(self.pending);
        if self.retrying {
            self.metrics.dead_letters_retrying(false);
        }
    }
}

/// What a delivery has read of its topics: the offsets to read on from and
/// the reject ids found.
struct Held {
    from: PartitionOffsets,
    ids: HashSet<String>,
    warned: bool,
}

/// A reject whose produce failed, and why.
struct Failed<'a> {
    reject: &'a Reject,
    error: String,
}

impl DeadLetters {
    /// The producer (see `client::dead_letter_config`); creates the
    /// dead-letter topics that do not exist yet.
    pub(crate) async fn connect(config: &Config, metrics: Arc<Metrics>) -> Result<DeadLetters> {
        let cc = client::dead_letter_config(config);
        let producer: FutureProducer<ClientLog> = cc.create_with_context(ClientLog::default())?;
        let mut by_topic = HashMap::new();
        let mut by_type = HashMap::new();
        for m in &config.mappings {
            let dlq = config.dead_letter_topic(&m.topic).to_string();
            by_topic.insert(m.topic.clone(), dlq.clone());
            by_type.entry(m.type_name().to_string()).or_insert(dlq);
        }
        let dl = DeadLetters {
            producer,
            by_topic,
            by_type,
            default_topic: config.errors.dead_letter_topic.clone(),
            connector: config.graph.actor.clone(),
            max_bytes: cc
                .get("message.max.bytes")
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(LIBRDKAFKA_MESSAGE_MAX_BYTES),
            metrics,
            client: cc,
            topics_ready: Arc::default(),
            reader: DeliveredReader::new(config)?,
            seen: Arc::default(),
        };
        dl.create_topics().await;
        // Best effort, in the background (a dead-letter cluster that is down
        // must not hold the start): the first fold's lower bound (`seen`).
        // Without it the first commits' fold rejects go out at least once.
        let bg = dl.clone();
        tokio::spawn(async move {
            match bg.reader.read(bg.topics(), None).await {
                Ok(found) => bg.saw(&found.ends),
                Err(e) => tracing::debug!(error = %e, "dead-letter ends unknown at start"),
            }
        });
        Ok(dl)
    }

    /// Every dead-letter topic, sorted.
    fn topics(&self) -> Vec<String> {
        let mut names: Vec<String> = self.by_topic.values().cloned().collect();
        names.push(self.default_topic.clone());
        names.sort();
        names.dedup();
        names
    }

    fn saw(&self, offsets: &PartitionOffsets) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        raise_offsets(&mut seen, offsets);
    }

    /// One acknowledged produce: the next one lands past it.
    fn saw_one(&self, topic: &str, partition: i32, next: i64) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let o = seen
            .entry(topic.to_string())
            .or_default()
            .entry(partition)
            .or_insert(next);
        *o = (*o).max(next);
    }

    /// Dead-letter offsets every later produce lands at or past: what a
    /// fold plan records (`GraphCommit::dead_letter_since`).
    pub(crate) fn seen(&self) -> PartitionOffsets {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Best effort: a broker that auto-creates topics, or an operator who
    /// created them, needs none of this; a failure shows at produce time.
    async fn create_topics(&self) {
        let topics = self.topics();
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        let outcomes = match admin::create_topics(&self.client, &names, 1).await {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(error = %e, "cannot create dead-letter topics");
                return;
            }
        };
        let mut ready = true;
        for o in outcomes {
            let t = &o.topic;
            match o.outcome {
                TopicCreation::Created => tracing::info!(topic = %t, "created dead-letter topic"),
                TopicCreation::Exists => tracing::debug!(topic = %t, "dead-letter topic exists"),
                TopicCreation::Failed(e) => {
                    ready = false;
                    tracing::warn!(topic = %t, error = %e, "cannot create dead-letter topic")
                }
            }
        }
        self.topics_ready.store(ready, Ordering::Relaxed);
    }

    /// The dead-letter topic of a reject.
    pub(crate) fn topic_for(&self, r: &Reject) -> &str {
        r.topic
            .as_ref()
            .and_then(|t| self.by_topic.get(t))
            .or_else(|| r.type_name.as_ref().and_then(|t| self.by_type.get(t)))
            .unwrap_or(&self.default_topic)
    }

    /// Delivers every reject: all are queued at once and their
    /// acknowledgements awaited together; only the failed ones are retried,
    /// with backoff. Returns only when all are acknowledged, or with an
    /// error once `stop` is cancelled.
    ///
    /// `once`: before each round, the rejects the topics hold at or past
    /// these offsets are skipped, so no reject id is produced twice (fold
    /// rejects, `GraphCommit::dead_letter_since`). `None` delivers at least
    /// once (record rejects: their offsets wait, so a crash re-reads and
    /// re-produces them).
    pub(crate) async fn deliver(
        &self,
        rejects: &[Reject],
        once: Option<&PartitionOffsets>,
        stop: &CancellationToken,
    ) -> Result<()> {
        let mut todo: Vec<&Reject> = rejects.iter().collect();
        let mut delivery = Delivery::new(&self.metrics, todo.len());
        let mut delay = Duration::from_millis(100);
        let mut first = true;
        // What the topics hold, read so far: a retry reads only past it.
        let mut held = once.map(|since| Held {
            from: since.clone(),
            ids: HashSet::new(),
            warned: false,
        });
        while !todo.is_empty() {
            let skipped = if first {
                self.skip_delivered(&mut todo, held.as_mut()).await
            } else {
                tokio::select! {
                    s = self.skip_delivered(&mut todo, held.as_mut()) => s,
                    _ = stop.cancelled() => Err(Error::Other("stopped while reading".into())),
                }
            };
            let (failed, attempted) = match skipped {
                Err(e) => {
                    let error = format!("cannot read what the topic holds: {e}");
                    let failed = todo.iter().map(|&reject| Failed {
                        reject,
                        error: error.clone(),
                    });
                    (failed.collect(), false)
                }
                Ok(skipped) => {
                    delivery.skipped(skipped);
                    if todo.is_empty() {
                        return Ok(());
                    }
                    // The first round runs to its end (bounded by
                    // message.timeout.ms), so a graceful stop still delivers
                    // to a healthy topic; retries give way to `stop`.
                    let failed = if std::mem::take(&mut first) {
                        self.send_all(&todo).await
                    } else {
                        tokio::select! {
                            failed = self.send_all(&todo) => failed,
                            _ = stop.cancelled() => todo.iter().map(|&reject| Failed {
                                reject,
                                error: "stopped while producing".to_string(),
                            }).collect(),
                        }
                    };
                    (failed, true)
                }
            };
            delivery.round(todo.len() - failed.len(), failed.len(), attempted);
            let Some(f) = failed.first() else {
                return Ok(());
            };
            tracing::warn!(
                topic = %self.topic_for(f.reject), failed = failed.len(), of = todo.len(),
                reject_id = %f.reject.reject_id, error = %f.error,
                "dead-letter produce failed; retrying (offsets wait)"
            );
            if stop.is_cancelled() {
                return Err(Error::DeadLetter {
                    topic: self.topic_for(f.reject).to_string(),
                    reason: format!(
                        "stopped before delivering reject {}: {}",
                        f.reject.reject_id, f.error
                    ),
                });
            }
            // The topics may be missing because the broker was down at start.
            if !self.topics_ready.load(Ordering::Relaxed) {
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = self.create_topics() => {}
                }
            }
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(Duration::from_secs(5));
            todo = failed.into_iter().map(|f| f.reject).collect();
        }
        Ok(())
    }

    /// With `held`: drops from `todo` the rejects the topics already hold
    /// (produced by a folder that crashed before its delivery mark, or by
    /// an earlier round). Returns how many.
    async fn skip_delivered(
        &self,
        todo: &mut Vec<&Reject>,
        held: Option<&mut Held>,
    ) -> Result<usize> {
        let Some(held) = held else { return Ok(0) };
        let mut topics: Vec<String> = todo.iter().map(|r| self.topic_for(r).to_string()).collect();
        topics.sort();
        topics.dedup();
        let found = self.reader.read(topics, Some(held.from.clone())).await?;
        self.saw(&found.ends);
        raise_offsets(&mut held.from, &found.ends);
        held.ids.extend(found.reject_ids);
        if !found.unbounded.is_empty() && !std::mem::replace(&mut held.warned, true) {
            tracing::warn!(partitions = ?found.unbounded, "dead-letter partitions with no offset recorded before these fold rejects' commit (a graph from before 2026-12-04, the broker down at start, or a topic not created yet): delivering them at least once");
        }
        let before = todo.len();
        todo.retain(|r| !held.ids.contains(&r.reject_id));
        let skipped = before - todo.len();
        if skipped > 0 {
            tracing::info!(
                skipped,
                of = before,
                "fold rejects already on the dead-letter topic; not produced again"
            );
        }
        Ok(skipped)
    }

    /// Queues every reject in order, then awaits all their deliveries;
    /// returns the failed ones, in order.
    async fn send_all<'a>(&self, rejects: &[&'a Reject]) -> Vec<Failed<'a>> {
        let results = join_all(rejects.iter().map(|r| self.send(r))).await;
        rejects
            .iter()
            .zip(results)
            .filter_map(|(&reject, sent)| sent.err().map(|error| Failed { reject, error }))
            .collect()
    }

    async fn send(&self, r: &Reject) -> std::result::Result<(), String> {
        let purpose = Purpose::DeadLetter {
            connector: &self.connector,
            max_bytes: self.max_bytes,
        };
        let topic = self.topic_for(r);
        let rec = reject_record(r, topic, &purpose);
        let delivered = self
            .producer
            .send(rec, QUEUE_TIMEOUT)
            .await
            .map_err(|(e, _)| e.to_string())?;
        self.saw_one(topic, delivered.partition, delivered.offset + 1);
        Ok(())
    }
}
