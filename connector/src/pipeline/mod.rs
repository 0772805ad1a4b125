//! The run loop: consume a poll → decode per mapping → put into shards
//! without waiting → queue the poll's durability in poll order → advance
//! watermarks → commit. It also serves the fold loop's freeze cuts, between
//! polls, so a cut never splits a poll.

pub(crate) mod from_registry;
mod schemas;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::FuturesOrdered;
use futures::{FutureExt, StreamExt};
use rdkafka::consumer::CommitMode;
use rdkafka::message::{BorrowedMessage, Message};
use tokio::sync::{mpsc, watch, Notify};
use tokio_util::sync::CancellationToken;

use crate::config::{Config, Evolve, Sharding, Tolerance};
use crate::decode::{RecordDecoder, SourceRecord};
use crate::error::{Error, ErrorKind, Result};
use crate::failpoints;
use crate::fold::{self, CutRequest, FoldLoop, FreezeCut, Policies};
use crate::graph::{Graph, GraphCommit};
use crate::kafka::consumer::{self, Committable, GroupConsumer, GroupEvent, GroupStream};
use crate::kafka::stall::{self, StallWatch, Verdict};
use crate::kafka::{DeadLetters, OffsetQueries};
use crate::metrics::Metrics;
use crate::offsets::{DurableWatermarks, PollAck, PollSpans, TopicPartition, WrittenSpans};
use crate::registry::Registry;
use crate::rejects;
use crate::retention;
use crate::schema::{GraphSchema, REJECTS_TABLE};
use crate::shards::{self, PendingWrite, ShardPool};
use schemas::SchemaHolds;

/// Knobs of one run that are not part of the config file.
#[derive(Clone, Default)]
pub struct RunOptions {
    /// Stop once every assigned partition is durable and committed up to the
    /// end offsets seen at assignment (like kafka-delta-ingest's `-e`).
    pub exit_at_end: bool,
    /// Notified to fold now (operators: SIGUSR1; tests).
    pub fold_now: Option<Arc<Notify>>,
    /// Receives every graph commit the fold loop publishes.
    pub published: Option<watch::Sender<Option<GraphCommit>>>,
    /// Live counters, shared with the caller.
    pub stats: Option<Arc<RunStats>>,
    /// Metrics and probe state, shared with whoever serves them (`http`);
    /// given, librdkafka's statistics are collected too.
    pub metrics: Option<Arc<Metrics>>,
}

/// Counters a running connector keeps up to date.
#[derive(Debug, Default)]
pub struct RunStats {
    /// Records taken from Kafka and written (not yet durable) to the WAL.
    pub consumed: AtomicU64,
    /// Records whose poll became durable.
    pub durable: AtomicU64,
    /// Records rejected before the WAL (decode, validate).
    pub rejected: AtomicU64,
    /// Successful offset commits.
    pub commits: AtomicU64,
    /// Ingest sessions restarted in-process after a passing storage failure.
    pub restarts: AtomicU64,
    /// Polls taken, and the run loop's time in them (ns): in all, in
    /// decoding + validating, and in handing rows to the shard writers
    /// (memtable inserts). The loop is one task, so busy ÷ wall time says
    /// how close ingest is to its single-task ceiling.
    pub polls: AtomicU64,
    pub poll_ns: AtomicU64,
    pub decode_ns: AtomicU64,
    pub put_ns: AtomicU64,
    /// Of the poll time: taking the records from the consumer, and putting
    /// the poll's rejects into the rejects WAL.
    pub take_ns: AtomicU64,
    pub reject_ns: AtomicU64,
    /// Outside polls: time with the in-flight window full (no fetching
    /// until an ack), and in the fold's freeze cuts.
    pub window_full_ns: AtomicU64,
    pub cut_ns: AtomicU64,
}

fn nanos(since: std::time::Instant) -> u64 {
    since.elapsed().as_nanos() as u64
}

/// What a finished run reports.
#[derive(Debug, Default, Clone)]
pub struct RunSummary {
    pub records: u64,
    pub committed: BTreeMap<TopicPartition, i64>,
}

/// Partitions as `topic/partition` lines joined by commas, for log fields.
fn names(tps: &[TopicPartition]) -> String {
    tps.iter()
        .map(|(t, p)| format!("{t}/{p}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Memtable rows and bytes and flush counts of every writer. A free
/// function: the run loop itself is not `Sync`, so `&RunLoop` cannot be
/// held across an await.
async fn sample_writers(pool: &ShardPool, metrics: &Metrics) {
    for m in pool.memtables().await {
        metrics.memtable(&m.table, m.bucket, m.rows, m.bytes, m.flushes);
    }
}

/// Sleeps until `t`, or forever when there is none.
async fn sleep_until(t: Option<tokio::time::Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// Runs the connector until `shutdown` is cancelled, then drains: stops
/// fetching, awaits in-flight durability, commits, closes the writers.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<RunSummary> {
    run_with(config, RunOptions::default(), shutdown).await
}

pub async fn run_with(
    config: Config,
    options: RunOptions,
    shutdown: CancellationToken,
) -> Result<RunSummary> {
    let mut total = RunSummary::default();
    let mut backoff = StorageBackoff::new(config.graph.storage_retry_max_backoff);
    let kafka_stats = options.metrics.is_some();
    let metrics = options
        .metrics
        .clone()
        .unwrap_or_else(|| Arc::new(Metrics::new(config.http.stall_bound)));
    loop {
        let started = tokio::time::Instant::now();
        let result = session(
            &config,
            &options,
            &metrics,
            kafka_stats,
            &shutdown,
            &mut total,
        )
        .await;
        metrics.run_loop_stopped();
        match result {
            Ok(()) => return Ok(total),
            // Under partition sharding a fencing means the group moved a
            // shard while this member was away (a pause past the session
            // timeout): nothing past durability was acked, so it rejoins.
            // A lost commit race means another member folded meanwhile (a
            // hand-off of the fold partition): the new session re-reads who
            // folds and recovers whatever this fold left.
            Err(e)
                if (e.is_passing_storage_failure()
                    || matches!(e, Error::RegistrySchemaGrew { .. })
                    || (config.wal.sharding == Sharding::Partition
                        && (e.kind() == ErrorKind::Fenced || e.is_commit_race())))
                    && !shutdown.is_cancelled() =>
            {
                let delay = backoff.next(started.elapsed());
                if let Some(stats) = &options.stats {
                    stats.restarts.fetch_add(1, Ordering::Relaxed);
                }
                metrics.session_restarted();
                if let Error::RegistrySchemaGrew { .. } = &e {
                    tracing::info!(event = "registry_schema_grew", "{e}");
                    continue; // nothing failed: no backoff
                }
                if e.kind() == ErrorKind::Fenced {
                    metrics.fenced();
                    tracing::warn!(
                        event = "fenced",
                        error = %e,
                        retry_in = ?delay,
                        "another member claimed a shard of this one (the group moved its \
                         partition): rejoining the group in this process; records not yet \
                         acked are read again by their owner"
                    );
                } else if e.is_commit_race() && !e.is_passing_storage_failure() {
                    tracing::warn!(
                        event = "commit_race",
                        error = %e,
                        retry_in = ?delay,
                        "another member published a graph commit while this one folded \
                         (the fold partition moved): restarting the session in this process; \
                         the new folder recovers what this fold left"
                    );
                } else {
                    tracing::warn!(
                        error = %e,
                        retry_in = ?delay,
                        "storage failed; restarting the ingest session in this process \
                         (shards reopen and replay; records not yet acked are read again)"
                    );
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return Err(e),
                    _ = tokio::time::sleep(delay) => {}
                }
            }
            Err(e) => {
                if e.kind() == ErrorKind::Fenced {
                    metrics.fenced();
                    tracing::error!(event = "fenced", error = %e, "fenced: another writer claimed a shard; this run stops acking");
                }
                return Err(e);
            }
        }
    }
}

/// The wait before restarting a session that failed on storage: doubling
/// from 250 ms up to `max`, and back to the start after a session that ran
/// a minute (it was not the same outage).
struct StorageBackoff {
    next: Duration,
    max: Duration,
}

impl StorageBackoff {
    const FIRST: Duration = Duration::from_millis(250);

    fn new(max: Duration) -> Self {
        StorageBackoff {
            next: Self::FIRST,
            max,
        }
    }

    fn next(&mut self, session_ran: Duration) -> Duration {
        if session_ran >= Duration::from_secs(60) {
            self.next = Self::FIRST;
        }
        let delay = self.next.min(self.max);
        self.next = (self.next * 2).min(self.max);
        delay
    }
}

/// One ingest session: open the graph, recover, open (claim) the shards,
/// join the group, and serve until shutdown, the end, or a failure. A
/// failed session has committed nothing past durability, so a new session
/// can start over from the group's committed offsets.
async fn session(
    config: &Config,
    options: &RunOptions,
    metrics: &Arc<Metrics>,
    kafka_stats: bool,
    shutdown: &CancellationToken,
    total: &mut RunSummary,
) -> Result<()> {
    metrics.session_started();
    let schema = GraphSchema::load(&config.schema_path())?;
    let schema = match config.graph.evolve {
        Evolve::FromRegistry => from_registry::schema(config, schema).await?,
        _ => schema,
    };
    let partitions = match config.wal.sharding {
        Sharding::Partition => Some(crate::kafka::partition_counts(config).await?),
        Sharding::Bucket => None,
    };
    let graph = Graph::open_or_init_with(config, schema, partitions.as_ref()).await?;
    let policies = Policies::from_config(config);
    // A schema change this config brings: applied before any writer opens
    // (boxed: its future nests a whole fold, too deep to inline here).
    let migrating = fold::migrate(&graph, &policies, &config.wal, &config.graph.actor);
    let graph = match Box::pin(migrating).await? {
        Some(m) => m.graph,
        None => graph,
    };
    // Under partition sharding only the member holding the fold partition
    // recovers and re-delivers, when it becomes that member (fold task).
    let partitioned = graph.layout().sharding == Sharding::Partition;
    if !partitioned {
        fold::recover(&graph, &policies).await?;
    }
    let head = graph.head().await?;
    metrics.head(head.seq, head.created_at);
    let decoders = decoders(config, &graph)?;
    let registry = config
        .mappings
        .iter()
        .any(|m| m.format.uses_registry())
        .then(|| Registry::new(&config.schema_registry))
        .transpose()?
        .map(|r| r.metered(metrics.clone()));
    let dead_letters = DeadLetters::connect(config, graph.root(), metrics.clone()).await?;
    let (pool, delivered, role) = if partitioned {
        let pool = ShardPool::open_unclaimed(&graph, &config.wal, &graph.wal_tables()).await?;
        (pool, 0, Some(FoldRole::new(config, &graph)))
    } else {
        let delivered = fold::redeliver(&graph, &dead_letters, shutdown).await?;
        let pool = ShardPool::open(&graph, &config.wal, &graph.wal_tables()).await?;
        (pool, delivered, None)
    };
    metrics.writers_reopened();
    let retention = retention::Scheduled::new(&config.retention, pool.live_shards());
    // End offsets (exit_at_end) and the group's progress (the stall watch).
    let queries = OffsetQueries::connect(config)?;
    let stall_bound = config.offsets.stall_timeout.unwrap_or_else(|| {
        stall::bound_for(config.kafka.get("session.timeout.ms").map(String::as_str))
    });

    // From here on, every exit closes the consumer through `consumer::close`.
    let committable: Committable = Default::default();
    let (kafka, events) =
        consumer::subscribe(config, committable.clone(), metrics.clone(), kafka_stats)?;
    let wake = options.fold_now.clone().unwrap_or_default();
    let (cut_tx, cuts) = mpsc::channel(1);
    let fold_loop = FoldLoop {
        graph: graph.clone(),
        policies,
        interval: config.fold.interval,
        actor: config.graph.actor.clone(),
        cuts: cut_tx,
        wake: wake.clone(),
        stop: CancellationToken::new(),
        final_fold: config.fold.on_shutdown,
        published: options
            .published
            .clone()
            .unwrap_or_else(|| watch::channel(None).0),
        dead_letters: dead_letters.clone(),
        delivered,
        stop_delivery: shutdown.child_token(),
        retention,
        report: fold::Report::new(metrics.clone()),
        oldest_taken: None,
        leader: role.as_ref().map(|r| r.tx.subscribe()),
        recovered: false,
    };
    let mut fold = FoldTask::spawn(fold_loop, cuts);
    let mut run = RunLoop {
        config,
        options,
        events,
        decoders,
        pool,
        committable,
        marks: DurableWatermarks::default(),
        spans: WrittenSpans::default(),
        in_flight: FuturesOrdered::new(),
        assigned: BTreeSet::new(),
        unassigned_probe: None,
        waiting_said: None,
        end_targets: None,
        queries,
        pending_rows: 0,
        pending_bytes: 0,
        wake,
        stats: options.stats.clone().unwrap_or_default(),
        summary: RunSummary::default(),
        dead_letters,
        shutdown: shutdown.clone(),
        breaker: Breaker::default(),
        last_poll: tokio::time::Instant::now(),
        stall: StallWatch::new(stall_bound, tokio::time::Instant::now()),
        metrics: metrics.clone(),
        taken: VecDeque::new(),
        oldest_taken: None,
        role,
        schemas: SchemaHolds::new(registry, config),
    };
    if let Err(e) = run.serve(&kafka, shutdown, &mut fold).await {
        total.records += run.summary.records;
        return Err(stop_after_failure(kafka, fold, e).await);
    }
    let summary = run.drain(kafka, fold).await?;
    total.records += summary.records;
    total.committed = summary.committed;
    Ok(())
}

/// One decoder per mapped topic.
fn decoders(config: &Config, graph: &Graph) -> Result<HashMap<String, RecordDecoder>> {
    let mut decoders = HashMap::new();
    for m in &config.mappings {
        let decoder = RecordDecoder::new(
            &graph.schema,
            m,
            config.wal.max_poll_records,
            config.errors.max_record_bytes,
        )?
        .partition_keyed(
            graph.layout().sharding == Sharding::Partition,
            config
                .wal
                .partitioner
                .zip(graph.layout().partitions.get(&m.topic).map(|&n| n as i32)),
        );
        decoders.insert(m.topic.clone(), decoder);
    }
    Ok(decoders)
}

/// How long a failed run waits for the fold task to end before aborting it.
const FOLD_STOP_BOUND: Duration = Duration::from_secs(30);

/// Every failed exit of a run: nothing more is acked (no drain, no
/// commit), the fold task ends (bounded) instead of outliving the run, and
/// the consumer leaves the group off the runtime. Returns `error`.
async fn stop_after_failure(kafka: GroupConsumer, fold: FoldTask, error: Error) -> Error {
    tracing::error!(error = %error, "stopping without committing further");
    fold.abandon(FOLD_STOP_BOUND).await;
    consumer::close(kafka).await;
    error
}

/// The fold loop's task and the run loop's side of its controls.
struct FoldTask {
    handle: tokio::task::JoinHandle<Result<()>>,
    /// Set once the handle returned (a join handle must not be polled again).
    joined: bool,
    stop: CancellationToken,
    /// Gives up the fold's dead-letter deliveries: a child of the shutdown
    /// token, also cancelled when the run fails.
    stop_delivery: CancellationToken,
    /// The fold loop's freeze-cut requests, served between polls.
    cuts: mpsc::Receiver<CutRequest>,
}

impl FoldTask {
    fn spawn(fold_loop: FoldLoop, cuts: mpsc::Receiver<CutRequest>) -> FoldTask {
        let stop = fold_loop.stop.clone();
        let stop_delivery = fold_loop.stop_delivery.clone();
        FoldTask {
            handle: tokio::spawn(fold_loop.run()),
            joined: false,
            stop,
            stop_delivery,
            cuts,
        }
    }

    /// How the fold task ended, as the run loop's result.
    fn ended(
        &mut self,
        joined: std::result::Result<Result<()>, tokio::task::JoinError>,
    ) -> Result<()> {
        self.joined = true;
        match joined {
            Ok(Ok(())) if self.stop.is_cancelled() => Ok(()),
            Ok(Ok(())) => Err(Error::Bug("fold loop ended unexpectedly".into())),
            Ok(Err(e)) => Err(e),
            Err(e) => Err(Error::joined("fold loop", e)),
        }
    }

    /// After a failure: no final fold (cut requests go unanswered) and no
    /// more deliveries; waits up to `bound` for the task to end, then
    /// aborts it (a fold cut short is a crash the next start recovers).
    async fn abandon(mut self, bound: Duration) {
        self.stop.cancel();
        self.stop_delivery.cancel();
        drop(self.cuts);
        if self.joined {
            return;
        }
        match tokio::time::timeout(bound, &mut self.handle).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "the fold loop stopped with an error"),
            Ok(Err(e)) => tracing::warn!(error = %e, "the fold loop panicked"),
            Err(_) => {
                tracing::warn!(?bound, "the fold loop did not stop in time; aborting it");
                self.handle.abort();
            }
        }
    }
}

/// A poll's durability: its ack, and the shards whose writes failed because
/// another writer claimed them (partition sharding: the shard moved with
/// its partition; `on_ack` decides whether that is fatal).
type AckFuture = BoxFuture<'static, Result<(PollAck, Vec<(String, u32, Error)>)>>;

struct RunLoop<'a> {
    config: &'a Config,
    options: &'a RunOptions,
    events: mpsc::UnboundedReceiver<GroupEvent>,
    decoders: HashMap<String, RecordDecoder>,
    pool: ShardPool,
    committable: Committable,
    marks: DurableWatermarks,
    /// Offsets written since the last freeze cut.
    spans: WrittenSpans,
    /// Durability of each poll, resolved in poll order (the ordered
    /// finalizer that keeps watermarks contiguous).
    in_flight: FuturesOrdered<AckFuture>,
    assigned: BTreeSet<TopicPartition>,
    /// When `at_end_unassigned` last asked the broker.
    unassigned_probe: Option<tokio::time::Instant>,
    /// When `at_end_unassigned` last said why it waits.
    waiting_said: Option<tokio::time::Instant>,
    /// End offsets to reach, for `exit_at_end`.
    end_targets: Option<BTreeMap<TopicPartition, i64>>,
    /// Watermark and committed-offset queries, for `exit_at_end` and the
    /// stall watch.
    queries: OffsetQueries,
    pending_rows: u64,
    pending_bytes: u64,
    wake: Arc<Notify>,
    stats: Arc<RunStats>,
    summary: RunSummary,
    dead_letters: DeadLetters,
    shutdown: CancellationToken,
    breaker: Breaker,
    /// When the last poll arrived (for `exit_at_end`).
    last_poll: tokio::time::Instant,
    /// Notices holding no partition while nobody consumes the topics.
    stall: StallWatch,
    metrics: Arc<Metrics>,
    /// When each in-flight poll was taken, in poll order (durable-ack latency).
    taken: VecDeque<std::time::Instant>,
    /// When the oldest record since the last cut was taken (graph-visible latency).
    oldest_taken: Option<std::time::Instant>,
    /// Under partition sharding: which tables each topic feeds, and
    /// whether this member folds.
    role: Option<FoldRole>,
    /// Partitions waiting for a schema from the registry.
    schemas: SchemaHolds,
}

/// A member's part under partition sharding: the shards of its assigned
/// partitions are its own, and the member assigned the fold partition
/// (partition 0 of the first mapped topic, by name) folds every shard's
/// flushed generations; the others only freeze theirs (docs/decisions/0007-scale-out.md).
struct FoldRole {
    /// Topic → the type tables it feeds.
    feeds: BTreeMap<String, Vec<String>>,
    fold_partition: TopicPartition,
    /// Every mapped partition.
    partitions: usize,
    tx: watch::Sender<fold::Part>,
}

impl FoldRole {
    fn new(config: &Config, graph: &Graph) -> FoldRole {
        let mut feeds: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for m in &config.mappings {
            if let Some(t) = graph.schema().get(m.type_name()) {
                feeds
                    .entry(m.topic.clone())
                    .or_default()
                    .push(t.table.clone());
            }
        }
        let first = feeds.keys().next().cloned().unwrap_or_default();
        let partitions = graph
            .layout()
            .partitions
            .values()
            .map(|&n| n as usize)
            .sum();
        FoldRole {
            feeds,
            fold_partition: (first, 0),
            partitions,
            tx: watch::channel(fold::Part::default()).0,
        }
    }

    /// The first partition `held` holds without partition p of another
    /// topic feeding the same table, as a config error: claiming its shard
    /// would fence the member holding the other. `range` with the same
    /// mappings on every member never does this (`validate_copartitioned_assignor`);
    /// a member mapping fewer topics than another does.
    fn split_shard(&self, held: &BTreeSet<TopicPartition>) -> Option<Error> {
        for (topic, p) in held {
            for table in self.feeds.get(topic).into_iter().flatten() {
                let missing = self
                    .feeds
                    .iter()
                    .filter(|(t, tables)| *t != topic && tables.contains(table))
                    .find(|(t, _)| !held.contains(&((*t).clone(), *p)));
                if let Some((other, _)) = missing {
                    return Some(Error::config(format!(
                        "the group assigned partition {p} of {topic} to this member and partition \
                         {p} of {other} elsewhere; both feed {table}, whose shard {p} has one \
                         writer, so this member stops rather than fence the other. Every member \
                         must map the same topics, with partition.assignment.strategy = \"range\""
                    )));
                }
            }
        }
        None
    }
}

/// The reject-rate breaker: rejects counted per minute; past the limit,
/// fetching pauses for `errors.breaker_pause`.
#[derive(Default)]
struct Breaker {
    window_start: Option<tokio::time::Instant>,
    count: u64,
    paused_until: Option<tokio::time::Instant>,
}

/// Takes whatever the consumer already holds after `first`, up to `limit`
/// records in all, without waiting for more.
fn take_poll<'c>(
    stream: &mut GroupStream<'c>,
    first: BorrowedMessage<'c>,
    limit: usize,
) -> Vec<BorrowedMessage<'c>> {
    let mut msgs = vec![first];
    while msgs.len() < limit {
        match stream.next().now_or_never() {
            Some(Some(Ok(m))) => msgs.push(m),
            Some(Some(Err(e))) => {
                tracing::warn!(error = %e, "consumer error inside a poll");
                break;
            }
            // Nothing ready (a Kafka stream never ends).
            Some(None) | None => break,
        }
    }
    msgs
}

impl RunLoop<'_> {
    async fn serve(
        &mut self,
        kafka: &GroupConsumer,
        shutdown: &CancellationToken,
        fold: &mut FoldTask,
    ) -> Result<()> {
        let mut commit_tick = tokio::time::interval(self.config.offsets.commit_interval);
        commit_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut end_check = tokio::time::interval(Duration::from_millis(200));
        let mut stall_check = tokio::time::interval(Duration::from_secs(1));
        stall_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let max_in_flight = self.config.wal.max_in_flight_polls;
        let mut full_since: Option<std::time::Instant> = None;
        let mut stream = kafka.stream();
        loop {
            // Priority: shutdown, then control (fold loop, rebalance, acks),
            // then data, then timers.
            self.metrics.run_loop_tick();
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Ok(()),
                joined = &mut fold.handle => return fold.ended(joined),
                Some(req) = fold.cuts.recv() => {
                    let t = std::time::Instant::now();
                    self.cut(req).await;
                    self.stats.cut_ns.fetch_add(nanos(t), Ordering::Relaxed);
                }
                Some(ev) = self.events.recv() => self.on_group_event(ev).await?,
                Some(ev) = self.schemas.events.recv() => {
                    self.schemas.on_event(kafka, &mut self.decoders, &self.metrics, ev)?;
                }
                Some(ack) = self.in_flight.next(), if !self.in_flight.is_empty() => {
                    if let Some(t) = full_since.take() {
                        self.stats.window_full_ns.fetch_add(nanos(t), Ordering::Relaxed);
                    }
                    let (ack, moved) = ack?;
                    self.on_moved(moved)?;
                    self.on_ack(ack);
                }
                _ = sleep_until(self.breaker.paused_until), if self.breaker.paused_until.is_some() => {
                    tracing::warn!(event = "breaker_closed", "reject-rate breaker: resuming fetches");
                    self.breaker.paused_until = None;
                    self.metrics.breaker(false);
                }
                Some(msg) = stream.next(), if self.in_flight.len() < max_in_flight && self.breaker.paused_until.is_none() => {
                    match msg {
                        Ok(first) => {
                            self.last_poll = tokio::time::Instant::now();
                            let ack = self.process_poll(kafka, &mut stream, first).await?;
                            self.in_flight.push_back(ack);
                            self.metrics.polls_in_flight(self.in_flight.len());
                            if self.in_flight.len() >= max_in_flight {
                                full_since = Some(std::time::Instant::now());
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "consumer error; librdkafka retries");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                }
                _ = commit_tick.tick() => {
                    self.commit(kafka, CommitMode::Async)?;
                    sample_writers(&self.pool, &self.metrics).await;
                }
                _ = stall_check.tick(), if self.assigned.is_empty() => self.watch_stall(kafka).await?,
                _ = end_check.tick(), if self.options.exit_at_end => {
                    if self.at_end().await? {
                        tracing::info!("all assigned partitions are durable up to their end offsets");
                        return Ok(());
                    }
                }
            }
        }
    }

    /// Takes whatever the consumer already holds, up to the poll limit, as
    /// one poll, and starts its WAL writes. Returns the poll's durability.
    async fn process_poll<'c>(
        &mut self,
        kafka: &GroupConsumer,
        stream: &mut GroupStream<'c>,
        first: BorrowedMessage<'c>,
    ) -> Result<AckFuture> {
        let started = std::time::Instant::now();
        let msgs = take_poll(stream, first, self.config.wal.max_poll_records);
        // Records whose schema is not known yet hold their partitions.
        let msgs = self.schemas.ready(kafka, &self.decoders, msgs)?;
        self.stats
            .take_ns
            .fetch_add(nanos(started), Ordering::Relaxed);
        let mut by_topic: BTreeMap<&str, Vec<SourceRecord<'_>>> = BTreeMap::new();
        let mut seen = PollSpans::default();
        // Per partition: records, key + value bytes, newest offset.
        let mut took: BTreeMap<(&str, i32), (u64, u64, i64)> = BTreeMap::new();
        self.taken.push_back(started);
        self.oldest_taken.get_or_insert(started);
        for m in &msgs {
            let r = SourceRecord {
                topic: m.topic(),
                partition: m.partition(),
                offset: m.offset(),
                timestamp: m.timestamp().to_millis(),
                key: m.key(),
                value: m.payload(),
                message: Some(m),
            };
            seen.record(r.topic, r.partition, r.offset);
            self.pending_bytes += r.value.map_or(0, |v| v.len() as u64);
            let t = took.entry((r.topic, r.partition)).or_default();
            t.0 += 1;
            t.1 += (r.key.map_or(0, <[u8]>::len) + r.value.map_or(0, <[u8]>::len)) as u64;
            t.2 = t.2.max(r.offset);
            by_topic.entry(r.topic).or_default().push(r);
        }
        for ((topic, partition), (n, bytes, newest)) in took {
            let tp = (topic.to_string(), partition);
            self.metrics.polled(&tp, n, bytes, newest + 1);
        }
        // Decode every topic before writing anything, so a poll that must
        // stop (errors.tolerance = "none") writes nothing.
        let decode_started = std::time::Instant::now();
        let mut decoded = Vec::with_capacity(by_topic.len());
        let mut rejects = Vec::new();
        for (topic, records) in by_topic {
            let decoder = self
                .decoders
                .get_mut(topic)
                .ok_or_else(|| Error::Bug(format!("record from unmapped topic {topic}")))?;
            let mut d = decoder.decode(&records)?;
            rejects.append(&mut d.rejects);
            decoded.push((decoder.graph_type().table.clone(), d));
        }
        if let Some(r) = rejects.first() {
            if self.config.errors.tolerance == Tolerance::None {
                return Err(r.intolerable());
            }
            self.trip_breaker(rejects.len() as u64);
        }
        let put_started = std::time::Instant::now();
        seen.add_to(&mut self.spans);
        let ack = seen.ack();
        let mut writes: Vec<PendingWrite> = Vec::new();
        for (table, d) in decoded {
            let shards = &self.pool.tables[&table];
            if let Some(rows) = d.upserts {
                self.pending_rows += rows.num_rows() as u64;
                writes.extend(shards.put(rows).await?);
            }
            if let Some(keys) = d.deletes {
                self.pending_rows += keys.num_rows() as u64;
                writes.extend(shards.delete(keys).await?);
            }
        }
        if !rejects.is_empty() {
            let t = std::time::Instant::now();
            writes.extend(self.write_rejects(&rejects).await?);
            self.stats.reject_ns.fetch_add(nanos(t), Ordering::Relaxed);
        }
        self.summary.records += msgs.len() as u64;
        let st = &self.stats;
        st.put_ns.fetch_add(nanos(put_started), Ordering::Relaxed);
        let decode = put_started.duration_since(decode_started).as_nanos() as u64;
        st.decode_ns.fetch_add(decode, Ordering::Relaxed);
        st.poll_ns.fetch_add(nanos(started), Ordering::Relaxed);
        st.polls.fetch_add(1, Ordering::Relaxed);
        st.consumed.fetch_add(msgs.len() as u64, Ordering::Relaxed);
        let fold = &self.config.fold;
        if self.pending_rows >= fold.max_pending_rows
            || self.pending_bytes >= fold.max_pending_bytes
        {
            self.wake.notify_one();
        }
        Ok(self.durability(rejects, writes, ack))
    }

    /// Puts a poll's rejects into the rejects WAL.
    async fn write_rejects(&mut self, rejects: &[rejects::Reject]) -> Result<Vec<PendingWrite>> {
        self.pending_rows += rejects.len() as u64;
        self.stats
            .rejected
            .fetch_add(rejects.len() as u64, Ordering::Relaxed);
        for r in rejects {
            tracing::debug!(reject_id = %r.reject_id, code = r.code.as_str(), message = %r.message, "rejected");
            self.metrics.rejected(r.stage.as_str(), r.code.as_str());
        }
        self.pool.tables[REJECTS_TABLE]
            .put(rejects::to_batch(rejects))
            .await
    }

    /// A poll's durability: in the WAL, and every reject both in the
    /// rejects WAL and acknowledged by the dead-letter topic. The two are
    /// awaited together, not one after the other: a poll with rejects
    /// would otherwise wait a produce round trip plus a WAL flush, and
    /// fill the in-flight window under a reject storm. The ack needs both.
    fn durability(
        &self,
        rejects: Vec<rejects::Reject>,
        writes: Vec<PendingWrite>,
        ack: PollAck,
    ) -> AckFuture {
        let dead_letters = self.dead_letters.clone();
        let stop = self.shutdown.clone();
        async move {
            let delivered = async {
                if !rejects.is_empty() {
                    failpoints::hit(failpoints::REJECTS_BEFORE_DEAD_LETTERS)?;
                    dead_letters.deliver(&rejects, None, &stop).await?;
                    failpoints::hit(failpoints::REJECTS_AFTER_DEAD_LETTERS)?;
                }
                Ok::<_, Error>(())
            };
            let written = async {
                let mut moved = Vec::new();
                for w in writes {
                    let (table, bucket) = (w.table.clone(), w.bucket);
                    match w.wait().await {
                        Ok(()) => {}
                        Err(e) if e.kind() == ErrorKind::Fenced => moved.push((table, bucket, e)),
                        Err(e) => return Err(e),
                    }
                }
                Ok(moved)
            };
            let ((), moved) = futures::try_join!(delivered, written)?;
            Ok((ack, moved))
        }
        .boxed()
    }

    /// Counts rejects; past `errors.max_rejects_per_minute`, pauses fetching.
    fn trip_breaker(&mut self, n: u64) {
        let limit = self.config.errors.max_rejects_per_minute;
        if limit == 0 {
            return;
        }
        let now = tokio::time::Instant::now();
        let b = &mut self.breaker;
        match b.window_start {
            Some(t) if now.duration_since(t) < Duration::from_secs(60) => b.count += n,
            _ => {
                b.window_start = Some(now);
                b.count = n;
            }
        }
        if b.count > limit && b.paused_until.is_none() {
            let pause = self.config.errors.breaker_pause;
            tracing::error!(
                event = "breaker_tripped",
                rejects = b.count,
                limit,
                pause = ?pause,
                "reject-rate breaker tripped: more than errors.max_rejects_per_minute; pausing fetches"
            );
            b.paused_until = Some(now + pause);
            self.metrics.breaker(true);
            b.window_start = None;
        }
    }

    /// Writes a fencing failed: fatal (the session restarts) unless each
    /// failed shard was released here, its partitions revoked, and is not
    /// held again. Then its records are the next owner's (it re-reads them
    /// from the committed offset, and replays whatever reached the WAL),
    /// and `on_ack` drops the revoked partitions from this ack.
    fn on_moved(&mut self, moved: Vec<(String, u32, Error)>) -> Result<()> {
        for (table, bucket, e) in moved {
            let gone = self.role.is_some() && self.pool.released(&table, bucket);
            if !gone {
                return Err(e);
            }
            tracing::info!(
                table,
                bucket,
                "writes of a shard that moved to another member were not acked here"
            );
        }
        Ok(())
    }

    fn on_ack(&mut self, mut ack: PollAck) {
        // Acks resolve in poll order, so the front is this poll's.
        if let Some(taken) = self.taken.pop_front() {
            self.metrics.acked(taken.elapsed());
        }
        self.metrics.polls_in_flight(self.in_flight.len());
        // Acks of partitions revoked meanwhile belong to the next owner.
        self.stats
            .durable
            .fetch_add(ack.records as u64, Ordering::Relaxed);
        ack.high.retain(|tp, _| self.assigned.contains(tp));
        self.marks.apply(&ack);
        let mut shared = self.committable.lock().expect("committable");
        for tp in ack.high.keys() {
            if let Some(n) = self.marks.next(tp) {
                shared.insert(tp.clone(), n);
                self.metrics.durable(tp, n);
            }
        }
    }

    /// Under partition sharding, an assignment claims the shards of its
    /// partitions before the next record is read (the loop is biased to
    /// control events), and a revoke releases them.
    async fn on_group_event(&mut self, ev: GroupEvent) -> Result<()> {
        match ev {
            GroupEvent::Assigned(tps) => {
                tracing::info!(event = "assigned", count = tps.len(), partitions = %names(&tps), "assigned");
                self.metrics.assigned(&tps);
                if let Some(role) = &self.role {
                    let held = self.assigned.iter().chain(&tps).cloned().collect();
                    if let Some(e) = role.split_shard(&held) {
                        return Err(e);
                    }
                    let shards = self.pool.shards_of(&tps, &role.feeds);
                    let started = std::time::Instant::now();
                    self.pool.claim(&shards).await?;
                    self.pool.close_parked();
                    tracing::info!(shards = shards.len(), took = ?started.elapsed(), "claimed the shards of the assigned partitions");
                }
                self.assigned.extend(tps);
                self.end_targets = None;
                self.stall
                    .holds(!self.assigned.is_empty(), tokio::time::Instant::now());
            }
            GroupEvent::Revoked(tps) => {
                tracing::info!(event = "revoked", count = tps.len(), partitions = %names(&tps), "revoked");
                self.metrics.revoked(&tps);
                if let Some(role) = &self.role {
                    let shards = self.pool.shards_of(&tps, &role.feeds);
                    self.pool.release(&shards);
                }
                self.schemas.forget(&tps, &self.metrics);
                let mut shared = self.committable.lock().expect("committable");
                for tp in tps {
                    self.assigned.remove(&tp);
                    self.marks.forget(&tp);
                    shared.remove(&tp);
                }
                self.end_targets = None;
                self.stall
                    .holds(!self.assigned.is_empty(), tokio::time::Instant::now());
            }
        }
        if let Some(role) = &self.role {
            let part = fold::Part {
                folds: self.assigned.contains(&role.fold_partition),
                alone: self.assigned.len() >= role.partitions,
            };
            role.tx
                .send_if_modified(|was| std::mem::replace(was, part) != part);
        }
        Ok(())
    }

    /// Freezes every memtable between polls and hands the cut to the fold.
    async fn cut(&mut self, req: CutRequest) {
        let result = self.pool.freeze_all().await.map(|frozen| FreezeCut {
            frozen,
            spans: self.spans.take(),
            oldest_taken: self.oldest_taken.take(),
        });
        self.pending_rows = 0;
        self.pending_bytes = 0;
        let _ = req.send(result);
    }

    fn commit(&mut self, kafka: &GroupConsumer, mode: CommitMode) -> Result<()> {
        let todo: Vec<_> = self
            .marks
            .uncommitted()
            .into_iter()
            .filter(|(tp, _)| self.assigned.contains(tp))
            .collect();
        if todo.is_empty() {
            return Ok(());
        }
        failpoints::hit(failpoints::COMMIT_BEFORE)?;
        match consumer::commit(kafka, &todo, mode) {
            Ok(()) => {
                self.marks.mark_committed(&todo);
                for (tp, n) in &todo {
                    self.metrics.committed(tp, *n);
                }
                self.stats.commits.fetch_add(1, Ordering::Relaxed);
                failpoints::hit(failpoints::COMMIT_AFTER)
            }
            Err(e) if matches!(mode, CommitMode::Async) => {
                tracing::warn!(error = %e, "async commit failed; retrying next tick");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    async fn at_end(&mut self) -> Result<bool> {
        if self.assigned.is_empty() && self.in_flight.is_empty() {
            return self.at_end_unassigned().await;
        }
        // Quiet too, if asked: some brokers (tansu 0.6) report a high
        // watermark below the true end when producers batch.
        if self.assigned.is_empty()
            || !self.in_flight.is_empty()
            || self.last_poll.elapsed() < self.config.offsets.exit_at_end_quiet
        {
            return Ok(false);
        }
        if self.end_targets.is_none() {
            let parts: Vec<TopicPartition> = self.assigned.iter().cloned().collect();
            let ends = self.queries.watermarks(parts.clone()).await?;
            let committed = self.queries.committed(parts).await?;
            // Partitions already committed to their end need nothing from us.
            let targets = ends
                .into_iter()
                .filter(|(tp, w)| committed.get(tp).copied().unwrap_or(0) < w.high)
                .map(|(tp, w)| (tp, w.high))
                .collect();
            self.end_targets = Some(targets);
        }
        let targets = self.end_targets.as_ref().expect("set above");
        let short: Vec<TopicPartition> = targets
            .iter()
            .filter(|(tp, end)| self.marks.next(tp).is_none_or(|n| n < **end))
            .map(|(tp, _)| tp.clone())
            .collect();
        if short.is_empty() {
            return Ok(true);
        }
        // A partition this run has nothing newer of may be committed to its
        // end already, by a run whose commit landed after the targets were
        // taken: its records are durable (commits follow durability), and
        // none will come to this run. Without this look, `--exit-at-end`
        // waited for them forever (seen on local and S3 roots after a
        // crash, docs/retention.md).
        let committed = self.queries.committed(short.clone()).await?;
        Ok(short
            .iter()
            .all(|tp| committed.get(tp).is_some_and(|&c| c >= targets[tp])))
    }

    /// A member holding nothing is at the end once it has held nothing for
    /// the stall bound and the group has committed every mapped partition
    /// to its end: nothing is left that it could be given. Under partition
    /// sharding it also needs the graph to hold everything durable: it
    /// claims no shard and does not fold, so a WAL left by a crashed member
    /// (or a live member's, not yet folded) would be left behind; until
    /// then it waits for the folding member, or for a rebalance that makes
    /// it the folder, and says so every 30 s. tansu 0.6 could leave a lone
    /// member in a stable group with no assignment; with no lag the stall
    /// watch rightly does nothing, and `--exit-at-end` used to wait forever
    /// and silently (docs/retention.md, docs/kafka.md). Looks once a second
    /// at most.
    async fn at_end_unassigned(&mut self) -> Result<bool> {
        let now = tokio::time::Instant::now();
        let waited = self.stall.unassigned_for(now).unwrap_or_default();
        let probed = self
            .unassigned_probe
            .is_some_and(|t| now - t < Duration::from_secs(1));
        if waited < self.stall.bound() || probed {
            return Ok(false);
        }
        self.unassigned_probe = Some(now);
        let topics = consumer::mapped_topics(self.config)
            .into_iter()
            .map(String::from)
            .collect();
        let lag = match self.queries.progress(topics).await {
            Ok(seen) => seen.lag,
            Err(e) => {
                self.say_waiting(format!("cannot read the group's progress: {e}"));
                return Ok(false);
            }
        };
        if lag > 0 {
            self.say_waiting(format!(
                "the group's lag on the mapped topics is {lag}; waiting for an assignment or for the members holding them"
            ));
            return Ok(false);
        }
        if self.config.wal.sharding == Sharding::Partition {
            match shards::unfolded(self.pool.graph()).await {
                Ok(u) if u.is_empty() => {}
                Ok(u) => {
                    self.say_waiting(format!(
                        "the group has committed every mapped partition to its end, but the graph has not folded {} flushed generations and the WAL of {} shards; waiting for the member holding the fold partition, or for a rebalance that gives it to this one",
                        u.generations, u.wal_shards
                    ));
                    return Ok(false);
                }
                Err(e) => {
                    self.say_waiting(format!("cannot read what the graph has not folded: {e}"));
                    return Ok(false);
                }
            }
        }
        tracing::info!(held_nothing_for = ?waited, "holding no partition, and the group has committed every mapped partition to its end");
        Ok(true)
    }

    /// `--exit-at-end` while holding nothing: why it does not end yet, once
    /// and then every 30 s, so it never waits without saying so.
    fn say_waiting(&mut self, why: String) {
        let now = tokio::time::Instant::now();
        if self
            .waiting_said
            .is_some_and(|t| now - t < Duration::from_secs(30))
        {
            return;
        }
        self.waiting_said = Some(now);
        tracing::info!(
            event = "exit_at_end_waiting",
            "exit-at-end: holding no partition; {why}"
        );
    }

    /// While holding no partition: once a bound has passed, looks at the
    /// group's progress on the mapped topics; rejoins on a first stall and
    /// fails the run on a second (kafka/stall.rs).
    async fn watch_stall(&mut self, kafka: &GroupConsumer) -> Result<()> {
        let now = tokio::time::Instant::now();
        if !self.stall.due(now) {
            return Ok(());
        }
        let topics = consumer::mapped_topics(self.config)
            .into_iter()
            .map(String::from)
            .collect();
        let seen = match self.queries.progress(topics).await {
            Ok(seen) => seen,
            Err(e) => {
                // A broker that cannot answer is not a stuck group; librdkafka
                // reports the outage itself.
                tracing::debug!(error = %e, "stall watch: cannot read the group's progress");
                return Ok(());
            }
        };
        match self.stall.judge(now, seen) {
            Verdict::Fine => Ok(()),
            Verdict::Rejoin { lag, stalled } => {
                tracing::warn!(
                    lag,
                    stalled = ?stalled,
                    bound = ?self.stall.bound(),
                    group = self.queries.group(),
                    "holding no partition while the mapped topics have lag and no member advances \
                     their committed offsets; rejoining the group (re-subscribe)"
                );
                consumer::resubscribe(kafka, self.config)
            }
            Verdict::GiveUp { lag, .. } => Err(Error::Unassigned {
                group: self.queries.group().to_string(),
                lag,
                waited: self.stall.bound() * 4,
            }),
        }
    }

    /// Awaits in-flight durability, commits synchronously, lets the fold
    /// loop finish (with its final fold), closes writers.
    async fn drain(mut self, kafka: GroupConsumer, mut fold: FoldTask) -> Result<RunSummary> {
        // Commit what became durable even when a later poll failed (e.g.
        // the dead-letter topic stayed down through the shutdown).
        let failed = self.await_in_flight().await;
        let committed = failpoints::hit(failpoints::DRAIN_BEFORE_COMMIT)
            .and_then(|()| self.commit(&kafka, CommitMode::Sync))
            .and_then(|()| failpoints::hit(failpoints::DRAIN_BEFORE_FOLD));
        if let Some(e) = committed.err().or(failed) {
            return Err(stop_after_failure(kafka, fold, e).await);
        }
        fold.stop.cancel();
        if let Err(e) = self.serve_final_fold(&mut fold).await {
            return Err(stop_after_failure(kafka, fold, e).await);
        }
        self.summary.committed = self.marks.all().into_iter().collect();
        if let Err(e) = failpoints::hit(failpoints::DRAIN_BEFORE_CLOSE) {
            return Err(stop_after_failure(kafka, fold, e).await);
        }
        // Leave the group before closing writers so partitions move on promptly.
        consumer::close(kafka).await;
        self.pool.close().await?;
        Ok(self.summary)
    }

    /// Applies every in-flight ack in order, up to the first failure;
    /// returns that failure.
    async fn await_in_flight(&mut self) -> Option<Error> {
        let mut failed = None;
        while let Some(ack) = self.in_flight.next().await {
            match ack {
                Ok((ack, moved)) if failed.is_none() => match self.on_moved(moved) {
                    Ok(()) => self.on_ack(ack),
                    Err(e) => failed = Some(e),
                },
                Ok(_) => {}
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        failed
    }

    /// Serves the fold loop's cuts until it ends (after its final fold).
    async fn serve_final_fold(&mut self, fold: &mut FoldTask) -> Result<()> {
        if fold.joined {
            return Ok(());
        }
        loop {
            tokio::select! {
                Some(req) = fold.cuts.recv() => self.cut(req).await,
                joined = &mut fold.handle => {
                    fold.joined = true;
                    joined.map_err(|e| Error::joined("fold loop", e))??;
                    return Ok(());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_split_over_members_is_a_config_error_naming_both_topics() {
        let feeds = BTreeMap::from([
            ("a".to_string(), vec!["nodes/P".to_string()]),
            ("b".to_string(), vec!["nodes/P".to_string()]),
            ("c".to_string(), vec!["nodes/Q".to_string()]),
        ]);
        let role = FoldRole {
            feeds,
            fold_partition: ("a".into(), 0),
            partitions: 6,
            tx: watch::channel(fold::Part::default()).0,
        };
        let held = |tps: &[(&str, i32)]| -> BTreeSet<TopicPartition> {
            tps.iter().map(|(t, p)| (t.to_string(), *p)).collect()
        };
        // What `range` gives: p of a and b together; c alone is its own.
        assert!(role
            .split_shard(&held(&[("a", 1), ("b", 1), ("c", 0)]))
            .is_none());
        assert!(role.split_shard(&held(&[])).is_none());
        let e = role
            .split_shard(&held(&[("a", 0), ("a", 1), ("b", 1)]))
            .expect("a0 without b0");
        assert_eq!(e.kind(), ErrorKind::BadConfig);
        let msg = e.to_string();
        assert!(
            msg.contains("partition 0 of a")
                && msg.contains("partition 0 of b")
                && msg.contains("nodes/P"),
            "{msg}"
        );
        assert!(role.split_shard(&held(&[("b", 2)])).is_some());
    }

    fn fold_task(
        handle: tokio::task::JoinHandle<Result<()>>,
        stop: &CancellationToken,
        stop_delivery: &CancellationToken,
        cuts: mpsc::Receiver<CutRequest>,
    ) -> FoldTask {
        FoldTask {
            handle,
            joined: false,
            stop: stop.clone(),
            stop_delivery: stop_delivery.clone(),
            cuts,
        }
    }

    /// A failed run gives up the fold's deliveries, answers no final cut,
    /// and returns only once the fold task has ended: nothing the task
    /// holds outlives the run.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_run_waits_for_its_fold_task() {
        let (stop, stop_delivery) = (CancellationToken::new(), CancellationToken::new());
        let (cut_tx, cuts) = mpsc::channel::<CutRequest>(1);
        let (alive, gone) = watch::channel(());
        let (s, d) = (stop.clone(), stop_delivery.clone());
        let handle = tokio::spawn(async move {
            let _alive = alive;
            // Like a dead-letter retry: ends only when delivery is given up.
            d.cancelled().await;
            s.cancelled().await;
            // Like the final fold: asks for a cut, which must go unanswered.
            let (tx, rx) = tokio::sync::oneshot::channel();
            if cut_tx.send(tx).await.is_ok() {
                let _ = rx.await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok(())
        });
        let started = std::time::Instant::now();
        fold_task(handle, &stop, &stop_delivery, cuts)
            .abandon(Duration::from_secs(20))
            .await;
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no wait for the bound"
        );
        assert!(gone.has_changed().is_err(), "the fold task ended first");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fold_task_that_does_not_stop_is_aborted_past_the_bound() {
        let (stop, stop_delivery) = (CancellationToken::new(), CancellationToken::new());
        let (_cut_tx, cuts) = mpsc::channel::<CutRequest>(1);
        let (alive, mut gone) = watch::channel(());
        let handle = tokio::spawn(async move {
            let _alive = alive;
            std::future::pending::<()>().await;
            Ok(())
        });
        fold_task(handle, &stop, &stop_delivery, cuts)
            .abandon(Duration::from_millis(100))
            .await;
        let dropped = tokio::time::timeout(Duration::from_secs(5), gone.changed()).await;
        assert!(matches!(dropped, Ok(Err(_))), "the task was aborted");
    }
}
