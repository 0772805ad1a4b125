//! A private tansu broker (memory storage, free loopback port), started the
//! way scripts/lib.sh starts it, that dies with the process that started it.
//! tansu is the opt-in backend now (`GRAPHSINK_TEST_BROKER_BACKEND=tansu`);
//! the spawner thread and `tie_to_parent` here serve every backend.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Sender};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

/// How long tansu may take to answer its first metadata request.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// How to start a tansu: memory storage on a free port unless told.
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub port: Option<u16>,
    /// `--storage-engine`; `memory://tansu/` when `None`.
    pub storage: Option<String>,
    /// Extra environment (the `AWS_*` settings of an `s3://` engine).
    pub env: Vec<(String, String)>,
}

impl Options {
    fn storage(&self) -> &str {
        self.storage.as_deref().unwrap_or("memory://tansu/")
    }
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("pick a free port for tansu: {e}"))
}

/// A running tansu. Dropping it kills the broker and reaps it.
pub struct Tansu {
    /// `127.0.0.1:PORT`, for `bootstrap.servers`.
    pub bootstrap: String,
    child: Child,
}

/// Where scripts/lib.sh's `ensure_tansu` installs tansu:
/// `$GRAPHSINK_CACHE/tansu-0.6.0/bin/tansu`, the cache defaulting to
/// `$HOME/.cache/graphsink`.
pub fn default_bin() -> PathBuf {
    cache_dir().join("tansu-0.6.0/bin/tansu")
}

/// `$GRAPHSINK_CACHE`, defaulting to `$HOME/.cache/graphsink` (scripts/lib.sh).
pub(crate) fn cache_dir() -> PathBuf {
    match std::env::var_os("GRAPHSINK_CACHE") {
        Some(c) => PathBuf::from(c),
        None => {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/graphsink")
        }
    }
}

impl Tansu {
    /// Starts `bin` (default: [`default_bin`]) with memory storage on a free
    /// port and waits until a metadata request succeeds. Its output goes to
    /// `log`, or nowhere if `None`. Callers that want a tailored "how to
    /// install tansu" message check that the binary exists first.
    pub fn start(bin: Option<PathBuf>, log: Option<&Path>) -> Result<Tansu, String> {
        Tansu::start_with(bin, log, &Options::default())
    }

    /// [`Tansu::start`] with a chosen port, storage engine and environment:
    /// a restart on the same port with `s3://` storage keeps the topics,
    /// the offsets and the groups (the chaos tool's broker restarts).
    pub fn start_with(
        bin: Option<PathBuf>,
        log: Option<&Path>,
        opts: &Options,
    ) -> Result<Tansu, String> {
        let bin = bin.unwrap_or_else(default_bin);
        // Bind-and-release picks a free port; the window until tansu binds is
        // tiny and a clash shows up as a startup failure, not wrong results.
        let port = match opts.port {
            Some(p) => p,
            None => free_port()?,
        };
        let url = format!("tcp://127.0.0.1:{port}");
        let (stdout, stderr) = log_output(log)?;
        let mut cmd = Command::new(&bin);
        cmd.args([
            "broker",
            "--listener-url",
            &url,
            "--advertised-listener-url",
            &url,
        ])
        .args(["--storage-engine", opts.storage()])
        .envs(opts.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr);
        tie_to_parent(&mut cmd);
        let child = spawn_from_long_lived_thread(cmd)
            .map_err(|e| format!("start {}: {e}", bin.display()))?;
        let mut tansu = Tansu {
            bootstrap: format!("127.0.0.1:{port}"),
            child,
        };
        tansu.wait_ready(READY_WITHIN, log)?;
        Ok(tansu)
    }

    /// The broker's process id (for SIGSTOP/SIGCONT).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.bootstrap
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("bootstrap is 127.0.0.1:PORT")
    }

    fn wait_ready(&mut self, limit: Duration, log: Option<&Path>) -> Result<(), String> {
        let see_log = log.map_or(String::new(), |p| format!(" (log: {})", p.display()));
        let deadline = Instant::now() + limit;
        // log_level 3: no librdkafka noise about refused connections while
        // tansu is still starting.
        let probe: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("log_level", "3")
            .create()
            .map_err(|e| format!("probe client for {}: {e}", self.bootstrap))?;
        loop {
            // A tansu that died (say, its port was taken) never gets ready:
            // say so now rather than after the whole wait.
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("tansu exited during startup ({status}){see_log}"));
            }
            match probe.fetch_metadata(None, Duration::from_secs(2)) {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    return Err(format!(
                        "broker {} not ready within {} s: {e}{see_log}",
                        self.bootstrap,
                        limit.as_secs()
                    ))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }
}

impl Drop for Tansu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A server's stdout and stderr: appended to `log`, or discarded.
pub(crate) fn log_output(log: Option<&Path>) -> Result<(Stdio, Stdio), String> {
    let Some(path) = log else {
        return Ok((Stdio::null(), Stdio::null()));
    };
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("create server log {}: {e}", path.display()))?;
    let g = f
        .try_clone()
        .map_err(|e| format!("server log {}: {e}", path.display()))?;
    Ok((Stdio::from(f), Stdio::from(g)))
}

/// PR_SET_PDEATHSIG: the kernel kills the child if its parent dies in any
/// way (panic, kill -9), so no test server outlives a run. Also used for
/// the e2e tests' `graphsink run` children: the signal fires when the
/// spawning thread ends, so a child dies with its (failed) test's runtime.
pub fn tie_to_parent(cmd: &mut Command) {
    // SAFETY: the closure runs in the forked child before exec and only
    // calls prctl and reads errno, both async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

type SpawnRequest = (Command, Sender<std::io::Result<Child>>);

/// PR_SET_PDEATHSIG fires when the spawning *thread* exits, not the process:
/// a broker spawned from a test thread (which ends with its test) or a
/// short-lived worker would be killed early. So every spawn goes through one
/// thread that lives as long as the process.
pub fn spawn_from_long_lived_thread(cmd: Command) -> std::io::Result<Child> {
    static SPAWNER: OnceLock<Sender<SpawnRequest>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("tansu-spawner".into())
            .spawn(move || {
                // The sender lives in a static, so recv never fails and this
                // thread never returns.
                while let Ok((mut cmd, reply)) = rx.recv() {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("start the tansu spawner thread");
        tx
    });
    let (reply, answer) = mpsc::channel();
    spawner
        .send((cmd, reply))
        .map_err(|_| std::io::Error::other("tansu spawner thread is gone"))?;
    answer
        .recv()
        .map_err(|_| std::io::Error::other("tansu spawner thread is gone"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broker_that_exits_fails_fast() {
        let t0 = Instant::now();
        let err = Tansu::start(Some("/bin/false".into()), None)
            .err()
            .expect("must fail");
        assert!(err.contains("exited during startup"), "{err}");
        assert!(t0.elapsed() < Duration::from_secs(10));
    }
}
