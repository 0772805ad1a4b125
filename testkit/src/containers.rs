//! The second broker backend: Apache Kafka (KRaft, the apache/kafka-native
//! image) in a container through testcontainers, where a Docker engine
//! exists. Selected by `GRAPHSINK_TEST_BROKER_BACKEND=containers`; the
//! default is Apache Kafka run from its Maven jars (crate::kafka). Needs the
//! `containers` feature, which the e2e tests' build turns on (a build without
//! it, the bench's or the chaos harness's alone, gets a `start` that says so).
//! CI has no Docker engine: it only compiles and lints this.

pub use crate::broker::BACKEND_VAR;

/// Whether the environment asks for the container backend.
pub fn selected() -> bool {
    std::env::var(BACKEND_VAR).is_ok_and(|v| v == "containers")
}

/// A running Kafka container; dropping it stops and removes the container.
pub struct KafkaContainer {
    pub bootstrap: String,
    #[cfg(feature = "containers")]
    _container: testcontainers_modules::testcontainers::Container<
        testcontainers_modules::kafka::apache::Kafka,
    >,
}

/// Starts Apache Kafka in a container (pulls the image on first use).
#[cfg(feature = "containers")]
pub fn start() -> Result<KafkaContainer, String> {
    use testcontainers_modules::kafka::apache;
    use testcontainers_modules::testcontainers::runners::SyncRunner;
    let container = apache::Kafka::default()
        .start()
        .map_err(|e| format!("start the Kafka container (is a Docker engine running?): {e}"))?;
    let port = container
        .get_host_port_ipv4(apache::KAFKA_PORT)
        .map_err(|e| format!("the Kafka container's port: {e}"))?;
    Ok(KafkaContainer {
        bootstrap: format!("127.0.0.1:{port}"),
        _container: container,
    })
}

#[cfg(not(feature = "containers"))]
pub fn start() -> Result<KafkaContainer, String> {
    Err(format!(
        "{BACKEND_VAR}=containers needs graphsink-testkit's `containers` feature: \
         build with --features graphsink-testkit/containers"
    ))
}
