//! Test and benchmark support shared by the e2e tests and graphsink-bench.
//! Both need a private Kafka broker (Apache Kafka by default, tansu on
//! request: `broker`), and the tests an S3 server; keeping
//! the one way to start each here means they cannot drift apart. The fault
//! proxy sits between the object store client and the S3 server, for the
//! storage-fault tests. The hostile-input generator feeds the reject tests. The test Schema
//! Registry serves the registry formats' tests, and their registry faults.
//! `containers` is a second broker backend (Kafka in a container).
//! `cluster` is the production-shaped one: three secured, replicated Kafka
//! nodes on a network of namespaces (`netns`) with Toxiproxy before each
//! (`toxiproxy`), its certificates (`certs`) and ACLs (`acl`).
//! `imports` reads a crate's sources for import circles: every crate of
//! the workspace checks itself with it.

pub mod acl;
pub mod broker;
pub mod certs;
pub mod cluster;
pub mod containers;
pub mod faults;
pub mod hostile;
pub mod imports;
pub mod kafka;
pub mod netns;
pub mod registry;
pub mod s3;
pub mod tansu;
pub mod toxiproxy;

pub use acl::{Acl, Operation, PatternType, ResourceType};
pub use broker::{Backend as BrokerBackend, TestBroker};
pub use cluster::{ClientHost, KafkaCluster, Listener, Options as ClusterOptions};
pub use faults::{Exchange, Fault, FaultProxy, Rule, RuleId};
pub use kafka::Kafka;
pub use netns::{Cut, Host, Network};
pub use registry::TestRegistry;
pub use s3::S3Server;
pub use tansu::{tie_to_parent, Options as TansuOptions, Tansu};
pub use toxiproxy::{Stream, Toxic, Toxiproxy};
