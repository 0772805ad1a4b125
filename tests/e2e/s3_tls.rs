//! An S3 root over TLS (issue 55): the graph on the test S3 server behind
//! a TLS front whose certificate a private CA signed, with
//! `aws_allow_http` unset, so only HTTPS is allowed. object_store (over
//! reqwest's rustls) verifies the server against the platform's store, for
//! which `SSL_CERT_FILE` stands in: graphsink's binary given the CA that
//! way ingests every key; without it, the run stops at the graph's open.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use graphsink_testkit::certs::Certs;
use graphsink_testkit::TlsFront;
use serde_json::json;

use crate::harness::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_root_over_tls_trusts_a_private_ca_through_ssl_cert_file() {
    crate::init_logs();
    let plain = s3_endpoint();
    let upstream: SocketAddr = plain.trim_start_matches("http://").parse().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::generate(dir.path(), &[("s3".into(), vec![Ipv4Addr::LOCALHOST])], &[])
        .expect("certificates (openssl and keytool)");
    let (cert, key) = certs.server("s3");
    let front = TlsFront::start(upstream, &cert, &key).expect("the TLS front");
    let tg = TestGraph::on(
        Backend::S3Via(front.url()),
        SCHEMA,
        &["node = \"Person\""],
        "",
    );
    let cfg = std::fs::read_to_string(tg.config_path()).unwrap();
    let https_only = cfg.replace("aws_allow_http = \"true\"\n", "");
    assert_ne!(cfg, https_only, "{cfg}");
    std::fs::write(tg.config_path(), &https_only).unwrap();
    create_topic(&tg.topics[0], 1).await;
    let people = [("ann", 31), ("bob", 40), ("cy", 9)];
    let recs: Vec<Rec> = people
        .iter()
        .map(|(n, a)| rec(0, Some(n), Some(json!({"name": n, "age": a}))))
        .collect();
    produce(&tg.topics[0], &recs).await;

    // Without the CA: the graph cannot be opened, and the run stops (exit
    // 1) after object_store's retries. graphsink's own last line says only
    // "error sending request"; the reason is rustls's ERROR line before it.
    let run = tg.spawn_capturing(&["run", "--exit-at-end"], &[]);
    let (code, stderr) = run.exit_within(Duration::from_secs(120)).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("invalid peer certificate: UnknownIssuer"),
        "{stderr}"
    );

    // With it: every key lands.
    let ca = certs.ca().display().to_string();
    let (code, stderr) = tg
        .spawn_capturing(&["run", "--exit-at-end"], &[("SSL_CERT_FILE", &ca)])
        .exit_within(Duration::from_secs(180))
        .await;
    assert_eq!(code, Some(0), "graphsink run over TLS failed:\n{stderr}");

    // Read back straight from the server, over plain HTTP.
    std::fs::write(tg.config_path(), cfg.replace(&front.url(), plain)).unwrap();
    let ages = tg.person_ages().await;
    let want: Vec<(String, Option<i64>)> = people
        .iter()
        .map(|(n, a)| (n.to_string(), Some(*a)))
        .collect();
    assert_eq!(ages, want);
}
