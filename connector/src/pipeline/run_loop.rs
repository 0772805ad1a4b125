//! The run loop of a session: one task that takes polls, hands their rows
//! to the shard writers without waiting, resolves their durability in poll
//! order, commits, and serves the fold task's freeze cuts between polls,
//! so a cut never splits a poll. Its parts are in the files beside this.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use rdkafka::consumer::CommitMode;
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

use super::acks::{AckQueue, Durable};
use super::breaker::Breaker;
use super::cut::SinceCut;
use super::end::{EndWatch, Look};
use super::open::{Decoding, Writers};
use super::role::FoldRole;
use super::schemas::SchemaHolds;
use super::RunOptions;
use crate::config::Config;
use crate::decode::RecordDecoder;
use crate::error::Result;
use crate::failpoints;
use crate::fold::{CutRequest, FoldTask, FromFold};
use crate::kafka::consumer::{self, GroupConsumer, GroupEvent};
use crate::kafka::denied::{self, Refused};
use crate::kafka::stall::{self, StallWatch};
use crate::kafka::{DeadLetters, OffsetQueries};
use crate::metrics::Metrics;
use crate::offsets::{OffsetBook, TopicPartition};
use crate::shards::ShardPool;

/// The run loop's state, one part per concern. Each part is a type of the
/// file that owns it, changed through its methods (`SinceCut` in `cut.rs`,
/// `EndWatch` in `end.rs`, the ack queue in `acks.rs`, the offsets in
/// `crate::offsets`), or a field written by one file only: `assigned` by
/// `group.rs`, `taken` by `poll.rs`, the stall watches by `stall.rs`.
pub(super) struct RunLoop<'a> {
    /// What the session was started with; never changed.
    pub(super) config: &'a Config,
    pub(super) exit_at_end: bool,
    pub(super) metrics: Arc<Metrics>,
    pub(super) shutdown: CancellationToken,
    /// Folds early once `since_cut` is full.
    pub(super) wake: Arc<Notify>,
    pub(super) queries: OffsetQueries,
    /// Taking and decoding (`poll.rs`): a decoder per topic, the
    /// partitions held for a schema, the reject-rate breaker, and the
    /// records taken so far.
    pub(super) decoders: HashMap<String, RecordDecoder>,
    pub(super) schemas: SchemaHolds,
    pub(super) breaker: Breaker,
    pub(super) taken: u64,
    /// Writing: the shard writers and the dead-letter producer.
    pub(super) pool: ShardPool,
    pub(super) dead_letters: DeadLetters,
    /// Polls in flight, and the offsets they make durable.
    pub(super) acks: AckQueue,
    pub(super) offsets: OffsetBook,
    /// The group (`group.rs`): what this member holds, and under
    /// partition sharding which tables each topic feeds and who folds.
    pub(super) assigned: BTreeSet<TopicPartition>,
    pub(super) role: Option<FoldRole>,
    /// What the next freeze cut hands the fold task.
    pub(super) since_cut: SinceCut,
    /// The loop's watches: the end (`--exit-at-end`), and the stall
    /// watches (`stall.rs`) while holding nothing or while the end waits
    /// for partitions held elsewhere.
    pub(super) end: EndWatch,
    pub(super) stall: StallWatch,
    pub(super) end_stall: Option<StallWatch>,
}

impl<'a> RunLoop<'a> {
    /// The run loop over `writers`; the consumer is not subscribed yet
    /// (`offsets` is what its callbacks will ask and tell).
    pub(super) fn new(
        config: &'a Config,
        options: &RunOptions,
        metrics: &Arc<Metrics>,
        shutdown: &CancellationToken,
        decoding: Decoding,
        writers: Writers,
        dead_letters: DeadLetters,
    ) -> Result<RunLoop<'a>> {
        let stall_bound = config.offsets.stall_timeout.unwrap_or_else(|| {
            stall::bound_for(config.kafka.get("session.timeout.ms").map(String::as_str))
        });
        Ok(RunLoop {
            config,
            exit_at_end: options.exit_at_end,
            metrics: metrics.clone(),
            shutdown: shutdown.clone(),
            wake: options.fold_now.clone().unwrap_or_default(),
            // End offsets (exit_at_end) and the group's progress (the stall watch).
            queries: OffsetQueries::connect(config)?,
            decoders: decoding.decoders,
            schemas: SchemaHolds::new(decoding.registry, config),
            breaker: Breaker::default(),
            taken: 0,
            pool: writers.pool,
            dead_letters,
            acks: AckQueue::new(),
            offsets: OffsetBook::default(),
            assigned: BTreeSet::new(),
            role: writers.role,
            since_cut: SinceCut::default(),
            end: EndWatch::default(),
            stall: StallWatch::new(stall_bound, tokio::time::Instant::now()),
            end_stall: None,
        })
    }

    /// Serves until shutdown, the end (`--exit-at-end`) or a failure.
    /// Priority: shutdown, then control (fold task, rebalance, schemas,
    /// acks), then data, then timers.
    pub(super) async fn serve(
        &mut self,
        kafka: &GroupConsumer,
        events: &mut mpsc::UnboundedReceiver<GroupEvent>,
        fold: &mut FoldTask,
    ) -> Result<()> {
        let mut commit_tick = tokio::time::interval(self.config.offsets.commit_interval);
        commit_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut end_check = tokio::time::interval(Duration::from_millis(200));
        let mut stall_check = tokio::time::interval(Duration::from_secs(1));
        stall_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let max_in_flight = self.config.wal.max_in_flight_polls;
        let mut full_since: Option<Instant> = None;
        let mut stream = kafka.stream();
        let shutdown = self.shutdown.clone();
        loop {
            self.metrics.run_loop_tick();
            let fetching = self.acks.len() < max_in_flight && self.breaker.paused_until().is_none();
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Ok(()),
                asked = fold.next() => match asked {
                    FromFold::Cut(req) => {
                        let t = Instant::now();
                        self.cut(req).await;
                        self.metrics.cut_served(t.elapsed());
                    }
                    FromFold::Ended(result) => return result,
                },
                Some(ev) = events.recv() => self.on_group_event(ev).await?,
                Some(ev) = self.schemas.events.recv() => {
                    self.schemas.on_event(kafka, &mut self.decoders, &self.metrics, ev)?;
                }
                Some(durable) = self.acks.next(), if !self.acks.is_empty() => {
                    if let Some(t) = full_since.take() {
                        self.metrics.window_was_full(t.elapsed());
                    }
                    self.on_durable(durable?)?;
                }
                _ = sleep_until(self.breaker.paused_until()), if self.breaker.paused_until().is_some() => {
                    tracing::warn!(event = "breaker_closed", "reject-rate breaker: resuming fetches");
                    self.breaker.resume();
                    self.metrics.breaker(false);
                }
                Some(msg) = stream.next(), if fetching => match msg {
                    Ok(first) => {
                        let taken = Instant::now();
                        self.end.polled();
                        let durability = self.process_poll(kafka, &mut stream, first, taken).await?;
                        self.acks.push(taken, durability);
                        self.metrics.polls_in_flight(self.acks.len());
                        if self.acks.len() >= max_in_flight {
                            full_since = Some(Instant::now());
                        }
                    }
                    Err(e) => {
                        // A refusal is no passing trouble: librdkafka would
                        // retry it for ever (issue 55).
                        if let Some(r) = Refused::of(&e) {
                            return Err(self.refused(r).await);
                        }
                        tracing::warn!(error = %e, "consumer error; librdkafka retries");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                _ = commit_tick.tick() => {
                    self.commit(kafka, CommitMode::Async).await?;
                    // The dead-letter producers' refusals that no delivery
                    // has met yet (their clients' own requests).
                    if let Some(e) = self.dead_letters.refused() {
                        return Err(e);
                    }
                    sample_writers(&self.pool, &self.metrics).await;
                }
                _ = stall_check.tick(), if self.assigned.is_empty() || self.end.waits_elsewhere().is_some() => {
                    self.watch_stall(kafka).await?
                }
                _ = end_check.tick(), if self.exit_at_end => {
                    if self.at_end().await? {
                        tracing::info!(
                            event = "exit_at_end",
                            "every mapped partition is durable here or committed by the group up to its end offset, and the graph holds what is durable"
                        );
                        return Ok(());
                    }
                }
            }
        }
    }

    /// A poll became durable (and every poll before it): its partitions'
    /// watermarks advance and become committable.
    pub(super) fn on_durable(&mut self, durable: Durable) -> Result<()> {
        self.on_moved(durable.moved)?;
        self.metrics
            .acked(durable.taken.elapsed(), durable.ack.records);
        self.metrics.polls_in_flight(self.acks.len());
        for (tp, next) in self.offsets.durable(durable.ack, &self.assigned) {
            self.metrics.durable(&tp, next);
        }
        Ok(())
    }

    /// Commits every durable watermark of the assigned partitions that
    /// moved past what the broker confirmed. A sync commit is confirmed
    /// here; an async one by the consumer's commit callback. A refused
    /// commit stops the session (`kafka::denied`).
    pub(super) async fn commit(&mut self, kafka: &GroupConsumer, mode: CommitMode) -> Result<()> {
        let todo = self.offsets.to_commit(&self.assigned);
        if todo.is_empty() {
            return Ok(());
        }
        failpoints::hit(failpoints::COMMIT_BEFORE)?;
        match consumer::commit(kafka, &todo, mode) {
            Ok(()) => {
                if matches!(mode, CommitMode::Sync) {
                    self.offsets.committed(&todo);
                    self.metrics.committed(&todo);
                }
                failpoints::hit(failpoints::COMMIT_AFTER)
            }
            Err(e) => match denied::refusal_in(&e) {
                Some(r) => Err(self.refused(r).await),
                None if matches!(mode, CommitMode::Async) => {
                    tracing::warn!(error = %e, "async commit failed; retrying next tick");
                    Ok(())
                }
                None => Err(e),
            },
        }
    }

    /// Freezes every memtable between polls and hands the cut to the fold.
    /// A freeze that fails keeps what was written since the last cut (the
    /// fold task fails with it).
    pub(super) async fn cut(&mut self, req: CutRequest) {
        let result = match self.pool.freeze_all().await {
            Ok(frozen) => Ok(self.since_cut.cut(frozen)),
            Err(e) => Err(e.into()),
        };
        let _ = req.send(result);
    }

    /// `--exit-at-end`: one look of the end watch (`end.rs`).
    async fn at_end(&mut self) -> Result<bool> {
        let now = tokio::time::Instant::now();
        let look = Look {
            config: self.config,
            assigned: &self.assigned,
            offsets: &self.offsets,
            queries: &self.queries,
            held_nothing_for: self.stall.unassigned_for(now),
            stall_bound: self.stall.bound(),
            folds: self.role.as_ref().is_none_or(|r| r.folds(&self.assigned)),
            graph: self.pool.graph(),
        };
        self.end.at_end(look).await
    }
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
