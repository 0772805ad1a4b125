//! Apicurio Registry 3.3.3, the real Confluent-compatible registry the
//! registry tests share (scripts/lib.sh's `ensure_apicurio` unpacks it,
//! `start_apicurio` starts the plain one), started by a test that needs
//! one of its own secured as a production registry is: HTTPS only, with a
//! PEM certificate (Quarkus's `quarkus.http.ssl.certificate.*`), and HTTP
//! basic auth against Quarkus's embedded users (the image is built with
//! `quarkus.security.users.embedded.enabled=true`; Apicurio's own
//! `AuthorizedInterceptor` then refuses a request without credentials
//! with a 401). No OIDC server is needed for that (docs/security.md).
//!
//! Its settings, credentials included, go into `config/application.properties`
//! in its own directory (mode 0700), never on a command line.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::tansu::{cache_dir, log_output, spawn_from_long_lived_thread, tie_to_parent};

/// The version scripts/apicurio/pom.xml unpacks.
pub const VERSION: &str = "3.3.3";

/// How long it may take to answer `/health/ready` (a JVM on 2 busy cores).
const READY_WITHIN: Duration = Duration::from_secs(180);

/// A running Apicurio Registry. Dropping it kills it; its directory (and
/// log) stays only when the test panicked.
pub struct Apicurio {
    child: Child,
    url: String,
    dir: PathBuf,
}

impl Apicurio {
    /// Serves `https://127.0.0.1:PORT` with `cert` and `key` (PEM; the key
    /// PKCS#8), and only to `user` with `password` (HTTP basic).
    pub fn start_secured(
        cert: &Path,
        key: &Path,
        user: &str,
        password: &str,
    ) -> Result<Apicurio, String> {
        let jar = std::env::var_os("APICURIO_JAR")
            .map(PathBuf::from)
            .unwrap_or_else(|| cache_dir().join(format!("apicurio-{VERSION}/quarkus-run.jar")));
        if !jar.exists() {
            return Err(format!(
                "Apicurio Registry {VERSION} is not unpacked at {}: run `source scripts/lib.sh && \
                 ensure_apicurio` (or set APICURIO_JAR)",
                jar.display()
            ));
        }
        let java = java21()?;
        let dir = std::env::temp_dir().join(format!(
            "graphsink-apicurio-{}-{}",
            std::process::id(),
            &crate::certs::secret()?[..8]
        ));
        std::fs::create_dir_all(dir.join("config"))
            .map_err(|e| format!("create {}: {e}", dir.display()))?;
        set_private(&dir)?;
        let (port, management) = (free_port()?, free_port()?);
        let settings = [
            "quarkus.http.host=127.0.0.1".to_string(),
            // Plain HTTP is off; its port is set only to keep off 8080.
            format!("quarkus.http.port={}", free_port()?),
            format!("quarkus.http.ssl-port={port}"),
            "quarkus.http.insecure-requests=disabled".into(),
            format!("quarkus.http.ssl.certificate.files={}", cert.display()),
            format!("quarkus.http.ssl.certificate.key-files={}", key.display()),
            "quarkus.management.host=127.0.0.1".into(),
            format!("quarkus.management.port={management}"),
            "quarkus.http.access-log.enabled=false".into(),
            "quarkus.http.auth.basic=true".into(),
            "quarkus.security.users.embedded.plain-text=true".into(),
            format!("quarkus.security.users.embedded.users.{user}={password}"),
            format!("quarkus.security.users.embedded.roles.{user}=sr-admin"),
        ];
        let props = dir.join("config/application.properties");
        std::fs::write(&props, settings.join("\n") + "\n")
            .map_err(|e| format!("write {}: {e}", props.display()))?;
        let log = dir.join("registry.log");
        let (stdout, stderr) = log_output(Some(&log))?;
        let mut cmd = Command::new(&java);
        // Serial GC and C1 only, as start_apicurio runs it: a test
        // registry holds a few schemas.
        cmd.args([
            "-Xms64m",
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-jar",
        ])
        .arg(&jar)
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr);
        tie_to_parent(&mut cmd);
        let child = spawn_from_long_lived_thread(cmd)
            .map_err(|e| format!("start {}: {e}", java.display()))?;
        let mut registry = Apicurio {
            child,
            url: format!("https://127.0.0.1:{port}/apis/ccompat/v7"),
            dir,
        };
        registry.wait_ready(management, &log)?;
        Ok(registry)
    }

    /// Its Confluent-compatible API, for `schema_registry.url`.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn wait_ready(&mut self, management: u16, log: &Path) -> Result<(), String> {
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            if ready(management) {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "Apicurio Registry exited during startup ({status}; log: {})",
                    log.display()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "Apicurio Registry not ready in {} s (log: {})",
                    READY_WITHIN.as_secs(),
                    log.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Apicurio {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "graphsink-testkit: the failed test's Apicurio directory is kept: {}",
                self.dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// `GET /health/ready` on the (plain HTTP) management port answers 200.
fn ready(port: u16) -> bool {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let req = "GET /health/ready HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.1 200")
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("pick a free port for Apicurio: {e}"))
}

fn set_private(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| format!("chmod {}: {e}", dir.display()))
}

/// A java of version 21 or newer, as scripts/lib.sh's `_java21` finds it:
/// `APICURIO_JAVA` (set by `ensure_apicurio`), `GRAPHSINK_JAVA21`,
/// `JAVA_HOME`, the JDKs under /usr/lib/jvm, then `java` on the PATH.
fn java21() -> Result<PathBuf, String> {
    let mut candidates: Vec<PathBuf> = ["APICURIO_JAVA", "GRAPHSINK_JAVA21"]
        .iter()
        .filter_map(std::env::var_os)
        .map(PathBuf::from)
        .collect();
    if let Some(home) = std::env::var_os("JAVA_HOME") {
        candidates.push(PathBuf::from(home).join("bin/java"));
    }
    if let Ok(entries) = std::fs::read_dir("/usr/lib/jvm") {
        let mut jdks: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path().join("bin/java")))
            .collect();
        jdks.sort();
        candidates.extend(jdks);
    }
    candidates.push(PathBuf::from("java"));
    candidates
        .into_iter()
        .find(|j| java_version(j).is_some_and(|v| v >= 21))
        .ok_or_else(|| {
            format!(
                "Apicurio Registry {VERSION} needs Java 21 or newer and none was found (looked at \
                 APICURIO_JAVA, GRAPHSINK_JAVA21, JAVA_HOME, /usr/lib/jvm/*, PATH)"
            )
        })
}

/// The major version `java -XshowSettings:properties -version` reports.
fn java_version(java: &Path) -> Option<u32> {
    let out = Command::new(java)
        .args(["-XshowSettings:properties", "-version"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stderr);
    let v = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("java.specification.version = "))?;
    v.split('.').next()?.parse().ok()
}
