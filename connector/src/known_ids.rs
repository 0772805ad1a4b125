//! Node ids kept in memory between folds, per node table and table version,
//! so an edge fold asks "does this endpoint exist?" of a hash set instead
//! of scanning the node table's `id` column (about 40–80 ns per committed
//! row: 0.4–0.8 s at 10M nodes, every fold).
//!
//! A Lance table version never changes, so a set is exact for the version
//! it is filed under. The fold fills it from its one scan on a miss, and
//! moves it forward by the ids it wrote itself, only when every Lance commit
//! in between is its own (`fold::execute`). Anything else (another writer,
//! a rebase, a restart) is a miss, and a scan refills it.
//!
//! Ids are kept as 128-bit digests (two foldhash hashes under random
//! per-process seeds), ~20–40 bytes per id in memory. A false "exists"
//! needs two ids to collide on 128 bits: about 1e-27 per fold at 10M nodes
//! and 40k endpoints. `fold.known_ids_max` bounds the ids held in total;
//! a table past it is scanned every fold instead (docs/fold-size.md).
//!
//! Under partition sharding each id also keeps its row's source partition
//! (its "home", ~40–70 bytes per id), so a fold can refuse a row that
//! arrives on another partition than its committed row came from
//! (`shard_conflict`) without a scan.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};

type Hasher = foldhash::fast::RandomState;

/// The ids of one node table at one version.
#[derive(Debug, Clone)]
pub(crate) enum IdSet {
    /// Bucket sharding: membership only.
    Plain(HashSet<u128, Hasher>),
    /// Partition sharding: each id's source partition.
    Homed(HashMap<u128, u32, Hasher>),
}

impl IdSet {
    pub fn len(&self) -> usize {
        match self {
            IdSet::Plain(s) => s.len(),
            IdSet::Homed(m) => m.len(),
        }
    }

    pub fn is_homed(&self) -> bool {
        matches!(self, IdSet::Homed(_))
    }

    fn has(&self, d: u128) -> bool {
        match self {
            IdSet::Plain(s) => s.contains(&d),
            IdSet::Homed(m) => m.contains_key(&d),
        }
    }

    fn put(&mut self, d: u128, home: Option<u32>) {
        match self {
            IdSet::Plain(s) => {
                s.insert(d);
            }
            IdSet::Homed(m) => {
                m.insert(d, home.unwrap_or_default());
            }
        }
    }

    fn take(&mut self, d: u128) {
        match self {
            IdSet::Plain(s) => {
                s.remove(&d);
            }
            IdSet::Homed(m) => {
                m.remove(&d);
            }
        }
    }
}

/// What the fold knows of each node table's ids, one version per table.
#[derive(Debug)]
pub(crate) struct KnownIds {
    /// Most ids held over all tables.
    max: usize,
    seeds: (foldhash::fast::FixedState, foldhash::fast::FixedState),
    tables: Mutex<HashMap<String, (u64, Arc<IdSet>)>>,
}

impl KnownIds {
    pub fn new(max: usize) -> KnownIds {
        let random = std::collections::hash_map::RandomState::new();
        KnownIds {
            max,
            seeds: (
                foldhash::fast::FixedState::with_seed(random.hash_one(1u8)),
                foldhash::fast::FixedState::with_seed(random.hash_one(2u8)),
            ),
            tables: Mutex::new(HashMap::new()),
        }
    }

    fn digest(&self, id: &str) -> u128 {
        (u128::from(self.seeds.0.hash_one(id)) << 64) | u128::from(self.seeds.1.hash_one(id))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u64, Arc<IdSet>)>> {
        // A panic while holding the lock leaves a map of whole entries.
        self.tables.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The ids of `table` at `version`, if known.
    pub fn at(&self, table: &str, version: u64) -> Option<Arc<IdSet>> {
        let t = self.lock();
        t.get(table)
            .filter(|(v, _)| *v == version)
            .map(|(_, s)| s.clone())
    }

    pub fn contains(&self, set: &IdSet, id: &str) -> bool {
        set.has(self.digest(id))
    }

    /// The partition `id`'s row came from, if `set` keeps homes and has it.
    pub fn home(&self, set: &IdSet, id: &str) -> Option<u32> {
        match set {
            IdSet::Homed(m) => m.get(&self.digest(id)).copied(),
            IdSet::Plain(_) => None,
        }
    }

    /// A set being filled by a scan of `table` that holds `rows` rows,
    /// keeping each id's partition when `homed`; `None` when keeping it
    /// would pass `known_ids_max`.
    pub fn filling(&self, table: &str, rows: usize, homed: bool) -> Option<IdSet> {
        let held: usize = self
            .lock()
            .iter()
            .filter(|(t, _)| t.as_str() != table)
            .map(|(_, (_, s))| s.len())
            .sum();
        (held + rows <= self.max).then(|| {
            let hasher = Hasher::default();
            if homed {
                IdSet::Homed(HashMap::with_capacity_and_hasher(rows, hasher))
            } else {
                IdSet::Plain(HashSet::with_capacity_and_hasher(rows, hasher))
            }
        })
    }

    /// Adds `id` (with its partition, kept by a homed set).
    pub fn add(&self, set: &mut IdSet, id: &str, home: Option<u32>) {
        set.put(self.digest(id), home);
    }

    /// Files `set` as the ids of `table` at `version`.
    pub fn keep(&self, table: &str, version: u64, set: IdSet) {
        self.lock()
            .insert(table.to_string(), (version, Arc::new(set)));
    }

    /// Moves `table`'s set from version `from` to `to` by ids added (with
    /// their partitions) and removed; forgets it when it is not at `from`.
    pub fn advance<'a>(
        &self,
        table: &str,
        from: u64,
        to: u64,
        added: impl Iterator<Item = (&'a str, Option<u32>)>,
        removed: impl Iterator<Item = &'a str>,
    ) {
        let Some((v, set)) = self.lock().remove(table) else {
            return;
        };
        if v != from {
            return;
        }
        let mut set = Arc::unwrap_or_clone(set);
        for id in removed {
            set.take(self.digest(id));
        }
        for (id, home) in added {
            set.put(self.digest(id), home);
        }
        self.keep(table, to, set);
    }

    /// The version and size of `table`'s set, if any.
    pub fn held(&self, table: &str) -> Option<(u64, usize)> {
        self.lock().get(table).map(|(v, s)| (*v, s.len()))
    }

    /// Forgets what is known of `table`.
    pub fn forget(&self, table: &str) {
        self.lock().remove(table);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_is_found_only_at_its_version_and_moves_forward_exactly() {
        let k = KnownIds::new(10);
        let mut s = k.filling("nodes/A", 3, false).expect("under the bound");
        for id in ["a", "b", "c"] {
            k.add(&mut s, id, None);
        }
        k.keep("nodes/A", 4, s);
        assert!(k.at("nodes/A", 3).is_none());
        let s = k.at("nodes/A", 4).expect("kept");
        assert!(k.contains(&s, "b") && !k.contains(&s, "d"));
        assert_eq!(k.home(&s, "b"), None, "a plain set keeps no partition");
        k.advance(
            "nodes/A",
            4,
            6,
            [("d", None)].into_iter(),
            ["b"].into_iter(),
        );
        assert!(k.at("nodes/A", 4).is_none());
        let s = k.at("nodes/A", 6).expect("advanced");
        assert!(k.contains(&s, "d") && !k.contains(&s, "b") && k.contains(&s, "a"));
        // Not at the version the fold read: forgotten, not patched.
        k.advance(
            "nodes/A",
            4,
            9,
            [("e", None)].into_iter(),
            std::iter::empty(),
        );
        assert!(k.at("nodes/A", 6).is_none() && k.at("nodes/A", 9).is_none());
    }

    #[test]
    fn a_homed_set_keeps_each_ids_partition_and_moves_it_forward() {
        let k = KnownIds::new(10);
        let mut s = k.filling("nodes/A", 2, true).expect("under the bound");
        k.add(&mut s, "a", Some(1));
        k.add(&mut s, "b", Some(3));
        assert!(s.is_homed());
        k.keep("nodes/A", 1, s);
        let s = k.at("nodes/A", 1).unwrap();
        assert_eq!(
            (k.home(&s, "a"), k.home(&s, "b"), k.home(&s, "c")),
            (Some(1), Some(3), None)
        );
        // A fold rewrote a from partition 1 and added c from 2; b deleted.
        k.advance(
            "nodes/A",
            1,
            2,
            [("a", Some(1)), ("c", Some(2))].into_iter(),
            ["b"].into_iter(),
        );
        let s = k.at("nodes/A", 2).unwrap();
        assert_eq!(
            (k.home(&s, "a"), k.home(&s, "b"), k.home(&s, "c")),
            (Some(1), None, Some(2))
        );
        assert!(k.contains(&s, "c") && !k.contains(&s, "b"));
    }

    #[test]
    fn the_bound_counts_the_ids_of_every_other_table() {
        let k = KnownIds::new(5);
        let mut s = k.filling("nodes/A", 3, false).expect("3 ≤ 5");
        k.add(&mut s, "a", None);
        k.add(&mut s, "b", None);
        k.add(&mut s, "c", None);
        k.keep("nodes/A", 1, s);
        assert!(k.filling("nodes/B", 3, false).is_none(), "3 + 3 > 5");
        assert!(k.filling("nodes/B", 2, true).is_some());
        assert!(
            k.filling("nodes/A", 5, false).is_some(),
            "its own set is replaced"
        );
    }
}
