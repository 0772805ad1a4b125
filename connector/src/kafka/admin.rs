//! Topic creation (dead-letter topics at start, `produce`'s topic), in one
//! place: each topic is looked up first and only a missing one is created,
//! with the cluster's default replication factor. It reads and writes no
//! records.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::config::ClientConfig;
use rdkafka::types::RDKafkaErrorCode;

use super::blocking;
use super::client::QuietContext;
use super::denied::Refused;
use crate::error::{Error, Result};

/// One metadata lookup, and the creation request.
const TIMEOUT: Duration = Duration::from_secs(10);

/// What ensuring one topic came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TopicCreation {
    Created,
    Exists,
    /// The cluster refused to describe it (`looked`), or to create it.
    Refused {
        refused: Refused,
        looked: bool,
    },
    Failed(String),
}

/// One topic's outcome.
#[derive(Debug, Clone)]
pub(crate) struct TopicOutcome {
    pub topic: String,
    pub outcome: TopicCreation,
}

/// Looks each of `names` up and creates the missing ones with `partitions`
/// partitions and the cluster's default replication factor
/// (`default.replication.factor`), through an admin client of `config`
/// (a producer config: see `client`). Errors only when no request could be
/// made (librdkafka reports a refusal of the credentials only to a client
/// that polls: the caller's producer); per-topic failures are outcomes,
/// for the caller to judge.
pub(crate) async fn create_topics(
    config: &ClientConfig,
    names: &[&str],
    partitions: i32,
) -> Result<Vec<TopicOutcome>> {
    let mut cc = config.clone();
    // A lookup must not create the topic by itself (with the broker's
    // auto-creation): a producer-type client asks for that by default.
    cc.set("allow.auto.create.topics", "false");
    let admin: AdminClient<QuietContext> = cc.create_with_context(QuietContext::default())?;
    let mut outcomes = Vec::new();
    let mut missing = Vec::new();
    for &name in names {
        match blocking(|| look_up(&admin, name))? {
            None => missing.push(name),
            Some(outcome) => outcomes.push(TopicOutcome {
                topic: name.to_string(),
                outcome,
            }),
        }
    }
    if missing.is_empty() {
        return Ok(outcomes);
    }
    // -1: the cluster's `default.replication.factor` (CreateTopics v4+,
    // which librdkafka passes through).
    let topics: Vec<NewTopic<'_>> = missing
        .iter()
        .map(|n| NewTopic::new(n, partitions, TopicReplication::Fixed(-1)))
        .collect();
    let opts = AdminOptions::new().request_timeout(Some(TIMEOUT));
    let results = admin.create_topics(&topics, &opts).await?;
    outcomes.extend(results.into_iter().map(|r| {
        let (topic, outcome) = match r {
            Ok(topic) => (topic, TopicCreation::Created),
            // Made meanwhile, by another member or an operator.
            Err((topic, RDKafkaErrorCode::TopicAlreadyExists)) => (topic, TopicCreation::Exists),
            Err((topic, code)) => match Refused::of_code(code) {
                Some(refused) => (
                    topic,
                    TopicCreation::Refused {
                        refused,
                        looked: false,
                    },
                ),
                None => (topic, TopicCreation::Failed(code.to_string())),
            },
        };
        TopicOutcome { topic, outcome }
    }));
    Ok(outcomes)
}

/// A topic's metadata: `None` when the cluster does not have it.
fn look_up(admin: &AdminClient<QuietContext>, name: &str) -> Result<Option<TopicCreation>> {
    let md = admin
        .inner()
        .fetch_metadata(Some(name), TIMEOUT)
        .map_err(|e| Error::Broker(format!("kafka: cannot look up topic {name}: {e}")))?;
    let Some(t) = md.topics().iter().find(|t| t.name() == name) else {
        return Ok(None);
    };
    let code = t.error().map(RDKafkaErrorCode::from);
    Ok(match code {
        None if !t.partitions().is_empty() => Some(TopicCreation::Exists),
        None | Some(RDKafkaErrorCode::UnknownTopicOrPartition) => None,
        Some(code) => Some(match Refused::of_code(code) {
            Some(refused) => TopicCreation::Refused {
                refused,
                looked: true,
            },
            None => TopicCreation::Failed(code.to_string()),
        }),
    })
}
