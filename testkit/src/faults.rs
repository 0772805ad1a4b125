//! A fault-injecting HTTP/1.1 proxy to put between an object store client
//! and a local S3 server (moto): delays, injected statuses, connections reset
//! before or after the request reached the server, and outages. It owns the
//! faults and the record of what it did; what a test concludes from them is
//! the test's business.
//!
//! Hand-rolled on tokio and httparse rather than hyper: the faults need the
//! raw socket (an RST is `SO_LINGER 0` on the very connection the client
//! sent on) and the exact bytes (SigV4 signs headers), and hyper hides both.
//!
//! Each client connection gets a fresh upstream connection per request.
//! Reusing one would mean guessing, when the server has closed it while
//! idle, whether a request that failed on it had landed; loopback connects
//! cost nothing.

mod http;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

use http::{Framing, Reader, RequestHead};

/// What a matching rule does to a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Wait, then forward as usual. The wait starts once the whole request
    /// is read, and the request is forwarded even if the client has given up
    /// meanwhile (a client timeout on a write that still lands).
    Delay(Duration),
    /// Answer with this status and an S3-style XML error, without forwarding.
    StatusBefore(u16),
    /// Forward, wait for the real reply, discard it, answer with this status.
    StatusAfter(u16),
    /// Reset the client connection (RST) without forwarding.
    ResetBefore,
    /// Forward, wait for the real reply, then reset the client connection:
    /// the write landed but the reply was lost.
    ResetAfter,
}

/// Which requests a fault applies to, and how often. `None` matches any
/// method or path; `times: None` means forever.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// Compared case-insensitively: `"PUT"`.
    pub method: Option<String>,
    /// A substring of the request target (path and query as sent, so
    /// percent-encoded): `"/_mem_wal/"`, `"_versions/"`.
    pub path_contains: Option<String>,
    pub fault: Fault,
    pub times: Option<u32>,
}

impl Rule {
    /// Every request, forever; narrow it with the methods below.
    pub fn new(fault: Fault) -> Rule {
        Rule {
            method: None,
            path_contains: None,
            fault,
            times: None,
        }
    }

    pub fn method(mut self, method: &str) -> Rule {
        self.method = Some(method.to_string());
        self
    }

    pub fn path_contains(mut self, part: &str) -> Rule {
        self.path_contains = Some(part.to_string());
        self
    }

    pub fn times(mut self, n: u32) -> Rule {
        self.times = Some(n);
        self
    }

    fn matches(&self, method: &str, target: &str) -> bool {
        self.method
            .as_deref()
            .is_none_or(|m| m.eq_ignore_ascii_case(method))
            && self
                .path_contains
                .as_deref()
                .is_none_or(|p| target.contains(p))
    }
}

/// Names a rule for [`FaultProxy::hits`] and [`FaultProxy::remove`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RuleId(u64);

/// One request the proxy saw and what it did with it, in the order the
/// outcomes were decided. Recorded before the client is answered, so a
/// client that has its answer finds the entry in [`FaultProxy::log`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exchange {
    pub method: String,
    /// The request target as sent (path and query).
    pub path: String,
    /// The status sent to the client; `None` when it was reset.
    pub status: Option<u16>,
    /// The status the upstream answered; `None` when the request was not
    /// forwarded or no full reply came back. `Some` means the request landed.
    pub upstream_status: Option<u16>,
    /// The rule that applied, if any.
    pub rule: Option<RuleId>,
    pub fault: Option<Fault>,
    /// Reset because an outage was on.
    pub outage: bool,
}

/// A running proxy on `127.0.0.1`, on its own thread and tokio runtime, so
/// it serves sync and async tests alike and outlives the runtime of the test
/// that started it. Dropping it stops it.
pub struct FaultProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    state: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub fn start(upstream: SocketAddr) -> io::Result<FaultProxy> {
        // Bound here, not on the proxy thread, so a failure is returned and
        // the port is known before the first request.
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()?;
        let state = Arc::new(Shared::default());
        let (stop, stopped) = oneshot::channel();
        let served = Arc::clone(&state);
        let thread = std::thread::Builder::new()
            .name(format!("fault-proxy-{}", addr.port()))
            .spawn(move || {
                runtime.block_on(async move {
                    // from_std needs the runtime's reactor, so it happens in here.
                    match TcpListener::from_std(listener) {
                        Ok(listener) => accept_loop(listener, upstream, served, stopped).await,
                        Err(e) => eprintln!("fault proxy {addr}: {e}"),
                    }
                });
                // Dropping the runtime here cancels the connection tasks.
            })?;
        Ok(FaultProxy {
            addr,
            upstream,
            state,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, for an S3 endpoint setting.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// Adds a rule after the existing ones; the first matching rule with
    /// uses left applies.
    pub fn add(&self, rule: Rule) -> RuleId {
        let mut s = self.state.lock();
        s.next_rule += 1;
        let id = RuleId(s.next_rule);
        s.hits.insert(id, 0);
        s.rules.push(ActiveRule {
            id,
            left: rule.times,
            rule,
        });
        id
    }

    /// Removes one rule; false if it was not there.
    pub fn remove(&self, id: RuleId) -> bool {
        let mut s = self.state.lock();
        let before = s.rules.len();
        s.rules.retain(|r| r.id != id);
        s.rules.len() != before
    }

    /// Removes every rule. Hit counts and the log stay; an outage stays on.
    pub fn clear(&self) {
        self.state.lock().rules.clear();
    }

    /// How many requests a rule has applied to so far.
    pub fn hits(&self, id: RuleId) -> u32 {
        self.state.lock().hits.get(&id).copied().unwrap_or(0)
    }

    /// For `length` from now, every request is answered with an RST, on new
    /// and kept-alive connections alike. (The TCP connect itself still
    /// succeeds: the kernel accepts on a listening port; a real refusal would
    /// mean giving the port up.)
    pub fn outage(&self, length: Duration) {
        self.state.lock().outage = Some(OutageEnd::At(Instant::now() + length));
    }

    /// Like [`outage`](Self::outage), until [`end_outage`](Self::end_outage).
    pub fn outage_until_cleared(&self) {
        self.state.lock().outage = Some(OutageEnd::Cleared);
    }

    pub fn end_outage(&self) {
        self.state.lock().outage = None;
    }

    pub fn in_outage(&self) -> bool {
        self.state.lock().in_outage()
    }

    /// Every request seen so far, oldest first.
    pub fn log(&self) -> Vec<Exchange> {
        self.state.lock().log.clone()
    }

    pub fn clear_log(&self) {
        self.state.lock().log.clear();
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[derive(Default)]
struct Shared(Mutex<State>);

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking test thread must not take the proxy down with it.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[derive(Default)]
struct State {
    next_rule: u64,
    rules: Vec<ActiveRule>,
    /// Kept apart from `rules` so counts survive `clear` and `remove`.
    hits: HashMap<RuleId, u32>,
    outage: Option<OutageEnd>,
    log: Vec<Exchange>,
}

struct ActiveRule {
    id: RuleId,
    rule: Rule,
    left: Option<u32>,
}

#[derive(Clone, Copy)]
enum OutageEnd {
    At(Instant),
    Cleared,
}

impl State {
    fn in_outage(&mut self) -> bool {
        match self.outage {
            Some(OutageEnd::At(end)) if Instant::now() >= end => {
                self.outage = None;
                false
            }
            Some(_) => true,
            None => false,
        }
    }

    /// The first matching rule with uses left, counting the use.
    fn take_rule(&mut self, method: &str, target: &str) -> Option<(RuleId, Fault)> {
        let active = self
            .rules
            .iter_mut()
            .find(|r| r.left != Some(0) && r.rule.matches(method, target))?;
        if let Some(left) = active.left.as_mut() {
            *left -= 1;
        }
        let taken = (active.id, active.rule.fault.clone());
        *self.hits.entry(taken.0).or_default() += 1;
        Some(taken)
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    state: Arc<Shared>,
    mut stopped: oneshot::Receiver<()>,
) {
    loop {
        tokio::select! {
            // Stop first: a drop must not wait behind a stream of connects.
            biased;
            _ = &mut stopped => return,
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    let _ = client.set_nodelay(true);
                    tokio::spawn(serve(client, upstream, Arc::clone(&state)));
                }
                // Out of file descriptors and the like: back off, keep serving.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
        }
    }
}

/// What the client gets for one request.
enum Answer {
    Bytes { bytes: Vec<u8>, close: bool },
    Reset,
}

/// One client connection: requests in turn until the client closes, a
/// reply ends the connection, or a fault resets it.
async fn serve(client: TcpStream, upstream: SocketAddr, state: Arc<Shared>) {
    let mut client = Reader::new(client);
    // A broken or garbled client connection is simply dropped, as a server would.
    while let Ok(Some(head)) = client.request_head().await {
        let mut seen = Exchange {
            method: head.method.clone(),
            path: head.target.clone(),
            status: None,
            upstream_status: None,
            rule: None,
            fault: None,
            outage: false,
        };
        if state.lock().in_outage() {
            seen.outage = true;
            state.lock().log.push(seen);
            reset(client.get_ref());
            return;
        }
        let Ok(framing) = head.framing() else {
            let bytes = s3_error(400, &head);
            seen.status = Some(400);
            state.lock().log.push(seen);
            let _ = client.get_mut().write_all(&bytes).await;
            return;
        };
        // The proxy wants the whole body before deciding anything, so it
        // says go ahead itself; an upstream 100 is then skipped.
        if head.expects_continue() && framing != Framing::None {
            let go_on = b"HTTP/1.1 100 Continue\r\n\r\n";
            if client.get_mut().write_all(go_on).await.is_err() {
                return;
            }
        }
        let Ok(body) = client.body(framing).await else {
            return;
        };
        let fault = state.lock().take_rule(&head.method, &head.target);
        if let Some((id, fault)) = &fault {
            seen.rule = Some(*id);
            seen.fault = Some(fault.clone());
        }
        let answer = answer(&head, &body, fault.map(|f| f.1), upstream, &mut seen).await;
        match answer {
            Answer::Reset => {
                state.lock().log.push(seen);
                reset(client.get_ref());
                return;
            }
            Answer::Bytes { bytes, close } => {
                state.lock().log.push(seen);
                if client.get_mut().write_all(&bytes).await.is_err() || close {
                    return;
                }
            }
        }
    }
}

async fn answer(
    head: &RequestHead,
    body: &[u8],
    fault: Option<Fault>,
    upstream: SocketAddr,
    seen: &mut Exchange,
) -> Answer {
    let client_closes = head.headers.closes(head.minor_version);
    let injected = |status: u16, seen: &mut Exchange| {
        seen.status = Some(status);
        Answer::Bytes {
            bytes: s3_error(status, head),
            close: client_closes,
        }
    };
    match fault {
        Some(Fault::StatusBefore(status)) => return injected(status, seen),
        Some(Fault::ResetBefore) => return Answer::Reset,
        Some(Fault::Delay(wait)) => tokio::time::sleep(wait).await,
        _ => {}
    }
    let reply = forward(head, body, upstream).await;
    if let Ok(reply) = &reply {
        seen.upstream_status = Some(reply.status);
    }
    match (fault, reply) {
        (Some(Fault::StatusAfter(status)), _) => injected(status, seen),
        (Some(Fault::ResetAfter), _) => Answer::Reset,
        (_, Ok(reply)) => {
            seen.status = Some(reply.status);
            Answer::Bytes {
                bytes: reply.raw,
                close: client_closes || reply.closes,
            }
        }
        // Upstream down or broken: what a gateway says.
        (_, Err(_)) => injected(502, seen),
    }
}

/// The upstream's full reply, raw.
struct Reply {
    status: u16,
    raw: Vec<u8>,
    /// The client must not reuse its connection after this reply.
    closes: bool,
}

async fn forward(head: &RequestHead, body: &[u8], upstream: SocketAddr) -> io::Result<Reply> {
    let mut stream = TcpStream::connect(upstream).await?;
    stream.set_nodelay(true)?;
    stream.write_all(&head.raw).await?;
    stream.write_all(body).await?;
    let mut reader = Reader::new(stream);
    loop {
        let reply = reader.response_head().await?;
        // Interim replies (100 Continue to a forwarded Expect): the client
        // already had its 100 from the proxy.
        if (100..200).contains(&reply.status) && reply.status != 101 {
            continue;
        }
        let framing = reply.framing(&head.method)?;
        let mut raw = reply.raw;
        raw.extend_from_slice(&reader.body(framing).await?);
        return Ok(Reply {
            status: reply.status,
            raw,
            closes: framing == Framing::UntilClose || reply.headers.closes(reply.minor_version),
        });
    }
}

/// Closes with an RST instead of a FIN: with a zero linger the kernel drops
/// the connection at once, so the client sees ECONNRESET, not a clean end.
fn reset(stream: &TcpStream) {
    let _ = stream.set_zero_linger();
    // The caller drops the stream right after, which sends the RST.
}

/// An injected reply shaped like S3's, so the client's error handling takes
/// the path it takes for the real thing.
fn s3_error(status: u16, head: &RequestHead) -> Vec<u8> {
    let (reason, code) = match status {
        400 => ("Bad Request", "InvalidRequest"),
        403 => ("Forbidden", "AccessDenied"),
        404 => ("Not Found", "NoSuchKey"),
        409 => ("Conflict", "ConditionalRequestConflict"),
        412 => ("Precondition Failed", "PreconditionFailed"),
        429 => ("Too Many Requests", "SlowDown"),
        500 => ("Internal Server Error", "InternalError"),
        502 => ("Bad Gateway", "BadGateway"),
        503 => ("Service Unavailable", "SlowDown"),
        504 => ("Gateway Timeout", "GatewayTimeout"),
        _ => ("Injected", "InjectedFault"),
    };
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code>\
         <Message>injected by graphsink-testkit FaultProxy</Message>\
         <Resource>{}</Resource><RequestId>faultproxy</RequestId></Error>",
        xml_escape(&head.target)
    );
    // A reply to HEAD carries no body.
    let body = if head.method.eq_ignore_ascii_case("HEAD") {
        String::new()
    } else {
        body
    };
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\n\
         Content-Length: {}\r\nx-amz-request-id: faultproxy\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
