use std::collections::{BTreeMap, BTreeSet};

use super::storage::{kind_of, Kind};
use super::versions::{doomed as doomed_versions, plan, Keep};
use super::wal::{doomed, parse, WalFile};
use super::*;
use crate::graph::GraphCommit;

fn wal(position: u64, landed: bool) -> WalFile {
    WalFile {
        position,
        landed,
        size: 1,
    }
}

fn name(position: u64) -> String {
    format!("{:064b}.arrow", position.reverse_bits())
}

#[test]
fn wal_names_parse_as_lance_writes_them() {
    assert_eq!(
        parse(&name(5), 7),
        Some(wal(5, true)).map(|w| WalFile { size: 7, ..w })
    );
    let staging = format!("{}.tmp.0123abcd", name(9));
    assert_eq!(parse(&staging, 1), Some(wal(9, false)));
    assert_eq!(parse("version_hint.json", 1), None);
    assert_eq!(parse(&format!("{}.arrow", "2".repeat(64)), 1), None);
}

#[test]
fn wal_below_the_mark_goes_and_the_newest_entry_always_stays() {
    let files = vec![wal(1, true), wal(2, true), wal(3, true), wal(4, true)];
    // Mark 3: entries 1 and 2 are covered; 3 and 4 are replayed.
    assert_eq!(doomed(&files, 3), vec![0, 1]);
    // Every entry below the mark: the newest stays anyway.
    assert_eq!(doomed(&files, 10), vec![0, 1, 2]);
    // A staging file above the newest landed entry does not count as it.
    let files = vec![wal(1, true), wal(2, true), wal(3, false)];
    assert_eq!(doomed(&files, 10), vec![0, 2]);
    // Nothing folded yet: nothing goes.
    assert!(doomed(&files, 0).is_empty());
    assert!(doomed(&[], 5).is_empty());
}

#[test]
fn generation_dirs_parse_and_others_do_not() {
    assert_eq!(generations::parse_generation("d574949e_gen_12"), Some(12));
    assert_eq!(generations::parse_generation("d574949e_gen_"), None);
    assert_eq!(generations::parse_generation("manifest"), None);
    assert_eq!(generations::parse_generation("xyz_gen_1"), None);
    assert_eq!(generations::parse_generation("d574949e_gen_1x"), None);
}

#[test]
fn storage_kinds_follow_memwal_layout() {
    let s = "6a1f0000-0000-0000-0000-000000000000";
    assert_eq!(kind_of(&format!("_mem_wal/{s}/wal/{}", name(1))), Kind::Wal);
    assert_eq!(
        kind_of(&format!("_mem_wal/{s}/manifest/x.binpb")),
        Kind::Wal
    );
    assert_eq!(
        kind_of(&format!("_mem_wal/{s}/d574949e_gen_3/data/a.lance")),
        Kind::Generation
    );
    assert_eq!(kind_of("data/a.lance"), Kind::Dataset);
    assert_eq!(kind_of("_versions/1.manifest"), Kind::Dataset);
}

fn commit(seq: u64, created_at: i64, pins: &[(&str, u64)]) -> GraphCommit {
    GraphCommit {
        id: format!("c{seq}"),
        seq,
        parent: None,
        actor: "t".into(),
        created_at,
        tables: pins.iter().map(|(t, v)| (t.to_string(), *v)).collect(),
        folded: vec![],
        offsets: vec![],
        stats: BTreeMap::new(),
        dead_letters_delivered: 0,
        folder: None,
        dead_letter_since: Default::default(),
        schema_version: 0,
        schema_change: None,
    }
}

#[test]
fn the_window_keeps_the_union_of_newest_and_young_and_the_head() {
    let commits: Vec<_> = (0..6).map(|s| commit(s, 1000 * s as i64, &[])).collect();
    let head = &commits[5];
    let seqs = |w: Window, now| {
        let (keep, gone) = w.retained(head, &commits, now);
        (keep.iter().map(|c| c.seq).collect::<Vec<_>>(), gone)
    };
    let by_count = Window {
        keep_commits: 2,
        keep_for_ms: 0,
    };
    assert_eq!(seqs(by_count, 1_000_000), (vec![5, 4], 4));
    let by_age = Window {
        keep_commits: 1,
        keep_for_ms: 2500,
    };
    // now 5000: commits created at 2500 or later (seq 3, 4, 5).
    assert_eq!(seqs(by_age, 5000), (vec![5, 4, 3], 3));
    let both = Window {
        keep_commits: 4,
        keep_for_ms: 500,
    };
    assert_eq!(seqs(both, 5000), (vec![5, 4, 3, 2], 2));
    // The head stays even when the clock says everything is old.
    let (keep, _) = by_count.retained(head, &commits[..], i64::MAX);
    assert!(keep.iter().any(|c| c.id == head.id));
}

fn version(v: u64, ms: i64) -> lance::dataset::Version {
    lance::dataset::Version {
        version: v,
        timestamp: chrono::DateTime::from_timestamp_millis(ms).unwrap(),
        metadata: Default::default(),
    }
}

#[test]
fn versions_keep_the_pins_and_everything_from_the_head_up() {
    let head = commit(3, 3000, &[("nodes/A", 9)]);
    let old = commit(1, 1000, &[("nodes/A", 4)]);
    let p = plan(&head, &[&head, &old]);
    assert_eq!(
        p["nodes/A"],
        Keep::Pinned {
            floor: 9,
            pinned: BTreeSet::from([4, 9])
        }
    );
    assert_eq!(p[MANIFEST_TABLE], Keep::Since(1000));
    let versions: Vec<_> = (1..=11).map(|v| version(v, v as i64 * 100)).collect();
    let mut gone: Vec<_> = doomed_versions(&versions, 11, &p["nodes/A"])
        .into_iter()
        .collect();
    gone.sort();
    // 9 (the head's pin), 10 (an unpublished fold) and 11 (latest) stay, and 4.
    assert_eq!(gone, vec![1, 2, 3, 5, 6, 7, 8]);
    let mut gone: Vec<_> = doomed_versions(&versions, 11, &Keep::Since(500))
        .into_iter()
        .collect();
    gone.sort();
    assert_eq!(gone, vec![1, 2, 3, 4]);
    // The latest survives any rule.
    assert!(doomed_versions(&versions[10..], 11, &Keep::Since(i64::MAX)).is_empty());
}

#[test]
fn the_fold_loop_collects_at_once_then_once_per_interval() {
    let t0 = std::time::Instant::now();
    let minute = Duration::from_secs(60);
    assert!(due(None, minute, t0));
    assert!(!due(Some(t0), minute, t0 + Duration::from_secs(59)));
    assert!(due(Some(t0), minute, t0 + minute));
    // `0s`: after every publish.
    assert!(due(Some(t0), Duration::ZERO, t0));
}

#[test]
fn a_scheduler_exists_only_when_retention_is_enabled() {
    let mut s = RetentionSettings::default();
    assert!(Scheduled::new(&s, Default::default()).is_some());
    s.enabled = false;
    assert!(Scheduled::new(&s, Default::default()).is_none());
}
