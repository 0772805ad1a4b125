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

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::join_all;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, Producer};
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

/// How long one transaction call (init, commit, abort) may take.
const TXN_TIMEOUT: Duration = Duration::from_secs(30);

/// The fold-reject producer's `transactional.id` for a graph: one per
/// graph, so each new folder fences the one before it. Derived from the
/// root, which names the graph, in one spelling (`canonical_root`): two
/// members that spell it differently must still fence each other.
pub(crate) fn fold_transactional_id(graph_root: &str) -> String {
    let root = crate::config::canonical_root(graph_root);
    let id = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_URL, root.as_bytes());
    format!("graphsink-fold-{id}")
}

/// How fold rejects reach the topic once.
enum FoldMode {
    /// Transactions are wanted; the producer is made and initialised at the
    /// first fold delivery (or when this process becomes the folder).
    Uninitialised,
    /// An initialised transactional producer: it fenced every older folder.
    Transactional(FutureProducer<ClientLog>),
    /// The read-back rule alone: `errors.dead_letter_transactions = false`,
    /// or a broker that refused transactions (said once).
    ReadBack,
}

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
        let producer: FutureProducer<ClientLog> = cc.create_with_context(ClientLog::default())?;
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
            self.back_off(&mut delay, stop).await;
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
            }).collect(),
        }
    }

    /// Fold rejects, exactly once: each round inits the transactional
    /// producer if it is not (fencing older folders, aborting their open
    /// transaction), reads back what the topics hold committed at or past
    /// `since` and skips it, then produces the rest in one transaction. A
    /// failed round aborts (an unclear commit re-inits, which settles it)
    /// and is retried with backoff; a fenced producer stops: another
    /// process folds now.
    async fn deliver_in_transactions(
        &self,
        fold: &mut FoldMode,
        rejects: &[Reject],
        since: &PartitionOffsets,
        stop: &CancellationToken,
    ) -> Result<()> {
        let mut todo: Vec<&Reject> = rejects.iter().collect();
        let mut delivery = Delivery::new(&self.metrics, todo.len());
        let mut delay = Duration::from_millis(100);
        let mut held = Held {
            from: since.clone(),
            ids: HashSet::new(),
            warned: false,
        };
        loop {
            let failure = match self.transactional(fold).await {
                Ok(None) => {
                    // The broker refused transactions: read-back from here on.
                    drop(delivery);
                    return self.deliver_read_back(rejects, Some(since), stop).await;
                }
                Err(e) => {
                    delivery.round(0, todo.len(), false);
                    format!("cannot start the transactional producer: {e}")
                }
                Ok(Some(producer)) => match self.skip_delivered(&mut todo, Some(&mut held)).await {
                    Err(e) => {
                        delivery.round(0, todo.len(), false);
                        format!("cannot read what the topic holds: {e}")
                    }
                    Ok(skipped) => {
                        delivery.skipped(skipped);
                        if todo.is_empty() {
                            return Ok(());
                        }
                        crate::failpoints::hit(
                            crate::failpoints::FOLD_DEAD_LETTERS_BEFORE_PRODUCE,
                        )?;
                        match self.transaction(&producer, &todo).await {
                            Ok(()) => {
                                delivery.round(todo.len(), 0, true);
                                return Ok(());
                            }
                            Err(f) => {
                                delivery.round(0, todo.len(), true);
                                if f.fenced {
                                    *fold = FoldMode::Uninitialised;
                                    return Err(Error::ProducerFenced {
                                        transactional_id: self
                                            .fold_client
                                            .get("transactional.id")
                                            .unwrap_or_default()
                                            .to_string(),
                                        reason: f.error,
                                    });
                                }
                                if f.reinit {
                                    *fold = FoldMode::Uninitialised;
                                }
                                f.error
                            }
                        }
                    }
                },
            };
            tracing::warn!(
                topic = %self.topic_for(todo[0]), rejects = todo.len(), error = %failure,
                "fold-reject transaction failed; retrying (the commit's delivery mark waits)"
            );
            if stop.is_cancelled() {
                return Err(Error::DeadLetter {
                    topic: self.topic_for(todo[0]).to_string(),
                    reason: format!("stopped before delivering fold rejects: {failure}"),
                });
            }
            self.back_off(&mut delay, stop).await;
        }
    }

    /// Between two failed rounds: creates the topics if they were missing
    /// (the broker may have been down at start), then waits `delay`
    /// (doubling it, up to 5 s), or less if `stop` is cancelled.
    async fn back_off(&self, delay: &mut Duration, stop: &CancellationToken) {
        if !self.topics_ready.load(Ordering::Relaxed) {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = self.create_topics() => {}
            }
        }
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(*delay) => {}
        }
        *delay = (*delay * 2).min(Duration::from_secs(5));
    }

    /// When this process becomes the graph's folder: init the fold-reject
    /// producer now, so an older folder's open transaction is aborted (and
    /// the older folder fenced) before anything is re-delivered, instead of
    /// at the first fold with rejects. Errors are retried by that fold.
    /// In the background: a dead-letter cluster that is down must not hold
    /// the start (a delivery waits for it on the same lock).
    pub(crate) fn fence_older_folders(&self) {
        let me = self.clone();
        tokio::spawn(async move {
            let mut fold = me.fold.lock().await;
            if let Err(e) = me.transactional(&mut fold).await {
                tracing::warn!(error = %e, "cannot init the fold-reject producer yet; the first fold delivery retries");
            }
        });
    }

    /// The initialised transactional producer; `None` once the broker
    /// refused transactions (the read-back rule from then on, said once).
    async fn transactional(
        &self,
        fold: &mut FoldMode,
    ) -> std::result::Result<Option<FutureProducer<ClientLog>>, String> {
        let cc = match fold {
            FoldMode::Transactional(p) => return Ok(Some(p.clone())),
            FoldMode::ReadBack => return Ok(None),
            FoldMode::Uninitialised => &self.fold_client,
        };
        let id = cc.get("transactional.id").unwrap_or_default().to_string();
        let producer: FutureProducer<ClientLog> = cc
            .create_with_context(ClientLog::default())
            .map_err(|e| e.to_string())?;
        let p = producer.clone();
        let init = tokio::task::spawn_blocking(move || p.init_transactions(TXN_TIMEOUT))
            .await
            .map_err(|e| format!("init task: {e}"))?;
        match init {
            Ok(()) => {
                tracing::info!(transactional_id = %id, "fold-reject producer initialised: any older folder is fenced and its open transaction aborted");
                *fold = FoldMode::Transactional(producer.clone());
                Ok(Some(producer))
            }
            Err(e) if refuses_transactions(&e) => {
                tracing::error!(transactional_id = %id, error = %e, "the dead-letter broker does not support transactions: fold rejects fall back to the read-back rule (exactly once across crashes, at least once across a frozen folder's late produce); set errors.dead_letter_transactions = false to say so in the config");
                *fold = FoldMode::ReadBack;
                Ok(None)
            }
            Err(e) => Err(e.to_string()),
        }
    }

    /// One transaction: begin, produce every reject, commit. A failed
    /// produce aborts it (what landed is never visible to read_committed
    /// readers); a commit that fails asks for a re-init, which completes or
    /// aborts it at the coordinator before anything else is produced.
    async fn transaction(
        &self,
        producer: &FutureProducer<ClientLog>,
        todo: &[&Reject],
    ) -> std::result::Result<(), TxnFailure> {
        let p = producer.clone();
        blocking(move || p.begin_transaction()).await?;
        let failed = self.send_all(producer, todo).await;
        if let Some(f) = failed.first() {
            let error = format!(
                "{} of {} produces failed: {}",
                failed.len(),
                todo.len(),
                f.error
            );
            let p = producer.clone();
            return match blocking(move || p.abort_transaction(TXN_TIMEOUT)).await {
                Ok(()) => Err(TxnFailure {
                    error,
                    reinit: false,
                    fenced: is_fenced(producer),
                }),
                Err(a) => Err(TxnFailure {
                    error: format!("{error}; abort: {}", a.error),
                    reinit: true,
                    fenced: a.fenced,
                }),
            };
        }
        crate::failpoints::hit(crate::failpoints::FOLD_DEAD_LETTERS_BEFORE_COMMIT).map_err(
            |e| TxnFailure {
                error: e.to_string(),
                reinit: true,
                fenced: false,
            },
        )?;
        let p = producer.clone();
        blocking(move || p.commit_transaction(TXN_TIMEOUT))
            .await
            .map_err(|f| TxnFailure { reinit: true, ..f })
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
            .filter_map(|(&reject, sent)| sent.err().map(|error| Failed { reject, error }))
            .collect()
    }

    async fn send(
        &self,
        producer: &FutureProducer<ClientLog>,
        r: &Reject,
    ) -> std::result::Result<(), String> {
        let purpose = Purpose::DeadLetter {
            connector: &self.connector,
            max_bytes: self.max_bytes,
        };
        let topic = self.topic_for(r);
        let rec = reject_record(r, topic, &purpose);
        let delivered = producer
            .send(rec, QUEUE_TIMEOUT)
            .await
            .map_err(|(e, _)| e.to_string())?;
        self.saw_one(topic, delivered.partition, delivered.offset + 1);
        Ok(())
    }
}

/// A failed transaction round.
struct TxnFailure {
    error: String,
    /// The producer's state is unclear (a failed commit or abort): make a
    /// new one, whose init settles the open transaction.
    reinit: bool,
    /// A newer folder fenced this producer.
    fenced: bool,
}

/// A blocking transaction call, off the async workers.
async fn blocking(
    f: impl FnOnce() -> rdkafka::error::KafkaResult<()> + Send + 'static,
) -> std::result::Result<(), TxnFailure> {
    let outcome = tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| TxnFailure {
            error: format!("transaction task: {e}"),
            reinit: true,
            fenced: false,
        })?;
    outcome.map_err(|e| TxnFailure {
        fenced: is_fenced_error(&e),
        reinit: !matches!(&e, KafkaError::Transaction(t) if t.txn_requires_abort() || t.is_retriable()),
        error: e.to_string(),
    })
}

fn code_of(e: &KafkaError) -> Option<RDKafkaErrorCode> {
    match e {
        KafkaError::Transaction(t) => Some(t.code()),
        other => other.rdkafka_error_code(),
    }
}

fn is_fenced_error(e: &KafkaError) -> bool {
    matches!(
        code_of(e),
        Some(
            RDKafkaErrorCode::Fenced
                | RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::InvalidProducerEpoch
        )
    )
}

/// A producer whose fatal error says a newer instance fenced it.
fn is_fenced(producer: &FutureProducer<ClientLog>) -> bool {
    matches!(
        producer.client().fatal_error(),
        Some((
            RDKafkaErrorCode::Fenced
                | RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::InvalidProducerEpoch,
            _
        ))
    )
}

/// An init refused because the broker has no transactions (too old, or a
/// broker such as tansu 0.6 that does not implement them), not because it
/// is unreachable.
fn refuses_transactions(e: &KafkaError) -> bool {
    matches!(
        code_of(e),
        Some(
            RDKafkaErrorCode::UnsupportedVersion
                | RDKafkaErrorCode::UnsupportedFeature
                | RDKafkaErrorCode::UnsupportedForMessageFormat
                | RDKafkaErrorCode::InvalidRequest
        )
    )
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::fold_transactional_id;
    use crate::config::resolve_uri;

    /// Two spellings of one root give one `transactional.id`, or two
    /// folders of one graph would not fence each other and a frozen one's
    /// late produce would show a reject twice.
    #[test]
    fn one_root_spelled_any_way_gives_one_transactional_id() {
        let base = Path::new("/srv/gs");
        let id = |root: &str| fold_transactional_id(&resolve_uri(root, base));
        let one = id("/srv/gs/graph");
        for root in [
            "graph",
            "./graph",
            "graph/",
            "./graph/.",
            "/srv/gs/graph/",
            "/srv/gs/x/../graph",
            "file:///srv/gs/graph",
            "file:///srv/gs/graph/",
            "file:///srv/gs/./graph",
        ] {
            assert_eq!(id(root), one, "{root}");
        }
        assert_ne!(id("/srv/gs/other"), one);
        assert_eq!(id("s3://bucket/g/"), id("s3://bucket/./g"));
        assert_ne!(id("s3://bucket/g"), one);
    }
}
