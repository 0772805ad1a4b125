//! Schema Registry formats end to end: records framed by Confluent's own
//! Python serializers (sr_encode.py), through the real broker, against a
//! real registry (Apicurio Registry, `GRAPHSINK_TEST_REGISTRY`, which
//! scripts/test.sh starts) and the testkit's registry (which can also be
//! stopped, for the stall). The rows, read back by pylance, must equal
//! what Confluent's deserializer reads back from the same bytes.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use graphsink_testkit::TestRegistry;
use serde_json::{json, Value};

use crate::harness::*;

crate::on_every_backend!(a_stopped_registry_holds_its_partition_and_loses_nothing);

const PG: &str = r#"
node Person { name: String @key  age: I64?  email: String? }
edge Knows: Person -> Person { since: I32? }
"#;

/// v1: name, age as an int.
const V1: &str = r#"{"type":"record","name":"Person","namespace":"gs.test","fields":[
    {"name":"name","type":"string"},{"name":"age","type":["null","int"],"default":null}]}"#;
/// v2: age widened to a long, and an optional email with a default.
const V2: &str = r#"{"type":"record","name":"Person","namespace":"gs.test","fields":[
    {"name":"name","type":"string"},{"name":"age","type":["null","long"],"default":null},
    {"name":"email","type":["null","string"],"default":null}]}"#;
const KNOWS: &str = r#"{"type":"record","name":"Knows","namespace":"gs.test","fields":[
    {"name":"src","type":"string"},{"name":"dst","type":"string"},{"name":"since","type":"int"}]}"#;

/// Apicurio's Confluent-compatible URL. Never skips: scripts/test.sh
/// starts Apicurio and sets it.
pub(crate) fn apicurio() -> String {
    std::env::var("GRAPHSINK_TEST_REGISTRY").expect(
        "GRAPHSINK_TEST_REGISTRY is not set: run `bash scripts/test.sh`, which starts Apicurio Registry (use_registry), or point it at a Confluent-compatible registry",
    )
}

/// Confluent's serializer frames `records` under `schema` (registering it
/// as `<topic>-value`); each framed value, and what Confluent's
/// deserializer reads back from it.
pub(crate) fn encode(
    registry: &str,
    topic: &str,
    schema: &str,
    records: &[Value],
) -> Vec<(Vec<u8>, Value)> {
    encode_as("avro", registry, topic, schema, records)
}

fn encode_as(
    format: &str,
    registry: &str,
    topic: &str,
    schema: &str,
    records: &[Value],
) -> Vec<(Vec<u8>, Value)> {
    encode_job(
        registry,
        topic,
        json!({"format": format, "schema": schema, "records": records}),
    )
}

/// Runs one sr_encode.py job (see its doc).
pub(crate) fn encode_job(registry: &str, topic: &str, job: Value) -> Vec<(Vec<u8>, Value)> {
    encode_keyed(registry, topic, job)
        .into_iter()
        .map(|e| (e.value, e.decoded))
        .collect()
}

/// One record framed by Confluent's serializers.
struct Encoded {
    value: Vec<u8>,
    decoded: Value,
    /// The framed key, when the job has `key_schema`.
    key: Option<Vec<u8>>,
}

fn unhex(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

/// How long one sr_encode.py job may take (its registry requests time out
/// after 30 s each and are retried).
const ENCODE_BOUND: std::time::Duration = std::time::Duration::from_secs(180);

/// Runs one sr_encode.py job, keys and all.
fn encode_keyed(registry: &str, topic: &str, job: Value) -> Vec<Encoded> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/e2e/sr_encode.py");
    let mut child = Command::new(sr_python())
        .arg(script)
        .arg(registry)
        .arg(topic)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start sr_encode.py");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(job.to_string().as_bytes())
        .unwrap();
    // A bound, so a registry that never answers fails the test rather than
    // hanging CI (Apicurio once kept a request unanswered for 15 minutes).
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (pid, seen) = (child.id() as libc::pid_t, done.clone());
    std::thread::spawn(move || {
        std::thread::sleep(ENCODE_BOUND);
        if !seen.load(std::sync::atomic::Ordering::SeqCst) {
            // SAFETY: kill(2) on our own child, not yet reaped (`done` unset).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    });
    let out = child.wait_with_output().unwrap();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(
        out.status.success(),
        "sr_encode.py ({:?}; killed if still running after {ENCODE_BOUND:?}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            Encoded {
                value: unhex(v["value"].as_str().unwrap()),
                decoded: v["decoded"].clone(),
                key: v["key"].as_str().map(unhex),
            }
        })
        .collect()
}

/// Rows of `table` at the head commit, read by pylance, not by graphsink's
/// Rust reader: id → row.
async fn pylance_rows(tg: &TestGraph, table: &str) -> BTreeMap<String, Value> {
    let g = tg.graph().await;
    let version = g.head().await.unwrap().tables[table];
    pylance_rows_at(&g, table, version)
}

fn raw(partition: i32, key: &str, value: Option<Vec<u8>>) -> RawRec {
    RawRec {
        partition,
        key: Some(key.as_bytes().to_vec()),
        value,
        headers: vec![],
    }
}

pub(crate) fn registry_toml(url: &str) -> String {
    format!("[schema_registry]\nurl = \"{url}\"\ntimeout = \"2s\"\n")
}

/// A graph of `PG` with a Person mapping and a Knows mapping (their
/// bodies), each on a fresh one-partition topic.
async fn person_and_knows(
    registry: &str,
    backend: Backend,
    person: &str,
    knows: &str,
) -> TestGraph {
    let tg = TestGraph::on(backend, PG, &[person, knows], &registry_toml(registry));
    create_topic(&tg.topics[0], 1).await;
    create_topic(&tg.topics[1], 1).await;
    tg
}

/// The codes of the rejects at the head commit, sorted.
async fn reject_codes(tg: &TestGraph) -> Vec<String> {
    let mut codes: Vec<String> = rejects_at_head(tg)
        .await
        .iter()
        .map(|r| r["code"].as_str().unwrap().to_string())
        .collect();
    codes.sort();
    codes
}

/// Each Person row's age and email, by id.
fn age_and_email(rows: &BTreeMap<String, Value>) -> BTreeMap<&str, (Value, Value)> {
    rows.iter()
        .map(|(id, r)| (id.as_str(), (r["age"].clone(), r["email"].clone())))
        .collect()
}

/// The age and email Confluent's deserializer read (an absent field: null).
fn age_and_email_decoded(d: &Value) -> (Value, Value) {
    (
        d["age"].clone(),
        d.get("email").cloned().unwrap_or(Value::Null),
    )
}

/// Knows edges at the head, read by pylance: (src, dst, since).
async fn knows_rows(tg: &TestGraph) -> Vec<(String, String, Option<i64>)> {
    pylance_rows(tg, "edges/Knows")
        .await
        .values()
        .map(|r| {
            let text = |k: &str| r[k].as_str().unwrap().to_string();
            (text("src"), text("dst"), r["since"].as_i64())
        })
        .collect()
}

/// Nodes (two writer versions) and edges in Avro, every reject code the
/// registry formats add, and a tombstone, against one registry on one
/// backend.
async fn avro_lands_against(registry: &str, backend: Backend) {
    let tg = person_and_knows(
        registry,
        backend,
        "node = \"Person\"\nformat = \"avro\"\nkey = \"kafka\"",
        "edge = \"Knows\"\nformat = \"avro\"",
    )
    .await;
    let (people, knows) = (&tg.topics[0], &tg.topics[1]);
    let v1 = encode(
        registry,
        people,
        V1,
        &[
            json!({"name": "ann", "age": 31}),
            json!({"name": "bob", "age": null}),
            json!({"name": "dan", "age": 9}),
        ],
    );
    let v2 = encode(
        registry,
        people,
        V2,
        &[
            json!({"name": "cy", "age": 5_000_000_000i64, "email": "cy@x"}),
            json!({"name": "bob", "age": 40, "email": null}),
        ],
    );
    let edges = encode(
        registry,
        knows,
        KNOWS,
        &[json!({"src": "ann", "dst": "bob", "since": 2020})],
    );
    let mut truncated = v1[0].0.clone();
    truncated.pop();
    let recs = vec![
        raw(0, "ann", Some(v1[0].0.clone())),
        raw(0, "bob", Some(v1[1].0.clone())),
        raw(0, "cy", Some(v2[0].0.clone())),
        raw(0, "bob", Some(v2[1].0.clone())),
        raw(0, "dan", Some(v1[2].0.clone())),
        // A tombstone deletes in every format; the Kafka key names the node.
        raw(0, "dan", None),
        raw(0, "j", Some(br#"{"name":"json"}"#.to_vec())),
        raw(0, "s", Some(vec![0, 0, 1])),
        raw(0, "u", Some(graphsink::testing::framed(999_999, b"\x02x"))),
        raw(0, "t", Some(truncated)),
    ];
    produce_raw(people, &recs).await;
    let edge_recs: Vec<RawRec> = edges
        .iter()
        .map(|(v, _)| raw(0, "e", Some(v.clone())))
        .collect();
    produce_raw(knows, &edge_recs).await;

    try_run_to_end(&tg).await.expect("run");
    let rows = pylance_rows(&tg, "nodes/Person").await;
    let got = age_and_email(&rows);
    // What Confluent's deserializer read back, last write per key.
    let decoded = age_and_email_decoded;
    let want: BTreeMap<&str, (Value, Value)> = [
        ("ann", decoded(&v1[0].1)),
        ("bob", decoded(&v2[1].1)),
        ("cy", decoded(&v2[0].1)),
    ]
    .into_iter()
    .collect();
    assert_eq!(got, want, "rows: {rows:?}");
    let edges_rows = pylance_rows(&tg, "edges/Knows").await;
    assert_eq!(edges_rows.len(), 1, "{edges_rows:?}");
    let e = edges_rows.values().next().unwrap();
    assert_eq!(
        (e["src"].as_str(), e["dst"].as_str(), e["since"].as_i64()),
        (Some("ann"), Some("bob"), Some(2020))
    );
    let codes = reject_codes(&tg).await;
    assert_eq!(
        codes,
        [
            "bad_framing",
            "bad_framing",
            "malformed_avro",
            "unknown_schema_id"
        ]
    );
    let dlq = read_topic(&tg.dlq, 4, Duration::from_secs(20));
    assert_eq!(dlq.len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn avro_from_confluents_serializer_lands_through_apicurio_on_s3() {
    crate::init_logs();
    avro_lands_against(&apicurio(), Backend::S3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn avro_from_confluents_serializer_lands_through_the_test_registry() {
    crate::init_logs();
    let reg = TestRegistry::start().unwrap();
    avro_lands_against(&reg.url(), Backend::Local).await;
    assert!(reg.unimplemented().is_empty(), "{:?}", reg.unimplemented());
}

/// A registry that stops mid-run holds the partition at the first record
/// of an unseen schema: nothing past it is committed, `/ready`'s HTTP body
/// says why, records of known schemas flow on, and once the registry is
/// back every record lands.
async fn a_stopped_registry_holds_its_partition_and_loses_nothing(backend: Backend) {
    crate::init_logs();
    let mut reg = TestRegistry::start().unwrap();
    let tg = TestGraph::on(
        backend,
        PG,
        &["node = \"Person\"\nformat = \"avro\"\nkey = \"kafka\""],
        &registry_toml(&reg.url()),
    );
    let topic = &tg.topics[0];
    create_topic(topic, 2).await;
    let names: Vec<String> = (0..40).map(|i| format!("p{i}")).collect();
    let a = encode(
        &reg.url(),
        topic,
        V1,
        &names[..20]
            .iter()
            .map(|n| json!({"name": n, "age": 1}))
            .collect::<Vec<_>>(),
    );
    let b = encode(
        &reg.url(),
        topic,
        V2,
        &names[20..]
            .iter()
            .map(|n| json!({"name": n, "age": 2, "email": null}))
            .collect::<Vec<_>>(),
    );
    // Partition 0: v1 then v2; partition 1: v1 only.
    let first: Vec<RawRec> = a
        .iter()
        .enumerate()
        .map(|(i, (v, _))| raw((i % 2) as i32, &names[i], Some(v.clone())))
        .collect();
    produce_raw(topic, &first).await;

    let metrics = Arc::new(graphsink::Metrics::default());
    let stop = tokio_util::sync::CancellationToken::new();
    let options = graphsink::RunOptions {
        metrics: Some(metrics.clone()),
        kafka_statistics: true,
        ..Default::default()
    };
    let run = tokio::spawn(graphsink::run_with(tg.config(), options, stop.clone()));
    // `/ready` as an orchestrator reads it: over HTTP, from these metrics.
    let any: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    let (http, _) = graphsink::serve_http(any, metrics.clone(), stop.clone())
        .await
        .expect("serve http");
    let group = tg.group.clone();
    wait_until(
        "the v1 records are committed",
        Duration::from_secs(60),
        || committed(&group, topic, 2).values().sum::<i64>() == 20,
    )
    .await;

    reg.stop();
    let second: Vec<RawRec> = b
        .iter()
        .enumerate()
        .map(|(i, (v, _))| raw(0, &names[20 + i], Some(v.clone())))
        .collect();
    produce_raw(topic, &second).await;
    // Known-schema records on partition 1 still flow.
    let more: Vec<RawRec> = (0..4)
        .map(|i| raw(1, &names[i * 2 + 1], Some(a[i * 2 + 1].0.clone())))
        .collect();
    produce_raw(topic, &more).await;
    wait_until("partition 1 goes on", Duration::from_secs(60), || {
        committed(&group, topic, 2).get(&1) == Some(&14)
    })
    .await;
    let stalled = |status: u16, body: &Value| {
        status == 503
            && body["ready"] == json!(false)
            && body["schema_registry_stalled"] == json!(true)
    };
    crate::ops::await_ready(
        http,
        "to say the registry stalls",
        Duration::from_secs(30),
        &stalled,
    )
    .await;
    // One more record of a known schema on partition 1, after the hold:
    // once it is committed, the run loop has committed since partition 0
    // was held, and partition 0 is still at the held record.
    produce_raw(topic, &[raw(1, &names[9], Some(a[9].0.clone()))]).await;
    wait_until(
        "partition 1 goes on after the hold",
        Duration::from_secs(60),
        || committed(&group, topic, 2).get(&1) == Some(&15),
    )
    .await;
    assert_eq!(
        committed(&group, topic, 2).get(&0),
        Some(&10),
        "nothing past the held record is committed"
    );
    let (status, body) = crate::ops::ready(http).await;
    assert!(stalled(status, &body), "{status} {body}");

    reg.restart().unwrap();
    wait_until("every record is committed", Duration::from_secs(60), || {
        committed(&group, topic, 2).values().sum::<i64>() == 45
    })
    .await;
    crate::ops::await_ready(
        http,
        "to say the registry answers again",
        Duration::from_secs(30),
        |status, body| {
            status == 200
                && body["ready"] == json!(true)
                && body["schema_registry_stalled"] == json!(false)
        },
    )
    .await;
    stop.cancel();
    run.await.unwrap().expect("run");
    let rows = tg.rows("nodes/Person").await;
    assert_eq!(rows.len(), 40, "{:?}", rows.keys());
    assert!(rejects_at_head(&tg).await.is_empty());
}

/// JSON Schema: Confluent's JSONSerializer frames JSON objects; the payload
/// takes the JSON path. An Avro schema's id on a json_schema topic is a
/// schema_mismatch.
async fn json_schema_lands_against(registry: &str, backend: Backend) {
    let registry = registry.to_string();
    let tg = person_and_knows(
        &registry,
        backend,
        "node = \"Person\"\nformat = \"json_schema\"",
        "edge = \"Knows\"\nformat = \"json_schema\"",
    )
    .await;
    let (topic, knows) = (&tg.topics[0], &tg.topics[1]);
    let edge_schema = r#"{"$schema":"http://json-schema.org/draft-07/schema#","title":"Knows","type":"object",
        "properties":{"src":{"type":"string"},"dst":{"type":"string"},"since":{"type":"integer"}}}"#;
    let edges = encode_as(
        "json_schema",
        &registry,
        knows,
        edge_schema,
        &[json!({"src": "ann", "dst": "bob", "since": 2021})],
    );
    produce_raw(knows, &[raw(0, "e", Some(edges[0].0.clone()))]).await;
    let schema = r#"{"$schema":"http://json-schema.org/draft-07/schema#","title":"Person","type":"object",
        "properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name"]}"#;
    let ok = encode_as(
        "json_schema",
        &registry,
        topic,
        schema,
        &[json!({"name": "ann", "age": 31}), json!({"name": "bob"})],
    );
    // The same topic's subject, but an Avro schema: refused by id.
    let avro = encode(
        &registry,
        &format!("{topic}-avro"),
        V1,
        &[json!({"name": "x", "age": 1})],
    );
    let recs = vec![
        raw(0, "a", Some(ok[0].0.clone())),
        raw(0, "b", Some(ok[1].0.clone())),
        raw(0, "x", Some(avro[0].0.clone())),
        raw(0, "j", Some(br#"{"name":"plain"}"#.to_vec())),
    ];
    produce_raw(topic, &recs).await;
    try_run_to_end(&tg).await.expect("run");
    let rows = pylance_rows(&tg, "nodes/Person").await;
    let ages: BTreeMap<&str, Value> = rows
        .iter()
        .map(|(k, r)| (k.as_str(), r["age"].clone()))
        .collect();
    assert_eq!(
        ages,
        [("ann", ok[0].1["age"].clone()), ("bob", Value::Null)]
            .into_iter()
            .collect()
    );
    let codes = reject_codes(&tg).await;
    assert_eq!(codes, ["bad_framing", "schema_mismatch"]);
    let e = knows_rows(&tg).await;
    assert_eq!(
        e,
        [(
            "ann".to_string(),
            "bob".to_string(),
            edges[0].1["since"].as_i64()
        )]
    );
    // The subject's latest schema is a JSON Schema, which `check` (and so
    // `graphsink run`) takes.
    let out = tg.cli(&["check"], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_schema_records_land_through_apicurio_on_s3() {
    crate::init_logs();
    json_schema_lands_against(&apicurio(), Backend::S3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_schema_records_land_through_the_test_registry() {
    crate::init_logs();
    let reg = TestRegistry::start().unwrap();
    json_schema_lands_against(&reg.url(), Backend::Local).await;
    assert!(reg.unimplemented().is_empty(), "{:?}", reg.unimplemented());
}

/// At start, a subject whose latest schema cannot resolve to the type is
/// refused (exit 2, one line naming the topic, the field and why); a
/// registry that cannot be reached is a warning, not a refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_refuses_a_subject_that_cannot_resolve_and_warns_on_no_registry() {
    crate::init_logs();
    let reg = TestRegistry::start().unwrap();
    let tg = TestGraph::with_schema(
        PG,
        &["node = \"Person\"\nformat = \"avro\""],
        &registry_toml(&reg.url()),
    );
    let topic = &tg.topics[0];
    // No subject yet: fine.
    let out = tg.cli(&["check"], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The latest version lacks the required `name`.
    let no_name = r#"{"type":"record","name":"P","fields":[{"name":"age","type":"int"}]}"#;
    reg.register(&format!("{topic}-value"), "AVRO", V1, json!([]));
    reg.register(&format!("{topic}-value"), "AVRO", no_name, json!([]));
    let out = tg.cli(&["check"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(topic.as_str()) && err.contains("'name'") && err.contains("schema_mismatch"),
        "{err}"
    );
    // A registry that does not answer: a warning, and the check passes.
    drop(reg);
    let out = tg.cli(&["check"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("cannot read the subject"), "{err}");
}

/// Protobuf: Confluent's ProtobufSerializer (which registers the schema as
/// a base64 descriptor) frames the messages; through the real broker
/// against both registries. Apicurio answers the serialized ask with a 500
/// and the plain one with the base64 text; the test registry serves it as
/// registered.
async fn protobuf_lands_against(registry: &str, backend: Backend) {
    let tg = person_and_knows(
        registry,
        backend,
        "node = \"Person\"\nformat = \"protobuf\"\nkey = \"kafka\"",
        "edge = \"Knows\"\nformat = \"protobuf\"",
    )
    .await;
    let (topic, knows) = (&tg.topics[0], &tg.topics[1]);
    let edge_spec = json!({"package": "gs.edges", "messages": [{"name": "Knows", "fields": [
        {"name": "src", "type": "string", "number": 1},
        {"name": "dst", "type": "string", "number": 2},
        {"name": "since", "type": "int32", "number": 3, "optional": true}]}]});
    let edges = encode_job(
        registry,
        knows,
        json!({"format": "protobuf", "schema": edge_spec, "message": "Knows", "records": [
            {"src": "ann", "dst": "cy", "since": 2020}]}),
    );
    produce_raw(knows, &[raw(0, "e", Some(edges[0].0.clone()))]).await;
    let spec = json!({"package": "gs.test", "messages": [{"name": "Person", "fields": [
        {"name": "name", "type": "string", "number": 1},
        {"name": "age", "type": "int64", "number": 2, "optional": true},
        {"name": "email", "type": "string", "number": 3, "optional": true}]}]});
    let enc = encode_job(
        registry,
        topic,
        json!({"format": "protobuf", "schema": spec, "message": "Person", "records": [
            {"name": "ann", "age": 31},
            {"name": "cy", "age": 5_000_000_000i64, "email": "cy@x"},
            {"name": "bob"}]}),
    );
    // The frame of a real message, then a length past the value.
    let mut garbage = enc[0].0[..6].to_vec();
    garbage.extend_from_slice(&[0x0a, 0xff, 0xff, 0xff, 0x0f]);
    let recs = vec![
        raw(0, "ann", Some(enc[0].0.clone())),
        raw(0, "cy", Some(enc[1].0.clone())),
        raw(0, "bob", Some(enc[2].0.clone())),
        raw(0, "bob", None),
        raw(0, "g", Some(garbage)),
        raw(0, "j", Some(br#"{"name":"json"}"#.to_vec())),
    ];
    produce_raw(topic, &recs).await;
    try_run_to_end(&tg).await.expect("run");
    let rows = pylance_rows(&tg, "nodes/Person").await;
    // As Confluent's deserializer read them back (MessageToDict writes an
    // int64 as a string; an unset optional field is absent).
    let text = |v: &Value| match v {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    };
    let got: BTreeMap<String, (Option<String>, Option<String>)> = rows
        .iter()
        .map(|(k, r)| (k.clone(), (text(&r["age"]), text(&r["email"]))))
        .collect();
    let want: BTreeMap<String, (Option<String>, Option<String>)> = enc[..2]
        .iter()
        .map(|(_, d)| {
            let f = |k: &str| d.get(k).and_then(text);
            (
                d["name"].as_str().unwrap().to_string(),
                (f("age"), f("email")),
            )
        })
        .collect();
    assert_eq!(got, want, "{rows:?}");
    let codes = reject_codes(&tg).await;
    assert_eq!(codes, ["bad_framing", "malformed_protobuf"]);
    let e = knows_rows(&tg).await;
    assert_eq!(
        e,
        [(
            "ann".to_string(),
            "cy".to_string(),
            edges[0].1["since"].as_i64()
        )]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_from_confluents_serializer_lands_through_apicurio_on_s3() {
    crate::init_logs();
    protobuf_lands_against(&apicurio(), Backend::S3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_from_confluents_serializer_lands_through_the_test_registry() {
    crate::init_logs();
    let reg = TestRegistry::start().unwrap();
    protobuf_lands_against(&reg.url(), Backend::Local).await;
    assert!(reg.unimplemented().is_empty(), "{:?}", reg.unimplemented());
}

/// Framed keys, through Confluent's AvroSerializer on the key (subject
/// `<topic>-key`, a bare `string` schema): a key names its node, an edge's
/// key is its id, a tombstone with a framed key deletes, and a key that is
/// not framed is one `bad_framing` reject keeping the key's bytes. The
/// rows, read back by pylance, equal what Confluent's deserializer read
/// from the values.
async fn framed_keys_against(registry: &str, backend: Backend) {
    let registry = registry.to_string();
    let tg = person_and_knows(
        &registry,
        backend,
        "node = \"Person\"\nformat = \"avro\"\nkey = \"kafka\"\nkey_format = \"avro\"",
        "edge = \"Knows\"\nformat = \"avro\"\nkey = \"kafka\"\nkey_format = \"avro\"",
    )
    .await;
    let (people, knows) = (&tg.topics[0], &tg.topics[1]);
    let key = r#""string""#;
    let v1 = encode_keyed(
        &registry,
        people,
        json!({"format": "avro", "schema": V1, "key_schema": key, "keys": ["ann", "bob"],
               "records": [{"name": "ann", "age": 31}, {"name": "bob", "age": null}]}),
    );
    let v2 = encode_keyed(
        &registry,
        people,
        json!({"format": "avro", "schema": V2, "key_schema": key, "keys": ["cy"],
               "records": [{"name": "cy", "age": 5_000_000_000i64, "email": "cy@x"}]}),
    );
    let edges = encode_keyed(
        &registry,
        knows,
        json!({"format": "avro", "schema": KNOWS, "key_schema": key, "keys": ["e1"],
               "records": [{"src": "ann", "dst": "cy", "since": 2020}]}),
    );
    let framed = |e: &Encoded, value: Option<Vec<u8>>| RawRec {
        partition: 0,
        key: e.key.clone(),
        value,
        headers: vec![],
    };
    let recs = vec![
        framed(&v1[0], Some(v1[0].value.clone())),
        framed(&v1[1], Some(v1[1].value.clone())),
        framed(&v2[0], Some(v2[0].value.clone())),
        // bob's tombstone, keyed as his upsert was.
        framed(&v1[1], None),
        raw(0, "plain", Some(v1[0].value.clone())),
    ];
    produce_raw(people, &recs).await;
    produce_raw(knows, &[framed(&edges[0], Some(edges[0].value.clone()))]).await;
    try_run_to_end(&tg).await.expect("run");

    let rows = pylance_rows(&tg, "nodes/Person").await;
    let got = age_and_email(&rows);
    let decoded = age_and_email_decoded;
    let want: BTreeMap<&str, (Value, Value)> = [
        ("ann", decoded(&v1[0].decoded)),
        ("cy", decoded(&v2[0].decoded)),
    ]
    .into_iter()
    .collect();
    assert_eq!(got, want, "{rows:?}");
    let e = pylance_rows(&tg, "edges/Knows").await;
    assert_eq!(e.keys().collect::<Vec<_>>(), ["e1"], "{e:?}");
    assert_eq!(
        (
            e["e1"]["src"].as_str(),
            e["e1"]["dst"].as_str(),
            e["e1"]["since"].as_i64()
        ),
        (Some("ann"), Some("cy"), Some(2020))
    );
    let rejects = rejects_at_head(&tg).await;
    assert_eq!(rejects.len(), 1, "{rejects:?}");
    assert_eq!(rejects[0]["code"], "bad_framing");
    let dlq = read_topic(&tg.dlq, 1, Duration::from_secs(20));
    assert_eq!(dlq[0].key.as_deref(), Some(b"plain".as_slice()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn framed_keys_name_nodes_and_edges_through_apicurio_on_s3() {
    crate::init_logs();
    framed_keys_against(&apicurio(), Backend::S3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn framed_keys_name_nodes_and_edges_through_the_test_registry() {
    crate::init_logs();
    let reg = TestRegistry::start().unwrap();
    framed_keys_against(&reg.url(), Backend::Local).await;
    assert!(reg.unimplemented().is_empty(), "{:?}", reg.unimplemented());
}

/// `evolve = "from_registry"`: a running connector that meets a writer
/// schema with a new optional field restarts its session, which adds the
/// field as an optional property (one schema commit) before it decodes the
/// records that carry it; a later start keeps the property although the
/// `.pg` file does not declare it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evolve_from_registry_adds_a_new_optional_writer_field() {
    crate::init_logs();
    let reg = TestRegistry::start().unwrap();
    let url = &reg.url().to_string();
    let tg = TestGraph::on(
        Backend::Local,
        "node Person { name: String @key  age: I64? }\n",
        &["node = \"Person\"\nformat = \"avro\"\nkey = \"kafka\"\nunknown_fields = \"reject\""],
        &format!("{}[fold]\ninterval = \"300ms\"\n", registry_toml(url)),
    );
    let cfg = std::fs::read_to_string(tg.config_path()).unwrap();
    std::fs::write(
        tg.config_path(),
        cfg.replace("[graph]\n", "[graph]\nevolve = \"from_registry\"\n"),
    )
    .unwrap();
    let people = &tg.topics[0];
    create_topic(people, 1).await;
    let v1 = encode(url, people, V1, &[json!({"name": "ann", "age": 31})]);
    produce_raw(people, &[raw(0, "ann", Some(v1[0].0.clone()))]).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(graphsink::run_with(
        tg.config(),
        graphsink::RunOptions::default(),
        stop.clone(),
    ));
    let landed = |id: &'static str| {
        let tg = &tg;
        move || async move {
            match graphsink::Graph::open_configured(&tg.config()).await {
                Ok(g) => {
                    let head = g.head().await.unwrap();
                    match head.tables.get("nodes/Person") {
                        Some(&v) => read_table(&g, "nodes/Person", v).await.contains_key(id),
                        None => false,
                    }
                }
                Err(_) => false,
            }
        }
    };
    wait_for("ann folded", Duration::from_secs(60), landed("ann")).await;
    // A writer schema with an optional email, met by the running session.
    let v2 = encode(
        url,
        people,
        V2,
        &[json!({"name": "cy", "age": 5, "email": "cy@x"})],
    );
    produce_raw(people, &[raw(0, "cy", Some(v2[0].0.clone()))]).await;
    wait_for("cy folded", Duration::from_secs(60), landed("cy")).await;
    stop.cancel();
    task.await.unwrap().expect("the run stops cleanly");

    let g = tg.graph().await;
    let commits = g.commits().await.unwrap();
    let changes: Vec<&String> = commits
        .iter()
        .filter_map(|c| c.schema_change.as_ref())
        .flat_map(|s| &s.changes)
        .collect();
    assert_eq!(
        changes,
        ["additive    Person: new optional property email: Utf8"],
        "{commits:#?}"
    );
    let rows = pylance_rows(&tg, "nodes/Person").await;
    assert_eq!(rows["cy"]["email"], json!("cy@x"));
    assert_eq!(rows["ann"]["email"], Value::Null);
    assert!(reject_codes(&tg).await.is_empty());
    // A later start keeps the property the file does not declare.
    for cmd in [&["check"][..], &["run", "--exit-at-end"][..]] {
        let out = tg.cli(cmd, &[]);
        assert!(
            out.status.success(),
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(tg.graph().await.head().await.unwrap().schema_version, 1);
}
