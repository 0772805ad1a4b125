//! The test broker, whichever backend runs it: Apache Kafka from Maven
//! Central (the default), tansu 0.6 (opt-in, the broker of the project's
//! first rounds), or any broker named in `GRAPHSINK_TEST_BROKER`. The e2e
//! tests, the chaos harness and the bench start theirs through here, so they
//! cannot drift apart.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::kafka::{self, Kafka};
use crate::tansu::{Options as TansuOptions, Tansu};

/// The environment variable that selects the backend.
pub const BACKEND_VAR: &str = "GRAPHSINK_TEST_BROKER_BACKEND";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// Apache Kafka 4.4 (KRaft), the jars scripts/lib.sh's `ensure_kafka`
    /// resolved.
    Kafka,
    /// tansu 0.6 at this binary (scripts/lib.sh's `ensure_tansu`).
    Tansu(PathBuf),
}

impl Backend {
    /// From `GRAPHSINK_TEST_BROKER_BACKEND`: `kafka` (or unset) or `tansu`.
    /// `containers` is the e2e harness's own (crate::containers).
    pub fn from_env() -> Result<Backend, String> {
        match std::env::var(BACKEND_VAR).as_deref() {
            Err(_) | Ok("") | Ok("kafka") => Ok(Backend::Kafka),
            Ok("tansu") => Ok(Backend::Tansu(crate::tansu::default_bin())),
            Ok(other) => Err(format!(
                "{BACKEND_VAR}={other}: expected kafka (the default), tansu or containers"
            )),
        }
    }

    /// Why this backend cannot start here, if it cannot.
    pub fn check_installed(&self) -> Result<(), String> {
        match self {
            Backend::Kafka if !kafka::installed() => Err(kafka::missing_message()),
            Backend::Tansu(bin) if !bin.exists() => Err(format!(
                "tansu not found at {} (run `source scripts/lib.sh && ensure_tansu`)",
                bin.display()
            )),
            _ => Ok(()),
        }
    }

    /// A name for reports: "Apache Kafka 4.4.0", "tansu 0.6.0".
    pub fn describe(&self) -> String {
        match self {
            Backend::Kafka => format!("Apache Kafka {} (KRaft)", kafka::VERSION),
            Backend::Tansu(_) => "tansu 0.6.0".into(),
        }
    }
}

enum Running {
    Kafka(Kafka),
    Tansu(Tansu),
}

/// A running private broker. Dropping it kills it (and removes Kafka's
/// temporary log directory).
pub struct TestBroker {
    pub bootstrap: String,
    pub backend: Backend,
    running: Option<Running>,
    log: Option<PathBuf>,
    tansu_opts: TansuOptions,
}

impl TestBroker {
    /// Starts a broker of `backend` on a free loopback port.
    pub fn start(backend: &Backend, log: Option<&Path>) -> Result<TestBroker, String> {
        TestBroker::start_with(backend, log, TansuOptions::default())
    }

    /// [`TestBroker::start`] with tansu options (its storage engine, for a
    /// tansu whose restart keeps its data); Kafka ignores them: its log
    /// directory always outlives a restart.
    pub fn start_with(
        backend: &Backend,
        log: Option<&Path>,
        mut tansu_opts: TansuOptions,
    ) -> Result<TestBroker, String> {
        backend.check_installed()?;
        let running = match backend {
            Backend::Kafka => Running::Kafka(Kafka::start(log)?),
            Backend::Tansu(bin) => {
                let t = Tansu::start_with(Some(bin.clone()), log, &tansu_opts)?;
                tansu_opts.port = Some(t.port());
                Running::Tansu(t)
            }
        };
        let bootstrap = match &running {
            Running::Kafka(k) => k.bootstrap.clone(),
            Running::Tansu(t) => t.bootstrap.clone(),
        };
        Ok(TestBroker {
            bootstrap,
            backend: backend.clone(),
            running: Some(running),
            log: log.map(Path::to_path_buf),
            tansu_opts,
        })
    }

    /// The broker's process id (the JVM, or tansu).
    pub fn pid(&self) -> Option<u32> {
        match &self.running {
            Some(Running::Kafka(k)) => Some(k.pid()),
            Some(Running::Tansu(t)) => Some(t.pid()),
            None => None,
        }
    }

    /// Whether a restart keeps topics, offsets and groups: always for
    /// Kafka, for tansu only with non-memory storage.
    pub fn restartable(&self) -> bool {
        match self.backend {
            Backend::Kafka => true,
            Backend::Tansu(_) => self.tansu_opts.storage.is_some(),
        }
    }

    /// SIGSTOP: the broker keeps its sockets open and answers nothing.
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// SIGCONT after [`TestBroker::freeze`].
    pub fn thaw(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, sig: i32) {
        if let Some(pid) = self.pid() {
            // SAFETY: kill(2) on our own child's pid; no memory is touched.
            unsafe { libc::kill(pid as i32, sig) };
        }
    }

    /// kill -9, then a start on the same port (and, for Kafka, the same
    /// log directory) after `down_for`.
    pub fn restart(&mut self, down_for: Duration) -> Result<(), String> {
        match self.running.as_mut() {
            Some(Running::Kafka(k)) => k.restart(down_for),
            Some(Running::Tansu(_)) | None => {
                drop(self.running.take()); // kill -9 and reap
                std::thread::sleep(down_for);
                let Backend::Tansu(bin) = &self.backend else {
                    unreachable!("a Kafka broker is always running")
                };
                let t =
                    Tansu::start_with(Some(bin.clone()), self.log.as_deref(), &self.tansu_opts)?;
                self.running = Some(Running::Tansu(t));
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reason for the spawner thread: a broker started from a thread
    /// that then exits must keep running (PR_SET_PDEATHSIG fires when the
    /// spawning thread ends).
    #[test]
    fn a_broker_outlives_the_thread_that_started_it() {
        let backend = Backend::from_env().expect("backend");
        backend.check_installed().expect("installed");
        let broker = std::thread::spawn(move || TestBroker::start(&backend, None))
            .join()
            .expect("starter thread")
            .expect("start the broker");
        std::thread::sleep(Duration::from_millis(500));
        let probe: rdkafka::consumer::BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &broker.bootstrap)
            .create()
            .expect("probe");
        rdkafka::consumer::Consumer::fetch_metadata(&probe, None, Duration::from_secs(10))
            .expect("the broker still answers");
    }
}
