//! Authorization (issue 55): graphsink's principal gets exactly the ACLs
//! docs/security.md lists, on a secured node (SASL_SSL with SCRAM-SHA-512,
//! `StandardAuthorizer`, `allow.everyone.if.no.acl.found=false`:
//! graphsink_testkit's `KafkaCluster` with one node), and ingests. Then
//! each ACL in turn is revoked: the real binary's `run --exit-at-end`
//! exits 5 with one line naming the permission in graphsink's words and
//! Kafka's, has committed nothing past what is durable, and once the ACL
//! is granted back the next run ends with every key exact and each fold
//! reject once on the dead-letter topic. A wrong password, and a missing
//! dead-letter topic graphsink may not create, stop it the same way.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use arrow::array::{Array, StringArray};
use graphsink::{Config, Graph, ReadAt, ReadRequest};
use graphsink_testkit::cluster::{ClientHost, Options, ADMIN};
use graphsink_testkit::{Acl, KafkaCluster, Operation, ResourceType};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::json;

use crate::binary::Running;
use crate::harness::{read_table, unique};

/// `@unique` gives a fold reject per round: two names, one email.
const SCHEMA: &str = "node Person { name: String @key  email: String? @unique }\n";

/// Each run's bound: a refusal must stop it well before.
const RUN_WITHIN: Duration = Duration::from_secs(90);

/// The secured node, its hosts and graphsink's config.
struct Secured {
    cluster: KafkaCluster,
    member: ClientHost,
    rt: tokio::runtime::Runtime,
    dir: tempfile::TempDir,
    topic: String,
    dlq: String,
    group: String,
    password: String,
    /// Each offset of `topic`: the key a run must make durable, if any
    /// (not the record that is no JSON, nor the fold reject).
    durable_keys: Vec<Option<String>>,
    /// Every key the graph must hold at the end of a successful run.
    want: BTreeSet<String>,
    rounds: usize,
}

impl Secured {
    fn start() -> Secured {
        let t0 = Instant::now();
        let cluster = KafkaCluster::start_with(&Options::single_node()).expect("secured node");
        eprintln!("secured node ready in {} ms", t0.elapsed().as_millis());
        let (topic, dlq, group) = (unique("people"), unique("dlq"), unique("group"));
        cluster.create_topic(&topic, 1, 1, &[]).expect("topic");
        cluster
            .create_topic(&dlq, 1, 1, &[])
            .expect("dead-letter topic");
        let producer = [Operation::Write, Operation::Describe]
            .map(|op| Acl::allow("producer", op, ResourceType::Topic, &topic));
        cluster.grant(&producer).expect("producer ACLs");
        let member = cluster.client("m1").expect("member host");
        let password = cluster.password("graphsink").unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("graph.pg"), SCHEMA).unwrap();
        let s = Secured {
            cluster,
            member,
            rt: tokio::runtime::Runtime::new().unwrap(),
            dir,
            topic,
            dlq,
            group,
            password,
            durable_keys: Vec::new(),
            want: BTreeSet::new(),
            rounds: 0,
        };
        s.write_config("graphsink.toml", &s.dlq);
        s
    }

    /// A config in the temp dir, its password from the environment.
    fn write_config(&self, name: &str, dlq: &str) -> PathBuf {
        let mut kafka = String::new();
        for (k, v) in self.member.sasl_properties("graphsink").unwrap() {
            let v = match k.as_str() {
                "sasl.password" => "${GRAPHSINK_KAFKA_PASSWORD}".to_string(),
                _ => v,
            };
            kafka.push_str(&format!("\"{k}\" = \"{v}\"\n"));
        }
        let text = format!(
            "[graph]\nroot = \"graph\"\nschema = \"graph.pg\"\n\n[kafka]\n{kafka}\
             \"group.id\" = \"{}\"\n\"session.timeout.ms\" = \"6000\"\n\n\
             [[mapping]]\ntopic = \"{}\"\nnode = \"Person\"\ndead_letter_topic = \"{dlq}\"\n",
            self.group, self.topic
        );
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("graphsink.toml")
    }

    /// The ACLs docs/security.md lists, for this graph.
    fn acls(&self) -> Vec<Acl> {
        Acl::graphsink_needs("graphsink", &[&self.topic], &self.group, &self.dlq)
    }

    /// One round of records: good ones, one that is no JSON (a record
    /// reject) and a second name for an email (a fold reject, `@unique`).
    fn produce_round(&mut self) {
        let r = self.rounds;
        self.rounds += 1;
        let good = |n: &str, email: Option<String>| json!({"name": n, "email": email}).to_string();
        let mut records: Vec<(String, Option<String>)> = vec![(
            good(&format!("r{r}-a"), Some(format!("e{r}"))),
            Some(format!("r{r}-a")),
        )];
        for k in 0..3 {
            let n = format!("r{r}-n{k}");
            records.push((good(&n, None), Some(n)));
        }
        records.push(("not json".into(), None));
        records.push((good(&format!("r{r}-b"), Some(format!("e{r}"))), None));
        let host = self.cluster.client("producer").expect("producer host");
        let mut cfg = host.sasl_config("producer").unwrap();
        cfg.set("enable.idempotence", "true");
        let producer: FutureProducer = host.create(&cfg).expect("producer");
        let topic = self.topic.clone();
        self.rt.block_on(async {
            for (value, _) in &records {
                producer
                    .send(
                        FutureRecord::<(), _>::to(&topic).payload(value),
                        Duration::from_secs(30),
                    )
                    .await
                    .map_err(|(e, _)| e)
                    .expect("produce");
            }
        });
        for (_, key) in records {
            self.want.extend(key.clone());
            self.durable_keys.push(key);
        }
    }

    /// `graphsink run --exit-at-end` on the member host: its exit code and
    /// stderr (checked for source locations by `binary`).
    fn run(&self, config: &PathBuf, password: &str) -> (Option<i32>, String) {
        let mut cmd = self.member.host().command(env!("CARGO_BIN_EXE_graphsink"));
        cmd.args(["run", "--exit-at-end", "--config"])
            .arg(config)
            .env("GRAPHSINK_KAFKA_PASSWORD", password)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        graphsink_testkit::tie_to_parent(&mut cmd);
        let mut child = Running::spawn(cmd);
        let deadline = Instant::now() + RUN_WITHIN;
        let status = loop {
            if let Some(s) = child.try_wait().expect("wait") {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "graphsink run --exit-at-end still running after {RUN_WITHIN:?}:\n{}",
                    child.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(
            !child.stderr().contains(password),
            "the password is never logged"
        );
        (status.code(), child.stderr().to_string())
    }

    /// A run with the whole list: it ends 0, every key exact, each fold
    /// reject once and every record reject at least once on the topic.
    fn run_to_the_end(&self, what: &str) {
        let (code, stderr) = self.run(&self.config(), &self.password);
        assert_eq!(code, Some(0), "{what}: the run ends 0:\n{stderr}");
        assert_eq!(
            self.keys(ReadAt::Head),
            self.want,
            "{what}: every key exact"
        );
        let (fold, record) = self.dead_letters();
        assert_eq!(
            fold.len(),
            self.rounds,
            "{what}: one fold reject a round: {fold:?}"
        );
        assert!(
            fold.values().all(|&n| n == 1),
            "{what}: each once: {fold:?}"
        );
        assert_eq!(
            record.len(),
            self.rounds,
            "{what}: a record reject a round: {record:?}"
        );
        assert_eq!(
            self.committed(),
            Some(self.durable_keys.len() as i64),
            "{what}"
        );
    }

    /// A run without one permission: exit 5, one line naming `needs` and
    /// one of `codes`, nothing committed past what is durable.
    fn run_refused(&self, config: &PathBuf, password: &str, needs: &str, codes: &[&str]) -> String {
        let (code, stderr) = self.run(config, password);
        let lines: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("graphsink: error: "))
            .collect();
        assert_eq!(code, Some(5), "refused {needs}: exit 5:\n{stderr}");
        assert_eq!(lines.len(), 1, "one error line:\n{stderr}");
        let line = lines[0];
        assert!(
            line.contains(&format!("not authorized: graphsink needs {needs}"))
                && codes.iter().any(|c| line.contains(&format!("({c})")))
                && line.contains("docs/security.md"),
            "the line names {needs} ({codes:?}): {line}"
        );
        // No passing trouble said meanwhile: the old retries for ever.
        for retry in [
            "librdkafka retries",
            "produce failed; retrying",
            "transaction failed; retrying",
        ] {
            assert!(
                !stderr.contains(retry),
                "refused {needs}: no '{retry}':\n{stderr}"
            );
        }
        self.nothing_committed_past_durable(needs);
        line.to_string()
    }

    /// Every record below the group's committed offset is durable: its
    /// key is in the graph or the WAL (a fresh read).
    fn nothing_committed_past_durable(&self, what: &str) {
        let committed = self.committed().unwrap_or(0) as usize;
        let fresh = self.keys(ReadAt::Fresh);
        for (offset, key) in self.durable_keys.iter().enumerate().take(committed) {
            if let Some(k) = key {
                assert!(
                    fresh.contains(k),
                    "{what}: offset {offset} ({k}) is committed ({committed}) but not durable"
                );
            }
        }
    }

    /// The ids of Person at the head, or fresh (WAL included).
    fn keys(&self, at: ReadAt) -> BTreeSet<String> {
        let text = std::fs::read_to_string(self.config())
            .unwrap()
            .replace("${GRAPHSINK_KAFKA_PASSWORD}", &self.password);
        self.rt.block_on(async {
            let config = Config::from_toml(&text, self.dir.path()).unwrap();
            let g = Graph::open_configured(&config).await.unwrap();
            if at == ReadAt::Head {
                let head = g.head().await.unwrap();
                let rows = read_table(&g, "nodes/Person", head.tables["nodes/Person"]).await;
                return rows.into_keys().collect();
            }
            let req = ReadRequest {
                type_name: "Person".into(),
                at,
                ..Default::default()
            };
            let rows = g.read(&req).await.unwrap();
            let mut ids = BTreeSet::new();
            for b in &rows.batches {
                let col = b.column_by_name("id").expect("id");
                let col = col
                    .as_any()
                    .downcast_ref::<StringArray>()
                    .expect("string ids");
                ids.extend((0..col.len()).map(|i| col.value(i).to_string()));
            }
            ids
        })
    }

    /// The group's committed offset of the topic's one partition.
    fn committed(&self) -> Option<i64> {
        let admin = self.cluster.admin_host();
        let mut cfg = admin.sasl_config(ADMIN).unwrap();
        cfg.set("group.id", &self.group);
        let c: BaseConsumer = admin.create(&cfg).expect("consumer");
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&self.topic, 0);
        let got = c
            .committed_offsets(tpl, Duration::from_secs(30))
            .expect("committed offsets");
        match got.elements()[0].offset() {
            Offset::Offset(n) => Some(n),
            _ => None,
        }
    }

    /// The dead-letter topic as a `read_committed` reader sees it: fold
    /// and record reject ids, each with how often it is there.
    fn dead_letters(&self) -> (BTreeMap<String, usize>, BTreeMap<String, usize>) {
        let admin = self.cluster.admin_host();
        let mut cfg = admin.sasl_config(ADMIN).unwrap();
        cfg.set("group.id", unique("reader"))
            .set("isolation.level", "read_committed")
            .set("enable.partition.eof", "true");
        let c: BaseConsumer = admin.create(&cfg).expect("reader");
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&self.dlq, 0, Offset::Beginning)
            .unwrap();
        c.assign(&tpl).unwrap();
        let (mut fold, mut record) = (BTreeMap::new(), BTreeMap::new());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            assert!(
                Instant::now() < deadline,
                "the dead-letter topic read to its end"
            );
            match c.poll(Duration::from_millis(500)) {
                Some(Ok(m)) => {
                    let header = |name: &str| {
                        m.headers().and_then(|hs| {
                            hs.iter()
                                .find(|h| h.key == name)
                                .and_then(|h| h.value)
                                .map(|v| String::from_utf8_lossy(v).into_owned())
                        })
                    };
                    let id = header("graphsink.reject_id").expect("reject_id");
                    let sink = match header("graphsink.stage").as_deref() {
                        Some("fold") => &mut fold,
                        _ => &mut record,
                    };
                    *sink.entry(id).or_insert(0) += 1;
                }
                Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => break,
                Some(Err(e)) => panic!("read the dead-letter topic: {e}"),
                None => {}
            }
        }
        (fold, record)
    }
}

/// What graphsink says it needs for each ACL of the list: the permission
/// and the codes Kafka may give for it (a revoked WRITE on the dead-letter
/// topic refuses the idempotent producer's init first, or the produce).
fn says(acl: &Acl) -> (String, Vec<&'static str>) {
    let t = "TOPIC_AUTHORIZATION_FAILED";
    match (acl.operation, acl.resource) {
        (Operation::Read, ResourceType::Topic) => (format!("READ on topic {}", acl.name), vec![t]),
        (Operation::Write, ResourceType::Topic) => (
            format!("WRITE on topic {}", acl.name),
            vec![t, "CLUSTER_AUTHORIZATION_FAILED"],
        ),
        (Operation::Read, ResourceType::Group) => (
            format!("READ on group {}", acl.name),
            vec!["GROUP_AUTHORIZATION_FAILED"],
        ),
        (Operation::Write, ResourceType::TransactionalId) => (
            format!("WRITE on transactional id {}", acl.name),
            vec!["TRANSACTIONAL_ID_AUTHORIZATION_FAILED"],
        ),
        other => panic!("an ACL the list does not have: {other:?}"),
    }
}

/// The list is enough, and each ACL on it is needed: its absence stops the
/// run with exit 5 naming it, and its return lets the run end exact.
#[test]
fn graphsink_needs_exactly_the_acls_docs_security_lists() {
    crate::init_logs();
    let t0 = Instant::now();
    let mut s = Secured::start();
    let acls = s.acls();
    s.cluster.grant(&acls).expect("graphsink's ACLs");
    s.produce_round();
    s.run_to_the_end("the whole list");

    for acl in &acls {
        let t = Instant::now();
        assert_eq!(
            s.cluster
                .revoke(std::slice::from_ref(acl))
                .expect("revoke")
                .len(),
            1
        );
        s.produce_round();
        let (needs, codes) = says(acl);
        let line = s.run_refused(&s.config(), &s.password, &needs, &codes);
        s.cluster
            .grant(std::slice::from_ref(acl))
            .expect("grant back");
        s.run_to_the_end(&format!("{acl} granted back"));
        eprintln!("without {acl}: {line} ({} ms)", t.elapsed().as_millis());
    }

    // The credentials: a wrong password is named by its user, never shown.
    let wrong = "not-the-password";
    s.run_refused(
        &s.config(),
        wrong,
        "valid SASL credentials for user graphsink",
        &["SASL_AUTHENTICATION_FAILED"],
    );

    // A dead-letter topic that does not exist, which graphsink may see and
    // write but not create: the start stops (an operator creates it, or
    // grants CREATE); with CREATE granted graphsink creates it.
    let missing = unique("dlq-missing");
    let config = s.write_config("missing-dlq.toml", &missing);
    let rw = [Operation::Read, Operation::Write]
        .map(|op| Acl::allow("graphsink", op, ResourceType::Topic, &missing));
    s.cluster
        .grant(&rw)
        .expect("READ and WRITE on the missing topic");
    s.run_refused(
        &config,
        &s.password,
        &format!("CREATE on topic {missing} (or the topic created by an operator)"),
        &["TOPIC_AUTHORIZATION_FAILED"],
    );
    let create = Acl::allow(
        "graphsink",
        Operation::Create,
        ResourceType::Topic,
        &missing,
    );
    s.cluster.grant(&[create]).expect("CREATE");
    let (code, stderr) = s.run(&config, &s.password);
    assert_eq!(code, Some(0), "with CREATE the topic is made:\n{stderr}");
    assert!(
        stderr.contains("created dead-letter topic"),
        "graphsink created it:\n{stderr}"
    );
    let md = s.cluster.metadata(Some(&missing)).expect("metadata");
    assert_eq!(
        md.topics()[0].partitions().len(),
        1,
        "made with one partition"
    );
    eprintln!("security: {} ms in all", t0.elapsed().as_millis());
}
