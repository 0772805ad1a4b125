//! The secured Kafka of the security mode (`--tls`, `--sasl`,
//! `--security`, `--cluster`; issue 55): graphsink-testkit's
//! `KafkaCluster` (a KRaft node per network namespace, TLS between nodes,
//! SCRAM users, `StandardAuthorizer` denying by default), with one more
//! listener per protocol the bench compares, each on the node's own
//! address: every protocol reaches the same brokers by the same route,
//! without the tests' Toxiproxy in between. Owns the cluster, the ACLs the
//! bench's principals get, and the host the bench runs on; the legs
//! themselves are `kafka/secured.rs`'s.

use std::net::Ipv4Addr;
use std::time::Instant;

use graphsink_testkit::{Acl, ClusterOptions, Host, KafkaCluster, Operation, ResourceType};

use crate::broker::BoxError;

const TEMPLATE: &str = include_str!("../../scripts/kafka/cluster.properties");

/// The SCRAM password of `sasl_ssl`'s principal reaches the bench in the
/// namespace, and graphsink, in this environment variable: graphsink's
/// config names it (`${VAR}`), as a user's would.
pub(crate) const PASSWORD_VAR: &str = "GRAPHSINK_BENCH_SASL_PASSWORD";

/// The dead-letter topic of the bench's config (`[errors]`'s default).
const DEAD_LETTERS: &str = "graphsink-dead-letters";

/// A protocol a leg reads over (librdkafka's `security.protocol`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Protocol {
    /// No TLS, no authentication: the principal is `User:ANONYMOUS`.
    Plaintext,
    /// TLS with a client certificate (mTLS): `User:graphsink-mtls`.
    Ssl,
    /// SCRAM-SHA-512 over TLS: `User:graphsink`. Named as the report
    /// names it; clap's own spelling, `sasl-ssl`, is taken too.
    #[value(name = "sasl_ssl", alias = "sasl-ssl")]
    SaslSsl,
}

impl Protocol {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Protocol::Plaintext => "plaintext",
            Protocol::Ssl => "ssl",
            Protocol::SaslSsl => "sasl_ssl",
        }
    }

    /// The bench's listener for it on every node, and its port.
    fn listener(self) -> (&'static str, u16) {
        match self {
            Protocol::Plaintext => ("BENCH_PLAIN", 9096),
            Protocol::Ssl => ("BENCH_SSL", 9097),
            Protocol::SaslSsl => ("BENCH_SASL", 9098),
        }
    }

    fn kafka_name(self) -> &'static str {
        match self {
            Protocol::Plaintext => "PLAINTEXT",
            Protocol::Ssl => "SSL",
            Protocol::SaslSsl => "SASL_SSL",
        }
    }

    /// Who the broker takes a client of this protocol for.
    fn principal(self) -> &'static str {
        match self {
            Protocol::Plaintext => "ANONYMOUS",
            Protocol::Ssl => "graphsink-mtls",
            Protocol::SaslSsl => "graphsink",
        }
    }

    const ALL: [Protocol; 3] = [Protocol::Plaintext, Protocol::Ssl, Protocol::SaslSsl];
}

/// How one leg's clients reach the cluster: `bootstrap.servers` and the
/// librdkafka security properties, without the SCRAM password (which
/// travels in [`PASSWORD_VAR`], never in a file).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Leg {
    pub protocol: Protocol,
    pub bootstrap: String,
    pub security: Vec<(String, String)>,
}

/// The cluster of one size, and the bench's host on its network.
pub(crate) struct BenchCluster {
    /// Dropped before the cluster: what runs in it goes first.
    host: Option<Host>,
    cluster: KafkaCluster,
    nodes: u32,
    pub start_secs: f64,
}

impl BenchCluster {
    /// `nodes` nodes with the bench's listeners; ready when every node is
    /// listed. One node is replicated once (`min.insync.replicas=1`), as a
    /// single broker is; more are the test cluster's factor 3 and
    /// `min.insync.replicas=2`.
    pub(crate) fn start(nodes: u32) -> Result<BenchCluster, BoxError> {
        let t0 = Instant::now();
        let opts = ClusterOptions {
            nodes,
            users: vec!["graphsink".into()],
            mtls_clients: vec!["graphsink-mtls".into()],
            extra: extra_settings(nodes)?,
            heap: None,
        };
        let cluster = KafkaCluster::start_with(&opts)?;
        let host = cluster.network().add_host("bench")?;
        Ok(BenchCluster {
            host: Some(host),
            cluster,
            nodes,
            start_secs: t0.elapsed().as_secs_f64(),
        })
    }

    pub(crate) fn nodes(&self) -> u32 {
        self.nodes
    }

    /// The host the bench's clients and graphsink run on.
    pub(crate) fn host(&self) -> &Host {
        self.host
            .as_ref()
            .expect("the host lives as long as the cluster")
    }

    pub(crate) fn describe(&self) -> String {
        format!(
            "secured Apache Kafka {} cluster of {} node{} (KafkaCluster, network namespaces)",
            graphsink_testkit::kafka::VERSION,
            self.nodes,
            if self.nodes == 1 { "" } else { "s" }
        )
    }

    /// The nodes' JVMs, for their CPU time.
    pub(crate) fn pids(&mut self) -> Vec<u32> {
        let ids = self.cluster.node_ids();
        ids.into_iter()
            .filter_map(|id| self.cluster.pid(id).ok().flatten())
            .collect()
    }

    /// SCRAM password of `sasl_ssl`'s principal.
    pub(crate) fn password(&self) -> Result<String, BoxError> {
        Ok(self.cluster.password(Protocol::SaslSsl.principal())?)
    }

    /// Makes `topics` (and the dead-letter topic) as the admin, replicated
    /// on every node, and grants each protocol's principal what graphsink
    /// and the bench's own clients need: docs/security.md's list, by
    /// prefix (`bench-` topics and groups), and the producer's WRITE to
    /// plaintext's principal.
    pub(crate) fn prepare(&self, topics: &[&str], partitions: i32) -> Result<(), BoxError> {
        let rf = self.nodes as i32;
        for t in topics {
            self.cluster.create_topic(t, partitions, rf, &[])?;
        }
        self.cluster.create_topic(DEAD_LETTERS, 1, rf, &[])?;
        let mut acls = Vec::new();
        for p in Protocol::ALL {
            let user = p.principal();
            acls.extend([
                Acl::allow(user, Operation::Read, ResourceType::Topic, "bench-").prefixed(),
                Acl::allow(user, Operation::Read, ResourceType::Group, "bench-").prefixed(),
                Acl::allow(user, Operation::Write, ResourceType::Topic, DEAD_LETTERS),
                Acl::allow(user, Operation::Read, ResourceType::Topic, DEAD_LETTERS),
                Acl::fold_transactions(user),
            ]);
        }
        acls.push(
            Acl::allow(
                Protocol::Plaintext.principal(),
                Operation::Write,
                ResourceType::Topic,
                "bench-",
            )
            .prefixed(),
        );
        self.cluster.grant(&acls)?;
        Ok(())
    }

    /// How clients of `protocol` reach every node.
    pub(crate) fn leg(&self, protocol: Protocol) -> Leg {
        let port = protocol.listener().1;
        let bootstrap: Vec<String> = self
            .cluster
            .node_ids()
            .iter()
            .map(|id| format!("{}:{port}", node_addr(*id)))
            .collect();
        let ca = self.cluster.ca().display().to_string();
        let mut security = vec![(
            "security.protocol".to_string(),
            protocol.kafka_name().into(),
        )];
        match protocol {
            Protocol::Plaintext => security.clear(),
            Protocol::Ssl => {
                let (pem, key) = self.cluster.certs().client(protocol.principal());
                security.extend([
                    ("ssl.ca.location".into(), ca),
                    ("ssl.certificate.location".into(), pem.display().to_string()),
                    ("ssl.key.location".into(), key.display().to_string()),
                ]);
            }
            Protocol::SaslSsl => security.extend([
                ("ssl.ca.location".into(), ca),
                ("sasl.mechanisms".into(), "SCRAM-SHA-512".into()),
                ("sasl.username".into(), protocol.principal().into()),
            ]),
        }
        Leg {
            protocol,
            bootstrap: bootstrap.join(","),
            security,
        }
    }
}

impl Drop for BenchCluster {
    fn drop(&mut self) {
        self.host.take();
    }
}

/// Node `id`'s own address (testkit's netns: host `id` is 10.77.id.2).
fn node_addr(id: u32) -> Ipv4Addr {
    graphsink_testkit::netns::host_addr(id as u8)
}

/// The settings added to every node: the bench's three listeners, each
/// advertised at the node's own address (its certificate names it), after
/// the template's own; and for a single node, replication 1.
fn extra_settings(nodes: u32) -> Result<Vec<(String, String)>, BoxError> {
    let template = |key: &str| -> Result<String, BoxError> {
        TEMPLATE
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(str::to_string)
            .ok_or_else(|| format!("scripts/kafka/cluster.properties has no {key}").into())
    };
    let mut listeners = template("listeners")?;
    let mut advertised = template("advertised.listeners")?;
    let mut map = template("listener.security.protocol.map")?;
    for p in Protocol::ALL {
        let (name, port) = p.listener();
        listeners.push_str(&format!(",{name}://@ADDR@:{port}"));
        advertised.push_str(&format!(",{name}://@ADDR@:{port}"));
        map.push_str(&format!(",{name}:{}", p.kafka_name()));
    }
    let sasl = Protocol::SaslSsl.listener().0.to_lowercase();
    let mut extra: Vec<(String, String)> = vec![
        ("listeners".into(), listeners),
        ("advertised.listeners".into(), advertised),
        ("listener.security.protocol.map".into(), map),
        // SCRAM names the principal there, as on the CLIENT listener.
        (
            format!("listener.name.{sasl}.ssl.client.auth"),
            "none".into(),
        ),
        (
            format!("listener.name.{sasl}.sasl.enabled.mechanisms"),
            "SCRAM-SHA-512".into(),
        ),
        (
            format!("listener.name.{sasl}.scram-sha-512.sasl.jaas.config"),
            "org.apache.kafka.common.security.scram.ScramLoginModule required;".into(),
        ),
    ];
    if nodes == 1 {
        for key in [
            "default.replication.factor",
            "min.insync.replicas",
            "offsets.topic.replication.factor",
            "transaction.state.log.replication.factor",
            "transaction.state.log.min.isr",
            "share.coordinator.state.topic.replication.factor",
            "share.coordinator.state.topic.min.isr",
        ] {
            extra.push((key.into(), "1".into()));
        }
    }
    Ok(extra)
}

/// `/proc/loadavg`'s 1, 5 and 15 minute averages (zeros if unreadable).
pub(crate) fn loadavg() -> [f64; 3] {
    let s = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut it = s.split_whitespace().map(|v| v.parse().unwrap_or(0.0));
    [
        it.next().unwrap_or(0.0),
        it.next().unwrap_or(0.0),
        it.next().unwrap_or(0.0),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bench's listeners extend the template's, which stay as they are.
    #[test]
    fn listeners_extend_the_templates() {
        let extra = extra_settings(3).unwrap();
        let get = |k: &str| extra.iter().find(|(key, _)| key == k).unwrap().1.clone();
        let listeners = get("listeners");
        assert!(
            listeners.starts_with("CLIENT://@ADDR@:9092,"),
            "{listeners}"
        );
        assert!(
            listeners.ends_with(",BENCH_SASL://@ADDR@:9098"),
            "{listeners}"
        );
        assert!(get("advertised.listeners").contains("BENCH_PLAIN://@ADDR@:9096"));
        assert!(get("listener.security.protocol.map").ends_with(",BENCH_SASL:SASL_SSL"));
        assert!(!extra.iter().any(|(k, _)| k == "min.insync.replicas"));
        let single = extra_settings(1).unwrap();
        assert!(single.contains(&("min.insync.replicas".into(), "1".into())));
    }
}
