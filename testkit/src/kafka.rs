//! A private Apache Kafka broker (KRaft, one node that is its own controller
//! quorum) on free loopback ports, started the way scripts/lib.sh's
//! `start_kafka` starts it: the jars `ensure_kafka` resolved from Maven
//! Central, `kafka.tools.StorageTool format --standalone`, then `kafka.Kafka`.
//! The broker dies with the process that started it; its log directory
//! outlives a [`Kafka::restart`], so a restart keeps topics, offsets, groups
//! and transactions, as a real broker's restart does.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::tansu::{cache_dir, log_output, spawn_from_long_lived_thread, tie_to_parent};

/// The version scripts/kafka/pom.xml resolves.
pub const VERSION: &str = "4.4.0";

/// The broker's settings, shared with scripts/lib.sh (placeholders filled in).
const SERVER_PROPERTIES: &str = include_str!("../../scripts/kafka/server.properties");
const LOG4J2: &str = include_str!("../../scripts/kafka/log4j2.yaml");

/// How long a broker may take to answer its first metadata request: a JVM
/// start on 2 busy cores (about 4 s idle, measured in docs/kafka.md).
const READY_WITHIN: Duration = Duration::from_secs(90);

/// The heap, as scripts/lib.sh sets it (`GRAPHSINK_KAFKA_HEAP` overrides).
const DEFAULT_HEAP: &str = "-Xms256m -Xmx1g";

/// `$GRAPHSINK_CACHE/kafka-4.4.0/libs`, filled by scripts/lib.sh's
/// `ensure_kafka`.
pub fn default_libs() -> PathBuf {
    cache_dir().join(format!("kafka-{VERSION}/libs"))
}

/// Whether `ensure_kafka` has run on this machine.
pub fn installed() -> bool {
    cache_dir()
        .join(format!("kafka-{VERSION}/.complete"))
        .exists()
}

/// The error a caller shows when the jars are missing: never a silent skip.
pub fn missing_message() -> String {
    format!(
        "Apache Kafka {VERSION} is not installed at {}: run `source scripts/lib.sh && ensure_kafka` \
         (it needs Maven Central, which the polyglot machine has) or set GRAPHSINK_TEST_BROKER=host:port",
        default_libs().display()
    )
}

/// Where a broker keeps its data and how it is reached.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The client port; a free one when `None`.
    pub port: Option<u16>,
    /// The log directory; a fresh temporary one (removed on drop) when
    /// `None`. A directory that already holds a formatted log is started as
    /// is (a restart).
    pub data_dir: Option<PathBuf>,
    /// Broker settings appended to scripts/kafka/server.properties.
    pub extra: Vec<(String, String)>,
}

/// A running broker. Dropping it kills the JVM (SIGKILL), reaps it, and
/// removes a temporary log directory.
pub struct Kafka {
    /// `127.0.0.1:PORT`, for `bootstrap.servers`.
    pub bootstrap: String,
    port: u16,
    controller_port: u16,
    dir: PathBuf,
    temporary: bool,
    log: Option<PathBuf>,
    extra: Vec<(String, String)>,
    child: Option<Child>,
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("pick a free port for kafka: {e}"))
}

/// A KRaft cluster id: 16 random bytes in URL-safe base64 without padding,
/// as `kafka-storage random-uuid` prints (one JVM start saved). Like
/// Kafka's own `Uuid.randomUuid`, never one that starts with `-`, which a
/// command line would take for an option.
pub(crate) fn cluster_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    loop {
        let mut bytes = [0u8; 16];
        for half in bytes.chunks_mut(8) {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos()),
            );
            h.write_u32(std::process::id());
            half.copy_from_slice(&h.finish().to_le_bytes());
        }
        let id = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
        if !id.starts_with('-') {
            return id;
        }
    }
}

impl Kafka {
    /// Starts a broker with a temporary log directory on free ports and
    /// waits until a metadata request succeeds. Its output goes to `log`,
    /// or nowhere if `None`.
    pub fn start(log: Option<&Path>) -> Result<Kafka, String> {
        Kafka::start_with(log, &Options::default())
    }

    /// [`Kafka::start`] with a chosen port, log directory or extra settings.
    pub fn start_with(log: Option<&Path>, opts: &Options) -> Result<Kafka, String> {
        if !default_libs().is_dir() {
            return Err(missing_message());
        }
        let port = match opts.port {
            Some(p) => p,
            None => free_port()?,
        };
        let (dir, temporary) = match &opts.data_dir {
            Some(d) => (d.clone(), false),
            None => {
                let base = std::env::temp_dir();
                let d = base.join(format!(
                    "graphsink-kafka-{}-{}",
                    std::process::id(),
                    cluster_id()
                ));
                (d, true)
            }
        };
        let mut kafka = Kafka {
            bootstrap: format!("127.0.0.1:{port}"),
            port,
            controller_port: free_port()?,
            dir,
            temporary,
            log: log.map(Path::to_path_buf),
            extra: opts.extra.clone(),
            child: None,
        };
        kafka.launch()?;
        Ok(kafka)
    }

    fn properties_path(&self) -> PathBuf {
        self.dir.join("server.properties")
    }

    fn log_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn java(&self) -> Result<Command, String> {
        let mut cmd = Command::new("java");
        let (stdout, stderr) = log_output(self.log.as_deref())?;
        cmd.arg(format!(
            "-Dlog4j2.configurationFile={}",
            self.dir.join("log4j2.yaml").display()
        ))
        .args(["-cp", &format!("{}/*", default_libs().display())])
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr);
        Ok(cmd)
    }

    /// Writes the settings, formats the log directory if it holds no log
    /// yet, starts the JVM and waits until it answers.
    fn launch(&mut self) -> Result<(), String> {
        let see_log = self
            .log
            .as_ref()
            .map_or(String::new(), |p| format!(" (log: {})", p.display()));
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| format!("create {}: {e}", self.dir.display()))?;
        let mut props = SERVER_PROPERTIES
            .replace("@PORT@", &self.port.to_string())
            .replace("@CONTROLLER_PORT@", &self.controller_port.to_string())
            .replace("@LOG_DIR@", &self.log_dir().display().to_string());
        for (k, v) in &self.extra {
            props.push_str(&format!("{k}={v}\n"));
        }
        std::fs::write(self.properties_path(), props)
            .and_then(|()| std::fs::write(self.dir.join("log4j2.yaml"), LOG4J2))
            .map_err(|e| format!("write kafka settings in {}: {e}", self.dir.display()))?;
        if !self.log_dir().join("meta.properties").exists() {
            let status = self
                .java()?
                .args(["kafka.tools.StorageTool", "format", "--standalone"])
                .arg(format!("--cluster-id={}", cluster_id()))
                .arg("--config")
                .arg(self.properties_path())
                .status()
                .map_err(|e| format!("run java (Java 17 is needed for Kafka {VERSION}): {e}"))?;
            if !status.success() {
                return Err(format!("kafka-storage format failed ({status}){see_log}"));
            }
        }
        let heap = std::env::var("GRAPHSINK_KAFKA_HEAP").unwrap_or_else(|_| DEFAULT_HEAP.into());
        let mut cmd = self.java()?;
        cmd.args(heap.split_whitespace())
            .args([
                "-XX:+UseG1GC",
                "-XX:MaxGCPauseMillis=20",
                "-Djava.awt.headless=true",
                "kafka.Kafka",
            ])
            .arg(self.properties_path());
        tie_to_parent(&mut cmd);
        let child = spawn_from_long_lived_thread(cmd).map_err(|e| format!("start java: {e}"))?;
        self.child = Some(child);
        self.wait_ready(READY_WITHIN, &see_log)
    }

    fn wait_ready(&mut self, limit: Duration, see_log: &str) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        let probe: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("log_level", "3")
            .create()
            .map_err(|e| format!("probe client for {}: {e}", self.bootstrap))?;
        loop {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                return Err(format!("kafka exited during startup ({status}){see_log}"));
            }
            match probe.fetch_metadata(None, Duration::from_secs(2)) {
                Ok(m) if !m.brokers().is_empty() => return Ok(()),
                Ok(_) | Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(200))
                }
                Ok(_) => {
                    return Err(format!(
                        "broker {} lists no broker{see_log}",
                        self.bootstrap
                    ))
                }
                Err(e) => {
                    return Err(format!(
                        "broker {} not ready within {} s: {e}{see_log}",
                        self.bootstrap,
                        limit.as_secs()
                    ))
                }
            }
        }
    }

    /// The JVM's process id (for SIGSTOP/SIGCONT and its CPU time).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The broker's log directory (kept across restarts).
    pub fn data_dir(&self) -> PathBuf {
        self.log_dir()
    }

    /// kill -9, reaped.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// kill -9, then a start on the same ports and log directory after
    /// `down_for`: topics, committed offsets and transactions are kept.
    pub fn restart(&mut self, down_for: Duration) -> Result<(), String> {
        self.kill();
        std::thread::sleep(down_for);
        self.launch()
    }
}

impl Drop for Kafka {
    fn drop(&mut self) {
        self.kill();
        if self.temporary {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One in 64 random ids starts with `-`: argparse took it for an option
    /// and the format failed (seen in a chaos run).
    #[test]
    fn no_cluster_id_looks_like_an_option() {
        for _ in 0..2000 {
            let id = cluster_id();
            assert_eq!(id.len(), 22, "{id}");
            assert!(!id.starts_with('-'), "{id}");
        }
    }

    /// A restart keeps the log directory: a topic made before it is there
    /// after it.
    #[test]
    fn a_restart_keeps_topics() {
        assert!(installed(), "{}", missing_message());
        let mut k = Kafka::start(None).expect("start kafka");
        let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
            ClientConfig::new()
                .set("bootstrap.servers", &k.bootstrap)
                .create()
                .expect("admin");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let topic =
            rdkafka::admin::NewTopic::new("kept", 3, rdkafka::admin::TopicReplication::Fixed(1));
        for r in rt
            .block_on(admin.create_topics([&topic], &rdkafka::admin::AdminOptions::new()))
            .expect("create")
        {
            r.expect("topic created");
        }
        k.restart(Duration::from_millis(100)).expect("restart");
        let probe: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &k.bootstrap)
            .create()
            .expect("probe");
        let md = probe
            .fetch_metadata(Some("kept"), Duration::from_secs(10))
            .expect("metadata");
        assert_eq!(
            md.topics()[0].partitions().len(),
            3,
            "the topic survived the restart"
        );
    }
}
