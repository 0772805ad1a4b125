//! The Schema Registry client: resolves the schema id framed in a record
//! (`wire`, the Confluent wire format) to its schema, and a topic's subject
//! to its latest version, over the Confluent REST API that Confluent's
//! registry, Apicurio (`/apis/ccompat/v7`), Karapace and Redpanda serve.
//!
//! Ids are immutable, so a schema once fetched is kept (up to
//! `cache_capacity`) and never asked for again; concurrent asks for one id
//! share one request. Each request tries the configured URLs in turn.
//!
//! A registry's answer sorts into two outcomes the decoder acts on
//! differently: `NotFound` (the id does not exist: the record is a typed
//! reject) and `Unavailable` (down, slow, 5xx, a reply it cannot read:
//! passing trouble, so the record waits; it is never rejected for it).

pub(crate) mod wire;

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::config::SchemaRegistrySettings;
use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// What a schema is written in (`schemaType`; absent means Avro).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum SchemaType {
    #[default]
    Avro,
    Protobuf,
    Json,
}

/// A schema another imports (Protobuf `import`, Avro named types, JSON
/// Schema `$ref`), by the name it is imported as.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Reference {
    pub name: String,
    pub subject: String,
    pub version: i32,
}

/// One schema as the registry holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schema {
    pub schema_type: SchemaType,
    /// The schema text (Avro JSON, `.proto` source, JSON Schema), or, for
    /// Protobuf asked with `format=serialized`, what the registry sent.
    pub text: String,
    /// Protobuf: the encoded `FileDescriptorProto`, when the registry
    /// served it (`format=serialized`, base64).
    pub descriptor: Option<Vec<u8>>,
    pub references: Vec<Reference>,
    /// The schemas `references` name, transitively, by import name, once
    /// `with_imports` has fetched them (empty until then).
    pub imports: Vec<(String, Arc<Schema>)>,
}

/// A subject's version: which id it is, and its schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SubjectVersion {
    pub subject: String,
    pub version: i32,
    pub id: u32,
    pub schema: Arc<Schema>,
}

/// A registry's answer that is not a schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// The registry says it has no such id, subject or version (HTTP 404).
    NotFound(String),
    /// No URL gave an answer to act on: unreachable, timed out, a 5xx, a
    /// 401/403, or a reply that is not the API's. Passing; ask again later.
    Unavailable(String),
}

impl std::fmt::Display for Lookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Lookup::NotFound(m) => write!(f, "not in the schema registry: {m}"),
            Lookup::Unavailable(m) => write!(f, "schema registry unavailable: {m}"),
        }
    }
}

/// How one request ended, for the requests metric and the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Ok,
    NotFound,
    /// Another 4xx: the registry refused the request as asked.
    Refused,
    Unavailable,
}

impl Outcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::NotFound => "not_found",
            Outcome::Refused => "refused",
            Outcome::Unavailable => "unavailable",
        }
    }
}

/// One request's failure, before the caller decides what it means.
enum Reply {
    NotFound(String),
    /// A 4xx other than 404 (and 401/403/408/429, which pass): the registry
    /// does not serve the request as asked.
    Refused(String),
    Unavailable(String),
}

impl Reply {
    fn lookup(self) -> Lookup {
        match self {
            Reply::NotFound(m) => Lookup::NotFound(m),
            // A plain GET the registry refuses is not a missing schema:
            // waiting (and saying why) beats rejecting records for it.
            Reply::Refused(m) | Reply::Unavailable(m) => Lookup::Unavailable(m),
        }
    }
}

/// The registry's JSON for a schema (by id or as a subject version).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SchemaReply {
    schema: String,
    #[serde(default)]
    schema_type: Option<SchemaType>,
    #[serde(default)]
    references: Vec<Reference>,
    #[serde(default)]
    subject: Option<String>,
    #[serde(default)]
    version: Option<i32>,
    #[serde(default)]
    id: Option<u32>,
}

#[derive(Deserialize)]
struct ErrorReply {
    error_code: i64,
    #[serde(default)]
    message: String,
}

/// Called once per request with its outcome (the metrics hook).
pub(crate) type OnRequest = Arc<dyn Fn(Outcome) + Send + Sync>;

/// A client of one registry (one or more URLs serving the same data).
#[derive(Clone)]
pub(crate) struct Registry {
    urls: Arc<Vec<String>>,
    http: reqwest::Client,
    auth: Option<Auth>,
    by_id: moka::future::Cache<(u32, bool), Arc<Schema>>,
    on_request: Option<OnRequest>,
}

#[derive(Clone)]
enum Auth {
    Basic { user: String, password: String },
    Bearer(String),
}

impl Registry {
    pub(crate) fn new(settings: &SchemaRegistrySettings) -> Result<Registry> {
        let urls: Vec<String> = settings.urls().into_iter().map(str::to_string).collect();
        if urls.is_empty() {
            return Err(Error::config("schema_registry.url is not set"));
        }
        // HTTP/1.1 only, as Confluent's own clients speak: Apicurio
        // Registry 3.3.3 over HTTPS negotiates HTTP/2 and then gzips each
        // reply twice under one `content-encoding: gzip`, which no client
        // reads (docs/security.md, "The Schema Registry").
        let mut http = reqwest::Client::builder()
            .http1_only()
            .timeout(settings.timeout)
            .connect_timeout(settings.timeout.min(Duration::from_secs(5)));
        if let Some(path) = &settings.ssl_ca_location {
            let pem = std::fs::read(path).map_err(|e| {
                Error::config(format!(
                    "schema_registry.ssl_ca_location: cannot read {}: {e}",
                    path.display()
                ))
            })?;
            let ca = reqwest::Certificate::from_pem(&pem).map_err(|e| {
                Error::config(format!(
                    "schema_registry.ssl_ca_location: {} is not a PEM certificate: {e}",
                    path.display()
                ))
            })?;
            http = http.add_root_certificate(ca);
        }
        let http = http
            .build()
            .map_err(|e| Error::config(format!("schema_registry: cannot build a client: {e}")))?;
        let auth = match (&settings.basic_auth_user_info, &settings.bearer_token) {
            (Some(info), _) => {
                let (user, password) = info.split_once(':').unwrap_or((info, ""));
                Some(Auth::Basic {
                    user: user.into(),
                    password: password.into(),
                })
            }
            (None, Some(t)) => Some(Auth::Bearer(t.clone())),
            (None, None) => None,
        };
        Ok(Registry {
            urls: Arc::new(urls),
            http,
            auth,
            by_id: moka::future::Cache::new(settings.cache_capacity),
            on_request: None,
        })
    }

    /// Reports every request's outcome to `hook`.
    pub(crate) fn on_request(mut self, hook: OnRequest) -> Registry {
        self.on_request = Some(hook);
        self
    }

    /// Counts every request in `graphsink_schema_registry_requests_total`.
    pub(crate) fn metered(self, metrics: Arc<Metrics>) -> Registry {
        self.on_request(Arc::new(move |o| {
            metrics.schema_registry_request(o.as_str())
        }))
    }

    /// The schema of `id`, from the cache or the registry. `serialized`
    /// asks for Protobuf's `format=serialized` (falling back to the text
    /// when the registry does not serve it).
    pub(crate) async fn schema(
        &self,
        id: u32,
        serialized: bool,
    ) -> std::result::Result<Arc<Schema>, Lookup> {
        // `try_get_with` runs one fetch per key however many ask at once;
        // an error is not cached, so the next ask tries again.
        self.by_id
            .try_get_with((id, serialized), self.fetch_schema(id, serialized))
            .await
            .map_err(|e| (*e).clone())
    }

    /// The schema of `id` if it is already cached.
    #[cfg(test)]
    pub(crate) fn cached(&self, id: u32, serialized: bool) -> Option<Arc<Schema>> {
        use futures::FutureExt;
        self.by_id.get(&(id, serialized)).now_or_never().flatten()
    }

    async fn fetch_schema(
        &self,
        id: u32,
        serialized: bool,
    ) -> std::result::Result<Arc<Schema>, Lookup> {
        let path = format!("/schemas/ids/{id}");
        if serialized {
            // Registries differ here: Confluent's answers base64, Apicurio
            // the raw bytes in a JSON string, or a 400 or 500 when the
            // schema was registered in that form. Only base64 that decodes
            // is taken; anything else but a missing id falls back to the
            // `.proto` text, which every registry serves.
            match self.get(&format!("{path}?format=serialized")).await {
                Ok(body) => {
                    let reply = parse_schema(&body, &path)?;
                    if reply.schema_type == Some(SchemaType::Protobuf) {
                        if let Some(bytes) = base64_decoded(&reply.schema) {
                            let mut s = schema_of(reply);
                            s.descriptor = Some(bytes);
                            return Ok(Arc::new(s));
                        }
                    }
                }
                Err(Reply::NotFound(m)) if m.contains("40403") => return Err(Lookup::NotFound(m)),
                // Not served in that form (Apicurio answers 400 or 500):
                // the text answers whether the registry is there at all.
                Err(_) => {}
            }
        }
        let body = self.get(&path).await.map_err(Reply::lookup)?;
        Ok(Arc::new(schema_of(parse_schema(&body, &path)?)))
    }

    /// `schema` with every schema it references fetched, transitively (by
    /// subject and version; each import name once), into `imports`.
    pub(crate) async fn with_imports(
        &self,
        schema: Arc<Schema>,
    ) -> std::result::Result<Arc<Schema>, Lookup> {
        if schema.references.is_empty() {
            return Ok(schema);
        }
        let mut imports: Vec<(String, Arc<Schema>)> = Vec::new();
        let mut todo: Vec<Reference> = schema.references.clone();
        while let Some(r) = todo.pop() {
            if imports.iter().any(|(name, _)| *name == r.name) {
                continue;
            }
            let v = self.version(&r.subject, &r.version.to_string()).await?;
            todo.extend(v.schema.references.iter().cloned());
            imports.push((r.name, v.schema));
        }
        let mut out = (*schema).clone();
        out.imports = imports;
        Ok(Arc::new(out))
    }

    /// `subject`'s version `version` (a number or `latest`).
    pub(crate) async fn version(
        &self,
        subject: &str,
        version: &str,
    ) -> std::result::Result<SubjectVersion, Lookup> {
        let path = format!("/subjects/{}/versions/{version}", encode(subject));
        let body = self.get(&path).await.map_err(Reply::lookup)?;
        let reply = parse_schema(&body, &path)?;
        let (Some(version), Some(id)) = (reply.version, reply.id) else {
            return Err(Lookup::Unavailable(format!(
                "{path}: the reply has no version or id"
            )));
        };
        Ok(SubjectVersion {
            subject: reply.subject.clone().unwrap_or_else(|| subject.to_string()),
            version,
            id,
            schema: Arc::new(schema_of(reply)),
        })
    }

    /// GETs `path` from the first URL that answers; the body of a 200.
    async fn get(&self, path: &str) -> std::result::Result<Vec<u8>, Reply> {
        let mut why = Vec::new();
        for base in self.urls.iter() {
            let url = format!("{base}{path}");
            let mut req = self.http.get(&url).header(
                "Accept",
                "application/vnd.schemaregistry.v1+json, application/json",
            );
            req = match &self.auth {
                Some(Auth::Basic { user, password }) => req.basic_auth(user, Some(password)),
                Some(Auth::Bearer(t)) => req.bearer_auth(t),
                None => req,
            };
            let reply = match req.send().await {
                Ok(r) => r,
                Err(e) => {
                    why.push(format!("{url}: {}{}", one_line(&e), tls_hint(&url, &e)));
                    continue;
                }
            };
            let status = reply.status();
            let body = match reply.bytes().await {
                Ok(b) => b,
                Err(e) => {
                    why.push(format!("{url}: reading the reply: {}", one_line(&e)));
                    continue;
                }
            };
            if status.is_success() {
                self.report(Outcome::Ok);
                return Ok(body.to_vec());
            }
            let detail = serde_json::from_slice::<ErrorReply>(&body)
                .map(|e| format!("error_code {}: {}", e.error_code, e.message))
                .unwrap_or_else(|_| String::from_utf8_lossy(&body).chars().take(200).collect());
            // The registry answered: every URL serves the same data.
            if status == reqwest::StatusCode::NOT_FOUND {
                self.report(Outcome::NotFound);
                return Err(Reply::NotFound(format!("{path}: {detail}")));
            }
            let passing =
                status.is_server_error() || matches!(status.as_u16(), 401 | 403 | 408 | 429);
            if !passing {
                self.report(Outcome::Refused);
                return Err(Reply::Refused(format!("{url}: HTTP {status}: {detail}")));
            }
            why.push(format!(
                "{url}: HTTP {status}: {detail}{}",
                self.auth_hint(status)
            ));
        }
        self.report(Outcome::Unavailable);
        Err(Reply::Unavailable(why.join("; ")))
    }

    /// What a 401 or 403 says about graphsink's credentials (never their
    /// values), so the log line names what to fix.
    fn auth_hint(&self, status: reqwest::StatusCode) -> &'static str {
        match (status.as_u16(), &self.auth) {
            (401, Some(Auth::Basic { .. })) => {
                " (the registry refused the credentials of schema_registry.basic_auth_user_info)"
            }
            (401, Some(Auth::Bearer(_))) => {
                " (the registry refused schema_registry.bearer_token)"
            }
            (401, None) => {
                " (the registry wants credentials: set schema_registry.basic_auth_user_info or bearer_token)"
            }
            (403, _) => " (the registry does not let graphsink's credentials read schemas)",
            _ => "",
        }
    }

    fn report(&self, o: Outcome) {
        if let Some(hook) = &self.on_request {
            hook(o);
        }
    }
}

fn parse_schema(body: &[u8], path: &str) -> std::result::Result<SchemaReply, Lookup> {
    serde_json::from_slice(body)
        .map_err(|e| Lookup::Unavailable(format!("{path}: the reply is not a schema: {e}")))
}

fn schema_of(reply: SchemaReply) -> Schema {
    Schema {
        schema_type: reply.schema_type.unwrap_or_default(),
        text: reply.schema,
        descriptor: None,
        references: reply.references,
        imports: Vec::new(),
    }
}

/// The bytes of a base64 string (`.proto` source never is one: it holds
/// spaces and `;`).
fn base64_decoded(s: &str) -> Option<Vec<u8>> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(s.trim())
        .ok()
}

/// A subject in a URL path (subjects may hold `/`, `:` and the like).
fn encode(subject: &str) -> String {
    let mut out = String::with_capacity(subject.len());
    for b in subject.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// For an `https://` URL whose certificate was not trusted, where the CA
/// goes.
fn tls_hint(url: &str, e: &dyn std::error::Error) -> &'static str {
    let text = one_line(e).to_ascii_lowercase();
    if url.starts_with("https://")
        && (text.contains("certificate") || text.contains("unknownissuer"))
    {
        " (is the registry's CA in schema_registry.ssl_ca_location?)"
    } else {
        ""
    }
}

fn one_line(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s.replace('\n', " ")
}

#[cfg(test)]
mod tests;
