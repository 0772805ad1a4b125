//! `--exit-at-end`: when a run that was asked to stop at the end of its
//! input has reached it. Holding partitions, that is every one durable and
//! committed up to the end offsets seen after the assignment; holding
//! none, that nothing is left the group could give this member.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::run_loop::RunLoop;
use crate::config::Sharding;
use crate::error::Result;
use crate::kafka::consumer;
use crate::offsets::TopicPartition;
use crate::shards;

/// What the end rule remembers between its looks.
pub(super) struct EndWatch {
    /// End offsets to reach (taken once per assignment).
    targets: Option<BTreeMap<TopicPartition, i64>>,
    /// When the last poll arrived (the end must be quiet too).
    last_poll: Instant,
    /// When `at_end_unassigned` last asked the broker.
    unassigned_probe: Option<Instant>,
    /// When `at_end_unassigned` last said why it waits.
    waiting_said: Option<Instant>,
}

impl Default for EndWatch {
    fn default() -> Self {
        EndWatch {
            targets: None,
            last_poll: Instant::now(),
            unassigned_probe: None,
            waiting_said: None,
        }
    }
}

impl EndWatch {
    pub(super) fn polled(&mut self) {
        self.last_poll = Instant::now();
    }

    /// A rebalance: the end offsets are taken again.
    pub(super) fn forget_targets(&mut self) {
        self.targets = None;
    }
}

impl RunLoop<'_> {
    pub(super) async fn at_end(&mut self) -> Result<bool> {
        if self.assigned.is_empty() && self.acks.is_empty() {
            return self.at_end_unassigned().await;
        }
        // Quiet too, if asked: some brokers (tansu 0.6) report a high
        // watermark below the true end when producers batch.
        if self.assigned.is_empty()
            || !self.acks.is_empty()
            || self.end.last_poll.elapsed() < self.config.offsets.exit_at_end_quiet
        {
            return Ok(false);
        }
        if self.end.targets.is_none() {
            self.end.targets = Some(self.end_targets().await?);
        }
        let targets = self.end.targets.as_ref().expect("set above");
        let short: Vec<TopicPartition> = targets
            .iter()
            .filter(|(tp, end)| self.acks.watermark(tp).is_none_or(|n| n < **end))
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

    /// The end offset of each assigned partition not yet committed to it.
    /// (`&mut self`, as every async method here: the run loop is not
    /// `Sync`, so a `&RunLoop` held across an await would make the run's
    /// future not `Send`.)
    async fn end_targets(&mut self) -> Result<BTreeMap<TopicPartition, i64>> {
        let parts: Vec<TopicPartition> = self.assigned.iter().cloned().collect();
        let ends = self.queries.watermarks(parts.clone()).await?;
        let committed = self.queries.committed(parts).await?;
        // Partitions already committed to their end need nothing from us.
        Ok(ends
            .into_iter()
            .filter(|(tp, w)| committed.get(tp).copied().unwrap_or(0) < w.high)
            .map(|(tp, w)| (tp, w.high))
            .collect())
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
        let now = Instant::now();
        let waited = self.stall.unassigned_for(now).unwrap_or_default();
        let probed = self
            .end
            .unassigned_probe
            .is_some_and(|t| now - t < Duration::from_secs(1));
        if waited < self.stall.bound() || probed {
            return Ok(false);
        }
        self.end.unassigned_probe = Some(now);
        if let Some(why) = self.nothing_left_waits_for().await {
            self.say_waiting(why);
            return Ok(false);
        }
        tracing::info!(held_nothing_for = ?waited, "holding no partition, and the group has committed every mapped partition to its end");
        Ok(true)
    }

    /// What a member holding nothing still waits for, if anything: lag on
    /// the mapped topics, or (partition sharding) what the graph has not
    /// folded.
    async fn nothing_left_waits_for(&mut self) -> Option<String> {
        let topics = consumer::mapped_topics(self.config)
            .into_iter()
            .map(String::from)
            .collect();
        match self.queries.progress(topics).await {
            Ok(seen) if seen.lag > 0 => {
                return Some(format!(
                    "the group's lag on the mapped topics is {}; waiting for an assignment or for the members holding them",
                    seen.lag
                ));
            }
            Ok(_) => {}
            Err(e) => return Some(format!("cannot read the group's progress: {e}")),
        }
        if self.config.wal.sharding != Sharding::Partition {
            return None;
        }
        match shards::unfolded(self.pool.graph()).await {
            Ok(u) if u.is_empty() => None,
            Ok(u) => Some(format!(
                "the group has committed every mapped partition to its end, but the graph has not folded {} flushed generations and the WAL of {} shards; waiting for the member holding the fold partition, or for a rebalance that gives it to this one",
                u.generations, u.wal_shards
            )),
            Err(e) => Some(format!("cannot read what the graph has not folded: {e}")),
        }
    }

    /// `--exit-at-end` while holding nothing: why it does not end yet, once
    /// and then every 30 s, so it never waits without saying so.
    fn say_waiting(&mut self, why: String) {
        let now = Instant::now();
        if self
            .end
            .waiting_said
            .is_some_and(|t| now - t < Duration::from_secs(30))
        {
            return;
        }
        self.end.waiting_said = Some(now);
        tracing::info!(
            event = "exit_at_end_waiting",
            "exit-at-end: holding no partition; {why}"
        );
    }
}
