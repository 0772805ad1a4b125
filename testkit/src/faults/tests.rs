//! Each fault proven on the wire: a blocking std client on one side, a tiny
//! upstream recording the raw bytes it received on the other.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream as StdStream};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

use super::http::Reader;
use super::{Fault, FaultProxy, Rule};

const WAL_PUT: &str = "/bucket/t.lance/_mem_wal/5f0c/wal/0001.arrow";

/// One request as the upstream read it off the wire.
#[derive(Clone, Debug)]
struct Received {
    method: String,
    target: String,
    raw: Vec<u8>,
}

/// Answers every request with a canned reply chosen by its target, and
/// records what it got. Runs on its own thread like the proxy.
struct Upstream {
    addr: SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Upstream {
    fn start() -> Upstream {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&received);
        let (stop, mut stopped) = oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let thread = std::thread::spawn(move || {
            runtime.block_on(async move {
                let listener = TcpListener::from_std(listener).unwrap();
                loop {
                    tokio::select! {
                        _ = &mut stopped => return,
                        Ok((conn, _)) = listener.accept() => {
                            tokio::spawn(upstream_conn(conn, Arc::clone(&record)));
                        }
                    }
                }
            })
        });
        Upstream {
            addr,
            received,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.stop.take().map(|s| s.send(()));
        let _ = self.thread.take().map(|t| t.join());
    }
}

async fn upstream_conn(conn: TcpStream, record: Arc<Mutex<Vec<Received>>>) {
    let mut conn = Reader::new(conn);
    while let Ok(Some(head)) = conn.request_head().await {
        if head.expects_continue() {
            // What werkzeug does; the proxy must not pass it on a second time.
            let _ = conn
                .get_mut()
                .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                .await;
        }
        let body = conn.body(head.framing().unwrap()).await.unwrap();
        let mut raw = head.raw.clone();
        raw.extend_from_slice(&body);
        record.lock().unwrap().push(Received {
            method: head.method.clone(),
            target: head.target.clone(),
            raw,
        });
        let (reply, close) = canned(&head.method, &head.target, body.len());
        if conn.get_mut().write_all(&reply).await.is_err() || close {
            return;
        }
    }
}

/// The reply for a target, and whether the connection ends after it.
fn canned(method: &str, target: &str, body_len: usize) -> (Vec<u8>, bool) {
    if method == "HEAD" {
        // A length but no body, as for a real HEAD.
        let head = "HTTP/1.1 200 OK\r\nContent-Length: 11\r\nETag: \"e\"\r\n\r\n";
        return (head.into(), false);
    }
    if target.contains("/chunked") {
        let reply = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
                     5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
        return (reply.into(), false);
    }
    if target.contains("/close") {
        // HTTP/1.0 style: the body ends where the connection does.
        return ("HTTP/1.0 200 OK\r\n\r\nuntil close".into(), true);
    }
    let body = format!("{method} {target} {body_len}");
    let reply = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    (reply.into(), false)
}

/// A blocking HTTP/1.1 client, written apart from the proxy's reader so a
/// framing bug in one is not mirrored in the other.
struct Client {
    stream: StdStream,
    buf: Vec<u8>,
}

#[derive(Debug)]
struct Response {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl Client {
    fn connect(addr: SocketAddr) -> Client {
        let stream = StdStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        Client {
            stream,
            buf: Vec::new(),
        }
    }

    fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)
    }

    fn request(&mut self, method: &str, path: &str, body: &[u8]) -> io::Result<Response> {
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        self.send(head.as_bytes())?;
        self.send(body)?;
        self.response(method == "HEAD")
    }

    /// Reads more; an EOF is an error unless `eof_ok`.
    fn fill(&mut self, eof_ok: bool) -> io::Result<bool> {
        let mut chunk = [0u8; 4096];
        let n = self.stream.read(&mut chunk)?;
        if n == 0 && !eof_ok {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n > 0)
    }

    fn take(&mut self, n: usize) -> io::Result<Vec<u8>> {
        while self.buf.len() < n {
            self.fill(false)?;
        }
        Ok(self.buf.drain(..n).collect())
    }

    fn line(&mut self) -> io::Result<String> {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line: Vec<u8> = self.buf.drain(..i + 2).collect();
                return Ok(String::from_utf8_lossy(&line[..i]).into_owned());
            }
            self.fill(false)?;
        }
    }

    fn response(&mut self, to_head: bool) -> io::Result<Response> {
        let end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            self.fill(false)?;
        };
        let head = String::from_utf8_lossy(&self.buf[..end]).to_ascii_lowercase();
        self.buf.drain(..end);
        let status: u16 = head[9..12].parse().unwrap();
        let header = |name: &str| {
            head.lines()
                .find_map(|l| l.strip_prefix(&format!("{name}: ")))
                .map(str::to_string)
        };
        let body = if to_head || (100..200).contains(&status) {
            Vec::new()
        } else if header("transfer-encoding").as_deref() == Some("chunked") {
            let mut body = Vec::new();
            loop {
                let size = usize::from_str_radix(&self.line()?, 16).unwrap();
                if size == 0 {
                    while !self.line()?.is_empty() {}
                    break body;
                }
                body.extend(self.take(size)?);
                self.take(2)?;
            }
        } else if let Some(n) = header("content-length") {
            self.take(n.parse().unwrap())?
        } else {
            while self.fill(true)? {}
            std::mem::take(&mut self.buf)
        };
        Ok(Response { status, head, body })
    }
}

fn setup() -> (Upstream, FaultProxy) {
    let upstream = Upstream::start();
    let proxy = FaultProxy::start(upstream.addr).unwrap();
    (upstream, proxy)
}

fn assert_reset(result: io::Result<Response>) {
    match result {
        Err(e) => assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}"),
        Ok(r) => panic!("expected a reset, got {r:?}"),
    }
}

#[test]
fn forward_and_keep_the_connection_alive() {
    let (upstream, proxy) = setup();
    assert_eq!(proxy.url(), format!("http://{}", proxy.addr()));
    let mut client = Client::connect(proxy.addr());
    let got = client.request("GET", "/bucket/a", b"").unwrap();
    assert_eq!(
        (got.status, got.body.as_slice()),
        (200, &b"GET /bucket/a 0"[..])
    );
    let got = client.request("PUT", WAL_PUT, b"arrow bytes").unwrap();
    assert_eq!(got.body, format!("PUT {WAL_PUT} 11").into_bytes());
    let got = client.request("HEAD", "/bucket/a", b"").unwrap();
    assert_eq!(got.status, 200);
    assert!(got.head.contains("content-length: 11"), "{}", got.head);
    let got = client.request("GET", "/bucket/b", b"").unwrap();
    assert_eq!(got.body, b"GET /bucket/b 0");

    let received = upstream.received();
    assert_eq!(received.len(), 4);
    let sent = format!(
        "PUT {WAL_PUT} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 11\r\n\r\narrow bytes"
    );
    assert_eq!(received[1].raw, sent.as_bytes(), "forwarded byte for byte");
    let log = proxy.log();
    assert_eq!(log.len(), 4);
    assert!(log
        .iter()
        .all(|e| e.status == Some(200) && e.upstream_status == Some(200) && e.fault.is_none()));
    assert_eq!(
        (log[2].method.as_str(), log[2].path.as_str()),
        ("HEAD", "/bucket/a")
    );
}

#[test]
fn chunked_request_body_is_forwarded_intact() {
    let (upstream, proxy) = setup();
    let mut client = Client::connect(proxy.addr());
    let head = format!("PUT {WAL_PUT} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
    let body = "4\r\nWiki\r\n5;name=ext\r\npedia\r\n0\r\nx-trailer: t\r\n\r\n";
    client.send(head.as_bytes()).unwrap();
    // Split mid-chunk, so the proxy has to read across packets.
    client.send(&body.as_bytes()[..12]).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    client.send(&body.as_bytes()[12..]).unwrap();
    let got = client.response(false).unwrap();
    assert_eq!(got.status, 200);
    // The framing was right: the next request on the connection works.
    assert_eq!(
        client.request("GET", "/bucket/next", b"").unwrap().status,
        200
    );

    let received = upstream.received();
    assert_eq!(received[0].raw, format!("{head}{body}").into_bytes());
    assert_eq!(received[1].target, "/bucket/next");
}

#[test]
fn chunked_and_until_close_replies_are_relayed() {
    let (_upstream, proxy) = setup();
    let mut client = Client::connect(proxy.addr());
    let got = client.request("GET", "/bucket/chunked", b"").unwrap();
    assert_eq!(got.body, b"hello world");
    let got = client.request("GET", "/bucket/close", b"").unwrap();
    assert_eq!(got.body, b"until close");
    assert_eq!(proxy.log().len(), 2);
}

#[test]
fn expect_100_continue_gets_one_continue_then_the_reply() {
    let (upstream, proxy) = setup();
    let mut client = Client::connect(proxy.addr());
    let head = "PUT /bucket/continue HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n";
    client.send(head.as_bytes()).unwrap();
    assert_eq!(client.response(false).unwrap().status, 100);
    client.send(b"hello").unwrap();
    let got = client.response(false).unwrap();
    assert_eq!(
        (got.status, got.body.as_slice()),
        (200, &b"PUT /bucket/continue 5"[..])
    );
    // The upstream's own 100 was not passed on: the next reply lines up.
    let got = client.request("GET", "/bucket/after", b"").unwrap();
    assert_eq!(got.body, b"GET /bucket/after 0");
    assert!(upstream.received()[0].raw.ends_with(b"\r\n\r\nhello"));
}

#[test]
fn delay_adds_at_least_the_delay_then_forwards() {
    let (upstream, proxy) = setup();
    let wait = Duration::from_millis(300);
    let rule = proxy.add(Rule::new(Fault::Delay(wait)).method("GET").times(1));
    let mut client = Client::connect(proxy.addr());
    let started = Instant::now();
    assert_eq!(client.request("GET", "/bucket/a", b"").unwrap().status, 200);
    assert!(started.elapsed() >= wait, "{:?}", started.elapsed());
    assert_eq!(client.request("GET", "/bucket/a", b"").unwrap().status, 200);
    assert_eq!(proxy.hits(rule), 1);
    assert_eq!(upstream.received().len(), 2);
    let log = proxy.log();
    assert_eq!(log[0].fault, Some(Fault::Delay(wait)));
    assert_eq!(log[1].fault, None);
}

#[test]
fn status_before_answers_without_forwarding() {
    let (upstream, proxy) = setup();
    let put = proxy.add(Rule::new(Fault::StatusBefore(503)).method("PUT").times(1));
    let head = proxy.add(Rule::new(Fault::StatusBefore(404)).method("HEAD").times(1));
    let mut client = Client::connect(proxy.addr());
    let got = client.request("PUT", WAL_PUT, b"arrow bytes").unwrap();
    assert_eq!(got.status, 503);
    let xml = String::from_utf8(got.body).unwrap();
    assert!(xml.contains("<Code>SlowDown</Code>"), "{xml}");
    let got = client.request("HEAD", "/bucket/missing", b"").unwrap();
    assert_eq!((got.status, got.body.len()), (404, 0));
    assert!(upstream.received().is_empty());
    // Still in step on the same connection, and the rules are used up.
    assert_eq!(client.request("PUT", WAL_PUT, b"x").unwrap().status, 200);
    assert_eq!((proxy.hits(put), proxy.hits(head)), (1, 1));
    assert_eq!(upstream.received().len(), 1);
    let first = &proxy.log()[0];
    assert_eq!((first.status, first.upstream_status), (Some(503), None));
    assert_eq!(first.rule, Some(put));
}

#[test]
fn status_after_forwards_and_replaces_the_reply() {
    let (upstream, proxy) = setup();
    proxy.add(Rule::new(Fault::StatusAfter(500)).path_contains("_mem_wal"));
    let mut client = Client::connect(proxy.addr());
    let got = client.request("PUT", WAL_PUT, b"arrow bytes").unwrap();
    assert_eq!(got.status, 500);
    assert!(String::from_utf8_lossy(&got.body).contains("InternalError"));
    assert_eq!(upstream.received()[0].method, "PUT");
    let entry = &proxy.log()[0];
    assert_eq!(
        (entry.status, entry.upstream_status),
        (Some(500), Some(200))
    );
}

#[test]
fn reset_before_drops_the_connection_without_forwarding() {
    let (upstream, proxy) = setup();
    let rule = proxy.add(Rule::new(Fault::ResetBefore).times(1));
    let mut client = Client::connect(proxy.addr());
    assert_reset(client.request("PUT", WAL_PUT, b"arrow bytes"));
    assert!(upstream.received().is_empty());
    assert_eq!(proxy.hits(rule), 1);
    let entry = &proxy.log()[0];
    assert_eq!((entry.status, entry.upstream_status), (None, None));
    // A new connection goes through.
    let mut client = Client::connect(proxy.addr());
    assert_eq!(client.request("PUT", WAL_PUT, b"x").unwrap().status, 200);
}

#[test]
fn reset_after_lands_the_write_and_loses_the_reply() {
    let (upstream, proxy) = setup();
    proxy.add(Rule::new(Fault::ResetAfter).method("PUT").times(1));
    let mut client = Client::connect(proxy.addr());
    assert_reset(client.request("PUT", WAL_PUT, b"arrow bytes"));
    let received = upstream.received();
    assert_eq!(received.len(), 1);
    assert!(received[0].raw.ends_with(b"arrow bytes"));
    let entry = &proxy.log()[0];
    assert_eq!((entry.status, entry.upstream_status), (None, Some(200)));
    assert_eq!(entry.fault, Some(Fault::ResetAfter));
}

#[test]
fn rules_match_by_method_path_and_count_in_order() {
    let (upstream, proxy) = setup();
    let first = proxy.add(
        Rule::new(Fault::StatusBefore(503))
            .method("put")
            .path_contains("/_mem_wal/")
            .times(2),
    );
    let second = proxy.add(Rule::new(Fault::StatusBefore(500)).method("PUT"));
    let mut client = Client::connect(proxy.addr());
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(client.request("PUT", WAL_PUT, b"x").unwrap().status);
    }
    statuses.push(client.request("PUT", "/bucket/other", b"x").unwrap().status);
    statuses.push(client.request("GET", WAL_PUT, b"").unwrap().status);
    assert_eq!(statuses, [503, 503, 500, 500, 200]);
    assert_eq!((proxy.hits(first), proxy.hits(second)), (2, 2));

    assert!(proxy.remove(second));
    assert!(!proxy.remove(second));
    proxy.add(Rule::new(Fault::ResetBefore));
    proxy.clear();
    assert_eq!(client.request("PUT", WAL_PUT, b"x").unwrap().status, 200);
    assert_eq!(proxy.hits(second), 2, "counts outlive the rule");
    assert_eq!(upstream.received().len(), 2);
}

#[test]
fn outage_resets_everything_then_recovers() {
    let (upstream, proxy) = setup();
    let mut kept = Client::connect(proxy.addr());
    assert_eq!(kept.request("GET", "/bucket/a", b"").unwrap().status, 200);

    proxy.outage(Duration::from_millis(400));
    assert!(proxy.in_outage());
    assert_reset(kept.request("GET", "/bucket/a", b""));
    assert_reset(Client::connect(proxy.addr()).request("PUT", WAL_PUT, b"x"));
    std::thread::sleep(Duration::from_millis(500));
    assert!(!proxy.in_outage());
    let mut client = Client::connect(proxy.addr());
    assert_eq!(client.request("PUT", WAL_PUT, b"x").unwrap().status, 200);

    assert_eq!(
        upstream.received().len(),
        2,
        "nothing reached it during the outage"
    );
    let outage: Vec<bool> = proxy.log().iter().map(|e| e.outage).collect();
    assert_eq!(outage, [false, true, true, false]);
}

#[test]
fn outage_until_cleared_lasts_until_ended() {
    let (_upstream, proxy) = setup();
    proxy.outage_until_cleared();
    std::thread::sleep(Duration::from_millis(100));
    assert_reset(Client::connect(proxy.addr()).request("GET", "/bucket/a", b""));
    proxy.end_outage();
    let got = Client::connect(proxy.addr()).request("GET", "/bucket/a", b"");
    assert_eq!(got.unwrap().status, 200);
}

#[test]
fn upstream_down_is_a_502() {
    let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = gone.local_addr().unwrap();
    drop(gone);
    let proxy = FaultProxy::start(addr).unwrap();
    let got = Client::connect(proxy.addr()).request("GET", "/bucket/a", b"");
    assert_eq!(got.unwrap().status, 502);
}

#[test]
fn dropping_the_proxy_stops_it() {
    let (_upstream, proxy) = setup();
    let addr = proxy.addr();
    drop(proxy);
    let refused = StdStream::connect(addr).unwrap_err();
    assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);
}

#[tokio::test]
async fn proxy_serves_an_async_test_and_drops_inside_it() {
    let (upstream, proxy) = setup();
    let addr = proxy.addr();
    let got =
        tokio::task::spawn_blocking(move || Client::connect(addr).request("GET", "/bucket/a", b""))
            .await
            .unwrap();
    assert_eq!(got.unwrap().status, 200);
    // Dropping inside a runtime must not panic: the proxy's runtime is
    // dropped on the proxy's own thread.
    drop(proxy);
    drop(upstream);
}

/// The `io::ErrorKind` at the bottom of an error chain, if there is one.
fn io_kind(e: &(dyn std::error::Error + 'static)) -> Option<io::ErrorKind> {
    let mut at = Some(e);
    while let Some(e) = at {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            return Some(io.kind());
        }
        at = e.source();
    }
    None
}

// What the client under Lance (reqwest 0.13 over hyper, through
// object_store 0.14) makes of a reset: a request error with
// ConnectionReset inside, and no resend of its own. object_store reads
// that as "interrupted" and retries it only for idempotent requests.
#[tokio::test]
async fn reqwest_gets_a_lost_reply_as_a_reset_and_does_not_resend() {
    let (upstream, proxy) = setup();
    let client = reqwest::Client::new();
    let url = format!("{}{WAL_PUT}", proxy.url());
    // Warm the pool, so the PUT goes out on a reused connection.
    let warm = client.get(&url).send().await.unwrap();
    assert_eq!(
        warm.bytes().await.unwrap().as_ref(),
        format!("GET {WAL_PUT} 0").as_bytes()
    );
    proxy.add(Rule::new(Fault::ResetAfter).method("PUT").times(1));

    let lost = client
        .put(&url)
        .body("arrow bytes")
        .send()
        .await
        .unwrap_err();
    assert!(lost.is_request() && !lost.is_connect(), "{lost:?}");
    assert_eq!(
        io_kind(&lost),
        Some(io::ErrorKind::ConnectionReset),
        "{lost:?}"
    );
    let puts = upstream
        .received()
        .iter()
        .filter(|r| r.method == "PUT")
        .count();
    assert_eq!(
        puts, 1,
        "the write landed once, and hyper did not send it again"
    );
    // The broken connection left the pool; the next request just works.
    assert_eq!(
        client
            .put(&url)
            .body("again")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

#[tokio::test]
async fn reqwest_gets_an_outage_on_a_pooled_connection_as_a_reset() {
    let (_upstream, proxy) = setup();
    let client = reqwest::Client::new();
    let url = format!("{}/bucket/a", proxy.url());
    client
        .get(&url)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    proxy.outage_until_cleared();
    let refused = client.get(&url).send().await.unwrap_err();
    assert_eq!(
        io_kind(&refused),
        Some(io::ErrorKind::ConnectionReset),
        "{refused:?}"
    );
    let outage = proxy.log().iter().filter(|e| e.outage).count();
    assert_eq!(outage, 1, "no hidden retry on a fresh connection");
    proxy.end_outage();
    assert_eq!(client.get(&url).send().await.unwrap().status(), 200);
}
