//! Operability: `/ready` through the group join, a dead-letter outage and
//! a fencing; a real Prometheus scraping a connector under a workload with
//! rejects; `promtool check metrics` on the exposition; the exposed names
//! against docs/metrics.md's table; secrets kept out of logs and errors.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use graphsink::Metrics;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::harness::*;

/// One HTTP/1.1 GET: status, Content-Type, body.
async fn get(addr: &str, path: &str) -> (u16, String, String) {
    get_accepting(addr, path, None).await
}

/// One HTTP/1.1 GET with an `Accept` header, if given.
async fn get_accepting(addr: &str, path: &str, accept: Option<&str>) -> (u16, String, String) {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    let accept = accept
        .map(|a| format!("Accept: {a}\r\n"))
        .unwrap_or_default();
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{accept}Connection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("a response");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let ctype = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_default();
    (status, ctype, body.to_string())
}

pub(crate) async fn ready(addr: SocketAddr) -> (u16, Value) {
    let (status, _, body) = get(&addr.to_string(), "/ready").await;
    (status, serde_json::from_str(&body).expect("ready is JSON"))
}

/// Polls `/ready` until `want` holds for its JSON body.
pub(crate) async fn await_ready(
    addr: SocketAddr,
    what: &str,
    timeout: Duration,
    want: impl Fn(u16, &Value) -> bool,
) -> Value {
    let deadline = Instant::now() + timeout;
    loop {
        let (status, body) = ready(addr).await;
        if want(status, &body) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for /ready {what}: last {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A connector run in process (its metrics served by the test, `serve`).
struct Live {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<graphsink::Result<graphsink::RunSummary>>,
}

async fn serve(metrics: &Arc<Metrics>, stop: &CancellationToken) -> SocketAddr {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    graphsink::serve_http(any, metrics.clone(), stop.clone())
        .await
        .expect("serve http")
        .0
}

fn start(tg: &TestGraph, metrics: &Arc<Metrics>) -> Live {
    let stop = CancellationToken::new();
    let options = graphsink::RunOptions {
        metrics: Some(metrics.clone()),
        kafka_statistics: true,
        ..Default::default()
    };
    let task = tokio::spawn(graphsink::run_with(tg.config(), options, stop.clone()));
    Live { stop, task }
}

impl Live {
    async fn stop(self) -> graphsink::Result<graphsink::RunSummary> {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(60), self.task)
            .await
            .expect("the run stops")
            .expect("no panic")
    }
}

fn people(n: usize, from: usize) -> Vec<Rec> {
    (from..from + n)
        .map(|i| {
            rec(
                (i % 2) as i32,
                None,
                Some(json!({"name": format!("p{i}"), "age": 30})),
            )
        })
        .collect()
}

/// `graphsink fold` refuses while the group has a member; with `--force` it
/// claims every shard: a connector running on the graph is fenced at its
/// next write, which `then` (if any) makes.
async fn fence_by_offline_fold(tg: &TestGraph, topic: &str, then: &[Rec]) {
    let out = tg.cli(&["fold"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("consumer group {} has 1 member(s)", tg.group))
            && err.contains("--force"),
        "{err}"
    );
    let out = tg.cli(&["fold", "--force"], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    if !then.is_empty() {
        produce(topic, then).await;
    }
}

/// `/ready` is false until the group is joined and true after; it reports
/// a fencing (`graphsink fold` claims every shard) and recovers once a new
/// run holds the shards again. `status` follows: the member and its
/// partitions, and each shard's writer epoch rising with every claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_follows_the_group_join_and_a_fencing() {
    crate::init_logs();
    let tg = TestGraph::new(
        &["node = \"Person\""],
        "[fold]\ninterval = \"1s\"\n[offsets]\ncommit_interval = \"200ms\"",
    );
    let topic = &tg.topics[0];
    create_topic(topic, 2).await;
    produce(topic, &people(10, 0)).await;
    let metrics = Arc::new(Metrics::new(Duration::from_secs(60)));
    let http_stop = CancellationToken::new();
    let addr = serve(&metrics, &http_stop).await;

    let (status, body) = ready(addr).await;
    assert_eq!((status, &body["joined"]), (503, &json!(false)), "{body}");
    let live = start(&tg, &metrics);
    let body = await_ready(addr, "joined", Duration::from_secs(60), |s, b| {
        s == 200 && b["ready"] == json!(true)
    })
    .await;
    assert_eq!(body["joined"], json!(true));
    wait_until("all committed", Duration::from_secs(60), || {
        committed(&tg.group, topic, 2).values().sum::<i64>() == 10
    })
    .await;

    // `status` lists the group's one member (tansu 0.6 reports no member's
    // partitions; their decoding is unit-tested in kafka::queries), and for
    // each shard the writer epoch, which every claim raises, and who
    // claimed it.
    let cfg = tg.config();
    let k = graphsink::kafka_status(&cfg).await.expect("kafka status");
    let members = k.members.as_ref().expect("the group is described");
    assert_eq!(members.members.len(), 1, "{k:?}");
    let me = graphsink::shard_holder();
    let shards = || async {
        let g = graphsink::graph_status(&cfg).await.expect("graph status");
        let s: Vec<graphsink::ShardState> = g
            .shards
            .into_iter()
            .filter(|s| s.table == "nodes/Person")
            .collect();
        assert!(!s.is_empty(), "no shards of nodes/Person");
        s
    };
    // Every shard's epoch rose: `who` claimed them all.
    let rose = |before: &[u64], after: &[u64], who: &str| {
        assert_eq!(before.len(), after.len(), "{who}");
        assert!(
            before.iter().zip(after).all(|(b, a)| a > b),
            "{who} claimed every shard: {before:?} → {after:?}"
        );
    };
    let epochs = |s: &[graphsink::ShardState]| s.iter().map(|s| s.writer_epoch).collect::<Vec<_>>();
    let held_by = |s: &[graphsink::ShardState]| {
        s.iter()
            .map(|s| s.owner.as_ref().map(|o| o.holder.clone()))
            .collect::<Vec<_>>()
    };
    let now = shards().await;
    let running = epochs(&now);
    assert!(running.iter().all(|&e| e >= 1), "{running:?}");
    assert!(
        held_by(&now).iter().all(|h| h.as_ref() == Some(&me)),
        "{now:?}"
    );
    let out = tg.cli(&["status"], &[]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("  member ") && text.contains(&me), "{text}");

    // An offline fold fences the running writers; the run stops on it.
    fence_by_offline_fold(&tg, topic, &people(4, 10)).await;
    let ended = tokio::time::timeout(Duration::from_secs(60), live.task)
        .await
        .expect("the fenced run stops")
        .unwrap();
    let err = ended.expect_err("a fenced run fails");
    assert_eq!(err.kind(), graphsink::ErrorKind::Fenced, "{err}");
    let now = shards().await;
    let fenced = epochs(&now);
    rose(&running, &fenced, "the offline fold");
    // The fold was another process.
    assert!(
        held_by(&now)
            .iter()
            .all(|h| h.is_some() && h.as_ref() != Some(&me)),
        "{now:?}"
    );
    let (status, body) = ready(addr).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["fenced"], json!(true), "{body}");
    let (_, _, text) = get(&addr.to_string(), "/metrics").await;
    assert!(text.contains("graphsink_fenced_total 1"), "{text}");

    // A new run claims the shards again: ready.
    let live = start(&tg, &metrics);
    await_ready(
        addr,
        "after the fencing",
        Duration::from_secs(60),
        |s, b| s == 200 && b["fenced"] == json!(false),
    )
    .await;
    let now = shards().await;
    rose(&fenced, &epochs(&now), "the new run");
    assert!(
        held_by(&now).iter().all(|h| h.as_ref() == Some(&me)),
        "{now:?}"
    );
    live.stop().await.expect("stops cleanly");
    http_stop.cancel();
}

/// The real binary as an orchestrator runs it: `[http] listen` serves the
/// probes; fenced by an offline fold, the process keeps serving `/ready`
/// (503, `"fenced": true`) and the fencing counter for `[http] linger`, then
/// exits with code 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_its_probes_and_reports_a_fencing_before_it_exits() {
    crate::init_logs();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let tg = TestGraph::new(
        &["node = \"Person\""],
        &format!(
            // No timed fold: the offline fold below would race the run's
            // own fold for the same generation and lose with Lance's
            // "stale compaction" (a limit of the offline fold against a
            // live fold, README; not what this test is about).
            "[fold]\ninterval = \"0s\"\n[offsets]\ncommit_interval = \"200ms\"\n\
             [http]\nlisten = \"127.0.0.1:{port}\"\nlinger = \"30s\""
        ),
    );
    let topic = &tg.topics[0];
    create_topic(topic, 2).await;
    produce(topic, &people(5, 0)).await;
    let mut child = tg.spawn_run();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    // Not listening yet while the binary starts: retry the connection.
    let deadline = Instant::now() + Duration::from_secs(60);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "graphsink never listened on {addr}"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "graphsink exited early"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    await_ready(addr, "joined", Duration::from_secs(60), |s, b| {
        s == 200 && b["ready"] == json!(true)
    })
    .await;
    let (status, _, body) = get(&addr.to_string(), "/health").await;
    assert_eq!(status, 200, "{body}");
    wait_until("all committed", Duration::from_secs(60), || {
        committed(&tg.group, topic, 2).values().sum::<i64>() == 5
    })
    .await;

    fence_by_offline_fold(&tg, topic, &people(3, 5)).await;
    let body = await_ready(addr, "fenced", Duration::from_secs(60), |s, b| {
        s == 503 && b["fenced"] == json!(true)
    })
    .await;
    assert_eq!(
        child.try_wait().unwrap(),
        None,
        "it lingers, serving: {body}"
    );
    let (_, _, text) = get(&addr.to_string(), "/metrics").await;
    assert!(text.contains("graphsink_fenced_total 1"), "{text}");

    // SIGTERM ends the linger; the exit code still says "fenced".
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "graphsink did not exit after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(status.code(), Some(3), "exit code of a fenced run");
    // Its exit line names the fence; `binary` has checked that no line
    // carries a source location (Lance appends one to its fence's text).
    let exit = child
        .stderr()
        .lines()
        .find(|l| l.starts_with("graphsink: error: "))
        .unwrap_or_default();
    assert!(exit.contains("fenced"), "exit line: {exit:?}");
}

/// `/ready` turns false while the dead-letter producer cannot reach its
/// broker for longer than `stall_bound`, and true again once it can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_is_false_while_dead_letters_stall_and_recovers() {
    crate::init_logs();
    // A port nobody listens on, until the forwarder below opens it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let extra = format!(
        "[offsets]\ncommit_interval = \"100ms\"\n[http]\nstall_bound = \"2s\"\n\
         [errors.producer]\n\"bootstrap.servers\" = \"127.0.0.1:{port}\"\n\"message.timeout.ms\" = \"1000\""
    );
    let tg = TestGraph::new(&["node = \"Person\""], &extra);
    let topic = &tg.topics[0];
    create_topic(topic, 1).await;
    produce(
        topic,
        &[
            rec(0, None, Some(json!({"name": "a"}))),
            rec(0, None, Some(json!({"name": "b", "age": "x"}))),
        ],
    )
    .await;
    let metrics = Arc::new(Metrics::new(tg.config().http.stall_bound));
    let http_stop = CancellationToken::new();
    let addr = serve(&metrics, &http_stop).await;
    let live = start(&tg, &metrics);

    let body = await_ready(
        addr,
        "dead letters stalled",
        Duration::from_secs(60),
        |s, b| s == 503 && b["dead_letters_stalled"] == json!(true),
    )
    .await;
    assert_eq!(body["joined"], json!(true), "{body}");
    let (_, _, text) = get(&addr.to_string(), "/metrics").await;
    assert!(text.contains("graphsink_dead_letters_pending 1"), "{text}");
    assert!(
        text.contains("graphsink_dead_letters_total{result=\"failed\"}"),
        "{text}"
    );

    // The dead-letter broker comes back: a forwarder to the real one.
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    let upstream = broker().to_string();
    let forwarder = tokio::spawn(async move {
        loop {
            let Ok((mut inbound, _)) = listener.accept().await else {
                return;
            };
            let upstream = upstream.clone();
            tokio::spawn(async move {
                if let Ok(mut out) = tokio::net::TcpStream::connect(&upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                }
            });
        }
    });
    await_ready(addr, "recovered", Duration::from_secs(90), |s, b| {
        s == 200 && b["ready"] == json!(true)
    })
    .await;
    wait_until("committed past the reject", Duration::from_secs(30), || {
        committed(&tg.group, topic, 1).get(&0) == Some(&2)
    })
    .await;
    let (_, _, text) = get(&addr.to_string(), "/metrics").await;
    assert!(text.contains("graphsink_dead_letters_pending 0"), "{text}");
    assert!(
        text.contains("graphsink_dead_letters_total{result=\"succeeded\"} 1"),
        "{text}"
    );
    live.stop().await.expect("stops cleanly");
    forwarder.abort();
    http_stop.cancel();
}

/// Prometheus's instant query: the result vector.
async fn prom_query(prom: &str, query: &str) -> Vec<Value> {
    let enc: String = query
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect();
    let host = prom.trim_start_matches("http://");
    let (status, _, body) = get(host, &format!("/api/v1/query?query={enc}")).await;
    assert_eq!(status, 200, "query {query}: {body}");
    let v: Value = serde_json::from_str(&body).expect("prometheus answers JSON");
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

fn sample(v: &Value) -> f64 {
    v["value"][1]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Polls a query until `want` holds for its result.
async fn await_prom(
    prom: &str,
    query: &str,
    timeout: Duration,
    want: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let deadline = Instant::now() + timeout;
    loop {
        let r = prom_query(prom, query).await;
        if want(&r) {
            return r;
        }
        assert!(
            Instant::now() < deadline,
            "timed out on Prometheus query {query}: last {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A real Prometheus (scripts/test.sh starts it) scrapes the connector
/// while it ingests records with rejects: the committed offsets reach the
/// end offsets, the rejects counter equals the rejects produced, and the
/// fold counter advances. The same scrape passes `promtool check metrics`
/// and its names and labels match docs/metrics.md's table. Then an offline fold
/// fences the run, Prometheus sees `graphsink_fenced_total`, and every query
/// of deploy/'s dashboard evaluates to data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_offsets_rejects_and_folds() {
    crate::init_logs();
    let (Ok(prom), Ok(targets)) = (
        std::env::var("GRAPHSINK_TEST_PROMETHEUS"),
        std::env::var("GRAPHSINK_TEST_PROM_TARGETS"),
    ) else {
        panic!(
            "no Prometheus for the tests: run `bash scripts/test.sh`, which starts one \
             (GRAPHSINK_TEST_PROMETHEUS and GRAPHSINK_TEST_PROM_TARGETS are unset)"
        );
    };
    let tg = TestGraph::with_schema(
        "node Person { name: String @key  age: I32? }\nedge Knows: Person -> Person",
        &["node = \"Person\"", "edge = \"Knows\""],
        "[fold]\ninterval = \"1s\"\n[offsets]\ncommit_interval = \"200ms\"",
    );
    let (persons, knows) = (&tg.topics[0], &tg.topics[1]);
    create_topic(persons, 2).await;
    create_topic(knows, 1).await;
    let mut recs = people(40, 0);
    // Six rejects: three wrong types, three that are not JSON.
    for i in 0..3 {
        recs.push(rec(
            i % 2,
            None,
            Some(json!({"name": format!("bad{i}"), "age": "old"})),
        ));
        recs.push(Rec {
            partition: i % 2,
            key: None,
            value: Some("{not json".into()),
        });
    }
    produce(persons, &recs).await;
    // An edge whose endpoint never arrives stays deferred.
    produce(
        knows,
        &[rec(0, None, Some(json!({"src": "p1", "dst": "nobody"})))],
    )
    .await;

    let metrics = Arc::new(Metrics::new(Duration::from_secs(60)));
    let http_stop = CancellationToken::new();
    let addr = serve(&metrics, &http_stop).await;
    let id = unique("scrape");
    let t = json!([{"targets": [addr.to_string()], "labels": {"test": id}}]);
    std::fs::write(&targets, t.to_string()).expect("write the targets file");
    let live = start(&tg, &metrics);

    let sel = format!("{{test=\"{id}\",topic=\"{persons}\"}}");
    let ends = end_offsets(persons, 2);
    let committed_q = format!("graphsink_committed_offset{sel}");
    let r = await_prom(&prom, &committed_q, Duration::from_secs(90), |r| {
        r.len() == 2
            && r.iter().all(|s| {
                let p: i32 = s["metric"]["partition"].as_str().unwrap().parse().unwrap();
                sample(s) == ends[&p] as f64
            })
    })
    .await;
    assert_eq!(r.len(), 2);
    // librdkafka's statistics report the same end offsets (every 5 s).
    await_prom(
        &prom,
        &format!("graphsink_end_offset{sel}"),
        Duration::from_secs(60),
        |r| {
            r.len() == 2
                && r.iter()
                    .all(|s| ends.values().any(|&e| sample(s) == e as f64))
        },
    )
    .await;
    await_prom(
        &prom,
        &format!("sum(graphsink_lag{sel})"),
        Duration::from_secs(60),
        |r| r.len() == 1 && sample(&r[0]) == 0.0,
    )
    .await;
    let rejects_q = format!("sum(graphsink_rejects_total{{test=\"{id}\"}})");
    await_prom(&prom, &rejects_q, Duration::from_secs(60), |r| {
        r.len() == 1 && sample(&r[0]) == 6.0
    })
    .await;
    let by_code = prom_query(&prom, &format!("graphsink_rejects_total{{test=\"{id}\"}}")).await;
    let codes: BTreeSet<String> = by_code
        .iter()
        .map(|s| s["metric"]["code"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        codes,
        BTreeSet::from(["malformed_json".to_string(), "wrong_type".to_string()]),
        "{by_code:?}"
    );

    // Folds: at least one, then another once more records arrive.
    let folds_q = format!("graphsink_folds_total{{test=\"{id}\"}}");
    let r = await_prom(&prom, &folds_q, Duration::from_secs(60), |r| {
        r.len() == 1 && sample(&r[0]) >= 1.0
    })
    .await;
    let before = sample(&r[0]);
    produce(persons, &people(5, 100)).await;
    await_prom(&prom, &folds_q, Duration::from_secs(60), |r| {
        r.len() == 1 && sample(&r[0]) > before
    })
    .await;
    await_prom(
        &prom,
        &format!("graphsink_pending_edges{{test=\"{id}\",type=\"Knows\"}}"),
        Duration::from_secs(60),
        |r| r.len() == 1 && sample(&r[0]) == 1.0,
    )
    .await;
    await_prom(
        &prom,
        &format!("graphsink_durable_ack_seconds_count{{test=\"{id}\"}}"),
        Duration::from_secs(30),
        |r| r.len() == 1 && sample(&r[0]) >= 1.0,
    )
    .await;

    // What `curl … | promtool check metrics` sees: the Prometheus text format.
    let (status, ctype, text) = get(&addr.to_string(), "/metrics").await;
    assert_eq!(status, 200);
    assert_eq!(ctype, graphsink::METRICS_TEXT_CONTENT_TYPE);
    promtool_check(&text);
    names_match_the_spec(&text);
    // What Prometheus asks for (its 2.x Accept header): OpenMetrics, same names.
    let (status, ctype, open) =
        get_accepting(&addr.to_string(), "/metrics", Some(PROMETHEUS_ACCEPT)).await;
    assert_eq!(status, 200);
    assert_eq!(ctype, graphsink::METRICS_CONTENT_TYPE);
    assert!(open.ends_with("# EOF\n"), "{open}");
    names_match_the_spec(&open);

    // A fencing event, as an operator meets it: an offline fold claims the
    // shards, the run stops, and the still-served endpoint shows it.
    fence_by_offline_fold(&tg, persons, &[]).await;
    let ended = tokio::time::timeout(Duration::from_secs(60), live.task)
        .await
        .expect("the fenced run stops")
        .unwrap();
    assert_eq!(
        ended.expect_err("fenced").kind(),
        graphsink::ErrorKind::Fenced
    );
    await_prom(
        &prom,
        &format!("graphsink_fenced_total{{test=\"{id}\"}}"),
        Duration::from_secs(30),
        |r| r.len() == 1 && sample(&r[0]) == 1.0,
    )
    .await;
    // The run has stopped, so no fold ends between two families' lines.
    let (_, _, text) = get(&addr.to_string(), "/metrics").await;
    fold_phases_add_up(&text);

    // Every query of the example dashboard evaluates against this scrape
    // and returns data (the test job is named as in deploy/, `graphsink`).
    for expr in dashboard_queries() {
        let r = await_prom(&prom, &expr, Duration::from_secs(60), |r| !r.is_empty()).await;
        assert!(r.iter().all(|s| s["value"][1].is_string()), "{expr}: {r:?}");
    }
    let fenced = prom_query(&prom, "sum(increase(graphsink_fenced_total[5m]))").await;
    assert!(
        sample(&fenced[0]) > 0.0,
        "the dashboard's fencing panel shows the event: {fenced:?}"
    );
    std::fs::write(&targets, "[]").expect("clear the targets file");
    http_stop.cancel();
}

/// `graphsink_fold_phase_seconds` has every phase once per published fold,
/// and the phases add up to `graphsink_fold_seconds` (they are laps of one
/// clock, so a phase left out or counted twice shows).
fn fold_phases_add_up(text: &str) {
    const PHASES: [&str; 10] = [
        "cut",
        "plan",
        "read",
        "view",
        "check",
        "write",
        "compact",
        "index",
        "publish",
        "dead_letters",
    ];
    let value = |line_start: &str| -> f64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(line_start))
            .unwrap_or_else(|| panic!("no `{line_start}` in the scrape:\n{text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let folds = value("graphsink_fold_seconds_count ");
    let total = value("graphsink_fold_seconds_sum ");
    assert!(folds >= 2.0, "folds: {folds}");
    let mut sum = 0.0;
    for phase in PHASES {
        let count = value(&format!(
            "graphsink_fold_phase_seconds_count{{phase=\"{phase}\"}} "
        ));
        assert_eq!(count, folds, "{phase}: one observation per published fold");
        sum += value(&format!(
            "graphsink_fold_phase_seconds_sum{{phase=\"{phase}\"}} "
        ));
    }
    assert!(
        sum <= total && sum >= total - 0.05 * folds,
        "the phases add up to {sum} s, the folds took {total} s"
    );
    assert!(
        value("graphsink_fold_phase_seconds_sum{phase=\"cut\"} ") > 0.0,
        "a cut waits for at least one flush"
    );
}

/// The PromQL of every panel of deploy/'s Grafana dashboard.
fn dashboard_queries() -> BTreeSet<String> {
    fn walk(v: &Value, out: &mut BTreeSet<String>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(e)) = m.get("expr") {
                    out.insert(e.clone());
                }
                m.values().for_each(|v| walk(v, out));
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/grafana/dashboards/graphsink.json"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut out = BTreeSet::new();
    walk(
        &serde_json::from_str(&text).expect("the dashboard is JSON"),
        &mut out,
    );
    assert!(out.len() >= 10, "the dashboard's queries: {out:?}");
    out
}

/// The Accept header Prometheus 2.x scrapes with.
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// `promtool check metrics` (Prometheus's linter) on an exposition.
fn promtool_check(exposition: &str) {
    use std::io::Write;
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (scripts/test.sh installs Debian's prometheus package)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(exposition.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}\n--- exposition ---\n{exposition}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `| `name` | type | labels | meaning |` rows of the first table under
/// `heading` in a markdown file: name → (type, labels).
fn metric_table(path: &str, heading: &str) -> BTreeMap<String, (String, BTreeSet<String>)> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let at = text
        .find(heading)
        .unwrap_or_else(|| panic!("{path} has no {heading:?}"));
    let mut out = BTreeMap::new();
    for line in text[at..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
    {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let Some(name) = cells
            .get(1)
            .and_then(|c| c.strip_prefix('`'))
            .and_then(|c| c.strip_suffix('`'))
        else {
            continue;
        };
        // `op (`upserted`, ...)`: the values in parentheses are not labels.
        let mut bare = String::new();
        let mut depth = 0;
        for c in cells[3].chars() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                c if depth == 0 => bare.push(c),
                _ => {}
            }
        }
        let labels = bare
            .split(',')
            .map(|l| l.trim().split(' ').next().unwrap_or("").to_string())
            .filter(|l| !l.is_empty() && l != "—")
            .collect();
        out.insert(name.to_string(), (cells[2].to_string(), labels));
    }
    out
}

/// What an exposition declares: name as scraped (counters with `_total`)
/// → (type, label names seen on its samples).
fn exposed(text: &str) -> BTreeMap<String, (String, BTreeSet<String>)> {
    let mut types = BTreeMap::new();
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').unwrap();
            types.insert(name.to_string(), ty.to_string());
        }
    }
    let mut out = BTreeMap::new();
    for (name, ty) in &types {
        let mut labels = BTreeSet::new();
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            let metric = l.split(['{', ' ']).next().unwrap();
            let base = ["_total", "_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| metric.strip_suffix(s))
                .unwrap_or(metric);
            if base != name && metric != name {
                continue;
            }
            if let Some((_, rest)) = l.split_once('{') {
                for pair in rest.split('}').next().unwrap().split(',') {
                    let k = pair.split('=').next().unwrap();
                    if k != "le" && !k.is_empty() {
                        labels.insert(k.to_string());
                    }
                }
            }
        }
        // OpenMetrics names the counter family without `_total`; the
        // Prometheus text format with it.
        let shown = if ty == "counter" && !name.ends_with("_total") {
            format!("{name}_total")
        } else {
            name.clone()
        };
        out.insert(shown, (ty.clone(), labels));
    }
    out
}

/// docs/metrics.md's table lists exactly the exposed names, with their
/// types and labels (labels checked where samples exist).
fn names_match_the_spec(text: &str) {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let spec = metric_table(&format!("{root}/docs/metrics.md"), "## Metrics");
    let got = exposed(text);
    let names = |m: &BTreeMap<String, _>| m.keys().cloned().collect::<BTreeSet<String>>();
    assert_eq!(
        names(&got),
        names(&spec),
        "exposed names (left) against docs/metrics.md (right)"
    );
    for (name, (ty, labels)) in &got {
        let (rty, rlabels) = &spec[name];
        assert_eq!(ty, rty, "{name}: type");
        if !labels.is_empty() {
            assert_eq!(labels, rlabels, "{name}: labels");
        }
    }
}

/// A SASL password and a `${VAR}` secret never show, in text or JSON logs
/// or in the error, even when a typo'd property makes librdkafka quote the
/// value back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_show_in_logs_or_errors() {
    const PASSWORD: &str = "sasl-pw-61c2e9";
    const TOKEN: &str = "env-token-a8d3f0";
    // Echoed config too: `run` prints the graph root it checked.
    const ROOT: &str = "graph-d41f9a";
    let tg = TestGraph::new(&["node = \"Person\""], "");
    let cfg = std::fs::read_to_string(tg.config_path()).unwrap();
    assert!(cfg.contains("root = \"graph\"\n"), "{cfg}");
    let cfg = cfg.replace("root = \"graph\"\n", "root = \"${GS_OPS_SECRET_ROOT}\"\n").replace(
        "[kafka]\n",
        &format!("[kafka]\n\"sasl.username\" = \"u\"\n\"sasl.password\" = \"{PASSWORD}\"\n\"sasl.passwd\" = \"${{GS_OPS_TEST_TOKEN}}\"\n"),
    );
    std::fs::write(tg.config_path(), cfg).unwrap();
    for format in ["text", "json"] {
        let out = tg.cli(
            &["--log-format", format, "run"],
            &[
                ("GS_OPS_TEST_TOKEN", TOKEN),
                ("GS_OPS_SECRET_ROOT", ROOT),
                ("RUST_LOG", "debug,lance=warn,datafusion=warn"),
            ],
        );
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(!out.status.success(), "the typo'd property fails the run");
        assert!(
            stderr.contains("sasl.passwd"),
            "the error names the property: {stderr}"
        );
        assert!(
            stdout.contains("graph root") && stdout.contains("<redacted>"),
            "{stdout}"
        );
        for secret in [PASSWORD, TOKEN, ROOT] {
            assert!(
                !stdout.contains(secret) && !stderr.contains(secret),
                "{format}: {secret} shown:\n{stdout}\n{stderr}"
            );
        }
        if format == "json" {
            let events: Vec<Value> = stderr
                .lines()
                .filter(|l| l.starts_with('{'))
                .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
                .collect();
            assert!(!events.is_empty(), "JSON log lines: {stderr}");
            for e in &events {
                for field in ["timestamp", "level", "target"] {
                    assert!(e.get(field).is_some(), "{field} missing: {e}");
                }
            }
        }
    }
}
