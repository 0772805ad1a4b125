//! The client against the testkit's registry: the API subset, the cache,
//! URL failover, and each kind of answer sorted into found / not found /
//! unavailable.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use graphsink_testkit::TestRegistry;
use serde_json::json;

use super::*;
use crate::config::SchemaRegistrySettings;

const AVRO: &str = r#"{"type":"record","name":"P","fields":[{"name":"id","type":"string"}]}"#;

fn settings(url: &str) -> SchemaRegistrySettings {
    SchemaRegistrySettings {
        url: url.into(),
        timeout: Duration::from_secs(2),
        ..Default::default()
    }
}

/// A client with a request counter by outcome (ok, not_found, refused, unavailable).
fn client(url: &str) -> (Registry, Arc<[AtomicU32; 4]>) {
    let counts: Arc<[AtomicU32; 4]> = Arc::new(Default::default());
    let c = Arc::clone(&counts);
    let r = Registry::new(&settings(url))
        .unwrap()
        .on_request(Arc::new(move |o| {
            let i = match o {
                Outcome::Ok => 0,
                Outcome::NotFound => 1,
                Outcome::Refused => 2,
                Outcome::Unavailable => 3,
            };
            c[i].fetch_add(1, Ordering::Relaxed);
        }));
    (r, counts)
}

fn n(c: &[AtomicU32; 4], i: usize) -> u32 {
    c[i].load(Ordering::Relaxed)
}

#[tokio::test]
async fn a_schema_is_fetched_once_and_kept() {
    let reg = TestRegistry::start().unwrap();
    let id = reg.register("people-value", "AVRO", AVRO, json!([]));
    let (c, counts) = client(&reg.url());
    for _ in 0..3 {
        let s = c.schema(id, false).await.unwrap();
        assert_eq!((s.schema_type, s.text.as_str()), (SchemaType::Avro, AVRO));
    }
    assert_eq!(n(&counts, 0), 1, "{:?}", reg.requests());
    assert!(c.cached(id, false).is_some());
    // Concurrent asks for an unseen id share one request.
    let id2 = reg.register("people-value", "JSON", r#"{"type":"object"}"#, json!([]));
    let asks = (0..8).map(|_| c.schema(id2, false));
    for s in futures::future::join_all(asks).await {
        assert_eq!(s.unwrap().schema_type, SchemaType::Json);
    }
    assert_eq!(n(&counts, 0), 2, "{:?}", reg.requests());
}

#[tokio::test]
async fn a_missing_id_is_not_found_and_not_kept() {
    let reg = TestRegistry::start().unwrap();
    let (c, counts) = client(&reg.url());
    for _ in 0..2 {
        match c.schema(42, false).await {
            Err(Lookup::NotFound(m)) => assert!(m.contains("40403"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(n(&counts, 1), 2);
    // Registered later, it is found: a miss is never cached.
    for i in 0..42 {
        reg.register(
            &format!("s{i}"),
            "AVRO",
            &format!(r#""string{i}""#),
            json!([]),
        );
    }
    assert!(c.schema(42, false).await.is_ok());
}

#[tokio::test]
async fn a_down_or_failing_registry_is_unavailable_never_not_found() {
    let mut reg = TestRegistry::start().unwrap();
    let id = reg.register("t-value", "AVRO", AVRO, json!([]));
    let (c, counts) = client(&reg.url());
    reg.fail_next(503, 1);
    assert!(matches!(c.schema(id, false).await, Err(Lookup::Unavailable(m)) if m.contains("503")));
    reg.fail_next(401, 1);
    assert!(matches!(c.schema(id, false).await, Err(Lookup::Unavailable(m)) if m.contains("401")));
    reg.stop();
    let e = c.schema(id, false).await.unwrap_err();
    assert!(matches!(&e, Lookup::Unavailable(_)), "{e}");
    assert_eq!(n(&counts, 3), 3);
    reg.restart().unwrap();
    assert_eq!(c.schema(id, false).await.unwrap().text, AVRO);
    // Slower than the timeout: unavailable, within about the timeout.
    let id2 = reg.register("t-value", "AVRO", r#""long""#, json!([]));
    reg.set_delay(Duration::from_secs(4));
    let t = std::time::Instant::now();
    assert!(matches!(
        c.schema(id2, false).await,
        Err(Lookup::Unavailable(_))
    ));
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    reg.clear_faults();
    // What was kept flows on while the registry is away.
    reg.stop();
    assert_eq!(c.schema(id, false).await.unwrap().text, AVRO);
}

#[tokio::test]
async fn urls_are_tried_in_turn() {
    let reg = TestRegistry::start().unwrap();
    let id = reg.register("t-value", "AVRO", AVRO, json!([]));
    // A closed port first (bound, then dropped), then the registry.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (c, _) = client(&format!("http://{dead}, {}/", reg.url()));
    assert_eq!(c.schema(id, false).await.unwrap().text, AVRO);
    let (c, _) = client(&format!("http://{dead}"));
    let e = c.schema(id, false).await.unwrap_err();
    assert!(e.to_string().contains(&dead.to_string()), "{e}");
}

#[tokio::test]
async fn protobuf_takes_the_serialized_form_when_served_else_the_text() {
    let reg = TestRegistry::start().unwrap();
    let proto = "syntax = \"proto3\";\nmessage P { string id = 1; }\n";
    let id = reg.register("p-value", "PROTOBUF", proto, json!([]));
    let (c, _) = client(&reg.url());
    // Not served (the text comes back, as from Apicurio): the text.
    let s = c.schema(id, true).await.unwrap();
    assert_eq!((s.text.as_str(), s.descriptor.is_none()), (proto, true));
    let id2 = reg.register("q-value", "PROTOBUF", &proto.replace('P', "Q"), json!([]));
    reg.set_serialized(id2, "CgFQEgF0"); // base64 of some bytes
    let s = c.schema(id2, true).await.unwrap();
    assert_eq!(s.descriptor.as_deref(), Some(&b"\n\x01P\x12\x01t"[..]));
    // A 400 to the serialized ask (Apicurio, for a base64-registered
    // schema) falls back to the text.
    let id3 = reg.register("r-value", "PROTOBUF", &proto.replace('P', "R"), json!([]));
    reg.fail_next(400, 1);
    let s = c.schema(id3, true).await.unwrap();
    assert!(s.text.contains("message R"), "{}", s.text);
    // So does a 500 to it (Apicurio, for a schema registered as base64).
    let id4 = reg.register("s-value", "PROTOBUF", &proto.replace('P', "S"), json!([]));
    reg.fail_next(500, 1);
    let s = c.schema(id4, true).await.unwrap();
    assert!(s.text.contains("message S"), "{}", s.text);
    assert!(matches!(c.schema(99, true).await, Err(Lookup::NotFound(_))));
}

#[tokio::test]
async fn subject_versions_carry_references() {
    let reg = TestRegistry::start().unwrap();
    let dep = reg.register(
        "common.proto",
        "PROTOBUF",
        "syntax = \"proto3\";\nmessage C {}\n",
        json!([]),
    );
    assert_eq!(dep, 1);
    let refs = json!([{"name": "common.proto", "subject": "common.proto", "version": 1}]);
    reg.register(
        "p-value",
        "PROTOBUF",
        "syntax = \"proto3\";\nimport \"common.proto\";\nmessage P { C c = 1; }\n",
        refs,
    );
    let (c, _) = client(&reg.url());
    let v = c.version("p-value", "latest").await.unwrap();
    assert_eq!((v.version, v.id), (1, 2));
    assert_eq!(
        v.schema.references,
        [Reference {
            name: "common.proto".into(),
            subject: "common.proto".into(),
            version: 1
        }]
    );
    let by_id = c.schema(2, false).await.unwrap();
    assert_eq!(by_id.references, v.schema.references);
    assert!(
        matches!(c.version("p-value", "7").await, Err(Lookup::NotFound(m)) if m.contains("40402"))
    );
    assert!(
        matches!(c.version("nope", "latest").await, Err(Lookup::NotFound(m)) if m.contains("40401"))
    );
    // Subjects with odd characters reach the registry whole.
    reg.register("a/b:c-value", "AVRO", AVRO, json!([]));
    assert_eq!(c.version("a/b:c-value", "1").await.unwrap().id, 3);
}

#[tokio::test]
async fn credentials_are_sent() {
    let reg = TestRegistry::start().unwrap();
    let id = reg.register("t-value", "AVRO", AVRO, json!([]));
    let mut s = settings(&reg.url());
    s.bearer_token = Some("tok-1234".into());
    Registry::new(&s).unwrap().schema(id, false).await.unwrap();
    let mut s = settings(&reg.url());
    s.basic_auth_user_info = Some("svc:pw:with:colons".into());
    Registry::new(&s).unwrap().schema(id, false).await.unwrap();
    let sent: Vec<_> = reg
        .requests()
        .into_iter()
        .map(|r| r.authorization)
        .collect();
    // base64("svc:pw:with:colons")
    assert_eq!(
        sent,
        [
            Some("Bearer tok-1234".into()),
            Some("Basic c3ZjOnB3OndpdGg6Y29sb25z".into())
        ]
    );
}

/// A registry over TLS (the test CA's certificate for 127.0.0.1) with
/// basic auth: the client trusts it through `ssl_ca_location` and sends
/// the credentials. Without the CA, or with a wrong password, a fetch is
/// `Unavailable` with a reason that names what to fix and never the
/// password; the registry served nothing to either.
#[tokio::test]
async fn tls_and_basic_auth() {
    use graphsink_testkit::certs::Certs;
    use graphsink_testkit::RegistrySecurity;
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::generate(
        dir.path(),
        &[("registry".into(), vec![std::net::Ipv4Addr::LOCALHOST])],
        &[],
    )
    .expect("certificates (openssl and keytool)");
    let password = "pw-8d1e-not-in-any-message";
    let reg = TestRegistry::start_secured(&RegistrySecurity {
        tls: Some(certs.server("registry")),
        basic_auth: Some(("svc".into(), password.into())),
    })
    .unwrap();
    assert!(reg.url().starts_with("https://127.0.0.1:"), "{}", reg.url());
    let id = reg.register("t-value", "AVRO", AVRO, json!([]));
    let secured = |user_info: &str, ca: bool| {
        let mut s = settings(&reg.url());
        s.basic_auth_user_info = Some(user_info.into());
        s.ssl_ca_location = ca.then(|| certs.ca());
        Registry::new(&s).unwrap()
    };

    let good = secured(&format!("svc:{password}"), true);
    assert_eq!(good.schema(id, false).await.unwrap().text, AVRO);

    let Err(Lookup::Unavailable(why)) = secured(&format!("svc:{password}"), false)
        .schema(id, false)
        .await
    else {
        panic!("an untrusted certificate is not a schema");
    };
    assert!(why.contains("schema_registry.ssl_ca_location"), "{why}");

    let Err(Lookup::Unavailable(why)) = secured("svc:wrong-password", true).schema(id, false).await
    else {
        panic!("a wrong password is not a schema");
    };
    assert!(why.contains("HTTP 401"), "{why}");
    assert!(
        why.contains("refused the credentials of schema_registry.basic_auth_user_info"),
        "{why}"
    );
    assert!(
        !why.contains("wrong-password") && !why.contains(password),
        "{why}"
    );

    let statuses: Vec<u16> = reg.requests().iter().map(|r| r.status).collect();
    // The untrusted client never got past the handshake.
    assert_eq!(statuses, [200, 401]);
}
