//! Edges and fold-time validation: endpoints (defer, deadline, reject),
//! edge ids by rule, tombstones, `@card`, `@unique`, and node deletes under
//! the `reject` and `cascade` policies. Never a placeholder node.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::harness::*;

fn keys(rows: &BTreeMap<String, Value>) -> Vec<String> {
    rows.keys().cloned().collect()
}

async fn rows_if_any(tg: &TestGraph, table: &str) -> BTreeMap<String, Value> {
    // The connector may not have created the graph yet.
    let Ok(g) = graphsink::Graph::open_configured(&tg.config()).await else {
        return BTreeMap::new();
    };
    let head = g.head().await.unwrap();
    match head.tables.get(table) {
        Some(&v) => read_table(&g, table, v).await,
        None => BTreeMap::new(),
    }
}

/// Polls the head until `f` holds (the connector folds in the background).
async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !f().await {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

const SCHEMA: &str = r#"
node Person { name: String @key }
node Slot { tenant: String  slot: U32  @key(tenant, slot) }
edge Knows: Person -> Person { since: I32? }
edge Likes: Person -> Person
edge In: Person -> Slot { @unique(src, dst) }
"#;

/// An edge whose endpoint arrives in a later fold lands under `defer`; one
/// whose endpoint never arrives is rejected at the deadline; `reject`
/// refuses at once; ids follow the mapping; a tombstone deletes by id.
async fn edges_wait_for_their_endpoints_until_the_deadline(backend: Backend) {
    crate::init_logs();
    let tg = TestGraph::on(
        backend,
        SCHEMA,
        &[
            "node = \"Person\"",
            "edge = \"Knows\"\nsrc = \"from\"\ndst = \"to\"\nendpoint_deadline = \"15s\"",
            "edge = \"Likes\"\non_missing_endpoint = \"reject\"",
            "node = \"Slot\"",
            "edge = \"In\"",
        ],
        "[fold]\ninterval = \"300ms\"",
    );
    let t = &tg.topics;
    for topic in t {
        create_topic(topic, 1).await;
    }
    let (people, knows, likes, slots, ins) = (&t[0], &t[1], &t[2], &t[3], &t[4]);
    produce(
        people,
        &[
            rec(0, None, Some(json!({"name": "a"}))),
            rec(0, None, Some(json!({"name": "b"}))),
        ],
    )
    .await;
    produce(
        slots,
        &[rec(0, None, Some(json!({"tenant": "acme", "slot": 7})))],
    )
    .await;

    let stop = CancellationToken::new();
    let task = tokio::spawn(graphsink::run_with(
        tg.config(),
        graphsink::RunOptions::default(),
        stop.clone(),
    ));
    // Nodes first: topics are fetched independently, so edges produced with
    // them could reach a fold before their endpoints, and `reject` would
    // then (rightly) refuse a->b.
    eventually("people and slots folded", || async {
        rows_if_any(&tg, "nodes/Person").await.len() == 2
            && rows_if_any(&tg, "nodes/Slot").await.len() == 1
    })
    .await;
    produce(
        knows,
        &[
            rec(0, None, Some(json!({"from": "a", "to": "b", "since": 1}))),
            rec(0, None, Some(json!({"from": "a", "to": "c"}))),
            rec(0, None, Some(json!({"from": "a", "to": "zz"}))),
        ],
    )
    .await;
    produce(
        likes,
        &[
            rec(0, None, Some(json!({"src": "a", "dst": "nobody"}))),
            rec(0, None, Some(json!({"src": "a", "dst": "b"}))),
        ],
    )
    .await;
    produce(
        ins,
        &[rec(0, None, Some(json!({"src": "a", "dst": ["acme", 7]})))],
    )
    .await;
    let k = |o: i64| format!("{knows}/0/{o}");
    let in_id = serde_json::to_string(&["a", r#"["acme","7"]"#]).unwrap();
    // Each topic may reach a different fold, so wait for all of them.
    eventually("a->b lands, a->c waits, Likes and In folded", || async {
        rows_if_any(&tg, "edges/Knows").await.contains_key(&k(0))
            && rows_if_any(&tg, "_pending/Knows").await.contains_key(&k(1))
            && rows_if_any(&tg, "edges/Likes")
                .await
                .contains_key(&format!("{likes}/0/1"))
            && rows_if_any(&tg, "edges/In").await.contains_key(&in_id)
    })
    .await;
    let knows_rows = tg.rows("edges/Knows").await;
    assert_eq!(keys(&knows_rows), [k(0)]);
    assert_eq!(knows_rows[&k(0)]["src"], json!("a"));
    assert_eq!(knows_rows[&k(0)]["dst"], json!("b"));
    assert_eq!(knows_rows[&k(0)]["since"], json!(1));
    // `reject`: refused at its first fold, not deferred.
    let likes_rows = tg.rows("edges/Likes").await;
    assert_eq!(keys(&likes_rows), [format!("{likes}/0/1")]);
    let rejects = rejects_at_head(&tg).await;
    assert_eq!(rejects.len(), 1, "{rejects:?}");
    assert_eq!(rejects[0]["code"], json!("endpoint_not_found"));
    assert_eq!(rejects[0]["stage"], json!("fold"));
    assert_eq!(rejects[0]["offset"], json!(0));
    assert_eq!(rejects[0]["topic"], json!(likes));
    // @unique(src, dst): the id is the endpoints; a composite dst is its array.
    let in_rows = tg.rows("edges/In").await;
    assert_eq!(keys(&in_rows), std::slice::from_ref(&in_id));
    assert_eq!(in_rows[&in_id]["dst"], json!(r#"["acme","7"]"#));

    // The endpoint arrives in a later fold: the pending edge lands.
    produce(people, &[rec(0, None, Some(json!({"name": "c"})))]).await;
    eventually("a->c lands", || async {
        rows_if_any(&tg, "edges/Knows").await.contains_key(&k(1))
    })
    .await;
    assert_eq!(keys(&tg.rows("_pending/Knows").await), [k(2)]);

    // The one that never arrives is rejected at the deadline.
    eventually("a->zz rejected", || async {
        rows_if_any(&tg, "_ingest_rejects").await.len() == 2
    })
    .await;
    let late = rejects_at_head(&tg)
        .await
        .into_iter()
        .find(|r| r["topic"] == json!(knows))
        .unwrap();
    assert_eq!(late["code"], json!("endpoint_not_found"));
    assert_eq!(late["offset"], json!(2));
    assert!(
        late["message"].as_str().unwrap().contains("deadline"),
        "{late}"
    );
    assert!(late["row"].as_str().unwrap().contains("zz"), "{late}");
    assert!(tg.rows("_pending/Knows").await.is_empty());
    // Never a placeholder node.
    assert_eq!(keys(&tg.rows("nodes/Person").await), ["a", "b", "c"]);

    // A tombstone keyed by the edge id deletes the edge.
    produce(knows, &[rec(0, Some(&k(0)), None)]).await;
    eventually("a->b deleted", || async {
        !rows_if_any(&tg, "edges/Knows").await.contains_key(&k(0))
    })
    .await;
    assert_eq!(keys(&tg.rows("edges/Knows").await), [k(1)]);

    // Both fold rejects reached the dead-letter topic, with their commit.
    let dlq = read_topic(&tg.dlq, 3, Duration::from_secs(10));
    assert_eq!(dlq.len(), 2);
    for m in &dlq {
        assert_eq!(m.header("graphsink.stage").as_deref(), Some("fold"));
        assert_eq!(
            m.header("graphsink.code").as_deref(),
            Some("endpoint_not_found")
        );
        assert!(m.header("graphsink.graph_commit").is_some());
        assert!(m.header("graphsink.reject_id").is_some());
    }
    stop.cancel();
    task.await.unwrap().expect("clean stop");
}

/// `@card` (at most one manager per person) and `@unique` (email) hold
/// across committed rows; the violating rows are fold rejects.
async fn card_and_unique_are_checked_against_committed_rows(backend: Backend) {
    crate::init_logs();
    let tg = TestGraph::on(backend,
        "node Person { name: String @key  email: String? @unique }\nedge Manager: Person -> Person @card(0..1)",
        &["node = \"Person\"", "edge = \"Manager\"\nkey = \"kafka\""],
        "",
    );
    let (people, managers) = (&tg.topics[0], &tg.topics[1]);
    create_topic(people, 1).await;
    create_topic(managers, 1).await;
    let p = |n: &str, e: &str| rec(0, None, Some(json!({"name": n, "email": e})));
    produce(people, &[p("a", "a@x"), p("b", "b@x"), p("c", "c@x")]).await;
    produce(
        managers,
        &[rec(0, Some("m1"), Some(json!({"src": "a", "dst": "b"})))],
    )
    .await;
    try_run_to_end(&tg).await.expect("first run");
    assert_eq!(keys(&tg.rows("edges/Manager").await), ["m1"]);

    // d takes a's email; a keeps its own (an update is no conflict); a gets
    // a second manager; m1 is re-sent unchanged (an update, not a second).
    produce(people, &[p("d", "a@x"), p("a", "a@x")]).await;
    produce(
        managers,
        &[
            rec(0, Some("m2"), Some(json!({"src": "a", "dst": "c"}))),
            rec(0, Some("m1"), Some(json!({"src": "a", "dst": "b"}))),
        ],
    )
    .await;
    try_run_to_end(&tg).await.expect("second run");
    assert_eq!(keys(&tg.rows("nodes/Person").await), ["a", "b", "c"]);
    assert_eq!(keys(&tg.rows("edges/Manager").await), ["m1"]);
    let rejects = rejects_at_head(&tg).await;
    let codes: BTreeMap<String, String> = rejects
        .iter()
        .map(|r| {
            (
                r["row"].as_str().unwrap().to_string(),
                r["code"].as_str().unwrap().to_string(),
            )
        })
        .map(|(row, code)| {
            let v: Value = serde_json::from_str(&row).unwrap();
            (v["id"].as_str().unwrap().to_string(), code)
        })
        .collect();
    assert_eq!(
        codes,
        BTreeMap::from([
            ("d".to_string(), "unique".to_string()),
            ("m2".to_string(), "cardinality".to_string())
        ]),
        "{rejects:#?}"
    );
    let head = tg.graph().await.head().await.unwrap();
    assert_eq!(head.stats["nodes/Person"].rejected, 1);
    assert_eq!(head.stats["edges/Manager"].rejected, 1);
}

/// Deleting a node that committed edges reference: `reject` refuses the
/// delete; `cascade` deletes the edges in the same graph commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_deletes_with_references_reject_or_cascade() {
    crate::init_logs();
    for policy in ["reject", "cascade"] {
        let tg = TestGraph::with_schema(
            "node Person { name: String @key }\nedge Knows: Person -> Person",
            &[
                &format!("node = \"Person\"\non_delete_referenced = \"{policy}\""),
                "edge = \"Knows\"\nkey = \"kafka\"",
            ],
            "",
        );
        let (people, knows) = (&tg.topics[0], &tg.topics[1]);
        create_topic(people, 1).await;
        create_topic(knows, 1).await;
        produce(
            people,
            &[
                rec(0, None, Some(json!({"name": "a"}))),
                rec(0, None, Some(json!({"name": "b"}))),
                rec(0, None, Some(json!({"name": "lonely"}))),
            ],
        )
        .await;
        produce(
            knows,
            &[rec(0, Some("e1"), Some(json!({"src": "a", "dst": "b"})))],
        )
        .await;
        try_run_to_end(&tg).await.expect("first run");
        // b is referenced (as dst); lonely is not.
        produce(
            people,
            &[rec(0, Some("b"), None), rec(0, Some("lonely"), None)],
        )
        .await;
        try_run_to_end(&tg).await.expect("second run");
        let people_now = keys(&tg.rows("nodes/Person").await);
        let edges_now = keys(&tg.rows("edges/Knows").await);
        let rejects = rejects_at_head(&tg).await;
        let head = tg.graph().await.head().await.unwrap();
        match policy {
            "reject" => {
                assert_eq!(people_now, ["a", "b"], "{policy}");
                assert_eq!(edges_now, ["e1"], "{policy}");
                assert_eq!(rejects.len(), 1, "{rejects:?}");
                assert_eq!(rejects[0]["code"], json!("referenced"));
                assert!(rejects[0]["message"].as_str().unwrap().contains("e1"));
                assert_eq!(head.stats["nodes/Person"].deleted, 1);
            }
            _ => {
                assert_eq!(people_now, ["a"], "{policy}");
                assert!(edges_now.is_empty(), "{policy}: {edges_now:?}");
                assert!(rejects.is_empty(), "{rejects:?}");
                // One graph commit did both.
                assert_eq!(head.stats["nodes/Person"].deleted, 2);
                assert_eq!(head.stats["edges/Knows"].deleted, 1);
            }
        }
    }
}

/// `errors.tolerance = "none"`: a fold reject stops the connector before
/// the fold is published; nothing of that fold becomes visible.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fold_reject_under_tolerance_none_publishes_nothing() {
    crate::init_logs();
    let tg = TestGraph::with_schema(
        "node Person { name: String @key }\nedge Likes: Person -> Person",
        &[
            "node = \"Person\"",
            "edge = \"Likes\"\non_missing_endpoint = \"reject\"",
        ],
        "[errors]\ntolerance = \"none\"",
    );
    let (people, likes) = (&tg.topics[0], &tg.topics[1]);
    create_topic(people, 1).await;
    create_topic(likes, 1).await;
    produce(people, &[rec(0, None, Some(json!({"name": "a"})))]).await;
    produce(
        likes,
        &[rec(0, None, Some(json!({"src": "a", "dst": "nobody"})))],
    )
    .await;
    let err = try_run_to_end(&tg)
        .await
        .expect_err("the fold reject stops it");
    assert_eq!(err.kind(), graphsink::ErrorKind::BadInput, "{err}");
    assert!(err.to_string().contains("endpoint_not_found"), "{err}");
    assert!(err.to_string().contains(&format!("{likes}/0@0")), "{err}");
    let head = tg.graph().await.head().await.unwrap();
    assert_eq!(head.seq, 0, "the fold was not published");
    assert!(read_topic_to_end(&tg.dlq, "read_committed").is_empty());
}

/// `@card(0..2)` and `@unique(src, dst)` over committed edges of many
/// `src`s: the fold reads only the committed edges whose `src` one of its
/// candidates names (docs/decisions/0004-fold-size.md), and that must include the `src`
/// of a deferred edge that resolves in a later fold with no other edge of
/// that `src` in it, and the old `src` of a moved edge may be left out.
#[tokio::test]
async fn card_and_unique_read_every_committed_edge_a_candidate_can_meet() {
    crate::init_logs();
    let tg = TestGraph::on(
        Backend::Local,
        "node Person { name: String @key }\nedge Tie: Person -> Person @card(0..2) {\n    @unique(src, dst)\n}",
        &["node = \"Person\"", "edge = \"Tie\"\nkey = \"kafka\""],
        "",
    );
    let (people, ties) = (&tg.topics[0], &tg.topics[1]);
    create_topic(people, 1).await;
    create_topic(ties, 1).await;
    let p = |n: &str| rec(0, None, Some(json!({"name": n})));
    let t = |id: &str, s: &str, d: &str| rec(0, Some(id), Some(json!({"src": s, "dst": d})));
    produce(people, &["a", "b", "c", "d", "e", "f"].map(p)).await;
    produce(
        ties,
        &[
            t("t1", "a", "b"),
            t("t2", "a", "c"),
            t("t3", "d", "e"),
            t("t4", "f", "e"),
            t("t11", "c", "d"),
            t("t12", "c", "e"),
        ],
    )
    .await;
    try_run_to_end(&tg).await.expect("first run");
    assert_eq!(tg.rows("edges/Tie").await.len(), 6);

    // t5: a is full. t6: (d, e) is t3's. t4 moves from f (no candidate
    // names f) to b, and t7 gives b its second. t8 waits for z.
    produce(
        ties,
        &[
            t("t5", "a", "d"),
            t("t6", "d", "e"),
            t("t4", "b", "e"),
            t("t7", "b", "f"),
            t("t8", "c", "z"),
        ],
    )
    .await;
    try_run_to_end(&tg).await.expect("second run");
    // Only z arrives: t8 resolves in a fold whose only `Tie` candidate it
    // is, and c already has two.
    produce(people, &[p("z")]).await;
    try_run_to_end(&tg).await.expect("third run");

    let edges = tg.rows("edges/Tie").await;
    assert_eq!(keys(&edges), ["t1", "t11", "t12", "t2", "t3", "t4", "t7"]);
    assert_eq!(edges["t4"]["src"], "b");
    let codes: BTreeMap<String, String> = rejects_at_head(&tg)
        .await
        .iter()
        .map(|r| {
            let row: Value = serde_json::from_str(r["row"].as_str().unwrap()).unwrap();
            let id = row["id"].as_str().unwrap().to_string();
            (id, r["code"].as_str().unwrap().to_string())
        })
        .collect();
    assert_eq!(
        codes,
        BTreeMap::from([
            ("t5".to_string(), "cardinality".to_string()),
            ("t6".to_string(), "unique".to_string()),
            ("t8".to_string(), "cardinality".to_string()),
        ]),
    );
}

crate::on_every_backend!(
    edges_wait_for_their_endpoints_until_the_deadline,
    card_and_unique_are_checked_against_committed_rows,
);

/// A graph folded in process, without a broker: records go through the
/// decoder and the shard writers as the run loop sends them, and each
/// `fold` is the fold loop's own stages, as the bench drives them.
struct InProcess {
    _dir: tempfile::TempDir,
    cfg: graphsink::Config,
    graph: graphsink::Graph,
    policies: graphsink::testing::Policies,
    pool: graphsink::testing::ShardPool,
    offset: i64,
}

impl InProcess {
    /// A graph of `schema`, its mappings (`topic`, `node|edge = type`)
    /// keyed by the Kafka key.
    async fn new(schema: &str, mappings: &[(&str, &str, &str)], extra: &str) -> InProcess {
        use graphsink::testing::{self, ShardPool};
        crate::init_logs();
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("g.pg"), schema).expect("schema");
        let mut toml = "[graph]\nroot = \"g\"\nschema = \"g.pg\"\n[kafka]\n\"bootstrap.servers\" = \"unused:1\"\n\"group.id\" = \"unused\"\n".to_string();
        for (topic, kind, ty) in mappings {
            toml +=
                &format!("[[mapping]]\ntopic = \"{topic}\"\n{kind} = \"{ty}\"\nkey = \"kafka\"\n");
            if *kind == "edge" {
                toml += "on_missing_endpoint = \"reject\"\n";
            }
        }
        toml += extra;
        let cfg = graphsink::Config::from_toml(&toml, dir.path()).expect("config");
        let schema = graphsink::GraphSchema::load(&cfg.schema_path()).expect("schema");
        let graph = graphsink::Graph::open_or_init(&cfg, schema)
            .await
            .expect("graph");
        let policies = testing::Policies::from_config(&cfg);
        let pool = ShardPool::open(&graph, &cfg.wal, &graph.wal_tables())
            .await
            .expect("shards");
        InProcess {
            _dir: dir,
            cfg,
            graph,
            policies,
            pool,
            offset: 0,
        }
    }

    /// Writes (mapping, key, value) records durably, then folds once.
    async fn fold(
        &mut self,
        recs: Vec<(usize, &str, Option<Value>)>,
    ) -> graphsink::testing::Folded {
        use graphsink::testing::{self, RecordDecoder, SourceRecord, WrittenSpans};
        let first = self.offset;
        self.offset += recs.len() as i64;
        let graph = &self.graph;
        for (m, mapping) in self.cfg.mappings.iter().enumerate() {
            let values: Vec<(String, Option<String>)> = recs
                .iter()
                .filter(|r| r.0 == m)
                .map(|r| (r.1.to_string(), r.2.as_ref().map(Value::to_string)))
                .collect();
            let src: Vec<SourceRecord<'_>> = values
                .iter()
                .enumerate()
                .map(|(i, (k, v))| SourceRecord {
                    topic: &mapping.topic,
                    partition: 0,
                    offset: first + i as i64,
                    timestamp: None,
                    key: Some(k.as_bytes()),
                    value: v.as_deref().map(str::as_bytes),
                    message: None,
                })
                .collect();
            let mut dec =
                RecordDecoder::new(graph.schema(), mapping, 100, 1 << 20).expect("decoder");
            let d = dec.decode(&src).expect("decode");
            assert!(d.rejects.is_empty(), "{:?}", d.rejects);
            let table = &graph.schema().get(mapping.type_name()).expect("type").table;
            let mut writes = Vec::new();
            if let Some(b) = d.upserts {
                writes.extend(self.pool.tables[table].put(b).await.expect("put"));
            }
            if let Some(keys) = d.deletes {
                writes.extend(self.pool.tables[table].delete(keys).await.expect("delete"));
            }
            for w in writes {
                w.wait().await.expect("durable");
            }
        }
        let mut limits = std::collections::HashMap::new();
        for f in self.pool.freeze_all().await.expect("freeze") {
            limits.insert(f.shard, f.upto_generation);
            f.fence.wait().await.expect("flushed");
        }
        let head = graph.head().await.expect("head");
        let plan = testing::plan(
            graph,
            &self.policies,
            &head,
            &Some(limits),
            &WrittenSpans::default(),
            "test",
        )
        .await
        .expect("plan")
        .expect("something to fold");
        testing::execute(graph, &self.policies, &plan)
            .await
            .expect("fold")
    }

    /// `table`'s rows at the head, by id, without provenance.
    async fn rows(&self, table: &str) -> BTreeMap<String, Value> {
        let head = self.graph.head().await.expect("head");
        read_table(&self.graph, table, head.tables[table]).await
    }
}

/// The node ids a fold keeps between folds follow its own writes exactly:
/// a node deleted in one fold is missing for the next fold's edges, a node
/// added is there, and the kept set sits at the node table's new version
/// (so the next fold used it, not a scan).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_node_ids_follow_each_folds_adds_and_deletes() {
    use graphsink::testing;
    let mut g = InProcess::new(
        "node Person { name: String @key }\nedge Likes: Person -> Person\n",
        &[("people", "node", "Person"), ("likes", "edge", "Likes")],
        "",
    )
    .await;
    let person = |n: &'static str| (0, n, Some(json!({ "name": n })));
    g.fold(vec![person("a"), person("b"), person("c")]).await;
    // The first edge fold scans Person once and keeps its ids.
    g.fold(vec![(1, "ab", Some(json!({"src": "a", "dst": "b"})))])
        .await;
    let at = |f: &graphsink::testing::Folded| f.commit.tables["nodes/Person"];
    // c goes, d comes: the kept ids move to the version this fold wrote.
    let f = g.fold(vec![(0, "c", None), person("d")]).await;
    assert_eq!(
        testing::known_ids(&g.policies, "nodes/Person"),
        Some((at(&f), 3)),
        "the kept ids follow the fold's own writes"
    );
    let f = g
        .fold(vec![
            (1, "ac", Some(json!({"src": "a", "dst": "c"}))),
            (1, "ad", Some(json!({"src": "a", "dst": "d"}))),
        ])
        .await;
    let refused: Vec<(&str, &str)> = f
        .rejects
        .iter()
        .map(|r| (r.code.as_str(), r.message.as_str()))
        .collect();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].0, "endpoint_not_found");
    assert!(
        refused[0].1.contains("\"ac\"") && refused[0].1.contains("dst Person \"c\""),
        "c was deleted: {}",
        refused[0].1
    );
    let rows = graphsink::row_counts(&g.graph, &f.commit)
        .await
        .expect("rows");
    assert_eq!(rows["edges/Likes"], 2, "ab, and ad (d was added)");
    g.pool.close().await.expect("close");
}

/// A fold replaces and deletes rows by the addresses it keeps for each
/// table's ids (no merge-insert scan of the keys): across updates, deletes,
/// re-inserts and the compactions that move rows, each table keeps one row
/// per live id holding its last write, the kept ids follow every fold and
/// match a scan of the table after it, and addresses that drifted from the
/// table (swapped here by hand; only a bug could do it) are caught by the
/// fold and never delete the wrong rows. Past `fold.known_ids_max` (0
/// here), the same folds go through merge-insert and column scans, and
/// every table and reject comes out the same, `@card`/`@unique` edges
/// (read through their kept `src` tags, or a scan of `src`) included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addressed_writes_keep_the_last_write_of_each_id_across_compactions() {
    let kept = fold_rounds(true).await;
    let scanned = fold_rounds(false).await;
    assert_eq!(kept.len(), scanned.len());
    for (round, (k, s)) in kept.iter().zip(&scanned).enumerate() {
        assert_eq!(k, s, "round {round}: kept ids against scans");
    }
    assert!(
        kept.iter()
            .any(|(_, rejects)| rejects.iter().any(|r| r.0 == "cardinality"))
            && kept
                .iter()
                .any(|(_, rejects)| rejects.iter().any(|r| r.0 == "unique")),
        "the rounds exercise both checks: {kept:?}"
    );
}

/// Ties' rows (id → w) and the fold's rejects (code, row) of one round.
type Round = (BTreeMap<String, i64>, Vec<(String, String)>);

/// 30 folds of updates, deletes and re-inserts of people, likes and ties,
/// with the fold's kept ids (`kept`) or past the bound; checks people and
/// likes against a model after each, and returns ties and the rejects.
async fn fold_rounds(kept: bool) -> Vec<Round> {
    use graphsink::testing;
    let mut g = InProcess::new(
        "node Person { name: String @key\n n: I64 }\nedge Likes: Person -> Person { w: I64 }\nedge Ties: Person -> Person @card(0..2) {\n w: I64\n @unique(src, dst)\n}\n",
        &[("people", "node", "Person"), ("likes", "edge", "Likes"), ("ties", "edge", "Ties")],
        if kept { "" } else { "[fold]\nknown_ids_max = 0\n" },
    )
    .await;
    // 40 people: enough fragments outlive their rewrites for compaction.
    let names: &'static [String] = Vec::leak((0..40).map(|i| format!("p{i:02}")).collect());
    let name = |i: usize| names[i].as_str();
    let key = |k: String| -> &'static str { Box::leak(k.into_boxed_str()) };
    let person = |i: usize, n: i64| (0, name(i), Some(json!({ "name": name(i), "n": n })));
    let edge = |m: usize, k: &'static str, s: usize, d: usize, w: i64| {
        (
            m,
            k,
            Some(json!({ "src": name(s), "dst": name(d), "w": w })),
        )
    };
    let values = |rows: BTreeMap<String, Value>, field: &str| -> BTreeMap<String, i64> {
        rows.into_iter()
            .map(|(id, v)| (id, v[field].as_i64().expect("a number")))
            .collect()
    };
    // What each table must hold: id → its last value.
    let mut people: BTreeMap<String, i64> = BTreeMap::new();
    let mut likes: BTreeMap<String, i64> = BTreeMap::new();
    let (mut compacted, mut fragments, mut out) = (false, 0, Vec::new());
    for round in 0..30i64 {
        let r = round as usize;
        let mut recs = Vec::new();
        if round == 0 {
            for i in 0..40 {
                recs.push(person(i, -1));
                people.insert(name(i).to_string(), -1);
            }
        }
        // Rewrite three people, delete one (and re-add it later).
        for i in [0, r % 30 + 1, 39] {
            recs.push(person(i, round));
            people.insert(name(i).to_string(), round);
        }
        if round % 3 == 1 {
            let gone = name(r % 30 + 1);
            recs.retain(|rec| rec.1 != gone);
            recs.push((0, gone, None));
            people.remove(gone);
        }
        let k = key(format!("e{}", round % 5));
        recs.push(edge(1, k, 0, 39, round));
        likes.insert(k.to_string(), round);
        if round % 4 == 3 {
            recs.push((1, "e0", None));
            likes.remove("e0");
        }
        // Ties from four srcs to five dsts under nine keys: past two per
        // src (`@card(0..2)`), and one tuple under two keys (`@unique`).
        recs.push(edge(
            2,
            key(format!("t{}", r % 9)),
            r % 4,
            39 - r % 5,
            round,
        ));
        if round % 5 == 4 {
            recs.push((2, key(format!("t{}", (r + 3) % 9)), None));
        }
        let f = g.fold(recs).await;
        assert!(
            f.rejects
                .iter()
                .all(|rej| rej.type_name.as_deref() == Some("Ties")),
            "round {round}: {:?}",
            f.rejects
        );
        assert_eq!(
            values(g.rows("nodes/Person").await, "n"),
            people,
            "round {round}"
        );
        assert_eq!(
            values(g.rows("edges/Likes").await, "w"),
            likes,
            "round {round}"
        );
        let mut rejects: Vec<(String, String)> = f
            .rejects
            .iter()
            .map(|rej| {
                let row = rej.row.clone().unwrap_or_default();
                (rej.code.as_str().to_string(), row)
            })
            .collect();
        rejects.sort();
        out.push((values(g.rows("edges/Ties").await, "w"), rejects));
        if !kept {
            assert_eq!(testing::known_ids(&g.policies, "nodes/Person"), None);
            continue;
        }
        for table in ["nodes/Person", "edges/Likes", "edges/Ties"] {
            let agree = testing::known_ids_agree(&g.graph, &g.policies, table)
                .await
                .expect("scan");
            assert_eq!(agree, Some(true), "round {round}: {table}'s kept addresses");
        }
        // The kept ids follow every fold, its compactions included.
        let (v, _) = testing::known_ids(&g.policies, "nodes/Person").expect("kept");
        assert_eq!(v, f.commit.tables["nodes/Person"], "round {round}");
        let table = g
            .graph
            .open_table("nodes/Person", None)
            .await
            .expect("open");
        compacted |= table.get_fragments().len() < fragments;
        fragments = table.get_fragments().len();
    }
    if kept {
        assert!(compacted, "30 folds passed the compaction bound");
        // Addresses that drifted: the fold must not delete by them.
        testing::swap_known_addresses(&g.policies, "nodes/Person", name(0), name(39));
        g.fold(vec![person(0, 100)]).await;
        people.insert(name(0).to_string(), 100);
        let got = values(g.rows("nodes/Person").await, "n");
        assert_eq!(got, people, "the swapped addresses deleted nothing");
    }
    g.pool.close().await.expect("close");
    out
}
