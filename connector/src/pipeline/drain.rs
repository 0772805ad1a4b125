//! How a session stops. A graceful stop drains: in-flight durability, a
//! last commit, the fold task's final fold, the writers closed. A failed
//! one acks nothing more: no drain, no commit, and the fold task ends
//! (bounded) instead of outliving the run.

use std::time::Duration;

use rdkafka::consumer::CommitMode;
use tokio::sync::mpsc;

use super::run_loop::RunLoop;
use super::RunSummary;
use crate::error::{Error, Result};
use crate::failpoints;
use crate::fold::{FoldTask, FromFold};
use crate::kafka::consumer::{self, GroupConsumer, GroupEvent};

/// How long a failed run waits for the fold task to end before aborting it.
const FOLD_STOP_BOUND: Duration = Duration::from_secs(30);

/// Every failed exit of a session: the fold task ends (bounded) and the
/// consumer leaves the group off the runtime. Returns `error`.
pub(super) async fn stop_after_failure(
    kafka: GroupConsumer,
    fold: FoldTask,
    error: Error,
) -> Error {
    tracing::error!(error = %error, "stopping without committing further");
    fold.abandon(FOLD_STOP_BOUND).await;
    consumer::close(kafka).await;
    error
}

impl RunLoop<'_> {
    /// Awaits in-flight durability, commits synchronously, lets the fold
    /// loop finish (with its final fold), closes writers.
    pub(super) async fn drain(
        mut self,
        kafka: GroupConsumer,
        events: &mut mpsc::UnboundedReceiver<GroupEvent>,
        mut fold: FoldTask,
    ) -> Result<RunSummary> {
        // Commit what became durable even when a later poll failed (e.g.
        // the dead-letter topic stayed down through the shutdown).
        let failed = self.await_in_flight().await;
        // A revoke the loop had not served yet (the stop came while the
        // revoke callback ran): those partitions are not ours to commit.
        while let Ok(ev) = events.try_recv() {
            if let GroupEvent::Revoked(tps) = ev {
                self.on_revoked(tps);
            }
        }
        let committed = match failpoints::hit(failpoints::DRAIN_BEFORE_COMMIT) {
            Ok(()) => self.final_commit(&kafka).await,
            Err(e) => Err(e),
        }
        .and_then(|()| failpoints::hit(failpoints::DRAIN_BEFORE_FOLD));
        if let Some(e) = committed.err().or(failed) {
            return Err(stop_after_failure(kafka, fold, e).await);
        }
        fold.stop();
        // A refusal the dead-letter clients met in the background (the
        // start's probes) that nothing in the run met again: a clean end
        // would hide a permission the next reject needs.
        let final_fold = self.serve_final_fold(&mut fold).await;
        if let Some(e) = final_fold.err().or_else(|| self.dead_letters.refused()) {
            return Err(stop_after_failure(kafka, fold, e).await);
        }
        let summary = RunSummary {
            records: self.taken,
            committed: self.offsets.watermarks().into_iter().collect(),
        };
        if let Err(e) = failpoints::hit(failpoints::DRAIN_BEFORE_CLOSE) {
            return Err(stop_after_failure(kafka, fold, e).await);
        }
        // Leave the group before closing writers so partitions move on promptly.
        consumer::close(kafka).await;
        self.pool.close().await?;
        Ok(summary)
    }

    /// The drain's commit. A group that no longer counts this member (its
    /// session expired, or a rebalance took its partitions meanwhile)
    /// refuses it: the partitions are another member's now, and it reads
    /// them from the group's offsets again (idempotent by id). That is a
    /// hand-off, not a failure: the stop goes on to its final fold.
    async fn final_commit(&mut self, kafka: &GroupConsumer) -> Result<()> {
        match self.commit(kafka, CommitMode::Sync).await {
            Err(e) if consumer::no_longer_member(&e) => {
                tracing::warn!(error = %e, "the group no longer counts this member: nothing more committed; the partitions' next owner re-reads (idempotent)");
                Ok(())
            }
            other => other,
        }
    }

    /// Applies every in-flight ack in order, up to the first failure;
    /// returns that failure.
    async fn await_in_flight(&mut self) -> Option<Error> {
        let mut failed = None;
        while let Some(durable) = self.acks.next().await {
            match durable {
                Ok(durable) if failed.is_none() => {
                    if let Err(e) = self.on_durable(durable) {
                        failed = Some(e);
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        failed
    }

    /// Serves the fold loop's cuts until it ends (after its final fold).
    async fn serve_final_fold(&mut self, fold: &mut FoldTask) -> Result<()> {
        loop {
            match fold.next().await {
                FromFold::Cut(req) => self.cut(req).await,
                FromFold::Ended(result) => return result,
            }
        }
    }
}
