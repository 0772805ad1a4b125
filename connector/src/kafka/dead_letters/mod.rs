//! The dead-letter producers: they produce rejects to their dead-letter
//! topic and wait for the broker's acknowledgements, retrying with backoff
//! while the topic is unavailable. A reject is never dropped, and its offset
//! waits until it is delivered. It decides nothing about what is rejected.
//!
//! Record rejects go out at least once (as in Kafka Connect): their offsets
//! wait, and a crash re-reads and re-produces them. Fold rejects go out
//! exactly once per `reject_id` to a `read_committed` reader: each
//! delivery is one Kafka transaction of a producer whose `transactional.id`
//! belongs to the graph's folding role, so a new folder's `InitProducerId`
//! fences the old one and aborts its open transaction; then what the topic
//! holds (`delivered`) is read back and skipped (docs/dead-letters.md).
//! That producer is `transactional.rs`'s.
//!
//! A refusal (an ACL, the credentials: `denied`) is no unavailability: a
//! delivery that meets one stops with `Error::NotAuthorized`, and so does
//! the start; what the clients meet in the background waits in
//! `DeadLetters::refused` for the run loop.

mod delivery;
mod transactional;

pub(crate) use transactional::fold_transactional_id;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::join_all;
use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, Producer};
use tokio_util::sync::CancellationToken;

use super::admin::{self, TopicCreation};
use super::client;
use super::client_log::ClientLog;
use super::delivered::DeliveredReader;
use super::denied::{self, Refused, SeenRefusal};
use super::record::{reject_record, Purpose};
use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::metrics::Metrics;
use crate::rejects::Reject;
use crate::types::{raise_offsets, PartitionOffsets};
use delivery::Delivery;
use transactional::FoldMode;

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
    /// The fold rejects' producer; one fold delivery at a time holds it.
    fold: Arc<tokio::sync::Mutex<FoldMode>>,
    /// Its client config: the dead-letter producer's, with the
    /// `transactional.id`.
    fold_client: rdkafka::ClientConfig,
    /// A refusal met in the background (the start's read of the topics,
    /// the fold-reject producer's init), for the run loop (`refused`).
    refusal: Arc<Mutex<Option<Error>>>,
    /// What both producers' contexts saw refused (their credentials).
    clients_saw: Arc<SeenRefusal>,
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
    /// The cluster refused it (or its producer).
    refused: Option<Refused>,
}

/// Why one produce failed.
struct SendError {
    error: String,
    refused: Option<Refused>,
}

impl DeadLetters {
    /// The producers (see `client::dead_letter_config`); creates the
    /// dead-letter topics that do not exist yet. `graph_root` names the
    /// fold-reject producer's `transactional.id` (unless `errors.producer`
    /// names one).
    pub(crate) async fn connect(
        config: &Config,
        graph_root: &str,
        metrics: Arc<Metrics>,
    ) -> Result<DeadLetters> {
        let mut cc = client::dead_letter_config(config);
        let txn_id = cc
            .get("transactional.id")
            .map(str::to_string)
            .unwrap_or_else(|| fold_transactional_id(graph_root));
        cc.remove("transactional.id");
        let clients_saw = Arc::<SeenRefusal>::default();
        let producer: FutureProducer<ClientLog> =
            cc.create_with_context(ClientLog::noting(clients_saw.clone()))?;
        let mut fold_client = cc.clone();
        fold_client.set("transactional.id", &txn_id);
        let fold = if config.errors.dead_letter_transactions {
            FoldMode::Uninitialised
        } else {
            FoldMode::ReadBack
        };
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
            reader: DeliveredReader::new(config, config.errors.dead_letter_transactions)?,
            seen: Arc::default(),
            fold: Arc::new(tokio::sync::Mutex::new(fold)),
            fold_client,
            refusal: Arc::default(),
            clients_saw,
        };
        dl.create_topics().await?;
        // Best effort, in the background (a dead-letter cluster that is down
        // must not hold the start): the first fold's lower bound (`seen`).
        // Without it the first commits' fold rejects go out at least once.
        // The read also probes that READ is granted.
        let bg = dl.clone();
        tokio::spawn(async move {
            match bg.reader.read(bg.topics(), None).await {
                Ok(found) => bg.saw(&found.ends),
                Err(e) if e.kind() == ErrorKind::NotAuthorized => bg.refused_meanwhile(e),
                Err(e) => tracing::debug!(error = %e, "dead-letter ends unknown at start"),
            }
        });
        Ok(dl)
    }

    /// A refusal the producers or the background reads met that no
    /// delivery has returned yet: the run loop asks between polls. The
    /// idempotent producer's init, refused, is fatal to it (librdkafka):
    /// every later produce would fail.
    pub(crate) fn refused(&self) -> Option<Error> {
        if let Some(e) = self
            .refusal
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            return Some(e);
        }
        let r = self.producer_refusal(&self.producer, None)?;
        Some(self.denied(r, &self.topics().join(", "), false))
    }

    fn refused_meanwhile(&self, e: Error) {
        let mut slot = self.refusal.lock().unwrap_or_else(|e| e.into_inner());
        slot.get_or_insert(e);
    }

    /// The `NotAuthorized` a refusal of producing to `topic` comes to
    /// (`transactional`: by the fold-reject producer).
    fn denied(&self, r: Refused, topic: &str, transactional: bool) -> Error {
        let needs = match r {
            Refused::Topic => denied::write_topic(topic),
            // The idempotent producer's InitProducerId: WRITE on any topic
            // allows it (KIP-679), as IDEMPOTENT_WRITE on the cluster does.
            Refused::Cluster if !transactional => {
                format!(
                    "{} (or IDEMPOTENT_WRITE on cluster)",
                    denied::write_topic(topic)
                )
            }
            Refused::Cluster => "IDEMPOTENT_WRITE on cluster".into(),
            Refused::TransactionalId => denied::write_transactional_id(self.transactional_id()),
            Refused::Credentials => denied::credentials(self.client.get("sasl.username")),
            Refused::Group => format!("a permission the dead-letter producer asked for ({topic})"),
        };
        r.needs(needs)
    }

    /// The refusal behind a producer's failure: the error's own code, the
    /// producer's fatal error (its init refused: librdkafka makes that
    /// fatal), or a refusal of the credentials (reported only to the
    /// producers' contexts).
    fn producer_refusal(
        &self,
        producer: &FutureProducer<ClientLog>,
        e: Option<&KafkaError>,
    ) -> Option<Refused> {
        let fatal = || {
            let (code, _) = producer.client().fatal_error()?;
            Refused::of_code(code)
        };
        let credentials = || {
            self.clients_saw
                .get()
                .filter(|r| *r == Refused::Credentials)
        };
        e.and_then(Refused::of).or_else(fatal).or_else(credentials)
    }

    /// The fold-reject producer's `transactional.id`.
    fn transactional_id(&self) -> &str {
        self.fold_client.get("transactional.id").unwrap_or_default()
    }

    /// Every dead-letter topic a mapping uses, sorted: `errors.dead_letter_topic`
    /// only if a mapping sets none of its own (it is looked up, created and
    /// read at start, so an unused one would need ACLs for nothing).
    fn topics(&self) -> Vec<String> {
        let mut names: Vec<String> = self.by_topic.values().cloned().collect();
        if names.is_empty() {
            names.push(self.default_topic.clone());
        }
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

    /// Looks the dead-letter topics up and creates the missing ones (an
    /// operator may have made them; a broker that auto-creates topics
    /// needs none of this). A refusal is an error: a topic graphsink may
    /// neither see nor create would hold every reject's offset for ever,
    /// so the start stops and says what to grant. Anything else is said
    /// and tried again at the first failed delivery.
    async fn create_topics(&self) -> Result<()> {
        let topics = self.topics();
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        let outcomes = match admin::create_topics(&self.client, &names, 1).await {
            Ok(o) => o,
            Err(e) if e.kind() == ErrorKind::NotAuthorized => return Err(e),
            // A wrong password shows as a lookup that timed out; the
            // producer's context heard why.
            Err(_) if self.clients_saw.get() == Some(Refused::Credentials) => {
                return Err(self.denied(Refused::Credentials, "", false))
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot look up or create the dead-letter topics; tried again at the first failed delivery");
                return Ok(());
            }
        };
        let mut ready = true;
        for o in outcomes {
            let t = &o.topic;
            match o.outcome {
                TopicCreation::Created => tracing::info!(topic = %t, "created dead-letter topic"),
                TopicCreation::Exists => tracing::debug!(topic = %t, "dead-letter topic exists"),
                // DESCRIBE refused: neither READ nor WRITE is granted.
                TopicCreation::Refused {
                    refused,
                    looked: true,
                } => return Err(refused.needs(format!("READ and WRITE on topic {t}"))),
                TopicCreation::Refused { refused, .. } => {
                    return Err(refused.needs(denied::create_topic(t)))
                }
                TopicCreation::Failed(e) => {
                    ready = false;
                    tracing::warn!(topic = %t, error = %e, "cannot create dead-letter topic")
                }
            }
        }
        self.topics_ready.store(ready, Ordering::Relaxed);
        Ok(())
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
        if let Some(since) = once {
            let mut fold = self.fold.lock().await;
            if !matches!(*fold, FoldMode::ReadBack) {
                return self
                    .deliver_in_transactions(&mut fold, rejects, since, stop)
                    .await;
            }
        }
        self.deliver_read_back(rejects, once, stop).await
    }

    /// [`DeadLetters::deliver`] without transactions: record rejects, and
    /// fold rejects under the read-back rule alone.
    async fn deliver_read_back(
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
                    _ = stop.cancelled() => Err(Error::Broker("stopped while reading".into())),
                }
            };
            let (failed, attempted) = match skipped {
                Err(e) if e.kind() == ErrorKind::NotAuthorized => return Err(e),
                Err(e) => {
                    let error = format!("cannot read what the topic holds: {e}");
                    let failed = todo.iter().map(|&reject| Failed {
                        reject,
                        error: error.clone(),
                        refused: None,
                    });
                    (failed.collect(), false)
                }
                Ok(skipped) => {
                    delivery.skipped(skipped);
                    if todo.is_empty() {
                        return Ok(());
                    }
                    if once.is_some() {
                        crate::failpoints::hit(
                            crate::failpoints::FOLD_DEAD_LETTERS_BEFORE_PRODUCE,
                        )?;
                    }
                    let first = std::mem::take(&mut first);
                    (self.produce_round(&todo, first, stop).await, true)
                }
            };
            delivery.round(todo.len() - failed.len(), failed.len(), attempted);
            let Some(f) = failed.first() else {
                return Ok(());
            };
            if let Some(f) = failed.iter().find(|f| f.refused.is_some()) {
                let refused = f.refused.expect("found above");
                return Err(self.denied(refused, self.topic_for(f.reject), false));
            }
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
            self.back_off(&mut delay, stop).await?;
            todo = failed.into_iter().map(|f| f.reject).collect();
        }
        Ok(())
    }

    /// One round's produce of `todo`; what comes back failed. The
    /// first round runs to its end (bounded by message.timeout.ms), so a
    /// graceful stop still delivers to a healthy topic; retries give way to
    /// `stop`.
    async fn produce_round<'r>(
        &self,
        todo: &[&'r Reject],
        first: bool,
        stop: &CancellationToken,
    ) -> Vec<Failed<'r>> {
        if first {
            return self.send_all(&self.producer, todo).await;
        }
        tokio::select! {
            failed = self.send_all(&self.producer, todo) => failed,
            _ = stop.cancelled() => todo.iter().map(|&reject| Failed {
                reject,
                error: "stopped while producing".to_string(),
                refused: None,
            }).collect(),
        }
    }

    /// Between two failed rounds: creates the topics if they were missing
    /// (the broker may have been down at start), then waits `delay`
    /// (doubling it, up to 5 s), or less if `stop` is cancelled. Fails only
    /// with a refusal.
    async fn back_off(&self, delay: &mut Duration, stop: &CancellationToken) -> Result<()> {
        if !self.topics_ready.load(Ordering::Relaxed) {
            tokio::select! {
                _ = stop.cancelled() => {}
                created = self.create_topics() => created?,
            }
        }
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(*delay) => {}
        }
        *delay = (*delay * 2).min(Duration::from_secs(5));
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
    async fn send_all<'a>(
        &self,
        producer: &FutureProducer<ClientLog>,
        rejects: &[&'a Reject],
    ) -> Vec<Failed<'a>> {
        let results = join_all(rejects.iter().map(|r| self.send(producer, r))).await;
        rejects
            .iter()
            .zip(results)
            .filter_map(|(&reject, sent)| {
                let e = sent.err()?;
                Some(Failed {
                    reject,
                    error: e.error,
                    refused: e.refused,
                })
            })
            .collect()
    }

    async fn send(
        &self,
        producer: &FutureProducer<ClientLog>,
        r: &Reject,
    ) -> std::result::Result<(), SendError> {
        let purpose = Purpose::DeadLetter {
            connector: &self.connector,
            max_bytes: self.max_bytes,
        };
        let topic = self.topic_for(r);
        let rec = reject_record(r, topic, &purpose);
        let delivered = producer
            .send(rec, QUEUE_TIMEOUT)
            .await
            .map_err(|(e, _)| SendError {
                refused: self.producer_refusal(producer, Some(&e)),
                error: e.to_string(),
            })?;
        self.saw_one(topic, delivered.partition, delivered.offset + 1);
        Ok(())
    }
}
