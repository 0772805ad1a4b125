//! A private S3-compatible server (moto's `moto_server`) on a free loopback
//! port, started the way scripts/lib.sh starts it, and the checks the tests
//! need before trusting it: the bucket exists, and conditional PUTs are
//! enforced. Lance's commits on `s3://` and MemWAL's WAL entries and shard
//! manifests are put-if-absent / put-if-match; a server that ignores those
//! headers loses concurrent commits silently, so the suite refuses one.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::netns::Host;
use crate::tansu::{spawn_from_long_lived_thread, tie_to_parent};

/// The bucket every test prefix lives in.
pub const TEST_BUCKET: &str = "graphsink-test";
/// moto accepts any credentials; these only make the client sign requests.
pub const ACCESS_KEY: &str = "testing";
pub const SECRET_KEY: &str = "testing-secret";
pub const REGION: &str = "us-east-1";

const READY_WITHIN: Duration = Duration::from_secs(30);

/// Where scripts/lib.sh's `ensure_moto` installs moto (a venv in the cache).
pub fn default_bin() -> PathBuf {
    crate::tansu::cache_dir().join("moto-venv/bin/moto_server")
}

/// A running moto server. Dropping it kills the server and reaps it.
pub struct S3Server {
    /// `http://127.0.0.1:PORT`, or `http://10.77.k.2:9000` on a host.
    pub endpoint: String,
    child: Child,
    /// The network namespace it serves in ([`S3Server::start_on`]).
    host: Option<Host>,
}

impl S3Server {
    /// Starts `bin` (default: [`default_bin`]) and waits until it answers.
    pub fn start(bin: Option<PathBuf>) -> Result<S3Server, String> {
        S3Server::start_logged(bin, None)
    }

    /// Like [`start`](Self::start), with moto's request log (its stderr: one
    /// line per request, `"METHOD /path HTTP/1.1" STATUS`) written to `log`
    /// instead of discarded. The bench counts requests from it.
    pub fn start_logged(bin: Option<PathBuf>, log: Option<&Path>) -> Result<S3Server, String> {
        let bin = bin.unwrap_or_else(default_bin);
        let stderr = match log {
            Some(p) => Stdio::from(
                std::fs::File::create(p).map_err(|e| format!("create {}: {e}", p.display()))?,
            ),
            None => Stdio::null(),
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("pick a free port for moto: {e}"))?
            .port();
        let mut cmd = Command::new(&bin);
        cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        tie_to_parent(&mut cmd);
        let child = spawn_from_long_lived_thread(cmd)
            .map_err(|e| format!("start {}: {e}", bin.display()))?;
        let mut server = S3Server {
            endpoint: format!("http://127.0.0.1:{port}"),
            child,
            host: None,
        };
        server.wait_ready()?;
        Ok(server)
    }

    /// moto on `host` (a namespace of a test network, [`crate::netns`]),
    /// listening on the host's address, port 9000: a server the test can
    /// cut off. Reach it from another host of the network, or with
    /// [`S3Server::reach`].
    pub fn start_on(
        host: &Host,
        bin: Option<PathBuf>,
        log: Option<&Path>,
    ) -> Result<S3Server, String> {
        let bin = bin.unwrap_or_else(default_bin);
        let stderr = match log {
            Some(p) => Stdio::from(
                std::fs::File::create(p).map_err(|e| format!("create {}: {e}", p.display()))?,
            ),
            None => Stdio::null(),
        };
        let addr = host.addr().to_string();
        let mut cmd = host.command(&bin);
        cmd.args(["-H", &addr, "-p", "9000"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        tie_to_parent(&mut cmd);
        let child = spawn_from_long_lived_thread(cmd)
            .map_err(|e| format!("start {} in {}: {e}", bin.display(), host.name()))?;
        let mut server = S3Server {
            endpoint: format!("http://{addr}:9000"),
            child,
            host: Some(host.clone()),
        };
        server.wait_ready()?;
        Ok(server)
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("moto_server exited during startup ({status})"));
            }
            let endpoint = self.endpoint.clone();
            match self.reach(move || request(&endpoint, "GET", "/", &[], b"")) {
                Ok(Ok((200, _))) => return Ok(()),
                _ if Instant::now() > deadline => {
                    return Err(format!(
                        "moto_server not ready at {} within 30 s",
                        self.endpoint
                    ))
                }
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Runs `f` where the server is reachable: in its host's namespace
    /// (on a thread of its own), or here.
    pub fn reach<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T, String> {
        match &self.host {
            Some(h) => h.enter(f),
            None => Ok(f()),
        }
    }

    /// The server's process id (to sample its CPU time).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Creates `bucket` (an existing one is fine).
pub fn create_bucket(endpoint: &str, bucket: &str) -> Result<(), String> {
    match request(endpoint, "PUT", &format!("/{bucket}"), &[], b"")? {
        (200, _) | (409, _) => Ok(()),
        (status, body) => Err(format!("create bucket {bucket}: HTTP {status}: {body}")),
    }
}

/// Proves the server enforces `If-None-Match: *` and `If-Match` with 412.
pub fn check_conditional_puts(endpoint: &str, bucket: &str) -> Result<(), String> {
    let key = format!(
        "/{bucket}/_probe/conditional-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    );
    let put = |headers: &[(&str, &str)]| request(endpoint, "PUT", &key, headers, b"x");
    let first = put(&[("If-None-Match", "*")])?;
    if first.0 != 200 {
        return Err(format!("a first put-if-absent failed: HTTP {}", first.0));
    }
    let again = put(&[("If-None-Match", "*")])?;
    let stale = put(&[("If-Match", "\"0000000000000000\"")])?;
    let _ = request(endpoint, "DELETE", &key, &[], b"");
    if again.0 != 412 || stale.0 != 412 {
        return Err(format!(
            "the S3 server at {endpoint} does not enforce conditional PUTs \
             (If-None-Match: * on an existing key gave HTTP {}, a stale If-Match gave HTTP {}; \
             both must be 412). Lance's commits would be lost silently on it.",
            again.0, stale.0
        ));
    }
    Ok(())
}

/// One HTTP/1.1 request with `Connection: close`, so the reply ends at EOF.
/// Returns (status, body). moto checks no signature, but it answers an
/// anonymous request on an existing key with 403 before it looks at the
/// conditions, so the request carries a dummy Authorization header.
pub fn request(
    endpoint: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<(u16, String), String> {
    let host = endpoint
        .strip_prefix("http://")
        .ok_or_else(|| format!("endpoint {endpoint} is not http://"))?
        .trim_end_matches('/');
    let addr: SocketAddr = host
        .parse()
        .map_err(|e| format!("endpoint {endpoint}: {e}"))?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connect {endpoint}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {}\r\nConnection: close\r\n\
         Authorization: AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/20260101/{REGION}/s3/aws4_request, \
         SignedHeaders=host, Signature=0\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())
        .and_then(|_| s.write_all(body))
        .map_err(|e| format!("send to {endpoint}: {e}"))?;
    let mut reply = Vec::new();
    s.read_to_end(&mut reply)
        .map_err(|e| format!("read from {endpoint}: {e}"))?;
    let text = String::from_utf8_lossy(&reply);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no HTTP status from {endpoint}"))?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Ok((status, body.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> S3Server {
        let bin = default_bin();
        assert!(
            bin.exists(),
            "{} is missing: run `bash scripts/test.sh`, which installs moto",
            bin.display()
        );
        S3Server::start(Some(bin)).expect("start moto")
    }

    #[test]
    fn moto_enforces_conditional_puts() {
        let s = server();
        create_bucket(&s.endpoint, TEST_BUCKET).unwrap();
        create_bucket(&s.endpoint, TEST_BUCKET).expect("idempotent");
        check_conditional_puts(&s.endpoint, TEST_BUCKET).unwrap();
    }

    /// The refusal itself must be able to fire: a server that accepts
    /// every PUT (a minimal fake, the only way to get one here) is refused.
    #[test]
    fn a_server_ignoring_conditions_is_refused() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", l.local_addr().unwrap());
        std::thread::spawn(move || {
            for mut c in l.incoming().flatten() {
                // Read the whole request (head, then Content-Length bytes):
                // closing with unread bytes would reset the connection.
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    let n = c.read(&mut buf).unwrap_or(0);
                    got.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&got).to_string();
                    if let Some((head, body)) = text.split_once("\r\n\r\n") {
                        let len = head
                            .lines()
                            .find_map(|l| l.strip_prefix("Content-Length: "))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        if body.len() >= len {
                            break;
                        }
                    }
                    if n == 0 {
                        break;
                    }
                }
                let _ = c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
            }
        });
        let err = check_conditional_puts(&endpoint, TEST_BUCKET).unwrap_err();
        assert!(err.contains("does not enforce conditional PUTs"), "{err}");
    }
}
