//! The broker under test: a private tansu on a free loopback port (the
//! default), or any broker the user names. Owns the tansu child process and
//! nothing else; starting tansu itself is graphsink-testkit's job, shared
//! with the e2e tests.

use std::path::PathBuf;

use graphsink_testkit::Tansu;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub struct Broker {
    pub bootstrap: String,
    /// Dropping it kills and reaps tansu; `None` for an external broker.
    _tansu: Option<Tansu>,
}

impl Broker {
    pub fn external(bootstrap: String) -> Broker {
        Broker {
            bootstrap,
            _tansu: None,
        }
    }

    /// Starts tansu with memory storage, as scripts/lib.sh does, logging to
    /// `log_dir/tansu.log`, and waits until a metadata request succeeds.
    pub fn start_tansu(
        bin: Option<PathBuf>,
        log_dir: &std::path::Path,
    ) -> Result<Broker, BoxError> {
        let bin = bin.unwrap_or_else(graphsink_testkit::tansu::default_bin);
        if !bin.exists() {
            return Err(format!(
                "tansu not found at {} (run `source scripts/lib.sh && ensure_tansu`, or pass --broker)",
                bin.display()
            )
            .into());
        }
        let tansu = Tansu::start(Some(bin), Some(&log_dir.join("tansu.log")))?;
        Ok(Broker {
            bootstrap: tansu.bootstrap.clone(),
            _tansu: Some(tansu),
        })
    }

    /// tansu's pid (None for an external broker), for its CPU time.
    pub fn pid(&self) -> Option<u32> {
        self._tansu.as_ref().map(Tansu::pid)
    }

    pub async fn create_topic(&self, topic: &str, partitions: i32) -> Result<(), BoxError> {
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
