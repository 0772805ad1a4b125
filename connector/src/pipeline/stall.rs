//! The stall watch in the run loop: while this member waits on partitions
//! it does not hold (it holds none, or `--exit-at-end` has done its own and
//! waits for another member's), once a bound has passed it looks at the
//! group's progress on those partitions; it rejoins on a first stall and
//! fails the run on a second. The decision is `kafka::stall`'s
//! (docs/decisions/0002-group-liveness.md).

use std::collections::BTreeSet;

use super::run_loop::RunLoop;
use crate::error::{Error, ErrorKind, Result};
use crate::kafka::consumer::{self, GroupConsumer};
use crate::kafka::stall::{StallWatch, Verdict};

impl RunLoop<'_> {
    pub(super) async fn watch_stall(&mut self, kafka: &GroupConsumer) -> Result<()> {
        let now = tokio::time::Instant::now();
        let holding = !self.assigned.is_empty();
        let bound = self.stall.bound();
        let watch = if holding {
            // Created at the first wait and kept for the session: a rejoin
            // that gives this member the same partitions must not reset it.
            self.end_stall
                .get_or_insert_with(|| StallWatch::new(bound, now))
        } else {
            &mut self.stall
        };
        if !watch.due(now) {
            return Ok(());
        }
        let topics = consumer::mapped_topics(self.config)
            .into_iter()
            .map(String::from)
            .collect();
        let held: BTreeSet<_> = self.assigned.iter().cloned().collect();
        let seen = match self.queries.progress(topics, &held).await {
            Ok(seen) => seen,
            // A permission refused is no outage: the run stops saying so.
            Err(e) if e.kind() == ErrorKind::NotAuthorized => return Err(e),
            Err(e) => {
                // A broker that cannot answer is not a stuck group; librdkafka
                // reports the outage itself.
                tracing::debug!(error = %e, "stall watch: cannot read the group's progress");
                return Ok(());
            }
        };
        let watch = if holding {
            self.end_stall.as_mut().expect("created above")
        } else {
            &mut self.stall
        };
        match watch.judge(now, seen) {
            Verdict::Fine => Ok(()),
            Verdict::Rejoin { lag, stalled } => {
                tracing::warn!(
                    lag,
                    stalled = ?stalled,
                    bound = ?bound,
                    group = self.queries.group(),
                    holding = holding,
                    "the mapped partitions this member does not hold have lag and no member \
                     advances their committed offsets; rejoining the group (re-subscribe)"
                );
                consumer::resubscribe(kafka, self.config)
            }
            Verdict::GiveUp { lag, .. } if holding => Err(Error::EndUnreached {
                group: self.queries.group().to_string(),
                partitions: self
                    .end
                    .waits_elsewhere()
                    .unwrap_or_default()
                    .iter()
                    .map(|(t, p)| format!("{t}/{p}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                lag,
                waited: bound * 4,
            }),
            Verdict::GiveUp { lag, .. } => Err(Error::Unassigned {
                group: self.queries.group().to_string(),
                lag,
                waited: bound * 4,
            }),
        }
    }
}
