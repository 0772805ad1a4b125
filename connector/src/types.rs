//! Plain values every layer shares: a topic partition, an offset range, the
//! clock. A leaf: it imports nothing from the crate.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A Kafka topic partition.
pub type TopicPartition = (String, i32);

/// Source records a commit folded, per topic partition (inclusive bounds).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct OffsetRange {
    pub topic: String,
    pub partition: i32,
    pub first: i64,
    pub last: i64,
}

/// An offset per topic and partition. For the dead-letter topics: offsets
/// every later produce lands at or past, so a read from them finds what was
/// produced since (a missing partition reads from its start).
pub(crate) type PartitionOffsets = BTreeMap<String, BTreeMap<i32, i64>>;

/// Raises each offset of `into` to `from`'s where that is higher. Two lower
/// bounds of what comes later give a tighter one.
pub(crate) fn raise_offsets(into: &mut PartitionOffsets, from: &PartitionOffsets) {
    for (topic, parts) in from {
        let mine = into.entry(topic.clone()).or_default();
        for (&p, &o) in parts {
            let e = mine.entry(p).or_insert(o);
            *e = (*e).max(o);
        }
    }
}

/// Wall-clock milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raising_offsets_keeps_the_higher_of_each_partition() {
        let mut into = PartitionOffsets::from([("a".into(), [(0, 5), (1, 9)].into())]);
        let from = PartitionOffsets::from([
            ("a".into(), [(0, 7), (1, 3), (2, 1)].into()),
            ("b".into(), [(0, 4)].into()),
        ]);
        raise_offsets(&mut into, &from);
        let want = PartitionOffsets::from([
            ("a".into(), [(0, 7), (1, 9), (2, 1)].into()),
            ("b".into(), [(0, 4)].into()),
        ]);
        assert_eq!(into, want);
    }
}
