//! The stall watch in the run loop: while holding no partition, once a
//! bound has passed, it looks at the group's progress on the mapped
//! topics; it rejoins on a first stall and fails the run on a second. The
//! decision is `kafka::stall`'s (docs/decisions/0002-group-liveness.md).

use super::run_loop::RunLoop;
use crate::error::{Error, Result};
use crate::kafka::consumer::{self, GroupConsumer};
use crate::kafka::stall::Verdict;

impl RunLoop<'_> {
    pub(super) async fn watch_stall(&mut self, kafka: &GroupConsumer) -> Result<()> {
        let now = tokio::time::Instant::now();
        if !self.stall.due(now) {
            return Ok(());
        }
        let topics = consumer::mapped_topics(self.config)
            .into_iter()
            .map(String::from)
            .collect();
        let seen = match self.queries.progress(topics).await {
            Ok(seen) => seen,
            Err(e) => {
                // A broker that cannot answer is not a stuck group; librdkafka
                // reports the outage itself.
                tracing::debug!(error = %e, "stall watch: cannot read the group's progress");
                return Ok(());
            }
        };
        match self.stall.judge(now, seen) {
            Verdict::Fine => Ok(()),
            Verdict::Rejoin { lag, stalled } => {
                tracing::warn!(
                    lag,
                    stalled = ?stalled,
                    bound = ?self.stall.bound(),
                    group = self.queries.group(),
                    "holding no partition while the mapped topics have lag and no member advances \
                     their committed offsets; rejoining the group (re-subscribe)"
                );
                consumer::resubscribe(kafka, self.config)
            }
            Verdict::GiveUp { lag, .. } => Err(Error::Unassigned {
                group: self.queries.group().to_string(),
                lag,
                waited: self.stall.bound() * 4,
            }),
        }
    }
}
