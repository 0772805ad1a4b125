//! graphsink against a production-shaped Kafka: three KRaft nodes in
//! network namespaces (replication factor 3, `min.insync.replicas=2`),
//! SASL_SSL with SCRAM-SHA-512, deny-by-default ACLs, Toxiproxy before
//! each node (graphsink_testkit::cluster). graphsink and the producer run
//! on hosts of their own; the graph is on the local disk.

use std::collections::BTreeMap;
use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use graphsink::{Config, Graph};
use graphsink_testkit::{Acl, KafkaCluster, Operation, ResourceType};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::json;

use crate::harness::{read_table, unique, SCHEMA};

/// Runs `graphsink run --exit-at-end` on `host` and returns its exit
/// status and standard error; kills it (and fails) past `within`.
fn run_to_end(
    host: &graphsink_testkit::Host,
    config: &std::path::Path,
    env: &[(&str, &str)],
    within: Duration,
) -> (std::process::ExitStatus, String) {
    let mut cmd = host.command(env!("CARGO_BIN_EXE_graphsink"));
    cmd.args(["run", "--exit-at-end", "--config"])
        .arg(config)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    graphsink_testkit::tie_to_parent(&mut cmd);
    let mut child = cmd.spawn().expect("spawn graphsink run");
    let mut stderr = child.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + within;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "graphsink run --exit-at-end still running after {} s:\n{}",
                within.as_secs(),
                reader.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    (status, reader.join().unwrap_or_default())
}

/// The smoke test of the secured cluster: a topic replicated 3 times made
/// by the admin over SASL_SSL, records from a producer host, and the real
/// binary on a member host with only the ACLs docs/security.md lists:
/// every key lands, the group's offsets reach the end.
#[test]
fn graphsink_ingests_from_a_secured_three_node_cluster() {
    crate::init_logs();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let t0 = Instant::now();
    let cluster = KafkaCluster::start(3).expect("start the cluster");
    let started = t0.elapsed();

    let topic = unique("people");
    let dlq = unique("dlq");
    let group = unique("group");
    cluster.create_topic(&topic, 3, 3, &[]).expect("topic");
    cluster
        .create_topic(&dlq, 1, 3, &[])
        .expect("dead-letter topic");
    let producer_acls = [Operation::Write, Operation::Describe]
        .map(|op| Acl::allow("producer", op, ResourceType::Topic, &topic));
    cluster.grant(&producer_acls).expect("producer ACLs");
    let acls = Acl::graphsink_needs("graphsink", &[&topic], &group, &dlq);
    cluster.grant(&acls).expect("graphsink ACLs");
    let listed = cluster.acls().expect("list ACLs");
    for a in acls.iter().chain(&producer_acls) {
        assert!(listed.contains(a), "{a} is granted: {listed:?}");
    }

    // 300 people over 3 partitions, 100 keys written 3 times: the last
    // write of each key wins.
    let producer_host = cluster.client("producer").expect("producer host");
    let mut cfg = producer_host.sasl_config("producer").unwrap();
    cfg.set("enable.idempotence", "true");
    let producer: FutureProducer = producer_host.create(&cfg).expect("producer");
    let mut expected = BTreeMap::new();
    rt.block_on(async {
        for round in 0..3 {
            for k in 0..100 {
                let name = format!("p{k}");
                let value = json!({"name": name, "age": round * 100 + k}).to_string();
                producer
                    .send(
                        FutureRecord::to(&topic).key(&name).payload(&value),
                        Duration::from_secs(30),
                    )
                    .await
                    .map_err(|(e, _)| e)
                    .expect("produce over SASL_SSL");
                expected.insert(name, round * 100 + k);
            }
        }
        // Records graphsink rejects: their dead letters go to `dlq`.
        for k in 0..BAD {
            producer
                .send(
                    FutureRecord::to(&topic)
                        .key(&format!("bad{k}"))
                        .payload("not json"),
                    Duration::from_secs(30),
                )
                .await
                .map_err(|(e, _)| e)
                .expect("produce");
        }
    });
    drop(producer);

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("graph.pg"), SCHEMA).unwrap();
    let member = cluster.client("m1").expect("member host");
    let mut kafka = String::new();
    for (k, v) in member.sasl_properties("graphsink").unwrap() {
        // The password stays out of the file, as a user's would.
        let v = if k == "sasl.password" {
            "${GRAPHSINK_KAFKA_PASSWORD}".to_string()
        } else {
            v
        };
        kafka.push_str(&format!("\"{k}\" = \"{v}\"\n"));
    }
    let config = dir.path().join("graphsink.toml");
    let text = format!(
        "[graph]\nroot = \"graph\"\nschema = \"graph.pg\"\n\n[kafka]\n{kafka}\"group.id\" = \"{group}\"\n\
         \"session.timeout.ms\" = \"6000\"\n\n[[mapping]]\ntopic = \"{topic}\"\nnode = \"Person\"\n\
         dead_letter_topic = \"{dlq}\"\n"
    );
    std::fs::write(&config, &text).unwrap();
    let password = cluster.password("graphsink").unwrap();
    let t1 = Instant::now();
    let (status, stderr) = run_to_end(
        member.host(),
        &config,
        &[("GRAPHSINK_KAFKA_PASSWORD", &password)],
        Duration::from_secs(90),
    );
    let ran = t1.elapsed();
    assert!(
        status.success(),
        "graphsink run failed ({status}):\n{stderr}"
    );
    assert!(!stderr.contains(&password), "the password is never logged");
    // What graphsink said above INFO on the secured cluster (docs/security.md).
    for line in stderr
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
    {
        eprintln!("graphsink on the secured cluster: {line}");
    }

    let rows = rt.block_on(async {
        // The file's ${GRAPHSINK_KAFKA_PASSWORD}, filled in here rather
        // than in this process's environment, which other tests share.
        let text = text.replace("${GRAPHSINK_KAFKA_PASSWORD}", &password);
        let config = Config::from_toml(&text, dir.path()).unwrap();
        let g = Graph::open_configured(&config).await.unwrap();
        let head = g.head().await.unwrap();
        read_table(&g, "nodes/Person", head.tables["nodes/Person"]).await
    });
    let got: BTreeMap<String, i64> = rows
        .iter()
        .map(|(id, row)| (id.clone(), row["age"].as_i64().unwrap_or(-1)))
        .collect();
    let want: BTreeMap<String, i64> = expected.into_iter().map(|(k, v)| (k, v as i64)).collect();
    assert_eq!(got, want, "every key landed with its last write");
    assert_eq!(
        dead_letters(&cluster, &dlq, BAD),
        BAD,
        "every reject is a dead letter"
    );
    let mut cluster = cluster;
    eprintln!(
        "cluster smoke: started in {} ms, graphsink ran {} ms, RSS (KiB) {:?}",
        started.as_millis(),
        ran.as_millis(),
        cluster.rss_kib()
    );
}

/// Records the smoke test's producer writes that are not JSON.
const BAD: usize = 5;

/// How many records `topic` holds, read as the admin (at most `want`:
/// it stops there, or after 30 s).
fn dead_letters(cluster: &KafkaCluster, topic: &str, want: usize) -> usize {
    let admin = cluster.admin_host();
    let mut cfg = admin
        .sasl_config(graphsink_testkit::cluster::ADMIN)
        .unwrap();
    cfg.set("group.id", unique("reader"))
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed");
    let c: BaseConsumer = admin.create(&cfg).expect("reader");
    c.subscribe(&[topic]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut n = 0;
    while n < want && Instant::now() < deadline {
        if let Some(Ok(_)) = c.poll(Duration::from_millis(500)) {
            n += 1;
        }
    }
    n
}
