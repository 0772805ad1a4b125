//! The parts a chaos run breaks: the main broker (Apache Kafka, whose
//! restart keeps its log directory; or tansu with memory storage, or
//! `s3://` storage on a moto server so a restart keeps its data), a second
//! broker holding only the dead-letter topic (so the dead-letter topic can
//! be taken away without taking the source topics), and the `graphsink run`
//! process, supervised the way an orchestrator would: restarted whenever it
//! exits.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use graphsink_testkit::{BrokerBackend, Host, S3Server, TansuOptions, TestBroker};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;

use crate::check::Res;
use crate::reach::Reach;

pub(crate) struct Broker {
    pub bootstrap: String,
    inner: TestBroker,
    _s3: Option<S3Server>,
}

impl Broker {
    /// A broker whose restart may lose its data: Apache Kafka (which
    /// keeps it anyway), or a memory-storage tansu.
    pub(crate) fn memory(backend: &BrokerBackend, log: PathBuf) -> Res<Broker> {
        let inner = TestBroker::start(backend, Some(&log))?;
        Ok(Broker {
            bootstrap: inner.bootstrap.clone(),
            inner,
            _s3: None,
        })
    }

    /// A broker whose restart keeps its topics, offsets and groups: Apache
    /// Kafka keeps its log directory; tansu needs its storage in a bucket
    /// of a private moto S3 server.
    pub(crate) fn persistent(
        backend: &BrokerBackend,
        moto: Option<PathBuf>,
        log: PathBuf,
    ) -> Res<Broker> {
        if *backend == BrokerBackend::Kafka {
            return Broker::memory(backend, log);
        }
        let s3 = S3Server::start(moto)?;
        graphsink_testkit::s3::create_bucket(&s3.endpoint, "tansu")?;
        let opts = TansuOptions {
            port: None,
            storage: Some("s3://tansu/".into()),
            env: vec![
                ("AWS_ENDPOINT".into(), s3.endpoint.clone()),
                ("AWS_ALLOW_HTTP".into(), "true".into()),
                (
                    "AWS_ACCESS_KEY_ID".into(),
                    graphsink_testkit::s3::ACCESS_KEY.into(),
                ),
                (
                    "AWS_SECRET_ACCESS_KEY".into(),
                    graphsink_testkit::s3::SECRET_KEY.into(),
                ),
                (
                    "AWS_DEFAULT_REGION".into(),
                    graphsink_testkit::s3::REGION.into(),
                ),
                ("AWS_REGION".into(), graphsink_testkit::s3::REGION.into()),
            ],
        };
        let inner = TestBroker::start_with(backend, Some(&log), opts)?;
        Ok(Broker {
            bootstrap: inner.bootstrap.clone(),
            inner,
            _s3: Some(s3),
        })
    }

    /// How the harness's clients reach it.
    pub(crate) fn reach(&self) -> Reach {
        Reach::plain(&self.bootstrap)
    }

    /// Whether this is the opt-in tansu backend.
    pub(crate) fn is_tansu(&self) -> bool {
        matches!(self.inner.backend, BrokerBackend::Tansu(_))
    }

    /// Whether a restart keeps the topics.
    pub(crate) fn restartable(&self) -> bool {
        self.inner.restartable()
    }

    /// SIGSTOP: the broker keeps its sockets open and answers nothing.
    pub(crate) fn freeze(&self) {
        self.inner.freeze();
    }

    pub(crate) fn thaw(&self) {
        self.inner.thaw();
    }

    /// kill -9, then a start on the same port and storage.
    pub(crate) fn restart(&mut self, down_for: Duration) -> Res<()> {
        self.inner.restart(down_for)
    }

    pub(crate) async fn create_topic(&self, topic: &str, partitions: i32) -> Res<()> {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .create()
            .map_err(|e| e.to_string())?;
        let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
        for r in admin
            .create_topics([&new], &AdminOptions::new())
            .await
            .map_err(|e| e.to_string())?
        {
            r.map_err(|(t, e)| format!("create topic {t}: {e}"))?;
        }
        Ok(())
    }
}

/// How a `graphsink` process ended.
#[derive(Debug, Clone)]
pub(crate) struct Exit {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// The failpoint that fired, read from its stderr line.
    pub fired: Option<String>,
}

/// One `graphsink` process with its output appended to a log file.
/// Dropping it kills a process still running (an early error of a phase).
pub(crate) struct Process {
    child: Child,
    log: PathBuf,
    log_len_at_start: u64,
}

impl Drop for Process {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Process {
    pub(crate) fn spawn(
        bin: &Path,
        args: &[&str],
        env: &[(&str, String)],
        log: &Path,
    ) -> Res<Process> {
        Process::spawn_on(None, bin, args, env, log)
    }

    /// [`Process::spawn`] in `host`'s network namespace (`ip netns exec`,
    /// which execs: the child is the program itself, so signals reach it).
    pub(crate) fn spawn_on(
        host: Option<&Host>,
        bin: &Path,
        args: &[&str],
        env: &[(&str, String)],
        log: &Path,
    ) -> Res<Process> {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| format!("open {}: {e}", log.display()))?;
        let log_len_at_start = f.metadata().map(|m| m.len()).unwrap_or(0);
        let g = f.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = match host {
            Some(h) => h.command(bin),
            None => Command::new(bin),
        };
        cmd.args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::from(f))
            .stderr(Stdio::from(g));
        graphsink_testkit::tie_to_parent(&mut cmd);
        let child = graphsink_testkit::tansu::spawn_from_long_lived_thread(cmd)
            .map_err(|e| format!("start {}: {e}", bin.display()))?;
        Ok(Process {
            child,
            log: log.to_path_buf(),
            log_len_at_start,
        })
    }

    pub(crate) fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub(crate) fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own (not yet reaped) child.
        unsafe { libc::kill(self.pid(), sig) };
    }

    /// Waits up to `limit` for the process to end on its own.
    pub(crate) async fn wait_for(&mut self, limit: Duration) -> Option<Exit> {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                use std::os::unix::process::ExitStatusExt;
                return Some(Exit {
                    code: status.code(),
                    signal: status.signal(),
                    fired: self.fired(),
                });
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// kill -9 and reap.
    pub(crate) async fn kill(&mut self) -> Exit {
        let _ = self.child.kill();
        match self.wait_for(Duration::from_secs(30)).await {
            Some(e) => e,
            None => Exit {
                code: None,
                signal: None,
                fired: Some("(did not die within 30 s of SIGKILL)".into()),
            },
        }
    }

    /// SIGTERM, then kill -9 past `grace`.
    pub(crate) async fn stop(&mut self, grace: Duration) -> Exit {
        self.signal(libc::SIGTERM);
        match self.wait_for(grace).await {
            Some(e) => e,
            None => self.kill().await,
        }
    }

    fn fired(&self) -> Option<String> {
        // The abort message is one eprintln!, but tracing may interleave.
        let text = std::fs::read(&self.log).ok()?;
        let start = (self.log_len_at_start as usize).min(text.len());
        let text = String::from_utf8_lossy(&text[start..]);
        let mark = "graphsink: failpoint ";
        text.lines()
            .find_map(|l| l.find(mark).map(|i| &l[i + mark.len()..]))
            .and_then(|l| l.split_whitespace().next())
            .map(str::to_string)
    }

    /// The lines this process wrote, for a failure report.
    pub(crate) fn tail(&self, n: usize) -> String {
        let text = std::fs::read(&self.log).unwrap_or_default();
        let start = (self.log_len_at_start as usize).min(text.len());
        let text = strip_ansi(&String::from_utf8_lossy(&text[start..]));
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

/// Drops the colour codes of graphsink's log lines (`ESC [ ... m`).
pub(crate) fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
