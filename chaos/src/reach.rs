//! How the harness's own Kafka clients (the producer, the checker's
//! readers, the commit sampler, topic creation) reach a Kafka: a plain
//! `bootstrap.servers` on loopback for the single brokers, or a client host
//! of the secured cluster (its namespace, and SASL_SSL properties of one
//! principal) for the `--cluster` phases.

use graphsink_testkit::{ClientHost, Host};
use rdkafka::config::{ClientConfig, FromClientConfig};

/// The properties a client needs, and the namespace it must be made in.
#[derive(Clone)]
pub(crate) struct Reach {
    props: Vec<(String, String)>,
    host: Option<Host>,
}

impl Reach {
    /// A broker on this host's loopback, without security.
    pub(crate) fn plain(bootstrap: &str) -> Reach {
        Reach {
            props: vec![("bootstrap.servers".into(), bootstrap.into())],
            host: None,
        }
    }

    /// The cluster as `user` sees it from `host` (SASL_SSL through the
    /// host's Toxiproxy). The host must outlive every client made here.
    pub(crate) fn sasl(host: &ClientHost, user: &str) -> Result<Reach, String> {
        Ok(Reach {
            props: host.sasl_properties(user)?,
            host: Some(host.host().clone()),
        })
    }

    /// A client config with the connection properties set.
    pub(crate) fn config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        for (k, v) in &self.props {
            c.set(k, v);
        }
        c
    }

    /// Creates a client from `config`, in the host's namespace when there
    /// is one: all its connections start there.
    pub(crate) fn create<T: FromClientConfig + Send>(
        &self,
        config: &ClientConfig,
    ) -> Result<T, String> {
        match &self.host {
            None => config.create::<T>().map_err(|e| e.to_string()),
            Some(h) => h.enter(|| config.create::<T>().map_err(|e| e.to_string()))?,
        }
    }
}
