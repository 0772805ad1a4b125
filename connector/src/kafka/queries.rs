//! Offset queries of the config's consumer group, without joining it:
//! partitions of topics, high and low watermarks, committed offsets. They
//! are blocking librdkafka calls, so every method runs its call on
//! tokio's blocking pool, never on an async worker.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};

use super::client::{self, QuietContext};
use super::denied::{self, Refused};
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
    /// `sasl.username`, to name in a refusal of the credentials.
    username: Option<String>,
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
    /// The broker refused to describe it (TOPIC_AUTHORIZATION_FAILED).
    pub(crate) refused: bool,
}

/// The partitions of some topics, as the broker's metadata lists them.
#[derive(Debug, Default)]
pub(crate) struct TopicPartitions {
    /// Sorted by topic (as asked), then partition.
    pub partitions: Vec<TopicPartition>,
    pub missing: Vec<MissingTopic>,
}

impl TopicPartitions {
    /// `NotAuthorized` naming the topics whose metadata was refused: a
    /// caller that needs them all must not take them for missing.
    pub(crate) fn refusal(&self) -> Option<Error> {
        let refused: Vec<String> = self
            .missing
            .iter()
            .filter(|m| m.refused)
            .map(|m| m.topic.clone())
            .collect();
        (!refused.is_empty()).then(|| Refused::Topic.needs(denied::read_topics(&refused)))
    }
}

impl OffsetQueries {
    /// A client of the config's cluster and group; it connects lazily.
    pub(crate) fn connect(config: &Config) -> Result<OffsetQueries> {
        let consumer =
            client::consumer_config(config).create_with_context(QuietContext::default())?;
        Ok(OffsetQueries {
            inner: Arc::new(Inner {
                consumer,
                servers: client::servers(config).to_string(),
                group: config.kafka.get("group.id").cloned().unwrap_or_default(),
                username: config.kafka.get("sasl.username").cloned(),
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
                let md = q.consumer.fetch_metadata(Some(&t), TIMEOUT).map_err(|e| {
                    q.fail(format!("fetch metadata of {t}"), e, denied::read_topic(&t))
                })?;
                let found = md.topics().iter().find(|x| x.name() == t);
                let mut refused = false;
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
                        Some(e) => {
                            let code = rdkafka::types::RDKafkaErrorCode::from(e);
                            refused = Refused::of_code(code) == Some(Refused::Topic);
                            code.to_string()
                        }
                    },
                    None => "not in the broker's metadata".to_string(),
                };
                out.missing.push(MissingTopic {
                    topic: t,
                    error,
                    refused,
                });
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
                let (low, high) = q.consumer.fetch_watermarks(&t, p, TIMEOUT).map_err(|e| {
                    q.fail(
                        format!("fetch watermarks of {t}/{p}"),
                        e,
                        denied::read_topic(&t),
                    )
                })?;
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
            let got = q.consumer.committed_offsets(tpl, TIMEOUT).map_err(|e| {
                let what = format!("fetch committed offsets of group {}", q.group);
                q.fail(what, e, denied::read_group(&q.group))
            })?;
            // A partition of a topic the group may not read comes back
            // with its own error, and no offset.
            for e in got.elements() {
                if let Err(k) = e.error() {
                    if Refused::of(&k) == Some(Refused::Topic) {
                        return Err(Refused::Topic.needs(denied::read_topic(e.topic())));
                    }
                }
            }
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

    /// The group's committed offsets of every partition of `topics` but
    /// those in `skip` (what this member holds), and the records between
    /// them (or the start) and the end.
    pub(crate) async fn progress(
        &self,
        topics: Vec<String>,
        skip: &BTreeSet<TopicPartition>,
    ) -> Result<GroupProgress> {
        let found = self.partitions(topics).await?;
        if let Some(e) = found.refusal() {
            return Err(e);
        }
        let mut parts = found.partitions;
        parts.retain(|tp| !skip.contains(tp));
        let ends = self.watermarks(parts.clone()).await?;
        let committed = self.committed(parts).await?;
        let lag = ends
            .iter()
            .map(|(tp, w)| (w.high - committed.get(tp).copied().unwrap_or(w.low)).max(0))
            .sum();
        Ok(GroupProgress { committed, lag })
    }

    /// The group's members as the coordinator lists them (DescribeGroups,
    /// through librdkafka's group list), each with what it holds.
    pub(crate) async fn members(&self) -> Result<GroupMembers> {
        self.off_runtime(|q| {
            let list = q
                .consumer
                .fetch_group_list(Some(&q.group), TIMEOUT)
                .map_err(|e| {
                    let what = format!("describe group {}", q.group);
                    q.fail(what, e, denied::read_group(&q.group))
                })?;
            let Some(g) = list.groups().iter().find(|g| g.name() == q.group) else {
                return Ok(GroupMembers::default());
            };
            let mut members: Vec<GroupMember> = g
                .members()
                .iter()
                .map(|m| GroupMember {
                    member_id: m.id().to_string(),
                    client_id: m.client_id().to_string(),
                    host: m.client_host().to_string(),
                    // Only a consumer group's bytes are in this format.
                    assigned: (g.protocol_type() == "consumer")
                        .then(|| m.assignment().and_then(consumer_assignment))
                        .flatten(),
                })
                .collect();
            members.sort_by(|a, b| (&a.client_id, &a.member_id).cmp(&(&b.client_id, &b.member_id)));
            Ok(GroupMembers {
                state: g.state().to_string(),
                protocol: g.protocol().to_string(),
                members,
            })
        })
        .await
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

/// A consumer group as its coordinator describes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupMembers {
    /// `Stable`, `PreparingRebalance`, `CompletingRebalance`, `Empty`,
    /// `Dead`; empty when the broker does not know the group.
    pub state: String,
    /// The assignor the group agreed on (`cooperative-sticky`, `range`).
    pub protocol: String,
    pub members: Vec<GroupMember>,
}

/// One member of the group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMember {
    pub member_id: String,
    pub client_id: String,
    pub host: String,
    /// The partitions assigned to it; `None` when its assignment is not in
    /// the classic consumer protocol's format (or is not there yet).
    pub assigned: Option<Vec<TopicPartition>>,
}

/// Parses a classic consumer-protocol assignment (Kafka's
/// `ConsumerProtocolAssignment`: `i16` version, then an array of topics,
/// each a string and an array of `i32` partitions; user data and later
/// fields follow and are not needed). Versions past 3 are read as 3, as
/// Kafka does. `None` if malformed.
pub(crate) fn consumer_assignment(bytes: &[u8]) -> Option<Vec<TopicPartition>> {
    struct Reader<'a>(&'a [u8]);
    impl Reader<'_> {
        fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
            let (head, rest) = self.0.split_at_checked(N)?;
            self.0 = rest;
            head.try_into().ok()
        }
        fn i16(&mut self) -> Option<i16> {
            self.take::<2>().map(i16::from_be_bytes)
        }
        fn i32(&mut self) -> Option<i32> {
            self.take::<4>().map(i32::from_be_bytes)
        }
        fn string(&mut self) -> Option<String> {
            let n = usize::try_from(self.i16()?).ok()?;
            let (head, rest) = self.0.split_at_checked(n)?;
            self.0 = rest;
            String::from_utf8(head.to_vec()).ok()
        }
    }
    let mut r = Reader(bytes);
    if r.i16()? < 0 {
        return None;
    }
    let mut out = Vec::new();
    for _ in 0..r.i32()?.max(0) {
        let topic = r.string()?;
        for _ in 0..r.i32()?.max(0) {
            out.push((topic.clone(), r.i32()?));
        }
    }
    out.sort();
    Some(out)
}

impl Inner {
    /// A failed query: `NotAuthorized` if the cluster refused it (`needs`
    /// names what it asked for) or refused the client's credentials.
    fn fail(&self, what: String, e: KafkaError, needs: String) -> Error {
        let credentials = || {
            let seen = client::queued_refusal(&self.consumer);
            seen.filter(|r| *r == Refused::Credentials)
        };
        match Refused::of(&e).or_else(credentials) {
            Some(Refused::Credentials) => {
                Refused::Credentials.needs(denied::credentials(self.username.as_deref()))
            }
            Some(r) => r.needs(needs),
            None => Error::Broker(format!("kafka at {}: cannot {what}: {e}", self.servers)),
        }
    }
}

/// Each mapped topic's partition count, as the broker reports it; a topic
/// the broker does not know is a configuration error under partition
/// sharding, whose shards are the partitions.
pub(crate) async fn partition_counts(config: &Config) -> Result<BTreeMap<String, u32>> {
    let topics: BTreeSet<String> = config.mappings.iter().map(|m| m.topic.clone()).collect();
    let found = OffsetQueries::connect(config)?
        .partitions(topics.into_iter().collect())
        .await?;
    if let Some(e) = found.refusal() {
        return Err(e);
    }
    if let Some(m) = found.missing.first() {
        return Err(Error::config(format!(
            "topic {} ({}): under wal.sharding = \"partition\" every mapped topic must exist \
             first, created with its final partition count",
            m.topic, m.error
        )));
    }
    let mut out = BTreeMap::new();
    for (t, _) in found.partitions {
        *out.entry(t).or_insert(0) += 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assignment(version: i16, topics: &[(&str, &[i32])], tail: &[u8]) -> Vec<u8> {
        let mut b = version.to_be_bytes().to_vec();
        b.extend((topics.len() as i32).to_be_bytes());
        for (t, parts) in topics {
            b.extend((t.len() as i16).to_be_bytes());
            b.extend(t.as_bytes());
            b.extend((parts.len() as i32).to_be_bytes());
            for p in *parts {
                b.extend(p.to_be_bytes());
            }
        }
        b.extend(tail);
        b
    }

    #[test]
    fn a_consumer_protocol_assignment_is_read_as_topic_partitions() {
        // Version 1 with empty user data (-1) after the topics.
        let bytes = assignment(1, &[("b", &[2, 0]), ("a", &[1])], &(-1i32).to_be_bytes());
        let want = vec![
            ("a".to_string(), 1),
            ("b".to_string(), 0),
            ("b".to_string(), 2),
        ];
        assert_eq!(consumer_assignment(&bytes), Some(want));
        assert_eq!(consumer_assignment(&assignment(0, &[], &[])), Some(vec![]));
        // A later version keeps the same prefix.
        let later = assignment(7, &[("t", &[3])], &[9, 9, 9]);
        assert_eq!(
            consumer_assignment(&later),
            Some(vec![("t".to_string(), 3)])
        );
    }

    #[test]
    fn a_malformed_or_foreign_assignment_is_none() {
        let bytes = assignment(1, &[("topic", &[0, 1])], &[]);
        // Cut inside the partitions, a negative version, nothing at all.
        assert_eq!(consumer_assignment(&bytes[..bytes.len() - 2]), None);
        assert_eq!(
            consumer_assignment(&assignment(-1, &[("t", &[0])], &[])),
            None
        );
        assert_eq!(consumer_assignment(&[]), None);
    }
}
