//! Live schema evolution (docs/schema-evolution.md): a start with a schema
//! that adds properties, types and topics applies it as one schema commit
//! while producers write; old commits still read with their own schema;
//! a crash at each step finishes on the next start and never leaves a mix;
//! `evolve = "none"` leaves it to `graphsink migrate`; a config older than
//! the graph is refused by name.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::harness::*;
use crate::on_every_backend;

const V0: &str = r#"
node Person { name: String @key  age: I32 }
edge Knows: Person -> Person { since: I32? }
"#;

const V1: &str = r#"
node Person { name: String @key  age: I32?  city: String? }
node City { name: String @key  population: I64? }
edge Knows: Person -> Person { since: I32?  weight: F64? }
edge LivesIn: Person -> City
"#;

/// Person and Knows (version 0), then City and LivesIn on new topics.
const MAPPINGS: [&str; 4] = [
    "node = \"Person\"",
    "edge = \"Knows\"\nsrc = \"from\"\ndst = \"to\"",
    "node = \"City\"",
    "edge = \"LivesIn\"",
];

/// The graph at version 0: the config keeps the first two mappings.
struct Evolving {
    tg: TestGraph,
    v1_config: String,
}

impl Evolving {
    async fn new(backend: Backend, extra: &str) -> Evolving {
        let tg = TestGraph::on(backend, V1, &MAPPINGS, extra);
        for t in &tg.topics {
            create_topic(t, 2).await;
        }
        let v1_config = std::fs::read_to_string(tg.config_path()).unwrap();
        let e = Evolving { tg, v1_config };
        e.write(0);
        e
    }

    /// Writes the schema and config of `version`.
    fn write(&self, version: u32) {
        let (schema, config) = match version {
            0 => {
                // Everything from the third mapping on is version 1's.
                let cut = self
                    .v1_config
                    .match_indices("[[mapping]]")
                    .nth(2)
                    .unwrap()
                    .0;
                (V0, self.v1_config[..cut].to_string())
            }
            _ => (V1, self.v1_config.clone()),
        };
        std::fs::write(self.tg.dir.path().join("graph.pg"), schema).unwrap();
        std::fs::write(self.tg.config_path(), config).unwrap();
    }

    fn person(&self) -> &str {
        &self.tg.topics[0]
    }
}

fn v0_person(i: usize) -> Rec {
    let name = format!("p{i}");
    rec(
        (i % 2) as i32,
        Some(&name),
        Some(json!({"name": name, "age": i})),
    )
}

/// A version-1 person: a city, no age.
fn v1_person(name: &str, city: &str) -> Rec {
    rec(0, Some(name), Some(json!({"name": name, "city": city})))
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

/// Every additive and loosening change, applied by a restart with the new
/// schema while a producer keeps writing version-0 records: one schema
/// commit; nothing acknowledged is lost; new columns are null in old rows;
/// the commit before the change still reads with its own columns.
async fn additive_changes_apply_at_start_while_a_producer_writes(backend: Backend) {
    crate::init_logs();
    let e = Evolving::new(backend, "[fold]\ninterval = \"300ms\"").await;
    let tg = &e.tg;
    // A producer of version-0 people across both runs and the change.
    let produced = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let producer = {
        let (topic, produced, done) = (e.person().to_string(), produced.clone(), done.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::SeqCst) {
                let i = produced.load(Ordering::SeqCst);
                produce(&topic, &[v0_person(i)]).await;
                produced.store(i + 1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    produce(
        &tg.topics[1],
        &[rec(
            0,
            None,
            Some(json!({"from": "p1", "to": "p0", "since": 2020})),
        )],
    )
    .await;

    let run = |tg: &TestGraph| {
        let stop = CancellationToken::new();
        let task = tokio::spawn(graphsink::run_with(
            tg.config(),
            graphsink::RunOptions::default(),
            stop.clone(),
        ));
        (stop, task)
    };
    let (stop, task) = run(tg);
    eventually("version-0 rows and the edge folded", || async {
        rows_if_any(tg, "nodes/Person").await.len() >= 20
            && !rows_if_any(tg, "edges/Knows").await.is_empty()
    })
    .await;
    stop.cancel();
    task.await.unwrap().expect("version 0 runs");
    let before = tg.graph().await.head().await.unwrap();
    assert_eq!(before.schema_version, 0);

    e.write(1);
    let check = tg.cli(&["check"], &[]);
    assert!(check.status.success(), "{}", stderr(&check));
    let plan = String::from_utf8_lossy(&check.stdout).to_string();
    for want in [
        "loosening   Person: property age made optional (the column becomes nullable)",
        "additive    Person: new optional property city: Utf8",
        "additive    City: new node type (table nodes/City)",
        "additive    Knows: new optional property weight: Float64",
        "additive    LivesIn: new edge type (table edges/LivesIn)",
    ] {
        assert!(plan.lines().any(|l| l == want), "{want:?} not in {plan}");
    }
    let (stop, task) = run(tg);
    eventually("the schema commit", || async {
        tg.graph().await.head().await.unwrap().schema_version == 1
    })
    .await;
    let (people, knows, cities, lives) =
        (&tg.topics[0], &tg.topics[1], &tg.topics[2], &tg.topics[3]);
    produce(
        cities,
        &[rec(
            0,
            Some("Oslo"),
            Some(json!({"name": "Oslo", "population": 700000})),
        )],
    )
    .await;
    produce(people, &[v1_person("q", "Oslo")]).await;
    produce(
        knows,
        &[rec(
            0,
            None,
            Some(json!({"from": "q", "to": "p0", "weight": 0.5})),
        )],
    )
    .await;
    produce(
        lives,
        &[rec(0, None, Some(json!({"src": "q", "dst": "Oslo"})))],
    )
    .await;
    // Version-0 records keep coming after the version-1 ones.
    let so_far = produced.load(Ordering::SeqCst);
    wait_until(
        "ten more version-0 records",
        Duration::from_secs(60),
        || produced.load(Ordering::SeqCst) >= so_far + 10,
    )
    .await;
    done.store(true, Ordering::SeqCst);
    producer.await.unwrap();
    let n = produced.load(Ordering::SeqCst);
    eventually("every record folded", || async {
        rows_if_any(tg, "nodes/Person").await.len() == n + 1
            && rows_if_any(tg, "edges/LivesIn").await.len() == 1
            && rows_if_any(tg, "edges/Knows").await.len() == 2
    })
    .await;
    stop.cancel();
    task.await.unwrap().expect("version 1 runs");

    // One schema commit, between the folds of each version.
    let g = tg.graph().await;
    let commits = g.commits().await.unwrap();
    let schema_commits: Vec<_> = commits
        .iter()
        .filter(|c| c.schema_change.is_some())
        .collect();
    assert_eq!(schema_commits.len(), 1, "{commits:#?}");
    let sc = schema_commits[0];
    assert_eq!(sc.schema_version, 1);
    assert_eq!(sc.schema_change.as_ref().unwrap().changes.len(), 5);
    assert!(sc.folded.is_empty() && sc.offsets.is_empty());
    for c in &commits {
        assert_eq!(c.schema_version, u32::from(c.seq >= sc.seq), "{c:#?}");
    }
    let log = tg.cli(&["log", "--limit", "1000"], &[]);
    let log = String::from_utf8_lossy(&log.stdout);
    assert!(log.contains("  schema  version 1\n"), "{log}");
    assert!(
        log.contains("    additive    City: new node type (table nodes/City)\n"),
        "{log}"
    );

    // pylance at the head: every person, old rows with a null city.
    let head = g.head().await.unwrap();
    let persons = pylance_rows_at(&g, "nodes/Person", head.tables["nodes/Person"]);
    assert_eq!(persons.len(), n + 1);
    assert_eq!(persons["p1"]["city"], Value::Null);
    assert_eq!(persons["p1"]["age"], json!(1));
    assert_eq!(persons["q"]["city"], json!("Oslo"));
    assert_eq!(persons["q"]["age"], Value::Null);
    let cities_rows = pylance_rows_at(&g, "nodes/City", head.tables["nodes/City"]);
    assert_eq!(cities_rows["Oslo"]["population"], json!(700000));
    let knows_rows = pylance_rows_at(&g, "edges/Knows", head.tables["edges/Knows"]);
    let weights: Vec<&Value> = knows_rows.values().map(|r| &r["weight"]).collect();
    assert!(
        weights.contains(&&json!(0.5)) && weights.contains(&&Value::Null),
        "{knows_rows:?}"
    );
    // The commit before the change: its own columns, its own rows.
    let old = pylance_rows_at(&g, "nodes/Person", before.tables["nodes/Person"]);
    assert!(!old.is_empty());
    assert!(old.values().all(|r| r.get("city").is_none()), "{old:?}");
    let show = tg.cli(&["show", "--commit", &before.id], &[]);
    assert!(show.status.success(), "{}", stderr(&show));
    assert!(!String::from_utf8_lossy(&show.stdout).contains("nodes/City"));
}

/// A kill -9 at each step of the change: a start with the old schema is
/// refused by name (the head still pins the old tables, so readers see the
/// old graph), and a start with the new one finishes it.
async fn a_crash_mid_change_finishes_on_the_next_start(backend: Backend) {
    crate::init_logs();
    // Tables go in name order: City (new), then Person (altered), ...
    for (fp, old_refused) in [
        ("migrate.after_table=abort", false),
        ("migrate.after_table=abort@2", true),
        ("migrate.before_commit=abort", true),
    ] {
        let e = Evolving::new(backend.clone(), "").await;
        let tg = &e.tg;
        produce(e.person(), &(0..10).map(v0_person).collect::<Vec<_>>()).await;
        let out = tg.cli(&["run", "--exit-at-end"], &[]);
        assert!(out.status.success(), "{}", stderr(&out));
        let before = tg.graph().await.head().await.unwrap();

        e.write(1);
        produce(e.person(), &(10..20).map(v0_person).collect::<Vec<_>>()).await;
        let out = tg.cli(&["run", "--exit-at-end"], &[("GRAPHSINK_FAILPOINTS", fp)]);
        assert!(!out.status.success(), "{fp}: the failpoint did not fire");
        let g = tg.graph().await;
        assert_eq!(g.head().await.unwrap().schema_version, 0, "{fp}");
        // Nothing of version 1 is visible: the head pins the old tables.
        assert_eq!(tg.rows("nodes/Person").await.len(), 10, "{fp}");

        // The old schema: refused while an old table carries part of the
        // change; with only a new table made, it runs on the old graph.
        e.write(0);
        let out = tg.cli(&["run", "--exit-at-end"], &[]);
        let err = stderr(&out);
        if old_refused {
            assert_eq!(out.status.code(), Some(2), "{fp}: {err}");
            assert!(
                err.contains("nodes/Person carries an unfinished schema change"),
                "{fp}: {err}"
            );
        } else {
            assert!(out.status.success(), "{fp}: {err}");
            assert_eq!(tg.rows("nodes/Person").await.len(), 20, "{fp}");
        }

        e.write(1);
        produce(e.person(), &[v1_person("q", "Bergen")]).await;
        let out = tg.cli(&["run", "--exit-at-end"], &[]);
        assert!(out.status.success(), "{fp}: {}", stderr(&out));
        let g = tg.graph().await;
        let head = g.head().await.unwrap();
        assert_eq!(head.schema_version, 1, "{fp}");
        let persons = pylance_rows_at(&g, "nodes/Person", head.tables["nodes/Person"]);
        assert_eq!(persons.len(), 21, "{fp}");
        assert_eq!(persons["q"]["city"], json!("Bergen"), "{fp}");
        assert_eq!(persons["p3"]["city"], Value::Null, "{fp}");
        let old = pylance_rows_at(&g, "nodes/Person", before.tables["nodes/Person"]);
        assert_eq!(old.len(), 10, "{fp}");
    }
}

on_every_backend!(
    additive_changes_apply_at_start_while_a_producer_writes,
    a_crash_mid_change_finishes_on_the_next_start,
    two_members_mid_upgrade,
    destructive_changes_are_refused_and_a_rebuild_takes_them,
);

/// `evolve = "none"`: a start refuses the change by name, `migrate
/// --dry-run` prints it, `migrate` applies it offline; then a config older
/// than the graph is refused with the graph's version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_applies_what_evolve_none_refuses() {
    crate::init_logs();
    let e = Evolving::new(Backend::Local, "").await;
    let tg = &e.tg;
    produce(e.person(), &(0..5).map(v0_person).collect::<Vec<_>>()).await;
    let out = tg.cli(&["run", "--exit-at-end"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));

    e.write(1);
    let cfg = std::fs::read_to_string(tg.config_path()).unwrap();
    std::fs::write(
        tg.config_path(),
        cfg.replace("[graph]\n", "[graph]\nevolve = \"none\"\n"),
    )
    .unwrap();
    let out = tg.cli(&["run", "--exit-at-end"], &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.lines()
            .any(|l| l.trim() == "additive    Person: new optional property city: Utf8"),
        "{err}"
    );

    let out = tg.cli(&["migrate", "--dry-run"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("dry run: 5 change(s) against schema version 0; nothing applied"),
        "{text}"
    );
    assert_eq!(tg.graph().await.head().await.unwrap().schema_version, 0);

    let out = tg.cli(&["migrate"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("applied 5 change(s) as schema version 1"),
        "{text}"
    );
    let out = tg.cli(&["migrate"], &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("nothing to migrate: the graph is at schema version 1"),
        "{text}"
    );
    produce(e.person(), &[v1_person("q", "Oslo")]).await;
    let out = tg.cli(&["run", "--exit-at-end"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(tg.rows("nodes/Person").await["q"]["city"], json!("Oslo"));

    // A member still on version 0 is refused by name.
    e.write(0);
    let out = tg.cli(&["run", "--exit-at-end"], &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("the graph's schema is version 1, this config's is older (version 0)"),
        "{err}"
    );
}

/// Rows of `table` at the head, or none before the table has a commit.
async fn rows_if_any(tg: &TestGraph, table: &str) -> std::collections::BTreeMap<String, Value> {
    let Ok(g) = graphsink::Graph::open_configured(&tg.config()).await else {
        return Default::default(); // not created yet
    };
    let head = g.head().await.unwrap();
    match head.tables.get(table) {
        Some(&v) => read_table(&g, table, v).await,
        None => Default::default(),
    }
}

async fn eventually<F, Fut>(what: &str, f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    wait_for(what, Duration::from_secs(60), f).await
}

/// Two members under partition sharding, mid-upgrade: the member restarted
/// with the new schema migrates (its claim of every shard fences the
/// other); the member still on the old one is refused by name; restarted
/// with the new schema it proceeds, and nothing acknowledged is lost.
async fn two_members_mid_upgrade(backend: Backend) {
    crate::init_logs();
    let e = Evolving::new(
        backend,
        "[wal]\nsharding = \"partition\"\n[fold]\ninterval = \"500ms\"\n[offsets]\ncommit_interval = \"200ms\"",
    )
    .await;
    let tg = &e.tg;
    let dir = tg.dir.path();
    // Member a keeps its own copy of the version-0 schema and config.
    std::fs::copy(dir.join("graph.pg"), dir.join("old.pg")).unwrap();
    let old_cfg = std::fs::read_to_string(tg.config_path())
        .unwrap()
        .replace("schema = \"graph.pg\"", "schema = \"old.pg\"");
    std::fs::write(dir.join("old.toml"), old_cfg).unwrap();
    let old = || graphsink::Config::load(&dir.join("old.toml")).unwrap();
    let start = |config: graphsink::Config| {
        let stop = CancellationToken::new();
        let task = tokio::spawn(graphsink::run_with(
            config,
            graphsink::RunOptions::default(),
            stop.clone(),
        ));
        (task, stop)
    };
    // Keyed by id, as partition sharding asks of producers.
    let keyed = v0_person;
    let (a, _a_stop) = start(old());
    let (b, b_stop) = start(tg.config());
    produce(e.person(), &(0..20).map(keyed).collect::<Vec<_>>()).await;
    eventually("version-0 rows folded by the two members", || async {
        rows_if_any(tg, "nodes/Person").await.len() == 20
    })
    .await;

    // b restarts with version 1 and migrates.
    b_stop.cancel();
    b.await.unwrap().expect("b stops cleanly");
    e.write(1);
    let (b, b_stop) = start(tg.config());
    eventually("the schema commit", || async {
        tg.graph().await.head().await.unwrap().schema_version == 1
    })
    .await;
    // a's writers were fenced: its next write fails, its session restarts
    // and is refused at start (or its fold, at publish), by name.
    produce(e.person(), &(20..40).map(keyed).collect::<Vec<_>>()).await;
    let err = tokio::time::timeout(Duration::from_secs(60), a)
        .await
        .expect("the old member stops")
        .unwrap()
        .expect_err("the old member is refused");
    let msg = err.to_string();
    assert!(
        msg.contains("the graph's schema is version 1, this config's is older (version 0)")
            || msg.contains("the graph's schema is version 1, this process's is version 0"),
        "{msg}"
    );
    assert_eq!(err.kind(), graphsink::ErrorKind::BadConfig, "{msg}");
    // a restarted with version 1 proceeds beside b.
    let (a, a_stop) = start(tg.config());
    produce(e.person(), &[v1_person("q", "Oslo")]).await;
    eventually("every record folded", || async {
        rows_if_any(tg, "nodes/Person").await.len() == 41
    })
    .await;
    a_stop.cancel();
    b_stop.cancel();
    a.await.unwrap().expect("a stops cleanly");
    b.await.unwrap().expect("b stops cleanly");
    let rows = tg.rows("nodes/Person").await;
    assert_eq!(rows["q"]["city"], json!("Oslo"));
    assert_eq!(rows["p25"]["city"], Value::Null);
}

/// Every destructive change is refused at start, each on a line of its
/// own with the way forward, and the graph stays at its version; then the
/// way forward, a rebuild into a new root with a new group from the
/// earliest offset, holds every record under the new schema.
async fn destructive_changes_are_refused_and_a_rebuild_takes_them(backend: Backend) {
    crate::init_logs();
    let e = Evolving::new(backend, "").await;
    let tg = &e.tg;
    produce(e.person(), &(0..10).map(v0_person).collect::<Vec<_>>()).await;
    produce(
        &tg.topics[1],
        &[rec(0, None, Some(json!({"from": "p1", "to": "p0"})))],
    )
    .await;
    let out = tg.cli(&["run", "--exit-at-end"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let pg = tg.dir.path().join("graph.pg");
    let refused = |schema: &str, config: Option<&str>, want: &[&str]| {
        std::fs::write(&pg, schema).unwrap();
        if let Some(c) = config {
            std::fs::write(tg.config_path(), c).unwrap();
        }
        for cmd in ["check", "run"] {
            let out = tg.cli(&[cmd], &[]);
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(2), "{cmd}: {err}");
            let lines: Vec<&str> = err.lines().map(str::trim).collect();
            for w in want {
                assert!(
                    lines.iter().any(|l| l.starts_with(w)),
                    "{cmd}: {w:?} not a line of {err}"
                );
            }
            assert!(
                lines.last().unwrap().starts_with("graphsink: error:"),
                "{err}"
            );
        }
    };
    refused(
        "node Person { name: String  years: I32 @key }\nedge Knows: Person -> Person { since: I32 }\n",
        None,
        &[
            "destructive Person: @key changed from (name) to (years): every id is made of the key",
            "destructive Person: new required property years: rows already committed have no value",
            "destructive Person: property age dropped: its column holds values (a rename is a drop and an add)",
            "destructive Knows: property since made required: rows already committed may lack it",
        ],
    );
    let v0_config = std::fs::read_to_string(tg.config_path()).unwrap();
    let cut = v0_config.match_indices("[[mapping]]").nth(1).unwrap().0;
    let people_only = v0_config[..cut].to_string();
    let wide = "node Person { name: String @key  age: I64 }\n";
    refused(
        wide,
        Some(&people_only),
        &[
            "destructive Person: property age retyped from Int32 to Int64: widening a type needs the MemWAL drained",
            "destructive Knows: edge type dropped",
        ],
    );
    let g = tg.graph().await;
    assert_eq!(g.head().await.unwrap().schema_version, 0);

    // The rebuild (docs/schema-evolution.md): a new root and group over
    // the same topics, from the earliest offset.
    let root_line = people_only
        .lines()
        .find(|l| l.starts_with("root = \""))
        .unwrap();
    let new_root = format!("{}-v2\"", root_line.trim_end_matches('"'));
    let rebuilt = people_only
        .replace(root_line, &new_root)
        .replace(&tg.group, &format!("{}-v2", tg.group));
    assert_ne!(rebuilt, people_only);
    std::fs::write(tg.config_path(), &rebuilt).unwrap();
    let out = tg.cli(&["run", "--exit-at-end"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let g2 = tg.graph().await;
    assert!(g2.root().ends_with("-v2"), "{}", g2.root());
    let head = g2.head().await.unwrap();
    let persons = pylance_rows_at(&g2, "nodes/Person", head.tables["nodes/Person"]);
    assert_eq!(persons.len(), 10);
    assert_eq!(persons["p7"]["age"], json!(7));
    assert!(!head.tables.contains_key("edges/Knows"));
    let ds = plain_open(&g2, "nodes/Person").await;
    let age = ds.schema().field("age").unwrap();
    assert_eq!(age.data_type(), arrow::datatypes::DataType::Int64);
    // The old graph is untouched.
    assert_eq!(g.head().await.unwrap().tables.len(), 4);
}
