//! The Schema Registry over TLS with basic auth (issue 55), as a
//! production registry is served: HTTPS only, with a certificate from a
//! private CA, and only to its user. Records framed by Confluent's own
//! serializer (which registers over the same TLS and credentials) land
//! through graphsink's real binary, given the CA in
//! `schema_registry.ssl_ca_location` and `basic_auth_user_info` with the
//! password from the environment; a wrong password holds the partition
//! with `/ready` false and a log line naming the credentials, never the
//! password. Against the testkit's registry and Apicurio Registry 3.3.3.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use graphsink_testkit::certs::Certs;
use graphsink_testkit::{Apicurio, RegistrySecurity, TestRegistry};
use serde_json::json;

use crate::formats::encode_job;
use crate::harness::*;
use crate::ops::await_ready;

const PG: &str = "node Person { name: String @key  age: I64? }\n";
const PERSON: &str = r#"{"type":"record","name":"Person","namespace":"gs.tls","fields":[
    {"name":"name","type":"string"},{"name":"age","type":["null","long"],"default":null}]}"#;
const MAPPING: &str = "node = \"Person\"\nformat = \"avro\"\nkey = \"kafka\"";
const USER: &str = "graphsink-reader";

/// A CA and a certificate for 127.0.0.1 (CN=broker, as certs.sh makes
/// every server's), in `dir`.
fn certs(dir: &Path) -> Certs {
    Certs::generate(dir, &[("registry".into(), vec![Ipv4Addr::LOCALHOST])], &[])
        .expect("certificates (openssl and keytool)")
}

/// `[schema_registry]` over TLS with basic auth, the password named
/// (`${var}`), and the probes on `http`, if given.
fn secured_toml(url: &str, ca: &Path, var: &str, http: Option<SocketAddr>) -> String {
    let mut t = format!(
        "[schema_registry]\nurl = \"{url}\"\nssl_ca_location = \"{}\"\n\
         basic_auth_user_info = \"{USER}:${{{var}}}\"\ntimeout = \"5s\"\n",
        ca.display()
    );
    if let Some(addr) = http {
        t.push_str(&format!("\n[http]\nlisten = \"{addr}\"\n"));
    }
    t
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
}

/// The records both runs read: three people framed by Confluent's
/// serializer, which registers the schema over TLS with the credentials.
async fn framed(url: &str, ca: &Path, password: &str, topic: &str) -> Vec<RawRec> {
    let job = json!({
        "format": "avro",
        "schema": PERSON,
        "records": [{"name": "ann", "age": 31}, {"name": "bob", "age": null}, {"name": "cy", "age": 5_000_000_000i64}],
        "registry": {"ssl.ca.location": ca.display().to_string(), "basic.auth.user.info": format!("{USER}:{password}")},
    });
    encode_job(url, topic, job)
        .into_iter()
        .zip(["ann", "bob", "cy"])
        .map(|((value, _), key)| RawRec {
            partition: 0,
            key: Some(key.as_bytes().to_vec()),
            value: Some(value),
            headers: vec![],
        })
        .collect()
}

/// Both halves against one registry at `url`, whose CA is `ca` and whose
/// user `USER` has `password`; graphsink's config names it `${var}` (one
/// name per test: the test process sets it too, to read the rows back).
async fn lands_over_tls_with_basic_auth(url: &str, ca: &Path, password: &str, var: &str) {
    let tg = TestGraph::with_schema(PG, &[MAPPING], &secured_toml(url, ca, var, None));
    create_topic(&tg.topics[0], 1).await;
    let recs = framed(url, ca, password, &tg.topics[0]).await;
    produce_raw(&tg.topics[0], &recs).await;
    let (code, stderr) = tg
        .spawn_capturing(&["run", "--exit-at-end"], &[(var, password)])
        .exit_within(Duration::from_secs(180))
        .await;
    assert_eq!(code, Some(0), "graphsink run failed:\n{stderr}");
    assert!(!stderr.contains(password), "the password is never logged");
    std::env::set_var(var, password);
    let ages = tg.person_ages().await;
    assert_eq!(
        ages,
        [
            ("ann".to_string(), Some(31)),
            ("bob".to_string(), None),
            ("cy".to_string(), Some(5_000_000_000))
        ]
    );

    // The same records, a wrong password: the partition holds (nothing is
    // rejected, nothing committed), `/ready` says why, and the log line
    // names the setting, not either password.
    let wrong = "wrong-9c41e7d2";
    let http = free_addr();
    let tg = TestGraph::with_schema(PG, &[MAPPING], &secured_toml(url, ca, var, Some(http)));
    create_topic(&tg.topics[0], 1).await;
    produce_raw(&tg.topics[0], &recs).await;
    let run = tg.spawn_capturing(&["run"], &[(var, wrong)]);
    wait_until("graphsink serves /ready", Duration::from_secs(60), || {
        std::net::TcpStream::connect(http).is_ok()
    })
    .await;
    let body = await_ready(
        http,
        "held by the registry's 401",
        Duration::from_secs(120),
        |status, b| status == 503 && b["schema_registry_stalled"] == true,
    )
    .await;
    assert_eq!(body["ready"], false, "{body}");
    let stderr = run.kill();
    let line = stderr
        .lines()
        .find(|l| l.contains("schema_registry_stalled"))
        .unwrap_or_else(|| panic!("no schema_registry_stalled line:\n{stderr}"));
    assert!(
        line.contains("HTTP 401")
            && line.contains("refused the credentials of schema_registry.basic_auth_user_info"),
        "{line}"
    );
    assert!(
        !stderr.contains(wrong) && !stderr.contains(password),
        "no password is logged:\n{stderr}"
    );
    assert!(
        committed(&tg.group, &tg.topics[0], 1)
            .get(&0)
            .copied()
            .unwrap_or(0)
            <= 0,
        "nothing past the held record is committed"
    );
}

/// The testkit's registry, HTTPS and basic auth (`start_secured`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_over_tls_with_basic_auth_testkit() {
    crate::init_logs();
    let dir = tempfile::tempdir().unwrap();
    let certs = certs(dir.path());
    let password = graphsink_testkit::certs::secret().unwrap();
    let reg = TestRegistry::start_secured(&RegistrySecurity {
        tls: Some(certs.server("registry")),
        basic_auth: Some((USER.into(), password.clone())),
    })
    .expect("the testkit registry over TLS");
    let var = "GRAPHSINK_TEST_TESTKIT_REGISTRY_PASSWORD";
    lands_over_tls_with_basic_auth(&reg.url(), &certs.ca(), &password, var).await;
    // Every request graphsink and Confluent's client made carried
    // credentials; the refused ones are the wrong password's.
    let requests = reg.requests();
    assert!(requests.iter().all(|r| r.authorization.is_some()));
    assert!(requests.iter().any(|r| r.status == 401));
}

/// Apicurio Registry 3.3.3 with Quarkus's TLS and embedded basic-auth
/// users (testkit's `Apicurio::start_secured`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_over_tls_with_basic_auth_apicurio() {
    crate::init_logs();
    let dir = tempfile::tempdir().unwrap();
    let certs = certs(dir.path());
    let password = graphsink_testkit::certs::secret().unwrap();
    let (cert, key) = certs.server("registry");
    let reg = Apicurio::start_secured(&cert, &key, USER, &password).expect("Apicurio over TLS");
    let var = "GRAPHSINK_TEST_APICURIO_PASSWORD";
    lands_over_tls_with_basic_auth(reg.url(), &certs.ca(), &password, var).await;
}
