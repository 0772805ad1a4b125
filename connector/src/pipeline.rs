//! The run loop: consume a poll → decode per mapping → put into shards
//! without waiting → queue the poll's durability in poll order → advance
//! watermarks → commit. It also serves the fold loop's freeze cuts, between
//! polls, so a cut never splits a poll.

use std::collections::{BTreeMap, BTreeSet, HashMap};
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

use crate::config::{Config, Tolerance};
use crate::consumer::{self, Committable, GroupConsumer, GroupEvent};
use crate::decode::{RecordDecoder, SourceRecord};
use crate::error::{Error, Result};
use crate::fold::{self, CutRequest, FoldLoop, FreezeCut, Policies};
use crate::graph::{Graph, GraphCommit};
use crate::offsets::{DurableWatermarks, PollAck, PollSpans, TopicPartition, WrittenSpans};
use crate::rejects::{self, DeadLetters};
use crate::schema::{GraphSchema, REJECTS_TABLE};
use crate::shards::{PendingWrite, ShardPool};

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
    /// Polls taken, and the run loop's time in them (ns): in all, in
    /// decoding + validating, and in handing rows to the shard writers
    /// (memtable inserts). The loop is one task, so busy ÷ wall time says
    /// how close ingest is to its single-task ceiling.
    pub polls: AtomicU64,
    pub poll_ns: AtomicU64,
    pub decode_ns: AtomicU64,
    pub put_ns: AtomicU64,
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

/// Closes the consumer (leaving the group) off the runtime, bounded: a
/// rebalance that lands during librdkafka's close can block the closing
/// thread for good (its rebalance callback asks the main thread for the
/// rebalance protocol, which is itself closing). Offsets are already
/// committed by then, so past the bound the consumer is left behind and
/// the group drops it after `session.timeout.ms`.
async fn close_consumer(kafka: GroupConsumer) {
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
    let schema = GraphSchema::load(&config.schema_path())?;
    let graph = Graph::open_or_init(&config, schema).await?;
    let policies = Policies::from_config(&config);
    fold::recover(&graph, &policies).await?;

    let mut decoders = HashMap::new();
    for m in &config.mappings {
        decoders.insert(
            m.topic.clone(),
            RecordDecoder::new(
                &graph.schema,
                m,
                config.wal.max_poll_records,
                config.errors.max_record_bytes,
            )?,
        );
    }
    let dead_letters = DeadLetters::connect(&config).await?;
    // Fold rejects a crash kept from the dead-letter topic go out first.
    let (delivered, late) = fold::undelivered(&graph).await?;
    if !late.is_empty() {
        tracing::warn!(
            rejects = late.len(),
            "re-delivering fold rejects of published commits"
        );
        dead_letters.deliver(&late, &shutdown).await?;
        graph.set_dead_letters_delivered(delivered).await?;
    }
    let pool = ShardPool::open(&graph, &config.wal, &graph.wal_tables()).await?;

    let committable: Committable = Default::default();
    let (kafka, events) = consumer::subscribe(&config, committable.clone())?;

    let (cut_tx, cut_rx) = mpsc::channel(1);
    let wake = options.fold_now.clone().unwrap_or_default();
    let fold_stop = CancellationToken::new();
    let published = options
        .published
        .clone()
        .unwrap_or_else(|| watch::channel(None).0);
    let fold_task = tokio::spawn(
        FoldLoop {
            graph: graph.clone(),
            policies,
            interval: config.fold.interval,
            actor: config.graph.actor.clone(),
            cuts: cut_tx,
            wake: wake.clone(),
            stop: fold_stop.clone(),
            final_fold: config.fold.on_shutdown,
            published,
            dead_letters: dead_letters.clone(),
            delivered,
            stop_delivery: shutdown.clone(),
        }
        .run(),
    );

    let mut run = RunLoop {
        config: &config,
        options: &options,
        events,
        decoders,
        pool,
        committable,
        marks: DurableWatermarks::default(),
        spans: WrittenSpans::default(),
        in_flight: FuturesOrdered::new(),
        assigned: BTreeSet::new(),
        end_targets: None,
        pending_rows: 0,
        pending_bytes: 0,
        wake,
        stats: options.stats.clone().unwrap_or_default(),
        summary: RunSummary::default(),
        dead_letters,
        shutdown: shutdown.clone(),
        breaker: Breaker::default(),
        last_poll: tokio::time::Instant::now(),
    };
    let mut cut_rx = cut_rx;
    let mut fold_task = fold_task;
    let result = run
        .serve(&kafka, &shutdown, &mut cut_rx, &mut fold_task, &fold_stop)
        .await;
    let summary = match result {
        Ok(()) => run.drain(kafka, cut_rx, fold_task, fold_stop).await?,
        Err(e) => {
            // Nothing more is acked after a failure: no drain, no commit.
            fold_stop.cancel();
            tracing::error!(error = %e, "stopping without committing further");
            return Err(e);
        }
    };
    Ok(summary)
}

type AckFuture = BoxFuture<'static, Result<PollAck>>;

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
    /// End offsets to reach, for `exit_at_end`.
    end_targets: Option<BTreeMap<TopicPartition, i64>>,
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
}

/// The reject-rate breaker: rejects counted per minute; past the limit,
/// fetching pauses for `errors.breaker_pause`.
#[derive(Default)]
struct Breaker {
    window_start: Option<tokio::time::Instant>,
    count: u64,
    paused_until: Option<tokio::time::Instant>,
}

impl RunLoop<'_> {
    async fn serve(
        &mut self,
        kafka: &GroupConsumer,
        shutdown: &CancellationToken,
        cuts: &mut mpsc::Receiver<CutRequest>,
        fold_task: &mut tokio::task::JoinHandle<Result<()>>,
        fold_stop: &CancellationToken,
    ) -> Result<()> {
        let mut commit_tick = tokio::time::interval(self.config.offsets.commit_interval);
        commit_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut end_check = tokio::time::interval(Duration::from_millis(200));
        let max_in_flight = self.config.wal.max_in_flight_polls;
        loop {
            // Priority: shutdown, then control (fold loop, rebalance, acks),
            // then data, then timers.
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Ok(()),
                joined = &mut *fold_task => {
                    return match joined {
                        Ok(Ok(())) if fold_stop.is_cancelled() => Ok(()),
                        Ok(Ok(())) => Err(Error::Other("fold loop ended unexpectedly".into())),
                        Ok(Err(e)) => Err(e),
                        Err(e) => Err(Error::joined("fold loop", e)),
                    };
                }
                Some(req) = cuts.recv() => self.cut(req).await,
                Some(ev) = self.events.recv() => self.on_group_event(ev),
                Some(ack) = self.in_flight.next(), if !self.in_flight.is_empty() => {
                    self.on_ack(ack?);
                }
                _ = sleep_until(self.breaker.paused_until), if self.breaker.paused_until.is_some() => {
                    tracing::warn!("reject-rate breaker: resuming fetches");
                    self.breaker.paused_until = None;
                }
                msg = kafka.recv(), if self.in_flight.len() < max_in_flight && self.breaker.paused_until.is_none() => {
                    match msg {
                        Ok(first) => {
                            self.last_poll = tokio::time::Instant::now();
                            let ack = self.process_poll(kafka, first).await?;
                            self.in_flight.push_back(ack);
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "consumer error; librdkafka retries");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                }
                _ = commit_tick.tick() => self.commit(kafka, CommitMode::Async)?,
                _ = end_check.tick(), if self.options.exit_at_end => {
                    if self.at_end(kafka)? {
                        tracing::info!("all assigned partitions are durable up to their end offsets");
                        return Ok(());
                    }
                }
            }
        }
    }

    /// Takes whatever the consumer already holds, up to the poll limit, as
    /// one poll, and starts its WAL writes. Returns the poll's durability.
    async fn process_poll(
        &mut self,
        kafka: &GroupConsumer,
        first: BorrowedMessage<'_>,
    ) -> Result<AckFuture> {
        let started = std::time::Instant::now();
        let limit = self.config.wal.max_poll_records;
        let mut msgs = vec![first];
        while msgs.len() < limit {
            match kafka.recv().now_or_never() {
                Some(Ok(m)) => msgs.push(m),
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "consumer error inside a poll");
                    break;
                }
                None => break,
            }
        }
        let mut by_topic: BTreeMap<&str, Vec<SourceRecord>> = BTreeMap::new();
        let mut seen = PollSpans::default();
        for m in &msgs {
            let r = SourceRecord {
                topic: m.topic(),
                partition: m.partition(),
                offset: m.offset(),
                timestamp: m.timestamp().to_millis(),
                key: m.key(),
                value: m.payload(),
                headers: m.headers(),
            };
            seen.record(r.topic, r.partition, r.offset);
            self.pending_bytes += r.value.map_or(0, |v| v.len() as u64);
            by_topic.entry(r.topic).or_default().push(r);
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
                .ok_or_else(|| Error::Other(format!("record from unmapped topic {topic}")))?;
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
            self.pending_rows += rejects.len() as u64;
            self.stats
                .rejected
                .fetch_add(rejects.len() as u64, Ordering::Relaxed);
            for r in &rejects {
                tracing::debug!(reject_id = %r.reject_id, code = r.code.as_str(), message = %r.message, "rejected");
            }
            writes.extend(
                self.pool.tables[REJECTS_TABLE]
                    .put(rejects::to_batch(&rejects))
                    .await?,
            );
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
        // Durable means: in the WAL, and every reject both in the rejects
        // WAL and acknowledged by the dead-letter topic.
        let dead_letters = self.dead_letters.clone();
        let stop = self.shutdown.clone();
        Ok(async move {
            if !rejects.is_empty() {
                dead_letters.deliver(&rejects, &stop).await?;
            }
            for w in writes {
                w.wait().await?;
            }
            Ok(ack)
        }
        .boxed())
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
                rejects = b.count,
                limit,
                pause = ?pause,
                "reject-rate breaker tripped: more than errors.max_rejects_per_minute; pausing fetches"
            );
            b.paused_until = Some(now + pause);
            b.window_start = None;
        }
    }

    fn on_ack(&mut self, mut ack: PollAck) {
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
            }
        }
    }

    fn on_group_event(&mut self, ev: GroupEvent) {
        match ev {
            GroupEvent::Assigned(tps) => {
                tracing::info!(partitions = tps.len(), "assigned");
                self.assigned.extend(tps);
                self.end_targets = None;
            }
            GroupEvent::Revoked(tps) => {
                tracing::info!(partitions = tps.len(), "revoked");
                let mut shared = self.committable.lock().expect("committable");
                for tp in tps {
                    self.assigned.remove(&tp);
                    self.marks.forget(&tp);
                    shared.remove(&tp);
                }
                self.end_targets = None;
            }
        }
    }

    /// Freezes every memtable between polls and hands the cut to the fold.
    async fn cut(&mut self, req: CutRequest) {
        let result = self.pool.freeze_all().await.map(|frozen| FreezeCut {
            frozen,
            spans: self.spans.take(),
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
        match consumer::commit(kafka, &todo, mode) {
            Ok(()) => {
                self.marks.mark_committed(&todo);
                self.stats.commits.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) if matches!(mode, CommitMode::Async) => {
                tracing::warn!(error = %e, "async commit failed; retrying next tick");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    fn at_end(&mut self, kafka: &GroupConsumer) -> Result<bool> {
        // Quiet for a second too: some brokers (tansu 0.6) report a high
        // watermark below the true end when producers batch.
        if self.assigned.is_empty()
            || !self.in_flight.is_empty()
            || self.last_poll.elapsed() < Duration::from_secs(1)
        {
            return Ok(false);
        }
        let parts: Vec<TopicPartition> = self.assigned.iter().cloned().collect();
        if self.end_targets.is_none() {
            let ends = consumer::end_offsets(kafka, &parts)?;
            let committed = consumer::committed(kafka, &parts)?;
            // Partitions already committed to their end need nothing from us.
            let targets = ends
                .into_iter()
                .filter(|(tp, end)| committed.get(tp).copied().unwrap_or(0) < *end)
                .collect();
            self.end_targets = Some(targets);
        }
        let targets = self.end_targets.as_ref().expect("set above");
        Ok(targets
            .iter()
            .all(|(tp, end)| self.marks.next(tp).is_some_and(|n| n >= *end)))
    }

    /// Awaits in-flight durability, commits synchronously, lets the fold
    /// loop finish (with its final fold), closes writers.
    async fn drain(
        mut self,
        kafka: GroupConsumer,
        mut cuts: mpsc::Receiver<CutRequest>,
        mut fold_task: tokio::task::JoinHandle<Result<()>>,
        fold_stop: CancellationToken,
    ) -> Result<RunSummary> {
        // Commit what became durable even when a later poll failed (e.g.
        // the dead-letter topic stayed down through the shutdown).
        let mut failed = None;
        while let Some(ack) = self.in_flight.next().await {
            match ack {
                Ok(ack) if failed.is_none() => self.on_ack(ack),
                Ok(_) => {}
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        self.commit(&kafka, CommitMode::Sync)?;
        if let Some(e) = failed {
            fold_stop.cancel();
            return Err(e);
        }
        fold_stop.cancel();
        loop {
            tokio::select! {
                Some(req) = cuts.recv() => self.cut(req).await,
                joined = &mut fold_task => {
                    joined.map_err(|e| Error::joined("fold loop", e))??;
                    break;
                }
            }
        }
        self.summary.committed = self.marks.all().into_iter().collect();
        // Leave the group before closing writers so partitions move on promptly.
        close_consumer(kafka).await;
        self.pool.close().await?;
        Ok(self.summary)
    }
}
