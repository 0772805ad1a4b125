//! Test and benchmark support shared by the e2e tests and graphsink-bench.
//! Both need a private Kafka broker; keeping the one way to start it here
//! means they cannot drift apart. The fault proxy sits between the object
//! store client and a local S3 server, for the storage-fault tests.

pub mod faults;
pub mod tansu;

pub use faults::{Exchange, Fault, FaultProxy, Rule, RuleId};
pub use tansu::Tansu;
