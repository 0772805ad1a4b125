//! The consumer group's liveness: a member that holds no partition while
//! nobody consumes its topics must not sit there silently (kafka/stall.rs),
//! and an idle member of a healthy group must not be taken for stalled.
//!
//! The stuck group is made with a real broker and a real second member: a
//! plain consumer that takes the only partition and never commits (a peer
//! that hangs while keeping its session alive). tansu 0.6's own wedge after
//! a broker freeze looks the same to graphsink: no assignment, lag, and
//! committed offsets that do not move.

use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::binary::{self, Running};
use crate::harness::*;

/// What the plain member did: records read, and whether it held its
/// partition from the moment it got it until it stopped (so the member
/// under test held none of it).
struct Held {
    read: u64,
    kept: bool,
}

/// A plain member of `group` on `topic`: it polls (keeping its session and
/// its partitions) until `stop`; it commits what it read only if `commits`.
/// Returns once it holds a partition, with the thread that keeps polling.
fn second_member(
    group: &str,
    topic: &str,
    commits: bool,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Held> {
    let (group, topic) = (group.to_string(), topic.to_string());
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        let c: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", broker())
            .set("group.id", &group)
            .set("partition.assignment.strategy", "cooperative-sticky")
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", "6000")
            .create()
            .unwrap();
        c.subscribe(&[&topic]).unwrap();
        let mut read = 0u64;
        let mut kept = true;
        let mut ready = Some(ready_tx);
        while !stop.load(Ordering::Relaxed) {
            if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
                read += 1;
                if commits {
                    c.commit_message(&m, CommitMode::Sync).unwrap();
                }
            }
            let holds = c.assignment().map(|a| a.count()).unwrap_or(0) > 0;
            if holds {
                if let Some(tx) = ready.take() {
                    let _ = tx.send(());
                }
            } else if ready.is_none() {
                kept = false;
            }
        }
        Held { read, kept }
    });
    ready_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the second member got the partition");
    h
}

/// A graph with a 2 s stall bound on a one-partition topic holding 20 records.
async fn one_partition_of_20() -> (TestGraph, String) {
    let tg = TestGraph::new(&["node = \"Person\""], "[offsets]\nstall_timeout = \"2s\"");
    let topic = tg.topics[0].clone();
    create_topic(&topic, 1).await;
    let recs: Vec<Rec> = (0..20)
        .map(|i| rec(0, None, Some(json!({"name": format!("p{i}")}))))
        .collect();
    produce(&topic, &recs).await;
    (tg, topic)
}

/// Runs `graphsink run` to its end (at most `limit`): exit status, stderr.
fn run_binary(tg: &TestGraph, limit: Duration) -> (Option<i32>, String) {
    let mut cmd = binary::graphsink();
    cmd.args(["run", "--config"])
        .arg(tg.config_path())
        .env("RUST_LOG", "info,lance=warn")
        .stdout(Stdio::null());
    graphsink_testkit::tie_to_parent(&mut cmd);
    let mut child = Running::spawn(cmd);
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    (status, child.stderr().to_string())
}

/// The held-out finding: a member joined, got no assignment, and sat for
/// minutes with the topic's records waiting and nothing logged. Now it
/// warns and rejoins after `offsets.stall_timeout`, and when the rejoin
/// changes nothing it exits non-zero, saying why, so an orchestrator
/// restarts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_without_partitions_while_nobody_consumes_rejoins_then_exits() {
    let (tg, topic) = one_partition_of_20().await;
    let stop = Arc::new(AtomicBool::new(false));
    let squatter = second_member(&tg.group, &topic, false, stop.clone());

    let started = Instant::now();
    let (status, stderr) = tokio::task::block_in_place(|| run_binary(&tg, Duration::from_secs(90)));
    stop.store(true, Ordering::Relaxed);
    let held = squatter.join().unwrap();
    assert!(held.kept, "graphsink was given the partition:\n{stderr}");

    assert!(
        status.is_some(),
        "graphsink sat unassigned for 90 s:\n{stderr}"
    );
    assert_ne!(status, Some(0), "a stuck group is a failure:\n{stderr}");
    assert!(
        stderr.contains("rejoining the group"),
        "no WARN before the rejoin:\n{stderr}"
    );
    assert!(
        stderr.contains("no partition assigned") && stderr.contains("20 records"),
        "the exit does not say why:\n{stderr}"
    );
    // Two bounds to a rejoin, two more to give up, plus the joins.
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    assert!(committed(&tg.group, &topic, 1).is_empty());
}

/// An idle member of a group whose other member consumes and commits is
/// fine for as long as it stays idle: the offsets it watches move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_member_of_a_consuming_group_is_not_stalled() {
    crate::init_logs();
    let tg = TestGraph::new(&["node = \"Person\""], "[offsets]\nstall_timeout = \"1s\"");
    let topic = tg.topics[0].clone();
    create_topic(&topic, 1).await;
    let stop = Arc::new(AtomicBool::new(false));
    let worker = second_member(&tg.group, &topic, true, stop.clone());

    let run_stop = CancellationToken::new();
    let run = tokio::spawn(graphsink::run(tg.config(), run_stop.clone()));
    // Records keep arriving for 12 bounds; the other member takes them all.
    let until = Instant::now() + Duration::from_secs(12);
    let mut i = 0;
    while Instant::now() < until {
        produce(
            &topic,
            &[rec(0, None, Some(json!({"name": format!("q{i}")})))],
        )
        .await;
        i += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !run.is_finished(),
            "the idle member stopped: {:?}",
            run.await
        );
    }
    run_stop.cancel();
    let summary = run.await.unwrap().expect("the idle member ends cleanly");
    assert_eq!(summary.records, 0, "the idle member was given records");
    wait_until(
        "the other member committed every record",
        Duration::from_secs(30),
        || committed(&tg.group, &topic, 1).get(&0) == Some(&(i as i64)),
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let held = tokio::task::spawn_blocking(move || worker.join().unwrap())
        .await
        .unwrap();
    assert!(held.kept, "the other member lost the partition");
    assert_eq!(
        held.read, i as u64,
        "the other member consumed every record"
    );
}

/// `run --exit-at-end` on a member that holds nothing (more members than
/// partitions, or a group that forgot it) ends once the group has
/// committed every mapped partition to its end. It waited forever: without
/// lag the stall watch rightly does nothing (seen in the S3 crash test of
/// docs/retention.md, where tansu left a lone member unassigned).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_at_end_without_partitions_ends_once_the_group_is_at_the_end() {
    crate::init_logs();
    let (tg, topic) = one_partition_of_20().await;
    let stop = Arc::new(AtomicBool::new(false));
    let worker = second_member(&tg.group, &topic, true, stop.clone());
    wait_until(
        "the other member committed everything",
        Duration::from_secs(30),
        || committed(&tg.group, &topic, 1).get(&0) == Some(&20),
    )
    .await;

    let started = Instant::now();
    let summary = try_run_to_end(&tg).await.expect("it ends at the end");
    assert_eq!(summary.records, 0, "it held nothing");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    stop.store(true, Ordering::Relaxed);
    let held = tokio::task::spawn_blocking(move || worker.join().unwrap())
        .await
        .unwrap();
    // Had graphsink been given the partition (at its end already), it
    // would also end with 0 records: the other member must have kept it.
    assert!(held.kept, "graphsink was given the partition");
}

/// Several instances started together on a fresh root: exactly one
/// initialises it, the others open what it made (found when three `graphsink
/// run` started at once and two died with "Dataset already exists"; a
/// second Lance create racing the first lands as an overwrite and drops the
/// first one's MemWAL index). Each opener runs on its own thread, runtime
/// and object store, as separate processes would; a barrier lines them up.
#[test]
fn instances_starting_together_share_one_initialisation() {
    const OPENERS: usize = 4;
    for round in 0..4 {
        let tg = TestGraph::new(&["node = \"Person\"", "node = \"Company\""], "");
        let barrier = Arc::new(std::sync::Barrier::new(OPENERS));
        let openers: Vec<_> = (0..OPENERS)
            .map(|_| {
                let (config, barrier) = (tg.config(), barrier.clone());
                std::thread::spawn(move || {
                    let rt = tokio::runtime::Runtime::new().unwrap();
                    let schema = graphsink::GraphSchema::load(&config.schema_path()).unwrap();
                    barrier.wait();
                    rt.block_on(graphsink::Graph::open_or_init(&config, schema))
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                })
            })
            .collect();
        for (i, o) in openers.into_iter().enumerate() {
            let opened = o.join().unwrap();
            assert!(opened.is_ok(), "round {round}, opener {i}: {opened:?}");
        }
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let g = tg.graph().await;
            let commits = g.commits().await.unwrap();
            assert_eq!(commits.len(), 1, "round {round}: one init commit");
            if round > 0 {
                return;
            }
            // And the graph works: a run ingests into it.
            let topic = tg.topics[0].clone();
            create_topic(&topic, 1).await;
            create_topic(&tg.topics[1], 1).await;
            produce(&topic, &[rec(0, None, Some(json!({"name": "ada"})))]).await;
            try_run_to_end(&tg)
                .await
                .expect("a run on the shared graph");
            assert_eq!(tg.rows("nodes/Person").await.len(), 1);
        });
    }
}

/// A claim to initialise left by a process that died (older than the
/// wait, with no graph) is taken over, so a crash during a first start
/// does not block every later start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_initialisers_claim_is_taken_over() {
    let tg = TestGraph::new(&["node = \"Person\""], "");
    let config = tg.config();
    let claims = std::path::Path::new(&config.root_uri()).join("_graphsink_init");
    std::fs::create_dir_all(&claims).unwrap();
    let stale = std::fs::File::create(claims.join("0")).unwrap();
    stale
        .set_modified(std::time::SystemTime::now() - Duration::from_secs(600))
        .unwrap();
    let schema = graphsink::GraphSchema::load(&config.schema_path()).unwrap();
    let opened = tokio::time::timeout(
        Duration::from_secs(30),
        graphsink::Graph::open_or_init(&config, schema),
    )
    .await
    .expect("no wait for a dead claimant");
    opened.expect("the next claim initialises");
    assert!(claims.join("1").exists(), "taken over under claim 1");
    assert_eq!(tg.graph().await.commits().await.unwrap().len(), 1);
}
