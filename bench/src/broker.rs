//! The broker under test: a private Apache Kafka on free loopback ports
//! (the default), tansu 0.6 (`--broker-backend tansu`, the figures of the
//! first rounds), or any broker the user names. Owns the broker process and
//! nothing else; starting it is graphsink-testkit's job, shared with the e2e
//! tests and the chaos harness.

use std::path::PathBuf;

use graphsink_testkit::{BrokerBackend, TestBroker};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub(crate) struct Broker {
    pub bootstrap: String,
    /// What runs it, for the report ("Apache Kafka 4.4.0 (KRaft) at ...").
    pub describe: String,
    /// Dropping it kills the broker; `None` for an external broker.
    private: Option<TestBroker>,
}

impl Broker {
    pub(crate) fn external(bootstrap: String) -> Broker {
        Broker {
            describe: bootstrap.clone(),
            bootstrap,
            private: None,
        }
    }

    /// Starts a private broker of `backend` ("kafka" or "tansu"), logging to
    /// `log_dir/broker.log`, and waits until a metadata request succeeds.
    pub(crate) fn start(
        backend: &str,
        tansu_bin: Option<PathBuf>,
        log_dir: &std::path::Path,
    ) -> Result<Broker, BoxError> {
        let backend = match backend {
            "kafka" => BrokerBackend::Kafka,
            "tansu" => BrokerBackend::Tansu(
                tansu_bin.unwrap_or_else(graphsink_testkit::tansu::default_bin),
            ),
            other => {
                return Err(format!("--broker-backend {other}: expected kafka or tansu").into())
            }
        };
        let b = TestBroker::start(&backend, Some(&log_dir.join("broker.log")))
            .map_err(|e| format!("{e} (or pass --broker)"))?;
        Ok(Broker {
            bootstrap: b.bootstrap.clone(),
            describe: format!("{} at {}", backend.describe(), b.bootstrap),
            private: Some(b),
        })
    }

    /// The broker's pid (None for an external broker), for its CPU time.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.private.as_ref().and_then(TestBroker::pid)
    }

    pub(crate) async fn create_topic(&self, topic: &str, partitions: i32) -> Result<(), BoxError> {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .create()?;
        let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
        for r in admin.create_topics([&new], &AdminOptions::new()).await? {
            r.map_err(|(t, e)| format!("create topic {t}: {e}"))?;
        }
        Ok(())
    }
}
