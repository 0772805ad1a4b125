//! Toxiproxy (Shopify's TCP proxy with faults) on a [`Host`], and a client
//! of its HTTP API: proxies, and the toxics that make a slow or faulty
//! network where the kernel has no `netem` (latency with jitter, bandwidth,
//! stalls, resets). The server is built from the Go module proxy by
//! scripts/lib.sh's `ensure_toxiproxy` into the cache; [`ensure`] runs it
//! when the binary is missing. Its API listens on the host's loopback, so
//! each host has its own, and the client here connects from inside the
//! host's namespace (HTTP/1.0 over a plain socket: a few JSON requests need
//! no HTTP crate).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::netns::Host;
use crate::tansu::{cache_dir, log_output, spawn_from_long_lived_thread, tie_to_parent};

/// The version scripts/kafka/cluster.sh's `ensure_toxiproxy` builds (what
/// `go install …/cmd/server@latest` resolves here).
pub const VERSION: &str = "2.5.0";

/// Where the API listens, in the host's namespace.
const API: &str = "127.0.0.1:8474";

/// `$GRAPHSINK_CACHE/toxiproxy-2.5.0/bin/toxiproxy-server`.
pub fn default_bin() -> PathBuf {
    cache_dir().join(format!("toxiproxy-{VERSION}/bin/toxiproxy-server"))
}

/// The server binary, built first (`ensure_toxiproxy`, flock'd, about a
/// minute once per machine) if it is missing.
pub fn ensure() -> Result<PathBuf, String> {
    let bin = default_bin();
    if bin.exists() {
        return Ok(bin);
    }
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/lib.sh");
    let status = std::process::Command::new("bash")
        .arg("-c")
        .arg("source \"$1\" && ensure_toxiproxy")
        .arg("bash")
        .arg(&lib)
        .stdin(Stdio::null())
        .status()
        .map_err(|e| format!("run bash for ensure_toxiproxy: {e}"))?;
    if !status.success() || !bin.exists() {
        return Err(format!(
            "Toxiproxy {VERSION} is not installed at {} and `source scripts/lib.sh && \
             ensure_toxiproxy` failed ({status}): it needs go and the Go module proxy",
            bin.display()
        ));
    }
    Ok(bin)
}

/// Which way a toxic acts: on what the client sends (`Upstream`) or on
/// what it receives (`Downstream`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Upstream,
    Downstream,
}

impl Stream {
    fn word(self) -> &'static str {
        match self {
            Stream::Upstream => "upstream",
            Stream::Downstream => "downstream",
        }
    }
}

/// A fault of Toxiproxy's (its `type` and `attributes`).
#[derive(Debug, Clone, PartialEq)]
pub enum Toxic {
    /// Each chunk of data is held `latency` ± `jitter` (uniform).
    Latency { latency: Duration, jitter: Duration },
    /// At most this many KB per second.
    Bandwidth { kb_per_s: u64 },
    /// A stall: no data passes; the connection is closed after `after`
    /// (never, for zero) — until the toxic is removed.
    Timeout { after: Duration },
    /// The connection is reset (TCP RST) after `after` (at once, for zero).
    ResetPeer { after: Duration },
    /// The close is delayed by `delay`.
    SlowClose { delay: Duration },
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Toxic {
    /// Toxiproxy's name for the kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Toxic::Latency { .. } => "latency",
            Toxic::Bandwidth { .. } => "bandwidth",
            Toxic::Timeout { .. } => "timeout",
            Toxic::ResetPeer { .. } => "reset_peer",
            Toxic::SlowClose { .. } => "slow_close",
        }
    }

    fn attributes(&self) -> Value {
        match self {
            Toxic::Latency { latency, jitter } => {
                json!({"latency": ms(*latency), "jitter": ms(*jitter)})
            }
            Toxic::Bandwidth { kb_per_s } => json!({ "rate": kb_per_s }),
            Toxic::Timeout { after } => json!({ "timeout": ms(*after) }),
            Toxic::ResetPeer { after } => json!({ "timeout": ms(*after) }),
            Toxic::SlowClose { delay } => json!({ "delay": ms(*delay) }),
        }
    }
}

/// A Toxiproxy server running on a host. Dropping it kills it.
pub struct Toxiproxy {
    host: Host,
    child: Option<Child>,
}

impl Toxiproxy {
    /// Starts the server in `host`'s namespace (API on its 127.0.0.1:8474)
    /// and waits until it answers. Its output goes to `log`, or nowhere.
    pub fn start(host: &Host, log: Option<&Path>) -> Result<Toxiproxy, String> {
        let bin = ensure()?;
        let (stdout, stderr) = log_output(log)?;
        let mut cmd = host.command(&bin);
        // Warnings only: at its default level it logs every connection.
        cmd.args(["-host", "127.0.0.1", "-port", "8474"])
            .env("LOG_LEVEL", "warn")
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        tie_to_parent(&mut cmd);
        let child = spawn_from_long_lived_thread(cmd)
            .map_err(|e| format!("start {} in {}: {e}", bin.display(), host.name()))?;
        let mut proxy = Toxiproxy {
            host: host.clone(),
            child: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match proxy.call("GET", "/version", None) {
                Ok(_) => return Ok(proxy),
                Err(e) if Instant::now() > deadline => {
                    return Err(format!(
                        "Toxiproxy on {} not ready in 20 s: {e}",
                        host.name()
                    ))
                }
                Err(_) => {
                    if let Some(Ok(Some(status))) = proxy.child.as_mut().map(Child::try_wait) {
                        return Err(format!("Toxiproxy on {} exited: {status}", host.name()));
                    }
                    std::thread::sleep(Duration::from_millis(50))
                }
            }
        }
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// One API request; the body of a 2xx answer as JSON (`Null` if empty,
    /// a string if not JSON).
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, String> {
        let api: SocketAddr = API.parse().map_err(|e| format!("{API}: {e}"))?;
        let mut s = self
            .host
            .connect(api, Duration::from_secs(2))
            .map_err(|e| format!("connect to Toxiproxy's API on {}: {e}", self.host.name()))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        let body = body.map(Value::to_string).unwrap_or_default();
        // HTTP/1.0: the answer is never chunked, and ends at close.
        let req = format!(
            "{method} {path} HTTP/1.0\r\nHost: {API}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).map_err(|e| e.to_string())?;
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut headers);
        let head = match resp.parse(&raw) {
            Ok(httparse::Status::Complete(n)) => n,
            _ => return Err(format!("{method} {path}: no HTTP answer")),
        };
        let code = resp.code.unwrap_or(0);
        let text = String::from_utf8_lossy(&raw[head..]).into_owned();
        if !(200..300).contains(&code) {
            return Err(format!("{method} {path}: HTTP {code}: {}", text.trim()));
        }
        // JSON, but `/version` answers plain text.
        Ok(match text.trim() {
            "" => Value::Null,
            t => serde_json::from_str(t).unwrap_or_else(|_| Value::String(t.to_owned())),
        })
    }

    /// A proxy `name` listening on `listen` (an address of this host) and
    /// forwarding to `upstream`.
    pub fn create_proxy(
        &self,
        name: &str,
        listen: SocketAddr,
        upstream: SocketAddr,
    ) -> Result<(), String> {
        self.call(
            "POST",
            "/proxies",
            Some(&json!({
                "name": name,
                "listen": listen.to_string(),
                "upstream": upstream.to_string(),
                "enabled": true,
            })),
        )
        .map(|_| ())
    }

    /// Turns a proxy off (its connections closed, new ones refused) or on.
    pub fn set_enabled(&self, proxy: &str, enabled: bool) -> Result<(), String> {
        self.call(
            "POST",
            &format!("/proxies/{proxy}"),
            Some(&json!({ "enabled": enabled })),
        )
        .map(|_| ())
    }

    /// Adds `toxic` to `proxy` as `name`, on `stream`, for a share
    /// `toxicity` (0..=1) of connections.
    pub fn add_toxic(
        &self,
        proxy: &str,
        name: &str,
        toxic: &Toxic,
        stream: Stream,
        toxicity: f32,
    ) -> Result<(), String> {
        self.call(
            "POST",
            &format!("/proxies/{proxy}/toxics"),
            Some(&json!({
                "name": name,
                "type": toxic.kind(),
                "stream": stream.word(),
                "toxicity": toxicity,
                "attributes": toxic.attributes(),
            })),
        )
        .map(|_| ())
    }

    /// Removes the toxic `name` from `proxy`.
    pub fn remove_toxic(&self, proxy: &str, name: &str) -> Result<(), String> {
        self.call("DELETE", &format!("/proxies/{proxy}/toxics/{name}"), None)
            .map(|_| ())
    }

    /// Removes every toxic and turns every proxy on again.
    pub fn reset(&self) -> Result<(), String> {
        self.call("POST", "/reset", None).map(|_| ())
    }

    /// Every proxy with its toxics, as the API lists them.
    pub fn proxies(&self) -> Result<Value, String> {
        self.call("GET", "/proxies", None)
    }
}

impl Drop for Toxiproxy {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netns::Network;
    use std::net::{Ipv4Addr, TcpListener};

    /// Round trips from a client host through its Toxiproxy to an echo
    /// server on another host: a 200 ms ± 20 ms latency toxic shows in the
    /// round trip the client measures, and is gone once removed; a
    /// reset_peer toxic resets the connection.
    #[test]
    fn latency_shows_in_a_clients_round_trip() {
        let net = Network::new().expect("network");
        let server = net.add_host("echo").expect("server host");
        let client = net.add_host("client").expect("client host");
        let l = server
            .enter(|| TcpListener::bind((server.addr(), 7000)))
            .expect("enter")
            .expect("bind");
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(mut c) = c else { return };
                std::thread::spawn(move || {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = c.read(&mut buf) {
                        if n == 0 || c.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let proxy_addr = Ipv4Addr::new(10, 77, 100, 1);
        client.add_local_address(proxy_addr).expect("address");
        let tp = Toxiproxy::start(&client, None).expect("toxiproxy");
        let listen = SocketAddr::from((proxy_addr, 7000));
        tp.create_proxy("echo", listen, SocketAddr::from((server.addr(), 7000)))
            .expect("proxy");

        // The median of 5 round trips on one connection.
        let round_trip = || -> Result<Duration, String> {
            let mut s = client
                .connect(listen, Duration::from_secs(2))
                .map_err(|e| e.to_string())?;
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut times = Vec::new();
            for _ in 0..5 {
                let t = Instant::now();
                s.write_all(b"ping").map_err(|e| e.to_string())?;
                let mut buf = [0u8; 4];
                s.read_exact(&mut buf).map_err(|e| e.to_string())?;
                times.push(t.elapsed());
            }
            times.sort();
            Ok(times[2])
        };
        let before = round_trip().expect("round trip");
        assert!(before < Duration::from_millis(50), "no toxic: {before:?}");

        let latency = Toxic::Latency {
            latency: Duration::from_millis(200),
            jitter: Duration::from_millis(20),
        };
        tp.add_toxic("echo", "slow", &latency, Stream::Downstream, 1.0)
            .expect("toxic");
        let slow = round_trip().expect("round trip");
        assert!(
            slow >= Duration::from_millis(170) && slow < Duration::from_millis(400),
            "200 ± 20 ms downstream: {slow:?}"
        );
        tp.remove_toxic("echo", "slow").expect("remove");
        let after = round_trip().expect("round trip");
        assert!(
            after < Duration::from_millis(50),
            "toxic removed: {after:?}"
        );

        let reset = Toxic::ResetPeer {
            after: Duration::ZERO,
        };
        tp.add_toxic("echo", "reset", &reset, Stream::Upstream, 1.0)
            .expect("toxic");
        let e = round_trip().expect_err("reset");
        assert!(!e.is_empty());
        tp.reset().expect("reset all");
        round_trip().expect("healthy after reset");
    }
}
