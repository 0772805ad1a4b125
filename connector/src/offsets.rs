//! Offsets: the one record of a session's offsets (`OffsetBook`: each
//! partition's durable watermark, advanced only by poll acks that arrive in
//! poll order; what the broker confirmed committed; so what may be
//! committed), and the spans of offsets written since the last fold cut.
//! Every rule for what may be committed is here; `kafka` sends the commits
//! this says, and reports back which the broker took. Does not talk to
//! Kafka.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::types::OffsetRange;
pub(crate) use crate::types::TopicPartition;

/// The highest offset of each partition a poll carried. A poll's ack is
/// produced only when every write of that poll is durable.
#[derive(Debug, Default, Clone)]
pub(crate) struct PollAck {
    pub high: BTreeMap<TopicPartition, i64>,
    pub records: usize,
}

impl PollAck {
    #[cfg(test)]
    pub(crate) fn record(&mut self, topic: &str, partition: i32, offset: i64) {
        self.records += 1;
        match self.high.get_mut(&(topic.to_string(), partition)) {
            Some(h) => *h = (*h).max(offset),
            None => {
                self.high.insert((topic.to_string(), partition), offset);
            }
        }
    }
}

/// Offsets seen in one poll, per partition, borrowed from the messages so
/// the per-record path allocates nothing. A poll touches few partitions,
/// so a linear scan beats hashing.
#[derive(Debug, Default)]
pub(crate) struct PollSpans<'a> {
    spans: Vec<(&'a str, i32, i64, i64)>,
    records: usize,
}

impl<'a> PollSpans<'a> {
    pub(crate) fn record(&mut self, topic: &'a str, partition: i32, offset: i64) {
        self.records += 1;
        match self
            .spans
            .iter_mut()
            .find(|(t, p, _, _)| *p == partition && *t == topic)
        {
            Some((_, _, lo, hi)) => {
                *lo = (*lo).min(offset);
                *hi = (*hi).max(offset);
            }
            None => self.spans.push((topic, partition, offset, offset)),
        }
    }

    pub(crate) fn ack(&self) -> PollAck {
        PollAck {
            high: self
                .spans
                .iter()
                .map(|(t, p, _, hi)| ((t.to_string(), *p), *hi))
                .collect(),
            records: self.records,
        }
    }

    pub(crate) fn add_to(&self, written: &mut WrittenSpans) {
        for (t, p, lo, hi) in &self.spans {
            written.record(t, *p, *lo);
            written.record(t, *p, *hi);
        }
    }
}

/// The session's offsets, shared by the run loop and the consumer's
/// callbacks (librdkafka calls them on the thread that polls). Every
/// update replaces whole entries, so a lock poisoned by a panic elsewhere
/// still holds a valid record and is used as it is.
#[derive(Debug, Clone, Default)]
pub(crate) struct OffsetBook {
    marks: Arc<Mutex<DurableWatermarks>>,
}

impl OffsetBook {
    fn marks(&self) -> MutexGuard<'_, DurableWatermarks> {
        self.marks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A durable poll, applied in poll order: the watermarks of its
    /// partitions still `assigned` advance (a revoked partition's records
    /// belong to its next owner). Returns each advanced partition with its
    /// next offset.
    pub(crate) fn durable(
        &self,
        mut ack: PollAck,
        assigned: &BTreeSet<TopicPartition>,
    ) -> Vec<(TopicPartition, i64)> {
        ack.high.retain(|tp, _| assigned.contains(tp));
        let mut marks = self.marks();
        marks.apply(&ack);
        ack.high
            .into_keys()
            .filter_map(|tp| marks.next(&tp).map(|n| (tp, n)))
            .collect()
    }

    /// What may be committed now: the watermark of each `assigned`
    /// partition that moved past what the broker confirmed. A commit the
    /// broker refused stays here, so the next commit sends it again.
    pub(crate) fn to_commit(
        &self,
        assigned: &BTreeSet<TopicPartition>,
    ) -> Vec<(TopicPartition, i64)> {
        self.marks()
            .uncommitted()
            .into_iter()
            .filter(|(tp, _)| assigned.contains(tp))
            .collect()
    }

    /// What a revoke may commit before the partitions go: the same rule,
    /// for the partitions being revoked.
    pub(crate) fn to_commit_on_revoke(
        &self,
        revoked: &[TopicPartition],
    ) -> Vec<(TopicPartition, i64)> {
        self.marks()
            .uncommitted()
            .into_iter()
            .filter(|(tp, _)| revoked.contains(tp))
            .collect()
    }

    /// The broker took these commits.
    pub(crate) fn committed(&self, done: &[(TopicPartition, i64)]) {
        self.marks().mark_committed(done);
    }

    /// The offset a commit of `tp` may name (one past its last durable record).
    pub(crate) fn watermark(&self, tp: &TopicPartition) -> Option<i64> {
        self.marks().next(tp)
    }

    /// Every partition's watermark (the summary of a run).
    pub(crate) fn watermarks(&self) -> Vec<(TopicPartition, i64)> {
        self.marks().all()
    }

    /// Revoked partitions: their watermarks and commits are forgotten.
    pub(crate) fn forget(&self, tps: &[TopicPartition]) {
        let mut marks = self.marks();
        for tp in tps {
            marks.forget(tp);
        }
    }
}

/// Contiguous durable progress per partition: `next` is the offset a
/// commit may name (one past the last durable record).
#[derive(Debug, Default)]
struct DurableWatermarks {
    next: BTreeMap<TopicPartition, i64>,
    committed: BTreeMap<TopicPartition, i64>,
}

impl DurableWatermarks {
    /// Acks must be applied in poll order (the pipeline resolves them
    /// through an ordered queue), which makes each watermark contiguous.
    pub(crate) fn apply(&mut self, ack: &PollAck) {
        for (tp, &high) in &ack.high {
            let e = self.next.entry(tp.clone()).or_insert(high + 1);
            *e = (*e).max(high + 1);
        }
    }

    /// Partitions whose watermark moved past their last commit.
    pub(crate) fn uncommitted(&self) -> Vec<(TopicPartition, i64)> {
        self.next
            .iter()
            .filter(|(tp, n)| self.committed.get(*tp).is_none_or(|c| c < n))
            .map(|(tp, n)| (tp.clone(), *n))
            .collect()
    }

    pub(crate) fn all(&self) -> Vec<(TopicPartition, i64)> {
        self.next.iter().map(|(tp, n)| (tp.clone(), *n)).collect()
    }

    /// Marks commits the broker took; a commit older than one already
    /// taken (an async reply arriving late) changes nothing.
    pub(crate) fn mark_committed(&mut self, done: &[(TopicPartition, i64)]) {
        for (tp, n) in done {
            if !self.next.contains_key(tp) {
                continue; // revoked meanwhile
            }
            let c = self.committed.entry(tp.clone()).or_insert(*n);
            *c = (*c).max(*n);
        }
    }

    pub(crate) fn next(&self, tp: &TopicPartition) -> Option<i64> {
        self.next.get(tp).copied()
    }

    /// Forgets revoked partitions; their later acks are ignored by the caller.
    pub(crate) fn forget(&mut self, tp: &TopicPartition) {
        self.next.remove(tp);
        self.committed.remove(tp);
    }
}

/// Offsets written to the WAL since the last fold cut, per partition.
#[derive(Debug, Default, Clone)]
pub struct WrittenSpans {
    spans: BTreeMap<TopicPartition, (i64, i64)>,
}

impl WrittenSpans {
    pub fn record(&mut self, topic: &str, partition: i32, offset: i64) {
        match self.spans.get_mut(&(topic.to_string(), partition)) {
            Some((lo, hi)) => {
                *lo = (*lo).min(offset);
                *hi = (*hi).max(offset);
            }
            None => {
                self.spans
                    .insert((topic.to_string(), partition), (offset, offset));
            }
        }
    }

    pub fn merge(&mut self, other: &WrittenSpans) {
        for ((t, p), (lo, hi)) in &other.spans {
            self.record(t, *p, *lo);
            self.record(t, *p, *hi);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    pub fn take(&mut self) -> WrittenSpans {
        std::mem::take(self)
    }

    pub fn ranges(&self) -> Vec<OffsetRange> {
        self.spans
            .iter()
            .map(|((topic, partition), (first, last))| OffsetRange {
                topic: topic.clone(),
                partition: *partition,
                first: *first,
                last: *last,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watermark_is_one_past_the_durable_high() {
        let mut w = DurableWatermarks::default();
        let mut a = PollAck::default();
        a.record("t", 0, 5);
        a.record("t", 0, 9);
        a.record("t", 1, 2);
        w.apply(&a);
        assert_eq!(w.next(&("t".into(), 0)), Some(10));
        assert_eq!(w.uncommitted().len(), 2);
        let all = w.all();
        w.mark_committed(&all);
        assert!(w.uncommitted().is_empty());
    }

    #[test]
    fn a_refused_or_late_commit_leaves_the_offset_to_commit_again() {
        let book = OffsetBook::default();
        let tp = ("t".to_string(), 0);
        let assigned: BTreeSet<_> = [tp.clone()].into();
        let mut a = PollAck::default();
        a.record("t", 0, 9);
        book.durable(a.clone(), &assigned);
        // Sent but not confirmed (an async commit the broker refused).
        assert_eq!(book.to_commit(&assigned), vec![(tp.clone(), 10)]);
        assert_eq!(book.to_commit(&assigned), vec![(tp.clone(), 10)]);
        a.record("t", 0, 19);
        book.durable(a, &assigned);
        book.committed(&[(tp.clone(), 20)]);
        // An older reply arriving after a newer one moves nothing back.
        book.committed(&[(tp.clone(), 10)]);
        assert!(book.to_commit(&assigned).is_empty());
        // A poisoned lock still answers (a panic elsewhere while holding it).
        let b = book.clone();
        let _ = std::thread::spawn(move || {
            let _g = b.marks.lock().unwrap();
            panic!("poison");
        })
        .join();
        assert_eq!(book.watermark(&tp), Some(20));
    }

    #[test]
    fn poll_spans_become_one_ack() {
        let mut ps = PollSpans::default();
        for (p, o) in [(0, 4), (1, 9), (0, 2), (0, 7)] {
            ps.record("t", p, o);
        }
        let ack = ps.ack();
        assert_eq!(ack.records, 4);
        assert_eq!(ack.high[&("t".to_string(), 0)], 7);
        let mut w = WrittenSpans::default();
        ps.add_to(&mut w);
        assert_eq!((w.ranges()[0].first, w.ranges()[0].last), (2, 7));
    }

    #[test]
    fn spans_merge() {
        let mut a = WrittenSpans::default();
        a.record("t", 0, 5);
        let mut b = WrittenSpans::default();
        b.record("t", 0, 9);
        b.record("t", 0, 7);
        a.merge(&b);
        assert_eq!(a.ranges()[0].first, 5);
        assert_eq!(a.ranges()[0].last, 9);
    }
}
