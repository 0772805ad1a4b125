//! The consume → WAL → commit → fold path, in process.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::harness::*;

/// Records for one topic plus the state they must leave behind.
pub(crate) struct Workload {
    pub recs: Vec<Rec>,
    /// id → (row without provenance, partition, offset of the last write)
    pub expected: BTreeMap<String, (Value, i32, i64)>,
}

/// People with repeated keys, a delete, and a delete followed by a re-insert.
/// A key always goes to the same partition, so Kafka order is per-key order.
pub(crate) fn people(n: usize, keys: usize, partitions: i32) -> Workload {
    let mut recs = Vec::new();
    let mut next = vec![0i64; partitions as usize];
    let mut expected = BTreeMap::new();
    let mut push = |recs: &mut Vec<Rec>, key: String, value: Option<Value>| {
        let p = (key[1..].parse::<usize>().unwrap() % partitions as usize) as i32;
        let off = next[p as usize];
        next[p as usize] += 1;
        match &value {
            Some(v) => {
                let mut row = v.clone();
                row["id"] = json!(key);
                expected.insert(key.clone(), (row, p, off));
            }
            None => {
                expected.remove(&key);
            }
        }
        recs.push(rec(p, Some(&key), value));
    };
    for i in 0..n {
        let key = format!("p{}", i % keys);
        push(
            &mut recs,
            key.clone(),
            Some(json!({"name": key, "age": i as i32})),
        );
    }
    push(&mut recs, "p3".into(), None);
    push(&mut recs, "p5".into(), None);
    push(
        &mut recs,
        "p5".into(),
        Some(json!({"name": "p5", "age": 555, "city": "Oslo"})),
    );
    push(&mut recs, format!("p{}", keys + 1), None); // delete of a key never written
    Workload { recs, expected }
}

fn assert_rows(
    rows: &BTreeMap<String, Value>,
    expected: &BTreeMap<String, (Value, i32, i64)>,
    topic: &str,
) {
    let want: BTreeMap<String, Value> = expected
        .iter()
        .map(|(k, (v, _, _))| (k.clone(), v.clone()))
        .collect();
    assert_eq!(strip_provenance(rows), want);
    for (id, (_, p, off)) in expected {
        let r = &rows[id];
        assert_eq!(r["_src_topic"], json!(topic), "{id}");
        assert_eq!(r["_src_partition"], json!(p), "{id}");
        assert_eq!(r["_src_offset"], json!(off), "{id}");
    }
}

async fn run_to_end(tg: &TestGraph) -> graphsink::RunSummary {
    try_run_to_end(tg).await.expect("run succeeds")
}

async fn two_types_last_write_wins_with_deletes_and_offsets(backend: Backend) {
    crate::init_logs();
    let tg = TestGraph::on(
        backend,
        SCHEMA,
        &[
            "node = \"Person\"",
            "node = \"Company\"\nkey = \"kafka\"",
            "node = \"Slot\"",
        ],
        "[fold]\ninterval = \"0s\"\n[wal]\nbuckets = 3",
    );
    let (tp, tc, ts) = (&tg.topics[0], &tg.topics[1], &tg.topics[2]);
    create_topic(tp, 3).await;
    create_topic(tc, 2).await;
    create_topic(ts, 1).await;
    let people = people(90, 25, 3);
    produce(tp, &people.recs).await;
    produce(
        tc,
        &[
            rec(0, Some("ACME"), Some(json!({"name": "Acme"}))),
            rec(
                1,
                Some("INIT"),
                Some(json!({"ticker": "INIT", "name": "Initech", "founded": 1999})),
            ),
            rec(
                0,
                Some("ACME"),
                Some(json!({"name": "Acme Corp", "founded": 1950})),
            ),
            rec(1, Some("\"GONE\""), Some(json!({"name": "Gone Inc"}))),
            rec(1, Some("GONE"), None),
        ],
    )
    .await;
    produce(
        ts,
        &[
            rec(
                0,
                None,
                Some(json!({"tenant": "acme", "slot": 7, "label": "a"})),
            ),
            rec(0, None, Some(json!({"tenant": "acme", "slot": 8}))),
            rec(0, Some(r#"["acme", 8]"#), None),
        ],
    )
    .await;

    let summary = run_to_end(&tg).await;
    assert_eq!(summary.records as usize, people.recs.len() + 5 + 3);
    // Everything is durable and committed: the group sits at the end offsets.
    for (t, n) in [(tp, 3), (tc, 2), (ts, 1)] {
        assert_eq!(committed(&tg.group, t, n), end_offsets(t, n), "topic {t}");
    }
    // The graceful stop folded once; an operator fold then finds nothing.
    assert_eq!(tg.graph().await.head().await.unwrap().seq, 1);
    let out = tg.cli(&["fold"], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing to fold"));

    assert_rows(&tg.rows("nodes/Person").await, &people.expected, tp);
    let companies = strip_provenance(&tg.rows("nodes/Company").await);
    assert_eq!(
        companies,
        BTreeMap::from([
            (
                "ACME".into(),
                json!({"id": "ACME", "ticker": "ACME", "name": "Acme Corp", "founded": 1950})
            ),
            (
                "INIT".into(),
                json!({"id": "INIT", "ticker": "INIT", "name": "Initech", "founded": 1999})
            ),
        ])
    );
    let slots = strip_provenance(&tg.rows("nodes/Slot").await);
    assert_eq!(
        slots,
        BTreeMap::from([(
            r#"["acme","7"]"#.to_string(),
            json!({"id": r#"["acme","7"]"#, "tenant": "acme", "slot": 7, "label": "a"})
        )])
    );

    let g = tg.graph().await;
    let head = g.head().await.unwrap();
    assert_eq!(head.seq, 1, "exactly one graph commit for one fold");
    let mut ranges: Vec<(String, i32, i64, i64)> = head
        .offsets
        .iter()
        .map(|r| (r.topic.clone(), r.partition, r.first, r.last))
        .collect();
    ranges.sort();
    let mut want = Vec::new();
    for (t, n) in [(tp, 3), (tc, 2), (ts, 1)] {
        for (p, end) in end_offsets(t, n) {
            want.push((t.to_string(), p, 0, end - 1));
        }
    }
    want.sort();
    assert_eq!(ranges, want);
    let stats = &head.stats["nodes/Person"];
    assert_eq!(stats.upserted as usize, people.expected.len());

    // The fold with nothing to fold published nothing.
    assert_eq!(tg.graph().await.head().await.unwrap().seq, 1);

    // The CLI reads it back.
    let log = String::from_utf8(tg.cli(&["log"], &[]).stdout).unwrap();
    assert!(
        log.contains(&head.id) && log.contains("nodes/Person"),
        "{log}"
    );
    let init = head.parent.clone().unwrap();
    let old = String::from_utf8(tg.cli(&["show", "--commit", &init], &[]).stdout).unwrap();
    assert!(old.contains("(seq 0)") && old.contains(" 0 rows"), "{old}");
    let show = String::from_utf8(tg.cli(&["show"], &[]).stdout).unwrap();
    assert!(
        show.contains(&format!("{} rows", people.expected.len())),
        "{show}"
    );
}

/// Holds durability back with a long WAL flush interval: records are
/// consumed and written, but the committed offset must stay behind until
/// the WAL entry lands. Then the live fold loop publishes them.
async fn committed_offset_never_passes_durability(backend: Backend) {
    crate::init_logs();
    let tg = TestGraph::on(backend, SCHEMA,
        &["node = \"Person\""],
        "[wal]\nflush_interval = \"20s\"\nbuckets = 2\n[offsets]\ncommit_interval = \"100ms\"\n[fold]\ninterval = \"25s\"",
    );
    let topic = &tg.topics[0];
    create_topic(topic, 2).await;
    let w = people(40, 40, 2);
    produce(topic, &w.recs).await;

    let stats = Arc::new(graphsink::Metrics::default());
    let stop = CancellationToken::new();
    let options = graphsink::RunOptions {
        metrics: Some(stats.clone()),
        ..Default::default()
    };
    let task = tokio::spawn(graphsink::run_with(tg.config(), options, stop.clone()));
    let n = w.recs.len() as u64;
    wait_until("records consumed", Duration::from_secs(30), || {
        stats.totals().consumed == n
    })
    .await;
    // Until the WAL entry lands (the 20 s flush; the fold, which would force
    // one, is further out), every look finds nothing committed. The offsets
    // are read before durability, so a look that finds nothing durable saw
    // the offsets while nothing was.
    let consumed = std::time::Instant::now();
    let mut looks = 0;
    loop {
        let at = committed(&tg.group, topic, 2);
        if stats.totals().durable > 0 {
            break;
        }
        assert!(
            at.values().all(|&o| o == 0),
            "committed past undurable records: {at:?}"
        );
        assert!(
            consumed.elapsed() < Duration::from_secs(60),
            "the WAL never flushed"
        );
        looks += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The window held many commit cadences (100 ms each): a flush that was
    // not held back would end it at once.
    assert!(
        consumed.elapsed() > Duration::from_secs(5) && looks >= 10,
        "durable {:?} after consumption ({looks} looks): the flush was not held back",
        consumed.elapsed()
    );
    let ends = end_offsets(topic, 2);
    wait_until("commit after durability", Duration::from_secs(30), || {
        committed(&tg.group, topic, 2) == ends
    })
    .await;

    // The background fold loop makes them visible without any operator step.
    let mut visible = false;
    for _ in 0..300 {
        if tg.rows("nodes/Person").await.len() == w.expected.len() {
            visible = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(visible, "fold loop did not publish the rows");
    stop.cancel();
    task.await.unwrap().expect("clean drain");
    assert_rows(&tg.rows("nodes/Person").await, &w.expected, topic);
}

async fn replay_from_the_beginning_changes_nothing(backend: Backend) {
    crate::init_logs();
    let tg = TestGraph::on(
        backend,
        SCHEMA,
        &["node = \"Person\""],
        "[fold]\ninterval = \"0s\"",
    );
    let topic = &tg.topics[0];
    create_topic(topic, 2).await;
    let w = people(60, 15, 2);
    produce(topic, &w.recs).await;
    run_to_end(&tg).await;
    assert!(tg.cli(&["fold"], &[]).status.success());
    let before = tg.rows("nodes/Person").await;
    assert_rows(&before, &w.expected, topic);

    reset_group(&tg.group, topic, 2);
    assert!(committed(&tg.group, topic, 2).values().all(|&o| o == 0));
    let summary = run_to_end(&tg).await;
    assert_eq!(summary.records as usize, w.recs.len(), "re-read everything");
    assert!(tg.cli(&["fold"], &[]).status.success());
    assert_eq!(tg.graph().await.head().await.unwrap().seq, 2);
    assert_eq!(
        tg.rows("nodes/Person").await,
        before,
        "same rows, same provenance"
    );
}

/// Another process claiming the shards fences the running connector: it
/// stops with an error naming the shard, and acks nothing after the fence.
async fn a_fenced_connector_stops_and_acks_nothing_more(backend: Backend) {
    crate::init_logs();
    let tg = TestGraph::on(
        backend,
        SCHEMA,
        &["node = \"Person\""],
        "[fold]\ninterval = \"0s\"\n[wal]\nbuckets = 1\n[offsets]\ncommit_interval = \"100ms\"",
    );
    let topic = &tg.topics[0];
    create_topic(topic, 1).await;
    let w = people(10, 10, 1);
    let end = w.recs.len() as i64;
    produce(topic, &w.recs).await;
    let stats = Arc::new(graphsink::Metrics::default());
    let options = graphsink::RunOptions {
        metrics: Some(stats.clone()),
        ..Default::default()
    };
    let task = tokio::spawn(graphsink::run_with(
        tg.config(),
        options,
        CancellationToken::new(),
    ));
    wait_until("first commit", Duration::from_secs(30), || {
        committed(&tg.group, topic, 1).get(&0) == Some(&end)
    })
    .await;

    // `graphsink fold --force` claims every shard under a new epoch.
    let out = tg.cli(&["fold", "--force"], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    produce(
        topic,
        &[rec(0, Some("late"), Some(json!({"name": "late"})))],
    )
    .await;

    let err = tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("connector stopped")
        .unwrap()
        .expect_err("a fenced connector must fail");
    assert_eq!(err.kind(), graphsink::ErrorKind::Fenced, "{err}");
    let msg = err.to_string();
    assert!(msg.contains("shard") && msg.contains("epoch"), "{msg}");
    assert_eq!(
        committed(&tg.group, topic, 1).get(&0),
        Some(&end),
        "acked past the fence"
    );
}

/// Every `.pg` type goes from JSON through the WAL and a fold into Lance and
/// reads back unchanged; edge tables exist from the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_schema_type_round_trips() {
    crate::init_logs();
    let schema = r#"
        node T {
            k: I64 @key
            s: String  b: Bool  i: I32  u: U32  ul: U64  f: F32  d: F64
            day: Date  at: DateTime  tags: [String]  v: Vector(3)?
            e: enum(red, green)  opt: String?
        }
        edge Likes: T -> T { weight: F64? }
    "#;
    let tg = TestGraph::with_schema(schema, &["node = \"T\""], "[wal]\nbuckets = 2");
    let topic = &tg.topics[0];
    create_topic(topic, 1).await;
    let value = json!({"k": -42, "s": "x", "b": true, "i": -5, "u": 7, "ul": 18446744073709551615u64,
        "f": 1.5, "d": 2.25, "day": "2024-02-29", "at": "2024-02-29T12:34:56Z",
        "tags": ["a", "b"], "v": [1.0, 2.0, 3.0], "e": "green"});
    produce(topic, &[rec(0, None, Some(value))]).await;
    run_to_end(&tg).await;
    let rows = strip_provenance(&tg.rows("nodes/T").await);
    let row = &rows["-42"];
    for (k, v) in [
        ("s", json!("x")),
        ("b", json!(true)),
        ("i", json!(-5)),
        ("u", json!(7)),
        ("ul", json!(18446744073709551615u64)),
        ("f", json!(1.5)),
        ("d", json!(2.25)),
        ("day", json!("2024-02-29")),
        ("tags", json!(["a", "b"])),
        ("v", json!([1.0, 2.0, 3.0])),
        ("e", json!("green")),
    ] {
        assert_eq!(row[k], v, "column {k}: {row}");
    }
    assert!(
        row["at"]
            .as_str()
            .unwrap_or_default()
            .starts_with("2024-02-29T12:34:56"),
        "{row}"
    );
    assert!(tg.rows("edges/Likes").await.is_empty());
}

/// A second member joins the group: the connector gives partitions up in a
/// cooperative rebalance and commits their durable watermark synchronously
/// on revoke (the cadence is an hour here, so only the revoke can commit),
/// so the new owner starts exactly after the records graphsink made durable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_commits_durable_watermarks_synchronously() {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::Message;
    crate::init_logs();
    let tg = TestGraph::new(
        &["node = \"Person\""],
        "[offsets]\ncommit_interval = \"1h\"\n[fold]\ninterval = \"0s\"",
    );
    let topic = tg.topics[0].clone();
    create_topic(&topic, 4).await;
    let w = people(80, 40, 4);
    produce(&topic, &w.recs).await;
    let ends = end_offsets(&topic, 4);

    let stats = Arc::new(graphsink::Metrics::default());
    let options = graphsink::RunOptions {
        metrics: Some(stats.clone()),
        ..Default::default()
    };
    let stop = CancellationToken::new();
    let task = tokio::spawn(graphsink::run_with(tg.config(), options, stop.clone()));
    let n = w.recs.len() as u64;
    wait_until("all durable", Duration::from_secs(30), || {
        stats.totals().durable == n
    })
    .await;
    assert!(
        committed(&tg.group, &topic, 4).is_empty(),
        "nothing committed before the rebalance"
    );

    // The second member: polls for a while, records what it was given.
    let (group, t) = (tg.group.clone(), topic.clone());
    let member = std::thread::spawn(move || {
        let c: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", broker())
            .set("group.id", &group)
            .set("partition.assignment.strategy", "cooperative-sticky")
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", "6000")
            .create()
            .unwrap();
        c.subscribe(&[&t]).unwrap();
        let mut got = Vec::new();
        let mut assigned = 0;
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
                got.push((m.partition(), m.offset()));
            }
            assigned = assigned.max(c.assignment().map(|a| a.count()).unwrap_or(0));
            if assigned > 0 && std::time::Instant::now() + Duration::from_secs(12) > deadline {
                break;
            }
        }
        (assigned, got)
    });
    let (assigned, got) = tokio::task::spawn_blocking(move || member.join().unwrap())
        .await
        .unwrap();
    assert!(assigned > 0, "the second member never got a partition");
    assert!(
        got.is_empty(),
        "new owner re-read records graphsink had made durable: {got:?}"
    );
    let c = committed(&tg.group, &topic, 4);
    assert!(!c.is_empty(), "revoke committed nothing");
    for (p, off) in &c {
        assert_eq!(*off, ends[p], "partition {p}");
    }

    // The member left: the connector takes the partitions back and drains.
    stop.cancel();
    task.await
        .unwrap()
        .expect("connector survives the rebalance");
    assert_eq!(committed(&tg.group, &topic, 4), ends);
}

/// A fold whose generations hold only tombstones (one of a key that never
/// existed) still records its progress, so the next fold starts after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletes_only_fold_advances() {
    crate::init_logs();
    let tg = TestGraph::new(&["node = \"Person\""], "[fold]\ninterval = \"0s\"");
    let topic = &tg.topics[0];
    create_topic(topic, 1).await;
    produce(topic, &[rec(0, Some("p1"), Some(json!({"name": "p1"})))]).await;
    run_to_end(&tg).await;
    produce(topic, &[rec(0, Some("p1"), None), rec(0, Some("p9"), None)]).await;
    run_to_end(&tg).await;
    let g = tg.graph().await;
    let head = g.head().await.unwrap();
    assert_eq!(head.seq, 2);
    assert_eq!(head.stats["nodes/Person"].deleted, 1);
    assert!(tg.rows("nodes/Person").await.is_empty());
    let out = tg.cli(&["fold"], &[]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing to fold"));
    // Only a never-existing key this time: nothing to delete, still progress.
    produce(topic, &[rec(0, Some("p8"), None)]).await;
    run_to_end(&tg).await;
    assert_eq!(g.head().await.unwrap().seq, 3);
    let out = tg.cli(&["fold"], &[]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing to fold"));
}

/// With the fold timer off, the pending-rows trigger alone folds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_rows_trigger_a_fold() {
    crate::init_logs();
    let tg = TestGraph::new(
        &["node = \"Person\""],
        "[fold]\ninterval = \"0s\"\nmax_pending_rows = 20\non_shutdown = false",
    );
    let topic = &tg.topics[0];
    create_topic(topic, 1).await;
    let (tx, mut rx) = tokio::sync::watch::channel(None);
    let options = graphsink::RunOptions {
        published: Some(tx),
        ..Default::default()
    };
    let stop = CancellationToken::new();
    let task = tokio::spawn(graphsink::run_with(tg.config(), options, stop.clone()));
    produce(topic, &people(50, 50, 1).recs).await;
    let commit = tokio::time::timeout(Duration::from_secs(30), rx.wait_for(|c| c.is_some()))
        .await
        .expect("a fold was triggered by pending rows")
        .unwrap()
        .clone()
        .unwrap();
    assert!(
        commit.stats["nodes/Person"].upserted >= 20,
        "{:?}",
        commit.stats
    );
    stop.cancel();
    task.await.unwrap().unwrap();
}

/// Many small folds: each table is compacted inside a fold once it has more
/// than `COMPACT_FRAGMENTS` fragments, and `__manifest` after a publish, so
/// fold cost stays flat in history; nothing is lost and a restart's
/// recovery accepts the compaction commits as the folds' own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_folds_keep_tables_compacted() {
    crate::init_logs();
    let tg = TestGraph::new(
        &["node = \"Person\""],
        "[wal]\nbuckets = 1\n[fold]\ninterval = \"0s\"",
    );
    let topic = &tg.topics[0];
    create_topic(topic, 1).await;
    let (tx, mut rx) = tokio::sync::watch::channel(None);
    let wake = Arc::new(tokio::sync::Notify::new());
    let options = graphsink::RunOptions {
        fold_now: Some(wake.clone()),
        published: Some(tx),
        ..Default::default()
    };
    let stop = CancellationToken::new();
    let task = tokio::spawn(graphsink::run_with(tg.config(), options, stop.clone()));
    let folds = graphsink::testing::COMPACT_FRAGMENTS + 10;
    for i in 0..folds {
        produce(
            topic,
            &[rec(
                0,
                None,
                Some(json!({"name": format!("p{i}"), "age": i})),
            )],
        )
        .await;
        wait_until("committed", Duration::from_secs(30), || {
            committed(&tg.group, topic, 1).get(&0) == Some(&(i as i64 + 1))
        })
        .await;
        wake.notify_one();
        let want = i as u64 + 1;
        tokio::time::timeout(
            Duration::from_secs(30),
            rx.wait_for(|c| c.as_ref().is_some_and(|c| c.seq == want)),
        )
        .await
        .expect("fold published")
        .unwrap();
    }
    stop.cancel();
    task.await.unwrap().expect("clean stop");
    let g = tg.graph().await;
    for table in ["nodes/Person", "__manifest"] {
        let ds = plain_open(&g, table).await;
        let n = ds.get_fragments().len();
        assert!(
            n <= graphsink::testing::COMPACT_FRAGMENTS + 1,
            "{table} has {n} fragments after {folds} folds"
        );
    }
    assert_eq!(tg.rows("nodes/Person").await.len(), folds);
    // A restart runs recovery over the compacted versions.
    run_to_end(&tg).await;
    assert_eq!(tg.rows("nodes/Person").await.len(), folds);
}

crate::on_every_backend!(
    two_types_last_write_wins_with_deletes_and_offsets,
    committed_offset_never_passes_durability,
    replay_from_the_beginning_changes_nothing,
    a_fenced_connector_stops_and_acks_nothing_more,
);
