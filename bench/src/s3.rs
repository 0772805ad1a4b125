//! The S3 side of the bench (`--s3`, `--s3-endpoint`): a private moto
//! server (graphsink-testkit's `S3Server`) or a given one, the graph roots on
//! it, and what each S3 phase cost the server: requests by method and kind
//! (from moto's request log, or from a rule-less `FaultProxy` in front of
//! the server) and the server's CPU time. Owns the server and the counting;
//! the phases are driven from kafka/.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Instant;

use graphsink_testkit::s3 as tk;
use graphsink_testkit::{FaultProxy, S3Server};
use serde::Serialize;

use crate::broker::BoxError;

/// The bucket every bench graph lives in (one prefix per run).
pub(crate) const BUCKET: &str = "graphsink-bench";

/// Where a graph lives: its root URI and the `[graph.storage_options]`
/// table that reaches it (empty for a local root).
#[derive(Clone, Debug)]
pub(crate) struct Root {
    pub uri: String,
    pub storage_toml: String,
}

impl Root {
    pub(crate) fn local(dir: &Path, name: &str) -> Root {
        Root {
            uri: dir.join(name).to_string_lossy().into_owned(),
            storage_toml: String::new(),
        }
    }
}

/// How the requests of a phase are counted.
enum Counter {
    /// moto's own request log (stderr), one line per request; what is
    /// counted is what the server handled, at no cost to the client.
    MotoLog(PathBuf),
    /// A `FaultProxy` with no rules between graphsink and the server: it
    /// adds a loopback hop and a fresh upstream connection per request.
    Proxy(FaultProxy),
    None,
}

pub(crate) struct S3Bench {
    /// What graphsink talks to (the proxy when counting through one).
    endpoint: String,
    pub describe: String,
    counter: Counter,
    pid: Option<u32>,
    _server: Option<S3Server>,
}

/// A point in time a phase's load is measured from.
pub(crate) struct Mark {
    at: Instant,
    log_pos: u64,
    server_ticks: Option<u64>,
    self_ticks: Option<u64>,
}

/// What one phase cost the S3 server (and the bench process, for scale).
#[derive(Serialize, Default, Clone, Debug)]
pub(crate) struct Load {
    pub secs: f64,
    /// "METHOD kind" → requests, kinds from the key's path (`wal entry`,
    /// `shard manifest`, `generation`, `table version`, `__manifest`, ...).
    pub requests: BTreeMap<String, u64>,
    /// HTTP status → requests.
    pub statuses: BTreeMap<u16, u64>,
    pub total_requests: u64,
    pub requests_per_s: f64,
    /// Server CPU seconds over the phase, and as a fraction of one core
    /// (moto is one Python process: ~1.0 is its ceiling, the GIL).
    pub server_cpu_secs: Option<f64>,
    pub server_cpu_cores: Option<f64>,
    /// graphsink's process's CPU over the phase, in cores (graphsink and
    /// the samplers; the backlog child's own when the phase ran in one; the
    /// machine has 2).
    pub bench_cpu_cores: Option<f64>,
}

impl Load {
    pub(crate) fn count(&self, prefix: &str) -> u64 {
        self.requests
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| *v)
            .sum()
    }
}

impl S3Bench {
    /// Starts a private moto (`endpoint: None`) or uses `endpoint`; creates
    /// the bucket and refuses a server that ignores conditional PUTs, as the
    /// tests do. `proxy`: count through a rule-less FaultProxy instead of
    /// moto's log (the only way with a server the bench did not start).
    pub(crate) fn start(
        endpoint: Option<&str>,
        moto_bin: Option<PathBuf>,
        server_pid: Option<u32>,
        proxy: bool,
        dir: &Path,
    ) -> Result<S3Bench, BoxError> {
        let (server, server_endpoint, log, describe) = match endpoint {
            None => {
                let log = dir.join("moto-requests.log");
                let s = S3Server::start_logged(moto_bin, Some(&log))?;
                let e = s.endpoint.clone();
                let d = format!("moto (private, {e})");
                (Some(s), e, Some(log), d)
            }
            Some(e) => (None, e.trim_end_matches('/').to_string(), None, e.into()),
        };
        tk::create_bucket(&server_endpoint, BUCKET)?;
        tk::check_conditional_puts(&server_endpoint, BUCKET)?;
        let pid = server.as_ref().map(|s| s.pid()).or(server_pid);
        let (endpoint, counter) = if proxy {
            let upstream = server_endpoint
                .strip_prefix("http://")
                .ok_or("--s3-count-proxy needs an http:// endpoint")?
                .parse()?;
            let p = FaultProxy::start(upstream)?;
            (p.url(), Counter::Proxy(p))
        } else {
            match log {
                Some(l) => (server_endpoint.clone(), Counter::MotoLog(l)),
                None => (server_endpoint.clone(), Counter::None),
            }
        };
        Ok(S3Bench {
            endpoint,
            describe,
            counter,
            pid,
            _server: server,
        })
    }

    pub(crate) fn counted_by(&self) -> &'static str {
        match self.counter {
            Counter::MotoLog(_) => "moto's request log",
            Counter::Proxy(_) => "a rule-less FaultProxy in front of the server",
            Counter::None => "not counted (an external server: add --s3-count-proxy)",
        }
    }

    /// A fresh graph root under the bench bucket.
    pub(crate) fn root(&self, prefix: &str) -> Root {
        self.root_via(prefix, &self.endpoint)
    }

    /// What graphsink talks to (the proxy when counting through one).
    pub(crate) fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The root `prefix`, reached through `endpoint` (a proxy of a
    /// caller's own in front of this server).
    pub(crate) fn root_via(&self, prefix: &str, endpoint: &str) -> Root {
        Root {
            uri: format!("s3://{BUCKET}/{prefix}"),
            storage_toml: format!(
                "[graph.storage_options]\naws_endpoint = \"{}\"\naws_region = \"{}\"\n\
                 aws_access_key_id = \"{}\"\naws_secret_access_key = \"{}\"\naws_allow_http = \"true\"\n",
                endpoint,
                tk::REGION,
                tk::ACCESS_KEY,
                tk::SECRET_KEY
            ),
        }
    }

    pub(crate) fn mark(&self) -> Mark {
        Mark {
            at: Instant::now(),
            log_pos: match &self.counter {
                Counter::MotoLog(p) => std::fs::metadata(p).map_or(0, |m| m.len()),
                Counter::Proxy(p) => p.log().len() as u64,
                Counter::None => 0,
            },
            server_ticks: self.pid.and_then(cpu_ticks),
            self_ticks: cpu_ticks_self(),
        }
    }

    /// The load since `m`.
    pub(crate) fn since(&self, m: &Mark) -> Load {
        let secs = m.at.elapsed().as_secs_f64();
        let server_ticks = self.pid.and_then(cpu_ticks);
        let self_ticks = cpu_ticks_self();
        // moto logs a request once it has answered it; give the last ones
        // a moment to reach the file.
        if matches!(self.counter, Counter::MotoLog(_)) {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        let mut load = Load {
            secs,
            ..Default::default()
        };
        let mut add = |method: &str, target: &str, status: Option<u16>| {
            *load
                .requests
                .entry(format!("{method} {}", kind(target)))
                .or_default() += 1;
            *load.statuses.entry(status.unwrap_or(0)).or_default() += 1;
        };
        match &self.counter {
            Counter::MotoLog(p) => {
                for line in read_from(p, m.log_pos).lines() {
                    if let Some((method, target, status)) = parse_log_line(line) {
                        add(method, target, status);
                    }
                }
            }
            Counter::Proxy(p) => {
                for x in p.log().iter().skip(m.log_pos as usize) {
                    add(&x.method, &x.path, x.status);
                }
            }
            Counter::None => {}
        }
        load.total_requests = load.requests.values().sum();
        load.requests_per_s = load.total_requests as f64 / secs.max(1e-9);
        let cores = |t0: Option<u64>, t1: Option<u64>| {
            t0.zip(t1)
                .map(|(a, b)| b.saturating_sub(a) as f64 / TICKS_PER_S)
        };
        load.server_cpu_secs = cores(m.server_ticks, server_ticks);
        load.server_cpu_cores = load.server_cpu_secs.map(|s| s / secs.max(1e-9));
        load.bench_cpu_cores = cores(m.self_ticks, self_ticks).map(|s| s / secs.max(1e-9));
        load
    }
}

/// Linux's USER_HZ, the unit of /proc/PID/stat's CPU times (fixed at 100
/// for user space on every architecture Linux runs this on).
pub(crate) const TICKS_PER_S: f64 = 100.0;

fn cpu_ticks(pid: u32) -> Option<u64> {
    stat_ticks(&format!("/proc/{pid}/stat"))
}

pub(crate) fn cpu_ticks_self() -> Option<u64> {
    stat_ticks("/proc/self/stat")
}

/// utime + stime of every thread of the process.
fn stat_ticks(path: &str) -> Option<u64> {
    let s = std::fs::read_to_string(path).ok()?;
    // The command name may hold spaces and parentheses: fields start after
    // the last ')'. utime and stime are fields 14 and 15 (1-based).
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

fn read_from(path: &Path, pos: u64) -> String {
    let mut out = Vec::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        if f.seek(SeekFrom::Start(pos)).is_ok() {
            let _ = f.read_to_end(&mut out);
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// werkzeug's request line, ANSI colours and all:
/// `127.0.0.1 - - [date] "\x1b[33mPUT /b/k HTTP/1.1\x1b[0m" 404 -`.
fn parse_log_line(line: &str) -> Option<(&str, &str, Option<u16>)> {
    let open = line.find('"')?;
    let close = open + 1 + line[open + 1..].find('"')?;
    let mut req = line[open + 1..close].split_whitespace();
    let method = strip_ansi(req.next()?);
    let target = req.next()?;
    let status = line[close + 1..]
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok());
    Some((method, target, status))
}

fn strip_ansi(s: &str) -> &str {
    // A colour prefix is ESC [ digits ; digits m; the method follows the last 'm'.
    if s.starts_with('\u{1b}') {
        s.rfind('m').map_or(s, |i| &s[i + 1..])
    } else {
        s
    }
}

/// What an object key is, from the Lance and MemWAL layout:
/// `<table>/_mem_wal/<shard>/wal/<pos>.arrow` (a WAL entry),
/// `<table>/_mem_wal/<shard>/manifest/...` (the shard manifest),
/// `<table>/_mem_wal/<shard>/<hex>_gen_<g>/...` (a flushed generation),
/// `<table>/_versions/`, `data/`, `_transactions/`, ... of a table, and
/// `__manifest/...` (the graph's manifest table). Multipart steps and LISTs
/// are told apart by the query.
pub(crate) fn kind(target: &str) -> String {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    // A LIST names the bucket as its path and the key prefix in the query.
    let listed = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("prefix="))
        .map(|p| format!("/{}/", p.replace("%2F", "/").replace("%2f", "/")));
    let is_list = query.contains("list-type") || listed.is_some();
    let path = listed.as_deref().unwrap_or(path);
    let what = if path.contains("__manifest") {
        "__manifest"
    } else if path.contains("/_mem_wal/") {
        if path.contains("/wal/") {
            "wal entry"
        } else if path.contains("/manifest/") || path.ends_with("version_hint.json") {
            "shard manifest"
        } else if path.contains("_gen_") {
            "generation"
        } else {
            "_mem_wal other"
        }
    } else if path.contains("/_versions/") {
        "table version"
    } else if path.contains("/_transactions/") {
        "table transaction"
    } else if path.contains("/data/") {
        "table data"
    } else if path.contains("/_indices/") {
        "table index"
    } else if path.contains("/_deletions/") {
        "table deletions"
    } else {
        "other"
    };
    let step = if query.contains("uploads") && !query.contains("uploadId") {
        " (multipart start)"
    } else if query.contains("partNumber") {
        " (multipart part)"
    } else if query.contains("uploadId") {
        " (multipart end)"
    } else if is_list {
        " (list)"
    } else {
        ""
    };
    format!("{what}{step}")
}

/// A process's CPU over a stretch of wall time, in cores: the bench's
/// own, or another's by pid (the broker's).
pub(crate) struct SelfCpu(Instant, Option<u64>, Option<u32>);

impl SelfCpu {
    pub(crate) fn start() -> SelfCpu {
        SelfCpu(Instant::now(), cpu_ticks_self(), None)
    }

    /// `pid`'s CPU from now (`None`: nothing to measure, `cores` is `None`).
    pub(crate) fn of(pid: Option<u32>) -> SelfCpu {
        SelfCpu(Instant::now(), pid.and_then(cpu_ticks), pid)
    }

    pub(crate) fn cores(&self) -> Option<f64> {
        let secs = self.0.elapsed().as_secs_f64().max(1e-9);
        self.secs().map(|cpu| cpu / secs)
    }

    /// CPU seconds since the start (10 ms resolution).
    pub(crate) fn secs(&self) -> Option<f64> {
        let now = match self.2 {
            Some(pid) => cpu_ticks(pid),
            None => cpu_ticks_self(),
        };
        self.1
            .zip(now)
            .map(|(a, b)| b.saturating_sub(a) as f64 / TICKS_PER_S)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moto_log_lines_and_keys_are_classified() {
        let l = "127.0.0.1 - - [02/Dec/2026 01:29:21] \"\u{1b}[33mPUT /b/t/_mem_wal/ab/wal/0001.arrow HTTP/1.1\u{1b}[0m\" 200 -";
        let (m, t, s) = parse_log_line(l).unwrap();
        assert_eq!((m, s), ("PUT", Some(200)));
        assert_eq!(kind(t), "wal entry");
        let l = "127.0.0.1 - - [d] \"GET /b?list-type=2&prefix=x HTTP/1.1\" 200 -";
        let (m, t, _) = parse_log_line(l).unwrap();
        assert_eq!((m, kind(t).as_str()), ("GET", "other (list)"));
        assert_eq!(
            kind("/b?list-type=2&prefix=g%2Fnodes%2FItem%2F_mem_wal%2Fs%2Fwal%2F"),
            "wal entry (list)"
        );
        assert_eq!(
            kind("/b/g/nodes/Item/_mem_wal/s/1a2b_gen_3/data/x.lance?partNumber=2&uploadId=u"),
            "generation (multipart part)"
        );
        assert_eq!(kind("/b/g/__manifest/_versions/1.manifest"), "__manifest");
        assert_eq!(
            kind("/b/g/nodes/Item/_mem_wal/s/manifest/01.binpb"),
            "shard manifest"
        );
    }
}
