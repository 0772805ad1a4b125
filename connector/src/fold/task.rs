//! The fold task: the background fold loop of a running connector. Serial,
//! one fold at a time; it asks the run loop for a freeze cut, waits for the
//! flushes, folds and publishes, then hands the fold's rejects to the
//! dead-letter topic.

use std::collections::HashMap;
use std::sync::Arc;

use super::{execute, plan, Folded, Policies, Report};
use crate::error::{ErrorKind, Result};
use crate::failpoints;
use crate::graph::{Graph, GraphCommit};
use crate::kafka::DeadLetters;
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

/// A member's part in folding under partition sharding.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Part {
    /// It holds the fold partition: it folds every shard.
    pub folds: bool,
    /// It holds every mapped partition: no other member has unflushed rows.
    pub alone: bool,
}

/// The background fold loop of a running connector: serial, one fold at a
/// time, triggered by its interval, by `wake` (pending rows/bytes, or an
/// operator's request), and stopped by `stop`.
pub(crate) struct FoldLoop {
    pub graph: Graph,
    pub policies: Policies,
    pub interval: std::time::Duration,
    pub actor: String,
    pub cuts: tokio::sync::mpsc::Sender<CutRequest>,
    pub wake: Arc<tokio::sync::Notify>,
    pub stop: tokio_util::sync::CancellationToken,
    /// Fold once more when stopped, so a graceful shutdown leaves the graph
    /// current (and its offsets exactly attributed).
    pub final_fold: bool,
    /// Receives each published commit (tests and latency measurements).
    pub published: tokio::sync::watch::Sender<Option<GraphCommit>>,
    /// Where fold rejects go once their commit is published.
    pub(crate) dead_letters: DeadLetters,
    /// Newest commit whose fold rejects are all delivered.
    pub delivered: u64,
    /// Gives up a dead-letter delivery that keeps failing (shutdown).
    pub stop_delivery: tokio_util::sync::CancellationToken,
    /// Garbage collection after a publish (`None`: retention is off). In
    /// this loop it never races a fold of this process.
    pub(crate) retention: Option<retention::Scheduled>,
    /// Metrics and the summary log of each fold.
    pub(crate) report: Report,
    /// When the oldest record not yet published was taken (over cuts, as `spans`).
    pub oldest_taken: Option<std::time::Instant>,
    /// Under partition sharding, this member's part: whether it folds now
    /// (it holds the fold partition; the others only freeze their shards,
    /// so that the folding member finds their rows in flushed generations)
    /// and whether it holds every partition. `None`: this process holds
    /// every shard and folds.
    pub leader: Option<tokio::sync::watch::Receiver<Part>>,
    /// Whether this member recovered and re-delivered since it last became
    /// the folding member.
    pub recovered: bool,
}

impl FoldLoop {
    pub(crate) async fn run(mut self) -> Result<()> {
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
            let Folded {
                commit,
                rejects,
                stages: t,
            } = execute(&self.graph, &policies, &plan).await?;
            *spans = WrittenSpans::default();
            self.deliver(&commit, &rejects).await?;
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
            let _ = self.published.send(Some(commit));
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
