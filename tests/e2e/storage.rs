//! Object storage: an `s3://` root on the real S3 server (moto), with a
//! fault-injecting proxy between graphsink and it (testkit's FaultProxy:
//! moto cannot delay, fail or drop a reply on its own, so a proxy of ours
//! does, on the real wire between the real client and the real server).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use graphsink_testkit::faults::{Fault, FaultProxy, Rule};
use tokio_util::sync::CancellationToken;

use crate::harness::*;
use crate::pipeline::{people, Workload};

/// A proxy in front of the test S3 server, and a one-type graph behind it.
fn proxied_graph(extra: &str) -> (FaultProxy, TestGraph) {
    let upstream: SocketAddr = s3_endpoint()
        .trim_start_matches("http://")
        .parse()
        .expect("moto address");
    let proxy = FaultProxy::start(upstream).expect("start the fault proxy");
    let tg = TestGraph::on(
        Backend::S3Via(proxy.url()),
        SCHEMA,
        &["node = \"Person\""],
        extra,
    );
    (proxy, tg)
}

fn rule(method: &str, path_contains: &str, fault: Fault, times: Option<u32>) -> Rule {
    Rule {
        method: Some(method.to_string()),
        path_contains: Some(path_contains.to_string()),
        fault,
        times,
    }
}

/// Every expected row is at the head, with nothing extra.
async fn assert_people(tg: &TestGraph, w: &Workload) {
    let want: std::collections::BTreeMap<_, _> = w
        .expected
        .iter()
        .map(|(k, (v, _, _))| (k.clone(), v.clone()))
        .collect();
    assert_eq!(strip_provenance(&tg.rows("nodes/Person").await), want);
}

/// The chain of graph commits is a line: seq 0, 1, 2, ... each the child
/// of the one before (a double commit would repeat a seq or a parent).
async fn assert_linear_history(tg: &TestGraph) {
    let mut commits = graphsink::commits(&tg.config(), usize::MAX).await.unwrap();
    commits.sort_by_key(|c| c.seq);
    for (i, c) in commits.iter().enumerate() {
        assert_eq!(c.seq, i as u64, "{commits:?}");
        if i > 0 {
            assert_eq!(c.parent.as_ref(), Some(&commits[i - 1].id), "{commits:?}");
        }
    }
}

/// Latency on every request and 5xx (before and after the server saw the
/// request) on WAL and table writes: the client retries, nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_and_5xx_are_retried_and_nothing_is_lost() {
    crate::init_logs();
    let (proxy, tg) = proxied_graph("[fold]\ninterval = \"0s\"\n[wal]\nbuckets = 2");
    let topic = &tg.topics[0];
    create_topic(topic, 2).await;
    let w = people(200, 60, 2);
    produce(topic, &w.recs).await;
    // The first matching rule with uses left applies: faults first, then
    // latency on every other write.
    let before = proxy.add(rule("PUT", "/wal/", Fault::StatusBefore(503), Some(3)));
    let after = proxy.add(rule("PUT", "/wal/", Fault::StatusAfter(500), Some(2)));
    let data = proxy.add(rule("PUT", "/data/", Fault::StatusBefore(503), Some(2)));
    // A read whose connection is reset before it reaches the server.
    let read = proxy.add(rule("GET", "/_versions/", Fault::ResetBefore, Some(2)));
    proxy.add(rule(
        "PUT",
        "",
        Fault::Delay(Duration::from_millis(30)),
        None,
    ));
    let summary = try_run_to_end(&tg).await.expect("a run through 5xx");
    assert_eq!(summary.records as usize, w.recs.len());
    let fold = tg.cli(&["fold"], &[]);
    assert!(
        fold.status.success(),
        "{}",
        String::from_utf8_lossy(&fold.stderr)
    );
    assert_eq!(proxy.hits(before), 3, "503 before forwarding fired");
    assert_eq!(proxy.hits(after), 2, "500 after forwarding fired");
    assert_eq!(proxy.hits(data), 2, "503 on a data file fired");
    assert_eq!(proxy.hits(read), 2, "a reset read fired");
    assert_eq!(committed(&tg.group, topic, 2), end_offsets(topic, 2));
    assert_people(&tg, &w).await;
}

/// A WAL PUT lands at the server but its reply is lost (the connection is
/// reset after forwarding). The writer cannot know the entry landed; the
/// run reopens its shards under a new epoch (replaying what landed) and
/// goes on in the same process, re-reading what was never acked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_wal_reply_reopens_the_shard_and_carries_on() {
    crate::init_logs();
    let (proxy, tg) = proxied_graph("[fold]\ninterval = \"0s\"\n[wal]\nbuckets = 1");
    let topic = &tg.topics[0];
    create_topic(topic, 1).await;
    let w = people(120, 40, 1);
    produce(topic, &w.recs).await;
    // Every retry of the entry is reset too, until the writer gives up.
    let lost = proxy.add(rule("PUT", "/wal/", Fault::ResetAfter, Some(12)));
    let stats = Arc::new(graphsink::Metrics::default());
    let options = graphsink::RunOptions {
        exit_at_end: true,
        metrics: Some(stats.clone()),
        ..Default::default()
    };
    let run = graphsink::run_with(tg.config(), options, CancellationToken::new());
    tokio::time::timeout(Duration::from_secs(180), run)
        .await
        .expect("the run reached the end")
        .expect("the run survived the lost replies");
    assert!(proxy.hits(lost) >= 1, "the fault fired");
    assert!(stats.totals().restarts >= 1, "the shards were reopened");
    assert!(tg.cli(&["fold"], &[]).status.success());
    assert_eq!(committed(&tg.group, topic, 1), end_offsets(topic, 1));
    assert_people(&tg, &w).await;
}

/// A 30 s outage of the object store: ingest pauses, nothing is acked
/// while it lasts, and the same process carries on once it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_pauses_ingest_and_acks_nothing_until_it_ends() {
    crate::init_logs();
    let (proxy, tg) = proxied_graph(
        "[fold]\ninterval = \"1s\"\n[wal]\nbuckets = 2\n[offsets]\ncommit_interval = \"100ms\"",
    );
    let topic = &tg.topics[0];
    create_topic(topic, 2).await;
    let first = people(40, 40, 2);
    produce(topic, &first.recs).await;
    let stats = Arc::new(graphsink::Metrics::default());
    let options = graphsink::RunOptions {
        metrics: Some(stats.clone()),
        ..Default::default()
    };
    let stop = CancellationToken::new();
    let task = tokio::spawn(graphsink::run_with(tg.config(), options, stop.clone()));
    let ends = end_offsets(topic, 2);
    wait_until("the first records acked", Duration::from_secs(60), || {
        committed(&tg.group, topic, 2) == ends
    })
    .await;

    let outage = Duration::from_secs(30);
    proxy.outage(outage);
    let began = Instant::now();
    // Keys p1000.. so the second batch only adds rows.
    let second: Vec<Rec> = (1000..1040i32)
        .map(|i| {
            let k = format!("p{i}");
            rec(i % 2, Some(&k), Some(serde_json::json!({"name": k})))
        })
        .collect();
    produce(topic, &second).await;
    while began.elapsed() < outage - Duration::from_secs(2) {
        assert_eq!(
            committed(&tg.group, topic, 2),
            ends,
            "acked during the outage"
        );
        assert!(!task.is_finished(), "the run stopped during the outage");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let ends = end_offsets(topic, 2);
    wait_until("acks after the outage", Duration::from_secs(120), || {
        committed(&tg.group, topic, 2) == ends
    })
    .await;
    assert!(!task.is_finished(), "the same process carries on");
    stop.cancel();
    task.await.unwrap().expect("a clean stop after the outage");
    let rows = tg.rows("nodes/Person").await;
    for (id, (v, _, _)) in &first.expected {
        assert_eq!(rows[id]["age"], v["age"], "{id}");
    }
    for r in &second {
        assert!(rows.contains_key(r.key.as_ref().unwrap()), "{:?}", r.key);
    }
    assert_eq!(rows.len(), first.expected.len() + second.len());
}

/// A commit lands but its reply is lost, at each kind of commit a fold
/// makes: the `__manifest` publish, a table's Lance commit, and a shard
/// manifest (the offline fold claims every shard). Lance settles whether
/// it committed; the graph never gets a double commit, and no row is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_commit_reply_never_double_commits() {
    crate::init_logs();
    for commit in [
        "/__manifest/_versions/",
        "/nodes/Person/_versions/",
        "/nodes/Person/_mem_wal/",
    ] {
        lost_commit_reply(commit).await;
    }
}

async fn lost_commit_reply(path: &str) {
    // No fold at all in the run: the one fold is the faulted one.
    let (proxy, tg) =
        proxied_graph("[fold]\ninterval = \"0s\"\non_shutdown = false\n[wal]\nbuckets = 1");
    let topic = &tg.topics[0];
    create_topic(topic, 1).await;
    let w = people(50, 20, 1);
    produce(topic, &w.recs).await;
    try_run_to_end(&tg).await.expect("ingest");
    let lost = proxy.add(rule("PUT", path, Fault::ResetAfter, Some(1)));
    let out = tg.cli(&["fold"], &[]);
    assert_eq!(proxy.hits(lost), 1, "{path}: the fault fired");
    eprintln!(
        "fold with a lost reply on {path}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        // The fold may report the lost reply; the next start settles it.
        let again = tg.cli(&["fold"], &[]);
        assert!(
            again.status.success(),
            "{path}: {}",
            String::from_utf8_lossy(&again.stderr)
        );
    }
    assert_linear_history(&tg).await;
    assert_eq!(
        tg.graph().await.head().await.unwrap().seq,
        1,
        "{path}: one fold"
    );
    assert_people(&tg, &w).await;
}

/// Credentials reach neither errors nor logs, even at debug level.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_never_appear_in_errors_or_logs() {
    crate::init_logs();
    let tg = TestGraph::on(Backend::S3, SCHEMA, &["node = \"Person\""], "");
    let secret = "do-not-print-0xC0FFEE";
    let path = tg.config_path();
    let cfg = std::fs::read_to_string(&path).unwrap().replace(
        &format!(
            "aws_secret_access_key = \"{}\"",
            graphsink_testkit::s3::SECRET_KEY
        ),
        "aws_secret_access_key = \"${GS_TEST_SECRET}\"",
    );
    // An endpoint nobody listens on: the command fails while connecting.
    let cfg = cfg.replace(s3_endpoint(), "http://127.0.0.1:9");
    std::fs::write(&path, cfg).unwrap();
    let out = tg.cli(
        &["status"],
        &[
            ("GS_TEST_SECRET", secret),
            ("RUST_LOG", "debug"),
            ("OBJECT_STORE_CLIENT_MAX_RETRIES", "0"),
        ],
    );
    assert!(!out.status.success(), "no server there");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        all.contains("127.0.0.1:9"),
        "the error names the store: {all}"
    );
    assert!(!all.contains(secret), "the secret leaked: {all}");
}

/// With no `[graph.storage_options]`, the standard `AWS_*` variables reach
/// the store (Lance reads them itself).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_environment_variables_configure_the_store() {
    crate::init_logs();
    let tg = TestGraph::on(Backend::S3, SCHEMA, &["node = \"Person\""], "");
    let path = tg.config_path();
    let with_options = std::fs::read_to_string(&path).unwrap();
    let start = with_options.find("[graph.storage_options]").unwrap();
    let end = with_options.find("[kafka]").unwrap();
    let bare = format!("{}{}", &with_options[..start], &with_options[end..]);
    std::fs::write(&path, bare).unwrap();
    // `fold` opens (creates) the graph and folds nothing.
    let out = tg.cli(
        &["fold"],
        &[
            ("AWS_ENDPOINT", s3_endpoint()),
            ("AWS_REGION", graphsink_testkit::s3::REGION),
            ("AWS_ACCESS_KEY_ID", graphsink_testkit::s3::ACCESS_KEY),
            ("AWS_SECRET_ACCESS_KEY", graphsink_testkit::s3::SECRET_KEY),
            ("AWS_ALLOW_HTTP", "true"),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Read back with explicit options: the graph is on the S3 server.
    std::fs::write(&path, with_options).unwrap();
    assert_eq!(tg.graph().await.head().await.unwrap().seq, 0);
}
