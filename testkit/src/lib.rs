//! Test and benchmark support shared by the e2e tests and graphsink-bench.
//! Both need a private Kafka broker; keeping the one way to start it here
//! means they cannot drift apart.

pub mod tansu;

pub use tansu::Tansu;
