//! The broker under test: a private tansu on a free loopback port (the
//! default), or any broker the user names. Owns the tansu child process and
//! nothing else.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub struct Broker {
    pub bootstrap: String,
    child: Option<Child>,
}

impl Broker {
    pub fn external(bootstrap: String) -> Broker {
        Broker {
            bootstrap,
            child: None,
        }
    }

    /// Starts tansu with memory storage, as scripts/lib.sh does, and waits
    /// until a metadata request succeeds.
    pub fn start_tansu(
        bin: Option<PathBuf>,
        log_dir: &std::path::Path,
    ) -> Result<Broker, BoxError> {
        let bin = bin.unwrap_or_else(default_tansu_bin);
        if !bin.exists() {
            return Err(format!(
                "tansu not found at {} (run `source scripts/lib.sh && ensure_tansu`, or pass --broker)",
                bin.display()
            )
            .into());
        }
        // Bind-and-release picks a free port; the window until tansu binds is
        // tiny and a clash shows up as a startup failure, not wrong numbers.
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let url = format!("tcp://127.0.0.1:{port}");
        let log = std::fs::File::create(log_dir.join("tansu.log"))?;
        let mut cmd = Command::new(&bin);
        cmd.args([
            "broker",
            "--listener-url",
            &url,
            "--advertised-listener-url",
            &url,
        ])
        .args(["--storage-engine", "memory://tansu/"])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
        // PR_SET_PDEATHSIG: the kernel kills tansu if the bench dies in any
        // way (panic, kill -9), so no broker outlives a run.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn()?;
        let broker = Broker {
            bootstrap: format!("127.0.0.1:{port}"),
            child: Some(child),
        };
        broker.wait_ready(Duration::from_secs(30))?;
        Ok(broker)
    }

    fn wait_ready(&self, limit: Duration) -> Result<(), BoxError> {
        let deadline = Instant::now() + limit;
        let probe: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("log_level", "3")
            .create()?;
        loop {
            match probe.fetch_metadata(None, Duration::from_secs(2)) {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    return Err(format!("broker {} not ready: {e}", self.bootstrap).into())
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    pub async fn create_topic(&self, topic: &str, partitions: i32) -> Result<(), BoxError> {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .create()?;
        let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
        for r in admin.create_topics([&new], &AdminOptions::new()).await? {
            r.map_err(|(t, e)| format!("create topic {t}: {e}"))?;
        }
        Ok(())
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn default_tansu_bin() -> PathBuf {
    let home = std::env::var_os("HOME").unwrap_or_default();
    PathBuf::from(home).join(".cache/graphsink/tansu-0.6.0/bin/tansu")
}
