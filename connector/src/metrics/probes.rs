//! The state behind `/ready` (serving: joined, not fenced, nothing
//! stalled) and `/health` (alive: both loops turning).

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::Metrics;

/// Consecutive failed folds after which `/ready` reports `folds_failing`.
pub(super) const FOLD_FAILURES_NOT_READY: u64 = 3;

/// A loop whose heartbeat is older than this fails `/health`.
pub(super) const HEARTBEAT_BOUND: Duration = Duration::from_secs(30);

/// One fold longer than this fails `/health` (the fold histogram's top
/// bucket is ~5 min; twice that is a stuck fold, not a big one).
pub(super) const FOLD_BOUND: Duration = Duration::from_secs(600);

/// What `/ready` answers, with the condition that failed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Readiness {
    pub ready: bool,
    pub joined: bool,
    pub fenced: bool,
    pub dead_letters_stalled: bool,
    /// A partition holds at a record whose schema the registry has not
    /// answered for (down, slow, 5xx): nothing past it is ingested.
    pub schema_registry_stalled: bool,
    pub durability_stalled: bool,
    pub folds_failing: bool,
}

/// What `/health` answers.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Health {
    pub healthy: bool,
    /// Seconds since the run loop last ticked (absent before it started).
    pub run_loop_age_seconds: Option<u64>,
    /// Seconds the fold loop has been inside its current fold (absent: idle).
    pub fold_busy_seconds: Option<u64>,
}

impl Metrics {
    pub fn readiness(&self) -> Readiness {
        let joined = self.joined.load(Ordering::Relaxed);
        let fenced = self.fenced.load(Ordering::Relaxed);
        let bound = self.stall_bound;
        let dead_letters_stalled = self.dead_letters_retrying.load(Ordering::Relaxed) > 0
            && self.older_than(
                self.dead_letters_failing_since.load(Ordering::Relaxed),
                bound,
            );
        let durability_stalled = self.run.polls_in_flight.get() > 0
            && self.older_than(self.durable_progress.load(Ordering::Relaxed), bound);
        let folds_failing =
            self.consecutive_fold_failures.load(Ordering::Relaxed) >= FOLD_FAILURES_NOT_READY;
        let schema_registry_stalled = self.schema_registry_stalled.load(Ordering::Relaxed);
        Readiness {
            ready: joined
                && !fenced
                && !dead_letters_stalled
                && !schema_registry_stalled
                && !durability_stalled
                && !folds_failing,
            joined,
            fenced,
            dead_letters_stalled,
            schema_registry_stalled,
            durability_stalled,
            folds_failing,
        }
    }

    pub fn health(&self) -> Health {
        let now = self.tick();
        let age = |t: u64| (t != 0).then(|| now.saturating_sub(t) / 1000);
        let run = self.run_heartbeat.load(Ordering::Relaxed);
        let fold = self.fold_busy_since.load(Ordering::Relaxed);
        // Before the run loop starts (opening, recovering) the process is
        // alive; `/ready` says it is not serving yet.
        let healthy = !self.older_than(run, HEARTBEAT_BOUND) && !self.older_than(fold, FOLD_BOUND);
        Health {
            healthy,
            run_loop_age_seconds: age(run),
            fold_busy_seconds: age(fold),
        }
    }
}
