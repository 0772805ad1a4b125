//! A member's role under partition sharding: the shards of its assigned
//! partitions are its own, and the member assigned the fold partition
//! (partition 0 of the first mapped topic, by name) folds every shard's
//! flushed generations; the others only freeze theirs
//! (docs/decisions/0007-scale-out.md). The run loop tells the fold task
//! its duty after each rebalance.

use std::collections::{BTreeMap, BTreeSet};

use tokio::sync::watch;

use crate::config::Config;
use crate::error::Error;
use crate::fold::Duty;
use crate::graph::Graph;
use crate::offsets::TopicPartition;

pub(super) struct FoldRole {
    /// Topic → the type tables it feeds.
    pub(super) feeds: BTreeMap<String, Vec<String>>,
    fold_partition: TopicPartition,
    /// Every mapped partition.
    partitions: usize,
    tx: watch::Sender<Duty>,
}

impl FoldRole {
    pub(super) fn new(config: &Config, graph: &Graph) -> FoldRole {
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
            tx: watch::channel(Duty::default()).0,
        }
    }

    /// What the fold task watches for its duty.
    pub(super) fn duty(&self) -> watch::Receiver<Duty> {
        self.tx.subscribe()
    }

    /// Whether holding `assigned` makes this member the folder.
    pub(super) fn folds(&self, assigned: &BTreeSet<TopicPartition>) -> bool {
        assigned.contains(&self.fold_partition)
    }

    /// Tells the fold task its duty while this member holds `assigned`.
    pub(super) fn holds(&self, assigned: &BTreeSet<TopicPartition>) {
        let duty = Duty {
            folds: self.folds(assigned),
            alone: assigned.len() >= self.partitions,
        };
        self.tx
            .send_if_modified(|was| std::mem::replace(was, duty) != duty);
    }

    /// The first partition `held` holds without partition p of another
    /// topic feeding the same table, as a config error: claiming its shard
    /// would fence the member holding the other. `range` with the same
    /// mappings on every member never does this (`validate_copartitioned_assignor`);
    /// a member mapping fewer topics than another does.
    pub(super) fn split_shard(&self, held: &BTreeSet<TopicPartition>) -> Option<Error> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn role(feeds: &[(&str, &str)]) -> FoldRole {
        let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (topic, table) in feeds {
            map.entry(topic.to_string())
                .or_default()
                .push(table.to_string());
        }
        FoldRole {
            feeds: map,
            fold_partition: ("a".into(), 0),
            partitions: 6,
            tx: watch::channel(Duty::default()).0,
        }
    }

    fn held(tps: &[(&str, i32)]) -> BTreeSet<TopicPartition> {
        tps.iter().map(|(t, p)| (t.to_string(), *p)).collect()
    }

    #[test]
    fn a_shard_split_over_members_is_a_config_error_naming_both_topics() {
        let role = role(&[("a", "nodes/P"), ("b", "nodes/P"), ("c", "nodes/Q")]);
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

    #[test]
    fn the_holder_of_the_fold_partition_folds_and_all_partitions_make_it_alone() {
        let role = role(&[("a", "nodes/P")]);
        let duty = role.duty();
        role.holds(&held(&[("a", 1)]));
        assert_eq!(*duty.borrow(), Duty::default());
        role.holds(&held(&[("a", 0), ("a", 1)]));
        assert_eq!(
            *duty.borrow(),
            Duty {
                folds: true,
                alone: false
            }
        );
        let all: Vec<_> = (0..6).map(|p| ("a", p)).collect();
        role.holds(&held(&all));
        assert_eq!(
            *duty.borrow(),
            Duty {
                folds: true,
                alone: true
            }
        );
    }
}
