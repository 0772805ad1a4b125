//! The group's events in the run loop. Under partition sharding an
//! assignment claims the shards of its partitions before the next record
//! is read (the loop is biased to control events), a revoke releases
//! them, and the fold task learns this member's duty (`role.rs`).

use super::run_loop::RunLoop;
use crate::error::{Error, Result};
use crate::kafka::consumer::{self, GroupEvent};
use crate::kafka::denied::{self, Refused};
use crate::offsets::TopicPartition;

impl RunLoop<'_> {
    pub(super) async fn on_group_event(&mut self, ev: GroupEvent) -> Result<()> {
        match ev {
            GroupEvent::Assigned(tps) => self.on_assigned(tps).await?,
            GroupEvent::Revoked(tps) => self.on_revoked(tps),
            GroupEvent::Refused { refused, topics } => {
                return Err(match refused {
                    Refused::Topic if !topics.is_empty() => {
                        refused.needs(denied::read_topics(&topics))
                    }
                    _ => self.refused(refused).await,
                })
            }
        }
        self.stall
            .holds(!self.assigned.is_empty(), tokio::time::Instant::now());
        if let Some(role) = &self.role {
            role.holds(&self.assigned);
        }
        Ok(())
    }

    async fn on_assigned(&mut self, tps: Vec<TopicPartition>) -> Result<()> {
        tracing::info!(event = "assigned", count = tps.len(), partitions = %names(&tps), "assigned");
        self.metrics.assigned(&tps);
        if let Some(role) = &self.role {
            let held = self.assigned.iter().chain(&tps).cloned().collect();
            if let Some(e) = role.split_shard(&held) {
                return Err(e);
            }
            let shards = self.pool.shards_of(&tps, &role.feeds);
            let started = std::time::Instant::now();
            self.pool.claim(&shards).await?;
            self.pool.close_parked();
            tracing::info!(shards = shards.len(), took = ?started.elapsed(), "claimed the shards of the assigned partitions");
        }
        self.assigned.extend(tps);
        Ok(())
    }

    pub(super) fn on_revoked(&mut self, tps: Vec<TopicPartition>) {
        tracing::info!(event = "revoked", count = tps.len(), partitions = %names(&tps), "revoked");
        self.metrics.revoked(&tps);
        if let Some(role) = &self.role {
            let shards = self.pool.shards_of(&tps, &role.feeds);
            self.pool.release(&shards);
        }
        self.schemas.forget(&tps, &self.metrics);
        self.offsets.forget(&tps);
        for tp in &tps {
            self.assigned.remove(tp);
        }
    }

    /// What a refusal of the group consumer comes to (`kafka::denied`).
    pub(super) async fn refused(&mut self, refused: Refused) -> Error {
        consumer::refusal(refused, self.config, &self.queries, &self.assigned).await
    }

    /// Writes a fencing failed: fatal (the session restarts) unless each
    /// failed shard was released here, its partitions revoked, and is not
    /// held again. Then its records are the next owner's (it re-reads them
    /// from the committed offset, and replays whatever reached the WAL),
    /// and the ack queue drops the revoked partitions from this ack.
    pub(super) fn on_moved(&mut self, moved: Vec<(String, u32, Error)>) -> Result<()> {
        for (table, bucket, e) in moved {
            let gone = self.role.is_some() && self.pool.released(&table, bucket);
            if !gone {
                return Err(e);
            }
            tracing::info!(
                table,
                bucket,
                "writes of a shard that moved to another member were not acked here"
            );
        }
        Ok(())
    }
}

/// Partitions as `topic/partition` lines joined by commas, for log fields.
fn names(tps: &[TopicPartition]) -> String {
    tps.iter()
        .map(|(t, p)| format!("{t}/{p}"))
        .collect::<Vec<_>>()
        .join(",")
}
