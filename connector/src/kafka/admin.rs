//! Topic creation (dead-letter topics at start, `produce`'s topic), in one
//! place. It reads and writes no records.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::types::RDKafkaErrorCode;

use crate::error::Result;

/// What creating one topic came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TopicCreation {
    Created,
    Exists,
    Failed(String),
}

/// One topic's outcome.
#[derive(Debug, Clone)]
pub(crate) struct TopicOutcome {
    pub topic: String,
    pub outcome: TopicCreation,
}

/// Creates `names` with `partitions` partitions each (replication 1),
/// through an admin client of `config` (a producer config: see `client`).
/// Errors only when no request could be made; per-topic failures are
/// outcomes, for the caller to judge.
pub(crate) async fn create_topics(
    config: &ClientConfig,
    names: &[&str],
    partitions: i32,
) -> Result<Vec<TopicOutcome>> {
    let admin: AdminClient<DefaultClientContext> = config.create()?;
    let topics: Vec<NewTopic<'_>> = names
        .iter()
        .map(|n| NewTopic::new(n, partitions, TopicReplication::Fixed(1)))
        .collect();
    let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
    let results = admin.create_topics(&topics, &opts).await?;
    Ok(results
        .into_iter()
        .map(|r| match r {
            Ok(topic) => TopicOutcome {
                topic,
                outcome: TopicCreation::Created,
            },
            Err((topic, RDKafkaErrorCode::TopicAlreadyExists)) => TopicOutcome {
                topic,
                outcome: TopicCreation::Exists,
            },
            Err((topic, e)) => TopicOutcome {
                topic,
                outcome: TopicCreation::Failed(e.to_string()),
            },
        })
        .collect())
}
