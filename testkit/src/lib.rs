//! Test and benchmark support shared by the e2e tests and graphsink-bench.
//! Both need a private Kafka broker (and the tests an S3 server); keeping the one way to start it here
//! means they cannot drift apart.

pub mod s3;
pub mod tansu;

pub use s3::S3Server;
pub use tansu::Tansu;
