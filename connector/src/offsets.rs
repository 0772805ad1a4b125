//! Offsets: per-partition durable watermarks, advanced only by poll acks
//! that arrive in poll order, and the spans of offsets written since the
//! last fold cut. Does not talk to Kafka; the consumer commits what this
//! says is committable.

use std::collections::BTreeMap;

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

/// Contiguous durable progress per partition: `next` is the offset a
/// commit may name (one past the last durable record).
#[derive(Debug, Default)]
pub(crate) struct DurableWatermarks {
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
            .filter(|(tp, n)| self.committed.get(*tp) != Some(n))
            .map(|(tp, n)| (tp.clone(), *n))
            .collect()
    }

    pub(crate) fn all(&self) -> Vec<(TopicPartition, i64)> {
        self.next.iter().map(|(tp, n)| (tp.clone(), *n)).collect()
    }

    pub(crate) fn mark_committed(&mut self, done: &[(TopicPartition, i64)]) {
        for (tp, n) in done {
            self.committed.insert(tp.clone(), *n);
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
