//! Partition sharding (docs/decisions/0007-scale-out.md): a record's shard is its source
//! partition, and keying breaches are typed rejects, never silent merges.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::json;

use crate::harness::*;

/// Partition sharding with quick folds and commits, for tests with members.
const MEMBERS: &str =
    "[wal]\nsharding = \"partition\"\n[fold]\ninterval = \"1s\"\n[offsets]\ncommit_interval = \"200ms\"";

/// One `graphsink run` member in this process: its task and its stop.
fn start_member(
    config: graphsink::Config,
    stats: std::sync::Arc<graphsink::Metrics>,
) -> (
    tokio::task::JoinHandle<graphsink::Result<graphsink::RunSummary>>,
    tokio_util::sync::CancellationToken,
) {
    let stop = tokio_util::sync::CancellationToken::new();
    let options = graphsink::RunOptions {
        metrics: Some(stats),
        ..Default::default()
    };
    let task = tokio::spawn(graphsink::run_with(config, options, stop.clone()));
    (task, stop)
}

/// Rows go to the shard of their source partition; a Kafka key naming
/// another id is refused at decode, an id arriving on two partitions in one
/// fold at the fold (the lowest partition's row stays), each once in both
/// sinks; the mode is fixed at creation and `status` reads N from the
/// schema record (Lance reports 0 shards for identity sharding).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_sharding_routes_by_partition_and_rejects_keying_breaches() {
    crate::init_logs();
    let tg = TestGraph::new(
        &["node = \"Person\""],
        "[wal]\nsharding = \"partition\"\n[fold]\ninterval = \"0s\"",
    );
    let topic = &tg.topics[0];
    create_topic(topic, 4).await;
    let person = |p: i32, key: Option<&str>, name: &str, age: i32| {
        rec(p, key, Some(json!({"name": name, "age": age})))
    };
    // A producer keyed by id, its partitioner placing ids on 1 and 3 only.
    let mut recs = vec![];
    for (i, n) in ["a", "b", "c", "d", "e", "f", "g", "h"].iter().enumerate() {
        let p = if i % 2 == 0 { 1 } else { 3 };
        recs.push(person(p, Some(n), n, i as i32));
    }
    recs.extend([
        // b deleted on its own partition.
        rec(3, Some("b"), None),
        // A key naming another id: partition_key_mismatch at decode.
        person(1, Some("zz"), "x", 1),
        // a (partition 1) also arriving on partition 3, keyed by id (another
        // partitioner): shard_conflict at the fold.
        person(3, Some("a"), "a", 99),
    ]);
    produce(topic, &recs).await;
    try_run_to_end(&tg).await.expect("run");

    let rows = tg.rows("nodes/Person").await;
    let ids: BTreeSet<&str> = rows.keys().map(String::as_str).collect();
    assert_eq!(ids, BTreeSet::from(["a", "c", "d", "e", "f", "g", "h"]));
    assert_eq!(
        rows["a"]["age"],
        json!(0),
        "the lowest partition's row of a stays"
    );
    for (id, row) in &rows {
        let i = ["a", "b", "c", "d", "e", "f", "g", "h"]
            .iter()
            .position(|n| n == id)
            .unwrap();
        let want = if i % 2 == 0 { 1 } else { 3 };
        assert_eq!(row["_src_partition"], json!(want), "{id}");
    }
    // Only the shards of partitions 1 and 3 held rows: routing followed the
    // partition, not bucket(id, 4), which would have spread 8 ids wider.
    let g = tg.graph().await;
    let folded: BTreeSet<u32> = g
        .commits()
        .await
        .unwrap()
        .iter()
        .flat_map(|c| c.folded.iter())
        .filter(|f| f.table == "nodes/Person")
        .map(|f| f.bucket)
        .collect();
    assert_eq!(folded, BTreeSet::from([1, 3]));

    let rejects = rejects_at_head(&tg).await;
    let mut got: Vec<(String, i64, i64)> = rejects
        .iter()
        .map(|r| {
            (
                r["code"].as_str().unwrap().to_string(),
                r["partition"].as_i64().unwrap(),
                r["offset"].as_i64().unwrap(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            ("partition_key_mismatch".to_string(), 1, 4),
            ("shard_conflict".to_string(), 3, 5),
        ]
    );
    let dlq = read_topic_to_end(&tg.dlq, "read_committed");
    let mut codes: Vec<String> = dlq
        .iter()
        .map(|m| m.header("graphsink.code").unwrap())
        .collect();
    codes.sort();
    assert_eq!(codes, ["partition_key_mismatch", "shard_conflict"]);

    // status reads N from the schema record: four Person shards.
    let out = tg.cli(&["status", "--json"], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let person_shards = status["shards"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["table"] == "nodes/Person")
        .count();
    assert_eq!(person_shards, 4, "{status}");

    // The mode is fixed at creation.
    let cfg = std::fs::read_to_string(tg.config_path()).unwrap();
    std::fs::write(
        tg.config_path(),
        cfg.replace("sharding = \"partition\"", "sharding = \"bucket\""),
    )
    .unwrap();
    let out = tg.cli(&["fold"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("wal.sharding = \"partition\""), "{err}");
}

/// With `wal.partitioner`, records a real librdkafka producer placed by
/// that partitioner pass, and one placed elsewhere is `wrong_partition`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_off_its_keys_partition_is_refused_under_a_known_partitioner() {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    crate::init_logs();
    let tg = TestGraph::new(
        &["node = \"Person\"\nkey = \"kafka\""],
        "[wal]\nsharding = \"partition\"\npartitioner = \"murmur2\"\n[fold]\ninterval = \"0s\"",
    );
    let topic = &tg.topics[0];
    create_topic(topic, 4).await;
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", broker())
        .set("partitioner", "murmur2_random")
        .create()
        .unwrap();
    let names: Vec<String> = (0..40).map(|i| format!("p{i}")).collect();
    let mut placed = std::collections::BTreeMap::new();
    for n in &names {
        let value = json!({"age": 1}).to_string();
        let delivery = producer
            .send(
                FutureRecord::to(topic).key(n.as_str()).payload(&value),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)
            .unwrap();
        placed.insert(n.clone(), delivery.partition);
    }
    let spread: BTreeSet<i32> = placed.values().copied().collect();
    assert!(spread.len() > 1, "40 keys over 4 partitions: {placed:?}");
    // p0 again, on a partition its key does not hash to.
    let wrong = (placed["p0"] + 1) % 4;
    produce(topic, &[rec(wrong, Some("p0"), Some(json!({"age": 2})))]).await;
    try_run_to_end(&tg).await.expect("run");

    let rows = tg.rows("nodes/Person").await;
    assert_eq!(rows.len(), 40);
    assert_eq!(
        rows["p0"]["age"],
        json!(1),
        "the misplaced update did not land"
    );
    for (n, p) in &placed {
        assert_eq!(rows[n]["_src_partition"], json!(p), "{n}");
    }
    let rejects = rejects_at_head(&tg).await;
    assert_eq!(rejects.len(), 1, "{rejects:?}");
    assert_eq!(rejects[0]["code"], "wrong_partition");
    assert_eq!(rejects[0]["partition"], json!(wrong));
}

/// Two members in one group on one partition-sharded graph: the second's
/// join moves partitions, and with them shards, without fencing anyone
/// (each shard's epoch rises once per move); the member holding the fold
/// partition folds every shard, so all rows of both members reach the
/// graph, and every offset is committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_members_split_the_shards_and_one_folds_them_all() {
    use std::sync::Arc;
    crate::init_logs();
    let tg = TestGraph::new(&["node = \"Person\""], MEMBERS);
    let topic = tg.topics[0].clone();
    create_topic(&topic, 4).await;
    // Ids keep their partition (i mod 4), as a producer keyed by id does.
    let batch = |round: i32| -> Vec<Rec> {
        (0..40)
            .map(|i| {
                let n = format!("p{i}");
                rec(i % 4, Some(&n), Some(json!({"name": n, "age": round})))
            })
            .collect()
    };
    let member = |stats: Arc<graphsink::Metrics>| start_member(tg.config(), stats);
    let all_committed = |topic: &str| {
        let ends = end_offsets(topic, 4);
        committed(&tg.group, topic, 4) == ends
    };

    let a_stats = Arc::new(graphsink::Metrics::default());
    let (a, a_stop) = member(a_stats.clone());
    produce(&topic, &batch(1)).await;
    wait_until(
        "the first member committed round 1",
        Duration::from_secs(60),
        || all_committed(&topic),
    )
    .await;

    let b_stats = Arc::new(graphsink::Metrics::default());
    let (b, b_stop) = member(b_stats.clone());
    // Round 2 goes on until the second member has taken partitions.
    let mut round = 2;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while b_stats.totals().consumed == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the second member never got records"
        );
        produce(&topic, &batch(round)).await;
        round += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let last = round - 1;
    wait_until(
        "both members committed everything",
        Duration::from_secs(60),
        || all_committed(&topic),
    )
    .await;
    wait_for(
        "the graph holds the last round",
        Duration::from_secs(60),
        || async {
            let rows = tg.rows("nodes/Person").await;
            rows.len() == 40 && rows.values().all(|r| r["age"] == json!(last))
        },
    )
    .await;
    assert!(a_stats.totals().consumed > 0);
    assert!(!a.is_finished() && !b.is_finished(), "a member stopped");

    // One claim per member per shard it holds: epochs 1 (never moved) or 2
    // (moved once), at least one of each; a fencing back and forth would
    // show more.
    let status = graphsink::graph_status(&tg.config()).await.unwrap();
    let epochs: Vec<u64> = status
        .shards
        .iter()
        .filter(|s| s.table == "nodes/Person")
        .map(|s| s.writer_epoch)
        .collect();
    assert_eq!(epochs.len(), 4);
    assert!(epochs.iter().all(|&e| e == 1 || e == 2), "{epochs:?}");
    assert!(epochs.contains(&1) && epochs.contains(&2), "{epochs:?}");
    assert_eq!(a_stats.totals().restarts, 0);
    assert_eq!(b_stats.totals().restarts, 0);
    // Both members run in this process, so one folder is named: this one.
    let me = graphsink::shard_holder();
    assert_eq!(
        status.last_folds.first().map(|f| f.folder.as_str()),
        Some(me.as_str())
    );
    assert_eq!(status.last_folds[0].seq, status.head.seq);

    a_stop.cancel();
    b_stop.cancel();
    a.await.unwrap().expect("the first member ends cleanly");
    b.await.unwrap().expect("the second member ends cleanly");
    assert!(rejects_at_head(&tg).await.is_empty());
}

/// Two topics feed one type: shard p of `Person` needs partition p of both
/// on one member. With graphsink's `range` the group keeps them together,
/// so two members split the shards without fencing each other and every
/// row of both topics lands. A member mapping only one of the topics would
/// make the group split a shard: it is refused at start (the graph records
/// every topic it was created with), and the other member goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn co_partitioned_topics_stay_together_and_a_split_is_refused() {
    use std::sync::Arc;
    crate::init_logs();
    let tg = TestGraph::new(&["node = \"Person\"", "node = \"Person\""], MEMBERS);
    let (ta, tb) = (tg.topics[0].clone(), tg.topics[1].clone());
    create_topic(&ta, 4).await;
    create_topic(&tb, 4).await;
    // Disjoint ids per topic, each on partition i mod 4 of its topic.
    let batch = |prefix: &str, round: i32| -> Vec<Rec> {
        (0..20)
            .map(|i| {
                let n = format!("{prefix}{i}");
                rec(i % 4, Some(&n), Some(json!({"name": n, "age": round})))
            })
            .collect()
    };
    let all_committed = || {
        [&ta, &tb]
            .iter()
            .all(|t| committed(&tg.group, t, 4) == end_offsets(t, 4))
    };

    let a_stats = Arc::new(graphsink::Metrics::default());
    let (a, a_stop) = start_member(tg.config(), a_stats.clone());
    produce(&ta, &batch("a", 1)).await;
    produce(&tb, &batch("b", 1)).await;
    wait_until(
        "the first member committed round 1",
        Duration::from_secs(60),
        all_committed,
    )
    .await;

    let b_stats = Arc::new(graphsink::Metrics::default());
    let (b, b_stop) = start_member(tg.config(), b_stats.clone());
    let mut round = 2;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while b_stats.totals().consumed == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the second member never got records"
        );
        produce(&ta, &batch("a", round)).await;
        produce(&tb, &batch("b", round)).await;
        round += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let last = round - 1;
    wait_until(
        "both members committed both topics",
        Duration::from_secs(60),
        all_committed,
    )
    .await;
    wait_for(
        "the graph holds the last round of both topics",
        Duration::from_secs(60),
        || async {
            let rows = tg.rows("nodes/Person").await;
            rows.len() == 40 && rows.values().all(|r| r["age"] == json!(last))
        },
    )
    .await;
    // Had a member held p of one topic and another p of the other, both
    // would have claimed shard p and fenced each other: a restart, an
    // epoch past 2, or now the split error.
    assert!(!a.is_finished() && !b.is_finished(), "a member stopped");
    assert_eq!(a_stats.totals().restarts, 0);
    assert_eq!(b_stats.totals().restarts, 0);
    let status = graphsink::graph_status(&tg.config()).await.unwrap();
    let epochs: Vec<u64> = status
        .shards
        .iter()
        .filter(|s| s.table == "nodes/Person")
        .map(|s| s.writer_epoch)
        .collect();
    assert_eq!(epochs.len(), 4);
    assert!(epochs.iter().all(|&e| e == 1 || e == 2), "{epochs:?}");
    b_stop.cancel();
    b.await.unwrap().expect("the second member ends cleanly");

    // A third member maps only the first topic: `range` would give it part
    // of that topic and none of the other, so the first member would hold
    // p of the second topic without p of the first. It is refused at
    // start, before it joins the group, and the first member goes on.
    let cfg = std::fs::read_to_string(tg.config_path()).unwrap();
    let second = format!("[[mapping]]\ntopic = \"{tb}\"");
    let cut = cfg.find(&second).expect("the second mapping");
    let narrow = tg.dir.path().join("narrow.toml");
    std::fs::write(&narrow, &cfg[..cut]).unwrap();
    let c_stats = Arc::new(graphsink::Metrics::default());
    let (c, _c_stop) = start_member(graphsink::Config::load(&narrow).unwrap(), c_stats.clone());
    let e = tokio::time::timeout(Duration::from_secs(60), c)
        .await
        .expect("the narrow member is refused at start")
        .unwrap()
        .expect_err("a config error");
    assert_eq!(e.kind(), graphsink::ErrorKind::BadConfig, "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains(&tb) && msg.contains("every member maps every topic"),
        "{msg}"
    );
    assert_eq!(c_stats.totals().consumed, 0);
    // The first member still holds every partition and ingests.
    produce(&ta, &batch("a", last + 1)).await;
    produce(&tb, &batch("b", last + 1)).await;
    wait_for(
        "the first member ingested the round after the refusal",
        Duration::from_secs(60),
        || async {
            let rows = tg.rows("nodes/Person").await;
            rows.len() == 40 && rows.values().all(|r| r["age"] == json!(last + 1))
        },
    )
    .await;
    assert!(!a.is_finished(), "the first member stopped");
    a_stop.cancel();
    a.await.unwrap().expect("the first member ends cleanly");
}

/// An id whose committed row came from one partition and that arrives
/// later on another (two producers with different partitioners, no
/// `wal.partitioner` to catch it at decode): its upsert and its delete are
/// refused as `shard_conflict` at the fold, and the committed row stays.
/// Checked with the node ids kept between folds (one run, two folds) and
/// with a fresh run that scans for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_moving_partition_between_folds_is_refused_and_its_row_stays() {
    use std::sync::Arc;
    crate::init_logs();
    let tg = TestGraph::new(&["node = \"Person\""], MEMBERS);
    let topic = tg.topics[0].clone();
    create_topic(&topic, 4).await;
    let person =
        |p: i32, name: &str, age: i32| rec(p, Some(name), Some(json!({"name": name, "age": age})));
    let ages =
        |rows: &std::collections::BTreeMap<String, serde_json::Value>| -> Vec<(String, i64, i64)> {
            rows.iter()
                .map(|(id, r)| {
                    let age = r["age"].as_i64().unwrap();
                    (id.clone(), age, r["_src_partition"].as_i64().unwrap())
                })
                .collect()
        };

    let stats = Arc::new(graphsink::Metrics::default());
    let (member, stop) = start_member(tg.config(), stats);
    produce(
        &topic,
        &[person(1, "a", 0), person(1, "b", 0), person(3, "c", 0)],
    )
    .await;
    wait_for(
        "round 1 is in the graph",
        Duration::from_secs(60),
        // The member initialises the graph in its own task: until then
        // there is none to open (a loaded machine lost this race once).
        || async {
            graphsink::Graph::open_configured(&tg.config())
                .await
                .is_ok()
                && tg.rows("nodes/Person").await.len() == 3
        },
    )
    .await;
    // a rewritten from partition 3, b deleted from partition 2: breaches;
    // c rewritten from its own partition.
    produce(
        &topic,
        &[
            person(3, "a", 99),
            rec(2, Some("b"), None),
            person(3, "c", 7),
        ],
    )
    .await;
    wait_for("round 2 is folded", Duration::from_secs(60), || async {
        let rows = tg.rows("nodes/Person").await;
        rows.get("c").is_some_and(|r| r["age"] == json!(7))
    })
    .await;
    stop.cancel();
    member.await.unwrap().expect("the member ends cleanly");
    assert_eq!(
        ages(&tg.rows("nodes/Person").await),
        [("a".into(), 0, 1), ("b".into(), 0, 1), ("c".into(), 7, 3)]
    );

    // A fresh run knows no ids: it reads them with their partitions.
    produce(&topic, &[person(0, "c", 5), person(0, "d", 1)]).await;
    try_run_to_end(&tg).await.expect("run");
    assert_eq!(
        ages(&tg.rows("nodes/Person").await),
        [
            ("a".into(), 0, 1),
            ("b".into(), 0, 1),
            ("c".into(), 7, 3),
            ("d".into(), 1, 0)
        ]
    );

    let mut got: Vec<(String, i64, i64)> = rejects_at_head(&tg)
        .await
        .iter()
        .map(|r| {
            let code = r["code"].as_str().unwrap().to_string();
            // A delete carries no record coordinates (-1), only its row.
            (
                code,
                r["partition"].as_i64().unwrap_or(-1),
                r["offset"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    got.sort();
    let conflict = |p: i64, o: i64| ("shard_conflict".to_string(), p, o);
    assert_eq!(got, [conflict(-1, -1), conflict(0, 0), conflict(3, 1)]);
    let messages: Vec<String> = rejects_at_head(&tg)
        .await
        .iter()
        .map(|r| r["message"].as_str().unwrap().to_string())
        .collect();
    assert!(
        messages
            .iter()
            .all(|m| m.contains("committed row came from partition")),
        "{messages:?}"
    );
    assert!(
        messages
            .iter()
            .any(|m| m.contains("partition 1 and its delete from partition 2")),
        "{messages:?}"
    );
    let dlq = read_topic(&tg.dlq, 3, Duration::from_secs(10));
    assert_eq!(dlq.len(), 3);
    assert!(dlq
        .iter()
        .all(|m| m.header("graphsink.code").as_deref() == Some("shard_conflict")));
}

/// One fold reads an id from a lower partition and from the partition its
/// committed row came from: the home row is the one the checks keep
/// (`home::rehome`), so it is also the one whose `@unique` tuple the view
/// must have read. Here the home row claims another node's email: it is
/// refused as `unique`, the stray row as `shard_conflict`, and the
/// committed row stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_home_row_of_an_id_read_from_two_partitions_is_checked_for_uniqueness() {
    crate::init_logs();
    let tg = TestGraph::with_schema(
        "node Person { name: String @key  age: I32?  email: String? @unique }",
        &["node = \"Person\""],
        "[wal]\nsharding = \"partition\"",
    );
    let topic = tg.topics[0].clone();
    create_topic(&topic, 4).await;
    let person = |p: i32, name: &str, age: i32, email: &str| {
        rec(
            p,
            Some(name),
            Some(json!({"name": name, "age": age, "email": email})),
        )
    };
    produce(
        &topic,
        &[person(1, "a", 0, "a@x"), person(1, "b", 0, "b@x")],
    )
    .await;
    try_run_to_end(&tg).await.expect("run 1");
    // a again, from partition 0 (a stray producer) and from its own
    // partition 1, where it claims b's email.
    produce(
        &topic,
        &[person(0, "a", 5, "a@x"), person(1, "a", 6, "b@x")],
    )
    .await;
    try_run_to_end(&tg).await.expect("run 2");

    let rows = tg.rows("nodes/Person").await;
    assert_eq!(rows["a"]["age"], json!(0), "{rows:?}");
    assert_eq!(rows["a"]["email"], json!("a@x"), "{rows:?}");
    assert_eq!(rows["b"]["email"], json!("b@x"), "{rows:?}");
    let mut got: Vec<(String, i64)> = rejects_at_head(&tg)
        .await
        .iter()
        .map(|r| {
            let code = r["code"].as_str().unwrap().to_string();
            (code, r["partition"].as_i64().unwrap_or(-1))
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [("shard_conflict".to_string(), 0), ("unique".to_string(), 1)]
    );
}

/// As above, with a delete: one fold reads node `a` upserted from a lower
/// partition and deleted from its home partition. The home delete is the
/// one kept, so the view must have read the committed edges that reference
/// `a`: under `on_delete_referenced = "reject"` the delete is refused
/// (`referenced`) and no edge is left pointing at a deleted node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_home_delete_of_an_id_read_from_two_partitions_sees_its_edges() {
    crate::init_logs();
    let tg = TestGraph::with_schema(
        "node Person { name: String @key  age: I32? }\nedge Knows: Person -> Person",
        &["node = \"Person\"", "edge = \"Knows\""],
        "[wal]\nsharding = \"partition\"",
    );
    let (people, knows) = (tg.topics[0].clone(), tg.topics[1].clone());
    create_topic(&people, 4).await;
    create_topic(&knows, 1).await;
    let person =
        |p: i32, name: &str, age: i32| rec(p, Some(name), Some(json!({"name": name, "age": age})));
    produce(&people, &[person(1, "a", 0), person(1, "b", 0)]).await;
    try_run_to_end(&tg).await.expect("run 1");
    produce(
        &knows,
        &[rec(0, None, Some(json!({"src": "a", "dst": "b"})))],
    )
    .await;
    try_run_to_end(&tg).await.expect("run 2");
    assert_eq!(tg.rows("edges/Knows").await.len(), 1);
    // a again, from partition 0 (a stray producer), then deleted from its
    // own partition 1.
    produce(&people, &[person(0, "a", 5), rec(1, Some("a"), None)]).await;
    try_run_to_end(&tg).await.expect("run 3");

    let rows = tg.rows("nodes/Person").await;
    assert_eq!(
        rows.get("a").map(|r| r["age"].clone()),
        Some(json!(0)),
        "{rows:?}"
    );
    let edges = tg.rows("edges/Knows").await;
    assert_eq!(edges.len(), 1, "{edges:?}");
    let mut got: Vec<(String, i64)> = rejects_at_head(&tg)
        .await
        .iter()
        .map(|r| {
            let code = r["code"].as_str().unwrap().to_string();
            (code, r["partition"].as_i64().unwrap_or(-1))
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            ("referenced".to_string(), -1),
            ("shard_conflict".to_string(), 0)
        ]
    );
}

/// `--exit-at-end` on a member that holds no partition (a topic of one
/// partition, kept by the first member under `cooperative-sticky`): it
/// claims no shard and does not fold, so it ends only once the group has
/// committed every partition to its end **and** the graph holds everything
/// durable. While the other member keeps its rows unfolded (a fold interval
/// of an hour) it waits, saying so; once that member has stopped (its last
/// fold lands, or its partition moves here) it ends. With a folding member
/// beside it, it ends while that member goes on. Before, it waited
/// silently, for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_holding_nothing_ends_at_exit_at_end_once_the_graph_holds_everything() {
    use std::sync::Arc;
    crate::init_logs();
    let tg = TestGraph::new(&["node = \"Person\""], MEMBERS);
    let topic = tg.topics[0].clone();
    create_topic(&topic, 1).await;
    let batch = |round: i32| -> Vec<Rec> {
        (0..20)
            .map(|i| {
                let n = format!("p{i}");
                rec(0, Some(&n), Some(json!({"name": n, "age": round})))
            })
            .collect()
    };
    let stall_bound = Duration::from_secs(2);
    let config = |fold_every: Duration| {
        let mut c = tg.config();
        c.fold.interval = fold_every;
        c.offsets.stall_timeout = Some(stall_bound);
        // Sticky: the partition stays with the member that has it.
        c.kafka.insert(
            "partition.assignment.strategy".into(),
            "cooperative-sticky".into(),
        );
        c
    };
    let holding_nothing = || {
        let stats = Arc::new(graphsink::Metrics::default());
        let options = graphsink::RunOptions {
            exit_at_end: true,
            metrics: Some(stats.clone()),
            ..Default::default()
        };
        let stop = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(graphsink::run_with(
            config(Duration::from_secs(1)),
            options,
            stop,
        ));
        (task, stats)
    };
    let all_committed = || committed(&tg.group, &topic, 1) == end_offsets(&topic, 1);

    // 1. The member with the partition folds nothing: the other waits.
    let (a, a_stop) = start_member(
        config(Duration::from_secs(3600)),
        Arc::new(graphsink::Metrics::default()),
    );
    produce(&topic, &batch(1)).await;
    wait_until("round 1 committed", Duration::from_secs(60), all_committed).await;
    // b is the real binary here, so the test reads the line it says.
    let b_config = tg.dir.path().join("holding-nothing.toml");
    let text = std::fs::read_to_string(tg.config_path())
        .unwrap()
        .replace("[offsets]\n", "[offsets]\nstall_timeout = \"2s\"\n")
        .replace(
            "[kafka]\n",
            "[kafka]\n\"partition.assignment.strategy\" = \"cooperative-sticky\"\n",
        );
    std::fs::write(&b_config, text).unwrap();
    let mut cmd = crate::binary::graphsink();
    cmd.args(["run", "--exit-at-end", "--config"])
        .arg(&b_config)
        .stdout(std::process::Stdio::null());
    graphsink_testkit::tie_to_parent(&mut cmd);
    let mut b = crate::binary::Running::spawn(cmd);
    // b joins and holds nothing; from the first stall bound (2 s) on it
    // looks whether it may end and says why it does not: the graph is
    // short of the WAL that a keeps.
    wait_until("b says why it waits", Duration::from_secs(60), || {
        let said = b.printed();
        said.contains("exit-at-end: holding no partition;") && said.contains("has not folded")
    })
    .await;
    assert!(
        b.try_wait().unwrap().is_none(),
        "ended with 20 committed rows in the WAL and none in the graph"
    );
    assert!(
        tg.rows("nodes/Person").await.is_empty(),
        "nothing folded yet"
    );
    a_stop.cancel();
    a.await.unwrap().expect("the first member stops cleanly");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = b.try_wait().unwrap() {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the waiting member did not end once nothing was left unfolded"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "b: {status}\n{}", b.printed());
    assert!(
        !b.printed().contains("holding no partition; waiting for"),
        "b held nothing, yet it waited for a partition: the group committed everything"
    );
    assert_eq!(tg.rows("nodes/Person").await.len(), 20);

    // 2. Beside a member that folds, it ends while that member goes on.
    let (a, a_stop) = start_member(
        config(Duration::from_secs(1)),
        Arc::new(graphsink::Metrics::default()),
    );
    produce(&topic, &batch(2)).await;
    wait_for("round 2 in the graph", Duration::from_secs(60), || async {
        all_committed()
            && tg
                .rows("nodes/Person")
                .await
                .values()
                .all(|r| r["age"] == json!(2))
    })
    .await;
    let (b, b_stats) = holding_nothing();
    let summary = tokio::time::timeout(Duration::from_secs(60), b)
        .await
        .expect("a member holding nothing ends beside a folding member")
        .unwrap()
        .expect("cleanly");
    assert_eq!(summary.records, 0);
    assert_eq!(b_stats.totals().consumed, 0);
    assert!(!a.is_finished(), "the folding member goes on");
    a_stop.cancel();
    a.await.unwrap().expect("the folding member stops cleanly");
}
