//! A small Schema Registry for the tests: the subset of the Confluent REST
//! API that serializers and graphsink use, in memory, on a free loopback
//! port, with the faults a real registry is hard to make (stopped, slow,
//! 5xx). It logs every request, and records any it does not implement:
//! dropping it with such a request panics, so a client that grows a new
//! call fails the test that made it rather than passing against a guess.
//!
//! Served (also under `/apis/ccompat/v7`, Apicurio's prefix):
//! - `POST /subjects/{s}/versions`: register; an identical schema (text,
//!   type, references) gets the id it already has, and no new version;
//! - `POST /subjects/{s}`: look a schema up under a subject;
//! - `GET /schemas/ids/{id}` (with `subject` and `format`): the schema; with
//!   `format=serialized`, the base64 `FileDescriptorProto` a test gave with
//!   [`TestRegistry::set_serialized`], else the text, as a registry that
//!   cannot serialize answers;
//! - `GET /subjects`, `GET /subjects/{s}/versions[/{v}|/latest]`;
//! - `GET|PUT /config`.
//!
//! Everything else is a JSON 404 (`{"error_code": 40403, ...}`); `GET
//! /associations/...` (newer clients ask it) is expected, and not recorded.
//!
//! [`TestRegistry::start_secured`] serves it over TLS (a certificate and
//! key in PEM, e.g. from [`crate::certs`]) and with HTTP basic auth, as a
//! production registry is: a request without the right credentials is a
//! 401 (`{"error_code": 40101}`) and changes nothing.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio_rustls::TlsAcceptor;

use crate::tls::{acceptor, serve_on_thread, Served};

/// How a registry is reached beyond plain HTTP.
#[derive(Debug, Clone, Default)]
pub struct Security {
    /// The server's certificate (chain) and its PKCS#8 key, both PEM
    /// files: serve `https://`.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// The `(user, password)` every request must carry in HTTP basic auth.
    pub basic_auth: Option<(String, String)>,
}

/// One schema as stored: ids are positions + 1.
#[derive(Clone, Debug, PartialEq)]
struct Stored {
    schema_type: String,
    schema: String,
    references: Value,
    /// `format=serialized`, if a test gave it.
    serialized: Option<String>,
}

/// One request as served.
#[derive(Clone, Debug)]
pub struct Logged {
    pub method: String,
    pub path: String,
    pub status: u16,
    /// The `Authorization` header, as sent.
    pub authorization: Option<String>,
}

#[derive(Default)]
struct State {
    schemas: Vec<Stored>,
    /// Subject → the id of each version (version n at index n - 1).
    subjects: BTreeMap<String, Vec<u32>>,
    compatibility: Option<String>,
    log: Vec<Logged>,
    unimplemented: Vec<String>,
    delay: Duration,
    /// An injected status, and how many requests it still applies to.
    fail: Option<(u16, u32)>,
    /// The `Authorization` header every request must carry, if any.
    required: Option<String>,
}

pub struct TestRegistry {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    server: Option<Served>,
    tls: Option<TlsAcceptor>,
}

impl TestRegistry {
    /// Serves plain HTTP on a free loopback port.
    pub fn start() -> io::Result<TestRegistry> {
        TestRegistry::start_secured(&Security::default())
    }

    /// Serves on a free loopback port as `security` says.
    pub fn start_secured(security: &Security) -> io::Result<TestRegistry> {
        let tls = match &security.tls {
            Some((cert, key)) => Some(acceptor(cert, key)?),
            None => None,
        };
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State {
            required: security.basic_auth.as_ref().map(|(user, password)| {
                use base64::Engine as _;
                let pair = format!("{user}:{password}");
                format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(pair)
                )
            }),
            ..State::default()
        }));
        let server = Some(serve(listener, Arc::clone(&state), tls.clone())?);
        Ok(TestRegistry {
            addr,
            state,
            server,
            tls,
        })
    }

    /// `http://127.0.0.1:PORT` (`https://` over TLS), for
    /// `schema_registry.url`.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving: the port refuses connections, open ones are closed.
    /// What it holds stays for [`restart`](Self::restart).
    pub fn stop(&mut self) {
        if let Some(mut s) = self.server.take() {
            s.stop();
        }
    }

    /// Serves again on the same port, with the same schemas.
    pub fn restart(&mut self) -> io::Result<()> {
        self.stop();
        let listener = std::net::TcpListener::bind(self.addr)?;
        self.server = Some(serve(listener, Arc::clone(&self.state), self.tls.clone())?);
        Ok(())
    }

    /// Every request waits this long before it is answered.
    pub fn set_delay(&self, d: Duration) {
        self.lock().delay = d;
    }

    /// The next `times` requests are answered with `status` (a JSON error).
    pub fn fail_next(&self, status: u16, times: u32) {
        self.lock().fail = Some((status, times));
    }

    /// No delay, no injected status.
    pub fn clear_faults(&self) {
        let mut s = self.lock();
        s.delay = Duration::ZERO;
        s.fail = None;
    }

    /// Registers a schema directly (no request logged); its id.
    pub fn register(
        &self,
        subject: &str,
        schema_type: &str,
        schema: &str,
        references: Value,
    ) -> u32 {
        let mut s = self.lock();
        register(&mut s, subject, schema_type, schema, references)
    }

    /// What `GET /schemas/ids/{id}?format=serialized` returns for `id`.
    pub fn set_serialized(&self, id: u32, base64: &str) {
        let mut s = self.lock();
        if let Some(stored) = s.schemas.get_mut(id as usize - 1) {
            stored.serialized = Some(base64.to_string());
        }
    }

    /// Every request served so far.
    pub fn requests(&self) -> Vec<Logged> {
        self.lock().log.clone()
    }

    /// Requests this registry does not implement (`METHOD path`).
    pub fn unimplemented(&self) -> Vec<String> {
        self.lock().unimplemented.clone()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        self.stop();
        let missing = self.unimplemented();
        if !missing.is_empty() && !std::thread::panicking() {
            panic!("the test registry was asked what it does not implement: {missing:?}");
        }
    }
}

fn serve(
    listener: std::net::TcpListener,
    state: Arc<Mutex<State>>,
    tls: Option<TlsAcceptor>,
) -> io::Result<Served> {
    serve_on_thread("test-registry", listener, move |stream| {
        let state = Arc::clone(&state);
        let tls = tls.clone();
        async move {
            let service = hyper::service::service_fn(move |req| {
                let state = Arc::clone(&state);
                async move { Ok::<_, Infallible>(handle(state, req).await) }
            });
            let http = hyper::server::conn::http1::Builder::new();
            match tls {
                // A failed handshake (a client that does not trust the
                // certificate) ends the connection.
                Some(tls) => {
                    if let Ok(stream) = tls.accept(stream).await {
                        let _ = http.serve_connection(TokioIo::new(stream), service).await;
                    }
                }
                None => {
                    let _ = http.serve_connection(TokioIo::new(stream), service).await;
                }
            }
        }
    })
}

async fn handle(state: Arc<Mutex<State>>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let method = req.method().clone();
    let full_path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let authorization = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let delay = state.lock().unwrap_or_else(|e| e.into_inner()).delay;
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
    let denied = s
        .required
        .as_ref()
        .is_some_and(|r| authorization.as_ref() != Some(r));
    let (status, reply) = match s.fail.as_mut() {
        _ if denied => (401, json!({"error_code": 40101, "message": "Unauthorized"})),
        Some((status, left)) if *left > 0 => {
            *left -= 1;
            let st = *status;
            (
                st,
                json!({"error_code": u32::from(st) * 100 + 1, "message": "injected"}),
            )
        }
        _ => answer(&mut s, &method, &full_path, &query, &body),
    };
    s.log.push(Logged {
        method: method.to_string(),
        path: if query.is_empty() {
            full_path
        } else {
            format!("{full_path}?{query}")
        },
        status,
        authorization,
    });
    let mut r = Response::new(Full::new(Bytes::from(reply.to_string())));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if status == 401 {
        r.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            hyper::header::HeaderValue::from_static("Basic realm=\"registry\""),
        );
    }
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/vnd.schemaregistry.v1+json"),
    );
    r
}

fn not_found(code: u32, message: &str) -> (u16, Value) {
    (404, json!({"error_code": code, "message": message}))
}

/// Routes a request (after any injected fault) to what the registry
/// answers: a status and a JSON body.
fn answer(
    s: &mut State,
    method: &Method,
    full_path: &str,
    query: &str,
    body: &[u8],
) -> (u16, Value) {
    let path = full_path
        .strip_prefix("/apis/ccompat/v7")
        .unwrap_or(full_path);
    let parts: Vec<String> = path
        .trim_matches('/')
        .split('/')
        .map(percent_decode)
        .collect();
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    let param = |name: &str| {
        query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
    };
    match (method, parts.as_slice()) {
        (&Method::POST, ["subjects", subject, "versions"]) => post_version(s, subject, body),
        (&Method::POST, ["subjects", subject]) => lookup(s, subject, body),
        (&Method::GET, ["schemas", "ids", id]) => {
            let serialized = param("format").as_deref() == Some("serialized");
            schema_by_id(s, id, serialized)
        }
        (&Method::GET, ["subjects"]) => (200, json!(s.subjects.keys().collect::<Vec<_>>())),
        (&Method::GET, ["subjects", subject, "versions"]) => match s.subjects.get(*subject) {
            Some(ids) => (200, json!((1..=ids.len()).collect::<Vec<_>>())),
            None => not_found(40401, "Subject not found"),
        },
        (&Method::GET, ["subjects", subject, "versions", v]) => subject_version(s, subject, v),
        (&Method::GET, ["config"]) => (
            200,
            json!({"compatibilityLevel": s.compatibility.clone().unwrap_or_else(|| "BACKWARD".into())}),
        ),
        (&Method::PUT, ["config"]) => {
            let level = posted(body)["compatibility"]
                .as_str()
                .unwrap_or("BACKWARD")
                .to_string();
            s.compatibility = Some(level.clone());
            (200, json!({"compatibility": level}))
        }
        (&Method::GET, ["associations", ..]) => not_found(40403, "Not found"),
        _ => {
            s.unimplemented.push(format!("{method} {full_path}"));
            not_found(40403, "Not implemented by the test registry")
        }
    }
}

/// A request's JSON body (`null` if it is not JSON).
fn posted(body: &[u8]) -> Value {
    serde_json::from_slice::<Value>(body).unwrap_or(Value::Null)
}

/// `POST /subjects/{s}/versions`: registers, or finds, the schema posted.
fn post_version(s: &mut State, subject: &str, body: &[u8]) -> (u16, Value) {
    let b = posted(body);
    let Some(schema) = b["schema"].as_str() else {
        return (422, json!({"error_code": 42201, "message": "no schema"}));
    };
    let ty = b["schemaType"].as_str().unwrap_or("AVRO");
    let refs = b.get("references").cloned().unwrap_or(json!([]));
    let id = register(s, subject, ty, schema, refs);
    let version = s.subjects[subject].iter().position(|&i| i == id).unwrap() + 1;
    (
        200,
        json!({"id": id, "subject": subject, "version": version}),
    )
}

/// `POST /subjects/{s}`: the version of the posted schema under a subject.
fn lookup(s: &State, subject: &str, body: &[u8]) -> (u16, Value) {
    let b = posted(body);
    let wanted = Stored {
        schema_type: b["schemaType"].as_str().unwrap_or("AVRO").to_string(),
        schema: b["schema"].as_str().unwrap_or("").to_string(),
        references: b.get("references").cloned().unwrap_or(json!([])),
        serialized: None,
    };
    let Some(ids) = s.subjects.get(subject) else {
        return not_found(40401, "Subject not found");
    };
    match ids
        .iter()
        .enumerate()
        .find(|(_, &id)| same(&s.schemas[id as usize - 1], &wanted))
    {
        Some((v, &id)) => (200, version_json(s, subject, v + 1, id)),
        None => not_found(40403, "Schema not found"),
    }
}

/// `GET /schemas/ids/{id}`: the schema, or with `format=serialized` what a
/// test gave for it.
fn schema_by_id(s: &State, id: &str, serialized: bool) -> (u16, Value) {
    let Some(stored) = id
        .parse::<usize>()
        .ok()
        .and_then(|i| s.schemas.get(i.wrapping_sub(1)))
    else {
        return not_found(40403, "Schema not found");
    };
    let text = match (&stored.serialized, serialized) {
        (Some(b64), true) => b64.clone(),
        _ => stored.schema.clone(),
    };
    let mut v = json!({"schema": text});
    if stored.schema_type != "AVRO" {
        v["schemaType"] = json!(stored.schema_type);
    }
    if stored.references.as_array().is_some_and(|r| !r.is_empty()) {
        v["references"] = stored.references.clone();
    }
    (200, v)
}

/// `GET /subjects/{s}/versions/{v}`: a version by number, or `latest`.
fn subject_version(s: &State, subject: &str, v: &str) -> (u16, Value) {
    let Some(ids) = s.subjects.get(subject) else {
        return not_found(40401, "Subject not found");
    };
    let n = if v == "latest" || v == "-1" {
        ids.len()
    } else {
        v.parse().unwrap_or(0)
    };
    match ids.get(n.wrapping_sub(1)) {
        Some(&id) => (200, version_json(s, subject, n, id)),
        None => not_found(40402, "Version not found"),
    }
}

fn register(
    s: &mut State,
    subject: &str,
    schema_type: &str,
    schema: &str,
    references: Value,
) -> u32 {
    let wanted = Stored {
        schema_type: schema_type.to_string(),
        schema: schema.to_string(),
        references,
        serialized: None,
    };
    let id = match s.schemas.iter().position(|x| same(x, &wanted)) {
        Some(i) => i as u32 + 1,
        None => {
            s.schemas.push(wanted);
            s.schemas.len() as u32
        }
    };
    let versions = s.subjects.entry(subject.to_string()).or_default();
    if !versions.contains(&id) {
        versions.push(id);
    }
    id
}

fn same(a: &Stored, b: &Stored) -> bool {
    a.schema_type == b.schema_type && a.schema == b.schema && a.references == b.references
}

fn version_json(s: &State, subject: &str, version: usize, id: u32) -> Value {
    let stored = &s.schemas[id as usize - 1];
    let mut v = json!({"subject": subject, "version": version, "id": id, "schema": stored.schema});
    if stored.schema_type != "AVRO" {
        v["schemaType"] = json!(stored.schema_type);
    }
    if stored.references.as_array().is_some_and(|r| !r.is_empty()) {
        v["references"] = stored.references.clone();
    }
    v
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push(h << 4 | l);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
