//! Retention: what `graphsink gc` and the fold loop delete, that a restart
//! after it replays and reads everything back, that retained commits stay
//! readable and expired ones say so, crashes at every GC step, and that
//! storage stops growing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use graphsink::testing::{self, RecordDecoder, ShardPool, SourceRecord, Window, WrittenSpans};
use graphsink::{Graph, GraphCommit, GraphSchema};
use lance::dataset::mem_wal::ShardManifestStore;
use lance_index::mem_wal::ShardManifest;
use serde_json::{json, Value};

use crate::harness::*;

const PERSON: &str = "nodes/Person";

async fn open_graph(tg: &TestGraph) -> Graph {
    let config = tg.config();
    let schema = GraphSchema::load(&config.schema_path()).unwrap();
    Graph::open_or_init(&config, schema).await.unwrap()
}

/// Writes `values` as one poll of Person records from `offset` on and waits
/// until they are durable (acked).
async fn write(
    pool: &ShardPool,
    decoder: &mut RecordDecoder,
    topic: &str,
    offset: i64,
    values: &[Value],
) {
    let texts: Vec<String> = values.iter().map(Value::to_string).collect();
    let recs: Vec<SourceRecord<'_>> = texts
        .iter()
        .enumerate()
        .map(|(i, v)| SourceRecord {
            topic,
            partition: 0,
            offset: offset + i as i64,
            timestamp: None,
            key: None,
            value: Some(v.as_bytes()),
            message: None,
        })
        .collect();
    let decoded = decoder.decode(&recs).unwrap();
    for w in pool.tables[PERSON]
        .put(decoded.upserts.unwrap())
        .await
        .unwrap()
    {
        w.wait().await.unwrap();
    }
}

fn person(name: &str, age: i32) -> Value {
    json!({"name": name, "age": age})
}

/// Flushes every live memtable to a generation (what a fold's cut does)
/// and returns each shard's limit, without folding.
pub(crate) async fn flush(pool: &ShardPool) -> std::collections::HashMap<uuid::Uuid, u64> {
    let mut limits = std::collections::HashMap::new();
    for f in pool.freeze_all().await.unwrap() {
        limits.insert(f.shard, f.upto_generation);
        f.fence.wait().await.unwrap();
    }
    limits
}

/// One fold as the fold loop makes it: cut, flush, plan, execute.
pub(crate) async fn fold(g: &Graph, pool: &ShardPool) -> GraphCommit {
    let limits = flush(pool).await;
    let policies = testing::Policies::default();
    let head = g.head().await.unwrap();
    let plan = testing::plan(
        g,
        &policies,
        &head,
        &Some(limits),
        &WrittenSpans::default(),
        "test",
    )
    .await
    .unwrap()
    .expect("something to fold");
    testing::execute(g, &policies, &plan).await.unwrap().commit
}

/// `_mem_wal/<shard>/` of a table and its store, as graphsink reaches them.
async fn shard_dir(
    g: &Graph,
    table: &str,
    bucket: u32,
) -> (
    std::sync::Arc<lance::io::ObjectStore>,
    object_store::path::Path,
) {
    let ds = g.open_table(table, None).await.unwrap();
    let store = ds.object_store(None).await.unwrap();
    let shard = testing::shard_id(table, bucket).to_string();
    let dir = ds
        .branch_location()
        .path
        .join("_mem_wal")
        .join(shard.as_str());
    (store, dir)
}

/// Files under `_mem_wal/<shard>/`, by path below it, listed through the
/// graph's object store (so the same test runs on an `s3://` root).
async fn shard_files(
    g: &Graph,
    table: &str,
    bucket: u32,
) -> Vec<(String, object_store::path::Path)> {
    use futures::TryStreamExt;
    let (store, dir) = shard_dir(g, table, bucket).await;
    let listed: Vec<_> = store.list(Some(dir.clone())).try_collect().await.unwrap();
    listed
        .into_iter()
        .map(|m| {
            let rel: Vec<String> = m
                .location
                .prefix_match(&dir)
                .unwrap()
                .map(|p| p.as_ref().to_string())
                .collect();
            (rel.join("/"), m.location)
        })
        .collect()
}

/// WAL positions of landed entries.
async fn wal_positions(g: &Graph, table: &str, bucket: u32) -> BTreeSet<u64> {
    shard_files(g, table, bucket)
        .await
        .into_iter()
        .filter_map(|(rel, _)| {
            let stem = rel.strip_prefix("wal/")?.strip_suffix(".arrow")?;
            Some(u64::from_str_radix(stem, 2).ok()?.reverse_bits())
        })
        .collect()
}

/// Generations with files on storage.
async fn generation_dirs(g: &Graph, table: &str, bucket: u32) -> BTreeSet<u64> {
    shard_files(g, table, bucket)
        .await
        .into_iter()
        .filter_map(|(rel, _)| {
            let first = rel.split('/').next()?;
            first.split_once("_gen_")?.1.parse().ok()
        })
        .collect()
}

async fn shard_manifest(g: &Graph, table: &str, bucket: u32) -> ShardManifest {
    let ds = g.open_table(table, None).await.unwrap();
    let store = ds.object_store(None).await.unwrap();
    ShardManifestStore::new(
        store,
        &ds.branch_location().path,
        testing::shard_id(table, bucket),
        2,
    )
    .latest()
    .await
    .unwrap()
    .expect("a shard manifest")
}

fn ages(rows: &BTreeMap<String, Value>) -> BTreeMap<String, i64> {
    rows.iter()
        .map(|(k, v)| (k.clone(), v["age"].as_i64().unwrap()))
        .collect()
}

/// GC deletes the WAL below the replay mark but keeps the newest entry;
/// a crash after it, a restart, more acked rows, a second crash and
/// restart still replay every acked row that was never flushed.
async fn gc_keeps_the_newest_wal_entry_and_replay_finds_every_acked_row(backend: Backend) {
    crate::init_logs();
    let tg = TestGraph::on(
        backend,
        SCHEMA,
        &["node = \"Person\""],
        "[wal]\nbuckets = 1\n[retention]\nkeep_commits = 1\nkeep_for = \"0s\"",
    );
    let cfg = tg.config();
    let topic = tg.topics[0].clone();
    let g = open_graph(&tg).await;
    let pool = ShardPool::open(&g, &cfg.wal, &g.wal_tables())
        .await
        .unwrap();
    let mut dec = RecordDecoder::new(g.schema(), &cfg.mappings[0], 64, 1 << 20).unwrap();
    let mut want = BTreeMap::new();
    for i in 0..4 {
        let v = [person(&format!("p{i}"), i), person("p0", 100 + i)];
        write(&pool, &mut dec, &topic, 2 * i as i64, &v).await;
        want.insert(format!("p{i}"), i as i64);
        want.insert("p0".to_string(), 100 + i as i64);
    }
    fold(&g, &pool).await;
    // Acked after the fold's cut, never flushed: only the WAL has them.
    write(&pool, &mut dec, &topic, 8, &[person("p0", 999)]).await;
    write(&pool, &mut dec, &topic, 9, &[person("p9", 9)]).await;
    want.insert("p0".into(), 999);
    want.insert("p9".into(), 9);

    let before = wal_positions(&g, PERSON, 0).await;
    let mark = shard_manifest(&g, PERSON, 0)
        .await
        .replay_after_wal_entry_position;
    let below: Vec<u64> = before.iter().copied().filter(|&p| p < mark).collect();
    assert!(
        below.len() >= 2,
        "WAL {before:?}, mark {mark}: little to collect"
    );
    let report = graphsink::gc(&cfg, false).await.unwrap();
    let after = wal_positions(&g, PERSON, 0).await;
    assert_eq!(report.tables[PERSON].wal.count, below.len() as u64);
    assert_eq!(
        after,
        before.iter().copied().filter(|&p| p >= mark).collect(),
        "mark {mark}"
    );
    assert!(after.contains(before.last().unwrap()), "the newest stays");
    assert!(report.tables[PERSON].generations.count >= 1);
    assert!(report.tables[PERSON].trimmed >= 1);
    let marker = shard_manifest(&g, PERSON, 0).await;
    assert!(
        marker.sstables.is_empty(),
        "the folded generation is trimmed: {:?}",
        marker.sstables
    );
    assert!(generation_dirs(&g, PERSON, 0).await.is_empty());

    // Crash (no close, no flush), restart, ack more, crash, restart.
    drop(pool);
    let pool = ShardPool::open(&g, &cfg.wal, &g.wal_tables())
        .await
        .unwrap();
    write(&pool, &mut dec, &topic, 10, &[person("p10", 10)]).await;
    want.insert("p10".into(), 10);
    drop(pool);
    let pool = ShardPool::open(&g, &cfg.wal, &g.wal_tables())
        .await
        .unwrap();
    fold(&g, &pool).await;
    pool.close().await.unwrap();
    assert_eq!(ages(&tg.rows(PERSON).await), want);
    // And once more: a GC of a graph with nothing left to fold changes no row.
    graphsink::gc(&cfg, false).await.unwrap();
    assert_eq!(ages(&tg.rows(PERSON).await), want);
}

/// Writer A keeps writing after writer B claimed the shard; returns
/// whether A's row was acked (its WAL write reported durable).
async fn zombie_write(a: &ShardPool, dec: &mut RecordDecoder, topic: &str, offset: i64) -> bool {
    let v = person("zombie", 1).to_string();
    let rec = SourceRecord {
        topic,
        partition: 0,
        offset,
        timestamp: None,
        key: None,
        value: Some(v.as_bytes()),
        message: None,
    };
    let batch = dec.decode(&[rec]).unwrap().upserts.unwrap();
    let Ok(writes) = a.tables[PERSON].put(batch).await else {
        return false;
    };
    for w in writes {
        if w.wait().await.is_err() {
            return false;
        }
    }
    true
}

/// A writer fences its predecessor by putting a sentinel at the WAL tip,
/// the slot the predecessor writes next. Lance finds the tip by listing;
/// this runs `clear` on the WAL after a fold, then lets writer B claim the
/// shard while writer A still writes. Returns whether A's row was acked,
/// and whether it survived B's fold and a restart.
async fn fence_after(
    backend: Backend,
    clear: impl AsyncFnOnce(&TestGraph, &Graph),
) -> (bool, bool) {
    let tg = TestGraph::on(
        backend,
        SCHEMA,
        &["node = \"Person\""],
        "[wal]\nbuckets = 1\n[retention]\nkeep_commits = 1\nkeep_for = \"0s\"",
    );
    let cfg = tg.config();
    let topic = tg.topics[0].clone();
    let g = open_graph(&tg).await;
    let a = ShardPool::open(&g, &cfg.wal, &g.wal_tables())
        .await
        .unwrap();
    let mut dec = RecordDecoder::new(g.schema(), &cfg.mappings[0], 64, 1 << 20).unwrap();
    for i in 0..4 {
        write(&a, &mut dec, &topic, i, &[person(&format!("p{i}"), 1)]).await;
    }
    fold(&g, &a).await;
    clear(&tg, &g).await;
    let b = ShardPool::open(&g, &cfg.wal, &g.wal_tables())
        .await
        .unwrap();
    let acked = zombie_write(&a, &mut dec, &topic, 4).await;
    write(&b, &mut dec, &topic, 5, &[person("b", 1)]).await;
    fold(&g, &b).await;
    drop(a);
    b.close().await.unwrap();
    let c = ShardPool::open(&g, &cfg.wal, &g.wal_tables())
        .await
        .unwrap();
    c.close().await.unwrap();
    let fresh = open_graph(&tg).await;
    let head = fresh.head().await.unwrap();
    let policies = testing::Policies::default();
    if let Some(p) = testing::plan(
        &fresh,
        &policies,
        &head,
        &None,
        &WrittenSpans::default(),
        "t",
    )
    .await
    .unwrap()
    {
        testing::execute(&fresh, &policies, &p).await.unwrap();
    }
    let rows = tg.rows(PERSON).await;
    assert!(rows.contains_key("b"), "{rows:?}");
    (acked, rows.contains_key("zombie"))
}

/// What the keep-the-newest rule guards, checked on Lance itself. With an
/// emptied WAL directory, B's fence sentinel lands at position 1, below
/// the slot A writes next: A is not fenced, acks a row, and B (which has
/// replayed already) never sees it; after B's flush moves the replay mark
/// past it, no restart replays it. An acked row is lost. (B's own appends
/// are fine: Lance starts them after the replay mark.) If Lance ever
/// fences another way, this test fails and the rule can be relaxed.
async fn an_emptied_wal_dir_lets_a_fenced_writer_ack_a_row_that_is_lost(backend: Backend) {
    crate::init_logs();
    let (acked, kept) = fence_after(backend, async |tg, g| {
        let _ = tg;
        let (store, _) = shard_dir(g, PERSON, 0).await;
        for (rel, path) in shard_files(g, PERSON, 0).await {
            if rel.starts_with("wal/") {
                store.delete(&path).await.unwrap();
            }
        }
        assert!(wal_positions(g, PERSON, 0).await.is_empty());
    })
    .await;
    assert!(acked, "the predecessor was fenced after all");
    assert!(!kept, "the acked row came back");
}

/// The same after `graphsink gc`: the newest entry stays, B's sentinel
/// takes A's next slot, and A's write fails as fenced instead of acking.
async fn after_gc_a_new_writer_still_fences_the_old_one(backend: Backend) {
    crate::init_logs();
    let (acked, kept) = fence_after(backend, async |tg, g| {
        let report = graphsink::gc(&tg.config(), false).await.unwrap();
        assert!(report.tables[PERSON].wal.count > 0, "{report:?}");
        assert!(!wal_positions(g, PERSON, 0).await.is_empty());
    })
    .await;
    assert!(!acked, "the fenced writer acked a row");
    assert!(!kept);
}

/// Trimming a shard manifest never fences its writer: through the live
/// writer's own store, and by compare-and-swap from `graphsink gc` while
/// the writer runs. The writer's next flush builds on the trimmed list,
/// and a writer fenced by a newer one leaves its shard untouched.
async fn trims_keep_the_writer_working_and_its_next_flush_keeps_them(backend: Backend) {
    crate::init_logs();
    let tg = TestGraph::on(
        backend,
        SCHEMA,
        &["node = \"Person\""],
        "[wal]\nbuckets = 1\n[retention]\nkeep_commits = 1\nkeep_for = \"0s\"",
    );
    let cfg = tg.config();
    let topic = tg.topics[0].clone();
    let g = open_graph(&tg).await;
    let window = Window {
        keep_commits: 1,
        keep_for_ms: 0,
    };
    let pool = ShardPool::open(&g, &cfg.wal, &g.wal_tables())
        .await
        .unwrap();
    let mut dec = RecordDecoder::new(g.schema(), &cfg.mappings[0], 64, 1 << 20).unwrap();
    write(&pool, &mut dec, &topic, 0, &[person("a", 1)]).await;
    fold(&g, &pool).await;
    // Through the writer's own store (what the fold loop does).
    let r = testing::collect_garbage(&g, &window, &pool).await.unwrap();
    assert_eq!(r.tables[PERSON].trimmed, 1);
    write(&pool, &mut dec, &topic, 1, &[person("b", 2)]).await;
    let c2 = fold(&g, &pool).await;
    // A flushed generation nobody folded yet (above every marker).
    write(&pool, &mut dec, &topic, 2, &[person("c", 3)]).await;
    for f in pool.freeze_all().await.unwrap() {
        f.fence.wait().await.unwrap();
    }
    let unfolded = shard_manifest(&g, PERSON, 0).await.current_generation - 1;
    let folded = c2.folded[0].upto_generation;
    assert!(unfolded > folded);

    // From outside, while the writer lives: a CAS at the stored epoch.
    let r = graphsink::gc(&cfg, false).await.unwrap();
    assert_eq!(r.tables[PERSON].trimmed, 1, "{r:?}");
    let m = shard_manifest(&g, PERSON, 0).await;
    let gens: Vec<u64> = m.sstables.iter().map(|s| s.generation).collect();
    assert_eq!(gens, vec![unfolded]);
    assert_eq!(
        generation_dirs(&g, PERSON, 0).await,
        BTreeSet::from([unfolded]),
        "folded generations are gone, the unfolded one stays"
    );
    // The writer still writes, and its next flush keeps the trim.
    write(&pool, &mut dec, &topic, 3, &[person("d", 4)]).await;
    let c3 = fold(&g, &pool).await;
    let m = shard_manifest(&g, PERSON, 0).await;
    let gens: Vec<u64> = m.sstables.iter().map(|s| s.generation).collect();
    assert_eq!(
        gens,
        vec![unfolded, unfolded + 1],
        "epoch {}",
        m.writer_epoch
    );
    assert_eq!(c3.folded[0].upto_generation, unfolded + 1);

    // A newer writer fences this one: its store no longer trims, and the
    // shard's directories stay until a run that can trim.
    let newer = ShardPool::open(&g, &cfg.wal, &g.wal_tables())
        .await
        .unwrap();
    let r = testing::collect_garbage(&g, &window, &pool).await.unwrap();
    assert_eq!(r.tables[PERSON].trimmed, 0, "{r:?}");
    assert_eq!(r.tables[PERSON].generations.count, 0, "{r:?}");
    assert!(generation_dirs(&g, PERSON, 0).await.contains(&unfolded));
    let r = testing::collect_garbage(&g, &window, &newer).await.unwrap();
    assert_eq!(r.tables[PERSON].trimmed, 2, "{r:?}");
    assert!(generation_dirs(&g, PERSON, 0).await.is_empty());
    drop(pool);
    newer.close().await.unwrap();
    let rows = ages(&tg.rows(PERSON).await);
    assert_eq!(
        rows,
        BTreeMap::from([
            ("a".into(), 1),
            ("b".into(), 2),
            ("c".into(), 3),
            ("d".into(), 4)
        ])
    );
}

/// Old versions follow the window: the commits inside it stay readable by
/// `show --commit` and by a plain Lance reader at the pinned version;
/// one outside it is a typed, clear error. A dry run deletes nothing and
/// reports exactly what the real run then deletes.
async fn retained_commits_stay_readable_and_expired_ones_say_so(backend: Backend) {
    crate::init_logs();
    let tg = TestGraph::on(
        backend,
        SCHEMA,
        &["node = \"Person\""],
        "[wal]\nbuckets = 2\n[retention]\nenabled = false\nkeep_commits = 2\nkeep_for = \"0s\"",
    );
    let cfg = tg.config();
    let topic = tg.topics[0].clone();
    let g = open_graph(&tg).await;
    let pool = ShardPool::open(&g, &cfg.wal, &g.wal_tables())
        .await
        .unwrap();
    let mut dec = RecordDecoder::new(g.schema(), &cfg.mappings[0], 64, 1 << 20).unwrap();
    let mut commits = vec![g.head().await.unwrap()];
    for i in 0..5 {
        let v: Vec<Value> = (0..6)
            .map(|k| person(&format!("k{k}"), i * 10 + k))
            .collect();
        write(&pool, &mut dec, &topic, i as i64 * 6, &v).await;
        commits.push(fold(&g, &pool).await);
    }
    pool.close().await.unwrap();
    let versions = |table: &'static str| {
        let g = &g;
        async move {
            let ds = plain_open(g, table).await;
            ds.versions().await.unwrap().len()
        }
    };
    let person_versions = versions(PERSON).await;
    let manifest_versions = versions("__manifest").await;

    let dry = graphsink::gc(&cfg, true).await.unwrap();
    assert!(dry.dry_run);
    assert_eq!(
        versions(PERSON).await,
        person_versions,
        "a dry run deletes nothing"
    );
    assert_eq!(versions("__manifest").await, manifest_versions);
    assert!(dry.tables[PERSON].versions.count > 0, "{dry:?}");
    assert!(dry.tables["__manifest"].versions.count > 0, "{dry:?}");
    let real = graphsink::gc(&cfg, false).await.unwrap();
    assert_eq!(real.tables, dry.tables, "the dry run told the truth");
    assert_eq!((real.retained_commits, real.expired_commits), (2, 4));
    assert_eq!(
        versions(PERSON).await as u64,
        person_versions as u64 - real.tables[PERSON].versions.count
    );

    // Inside the window: graphsink and plain Lance both read it.
    let kept = &commits[4];
    let snap = graphsink::snapshot(&cfg, Some(&kept.id)).await.unwrap();
    let rows = snap.tables.iter().find(|t| t.table == PERSON).unwrap().rows;
    assert_eq!(rows, 6);
    let plain = read_table(&g, PERSON, kept.tables[PERSON]).await;
    assert_eq!(plain["k5"]["age"], json!(35));
    let out = tg.cli(&["show", "--commit", &kept.id], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Outside it: a clear, typed error, exit code 4.
    let gone = &commits[2];
    let e = graphsink::snapshot(&cfg, Some(&gone.id)).await.unwrap_err();
    assert_eq!(e.kind(), graphsink::ErrorKind::NotFound, "{e}");
    assert!(
        e.message()
            .starts_with(&format!("graph commit {} has expired", gone.id)),
        "{e}"
    );
    let out = tg.cli(&["show", "--commit", &gone.id], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("has expired"), "{stderr}");
    assert!(!stderr.contains("lance ("), "no raw Lance error: {stderr}");
    // The head, of course, reads too.
    assert_eq!(tg.rows(PERSON).await.len(), 6);
}

/// The schema of the crash test: nodes, edges that may wait for their
/// endpoints (`_pending/Knows`), and rejects.
const CRASH_SCHEMA: &str = r#"
node Person { name: String @key  age: I32? }
edge Knows: Person -> Person
"#;

/// One round of the crash test: people (updates over a fixed key space,
/// a delete of a key no edge references), an edge between live nodes, an
/// edge that waits for a node never produced (`_pending/Knows`), and a
/// record that is rejected.
fn round(r: i64, people: &mut BTreeMap<String, i64>) -> (Vec<Rec>, Vec<Rec>) {
    let mut nodes = Vec::new();
    for k in 0..8 {
        let key = format!("p{k}");
        nodes.push(rec(
            0,
            Some(&key),
            Some(json!({"name": key, "age": r * 100 + k})),
        ));
        people.insert(key, r * 100 + k);
    }
    let gone = format!("p{}", 3 + r % 5);
    nodes.push(rec(0, Some(&gone), None));
    people.remove(&gone);
    nodes.push(rec(
        0,
        Some("bad"),
        Some(json!({"name": "bad", "age": "old"})),
    ));
    let edges = vec![
        rec(0, None, Some(json!({"src": "p1", "dst": "p2"}))),
        rec(
            0,
            None,
            Some(json!({"src": format!("later{r}"), "dst": "p1"})),
        ),
    ];
    (nodes, edges)
}

/// A second config of the same graph with the fold loop's retention off,
/// so `graphsink gc` meets garbage at every step.
fn without_gc(tg: &TestGraph) -> PathBuf {
    let text = std::fs::read_to_string(tg.config_path()).unwrap();
    let path = tg.dir.path().join("nogc.toml");
    std::fs::write(
        &path,
        text.replace("[retention]\n", "[retention]\nenabled = false\n"),
    )
    .unwrap();
    path
}

fn run_with_config(config: &std::path::Path) -> std::process::Output {
    let mut cmd = crate::binary::graphsink();
    cmd.args(["run", "--exit-at-end", "--config"]).arg(config);
    crate::binary::output(cmd)
}

/// kill -9 at every GC step and inside each (failpoints, `abort`), in the
/// fold loop of the real binary and in `graphsink gc`; after each, a
/// restart, and everything reads back: rows, folded and deferred edges,
/// rejects, committed offsets, and plain Lance reads of the head.
async fn a_crash_at_any_gc_step_loses_nothing(backend: Backend) {
    crate::init_logs();
    let tg = TestGraph::on(
        backend,
        CRASH_SCHEMA,
        &["node = \"Person\"", "edge = \"Knows\""],
        "[wal]\nbuckets = 2\n[fold]\ninterval = \"0s\"\n[offsets]\ncommit_interval = \"100ms\"\n[retention]\ninterval = \"0s\"\nkeep_commits = 1\nkeep_for = \"0s\"",
    );
    let nogc = without_gc(&tg);
    let (nodes_topic, edges_topic) = (tg.topics[0].clone(), tg.topics[1].clone());
    create_topic(&nodes_topic, 1).await;
    create_topic(&edges_topic, 1).await;
    let mut people = BTreeMap::new();
    let mut rounds = 0;
    let ok = |out: std::process::Output, what: &str| {
        assert!(
            out.status.success(),
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };

    // A first fold, so every later run has garbage at every step.
    rounds += 1;
    let (n, e) = round(rounds, &mut people);
    produce(&nodes_topic, &n).await;
    produce(&edges_topic, &e).await;
    ok(tg.cli(&["run", "--exit-at-end"], &[]), "first run");
    check_everything(&tg, &people, rounds).await;
    // A GC that fails (not crashes) is logged; the connector carries on.
    rounds += 1;
    let (n, e) = round(rounds, &mut people);
    produce(&nodes_topic, &n).await;
    produce(&edges_topic, &e).await;
    let fails = [("GRAPHSINK_FAILPOINTS", "gc.after_wal=error")];
    let stderr = ok(tg.cli(&["run", "--exit-at-end"], &fails), "failing GC");
    assert!(stderr.contains("retention failed"), "{stderr}");
    check_everything(&tg, &people, rounds).await;

    let windows = [
        "gc.wal_partial",
        "gc.after_wal",
        "gc.after_trim",
        "gc.generation_partial",
        "gc.after_generations",
        "gc.versions_partial",
        "gc.after_versions",
    ];
    for (i, fp) in windows.iter().enumerate() {
        rounds += 1;
        let (n, e) = round(rounds, &mut people);
        produce(&nodes_topic, &n).await;
        produce(&edges_topic, &e).await;
        let armed = [("GRAPHSINK_FAILPOINTS", format!("{fp}=abort"))];
        let armed: Vec<(&str, &str)> = armed.iter().map(|(k, v)| (*k, v.as_str())).collect();
        // Alternately the fold loop's GC, and `graphsink gc` after a run
        // that left its garbage.
        let out = if i % 2 == 0 {
            tg.cli(&["run", "--exit-at-end"], &armed)
        } else {
            ok(run_with_config(&nogc), "run without GC");
            tg.cli(&["gc"], &armed)
        };
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(&format!("failpoint {fp} fired")),
            "failpoint {fp} did not fire: {stderr}"
        );
        // Restart: recovery and replay, then a full read-back.
        ok(
            tg.cli(&["run", "--exit-at-end"], &[]),
            &format!("restart after {fp}"),
        );
        check_everything(&tg, &people, rounds).await;
    }
    // A last GC finishes whatever a crash cut short.
    ok(tg.cli(&["gc"], &[]), "last gc");
    check_everything(&tg, &people, rounds).await;
}

/// Rows, edges (folded and deferred), rejects and offsets at the head.
async fn check_everything(tg: &TestGraph, people: &BTreeMap<String, i64>, rounds: i64) {
    let g = tg.graph().await;
    let head = g.head().await.unwrap();
    for (table, &v) in &head.tables {
        plain_open(&g, table)
            .await
            .checkout_version(v)
            .await
            .unwrap_or_else(|e| panic!("{table}@{v} of the head: {e}"));
    }
    assert_eq!(&ages(&tg.rows(PERSON).await), people);
    let edges = tg.rows("edges/Knows").await;
    let pending = tg.rows("_pending/Knows").await;
    assert_eq!(edges.len() as i64, rounds, "{edges:?}");
    assert_eq!(pending.len() as i64, rounds, "{pending:?}");
    assert_eq!(rejects_at_head(tg).await.len() as i64, rounds);
    for t in &tg.topics {
        assert_eq!(committed(&tg.group, t, 1), end_offsets(t, 1), "{t}");
    }
}

/// Storage stops growing: a fixed key space updated fold after fold, with
/// retention after every fold. After a warm-up the bytes on disk stay
/// within a band instead of climbing with every fold (the long run is
/// `graphsink-bench --storage`, docs/perf/2026-12-02-storage-against-time-with-and-without-retention.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_stops_growing_with_retention() {
    crate::init_logs();
    let tg = TestGraph::new(
        &["node = \"Person\""],
        "[wal]\nbuckets = 2\n[retention]\nkeep_commits = 2\nkeep_for = \"0s\"",
    );
    let cfg = tg.config();
    let topic = tg.topics[0].clone();
    let g = open_graph(&tg).await;
    let window = Window::from(&cfg.retention);
    let pool = ShardPool::open(&g, &cfg.wal, &g.wal_tables())
        .await
        .unwrap();
    let mut dec = RecordDecoder::new(g.schema(), &cfg.mappings[0], 256, 1 << 20).unwrap();
    let mut bytes = Vec::new();
    let folds = 36;
    for f in 0..folds {
        // 4 polls per fold, 50 updates each, over 200 keys.
        for p in 0..4 {
            let v: Vec<Value> = (0..50)
                .map(|k| person(&format!("k{}", (p * 50 + k) % 200), f * 1000 + k))
                .collect();
            write(&pool, &mut dec, &topic, (f * 4 + p) as i64 * 50, &v).await;
        }
        fold(&g, &pool).await;
        testing::collect_garbage(&g, &window, &pool).await.unwrap();
        let storage = testing::graph_storage(&g).await.unwrap();
        bytes.push(storage.iter().map(|s| s.total()).sum());
    }
    pool.close().await.unwrap();
    eprintln!("bytes after each fold: {bytes:?}");
    // `__manifest` saws up and down with its compaction (every 16 small
    // fragments), so windows of 17 folds compare like with like: each
    // holds one low right after a compaction.
    let window = |w: &[u64]| (*w.iter().min().unwrap(), *w.iter().max().unwrap());
    let (lo1, _) = window(&bytes[2..19]);
    let (lo2, hi2) = window(&bytes[19..36]);
    // What still grows: the commit log (a commit row and its table
    // versions) and shard-manifest versions (Lance prunes those after a
    // day), about 1.2 KiB per fold here. Without retention every fold
    // keeps a whole old version of the table (~75 KiB here).
    let per_fold = lo2.saturating_sub(lo1) / 17;
    assert!(per_fold < 4096, "{per_fold} B per fold: {bytes:?}");
    assert!(
        hi2 < lo2 + lo2 / 2,
        "the saw is bounded: {lo2}..{hi2} ({bytes:?})"
    );
    assert_eq!(tg.rows(PERSON).await.len(), 200);
}

/// Bytes of every file under `dir`, walked on the local disk (independent
/// of the object-store listing `status` uses).
fn disk_bytes(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let meta = e.metadata().unwrap();
        total += if meta.is_dir() {
            disk_bytes(&e.path())
        } else {
            meta.len()
        };
    }
    total
}

/// `status` shows storage per table by kind; the kinds add up to what is
/// on disk, and a GC moves the right ones.
async fn status_shows_storage_per_table_by_kind(backend: Backend) {
    crate::init_logs();
    let tg = TestGraph::on(
        backend.clone(),
        SCHEMA,
        &["node = \"Person\""],
        "[wal]\nbuckets = 2\n[retention]\nkeep_commits = 1\nkeep_for = \"0s\"",
    );
    let cfg = tg.config();
    let topic = tg.topics[0].clone();
    let g = open_graph(&tg).await;
    let pool = ShardPool::open(&g, &cfg.wal, &g.wal_tables())
        .await
        .unwrap();
    let mut dec = RecordDecoder::new(g.schema(), &cfg.mappings[0], 64, 1 << 20).unwrap();
    for f in 0..3 {
        let v: Vec<Value> = (0..20)
            .map(|k| person(&format!("k{k}"), f * 100 + k))
            .collect();
        write(&pool, &mut dec, &topic, f as i64 * 20, &v).await;
        fold(&g, &pool).await;
    }
    let of = |s: &graphsink::GraphStatus| {
        s.storage
            .iter()
            .find(|t| t.table == PERSON)
            .cloned()
            .unwrap()
    };
    let before = graphsink::graph_status(&cfg).await.unwrap();
    let names: Vec<&str> = before.storage.iter().map(|s| s.table.as_str()).collect();
    assert_eq!(names.last(), Some(&"__manifest"), "{names:?}");
    if backend == Backend::Local {
        for s in &before.storage {
            let on_disk = disk_bytes(&PathBuf::from(g.table_uri(&s.table)));
            assert_eq!(s.total(), on_disk, "{s:?}");
        }
    }
    let p = of(&before);
    assert!(
        p.wal > 0 && p.generations > 0 && p.old_versions > 0 && p.base > 0,
        "{p:?}"
    );

    graphsink::gc(&cfg, false).await.unwrap();
    let after = of(&graphsink::graph_status(&cfg).await.unwrap());
    assert_eq!(after.generations, 0, "{after:?}");
    assert!(after.wal < p.wal, "{p:?} → {after:?}");
    assert!(after.old_versions < p.old_versions, "{p:?} → {after:?}");
    assert_eq!(after.base, p.base, "the latest version is untouched");
    assert!(after.versions < p.versions);

    // The CLI prints the same, as JSON too.
    let out = tg.cli(&["status", "--json"], &[]);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
    });
    let cli = json["storage"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["table"] == PERSON)
        .unwrap()
        .clone();
    assert_eq!(cli["generations"], json!(0));
    assert_eq!(cli["base"], json!(after.base));
    pool.close().await.unwrap();
}

crate::on_every_backend!(
    gc_keeps_the_newest_wal_entry_and_replay_finds_every_acked_row,
    an_emptied_wal_dir_lets_a_fenced_writer_ack_a_row_that_is_lost,
    after_gc_a_new_writer_still_fences_the_old_one,
    trims_keep_the_writer_working_and_its_next_flush_keeps_them,
    retained_commits_stay_readable_and_expired_ones_say_so,
    status_shows_storage_per_table_by_kind,
);

/// Local only in CI, for time: on an `s3://` root it takes ~150 s. It used
/// to stall in 2 of 3 runs: one `run --exit-at-end` sat in a stable group
/// with no partition and nothing left to read (tansu left the member that
/// replaced a crashed one unassigned), and waited forever. That was the
/// run loop's, fixed and tested in CI by
/// `group::exit_at_end_without_partitions_ends_once_the_group_is_at_the_end`;
/// this test then passed twice on S3 (2026-12-04). Run it with `--ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_crash_at_any_gc_step_loses_nothing() {
    a_crash_at_any_gc_step_loses_nothing(Backend::Local).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "~150 s on S3; kept out of CI for time (see above)"]
async fn s3_crash_at_any_gc_step_loses_nothing() {
    a_crash_at_any_gc_step_loses_nothing(Backend::S3).await
}
