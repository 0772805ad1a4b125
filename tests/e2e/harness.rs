//! Test harness: the real broker (external via GRAPHSINK_TEST_BROKER, or an
//! Apache Kafka started here), per-test topics, graphs in temp dirs, and readers
//! of what landed in Lance and in the consumer group.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use arrow::array::{Array, RecordBatch, StringArray};
use futures::TryStreamExt;
use graphsink::Config;
use graphsink::Graph;
use graphsink_testkit::{s3, BrokerBackend, S3Server, TestBroker};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::binary::{self, Running};

struct Broker {
    addr: String,
    /// Never dropped (it lives in a static): the broker goes with the test
    /// process through PR_SET_PDEATHSIG, which graphsink-testkit sets.
    _private: Option<TestBroker>,
    /// The container backend's Kafka (left to Docker's reaper at exit).
    _container: Option<graphsink_testkit::containers::KafkaContainer>,
}

static BROKER: OnceLock<Broker> = OnceLock::new();

/// The broker address. Never skips: it uses GRAPHSINK_TEST_BROKER, or Kafka
/// in a container (GRAPHSINK_TEST_BROKER_BACKEND=containers), or starts the
/// Apache Kafka (or, with GRAPHSINK_TEST_BROKER_BACKEND=tansu, the tansu)
/// that scripts/test.sh installs, or fails saying how to get one.
pub(crate) fn broker() -> &'static str {
    &BROKER
        .get_or_init(|| {
            if let Ok(addr) = std::env::var("GRAPHSINK_TEST_BROKER") {
                return Broker {
                    addr,
                    _private: None,
                    _container: None,
                };
            }
            if graphsink_testkit::containers::selected() {
                let k = graphsink_testkit::containers::start().unwrap_or_else(|e| panic!("{e}"));
                return Broker {
                    addr: k.bootstrap.clone(),
                    _private: None,
                    _container: Some(k),
                };
            }
            let backend = BrokerBackend::from_env().unwrap_or_else(|e| panic!("{e}"));
            backend.check_installed().unwrap_or_else(|e| {
                panic!("no Kafka broker for the tests: set GRAPHSINK_TEST_BROKER=host:port, or run `bash scripts/test.sh`, which installs and starts one ({e})")
            });
            let b = TestBroker::start(&backend, None)
                .unwrap_or_else(|e| panic!("start {}: {e}", backend.describe()));
            Broker {
                addr: b.bootstrap.clone(),
                _private: Some(b),
                _container: None,
            }
        })
        .addr
}

struct S3 {
    endpoint: String,
    _moto: Option<S3Server>,
}

static S3_SERVER: OnceLock<S3> = OnceLock::new();

/// The S3 endpoint (moto, `http://127.0.0.1:PORT`), with the test bucket
/// created and conditional PUTs proven enforced. Never skips: it uses
/// GRAPHSINK_TEST_S3, or starts the moto that scripts/test.sh installs, or
/// fails saying how to get one.
pub(crate) fn s3_endpoint() -> &'static str {
    &S3_SERVER
        .get_or_init(|| {
            let (endpoint, moto) = match std::env::var("GRAPHSINK_TEST_S3") {
                Ok(e) => (e, None),
                Err(_) => {
                    let bin = s3::default_bin();
                    assert!(
                        bin.exists(),
                        "no S3 server for the tests: set GRAPHSINK_TEST_S3=http://host:port, \
                         or run `bash scripts/test.sh`, which installs and starts moto ({} is missing)",
                        bin.display()
                    );
                    let m = S3Server::start(Some(bin)).unwrap_or_else(|e| panic!("start moto: {e}"));
                    (m.endpoint.clone(), Some(m))
                }
            };
            s3::create_bucket(&endpoint, s3::TEST_BUCKET).unwrap_or_else(|e| panic!("{e}"));
            // The suite refuses a server on which Lance would lose commits.
            s3::check_conditional_puts(&endpoint, s3::TEST_BUCKET)
                .unwrap_or_else(|e| panic!("{e}"));
            S3 {
                endpoint,
                _moto: moto,
            }
        })
        .endpoint
}

/// Where a test graph's root lives: the core scenarios run on both.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Backend {
    /// A directory in the test's temp dir.
    Local,
    /// A fresh prefix of the test bucket on the S3 server.
    S3,
    /// The same, reached through this endpoint (a fault proxy).
    S3Via(String),
}

impl Backend {
    /// The `[graph]` lines naming the root and how to reach it.
    fn graph_toml(&self) -> String {
        let endpoint = match self {
            Backend::Local => return "root = \"graph\"\n".into(),
            Backend::S3 => s3_endpoint().to_string(),
            Backend::S3Via(e) => {
                s3_endpoint(); // the bucket exists and the server is checked
                e.clone()
            }
        };
        format!(
            "root = \"s3://{}/{}\"\n\n[graph.storage_options]\naws_endpoint = \"{endpoint}\"\n\
             aws_region = \"{}\"\naws_access_key_id = \"{}\"\naws_secret_access_key = \"{}\"\n\
             aws_allow_http = \"true\"\n",
            s3::TEST_BUCKET,
            unique("graph"),
            s3::REGION,
            s3::ACCESS_KEY,
            s3::SECRET_KEY,
        )
    }
}

/// Generates one test per backend from `async fn name(backend: Backend)`:
/// `local::name` and `s3::name`, so each scenario is written once.
#[macro_export]
macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {
        mod local {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::harness::Backend::Local).await
                }
            )*
        }
        mod s3 {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::harness::Backend::S3).await
                }
            )*
        }
    };
}

pub(crate) fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

pub(crate) async fn create_topic(name: &str, partitions: i32) {
    create_topic_with(name, partitions, &[]).await
}

/// [`create_topic`] with topic configs (`max.message.bytes`, ...).
pub(crate) async fn create_topic_with(name: &str, partitions: i32, configs: &[(&str, &str)]) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", broker())
        .create()
        .expect("admin client");
    let mut topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    for (k, v) in configs {
        topic = topic.set(k, v);
    }
    let res = admin
        .create_topics([&topic], &AdminOptions::new())
        .await
        .expect("create topics");
    for r in res {
        r.expect("topic created");
    }
}

/// One record to produce to an explicit partition.
#[derive(Clone, Debug)]
pub(crate) struct Rec {
    pub partition: i32,
    pub key: Option<String>,
    pub value: Option<String>,
}

pub(crate) fn rec(partition: i32, key: Option<&str>, value: Option<serde_json::Value>) -> Rec {
    Rec {
        partition,
        key: key.map(str::to_string),
        value: value.map(|v| v.to_string()),
    }
}

/// A record with raw bytes and headers (the hostile corpus).
#[derive(Clone, Debug, Default)]
pub(crate) struct RawRec {
    pub partition: i32,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Vec<u8>)>,
}

pub(crate) async fn produce_raw(topic: &str, recs: &[RawRec]) {
    use rdkafka::message::{Header, OwnedHeaders};
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", broker())
        .set("enable.idempotence", "true")
        .set("message.max.bytes", "2000000")
        .create()
        .expect("producer");
    for r in recs {
        let mut h = OwnedHeaders::new();
        for (k, v) in &r.headers {
            h = h.insert(Header {
                key: k,
                value: Some(v),
            });
        }
        let mut fr: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(topic).partition(r.partition).headers(h);
        if let Some(k) = &r.key {
            fr = fr.key(k);
        }
        if let Some(v) = &r.value {
            fr = fr.payload(v);
        }
        producer
            .send(fr, Duration::from_secs(10))
            .await
            .map_err(|(e, _)| e)
            .expect("produce");
    }
}

/// `_ingest_rejects` at the head commit, as plain Lance reads it.
pub(crate) async fn rejects_at_head(tg: &TestGraph) -> Vec<serde_json::Value> {
    tg.rows("_ingest_rejects").await.into_values().collect()
}

pub(crate) async fn produce(topic: &str, recs: &[Rec]) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", broker())
        .set("enable.idempotence", "true")
        .create()
        .expect("producer");
    for r in recs {
        let mut fr: FutureRecord<'_, String, String> =
            FutureRecord::to(topic).partition(r.partition);
        if let Some(k) = &r.key {
            fr = fr.key(k);
        }
        if let Some(v) = &r.value {
            fr = fr.payload(v);
        }
        producer
            .send(fr, Duration::from_secs(10))
            .await
            .map_err(|(e, _)| e)
            .expect("produce");
    }
}

fn group_consumer(group: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", broker())
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer")
}

/// Committed offsets of `group` on `topic` (absent partitions have none).
pub(crate) fn committed(group: &str, topic: &str, partitions: i32) -> BTreeMap<i32, i64> {
    let c = group_consumer(group);
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    // Retried: on a broker that just started, the first group request
    // creates __consumer_offsets and is answered NotCoordinator (or
    // CoordinatorLoadInProgress) until its partitions are loaded.
    let deadline = Instant::now() + Duration::from_secs(30);
    let got = loop {
        match c.committed_offsets(tpl.clone(), Duration::from_secs(10)) {
            Ok(got) => break got,
            Err(e) if Instant::now() < deadline => {
                eprintln!("committed offsets of {group}: {e}; retrying");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("committed offsets of {group}: {e}"),
        }
    };
    got.elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(n) => Some((e.partition(), n)),
            _ => None,
        })
        .collect()
}

pub(crate) fn end_offsets(topic: &str, partitions: i32) -> BTreeMap<i32, i64> {
    let c = group_consumer(&unique("probe"));
    (0..partitions)
        .map(|p| {
            let (_, high) = c
                .fetch_watermarks(topic, p, Duration::from_secs(10))
                .expect("watermarks");
            (p, high)
        })
        .collect()
}

/// Resets `group` to offset 0 on every partition of `topic`.
pub(crate) fn reset_group(group: &str, topic: &str, partitions: i32) {
    let c = group_consumer(group);
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Offset(0))
            .unwrap();
    }
    c.commit(&tpl, CommitMode::Sync).expect("reset offsets");
}

/// The members of `group` as its coordinator lists them (DescribeGroups).
pub(crate) fn group_members(group: &str) -> usize {
    let list = group_consumer(&unique("probe"))
        .fetch_group_list(Some(group), Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("describe group {group}: {e}"));
    list.groups()
        .iter()
        .find(|g| g.name() == group)
        .map_or(0, |g| g.members().len())
}

/// Waits until `group` has no member: a killed member's session expired.
/// Bounded by the session timeout the tests set, and the coordinator's
/// check of it, with room for a loaded machine.
pub(crate) async fn wait_for_no_members(group: &str) {
    let bound = SESSION_TIMEOUT * 4;
    wait_until(
        &format!("group {group} to have no member (session {SESSION_TIMEOUT:?})"),
        bound,
        || group_members(group) == 0,
    )
    .await;
}

/// `wait_until` for a check that awaits (reads the graph). A sync check
/// must not `block_on` a Lance read inside the test's runtime: once tokio's
/// cooperative budget of the test task is spent, every tokio resource the
/// nested read polls answers "pending, wake me" at once, and the read spins
/// at 100 % CPU forever.
pub(crate) async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(crate) async fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A graph in a temp dir with its own topics and consumer group.
pub(crate) struct TestGraph {
    pub dir: tempfile::TempDir,
    pub group: String,
    pub topics: Vec<String>,
    /// The dead-letter topic of every mapping (unique per test).
    pub dlq: String,
}

/// Every test graph's `session.timeout.ms`: the bound of a wait for a dead
/// member to leave its group.
pub(crate) const SESSION_TIMEOUT: Duration = Duration::from_secs(6);

pub(crate) const SCHEMA: &str = r#"
node Person { name: String @key  age: I32?  city: String? }
node Company { ticker: String @key  name: String  founded: I32? }
node Slot { tenant: String  slot: U32  label: String?  @key(tenant, slot) }
"#;

impl TestGraph {
    /// `mappings` are TOML `[[mapping]]` bodies without the `topic` line;
    /// each gets a fresh topic, in order. `extra` is appended verbatim.
    pub(crate) fn new(mappings: &[&str], extra: &str) -> TestGraph {
        Self::with_schema(SCHEMA, mappings, extra)
    }

    pub(crate) fn with_schema(schema: &str, mappings: &[&str], extra: &str) -> TestGraph {
        Self::on(Backend::Local, schema, mappings, extra)
    }

    /// A graph on `backend`; the config file stays in the temp dir.
    pub(crate) fn on(backend: Backend, schema: &str, mappings: &[&str], extra: &str) -> TestGraph {
        let extra = &for_the_broker(extra);
        let dir = tempfile::tempdir().expect("temp dir");
        let group = unique("group");
        let topics: Vec<String> = mappings.iter().map(|_| unique("topic")).collect();
        std::fs::write(dir.path().join("graph.pg"), schema).unwrap();
        let mut cfg = format!(
            "[graph]\nschema = \"graph.pg\"\n{}\n[kafka]\n\"bootstrap.servers\" = \"{}\"\n\"group.id\" = \"{group}\"\n\"session.timeout.ms\" = \"{}\"\n\n{extra}\n",
            backend.graph_toml(),
            broker(),
            SESSION_TIMEOUT.as_millis()
        );
        let dlq = unique("dlq");
        for (m, t) in mappings.iter().zip(&topics) {
            cfg.push_str(&format!("[[mapping]]\ntopic = \"{t}\"\n{m}\n"));
            if !m.contains("dead_letter_topic") {
                cfg.push_str(&format!("dead_letter_topic = \"{dlq}\"\n"));
            }
            cfg.push('\n');
        }
        std::fs::write(dir.path().join("graphsink.toml"), cfg).unwrap();
        TestGraph {
            dir,
            group,
            topics,
            dlq,
        }
    }

    pub(crate) fn config_path(&self) -> PathBuf {
        self.dir.path().join("graphsink.toml")
    }

    pub(crate) fn config(&self) -> Config {
        Config::load(&self.config_path()).expect("config")
    }

    pub(crate) async fn graph(&self) -> Graph {
        Graph::open_configured(&self.config()).await.expect("graph")
    }

    /// Rows of `table` at the head commit: id → the row as JSON.
    pub(crate) async fn rows(&self, table: &str) -> BTreeMap<String, serde_json::Value> {
        let g = self.graph().await;
        let head = g.head().await.unwrap();
        read_table(&g, table, head.tables[table]).await
    }

    /// Each `Person`'s id and age at the head commit, in id order.
    pub(crate) async fn person_ages(&self) -> Vec<(String, Option<i64>)> {
        self.rows("nodes/Person")
            .await
            .into_iter()
            .map(|(id, r)| (id, r["age"].as_i64()))
            .collect()
    }

    /// Runs the real binary to completion (its stderr checked: `binary`).
    pub(crate) fn cli(&self, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
        let mut cmd = binary::graphsink();
        cmd.args(args).arg("--config").arg(self.config_path());
        for (k, v) in env {
            cmd.env(k, v);
        }
        binary::output(cmd)
    }

    /// A `graphsink run` child that dies with the test, even one that
    /// fails before it kills the child itself.
    pub(crate) fn spawn_run(&self) -> Running {
        self.spawn_run_with(&[])
    }

    /// [`TestGraph::spawn_run`] with extra environment (failpoints).
    pub(crate) fn spawn_run_with(&self, env: &[(&str, &str)]) -> Running {
        let mut cmd = binary::graphsink();
        cmd.args(["run", "--config"])
            .arg(self.config_path())
            .envs(env.iter().copied())
            .stdout(Stdio::null());
        graphsink_testkit::tie_to_parent(&mut cmd);
        Running::spawn(cmd)
    }

    /// [`TestGraph::spawn_run_with`] whose stderr the test reads
    /// ([`Captured::exit_within`]).
    pub(crate) fn spawn_run_capturing(&self, env: &[(&str, &str)]) -> Captured {
        self.spawn_capturing(&["run"], env)
    }

    /// The binary with `args` (and `--config`), its stderr kept (and
    /// checked for source locations, as `binary::Running` does).
    pub(crate) fn spawn_capturing(&self, args: &[&str], env: &[(&str, &str)]) -> Captured {
        let mut cmd = crate::binary::graphsink();
        cmd.args(args)
            .arg("--config")
            .arg(self.config_path())
            .envs(env.iter().copied())
            .stdout(Stdio::null());
        graphsink_testkit::tie_to_parent(&mut cmd);
        Captured {
            child: Running::spawn(cmd),
        }
    }
}

/// A graphsink child whose stderr the test reads.
pub(crate) struct Captured {
    pub child: Running,
}

impl Captured {
    /// Waits up to `limit` for the child to exit by itself: its exit code
    /// and all it wrote to stderr. Past `limit` it is killed and the test
    /// fails.
    pub(crate) async fn exit_within(mut self, limit: Duration) -> (Option<i32>, String) {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("wait") {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "graphsink did not exit within {limit:?}; its stderr:\n{}",
                    self.child.stderr()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        (status.code(), self.child.stderr().to_string())
    }

    /// Kills the child (if it still runs) and returns its stderr.
    pub(crate) fn kill(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child.stderr().to_string()
    }
}

/// What the opt-in tansu backend needs in every config: the quiet second of
/// `--exit-at-end` (its high watermark can read low) and no dead-letter
/// transactions (it cannot abort one). Nothing for Apache Kafka.
/// Whether the tests run against the opt-in tansu backend.
pub(crate) fn on_tansu() -> bool {
    std::env::var(graphsink_testkit::broker::BACKEND_VAR).is_ok_and(|b| b == "tansu")
}

fn for_the_broker(extra: &str) -> String {
    if !on_tansu() {
        return extra.to_string();
    }
    let mut out = extra.to_string();
    for (section, line) in [
        ("[offsets]", "exit_at_end_quiet = \"1s\""),
        ("[errors]", "dead_letter_transactions = false"),
    ] {
        let key = line.split(' ').next().unwrap_or_default();
        if out.contains(key) {
            continue;
        }
        out = match out.find(&format!("{section}\n")) {
            Some(i) => {
                let at = i + section.len() + 1;
                format!("{}{line}\n{}", &out[..at], &out[at..])
            }
            None => format!("{out}\n{section}\n{line}\n"),
        };
    }
    out
}

/// The latest version of a table, opened with plain Lance (and the root's
/// storage options), independent of graphsink's own read path.
pub(crate) async fn plain_open(g: &Graph, table: &str) -> lance::Dataset {
    let uri = g.table_uri(table);
    lance::dataset::builder::DatasetBuilder::from_uri(&uri)
        .with_storage_options(g.store().options().clone())
        .load()
        .await
        .unwrap_or_else(|e| panic!("open {uri}: {e}"))
}

/// Reads every row of a table version with plain Lance.
pub(crate) async fn read_table(
    g: &Graph,
    table: &str,
    version: u64,
) -> BTreeMap<String, serde_json::Value> {
    let ds = plain_open(g, table).await;
    let ds = ds.checkout_version(version).await.unwrap();
    let batches: Vec<RecordBatch> = ds
        .scan()
        .try_into_stream()
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let mut out = BTreeMap::new();
    for b in batches {
        let mut buf = Vec::new();
        let mut w = arrow_json::ArrayWriter::new(&mut buf);
        w.write(&b).unwrap();
        w.finish().unwrap();
        let rows: Vec<serde_json::Value> = serde_json::from_slice(&buf).unwrap_or_default();
        let ids = b
            .column_by_name("id")
            .or_else(|| b.column_by_name("reject_id"))
            .unwrap()
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap()
            .clone();
        for (i, row) in rows.into_iter().enumerate() {
            let id = ids.value(i).to_string();
            assert!(
                out.insert(id.clone(), row).is_none(),
                "duplicate id {id} in {table}"
            );
        }
    }
    out
}

pub(crate) fn strip_provenance(
    rows: &BTreeMap<String, serde_json::Value>,
) -> BTreeMap<String, serde_json::Value> {
    rows.iter()
        .map(|(k, v)| {
            let mut v = v.clone();
            if let Some(o) = v.as_object_mut() {
                o.retain(|k, _| !k.starts_with("_src_"));
            }
            (k.clone(), v)
        })
        .collect()
}

/// One message read back from a topic (the dead-letter topic, mostly).
#[derive(Debug, Clone)]
pub(crate) struct Consumed {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl Consumed {
    pub(crate) fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_ref())
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }
}

/// Every message of `topic` (all partitions, from the start) as an
/// independent consumer sees it, once `want` arrived or `timeout` passed.
pub(crate) fn read_topic(topic: &str, want: usize, timeout: Duration) -> Vec<Consumed> {
    read_topic_as(topic, want, timeout, "read_committed")
}

/// [`read_topic`] with `isolation.level` set: `read_uncommitted` also shows
/// the records of aborted (and open) transactions.
pub(crate) fn read_topic_as(
    topic: &str,
    want: usize,
    timeout: Duration,
    isolation: &str,
) -> Vec<Consumed> {
    use rdkafka::message::{Headers, Message};
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker())
        .set("group.id", unique("reader"))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", isolation)
        .create()
        .expect("reader");
    let deadline = Instant::now() + timeout;
    let parts = loop {
        if let Ok(md) = c.fetch_metadata(Some(topic), Duration::from_secs(5)) {
            let n = md.topics().first().map_or(0, |t| t.partitions().len());
            if n > 0 {
                break n as i32;
            }
        }
        if Instant::now() > deadline {
            return vec![];
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut tpl = TopicPartitionList::new();
    for p in 0..parts {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    c.assign(&tpl).expect("assign");
    let mut out = Vec::new();
    while out.len() < want && Instant::now() < deadline {
        if let Some(Ok(m)) = c.poll(Duration::from_millis(200)) {
            out.push(Consumed {
                key: m.key().map(<[u8]>::to_vec),
                value: m.payload().map(<[u8]>::to_vec),
                headers: m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|x| (x.key.to_string(), x.value.map(<[u8]>::to_vec)))
                            .collect()
                    })
                    .unwrap_or_default(),
            });
        }
    }
    out
}

/// Every message `topic` holds now, as a reader with `isolation` sees it:
/// read until each partition reports its end (librdkafka's partition EOF:
/// the high watermark, or the last stable offset for `read_committed`).
/// For a topic whose producers are done, "exactly N" then needs no wait
/// for more. A topic that does not exist holds nothing.
pub(crate) fn read_topic_to_end(topic: &str, isolation: &str) -> Vec<Consumed> {
    read_topic_to_end_on(broker(), topic, isolation)
}

/// [`read_topic_to_end`] on the broker at `bootstrap`.
pub(crate) fn read_topic_to_end_on(bootstrap: &str, topic: &str, isolation: &str) -> Vec<Consumed> {
    use rdkafka::error::KafkaError;
    use rdkafka::message::{Headers, Message};
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", unique("reader"))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "true")
        .set("isolation.level", isolation)
        .create()
        .expect("reader");
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("metadata of {topic}: {e}"));
    let parts = md.topics().first().map_or(0, |t| t.partitions().len()) as i32;
    let deadline = Instant::now() + Duration::from_secs(60);
    if isolation == "read_committed" {
        // A transaction committed just now may not have its markers on the
        // partition yet, which holds the stable offset below the end: wait
        // until none is open (the watermark query follows the isolation).
        let all: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", unique("probe"))
            .set("isolation.level", "read_uncommitted")
            .create()
            .expect("probe");
        for p in 0..parts {
            let high = |c: &BaseConsumer| {
                c.fetch_watermarks(topic, p, Duration::from_secs(10))
                    .expect("watermarks")
                    .1
            };
            while high(&c) < high(&all) {
                assert!(
                    Instant::now() < deadline,
                    "{topic}/{p}: a transaction stays open"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    let mut tpl = TopicPartitionList::new();
    for p in 0..parts {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    c.assign(&tpl).expect("assign");
    let mut ended = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    while (ended.len() as i32) < parts {
        assert!(
            Instant::now() < deadline,
            "{topic}: no end on partitions {:?} after 60 s",
            (0..parts)
                .filter(|p| !ended.contains(p))
                .collect::<Vec<_>>()
        );
        match c.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => out.push(Consumed {
                key: m.key().map(<[u8]>::to_vec),
                value: m.payload().map(<[u8]>::to_vec),
                headers: m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|x| (x.key.to_string(), x.value.map(<[u8]>::to_vec)))
                            .collect()
                    })
                    .unwrap_or_default(),
            }),
            Some(Err(KafkaError::PartitionEOF(p))) => {
                ended.insert(p);
            }
            Some(Err(e)) => panic!("read {topic}: {e}"),
            None => {}
        }
    }
    out
}

/// Runs the connector in process until it is at the end of its topics.
pub(crate) async fn try_run_to_end(tg: &TestGraph) -> graphsink::Result<graphsink::RunSummary> {
    let options = graphsink::RunOptions {
        exit_at_end: true,
        ..Default::default()
    };
    tokio::time::timeout(
        Duration::from_secs(120),
        graphsink::run_with(
            tg.config(),
            options,
            tokio_util::sync::CancellationToken::new(),
        ),
    )
    .await
    .expect("run reached the end in time")
}

/// The Python with Confluent's client (scripts/lib.sh `ensure_sr_client`).
pub(crate) fn sr_python() -> String {
    if let Ok(p) = std::env::var("SR_PYTHON") {
        return p;
    }
    let cache = std::env::var("GRAPHSINK_CACHE")
        .unwrap_or_else(|_| format!("{}/.cache/graphsink", std::env::var("HOME").expect("HOME")));
    let p = format!("{cache}/sr-client-venv/bin/python");
    assert!(
        std::path::Path::new(&p).exists(),
        "no Python with confluent-kafka for the registry-format tests: run `bash scripts/test.sh`, which installs it (ensure_sr_client), or set SR_PYTHON"
    );
    p
}

/// Rows of `table` at `version`, read by pylance (lance_rows.py), not by
/// graphsink's Rust reader: id → row.
pub(crate) fn pylance_rows_at(
    g: &Graph,
    table: &str,
    version: u64,
) -> BTreeMap<String, serde_json::Value> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/e2e/lance_rows.py");
    let options = serde_json::to_string(g.store().options()).unwrap();
    let out = Command::new(sr_python())
        .arg(script)
        .arg(g.table_uri(table))
        .arg(version.to_string())
        .arg(options)
        .output()
        .expect("run lance_rows.py");
    assert!(
        out.status.success(),
        "lance_rows.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let row: serde_json::Value = serde_json::from_str(l).unwrap();
            (row["id"].as_str().unwrap().to_string(), row)
        })
        .collect()
}
