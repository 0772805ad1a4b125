//! A secured, replicated Apache Kafka cluster on a network the test
//! controls, started from the jars `ensure_kafka` resolved (as
//! [`crate::kafka`] starts one broker): KRaft nodes that are each broker
//! and controller, a quorum of all of them, SASL_SSL with SCRAM-SHA-512,
//! mTLS, deny-by-default ACLs, replication factor 3 and
//! `min.insync.replicas=2` (scripts/kafka/cluster.properties). The bash
//! twin is scripts/lib.sh's `start_kafka_cluster`.
//!
//! ```text
//!  client host "m1" (10.77.12.2)            node 1 (10.77.1.2)
//!  ┌──────────────────────────────┐         ┌──────────────────────┐
//!  │ graphsink ─▶ 10.77.100.1:9092 │         │ CLIENT   9092 SASL_SSL│
//!  │   (lo)   Toxiproxy ──────────┼─router──▶ MTLS     9093 SSL     │
//!  │          10.77.100.2, .3 … ─┼──┐      │ INTERNAL 9094 ◀─▶ nodes│
//!  └──────────────────────────────┘  │      │ CONTROLLER 9095 ◀─▶    │
//!                                    └────▶ nodes 2, 3 (10.77.2.2, …)
//! ```
//!
//! - Node `i` runs in namespace host `i` at `10.77.i.2` ([`crate::netns`]).
//!   Its client listeners (CLIENT, MTLS) advertise `10.77.100.i`, an address
//!   that exists only on each client host's loopback, where that host's own
//!   Toxiproxy forwards it to `10.77.i.2`. So every client connection goes
//!   through its host's proxy (toxics are per client host and node), while
//!   inter-broker (INTERNAL) and quorum (CONTROLLER) traffic goes node to
//!   node directly, over mTLS as `User:broker`.
//! - Partitions are the router's: [`KafkaCluster::partition`] cuts a host off
//!   from one node or all (the proxy's upstream connections then stall, as
//!   a real client's would); delay, jitter, bandwidth, stalls and resets are
//!   the proxy's toxics ([`ClientHost::add_toxic`]).
//! - The harness itself is a client host too (`admin`), a super user over
//!   SASL_SSL, with its own proxy that no test poisons.
//!
//! Everything (JVMs, proxies, namespaces, the directory with data, logs and
//! certificates) goes when the cluster and its client hosts are dropped; a
//! panicking test keeps the directory and says where.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::{ClientConfig, FromClientConfig};
use rdkafka::metadata::Metadata;

use crate::acl::{self, Acl};
use crate::certs::{secret, Certs};
use crate::kafka::{default_libs, installed, missing_message, VERSION};
use crate::netns::{host_addr, Cut, Host, Network};
use crate::tansu::{log_output, spawn_from_long_lived_thread, tie_to_parent};
use crate::toxiproxy::{Stream, Toxic, Toxiproxy};

const PROPERTIES: &str = include_str!("../../scripts/kafka/cluster.properties");
const LOG4J2: &str = include_str!("../../scripts/kafka/log4j2.yaml");

/// Each node's heap, as scripts/kafka/cluster.sh sets it
/// (`GRAPHSINK_KAFKA_CLUSTER_HEAP` overrides): three JVMs share 2 cores
/// and the tests' memory.
const DEFAULT_HEAP: &str = "-Xms128m -Xmx512m";

/// How long a node may take to be listed by the cluster after its JVM
/// starts (three JVMs starting at once on 2 busy cores).
const READY_WITHIN: Duration = Duration::from_secs(180);

/// How long a controlled shutdown may take before it counts as hung.
const STOP_WITHIN: Duration = Duration::from_secs(60);

/// JVM options of Kafka's short-lived tools (format, describe, configs).
const TOOL_JVM: [&str; 3] = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xmx256m"];

/// The super user the harness administers the cluster as.
pub const ADMIN: &str = "admin";

/// The client listeners (both through each client host's Toxiproxy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// CLIENT, port 9092: SASL_SSL with SCRAM-SHA-512.
    SaslSsl,
    /// MTLS, port 9093: SSL with a client certificate.
    Mtls,
}

impl Listener {
    /// Its port on every node and proxy address.
    pub fn port(self) -> u16 {
        match self {
            Listener::SaslSsl => 9092,
            Listener::Mtls => 9093,
        }
    }

    fn proxy_suffix(self) -> &'static str {
        match self {
            Listener::SaslSsl => "client",
            Listener::Mtls => "mtls",
        }
    }
}

/// Node `id` as clients reach it: `10.77.100.id`, on each client host's
/// loopback, where its Toxiproxy listens.
pub fn proxy_addr(id: u32) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, 100, id as u8)
}

/// How to start a cluster.
#[derive(Debug, Clone)]
pub struct Options {
    /// Nodes (each broker and controller, all voters): 1 to 9.
    pub nodes: u32,
    /// SCRAM-SHA-512 users made at format time besides [`ADMIN`], each
    /// with a random password ([`KafkaCluster::password`]) and no ACL.
    pub users: Vec<String>,
    /// Client certificates to make (their CN is their principal).
    pub mtls_clients: Vec<String>,
    /// Settings appended to every node's (scripts/kafka/cluster.properties).
    pub extra: Vec<(String, String)>,
    /// The JVM heap options; [`DEFAULT_HEAP`] or
    /// `GRAPHSINK_KAFKA_CLUSTER_HEAP` when `None`.
    pub heap: Option<String>,
}

impl Options {
    /// One node with the cluster's security (SASL_SSL with SCRAM-SHA-512,
    /// mTLS, the standard authorizer, deny by default) and everything
    /// replicated once: the secured broker of a test about permissions,
    /// not replication (tests/e2e/security.rs), at a third of the cost.
    pub fn single_node() -> Options {
        let once = [
            "default.replication.factor",
            "min.insync.replicas",
            "offsets.topic.replication.factor",
            "transaction.state.log.replication.factor",
            "transaction.state.log.min.isr",
            "share.coordinator.state.topic.replication.factor",
            "share.coordinator.state.topic.min.isr",
        ];
        Options {
            nodes: 1,
            extra: once.iter().map(|k| (k.to_string(), "1".into())).collect(),
            ..Options::default()
        }
    }
}

impl Default for Options {
    fn default() -> Options {
        Options {
            nodes: 3,
            users: vec!["graphsink".into(), "producer".into()],
            mtls_clients: vec!["graphsink-mtls".into()],
            extra: Vec::new(),
            heap: None,
        }
    }
}

/// What every client host needs to make a client config.
struct Secrets {
    certs: Certs,
    passwords: std::sync::Mutex<BTreeMap<String, String>>,
    nodes: Vec<u32>,
}

struct Node {
    id: u32,
    host: Host,
    dir: PathBuf,
    child: Option<Child>,
}

impl Node {
    fn properties(&self) -> PathBuf {
        self.dir.join("server.properties")
    }

    fn log(&self) -> PathBuf {
        self.dir.join("kafka.log")
    }

    fn running(&mut self) -> bool {
        matches!(self.child.as_mut().map(Child::try_wait), Some(Ok(None)))
    }
}

/// A client host: a namespace of its own whose Toxiproxy stands before
/// every node, on both client listeners. Clients run in it with
/// [`Host::command`] (a process) or [`ClientHost::create`] (an rdkafka
/// client in this process). Dropping it stops the proxy, kills what still
/// runs in the namespace and deletes it.
pub struct ClientHost {
    proxy: Toxiproxy,
    host: Host,
    secrets: Arc<Secrets>,
}

impl ClientHost {
    /// The host (its namespace, address, `command()`, `enter()`).
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// Its Toxiproxy, for what [`ClientHost::add_toxic`] does not cover.
    pub fn toxiproxy(&self) -> &Toxiproxy {
        &self.proxy
    }

    /// `bootstrap.servers` for `listener`: every node's proxy address.
    pub fn bootstrap(&self, listener: Listener) -> String {
        let addrs: Vec<String> = self
            .secrets
            .nodes
            .iter()
            .map(|id| format!("{}:{}", proxy_addr(*id), listener.port()))
            .collect();
        addrs.join(",")
    }

    /// The name of node `id`'s proxy for `listener` (`node1-client`,
    /// `node1-mtls`).
    pub fn proxy_name(id: u32, listener: Listener) -> String {
        format!("node{id}-{}", listener.proxy_suffix())
    }

    /// librdkafka properties for `user` over SASL_SSL (SCRAM-SHA-512),
    /// trusting the test CA: what a graphsink `[kafka]` section holds.
    pub fn sasl_properties(&self, user: &str) -> Result<Vec<(String, String)>, String> {
        let password = self
            .secrets
            .passwords
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(user)
            .cloned()
            .ok_or_else(|| format!("no SCRAM user {user} in this cluster"))?;
        Ok(vec![
            (
                "bootstrap.servers".into(),
                self.bootstrap(Listener::SaslSsl),
            ),
            ("security.protocol".into(), "SASL_SSL".into()),
            ("sasl.mechanisms".into(), "SCRAM-SHA-512".into()),
            ("sasl.username".into(), user.into()),
            ("sasl.password".into(), password),
            (
                "ssl.ca.location".into(),
                path_text(&self.secrets.certs.ca()),
            ),
        ])
    }

    /// librdkafka properties for the client certificate `cn` over mTLS.
    pub fn mtls_properties(&self, cn: &str) -> Vec<(String, String)> {
        let (pem, key) = self.secrets.certs.client(cn);
        vec![
            ("bootstrap.servers".into(), self.bootstrap(Listener::Mtls)),
            ("security.protocol".into(), "SSL".into()),
            (
                "ssl.ca.location".into(),
                path_text(&self.secrets.certs.ca()),
            ),
            ("ssl.certificate.location".into(), path_text(&pem)),
            ("ssl.key.location".into(), path_text(&key)),
        ]
    }

    /// An rdkafka `ClientConfig` of [`ClientHost::sasl_properties`].
    pub fn sasl_config(&self, user: &str) -> Result<ClientConfig, String> {
        let mut c = ClientConfig::new();
        for (k, v) in self.sasl_properties(user)? {
            c.set(k, v);
        }
        Ok(c)
    }

    /// Creates an rdkafka client from this host's namespace: all its
    /// connections (and its threads' later ones) start here.
    pub fn create<T: FromClientConfig + Send>(&self, config: &ClientConfig) -> Result<T, String> {
        self.host
            .enter(|| config.create::<T>().map_err(|e| e.to_string()))?
    }

    fn proxies_of(&self, node: Option<u32>) -> Vec<String> {
        self.secrets
            .nodes
            .iter()
            .filter(|id| node.is_none_or(|n| n == **id))
            .flat_map(|id| {
                [Listener::SaslSsl, Listener::Mtls].map(|l| ClientHost::proxy_name(*id, l))
            })
            .collect()
    }

    /// Adds `toxic` as `name` to this host's proxies of node `node` (both
    /// listeners), or of every node for `None`, on `stream`, for a share
    /// `toxicity` (0..=1) of connections.
    pub fn add_toxic(
        &self,
        node: Option<u32>,
        name: &str,
        toxic: &Toxic,
        stream: Stream,
        toxicity: f32,
    ) -> Result<(), String> {
        for p in self.proxies_of(node) {
            self.proxy.add_toxic(&p, name, toxic, stream, toxicity)?;
        }
        Ok(())
    }

    /// Removes the toxic `name` from the proxies [`ClientHost::add_toxic`]
    /// put it on.
    pub fn remove_toxic(&self, node: Option<u32>, name: &str) -> Result<(), String> {
        for p in self.proxies_of(node) {
            self.proxy.remove_toxic(&p, name)?;
        }
        Ok(())
    }

    /// Removes every toxic of this host.
    pub fn clear_toxics(&self) -> Result<(), String> {
        self.proxy.reset()
    }
}

fn path_text(p: &Path) -> String {
    p.display().to_string()
}

/// A running cluster. See the module's text for its layout.
pub struct KafkaCluster {
    /// Dropped first: its destroy talks to the nodes.
    admin: Option<AdminClient<DefaultClientContext>>,
    admin_host: Option<ClientHost>,
    nodes: Vec<Node>,
    net: Network,
    secrets: Arc<Secrets>,
    dir: PathBuf,
    heap: String,
}

impl KafkaCluster {
    /// `n` nodes with the default [`Options`] (users `graphsink` and
    /// `producer`, the client certificate `graphsink-mtls`), ready when
    /// every node is listed in the metadata the harness reads.
    pub fn start(n: u32) -> Result<KafkaCluster, String> {
        KafkaCluster::start_with(&Options {
            nodes: n,
            ..Options::default()
        })
    }

    /// A cluster as `opts` says.
    pub fn start_with(opts: &Options) -> Result<KafkaCluster, String> {
        if !installed() {
            return Err(missing_message());
        }
        if !default_libs()
            .join(format!("kafka-tools-{VERSION}.jar"))
            .exists()
        {
            return Err(format!(
                "kafka-tools-{VERSION}.jar is missing from {}: run `source scripts/lib.sh && \
                 ensure_kafka` (it resolves scripts/kafka/pom.xml again when the pom changed)",
                default_libs().display()
            ));
        }
        if !(1..=9).contains(&opts.nodes) {
            return Err(format!("a cluster has 1 to 9 nodes, not {}", opts.nodes));
        }
        crate::toxiproxy::ensure()?;
        let started = Instant::now();
        let net = Network::new()?;
        let dir = std::env::temp_dir().join(format!(
            "graphsink-cluster-{}-{}",
            std::process::id(),
            &secret()?[..8]
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        std::fs::write(dir.join("log4j2.yaml"), LOG4J2)
            .map_err(|e| format!("write {}: {e}", dir.display()))?;
        let ids: Vec<u32> = (1..=opts.nodes).collect();
        let brokers: Vec<(String, Vec<Ipv4Addr>)> = ids
            .iter()
            .map(|id| {
                (
                    format!("node{id}"),
                    vec![host_addr(*id as u8), proxy_addr(*id)],
                )
            })
            .collect();
        let mtls: Vec<&str> = opts.mtls_clients.iter().map(String::as_str).collect();
        let certs = Certs::generate(&dir.join("certs"), &brokers, &mtls)?;
        let mut passwords = BTreeMap::new();
        for user in std::iter::once(ADMIN).chain(opts.users.iter().map(String::as_str)) {
            passwords.insert(user.to_owned(), secret()?);
        }
        let secrets = Arc::new(Secrets {
            certs,
            passwords: std::sync::Mutex::new(passwords),
            nodes: ids.clone(),
        });
        let heap = opts
            .heap
            .clone()
            .or_else(|| std::env::var("GRAPHSINK_KAFKA_CLUSTER_HEAP").ok())
            .unwrap_or_else(|| DEFAULT_HEAP.into());
        let mut cluster = KafkaCluster {
            admin: None,
            admin_host: None,
            nodes: Vec::new(),
            net,
            secrets,
            dir,
            heap,
        };
        for id in &ids {
            let host = cluster.net.add_host_at(&format!("node{id}"), *id as u8)?;
            let dir = cluster.dir.join(format!("node{id}"));
            std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
            cluster.nodes.push(Node {
                id: *id,
                host,
                dir,
                child: None,
            });
        }
        cluster.write_properties(&opts.extra)?;
        cluster.format()?;
        cluster.write_admin_config()?;
        for i in 0..cluster.nodes.len() {
            cluster.launch(i)?;
        }
        let admin_host = cluster.client(ADMIN)?;
        let mut admin_config = admin_host.sasl_config(ADMIN)?;
        admin_config.set("log_level", "3");
        cluster.admin = Some(admin_host.create(&admin_config)?);
        cluster.admin_host = Some(admin_host);
        for id in ids {
            cluster.wait_listed(id, READY_WITHIN)?;
        }
        eprintln!(
            "graphsink-testkit: Kafka cluster of {} nodes ready in {} ms ({})",
            opts.nodes,
            started.elapsed().as_millis(),
            cluster.dir.display()
        );
        Ok(cluster)
    }

    fn write_properties(&self, extra: &[(String, String)]) -> Result<(), String> {
        let controllers: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("{}:9095", n.host.addr()))
            .collect();
        for n in &self.nodes {
            let certs = &self.secrets.certs;
            let mut props = PROPERTIES
                .replace("@NODE_ID@", &n.id.to_string())
                .replace("@ADDR@", &n.host.addr().to_string())
                .replace("@PROXY_ADDR@", &proxy_addr(n.id).to_string())
                .replace("@CONTROLLERS@", &controllers.join(","))
                .replace("@LOG_DIR@", &path_text(&n.dir.join("data")))
                .replace(
                    "@KEYSTORE@",
                    &path_text(&certs.keystore(&format!("node{}", n.id))),
                )
                .replace("@TRUSTSTORE@", &path_text(&certs.truststore()))
                .replace("@STORE_PASSWORD@", &certs.store_password);
            for (k, v) in extra {
                props.push_str(&format!("{k}={v}\n"));
            }
            std::fs::write(n.properties(), props)
                .map_err(|e| format!("write {}: {e}", n.properties().display()))?;
        }
        Ok(())
    }

    /// `java -cp libs/* …` with the test log settings, for a short-lived
    /// tool: C1 only and the serial collector start it faster on 2 busy
    /// cores, and it runs too briefly for the second JIT tier to pay.
    fn java(&self) -> Command {
        let mut c = Command::new("java");
        c.args(TOOL_JVM);
        self.java_args(&mut c);
        c
    }

    fn java_args(&self, c: &mut Command) {
        c.arg(format!(
            "-Dlog4j2.configurationFile={}",
            self.dir.join("log4j2.yaml").display()
        ))
        .args(["-cp", &format!("{}/*", default_libs().display())]);
    }

    /// Formats every node's storage at once: the same cluster id, the same
    /// three voters (`--initial-controllers`, each with its directory id),
    /// and the SCRAM users in the bootstrap metadata (KIP-900).
    fn format(&self) -> Result<(), String> {
        let cluster_id = crate::kafka::cluster_id();
        let voters: Vec<String> = self
            .nodes
            .iter()
            .map(|n| {
                format!(
                    "{}@{}:9095:{}",
                    n.id,
                    n.host.addr(),
                    crate::kafka::cluster_id()
                )
            })
            .collect();
        let passwords = self
            .secrets
            .passwords
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut running = Vec::new();
        for n in &self.nodes {
            let (stdout, stderr) = log_output(Some(&n.log()))?;
            let mut c = self.java();
            c.args([
                "kafka.tools.StorageTool",
                "format",
                "--cluster-id",
                &cluster_id,
            ])
            .args(["--initial-controllers", &voters.join(",")]);
            for (user, pw) in &passwords {
                c.arg("--add-scram")
                    .arg(format!("SCRAM-SHA-512=[name={user},password={pw}]"));
            }
            c.arg("--config")
                .arg(n.properties())
                .stdin(Stdio::null())
                .stdout(stdout)
                .stderr(stderr);
            let child = c
                .spawn()
                .map_err(|e| format!("run java (Java 17 is needed for Kafka {VERSION}): {e}"))?;
            running.push((n.id, n.log(), child));
        }
        for (id, log, mut child) in running {
            let status = child.wait().map_err(|e| format!("wait for format: {e}"))?;
            if !status.success() {
                return Err(format!(
                    "kafka-storage format of node {id} failed ({status}; log: {})",
                    log.display()
                ));
            }
        }
        Ok(())
    }

    /// A Java client config for Kafka's tools: SASL_SSL as [`ADMIN`].
    fn write_admin_config(&self) -> Result<(), String> {
        let pw = self.password(ADMIN)?;
        let text = format!(
            "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n\
             sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \
             username=\"{ADMIN}\" password=\"{pw}\";\n\
             ssl.truststore.type=PEM\nssl.truststore.location={}\n",
            path_text(&self.secrets.certs.ca())
        );
        std::fs::write(self.admin_config(), text)
            .map_err(|e| format!("write {}: {e}", self.admin_config().display()))
    }

    fn admin_config(&self) -> PathBuf {
        self.dir.join("admin.properties")
    }

    /// Starts node index `i`'s JVM in its namespace, on its kept data.
    fn launch(&mut self, i: usize) -> Result<(), String> {
        let mut cmd = self.nodes[i].host.command("java");
        cmd.args(self.heap.split_whitespace()).args([
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
        ]);
        self.java_args(&mut cmd);
        let node = &mut self.nodes[i];
        let (stdout, stderr) = log_output(Some(&node.log()))?;
        cmd.arg("kafka.Kafka")
            .arg(node.properties())
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        tie_to_parent(&mut cmd);
        let child = spawn_from_long_lived_thread(cmd)
            .map_err(|e| format!("start node {}: {e}", node.id))?;
        node.child = Some(child);
        Ok(())
    }

    fn node_mut(&mut self, id: u32) -> Result<&mut Node, String> {
        self.nodes
            .iter_mut()
            .find(|n| n.id == id)
            .ok_or_else(|| format!("no node {id}"))
    }

    fn node(&self, id: u32) -> Result<&Node, String> {
        self.nodes
            .iter()
            .find(|n| n.id == id)
            .ok_or_else(|| format!("no node {id}"))
    }

    /// The harness's admin client (SASL_SSL as the super user [`ADMIN`],
    /// from the `admin` host).
    pub fn admin(&self) -> &AdminClient<DefaultClientContext> {
        self.admin
            .as_ref()
            .expect("the admin client lives as long as the cluster")
    }

    /// The harness's own client host.
    pub fn admin_host(&self) -> &ClientHost {
        self.admin_host
            .as_ref()
            .expect("the admin host lives as long as the cluster")
    }

    /// The network (for cuts between any hosts, and more hosts).
    pub fn network(&self) -> &Network {
        &self.net
    }

    /// The node ids, 1..=n.
    pub fn node_ids(&self) -> Vec<u32> {
        self.secrets.nodes.clone()
    }

    /// Node `id`'s host.
    pub fn node_host(&self, id: u32) -> Result<&Host, String> {
        self.node(id).map(|n| &n.host)
    }

    /// Node `id`'s log (its JVM's output).
    pub fn node_log(&self, id: u32) -> Result<PathBuf, String> {
        self.node(id).map(Node::log)
    }

    /// Node `id`'s JVM, while it runs.
    pub fn pid(&mut self, id: u32) -> Result<Option<u32>, String> {
        let n = self.node_mut(id)?;
        Ok(if n.running() {
            n.child.as_ref().map(Child::id)
        } else {
            None
        })
    }

    /// The directory of the cluster's data, logs and certificates.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CA certificate every client trusts.
    pub fn ca(&self) -> PathBuf {
        self.secrets.certs.ca()
    }

    /// The certificates (for more client certificates:
    /// [`Certs::add_client`]).
    pub fn certs(&self) -> &Certs {
        &self.secrets.certs
    }

    /// SCRAM user `user`'s password.
    pub fn password(&self, user: &str) -> Result<String, String> {
        self.secrets
            .passwords
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(user)
            .cloned()
            .ok_or_else(|| format!("no SCRAM user {user} in this cluster"))
    }

    /// A new client host `label`: a namespace of its own with a Toxiproxy
    /// before every node.
    pub fn client(&self, label: &str) -> Result<ClientHost, String> {
        let host = self.net.add_host(label)?;
        for id in &self.secrets.nodes {
            host.add_local_address(proxy_addr(*id))?;
        }
        let log = self.dir.join(format!("toxiproxy-{label}.log"));
        let proxy = Toxiproxy::start(&host, Some(&log))?;
        for id in &self.secrets.nodes {
            for l in [Listener::SaslSsl, Listener::Mtls] {
                proxy.create_proxy(
                    &ClientHost::proxy_name(*id, l),
                    SocketAddr::from((proxy_addr(*id), l.port())),
                    SocketAddr::from((host_addr(*id as u8), l.port())),
                )?;
            }
        }
        Ok(ClientHost {
            proxy,
            host,
            secrets: self.secrets.clone(),
        })
    }

    /// Cuts `host` off from node `node`, or from every node for `None`
    /// (the router drops both directions), until [`KafkaCluster::heal`].
    pub fn partition(&self, host: &Host, node: Option<u32>, how: Cut) -> Result<(), String> {
        for n in self
            .nodes
            .iter()
            .filter(|n| node.is_none_or(|id| id == n.id))
        {
            self.net.cut(host, &n.host, how)?;
        }
        Ok(())
    }

    /// Undoes every cut that names `host`.
    pub fn heal(&self, host: &Host) -> Result<(), String> {
        self.net.rejoin(host)
    }

    /// A controlled shutdown of node `id` (SIGTERM), waited for: it hands
    /// its leaderships over first, as a rolling restart does. A node that
    /// has not exited within 60 s is killed and this is an error.
    pub fn stop_node(&mut self, id: u32) -> Result<(), String> {
        let n = self.node_mut(id)?;
        let Some(mut child) = n.child.take() else {
            return Ok(());
        };
        // SAFETY: kill(2) on our own child's pid; no memory involved.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + STOP_WITHIN;
        loop {
            match child.try_wait() {
                Ok(Some(_)) => return Ok(()),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100))
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "node {id} did not finish its controlled shutdown in {} s; killed it \
                         (log: {})",
                        STOP_WITHIN.as_secs(),
                        n.log().display()
                    ));
                }
            }
        }
    }

    /// kill -9 of node `id`, reaped.
    pub fn kill_node(&mut self, id: u32) -> Result<(), String> {
        let n = self.node_mut(id)?;
        if let Some(mut c) = n.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        Ok(())
    }

    /// Starts node `id` again on its kept data and waits until the
    /// cluster lists it (registered and unfenced). See
    /// [`KafkaCluster::wait_in_sync`] for its replicas catching up.
    pub fn start_node(&mut self, id: u32) -> Result<(), String> {
        let i = self
            .nodes
            .iter()
            .position(|n| n.id == id)
            .ok_or_else(|| format!("no node {id}"))?;
        if self.nodes[i].running() {
            return Err(format!("node {id} is running"));
        }
        self.launch(i)?;
        self.wait_listed(id, READY_WITHIN)
    }

    fn signal(&mut self, id: u32, signal: libc::c_int) -> Result<(), String> {
        let pid = self
            .pid(id)?
            .ok_or_else(|| format!("node {id} is not running"))?;
        // SAFETY: kill(2) on our own running child; no memory involved.
        if unsafe { libc::kill(pid as libc::pid_t, signal) } != 0 {
            return Err(format!(
                "signal node {id}: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(())
    }

    /// SIGSTOP of node `id`: a frozen VM (its sessions expire, its
    /// connections stay open).
    pub fn freeze_node(&mut self, id: u32) -> Result<(), String> {
        self.signal(id, libc::SIGSTOP)
    }

    /// SIGCONT after [`KafkaCluster::freeze_node`].
    pub fn thaw_node(&mut self, id: u32) -> Result<(), String> {
        self.signal(id, libc::SIGCONT)
    }

    /// The cluster's metadata as the admin reads it (`topic`: one topic;
    /// `None`: all, internal ones too).
    pub fn metadata(&self, topic: Option<&str>) -> Result<Metadata, String> {
        self.admin()
            .inner()
            .fetch_metadata(topic, Duration::from_secs(10))
            .map_err(|e| format!("metadata: {e}"))
    }

    /// Waits until node `id` is among the brokers the metadata lists.
    fn wait_listed(&mut self, id: u32, within: Duration) -> Result<(), String> {
        let deadline = Instant::now() + within;
        loop {
            let log = self.node(id)?.log();
            if !self.node_mut(id)?.running() {
                return Err(format!(
                    "node {id} exited during startup (log: {})",
                    log.display()
                ));
            }
            let last = match self.metadata(None) {
                Ok(m) if m.brokers().iter().any(|b| b.id() == id as i32) => return Ok(()),
                Ok(m) => format!(
                    "brokers listed: {:?}",
                    m.brokers().iter().map(|b| b.id()).collect::<Vec<_>>()
                ),
                Err(e) => e,
            };
            if Instant::now() > deadline {
                return Err(format!(
                    "node {id} not listed within {} s ({last}; log: {})",
                    within.as_secs(),
                    log.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Waits until every partition of every topic (internal ones too) has
    /// all its replicas in sync: the point a rolling restart waits for
    /// before the next node.
    pub fn wait_in_sync(&self, within: Duration) -> Result<(), String> {
        let deadline = Instant::now() + within;
        loop {
            let lagging: Vec<String> = match self.metadata(None) {
                Ok(m) => m
                    .topics()
                    .iter()
                    .flat_map(|t| {
                        t.partitions().iter().filter_map(move |p| {
                            let mut isr = p.isr().to_vec();
                            let mut replicas = p.replicas().to_vec();
                            isr.sort();
                            replicas.sort();
                            (isr != replicas || p.leader() < 0).then(|| {
                                format!("{}-{} isr {:?} of {:?}", t.name(), p.id(), isr, replicas)
                            })
                        })
                    })
                    .collect(),
                Err(e) => vec![e],
            };
            if lagging.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "replicas not in sync within {} s: {}",
                    within.as_secs(),
                    lagging.join("; ")
                ));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The leader of `topic`'s `partition`, or `None` while it has none.
    pub fn leader(&self, topic: &str, partition: i32) -> Result<Option<i32>, String> {
        let m = self.metadata(Some(topic))?;
        let t = m
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .ok_or_else(|| format!("no topic {topic}"))?;
        if let Some(e) = t.error() {
            return Err(format!("topic {topic}: {e:?}"));
        }
        let p = t
            .partitions()
            .iter()
            .find(|p| p.id() == partition)
            .ok_or_else(|| format!("no partition {topic}-{partition}"))?;
        Ok((p.leader() >= 0).then_some(p.leader()))
    }

    /// The coordinator of group `group`: the leader of its partition of
    /// `__consumer_offsets`, as Kafka finds it (`abs(hashCode) %
    /// partitions`, both protocols). `None` while that has no leader; an
    /// error before the topic exists (the first group makes it).
    pub fn group_coordinator(&self, group: &str) -> Result<Option<i32>, String> {
        self.coordinator("__consumer_offsets", group)
    }

    /// The transaction coordinator of `transactional_id`: the leader of
    /// its partition of `__transaction_state`, as for a group.
    pub fn transaction_coordinator(&self, transactional_id: &str) -> Result<Option<i32>, String> {
        self.coordinator("__transaction_state", transactional_id)
    }

    fn coordinator(&self, topic: &str, key: &str) -> Result<Option<i32>, String> {
        let m = self.metadata(Some(topic))?;
        let partitions = m
            .topics()
            .iter()
            .find(|t| t.name() == topic && t.error().is_none())
            .map_or(0, |t| t.partitions().len());
        if partitions == 0 {
            return Err(format!("{topic} does not exist yet"));
        }
        self.leader(topic, partition_for(key, partitions as i32))
    }

    /// The active controller (the quorum's leader), from Kafka's own
    /// `kafka-metadata-quorum describe --status` (a JVM start, ~3 s).
    pub fn active_controller(&self) -> Result<u32, String> {
        let out = self.kafka_tool(
            "org.apache.kafka.tools.MetadataQuorumCommand",
            &["describe", "--status"],
        )?;
        out.lines()
            .find_map(|l| l.strip_prefix("LeaderId:"))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| format!("no LeaderId in: {out}"))
    }

    /// Runs one of Kafka's tools (`org.apache.kafka.tools.AclCommand`, …)
    /// from the admin host as [`ADMIN`] (`--bootstrap-server`,
    /// `--command-config` are added) and returns its standard output.
    pub fn kafka_tool(&self, class: &str, args: &[&str]) -> Result<String, String> {
        let mut c = self.admin_host().host().command("java");
        c.args(TOOL_JVM);
        self.java_args(&mut c);
        c.arg(class)
            .args([
                "--bootstrap-server",
                &self.admin_host().bootstrap(Listener::SaslSsl),
            ])
            .arg("--command-config")
            .arg(self.admin_config())
            .args(args)
            .stdin(Stdio::null());
        let out = c.output().map_err(|e| format!("run {class}: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "{class} {} failed ({}): {}{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// A SCRAM-SHA-512 user made after the start (Kafka's ConfigCommand,
    /// a JVM start); returns its random password.
    pub fn add_scram_user(&self, user: &str) -> Result<String, String> {
        let pw = secret()?;
        self.kafka_tool(
            "org.apache.kafka.tools.ConfigCommand",
            &[
                "--alter",
                "--entity-type",
                "users",
                "--entity-name",
                user,
                "--add-config",
                &format!("SCRAM-SHA-512=[password={pw}]"),
            ],
        )?;
        self.secrets
            .passwords
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(user.to_owned(), pw.clone());
        Ok(pw)
    }

    /// Creates `topic` as the admin, replicated on `replication` nodes,
    /// and waits until every partition has a leader.
    pub fn create_topic(
        &self,
        topic: &str,
        partitions: i32,
        replication: i32,
        configs: &[(&str, &str)],
    ) -> Result<(), String> {
        let mut t = NewTopic::new(topic, partitions, TopicReplication::Fixed(replication));
        for (k, v) in configs {
            t = t.set(k, v);
        }
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        for r in block_on(self.admin().create_topics([&t], &opts))
            .map_err(|e| format!("create topic {topic}: {e}"))?
        {
            r.map_err(|(t, e)| format!("create topic {t}: {e}"))?;
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let led = (0..partitions)
                .map(|p| self.leader(topic, p).ok().flatten())
                .all(|l| l.is_some());
            if led {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "topic {topic} has partitions without a leader after 30 s"
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Grants `acls` (one CreateAcls request, as the admin) and waits until
    /// every broker the metadata lists has them: then they are in effect
    /// wherever a client connects.
    pub fn grant(&self, acls: &[Acl]) -> Result<(), String> {
        acl::create(self.admin(), acls, Duration::from_secs(30))?;
        self.wait_acls(|listed| acls.iter().all(|a| listed.contains(a)), "granted")
    }

    /// Revokes `acls` (one DeleteAcls request), waits until no listed
    /// broker has them, and returns those deleted.
    pub fn revoke(&self, acls: &[Acl]) -> Result<Vec<Acl>, String> {
        let deleted = acl::delete(self.admin(), acls, Duration::from_secs(30))?;
        self.wait_acls(|listed| acls.iter().all(|a| !listed.contains(a)), "revoked")?;
        Ok(deleted)
    }

    /// Every ACL of the cluster, sorted (as one broker knows them).
    pub fn acls(&self) -> Result<Vec<Acl>, String> {
        acl::list(self.admin(), None, Duration::from_secs(30))
    }

    fn wait_acls(&self, done: impl Fn(&[Acl]) -> bool, what: &str) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let brokers: Vec<i32> = self
            .metadata(None)?
            .brokers()
            .iter()
            .map(|b| b.id())
            .collect();
        for id in brokers {
            loop {
                match acl::list(self.admin(), Some(id), Duration::from_secs(10)) {
                    Ok(listed) if done(&listed) => break,
                    Ok(_) | Err(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    Ok(listed) => {
                        return Err(format!(
                            "ACLs not {what} on broker {id} in 30 s: {listed:?}"
                        ))
                    }
                    Err(e) => return Err(format!("list the ACLs of broker {id}: {e}")),
                }
            }
        }
        Ok(())
    }

    /// Resident memory of each running node's JVM, in KiB.
    pub fn rss_kib(&mut self) -> Vec<(u32, u64)> {
        let ids = self.node_ids();
        ids.into_iter()
            .filter_map(|id| {
                let pid = self.pid(id).ok().flatten()?;
                let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
                let kib = status
                    .lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()?;
                Some((id, kib))
            })
            .collect()
    }
}

/// Runs a future to completion on this thread. The admin client's futures
/// are answered by its own polling thread, so they need no runtime; this
/// also works from inside a test's tokio runtime, where `block_on` of
/// tokio's own would panic.
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark()
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

/// Java's `String.hashCode`, over UTF-16 units with wrapping arithmetic.
fn java_hash(s: &str) -> i32 {
    s.encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)))
}

/// Kafka's `Utils.abs(key.hashCode()) % partitions` (Utils.abs maps
/// `MIN_VALUE` to 0): the partition of `__consumer_offsets` or
/// `__transaction_state` that holds a group or a transactional id.
fn partition_for(key: &str, partitions: i32) -> i32 {
    let h = java_hash(key);
    let abs = if h == i32::MIN { 0 } else { h.abs() };
    abs % partitions
}

impl Drop for KafkaCluster {
    fn drop(&mut self) {
        // The admin client first, while the nodes still answer its close.
        self.admin.take();
        for n in &mut self.nodes {
            if let Some(mut c) = n.child.take() {
                // A frozen JVM takes SIGKILL too; nothing to thaw.
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        self.admin_host.take();
        if std::thread::panicking() {
            eprintln!(
                "graphsink-testkit: the failed test's cluster directory is kept: {}",
                self.dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acl::{Operation, ResourceType};
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
    use rdkafka::producer::{FutureProducer, FutureRecord};
    use rdkafka::Message;

    fn until<T>(what: &str, within: Duration, mut f: impl FnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + within;
        loop {
            if let Some(t) = f() {
                return t;
            }
            assert!(
                Instant::now() < deadline,
                "{what} within {} s",
                within.as_secs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The cluster does what the tests built on it rely on: a three-voter
    /// quorum, denial by default over SASL_SSL, ACLs that take effect,
    /// mTLS clients, Kafka's own coordinator, a new leader after a kill -9,
    /// a controlled shutdown and restart on kept data, partitions and
    /// heals, and nothing left behind.
    #[test]
    fn a_secured_cluster_denies_elects_and_partitions() {
        let t0 = Instant::now();
        let mut c = KafkaCluster::start(3).expect("cluster");
        eprintln!(
            "started in {} ms, RSS KiB {:?}",
            t0.elapsed().as_millis(),
            c.rss_kib()
        );
        let controller = c.active_controller().expect("describe quorum");
        assert!((1..=3).contains(&controller), "{controller}");
        c.create_topic("t", 3, 3, &[]).expect("topic");
        for p in c.metadata(Some("t")).unwrap().topics()[0].partitions() {
            assert_eq!(p.replicas().len(), 3, "replication factor 3");
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let host = c.client("p").expect("client host");
        let produce = |n: usize| -> Result<(), String> {
            let mut cfg = host.sasl_config("producer")?;
            cfg.set("message.timeout.ms", "5000");
            let p: FutureProducer = host.create(&cfg)?;
            rt.block_on(async {
                for i in 0..n {
                    let v = format!("v{i}");
                    p.send(
                        FutureRecord::to("t").key(&v).payload(&v),
                        Duration::from_secs(10),
                    )
                    .await
                    .map_err(|(e, _)| e.to_string())?;
                }
                Ok(())
            })
        };
        let denied = produce(1).expect_err("no ACL, no produce");
        assert!(
            denied.contains("authoriz") || denied.contains("Authoriz"),
            "{denied}"
        );
        let write = [Operation::Write, Operation::Describe]
            .map(|op| Acl::allow("producer", op, ResourceType::Topic, "t"));
        c.grant(&write).expect("grant");
        until("the grant takes effect", Duration::from_secs(20), || {
            produce(10).ok()
        });

        // An mTLS client (User:graphsink-mtls) reads them in a group.
        let read = vec![
            Acl::allow("graphsink-mtls", Operation::Read, ResourceType::Topic, "t"),
            Acl::allow(
                "graphsink-mtls",
                Operation::Describe,
                ResourceType::Topic,
                "t",
            ),
            Acl::allow("graphsink-mtls", Operation::Read, ResourceType::Group, "g"),
        ];
        c.grant(&read).expect("grant");
        let mut cfg = ClientConfig::new();
        for (k, v) in host.mtls_properties("graphsink-mtls") {
            cfg.set(k, v);
        }
        cfg.set("group.id", "g")
            .set("auto.offset.reset", "earliest");
        let consumer: BaseConsumer = host.create(&cfg).expect("mTLS consumer");
        consumer.subscribe(&["t"]).unwrap();
        let mut got = 0;
        until("10 records over mTLS", Duration::from_secs(60), || {
            if let Some(Ok(m)) = consumer.poll(Duration::from_millis(500)) {
                assert!(m.payload().is_some());
                got += 1;
            }
            (got >= 10).then_some(())
        });
        consumer
            .commit_consumer_state(CommitMode::Sync)
            .expect("commit");
        let coordinator = c.group_coordinator("g").unwrap().expect("a coordinator");
        let described = c
            .kafka_tool(
                "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
                &["--describe", "--group", "g", "--state"],
            )
            .expect("describe group");
        assert!(
            described.contains(&format!("({coordinator})")),
            "{coordinator}: {described}"
        );
        drop(consumer);
        assert_eq!(c.revoke(&read).expect("revoke").len(), 3);

        // A transactional id's coordinator, as Kafka's own tool names it.
        c.grant(&[Acl::allow(
            "producer",
            Operation::Write,
            ResourceType::TransactionalId,
            "tx",
        )])
        .expect("grant");
        let mut cfg = host.sasl_config("producer").unwrap();
        cfg.set("transactional.id", "tx");
        let txp: FutureProducer = host.create(&cfg).expect("transactional producer");
        rdkafka::producer::Producer::init_transactions(&txp, Duration::from_secs(60))
            .expect("init transactions");
        let coordinator = c
            .transaction_coordinator("tx")
            .unwrap()
            .expect("a coordinator");
        let described = c
            .kafka_tool(
                "org.apache.kafka.tools.TransactionsCommand",
                &["describe", "--transactional-id", "tx"],
            )
            .expect("describe transaction");
        let named = described
            .lines()
            .nth(1)
            .and_then(|l| l.split_whitespace().next())
            .and_then(|id| id.parse::<i32>().ok());
        assert_eq!(named, Some(coordinator), "{described}");
        drop(txp);

        // kill -9 of a leader: another replica leads; back, it catches up.
        let leader = c.leader("t", 0).unwrap().expect("a leader") as u32;
        c.kill_node(leader).unwrap();
        until("a new leader", Duration::from_secs(60), || {
            c.leader("t", 0)
                .ok()
                .flatten()
                .filter(|l| *l as u32 != leader)
        });
        c.start_node(leader).expect("restart on kept data");
        c.wait_in_sync(Duration::from_secs(120)).expect("in sync");

        // A controlled shutdown and start of another node; a freeze.
        let other = 1 + leader % 3;
        c.stop_node(other).expect("controlled shutdown");
        c.start_node(other).expect("start");
        c.freeze_node(other).unwrap();
        c.thaw_node(other).unwrap();

        // A client host cut from every node reaches none; healed, it does.
        let probe = || -> Result<usize, String> {
            let mut cfg = host.sasl_config("producer")?;
            cfg.set("log_level", "3");
            let p: BaseConsumer = host.create(&cfg)?;
            p.fetch_metadata(Some("t"), Duration::from_secs(3))
                .map(|m| m.brokers().len())
                .map_err(|e| e.to_string())
        };
        c.partition(host.host(), None, Cut::Unreachable).unwrap();
        probe().expect_err("cut off from every node");
        c.heal(host.host()).unwrap();
        assert_eq!(probe().expect("healed"), 3);

        let prefix = c.network().router().trim_end_matches("-hub").to_owned();
        drop(host);
        drop(c);
        let left = crate::netns::ip(&["netns", "list"]).unwrap();
        assert!(!left.contains(&prefix), "every namespace is gone: {left}");
    }

    /// Java's own values (`"graphsink".hashCode()` and friends).
    #[test]
    fn partitions_follow_javas_hash() {
        assert_eq!(java_hash(""), 0);
        assert_eq!(java_hash("a"), 97);
        assert_eq!(java_hash("hello"), 99162322);
        assert_eq!(java_hash("polygenelubricants"), i32::MIN);
        assert_eq!(partition_for("polygenelubricants", 8), 0);
        assert_eq!(java_hash("graphsink"), -1_172_748_063);
        assert_eq!(partition_for("graphsink", 8), 1_172_748_063 % 8);
    }
}
