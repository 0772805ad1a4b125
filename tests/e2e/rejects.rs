//! Rejects: every bad record lands once in `_ingest_rejects` and once on the
//! dead-letter topic, read back by independent clients (plain Lance, a
//! plain Kafka consumer); the good records around it land; offsets commit.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::harness::*;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

const CORPUS_SCHEMA: &str = r#"
node Person {
    name: String @key  age: I32?  n: U32?  color: enum(red, green)?  code: String?
    @range(age, 0..150)  @check(code, "^[A-Z]{3}$")
}
node Company { ticker: String @key  name: String }
node Tag { label: String @key }
"#;

/// The hostile corpus: each bad record gives exactly one reject with its
/// code, in both sinks, with the original bytes and headers; the good ones
/// land; every offset is committed.
async fn a_hostile_corpus_is_rejected_record_by_record_in_both_sinks(backend: Backend) {
    crate::init_logs();
    let tg = TestGraph::on(
        backend,
        CORPUS_SCHEMA,
        &[
            "node = \"Person\"",
            "node = \"Company\"",
            "node = \"Tag\"\nkey = \"kafka\"",
        ],
        "[errors]\nmax_record_bytes = 4096",
    );
    let (people, companies, tags) = (&tg.topics[0], &tg.topics[1], &tg.topics[2]);
    for t in [people, companies, tags] {
        create_topic(t, 1).await;
    }
    let v = |s: &str| Some(s.as_bytes().to_vec());
    let big = format!(r#"{{"name":"g","code":"{}"}}"#, "A".repeat(5000));
    // (value, expected code) in offset order on partition 0.
    let person_corpus: Vec<(Option<Vec<u8>>, Option<&str>)> = vec![
        (v(r#"{"name":"a","age":30}"#), None),
        (v(r#"{"name":"#), Some("malformed_json")),
        (v(r#"{"name":"b","age":"old"}"#), Some("wrong_type")),
        (v(r#"{"name":"c","age":3000000000}"#), Some("overflow")),
        (v(r#"{"name":"d","color":"blue"}"#), Some("enum")),
        (v(r#"{"name":"e","age":151}"#), Some("range")),
        (v(r#"{"name":"f","code":"abc"}"#), Some("check")),
        (v(&big), Some("oversized")),
        (Some(b"{\"name\":\"\xff\"}".to_vec()), Some("not_utf8")),
        (v(r#"{"name":"h","extra":1}"#), Some("unknown_field")),
        (
            v(r#"{"name":"i","age":150,"code":"ABC","color":"red"}"#),
            None,
        ),
    ];
    let recs: Vec<RawRec> = person_corpus
        .iter()
        .enumerate()
        .map(|(i, (value, _))| RawRec {
            partition: 0,
            key: Some(format!("k{i}").into_bytes()),
            value: value.clone(),
            headers: vec![("trace".into(), format!("t-{i}").into_bytes())],
        })
        .collect();
    produce_raw(people, &recs).await;
    produce_raw(
        companies,
        &[
            RawRec {
                value: v(r#"{"ticker":"X"}"#),
                ..Default::default()
            },
            RawRec {
                value: v(r#"{"ticker":"Y","name":"Yco"}"#),
                ..Default::default()
            },
        ],
    )
    .await;
    produce_raw(
        tags,
        &[
            RawRec {
                key: None,
                value: v("{}"),
                ..Default::default()
            },
            RawRec {
                key: v("t1"),
                value: v("{}"),
                ..Default::default()
            },
        ],
    )
    .await;

    try_run_to_end(&tg)
        .await
        .expect("rejects do not stop the connector");

    // The good records landed.
    let ids = |rows: BTreeMap<String, Value>| rows.into_keys().collect::<Vec<_>>();
    assert_eq!(ids(tg.rows("nodes/Person").await), ["a", "i"]);
    assert_eq!(ids(tg.rows("nodes/Company").await), ["Y"]);
    assert_eq!(ids(tg.rows("nodes/Tag").await), ["t1"]);
    // Every offset is committed: rejects are durable in both sinks.
    for (t, n) in [(people, 11), (companies, 2), (tags, 2)] {
        assert_eq!(committed(&tg.group, t, 1).get(&0), Some(&n), "{t}");
    }

    // The table: one row per bad record, typed, with the original bytes.
    let mut want: BTreeMap<(String, i64), &str> = BTreeMap::new();
    for (i, (_, code)) in person_corpus.iter().enumerate() {
        if let Some(c) = code {
            want.insert((people.clone(), i as i64), c);
        }
    }
    want.insert((companies.clone(), 0), "missing_required");
    want.insert((tags.clone(), 0), "missing_key");
    let rows = rejects_at_head(&tg).await;
    let got: BTreeMap<(String, i64), &str> = rows
        .iter()
        .map(|r| {
            (
                (
                    r["topic"].as_str().unwrap().to_string(),
                    r["offset"].as_i64().unwrap(),
                ),
                r["code"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(got, want, "{rows:#?}");
    assert_eq!(rows.len(), want.len());
    let head = tg.graph().await.head().await.unwrap();
    for r in &rows {
        let code = r["code"].as_str().unwrap();
        let stage = if ["enum", "range", "check"].contains(&code) {
            "validate"
        } else {
            "decode"
        };
        assert_eq!(r["stage"], json!(stage), "{r}");
        assert!(r["graph_commit"].is_string(), "{r}");
        assert!(!r["message"].as_str().unwrap().is_empty());
        if r["topic"] == json!(people) {
            let i = r["offset"].as_u64().unwrap() as usize;
            let original = person_corpus[i].0.as_deref().unwrap();
            assert_eq!(r["value"], json!(hex(original)), "{code}");
            assert_eq!(r["key"], json!(hex(format!("k{i}").as_bytes())));
            assert!(r["headers"].as_str().unwrap().contains("trace"), "{r}");
        }
    }
    let range = rows.iter().find(|r| r["code"] == json!("range")).unwrap();
    assert!(range["row"].as_str().unwrap().contains("151"), "{range}");
    assert!(
        range["message"].as_str().unwrap().contains("age"),
        "{range}"
    );
    assert_eq!(
        head.tables.len(),
        3 + 1,
        "3 node tables and _ingest_rejects"
    );

    // The dead-letter topic: one message per reject, Connect's headers plus
    // ours, the original key, value and headers.
    let dlq = read_topic_to_end(&tg.dlq, "read_committed");
    assert_eq!(dlq.len(), want.len(), "exactly one message per reject");
    let table_ids: BTreeMap<&str, &Value> = rows
        .iter()
        .map(|r| (r["reject_id"].as_str().unwrap(), r))
        .collect();
    for m in &dlq {
        let id = m.header("graphsink.reject_id").expect("reject_id header");
        let row = table_ids
            .get(id.as_str())
            .expect("same reject in the table");
        assert_eq!(
            m.header("__connect.errors.topic").as_deref(),
            row["topic"].as_str()
        );
        assert_eq!(
            m.header("__connect.errors.offset"),
            Some(row["offset"].to_string())
        );
        assert_eq!(m.header("__connect.errors.partition").as_deref(), Some("0"));
        assert_eq!(
            m.header("__connect.errors.exception.class.name").as_deref(),
            row["code"].as_str()
        );
        assert_eq!(m.header("graphsink.code").as_deref(), row["code"].as_str());
        assert_eq!(
            m.header("graphsink.stage").as_deref(),
            row["stage"].as_str()
        );
        assert!(m.header("__connect.errors.exception.message").is_some());
        if row["topic"] == json!(people) {
            let i = row["offset"].as_u64().unwrap() as usize;
            assert_eq!(m.value.as_deref(), person_corpus[i].0.as_deref());
            assert_eq!(m.header("trace"), Some(format!("t-{i}")));
            assert_eq!(m.header("graphsink.type").as_deref(), Some("Person"));
        }
    }

    // The CLI lists them, and replays the validation rejects' originals.
    let out = tg.cli(&["rejects", "--stage", "validate"], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listing = String::from_utf8_lossy(&out.stdout);
    for code in ["enum", "range", "check"] {
        assert!(listing.contains(code), "{listing}");
    }
    assert!(!listing.contains("malformed_json"), "{listing}");
    let replay = unique("replay");
    create_topic(&replay, 1).await;
    let out = tg.cli(
        &["replay-rejects", "--stage", "validate", "--to", &replay],
        &[],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let again = read_topic_to_end(&replay, "read_committed");
    assert_eq!(again.len(), 3);
    for m in &again {
        let i: usize = String::from_utf8(m.key.clone().unwrap()).unwrap()[1..]
            .parse()
            .unwrap();
        assert_eq!(m.value.as_deref(), person_corpus[i].0.as_deref());
        assert_eq!(m.header("trace"), Some(format!("t-{i}")));
        assert!(
            m.headers
                .iter()
                .all(|(k, _)| !k.starts_with("graphsink.") && !k.starts_with("__connect.")),
            "{:?}",
            m.headers
        );
    }
}

/// `graphsink_dead_letters_total{result}` as the run's metrics expose it.
fn dead_letters(metrics: &graphsink::Metrics, result: &str) -> u64 {
    metric(
        metrics,
        &format!("graphsink_dead_letters_total{{result=\"{result}\"}}"),
    )
}

/// The value of one series (name and labels, as exposed) in `metrics`' text
/// exposition; 0 when absent.
fn metric(metrics: &graphsink::Metrics, series: &str) -> u64 {
    metrics
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// The dead-letter topic is unreachable: the reject's offset is never
/// committed, the connector keeps retrying, a stop fails loudly, and a
/// restart with a working topic delivers the reject and commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_dead_letter_topic_loses_no_reject() {
    crate::init_logs();
    let broken = "[offsets]\ncommit_interval = \"100ms\"\n[errors.producer]\n\"bootstrap.servers\" = \"127.0.0.1:1\"\n\"message.timeout.ms\" = \"1000\"";
    let tg = TestGraph::new(&["node = \"Person\""], broken);
    let topic = &tg.topics[0];
    create_topic(topic, 1).await;
    produce(
        topic,
        &[
            rec(0, None, Some(json!({"name": "a"}))),
            rec(0, None, Some(json!({"name": "b", "age": "x"}))),
            rec(0, None, Some(json!({"name": "c"}))),
        ],
    )
    .await;
    let metrics = Arc::new(graphsink::Metrics::default());
    let stop = CancellationToken::new();
    let options = graphsink::RunOptions {
        metrics: Some(metrics.clone()),
        ..Default::default()
    };
    let task = tokio::spawn(graphsink::run_with(tg.config(), options, stop.clone()));
    // Three failed produce rounds (each ends at `message.timeout.ms`, 1 s):
    // dozens of commit ticks (100 ms) passed meanwhile.
    wait_until(
        "three failed dead-letter produce rounds",
        Duration::from_secs(60),
        || dead_letters(&metrics, "failed") >= 3,
    )
    .await;
    assert!(!task.is_finished(), "the connector keeps retrying");
    let c = committed(&tg.group, topic, 1).get(&0).copied().unwrap_or(0);
    assert!(c <= 1, "committed {c}: past the undelivered reject at 1");
    stop.cancel();
    let err = tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("stops")
        .unwrap()
        .expect_err("a stop with an undelivered reject is an error");
    assert!(err.to_string().contains("dead-letter"), "{err}");
    let c = committed(&tg.group, topic, 1).get(&0).copied().unwrap_or(0);
    assert!(c <= 1, "committed {c} past the reject while stopping");

    // Fixed: everything is delivered and committed.
    let cfg = std::fs::read_to_string(tg.config_path()).unwrap();
    let fixed = cfg
        .replace("\"bootstrap.servers\" = \"127.0.0.1:1\"", "")
        .replace("\"message.timeout.ms\" = \"1000\"", "");
    std::fs::write(tg.config_path(), fixed).unwrap();
    try_run_to_end(&tg).await.expect("runs");
    assert_eq!(committed(&tg.group, topic, 1).get(&0), Some(&3));
    let dlq = read_topic_to_end(&tg.dlq, "read_committed");
    assert_eq!(dlq.len(), 1);
    assert_eq!(
        dlq[0].header("__connect.errors.offset").as_deref(),
        Some("1")
    );
    let rows = rejects_at_head(&tg).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["code"], json!("wrong_type"));
    assert_eq!(
        tg.rows("nodes/Person")
            .await
            .into_keys()
            .collect::<Vec<_>>(),
        ["a", "c"]
    );
}

/// A crash after the fold's publish and before its dead-letter produce:
/// the restart re-delivers the fold reject, once.
async fn a_crash_between_publish_and_dead_letter_redelivers(backend: Backend) {
    crash_around_the_dead_letter_produce(backend, "fold.before_dead_letters", 0).await
}

/// A crash after the fold reject reached the dead-letter topic and before
/// the delivery mark: the restart finds it there and produces nothing (it
/// was produced twice before `GraphCommit::dead_letter_since`).
async fn a_crash_after_the_dead_letter_produce_does_not_repeat_it(backend: Backend) {
    crash_around_the_dead_letter_produce(backend, "fold.before_delivered_mark", 1).await
}

/// One fold reject, a crash at `failpoint` with `produced` copies on the
/// topic, then two clean runs: the topic ends with exactly one copy.
async fn crash_around_the_dead_letter_produce(backend: Backend, failpoint: &str, produced: usize) {
    let tg = one_fold_reject(backend, "").await;
    let out = tg.cli(
        &["run", "--exit-at-end"],
        &[("GRAPHSINK_FAILPOINTS", &format!("{failpoint}=abort"))],
    );
    assert!(!out.status.success(), "the failpoint aborts");
    let rows = rejects_at_head(&tg).await;
    assert_eq!(rows.len(), 1, "published with the fold: {rows:?}");
    assert_eq!(rows[0]["code"], json!("endpoint_not_found"));
    assert_eq!(rows[0]["stage"], json!("fold"));
    let id = rows[0]["reject_id"].as_str().unwrap().to_string();
    assert_eq!(
        read_topic_to_end(&tg.dlq, "read_committed").len(),
        produced,
        "produced before the crash at {failpoint}"
    );
    // The restart joins once the dead member's session expired: on Kafka a
    // join waits for it anyway, and the opt-in tansu backend can leave a
    // member that joins while the old one is expiring unassigned.
    wait_for_no_members(&tg.group).await;
    let out = tg.cli(&["run", "--exit-at-end"], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dlq = read_topic_to_end(&tg.dlq, "read_committed");
    let ids: Vec<_> = dlq
        .iter()
        .map(|m| m.header("graphsink.reject_id"))
        .collect();
    assert_eq!(dlq.len(), 1, "on the topic once: {ids:?}");
    assert_eq!(dlq[0].header("graphsink.reject_id"), Some(id));
    assert_eq!(dlq[0].header("graphsink.stage").as_deref(), Some("fold"));
    assert_eq!(
        dlq[0].header("graphsink.graph_commit").as_deref(),
        rows[0]["graph_commit"].as_str()
    );
    // A third start has nothing left to deliver.
    let out = tg.cli(&["run", "--exit-at-end"], &[]);
    assert!(out.status.success());
    assert_eq!(read_topic_to_end(&tg.dlq, "read_committed").len(), 1);
}

/// A topic with one node and one fold reject (an edge to a missing node,
/// rejected at the first fold).
async fn one_fold_reject(backend: Backend, extra: &str) -> TestGraph {
    let tg = TestGraph::on(
        backend,
        "node Person { name: String @key }\nedge Likes: Person -> Person",
        &[
            "node = \"Person\"",
            "edge = \"Likes\"\non_missing_endpoint = \"reject\"",
        ],
        extra,
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
    tg
}

/// Whether a process is stopped (state T in /proc/PID/stat).
fn is_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()
                .map(|r| r.trim_start().starts_with('T'))
        })
        .unwrap_or(false)
}

/// The window issue 13 left open: a folder frozen after it read the topic
/// back and before its produce. A second process takes over (the group
/// gives it the partitions once the frozen one's session expires; its
/// claims fence the frozen one's shards), re-delivers the published fold
/// reject, and ends. Then the frozen folder thaws and produces.
///
/// With transactions the new folder's init fenced the old producer: its
/// late produce is refused, the thawed run exits 3 saying its producer was
/// fenced, and every reader sees the reject once. Without them
/// (`dead_letter_transactions = false`, the read-back rule alone) the late
/// produce lands: twice, which is why transactions are the default.
async fn a_frozen_folder_cannot_deliver_a_fold_reject_twice(transactions: bool) {
    let tg = one_fold_reject(
        Backend::Local,
        &format!("[errors]\ndead_letter_transactions = {transactions}"),
    )
    .await;
    let frozen = tg.spawn_run_capturing(&[(
        "GRAPHSINK_FAILPOINTS",
        "fold.dead_letters_before_produce=stop",
    )]);
    let pid = frozen.child.id();
    wait_until(
        "the folder freezes at its produce",
        Duration::from_secs(60),
        || is_stopped(pid),
    )
    .await;
    let rows = rejects_at_head(&tg).await;
    assert_eq!(rows.len(), 1, "the fold was published: {rows:?}");
    let id = rows[0]["reject_id"].as_str().unwrap().to_string();
    // The successor: it waits out the frozen member's session (6 s).
    let out = tg.cli(&["run", "--exit-at-end"], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let once = read_topic_to_end(&tg.dlq, "read_committed");
    assert_eq!(once.len(), 1, "the successor delivered it");
    // The frozen folder thaws and goes on with its produce.
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(pid as i32, libc::SIGCONT) };
    if transactions {
        // The successor's init fenced its producer: the produce is refused
        // and the run stops with the fencing (exit 3, ErrorKind::Fenced),
        // saying which producer and why.
        let (code, stderr) = frozen.exit_within(Duration::from_secs(120)).await;
        assert_eq!(code, Some(3), "a fenced folder exits 3: {stderr}");
        let line = stderr
            .lines()
            .find(|l| l.starts_with("graphsink: error: "))
            .unwrap_or_else(|| panic!("no error line: {stderr}"));
        assert!(
            line.contains("the fold-reject producer graphsink-fold-")
                && line.contains("was fenced by a newer folder"),
            "{line}"
        );
        let dlq = read_topic_to_end(&tg.dlq, "read_committed");
        let ids: Vec<_> = dlq
            .iter()
            .map(|m| m.header("graphsink.reject_id"))
            .collect();
        assert_eq!(dlq.len(), 1, "read_committed sees it once: {ids:?}");
        assert_eq!(dlq[0].header("graphsink.reject_id"), Some(id));
        // Nor did any attempt of the fenced producer land uncommitted.
        assert_eq!(read_topic_to_end(&tg.dlq, "read_uncommitted").len(), 1);
    } else {
        // Nothing refuses it: its produce lands, a second copy.
        let dlq = read_topic(&tg.dlq, 2, Duration::from_secs(60));
        frozen.kill();
        let ids: Vec<_> = dlq
            .iter()
            .map(|m| m.header("graphsink.reject_id"))
            .collect();
        assert_eq!(
            dlq.len(),
            2,
            "without transactions the thawed folder's produce lands: {ids:?}"
        );
        assert!(
            ids.iter().all(|i| i.as_deref() == Some(id.as_str())),
            "{ids:?}"
        );
        assert_eq!(read_topic_to_end(&tg.dlq, "read_committed").len(), 2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_folder_is_fenced_by_its_successor() {
    crate::init_logs();
    a_frozen_folder_cannot_deliver_a_fold_reject_twice(true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_transactions_a_frozen_folder_delivers_twice() {
    crate::init_logs();
    a_frozen_folder_cannot_deliver_a_fold_reject_twice(false).await
}

/// A produce that landed but whose transaction did not commit (the window
/// of a produce that timed out in librdkafka yet landed): the round is
/// redone after a re-init, which aborts the first attempt. A
/// read_uncommitted reader sees both attempts, a read_committed one only
/// the second. Then a crash inside the transaction: the restart's init
/// aborts it, and the reject is still there once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncommitted_fold_reject_attempt_is_never_seen() {
    crate::init_logs();
    // Not a skip: this test is about aborted transactions, which the
    // tansu backend (transactions off) cannot give (docs/kafka.md).
    assert!(
        !on_tansu(),
        "needs a broker that aborts transactions: tansu 0.6 cannot, so the tansu backend runs with errors.dead_letter_transactions = false"
    );
    let tg = one_fold_reject(Backend::Local, "").await;
    let out = tg.cli(
        &["run", "--exit-at-end"],
        &[(
            "GRAPHSINK_FAILPOINTS",
            "fold.dead_letters_before_commit=error_once",
        )],
    );
    assert!(
        out.status.success(),
        "the round is retried: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all = read_topic_to_end(&tg.dlq, "read_uncommitted");
    assert_eq!(all.len(), 2, "the aborted attempt landed, and the retry");
    assert_eq!(read_topic_to_end(&tg.dlq, "read_committed").len(), 1);

    let tg = one_fold_reject(Backend::Local, "").await;
    let out = tg.cli(
        &["run", "--exit-at-end"],
        &[(
            "GRAPHSINK_FAILPOINTS",
            "fold.dead_letters_before_commit=abort",
        )],
    );
    assert!(!out.status.success(), "the failpoint aborts");
    assert_eq!(
        read_topic_to_end(&tg.dlq, "read_uncommitted").len(),
        1,
        "produced in the open transaction before the crash"
    );
    let out = tg.cli(&["run", "--exit-at-end"], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dlq = read_topic_to_end(&tg.dlq, "read_committed");
    assert_eq!(dlq.len(), 1, "once, from the restart's transaction");
    assert_eq!(dlq[0].header("graphsink.stage").as_deref(), Some("fold"));
}

/// A dead-letter cluster that refuses graphsink its fold-reject
/// `transactional.id` (an ACL) is no cluster without transactions: the run
/// stops with exit 5 and one line naming the permission, in graphsink's
/// words and Kafka's, and falls back to nothing (issue 55). The read-back
/// rule of issue 50 is for brokers that have no transactions
/// (UNSUPPORTED_VERSION and the like), not for a permission an operator
/// left out; a fold reject is not produced without it.
///
/// The refusal is real: a private Apache Kafka 4.4 with the standard
/// authorizer and an ACL that denies `Write` on the transactional ids
/// `graphsink-fold-*`; Kafka answers `InitProducerId` with
/// TRANSACTIONAL_ID_AUTHORIZATION_FAILED, while idempotent produces, reads
/// and topic creation stay allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_transactional_id_stops_the_run_naming_it() {
    crate::init_logs();
    let (kafka, bootstrap) = kafka_refusing_transactions();
    let tg = one_fold_reject(
        Backend::Local,
        &format!(
            "[log]\nformat = \"json\"\n[errors.producer]\n\"bootstrap.servers\" = \"{bootstrap}\""
        ),
    )
    .await;
    let run = tg.spawn_capturing(&["run", "--exit-at-end"], &[]);
    let (code, stderr) = run.exit_within(Duration::from_secs(120)).await;
    assert_eq!(code, Some(5), "a refused permission exits 5: {stderr}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("graphsink: error: "))
        .collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0]
            .contains("not authorized: graphsink needs WRITE on transactional id graphsink-fold-")
            && lines[0].contains("(TRANSACTIONAL_ID_AUTHORIZATION_FAILED)"),
        "{}",
        lines[0]
    );
    assert_eq!(fallback_errors(&stderr), 0, "no fallback: {stderr}");
    assert!(
        !stderr.contains("transaction failed; retrying"),
        "no retry either: {stderr}"
    );
    let dlq = read_topic_to_end_on(&bootstrap, &tg.dlq, "read_uncommitted");
    assert!(dlq.is_empty(), "nothing produced without it: {}", dlq.len());
    drop(kafka);
}

/// Issue 50: a dead-letter broker that has no transactions (refuses
/// `InitProducerId` as unsupported) gives one ERROR and the read-back rule:
/// a crash after the produce and before the delivery mark re-delivers
/// nothing, since the restart reads the topic back, and a later fold's
/// reject goes out the same way, with no second ERROR.
///
/// The broker is librdkafka's own mock cluster whose `FindCoordinator`
/// stops at version 0, which cannot name a transaction coordinator: a
/// fake, because no real broker here lacks transactions (Apache Kafka has
/// had them since 0.11; tansu 0.6 accepts them). librdkafka then refuses
/// transactions itself, as against such a broker (UNSUPPORTED_FEATURE,
/// fatal to the transactional producer), while its idempotent produces
/// work. The mapped topics stay on the real Kafka.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_broker_without_transactions_gives_one_error_and_the_read_back_rule() {
    use rdkafka::mocking::MockCluster;
    use rdkafka::types::RDKafkaApiKey;
    crate::init_logs();
    let mock = MockCluster::new(1).expect("librdkafka's mock cluster");
    mock.apiversion(RDKafkaApiKey::FindCoordinator, Some(0), Some(0))
        .expect("FindCoordinator v0 only");
    let bootstrap = mock.bootstrap_servers();
    let tg = one_fold_reject(
        Backend::Local,
        &format!(
            "[fold]\ninterval = \"1s\"\n[log]\nformat = \"json\"\n[errors.producer]\n\"bootstrap.servers\" = \"{bootstrap}\""
        ),
    )
    .await;
    mock.create_topic(&tg.dlq, 1, 1)
        .expect("the dead-letter topic");
    let dlq = |isolation| read_topic_to_end_on(&bootstrap, &tg.dlq, isolation);

    // A crash after the produce, before the delivery mark.
    let crashed = tg.spawn_capturing(
        &["run", "--exit-at-end"],
        &[("GRAPHSINK_FAILPOINTS", "fold.before_delivered_mark=abort")],
    );
    let (code, stderr) = crashed.exit_within(Duration::from_secs(120)).await;
    assert_ne!(code, Some(0), "the failpoint aborts: {stderr}");
    assert_eq!(fallback_errors(&stderr), 1, "{stderr}");
    assert_eq!(
        dlq("read_uncommitted").len(),
        1,
        "produced before the crash"
    );

    // The restart reads it back and skips it; a later fold's reject goes
    // out the same way, without a second ERROR.
    wait_for_no_members(&tg.group).await;
    let restarted = tg.spawn_run_capturing(&[]);
    produce(
        &tg.topics[1],
        &[rec(
            0,
            None,
            Some(json!({"src": "a", "dst": "nobody else"})),
        )],
    )
    .await;
    wait_until("the second fold reject", Duration::from_secs(120), || {
        dlq("read_uncommitted").len() >= 2
    })
    .await;
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(restarted.child.id() as i32, libc::SIGTERM) };
    let (code, stderr) = restarted.exit_within(Duration::from_secs(60)).await;
    assert_eq!(code, Some(0), "a clean stop: {stderr}");
    assert_eq!(fallback_errors(&stderr), 1, "said once: {stderr}");
    assert!(
        stderr.contains("fold rejects already on the dead-letter topic; not produced again"),
        "the restart read the first back: {stderr}"
    );
    let ids: BTreeMap<String, usize> = dlq("read_uncommitted")
        .iter()
        .map(|m| m.header("graphsink.reject_id").expect("reject_id"))
        .fold(BTreeMap::new(), |mut n, id| {
            *n.entry(id).or_default() += 1;
            n
        });
    assert_eq!(ids.len(), 2, "two fold rejects: {ids:?}");
    assert!(ids.values().all(|&n| n == 1), "each once: {ids:?}");
    drop(mock);
}

/// The same broker as seen by its user: one without `InitProducerId` at
/// all (librdkafka's mock cluster with the API taken out: a fake, as
/// above) has no idempotent producer either, so the user turns
/// idempotence off for the dead-letter producer; transactions need it, so
/// fold rejects take the read-back rule, said once at ERROR.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_producer_without_idempotence_takes_the_read_back_rule() {
    use rdkafka::mocking::MockCluster;
    use rdkafka::types::RDKafkaApiKey;
    crate::init_logs();
    let mock = MockCluster::new(1).expect("librdkafka's mock cluster");
    mock.apiversion(RDKafkaApiKey::InitProducerId, None, None)
        .expect("take InitProducerId out");
    let bootstrap = mock.bootstrap_servers();
    let tg = one_fold_reject(
        Backend::Local,
        &format!(
            "[log]\nformat = \"json\"\n[errors.producer]\n\"bootstrap.servers\" = \"{bootstrap}\"\n\"enable.idempotence\" = \"false\""
        ),
    )
    .await;
    mock.create_topic(&tg.dlq, 1, 1)
        .expect("the dead-letter topic");
    let run = tg.spawn_capturing(&["run", "--exit-at-end"], &[]);
    let (code, stderr) = run.exit_within(Duration::from_secs(120)).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(fallback_errors(&stderr), 1, "{stderr}");
    assert!(stderr.contains("enable.idempotence = false"), "{stderr}");
    let dlq = read_topic_to_end_on(&bootstrap, &tg.dlq, "read_uncommitted");
    assert_eq!(dlq.len(), 1, "the fold reject, once");
    drop(mock);
}

/// A private Kafka whose ACLs deny graphsink's fold-reject transactional
/// ids, and its address.
fn kafka_refusing_transactions() -> (graphsink_testkit::Kafka, String) {
    let opts = graphsink_testkit::kafka::Options {
        extra: vec![
            (
                "authorizer.class.name".into(),
                "org.apache.kafka.metadata.authorizer.StandardAuthorizer".into(),
            ),
            // Everything without an ACL stays allowed (this one denies).
            ("allow.everyone.if.no.acl.found".into(), "true".into()),
        ],
        ..Default::default()
    };
    let kafka = graphsink_testkit::Kafka::start_with(None, &opts)
        .unwrap_or_else(|e| panic!("start a private Kafka: {e}"));
    let bootstrap = kafka.bootstrap.clone();
    let out = std::process::Command::new("java")
        .args([
            "-cp",
            &format!("{}/*", graphsink_testkit::kafka::default_libs().display()),
        ])
        .args([
            "org.apache.kafka.tools.AclCommand",
            "--bootstrap-server",
            &bootstrap,
        ])
        .args([
            "--add",
            "--deny-principal",
            "User:ANONYMOUS",
            "--operation",
            "Write",
        ])
        .args([
            "--transactional-id",
            "graphsink-fold-",
            "--resource-pattern-type",
            "prefixed",
        ])
        .output()
        .expect("run kafka's AclCommand");
    assert!(
        out.status.success(),
        "AclCommand: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (kafka, bootstrap)
}

/// How many ERROR events of a JSON log say fold rejects fell back to the
/// read-back rule.
fn fallback_errors(stderr: &str) -> usize {
    stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["level"] == json!("ERROR"))
        .filter(|e| {
            e["message"]
                .as_str()
                .is_some_and(|m| m.contains("read-back rule"))
        })
        .count()
}

/// The reject-rate breaker: past `max_rejects_per_minute`, fetching pauses
/// for `breaker_pause`; records behind the burst wait, then land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reject_rate_breaker_pauses_fetching() {
    crate::init_logs();
    let tg = TestGraph::new(
        &["node = \"Person\""],
        "[offsets]\ncommit_interval = \"100ms\"\n[errors]\nmax_rejects_per_minute = 2\nbreaker_pause = \"20s\"",
    );
    let topic = &tg.topics[0];
    create_topic(topic, 1).await;
    let bad: Vec<Rec> = (0..5)
        .map(|i| rec(0, None, Some(json!({"name": format!("b{i}"), "age": "x"}))))
        .collect();
    produce(topic, &bad).await;
    let metrics = Arc::new(graphsink::Metrics::default());
    let stop = CancellationToken::new();
    let options = graphsink::RunOptions {
        metrics: Some(metrics.clone()),
        ..Default::default()
    };
    let task = tokio::spawn(graphsink::run_with(tg.config(), options, stop.clone()));
    let open = || metric(&metrics, "graphsink_breaker_open") == 1;
    wait_until("the burst is committed", Duration::from_secs(30), || {
        committed(&tg.group, topic, 1).get(&0) == Some(&5)
    })
    .await;
    wait_until("the breaker trips", Duration::from_secs(30), open).await;
    produce(topic, &[rec(0, None, Some(json!({"name": "good"})))]).await;
    // Paused: the good record is not taken for as long as the breaker
    // holds. The offset is read before the breaker's state, so a look that
    // finds it open saw the offset while it was open.
    let tripped = std::time::Instant::now();
    loop {
        let at = committed(&tg.group, topic, 1).get(&0).copied();
        if !open() {
            break;
        }
        assert_eq!(at, Some(5), "fetched while the breaker was open");
        assert!(
            tripped.elapsed() < Duration::from_secs(60),
            "the breaker stays open past its 20 s pause"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        tripped.elapsed() > Duration::from_secs(5),
        "the breaker closed {:?} after the good record was produced, before most of its 20 s pause",
        tripped.elapsed()
    );
    wait_until("fetching resumes", Duration::from_secs(40), || {
        committed(&tg.group, topic, 1).get(&0) == Some(&6)
    })
    .await;
    stop.cancel();
    task.await.unwrap().expect("clean stop");
    assert_eq!(rejects_at_head(&tg).await.len(), 5);
}

crate::on_every_backend!(
    a_hostile_corpus_is_rejected_record_by_record_in_both_sinks,
    a_crash_between_publish_and_dead_letter_redelivers,
    a_crash_after_the_dead_letter_produce_does_not_repeat_it,
);

/// The generated hostile corpus (over 300 distinct bad records across every
/// `.pg` type and constraint, graphsink-testkit's `hostile`) through a real
/// broker: each bad record is exactly one reject with an allowed code in
/// `_ingest_rejects` and exactly one message on the dead-letter topic; the
/// records accepted on purpose land as rows; every offset is committed and
/// the connector never stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generated_hostile_corpus_lands_once_in_both_sinks() {
    use graphsink_testkit::hostile::{self, Expect, Feed};
    const MAX: usize = hostile::MIN_RECORD_BYTES;
    let corpus = hostile::corpus_for(MAX);
    let feeds: Vec<&str> = Feed::ALL.iter().map(|f| f.mapping()).collect();
    let tg = TestGraph::with_schema(
        hostile::SCHEMA,
        &feeds,
        &format!("[errors]\nmax_record_bytes = {MAX}"),
    );
    let topic_of = |f: Feed| tg.topics[Feed::ALL.iter().position(|x| *x == f).unwrap()].clone();
    // (topic, offset) → the record there.
    let mut at: BTreeMap<(String, i64), &hostile::Hostile> = BTreeMap::new();
    for feed in Feed::ALL {
        let topic = topic_of(feed);
        create_topic(&topic, 1).await;
        let mine: Vec<&hostile::Hostile> = corpus.iter().filter(|h| h.feed == feed).collect();
        let recs: Vec<RawRec> = mine
            .iter()
            .map(|h| RawRec {
                partition: 0,
                key: h.key.clone(),
                value: h.value.clone(),
                headers: h.headers.clone(),
            })
            .collect();
        produce_raw(&topic, &recs).await;
        for (i, h) in mine.into_iter().enumerate() {
            at.insert((topic.clone(), i as i64), h);
        }
    }
    try_run_to_end(&tg)
        .await
        .expect("hostile input never stops the connector");
    for feed in Feed::ALL {
        let n = corpus.iter().filter(|h| h.feed == feed).count() as i64;
        assert_eq!(
            committed(&tg.group, &topic_of(feed), 1).get(&0),
            Some(&n),
            "{feed:?}"
        );
    }

    let rows = rejects_at_head(&tg).await;
    let mut table: BTreeMap<(String, i64), Vec<String>> = BTreeMap::new();
    for r in &rows {
        let place = (
            r["topic"].as_str().unwrap().to_string(),
            r["offset"].as_i64().unwrap(),
        );
        table
            .entry(place)
            .or_default()
            .push(r["code"].as_str().unwrap().to_string());
    }
    let bad = corpus.iter().filter(|h| h.expect != Expect::Accept).count();
    let mut wrong = Vec::new();
    for (place, h) in &at {
        let codes = table.get(place).cloned().unwrap_or_default();
        let ok = match &h.expect {
            Expect::Reject(allowed) => codes.len() == 1 && allowed.contains(&codes[0].as_str()),
            Expect::Accept => codes.is_empty(),
        };
        if !ok {
            wrong.push(format!(
                "{}: expected {:?}, the table has {codes:?}",
                h.name, h.expect
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    assert_eq!(rows.len(), bad);

    // The accepted Things are rows.
    let things = tg.rows("nodes/Thing").await;
    let accepted_things = at
        .iter()
        .filter(|((t, _), h)| *t == topic_of(Feed::Things) && h.expect == Expect::Accept)
        .count();
    assert_eq!(things.len(), accepted_things, "{:?}", things.keys());

    // The dead-letter topic: one message per reject, by its place.
    let dlq = read_topic_to_end(&tg.dlq, "read_committed");
    let mut seen: BTreeMap<(String, i64), usize> = BTreeMap::new();
    for m in &dlq {
        let topic = m.header("__connect.errors.topic").expect("topic header");
        let offset: i64 = m
            .header("__connect.errors.offset")
            .unwrap()
            .parse()
            .unwrap();
        *seen.entry((topic, offset)).or_default() += 1;
    }
    assert_eq!(dlq.len(), bad, "exactly one dead letter per reject");
    assert!(seen.values().all(|&n| n == 1));
    assert!(seen.keys().all(|p| table.contains_key(p)));
}

/// A rejected record too big for the dead-letter producer (here over
/// librdkafka's default `message.max.bytes`, under `max_record_bytes`)
/// still reaches the dead-letter topic, cut to fit and saying so, and its
/// offset commits; `_ingest_rejects` keeps every byte. Before, its produce
/// failed with MsgSizeTooLarge on every retry and the partition stalled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reject_too_big_for_the_dead_letter_producer_is_cut_to_fit() {
    let tg = TestGraph::new(
        &["node = \"Person\""],
        "[errors]\nmax_record_bytes = 1500000",
    );
    let topic = tg.topics[0].clone();
    // Apache Kafka refuses records over 1 MiB unless the topic allows them.
    create_topic_with(&topic, 1, &[("max.message.bytes", "2000000")]).await;
    let big = format!(r#"{{"name":"x","age":"{}"}}"#, "9".repeat(1_100_000));
    let ok = r#"{"name":"after"}"#;
    produce_raw(
        &topic,
        &[
            RawRec {
                value: Some(big.clone().into_bytes()),
                ..Default::default()
            },
            RawRec {
                value: Some(ok.as_bytes().to_vec()),
                ..Default::default()
            },
        ],
    )
    .await;
    try_run_to_end(&tg).await.expect("the run reaches the end");
    assert_eq!(committed(&tg.group, &topic, 1).get(&0), Some(&2));
    let rows = rejects_at_head(&tg).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["code"], json!("wrong_type"));
    assert_eq!(
        rows[0]["value"].as_str().unwrap().len(),
        2 * big.len(),
        "hex of every byte"
    );
    let dlq = read_topic_to_end(&tg.dlq, "read_committed");
    assert_eq!(dlq.len(), 1);
    assert_eq!(
        dlq[0].header("graphsink.value_truncated"),
        Some(big.len().to_string())
    );
    let cut = dlq[0].value.as_ref().unwrap();
    assert!(cut.len() < 1_000_000 && big.as_bytes().starts_with(cut));
    assert!(tg.rows("nodes/Person").await.contains_key("after"));
}
