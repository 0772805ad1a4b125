//! End-to-end tests: a real Kafka-protocol broker on loopback, real Lance
//! tables on disk, the real binary where a process must die.

mod binary;
mod cdc;
mod cluster;
mod edges;
mod evolution;
mod formats;
mod ghost;
mod group;
mod harness;
mod ops;
mod pipeline;
mod read;
mod recovery;
mod rejects;
mod retention;
mod scaleout;
mod security;
mod storage;

/// Writes the tracing output of in-process runs to the test's stderr.
/// Their lines are not checked for source locations as the binary's are
/// (`binary`): they share the test's subscriber, not a stderr of their own.
pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,lance=warn,datafusion=warn".into()),
        )
        .with_test_writer()
        .try_init();
}
