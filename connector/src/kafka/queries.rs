//! Offset queries of the config's consumer group, without joining it:
//! partitions of topics, high and low watermarks, committed offsets. They
//! are blocking librdkafka calls, so every method runs its call on
//! tokio's blocking pool, never on an async worker.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};

use super::client::{self, QuietContext};
use super::stall::GroupProgress;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::types::TopicPartition;

const TIMEOUT: Duration = Duration::from_secs(10);

/// A query client; cheap to clone (one librdkafka client behind an `Arc`).
#[derive(Clone)]
pub(crate) struct OffsetQueries {
    inner: Arc<Inner>,
}

struct Inner {
    consumer: BaseConsumer<QuietContext>,
    servers: String,
    group: String,
}

/// A partition's low and high watermarks (first retained offset, end offset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Watermarks {
    pub low: i64,
    pub high: i64,
}

/// A topic the broker does not know, with its error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingTopic {
    pub topic: String,
    pub error: String,
}

/// The partitions of some topics, as the broker's metadata lists them.
#[derive(Debug, Default)]
pub(crate) struct TopicPartitions {
    /// Sorted by topic (as asked), then partition.
    pub partitions: Vec<TopicPartition>,
    pub missing: Vec<MissingTopic>,
}

impl OffsetQueries {
    /// A client of the config's cluster and group; it connects lazily.
    pub(crate) fn connect(config: &Config) -> Result<OffsetQueries> {
        let consumer = client::consumer_config(config).create_with_context(QuietContext)?;
        Ok(OffsetQueries {
            inner: Arc::new(Inner {
                consumer,
                servers: client::servers(config).to_string(),
                group: config.kafka.get("group.id").cloned().unwrap_or_default(),
            }),
        })
    }

    pub(crate) fn group(&self) -> &str {
        &self.inner.group
    }

    /// The partitions of `topics`, in the order given.
    pub(crate) async fn partitions(&self, topics: Vec<String>) -> Result<TopicPartitions> {
        self.off_runtime(move |q| {
            let mut out = TopicPartitions::default();
            for t in topics {
                let md = q
                    .consumer
                    .fetch_metadata(Some(&t), TIMEOUT)
                    .map_err(|e| q.fail(format!("fetch metadata of {t}"), e))?;
                let found = md.topics().iter().find(|x| x.name() == t);
                let error = match found {
                    Some(mt) => match mt.error() {
                        None => {
                            let mut ids: Vec<i32> =
                                mt.partitions().iter().map(|p| p.id()).collect();
                            ids.sort();
                            out.partitions
                                .extend(ids.into_iter().map(|p| (t.clone(), p)));
                            continue;
                        }
                        Some(e) => rdkafka::types::RDKafkaErrorCode::from(e).to_string(),
                    },
                    None => "not in the broker's metadata".to_string(),
                };
                out.missing.push(MissingTopic { topic: t, error });
            }
            Ok(out)
        })
        .await
    }

    /// Watermarks of `partitions`.
    pub(crate) async fn watermarks(
        &self,
        partitions: Vec<TopicPartition>,
    ) -> Result<BTreeMap<TopicPartition, Watermarks>> {
        self.off_runtime(move |q| {
            let mut out = BTreeMap::new();
            for (t, p) in partitions {
                let (low, high) = q
                    .consumer
                    .fetch_watermarks(&t, p, TIMEOUT)
                    .map_err(|e| q.fail(format!("fetch watermarks of {t}/{p}"), e))?;
                out.insert((t, p), Watermarks { low, high });
            }
            Ok(out)
        })
        .await
    }

    /// The group's committed offsets of `partitions` (missing = none yet).
    pub(crate) async fn committed(
        &self,
        partitions: Vec<TopicPartition>,
    ) -> Result<BTreeMap<TopicPartition, i64>> {
        if partitions.is_empty() {
            return Ok(BTreeMap::new());
        }
        self.off_runtime(move |q| {
            let mut tpl = TopicPartitionList::new();
            for (t, p) in &partitions {
                tpl.add_partition(t, *p);
            }
            let got = q
                .consumer
                .committed_offsets(tpl, TIMEOUT)
                .map_err(|e| q.fail(format!("fetch committed offsets of group {}", q.group), e))?;
            Ok(got
                .elements()
                .iter()
                .filter_map(|e| match e.offset() {
                    Offset::Offset(n) => Some(((e.topic().to_string(), e.partition()), n)),
                    _ => None,
                })
                .collect())
        })
        .await
    }

    /// The group's committed offsets of every partition of `topics`, and
    /// the records between them (or the start) and the end.
    pub(crate) async fn progress(&self, topics: Vec<String>) -> Result<GroupProgress> {
        let parts = self.partitions(topics).await?.partitions;
        let ends = self.watermarks(parts.clone()).await?;
        let committed = self.committed(parts).await?;
        let lag = ends
            .iter()
            .map(|(tp, w)| (w.high - committed.get(tp).copied().unwrap_or(w.low)).max(0))
            .sum();
        Ok(GroupProgress { committed, lag })
    }

    async fn off_runtime<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || f(&inner))
            .await
            .map_err(|e| Error::joined("kafka query", e))?
    }
}

impl Inner {
    fn fail(&self, what: String, e: KafkaError) -> Error {
        Error::Other(format!("kafka at {}: cannot {what}: {e}", self.servers))
    }
}
