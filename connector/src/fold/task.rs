//! The fold task: the background fold loop of a running connector. Serial,
//! one fold at a time; it asks the run loop for a freeze cut, waits for the
//! flushes, folds and publishes, then hands the fold's rejects to the
//! dead-letter topic.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch, Notify};
use tokio_util::sync::CancellationToken;

use super::{execute, plan, Folded, Policies, Report};
use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::failpoints;
use crate::graph::{Graph, GraphCommit};
use crate::kafka::DeadLetters;
use crate::metrics::Metrics;
use crate::offsets::WrittenSpans;
use crate::retention;
use crate::shards;

/// What the run loop hands the fold loop at a cut: the frozen memtables and
/// the offsets written since the previous cut.
pub(crate) struct FreezeCut {
    pub frozen: Vec<shards::FrozenShard>,
    pub spans: WrittenSpans,
    /// When the oldest record of the cut was taken from Kafka.
    pub oldest_taken: Option<std::time::Instant>,
}

pub(crate) type CutRequest = tokio::sync::oneshot::Sender<Result<FreezeCut>>;

/// A member's duty in folding under partition sharding.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Duty {
    /// It holds the fold partition: it folds every shard.
    pub folds: bool,
    /// It holds every mapped partition: no other member has unflushed rows.
    pub alone: bool,
}

/// The background fold loop of a running connector: serial, one fold at a
/// time, triggered by its interval, by `wake` (pending rows/bytes, or an
/// operator's request), and stopped by `stop`. Built by `new`, given what
/// the session knows with the `with_*` calls, and started by `spawn`.
pub(crate) struct FoldLoop {
    graph: Graph,
    policies: Policies,
    interval: std::time::Duration,
    actor: String,
    /// Asks the run loop for a freeze cut (set by `spawn`).
    cuts: mpsc::Sender<CutRequest>,
    wake: Arc<Notify>,
    stop: CancellationToken,
    /// Fold once more when stopped, so a graceful shutdown leaves the graph
    /// current (and its offsets exactly attributed).
    final_fold: bool,
    /// Receives each published commit (tests and latency measurements).
    published: watch::Sender<Option<GraphCommit>>,
    /// Where fold rejects go once their commit is published.
    dead_letters: DeadLetters,
    /// Newest commit whose fold rejects are all delivered.
    delivered: u64,
    /// Gives up a dead-letter delivery that keeps failing: a child of the
    /// shutdown token, also cancelled when the run fails.
    stop_delivery: CancellationToken,
    /// Garbage collection after a publish (`None`: retention is off). In
    /// this loop it never races a fold of this process.
    retention: Option<retention::Scheduled>,
    /// Metrics and the summary log of each fold.
    report: Report,
    /// When the oldest record not yet published was taken (over cuts, as `spans`).
    oldest_taken: Option<std::time::Instant>,
    /// Under partition sharding, this member's duty: whether it folds now
    /// (it holds the fold partition; the others only freeze their shards,
    /// so that the folding member finds their rows in flushed generations)
    /// and whether it holds every partition. `None`: this process holds
    /// every shard and folds.
    leader: Option<watch::Receiver<Duty>>,
    /// Whether this member recovered and re-delivered since it last became
    /// the folding member.
    recovered: bool,
}

impl FoldLoop {
    /// A fold loop of `graph` under `[fold]` and `[graph] actor`; its
    /// dead-letter deliveries end with `shutdown`.
    pub(crate) fn new(
        config: &Config,
        graph: Graph,
        policies: Policies,
        dead_letters: DeadLetters,
        metrics: Arc<Metrics>,
        shutdown: &CancellationToken,
    ) -> FoldLoop {
        FoldLoop {
            graph,
            policies,
            interval: config.fold.interval,
            actor: config.graph.actor.clone(),
            cuts: mpsc::channel(1).0,
            wake: Arc::default(),
            stop: CancellationToken::new(),
            final_fold: config.fold.on_shutdown,
            published: watch::channel(None).0,
            dead_letters,
            delivered: 0,
            stop_delivery: shutdown.child_token(),
            retention: None,
            report: Report::new(metrics),
            oldest_taken: None,
            leader: None,
            recovered: false,
        }
    }

    /// Folds now when notified (pending rows or bytes; an operator's SIGUSR1).
    pub(crate) fn with_wake(mut self, wake: Arc<Notify>) -> FoldLoop {
        self.wake = wake;
        self
    }

    /// Sends each published commit to `published`.
    pub(crate) fn with_published(
        mut self,
        published: watch::Sender<Option<GraphCommit>>,
    ) -> FoldLoop {
        self.published = published;
        self
    }

    /// The newest commit whose fold rejects are already delivered.
    pub(crate) fn with_delivered(mut self, delivered: u64) -> FoldLoop {
        self.delivered = delivered;
        self
    }

    /// Collects garbage after publishes, when `[retention]` is on.
    pub(crate) fn with_retention(mut self, retention: Option<retention::Scheduled>) -> FoldLoop {
        self.retention = retention;
        self
    }

    /// Under partition sharding: folds only while `duty` says so.
    pub(crate) fn with_duty(mut self, duty: watch::Receiver<Duty>) -> FoldLoop {
        self.leader = Some(duty);
        self
    }

    /// Starts the loop on its own task; the run loop serves its cuts
    /// through the returned handle.
    pub(crate) fn spawn(self) -> FoldTask {
        let (tx, cuts) = mpsc::channel(1);
        let fold_loop = FoldLoop { cuts: tx, ..self };
        FoldTask {
            stop: fold_loop.stop.clone(),
            stop_delivery: fold_loop.stop_delivery.clone(),
            handle: tokio::spawn(fold_loop.run()),
            joined: false,
            cuts,
        }
    }
}

impl FoldLoop {
    async fn run(mut self) -> Result<()> {
        let period = if self.interval.is_zero() {
            std::time::Duration::from_secs(3600 * 24 * 365)
        } else {
            self.interval
        };
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        // Offsets of cuts whose fold has not been published yet.
        let mut spans = WrittenSpans::default();
        loop {
            let last = tokio::select! {
                biased;
                _ = self.stop.cancelled() => {
                    if !self.final_fold {
                        return Ok(());
                    }
                    true
                }
                _ = self.wake.notified() => false,
                _ = tick.tick() => false,
            };
            self.report.started();
            let folded = self.fold_once(&mut spans).await;
            self.report.ended(&folded);
            if !folded? || last {
                return Ok(());
            }
        }
    }

    /// Cuts, waits for the flushes, folds and publishes. Returns false when
    /// the run loop is gone.
    async fn fold_once(&mut self, spans: &mut WrittenSpans) -> Result<bool> {
        let started = std::time::Instant::now();
        let Some(mut limits) = self.take_cut(spans).await? else {
            return Ok(false);
        };
        let cut = started.elapsed();
        let Some(grace) = self.take_part(&mut limits, spans).await? else {
            return Ok(true);
        };
        let policies = match grace {
            Some(g) => std::borrow::Cow::Owned(self.policies.deferring_rejects(g)),
            None => std::borrow::Cow::Borrowed(&self.policies),
        };
        let head = self.graph.head().await?;
        if let Some(mut plan) = plan(
            &self.graph,
            &policies,
            &head,
            &Some(limits),
            spans,
            &self.actor,
        )
        .await?
        {
            plan.dead_letters_delivered = plan.dead_letters_delivered.max(self.delivered);
            // Recorded in every table commit, so a roll-forward (`recover`,
            // by this member or the next folder) checks as this fold does.
            plan.defer_rejects_ms = grace.map(|g| g.as_millis() as u64);
            crate::types::raise_offsets(&mut plan.dead_letter_since, &self.dead_letters.seen());
            let planned = started.elapsed();
            let Folded {
                commit,
                rejects,
                stages: mut t,
            } = execute(&self.graph, &policies, &plan).await?;
            *spans = WrittenSpans::default();
            let executed = started.elapsed();
            // The moment a reader can see it: the commit is in __manifest.
            // The dead letters that follow are for the topic's consumers.
            let _ = self.published.send(Some(commit.clone()));
            self.deliver(&commit, &rejects).await?;
            t.cut = cut.as_secs_f64();
            t.plan = (planned - cut).as_secs_f64();
            t.dead_letters = (started.elapsed() - executed).as_secs_f64();
            let oldest = self.oldest_taken.take();
            self.report
                .published(
                    &self.graph,
                    &commit,
                    &rejects,
                    started.elapsed(),
                    oldest,
                    &t,
                )
                .await;
            if let Some(r) = &mut self.retention {
                r.after_publish(&self.graph).await;
            }
        }
        Ok(true)
    }

    /// Asks the run loop for a cut, notes its offsets, and waits for its
    /// shards' flushes: the generation each shard is folded up to (`None`
    /// when the run loop is gone).
    async fn take_cut(
        &mut self,
        spans: &mut WrittenSpans,
    ) -> Result<Option<HashMap<uuid::Uuid, u64>>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if self.cuts.send(tx).await.is_err() {
            return Ok(None);
        }
        let Ok(cut) = rx.await else { return Ok(None) };
        let cut = cut?;
        spans.merge(&cut.spans);
        self.oldest_taken = match (self.oldest_taken, cut.oldest_taken) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let mut limits = HashMap::new();
        for f in cut.frozen {
            limits.insert(f.shard, f.upto_generation);
            let flushed = f.fence.wait().await;
            match flushed.map_err(|e| shards::fenced_or(e, &f.table, f.bucket, f.shard, "flush")) {
                Ok(()) => {}
                // Partition sharding: the shard moved to another member
                // since the cut; its flushed generations are folded as any
                // other member's, its memtable is the new owner's replay.
                Err(e) if self.leader.is_some() && e.kind() == ErrorKind::Fenced => {
                    tracing::info!(table = %f.table, bucket = f.bucket, "a cut shard moved to another member before its flush");
                    limits.remove(&f.shard);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Some(limits))
    }

    /// Under partition sharding, this member's part in the fold: `None`
    /// when another member folds (the cut's offsets are then its to
    /// report); else whether rejects wait a grace for other members'
    /// unflushed rows. The folding member recovers and re-delivers once,
    /// and folds every other shard as far as it is flushed.
    async fn take_part(
        &mut self,
        limits: &mut HashMap<uuid::Uuid, u64>,
        spans: &mut WrittenSpans,
    ) -> Result<Option<Option<std::time::Duration>>> {
        let Some(leader) = &self.leader else {
            return Ok(Some(None));
        };
        let part = *leader.borrow();
        if !part.folds {
            // Another member folds these rows, and reports its own
            // offsets and latency.
            self.recovered = false;
            *spans = WrittenSpans::default();
            self.oldest_taken = None;
            return Ok(None);
        }
        if !self.recovered {
            super::recover(&self.graph, &self.policies).await?;
            let delivered =
                super::redeliver(&self.graph, &self.dead_letters, &self.stop_delivery).await?;
            self.delivered = self.delivered.max(delivered);
            self.recovered = true;
        }
        let grace = (!part.alone).then(|| 2 * self.interval.max(std::time::Duration::from_secs(1)));
        // Every other shard as far as it is flushed: its generations
        // are complete once listed in its manifest.
        for table in self.graph.wal_tables() {
            for bucket in 0..shards::shard_count(&self.graph, &table)? {
                limits
                    .entry(shards::shard_id(&table, bucket))
                    .or_insert(u64::MAX);
            }
        }
        Ok(Some(grace))
    }

    /// Hands a published fold's rejects to the dead-letter topic and marks
    /// its commit delivered.
    async fn deliver(
        &mut self,
        commit: &GraphCommit,
        rejects: &[crate::rejects::Reject],
    ) -> Result<()> {
        // Published first, then produced: a crash in between re-delivers
        // on the next start, skipping what reached the topic (once per
        // reject_id).
        failpoints::hit(failpoints::FOLD_BEFORE_DEAD_LETTERS)?;
        if commit.seq > self.delivered + 1 {
            // Another folder published between this one's last
            // delivered commit and this one (a hand-off: a member that
            // was frozen while folding published after this member
            // became the folder). Its fold rejects may be on no topic:
            // this folder's init fenced its producer and aborted its
            // transaction. Deliver every commit past the mark, this one
            // included, before claiming them delivered (the chaos
            // `members` phase lost such a commit's rejects).
            self.delivered =
                super::redeliver(&self.graph, &self.dead_letters, &self.stop_delivery).await?;
        }
        if !rejects.is_empty() {
            self.dead_letters
                .deliver(
                    rejects,
                    Some(&commit.dead_letter_since),
                    &self.stop_delivery,
                )
                .await?;
            failpoints::hit(failpoints::FOLD_BEFORE_DELIVERED_MARK)?;
            self.graph.set_dead_letters_delivered(commit.seq).await?;
        }
        // Every earlier commit's rejects went out before this fold.
        self.delivered = commit.seq;
        Ok(())
    }
}

/// The fold loop's task and the run loop's side of its controls.
pub(crate) struct FoldTask {
    handle: tokio::task::JoinHandle<Result<()>>,
    /// Set once the handle returned (a join handle must not be polled again).
    joined: bool,
    stop: CancellationToken,
    /// Gives up the fold's dead-letter deliveries.
    stop_delivery: CancellationToken,
    /// The fold loop's freeze-cut requests, served between polls.
    cuts: mpsc::Receiver<CutRequest>,
}

/// What the fold task asks of the run loop, or that it ended.
pub(crate) enum FromFold {
    Cut(CutRequest),
    Ended(Result<()>),
}

impl FoldTask {
    /// The fold task's next cut request, or its end (ahead of any request).
    pub(crate) async fn next(&mut self) -> FromFold {
        if self.joined {
            return FromFold::Ended(Ok(()));
        }
        tokio::select! {
            biased;
            joined = &mut self.handle => FromFold::Ended(self.ended(joined)),
            Some(req) = self.cuts.recv() => FromFold::Cut(req),
        }
    }

    /// How the fold task ended, as the run loop's result: only a stop asked
    /// for ends it cleanly.
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

    /// Asks the loop to end, after its final fold if `fold.on_shutdown`.
    pub(crate) fn stop(&self) {
        self.stop.cancel();
    }

    /// After a failure: no final fold (cut requests go unanswered) and no
    /// more deliveries; waits up to `bound` for the task to end, then
    /// aborts it (a fold cut short is a crash the next start recovers).
    pub(crate) async fn abandon(mut self, bound: Duration) {
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

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A fold loop that ends without being asked to is a bug, not a stop.
    #[tokio::test]
    async fn a_fold_task_ending_unasked_is_a_bug() {
        let (stop, stop_delivery) = (CancellationToken::new(), CancellationToken::new());
        let (_cut_tx, cuts) = mpsc::channel::<CutRequest>(1);
        let mut task = fold_task(tokio::spawn(async { Ok(()) }), &stop, &stop_delivery, cuts);
        let FromFold::Ended(Err(e)) = task.next().await else {
            panic!("ended cleanly")
        };
        assert_eq!(e.kind(), ErrorKind::Bug);
        assert!(
            matches!(task.next().await, FromFold::Ended(Ok(()))),
            "joined once"
        );
    }
}
