//! `--exit-at-end`: when a run asked to stop at the end of its input has
//! reached it. One rule for every member and every sharding: every
//! partition of every mapped topic has reached the end offset read when
//! the session started, either durable here (this run's drain commits it)
//! or committed by the group, and the graph holds what is durable. A
//! partition another member holds is waited for and named every 30 s; the
//! stall watch (`stall.rs`) decides when such a wait has gone on too long.
//! What this member holds being done is never enough (issue 49: a member
//! the coordinator still counted, gone without leaving, held half the
//! partitions, and a fresh run exited 0 with them unread).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use crate::config::{Config, Sharding};
use crate::error::{Error, ErrorKind, Result};
use crate::graph::Graph;
use crate::kafka::consumer;
use crate::kafka::OffsetQueries;
use crate::offsets::{OffsetBook, TopicPartition};
use crate::shards;

/// How often the end rule asks the broker for the group's committed offsets.
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// How often a wait is said again.
const SAY_EVERY: Duration = Duration::from_secs(30);

/// What the end rule remembers between its looks.
pub(super) struct EndWatch {
    /// The end offset of every mapped partition, read at the session's
    /// first look and never again: a live producer must not move the end.
    targets: Option<BTreeMap<TopicPartition, i64>>,
    /// When the last poll arrived (the end must be quiet too).
    last_poll: Instant,
    /// When the group's committed offsets were last read.
    looked: Option<Instant>,
    /// Partitions held elsewhere that this member waits for, with the
    /// group's committed offset of each (empty: it waits for none).
    elsewhere: BTreeMap<TopicPartition, Option<i64>>,
    /// When a wait was last said.
    waiting_said: Option<Instant>,
}

impl Default for EndWatch {
    fn default() -> Self {
        EndWatch {
            targets: None,
            last_poll: Instant::now(),
            looked: None,
            elsewhere: BTreeMap::new(),
            waiting_said: None,
        }
    }
}

/// What the end rule looks at, lent by the run loop for one look.
pub(super) struct Look<'a> {
    pub(super) config: &'a Config,
    pub(super) assigned: &'a BTreeSet<TopicPartition>,
    pub(super) offsets: &'a OffsetBook,
    pub(super) queries: &'a OffsetQueries,
    /// How long this member has held nothing (`None`: it holds some).
    pub(super) held_nothing_for: Option<Duration>,
    /// The stall bound: a member holding nothing waits that long first.
    pub(super) stall_bound: Duration,
    /// Whether this member's drain folds everything durable.
    pub(super) folds: bool,
    pub(super) graph: &'a Graph,
}

impl EndWatch {
    pub(super) fn polled(&mut self) {
        self.last_poll = Instant::now();
    }

    /// The partitions held elsewhere that the end waits for, once this
    /// member's own are done (the stall watch judges their progress).
    pub(super) fn waits_elsewhere(&self) -> Option<Vec<TopicPartition>> {
        (!self.elsewhere.is_empty()).then(|| self.elsewhere.keys().cloned().collect())
    }
}

impl EndWatch {
    /// Whether the run is at its end. Errors of a look (a broker that does
    /// not answer) are said and waited out, never fatal, but for a refusal
    /// (`Error::NotAuthorized`), which no wait cures.
    pub(super) async fn at_end(&mut self, look: Look<'_>) -> Result<bool> {
        let now = Instant::now();
        let holding = !look.assigned.is_empty();
        if holding && self.last_poll.elapsed() < look.config.offsets.exit_at_end_quiet {
            // Quiet too, if asked: a broker whose high watermark reads low
            // while producers batch (tansu 0.6).
            return Ok(false);
        }
        // A member that holds nothing may not have been assigned yet: it
        // gives the group a stall bound first (docs/decisions/0002).
        if look.held_nothing_for.is_some_and(|w| w < look.stall_bound) {
            return Ok(false);
        }
        if self.looked.is_some_and(|t| now - t < LOOK_EVERY) {
            return Ok(false);
        }
        self.looked = Some(now);
        if let Some(why) = self.short_of_end(&look).await? {
            self.say_waiting(why, holding);
            return Ok(false);
        }
        if let Some(why) = graph_waits_for(&look).await {
            self.say_waiting(why, holding);
            return Ok(false);
        }
        Ok(true)
    }

    /// Why some mapped partition has not reached its end, if one has not:
    /// neither durable here nor committed by the group up to its target.
    async fn short_of_end(&mut self, look: &Look<'_>) -> Result<Option<String>> {
        if self.targets.is_none() {
            match end_targets(look).await {
                Ok(t) => self.targets = Some(t),
                Err(e) => return refused_or(e, "cannot read the end offsets"),
            }
        }
        let targets = self.targets.as_ref().expect("set above");
        // Durable here reaches the end: the drain commits it.
        let short: Vec<TopicPartition> = targets
            .iter()
            .filter(|(tp, end)| {
                !look.assigned.contains(*tp) || look.offsets.watermark(tp).is_none_or(|n| n < **end)
            })
            .map(|(tp, _)| tp.clone())
            .collect();
        self.elsewhere.clear();
        if short.is_empty() {
            return Ok(None);
        }
        // A partition this run has nothing newer of may be committed to
        // its end already, by this run's earlier commits or another member.
        let committed = match look.queries.committed(short.clone()).await {
            Ok(c) => c,
            Err(e) => return refused_or(e, "cannot read the group's committed offsets"),
        };
        let left: Vec<TopicPartition> = short
            .into_iter()
            .filter(|tp| committed.get(tp).is_none_or(|&c| c < targets[tp]))
            .collect();
        if left.is_empty() {
            return Ok(None);
        }
        let (mine, elsewhere): (Vec<_>, Vec<_>) =
            left.into_iter().partition(|tp| look.assigned.contains(tp));
        if !mine.is_empty() {
            // Still reading its own: nothing to say, nothing to judge yet.
            return Ok(Some(String::new()));
        }
        self.elsewhere = elsewhere
            .iter()
            .map(|tp| (tp.clone(), committed.get(tp).copied()))
            .collect();
        Ok(Some(waiting_for(&self.elsewhere, targets)))
    }

    /// Why the run does not end yet: once, then every 30 s, so it never
    /// waits without saying so. Empty: nothing worth saying (it is reading).
    fn say_waiting(&mut self, why: String, holding: bool) {
        let now = Instant::now();
        if why.is_empty() || self.waiting_said.is_some_and(|t| now - t < SAY_EVERY) {
            return;
        }
        self.waiting_said = Some(now);
        let holding = if holding {
            ""
        } else {
            "holding no partition; "
        };
        tracing::info!(event = "exit_at_end_waiting", "exit-at-end: {holding}{why}");
    }
}

/// A look's failure: a refusal stops the run; anything else is a reason
/// to wait, said.
fn refused_or(e: Error, what: &str) -> Result<Option<String>> {
    match e.kind() {
        ErrorKind::NotAuthorized => Err(e),
        _ => Ok(Some(format!("{what}: {e}"))),
    }
}

/// The end offset of every partition of every mapped topic. A mapped
/// topic the broker does not know has nothing to wait for; one it refuses
/// to describe is a refusal.
async fn end_targets(look: &Look<'_>) -> Result<BTreeMap<TopicPartition, i64>> {
    let topics = consumer::mapped_topics(look.config)
        .into_iter()
        .map(String::from)
        .collect();
    let found = look.queries.partitions(topics).await?;
    if let Some(e) = found.refusal() {
        return Err(e);
    }
    let parts = found.partitions;
    let ends = look.queries.watermarks(parts).await?;
    // A partition with nothing to read (empty, or every record deleted by
    // retention) has no end to reach: no record will ever be durable or
    // committed there.
    let targets: BTreeMap<TopicPartition, i64> = ends
        .into_iter()
        .filter(|(_, w)| w.high > w.low)
        .map(|(tp, w)| (tp, w.high))
        .collect();
    tracing::info!(
        partitions = targets.len(),
        records_to = targets.values().sum::<i64>(),
        "exit-at-end: ends when every mapped partition reaches the end offset read now"
    );
    Ok(targets)
}

/// What the graph has not folded that this member's drain will not fold,
/// if anything. A member that folds (every member under bucket sharding;
/// the holder of the fold partition under partition sharding) folds
/// everything durable in its drain; any other member waits for the
/// folder, or for a rebalance that makes it the folder.
async fn graph_waits_for(look: &Look<'_>) -> Option<String> {
    if look.config.wal.sharding != Sharding::Partition || look.folds {
        return None;
    }
    match shards::unfolded(look.graph).await {
        Ok(u) if u.is_empty() => None,
        Ok(u) => Some(format!(
            "the group has committed every mapped partition to its end, but the graph has not folded {} flushed generations and the WAL of {} shards; waiting for the member holding the fold partition, or for a rebalance that gives it to this one",
            u.generations, u.wal_shards
        )),
        Err(e) => Some(format!("cannot read what the graph has not folded: {e}")),
    }
}

/// `waiting for t/1, /3: assigned to another member, committed 0 of 25002`:
/// partitions of one topic after the first are written `/p`; the offsets
/// are summed over the partitions named.
fn waiting_for(
    elsewhere: &BTreeMap<TopicPartition, Option<i64>>,
    targets: &BTreeMap<TopicPartition, i64>,
) -> String {
    let mut names = Vec::new();
    let mut last_topic: Option<&str> = None;
    for (t, p) in elsewhere.keys() {
        if last_topic == Some(t.as_str()) {
            names.push(format!("/{p}"));
        } else {
            names.push(format!("{t}/{p}"));
            last_topic = Some(t);
        }
    }
    let committed: i64 = elsewhere.values().map(|c| c.unwrap_or(0)).sum();
    let end: i64 = elsewhere.keys().map(|tp| targets[tp]).sum();
    format!(
        "waiting for {}: assigned to another member, committed {committed} of {end}",
        names.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(t: &str, p: i32) -> TopicPartition {
        (t.to_string(), p)
    }

    #[test]
    fn a_wait_names_each_partition_once_and_sums_their_offsets() {
        let targets: BTreeMap<_, _> = [
            (tp("freeze_items", 0), 25_000),
            (tp("freeze_items", 1), 25_002),
            (tp("freeze_items", 3), 24_998),
            (tp("other", 2), 10),
        ]
        .into();
        let one: BTreeMap<_, _> = [(tp("freeze_items", 1), None)].into();
        assert_eq!(
            waiting_for(&one, &targets),
            "waiting for freeze_items/1: assigned to another member, committed 0 of 25002"
        );
        let some: BTreeMap<_, _> = [
            (tp("freeze_items", 1), Some(2)),
            (tp("freeze_items", 3), None),
            (tp("other", 2), Some(4)),
        ]
        .into();
        assert_eq!(
            waiting_for(&some, &targets),
            "waiting for freeze_items/1, /3, other/2: assigned to another member, committed 6 of 50010"
        );
    }
}
