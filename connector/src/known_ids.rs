//! Table ids kept in memory between folds, per table and table version,
//! each with its row's address, so a fold neither scans a table's `id`
//! column to ask "does this endpoint exist?" (about 40–80 ns per committed
//! row: 0.4–0.8 s at 10M nodes, every fold) nor lets Lance's merge-insert
//! hash-join every key of the table to find the rows it replaces: it
//! deletes them by address (`fold::write`, docs/decisions/0004-fold-size.md).
//!
//! A Lance table version never changes, so a set is exact for the version
//! it is filed under. The fold fills it from one scan (`fold::keys`) on a
//! miss, and moves it forward by its own write when that is the table's
//! one commit since (`fold::write`). Anything else (another writer, a
//! compaction, a merge-insert, a restart) is a miss, and a scan refills it.
//! The write also reads back the ids at the addresses it deletes, so a set
//! that drifted from its table is caught, never trusted.
//!
//! Ids are kept as 128-bit digests (two foldhash hashes under random
//! per-process seeds) with a 64-bit row address: ~28–55 bytes per id in
//! memory. A false "exists" needs two ids to collide on 128 bits: about
//! 1e-27 per fold at 10M nodes and 40k endpoints. `fold.known_ids_max`
//! bounds the ids held in total; a table past it is scanned every fold
//! instead, and written by merge-insert (docs/decisions/0004-fold-size.md).
//!
//! Under partition sharding each node id also keeps its row's source
//! partition (its "home", ~37–74 bytes per id), so a fold can refuse a row
//! that arrives on another partition than its committed row came from
//! (`shard_conflict`) without a scan.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};

pub(crate) type Hasher = foldhash::fast::RandomState;
/// Two 64-bit hashes: 8-byte aligned, so an entry with its row address
/// takes 24 bytes (a `u128` key would pad it to 32).
type Digest = (u64, u64);

/// What a set keeps with each id besides its row's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Nothing more.
    Plain,
    /// Its row's source partition: node tables under partition sharding.
    Homed,
    /// A hash of its row's `src`: edge tables with `@card` or `@unique`,
    /// whose checks read the committed edges of the fold's `src`s.
    Sourced,
}

/// The ids of one table at one version, each with its row's address
/// (fragment id << 32 | offset) at that version, so a fold can replace or
/// delete the row without scanning the table's keys (`fold::write`).
#[derive(Debug, Clone)]
pub(crate) enum IdSet {
    Plain(HashMap<Digest, u64, Hasher>),
    /// Homed or Sourced: (address, tag). A `u32` partition would take as
    /// much room as a `u64` tag, for alignment.
    Tagged(Kind, HashMap<Digest, (u64, u64), Hasher>),
}

impl IdSet {
    pub(crate) fn len(&self) -> usize {
        match self {
            IdSet::Plain(s) => s.len(),
            IdSet::Tagged(_, m) => m.len(),
        }
    }

    pub(crate) fn kind(&self) -> Kind {
        match self {
            IdSet::Plain(_) => Kind::Plain,
            IdSet::Tagged(k, _) => *k,
        }
    }

    pub(crate) fn is_homed(&self) -> bool {
        self.kind() == Kind::Homed
    }

    fn addr(&self, d: Digest) -> Option<u64> {
        match self {
            IdSet::Plain(s) => s.get(&d).copied(),
            IdSet::Tagged(_, m) => m.get(&d).map(|(a, _)| *a),
        }
    }

    fn put(&mut self, d: Digest, tag: u64, addr: u64) {
        match self {
            IdSet::Plain(s) => {
                s.insert(d, addr);
            }
            IdSet::Tagged(_, m) => {
                m.insert(d, (addr, tag));
            }
        }
    }

    fn tag_of(&self, d: Digest) -> Option<u64> {
        match self {
            IdSet::Plain(_) => None,
            IdSet::Tagged(_, m) => m.get(&d).map(|(_, t)| *t),
        }
    }

    fn take(&mut self, d: Digest) {
        match self {
            IdSet::Plain(s) => {
                s.remove(&d);
            }
            IdSet::Tagged(_, m) => {
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

/// Bounded by the config's default `fold.known_ids_max` (the default
/// `Policies` folds as a default config would).
impl Default for KnownIds {
    fn default() -> KnownIds {
        KnownIds::new(crate::config::FoldSettings::default().known_ids_max)
    }
}

impl KnownIds {
    pub(crate) fn new(max: usize) -> KnownIds {
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

    fn digest(&self, id: &str) -> Digest {
        (self.seeds.0.hash_one(id), self.seeds.1.hash_one(id))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u64, Arc<IdSet>)>> {
        // A panic while holding the lock leaves a map of whole entries.
        self.tables.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The ids of `table` at `version`, if known.
    pub(crate) fn at(&self, table: &str, version: u64) -> Option<Arc<IdSet>> {
        let t = self.lock();
        t.get(table)
            .filter(|(v, _)| *v == version)
            .map(|(_, s)| s.clone())
    }

    pub(crate) fn contains(&self, set: &IdSet, id: &str) -> bool {
        set.addr(self.digest(id)).is_some()
    }

    /// The address of `id`'s row at the set's version, if `set` has it.
    pub(crate) fn addr(&self, set: &IdSet, id: &str) -> Option<u64> {
        set.addr(self.digest(id))
    }

    /// The partition `id`'s row came from, if `set` keeps homes and has it.
    pub(crate) fn home(&self, set: &IdSet, id: &str) -> Option<u32> {
        set.is_homed()
            .then(|| set.tag_of(self.digest(id)).map(|t| t as u32))
            .flatten()
    }

    /// The tag a Sourced set keeps for a row whose `src` is `src`.
    pub(crate) fn src_tag(&self, src: &str) -> u64 {
        self.seeds.0.hash_one(src)
    }

    /// The addresses of the rows of a Sourced `set` whose `src` tag is in
    /// `tags`: one pass over the set (a superset on a 64-bit collision,
    /// which the caller's checks read past). A bitmap of the tags' low bits,
    /// 64 bits per tag and small enough for the L2 cache, screens out all
    /// but ~1/64 of the other ids before the hash probe (at 10M edges the
    /// pass then takes ~0.05 s; docs/perf/2026-12-05-fold-cost-against-graph-size-rows-replaced-by-address.md, "Repeat runs").
    pub(crate) fn with_src_tags(&self, set: &IdSet, tags: &HashSet<u64, Hasher>) -> Vec<u64> {
        let IdSet::Tagged(Kind::Sourced, m) = set else {
            return Vec::new();
        };
        let bits = (tags.len() * 64)
            .next_power_of_two()
            .clamp(1 << 12, 1 << 23);
        let mask = (bits - 1) as u64;
        let mut screen = vec![0u64; bits / 64];
        for t in tags {
            let b = t & mask;
            screen[(b >> 6) as usize] |= 1 << (b & 63);
        }
        let maybe = |t: u64| {
            let b = t & mask;
            screen[(b >> 6) as usize] & (1 << (b & 63)) != 0
        };
        m.values()
            .filter(|&&(_, t)| maybe(t) && tags.contains(&t))
            .map(|(a, _)| *a)
            .collect()
    }

    /// A set of `kind` being filled by a scan of `table` that holds `rows`
    /// rows; `None` when keeping it would pass `known_ids_max`.
    pub(crate) fn filling(&self, table: &str, rows: usize, kind: Kind) -> Option<IdSet> {
        let held: usize = self
            .lock()
            .iter()
            .filter(|(t, _)| t.as_str() != table)
            .map(|(_, (_, s))| s.len())
            .sum();
        (held + rows <= self.max).then(|| {
            let hasher = Hasher::default();
            match kind {
                Kind::Plain => IdSet::Plain(HashMap::with_capacity_and_hasher(rows, hasher)),
                k => IdSet::Tagged(k, HashMap::with_capacity_and_hasher(rows, hasher)),
            }
        })
    }

    /// Adds `id` with its row's address and its tag (kept by a Tagged set).
    pub(crate) fn add(&self, set: &mut IdSet, id: &str, tag: u64, addr: u64) {
        set.put(self.digest(id), tag, addr);
    }

    /// Files `set` as the ids of `table` at `version`.
    pub(crate) fn keep(&self, table: &str, version: u64, set: IdSet) {
        self.lock()
            .insert(table.to_string(), (version, Arc::new(set)));
    }

    /// Moves `table`'s set from version `from` to `to` by ids added (with
    /// their tags and new row addresses) and removed; forgets it when
    /// it is not at `from`, or when it grew past `known_ids_max`.
    pub(crate) fn advance<'a>(
        &self,
        table: &str,
        from: u64,
        to: u64,
        added: impl Iterator<Item = (&'a str, u64, u64)>,
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
        for (id, tag, addr) in added {
            set.put(self.digest(id), tag, addr);
        }
        // Grown past the bound: dropped, as a scan would not have kept it.
        let mut t = self.lock();
        let others: usize = t.values().map(|(_, s)| s.len()).sum();
        if others + set.len() <= self.max {
            t.insert(table.to_string(), (to, Arc::new(set)));
        }
    }

    /// The version and size of `table`'s set, if any.
    pub(crate) fn held(&self, table: &str) -> Option<(u64, usize)> {
        self.lock().get(table).map(|(v, s)| (*v, s.len()))
    }

    /// Swaps the row addresses kept for ids `a` and `b` of `table`: a set
    /// that drifted from its table, which the fold must catch. For tests.
    pub(crate) fn swap_addresses(&self, table: &str, a: &str, b: &str) {
        let (da, db) = (self.digest(a), self.digest(b));
        let mut t = self.lock();
        let Some((_, set)) = t.get_mut(table) else {
            return;
        };
        let set = Arc::make_mut(set);
        if let (Some(x), Some(y)) = (set.addr(da), set.addr(db)) {
            let (ta, tb) = (set.tag_of(da), set.tag_of(db));
            set.put(da, ta.unwrap_or_default(), y);
            set.put(db, tb.unwrap_or_default(), x);
        }
    }

    /// Forgets what is known of `table`.
    pub(crate) fn forget(&self, table: &str) {
        self.lock().remove(table);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_is_found_only_at_its_version_and_moves_forward_exactly() {
        let k = KnownIds::new(10);
        let mut s = k
            .filling("nodes/A", 3, Kind::Plain)
            .expect("under the bound");
        for id in ["a", "b", "c"] {
            k.add(&mut s, id, 0, 7);
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
            [("d", 0, 9)].into_iter(),
            ["b"].into_iter(),
        );
        assert!(k.at("nodes/A", 4).is_none());
        let s = k.at("nodes/A", 6).expect("advanced");
        assert!(k.contains(&s, "d") && !k.contains(&s, "b") && k.contains(&s, "a"));
        assert_eq!((k.addr(&s, "a"), k.addr(&s, "d")), (Some(7), Some(9)));
        // Not at the version the fold read: forgotten, not patched.
        k.advance(
            "nodes/A",
            4,
            9,
            [("e", 0, 9)].into_iter(),
            std::iter::empty(),
        );
        assert!(k.at("nodes/A", 6).is_none() && k.at("nodes/A", 9).is_none());
    }

    #[test]
    fn a_homed_set_keeps_each_ids_partition_and_moves_it_forward() {
        let k = KnownIds::new(10);
        let mut s = k
            .filling("nodes/A", 2, Kind::Homed)
            .expect("under the bound");
        k.add(&mut s, "a", 1, 7);
        k.add(&mut s, "b", 3, 7);
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
            [("a", 1, 11), ("c", 2, 12)].into_iter(),
            ["b"].into_iter(),
        );
        let s = k.at("nodes/A", 2).unwrap();
        assert_eq!(
            (k.home(&s, "a"), k.home(&s, "b"), k.home(&s, "c")),
            (Some(1), None, Some(2))
        );
        assert!(k.contains(&s, "c") && !k.contains(&s, "b"));
        assert_eq!((k.addr(&s, "a"), k.addr(&s, "c")), (Some(11), Some(12)));
    }

    #[test]
    fn the_bound_counts_the_ids_of_every_other_table() {
        let k = KnownIds::new(5);
        let mut s = k.filling("nodes/A", 3, Kind::Plain).expect("3 ≤ 5");
        k.add(&mut s, "a", 0, 7);
        k.add(&mut s, "b", 0, 7);
        k.add(&mut s, "c", 0, 7);
        k.keep("nodes/A", 1, s);
        assert!(k.filling("nodes/B", 3, Kind::Plain).is_none(), "3 + 3 > 5");
        assert!(k.filling("nodes/B", 2, Kind::Homed).is_some());
        assert!(
            k.filling("nodes/A", 5, Kind::Plain).is_some(),
            "its own set is replaced"
        );
        // A fold growing A to 4 ids keeps it (4 ≤ 5); 2 more (6 > 5) drop it.
        k.advance(
            "nodes/A",
            1,
            2,
            [("d", 0, 1)].into_iter(),
            std::iter::empty(),
        );
        assert_eq!(k.held("nodes/A"), Some((2, 4)));
        let ab = [("e", 0, 2), ("f", 0, 3)];
        k.advance("nodes/A", 2, 3, ab.into_iter(), std::iter::empty());
        assert_eq!(k.held("nodes/A"), None, "grown past the bound: dropped");
    }

    #[test]
    fn a_sourced_set_finds_the_rows_of_the_srcs_asked() {
        let k = KnownIds::new(10);
        let mut s = k
            .filling("edges/E", 3, Kind::Sourced)
            .expect("under the bound");
        k.add(&mut s, "e1", k.src_tag("a"), 10);
        k.add(&mut s, "e2", k.src_tag("b"), 11);
        k.add(&mut s, "e3", k.src_tag("a"), 12);
        let tags: HashSet<u64, Hasher> = [k.src_tag("a")].into_iter().collect();
        let mut rows = k.with_src_tags(&s, &tags);
        rows.sort();
        assert_eq!(rows, vec![10, 12]);
        assert_eq!(k.home(&s, "e1"), None, "a src tag is not a partition");
    }

    /// The bitmap screen never drops a row: checked against a plain filter
    /// over enough ids that thousands share their low bits with an asked
    /// tag.
    #[test]
    fn the_tag_screen_keeps_every_row_of_the_srcs_asked() {
        let n = 200_000;
        let k = KnownIds::new(n);
        let mut s = k
            .filling("edges/E", n, Kind::Sourced)
            .expect("under the bound");
        for i in 0..n {
            let src = format!("s{}", i % 50_000);
            k.add(&mut s, &format!("e{i}"), k.src_tag(&src), i as u64);
        }
        let tags: HashSet<u64, Hasher> = (0..50_000)
            .step_by(7)
            .map(|j| k.src_tag(&format!("s{j}")))
            .collect();
        let mut got = k.with_src_tags(&s, &tags);
        got.sort();
        let want: Vec<u64> = (0..n as u64).filter(|i| (i % 50_000) % 7 == 0).collect();
        assert_eq!(got, want);
    }
}
