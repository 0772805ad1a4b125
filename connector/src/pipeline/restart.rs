//! Whether a failed ingest session restarts in the process, and how long
//! it waits first. A failed session has committed nothing past
//! durability, so a new one can start over from the group's committed
//! offsets: `run_with` restarts for failures that pass and stops for the
//! rest.

use std::time::Duration;

use crate::config::Sharding;
use crate::error::{Error, ErrorKind};

/// Why a failed session is restarted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Restart {
    /// `evolve = "from_registry"` met a writer schema with new optional
    /// fields: nothing failed, the next session adds them (no backoff).
    SchemaGrew,
    /// Under partition sharding, another member claimed a shard of this
    /// one: the group moved its partition while this member was away (a
    /// pause past the session timeout). Nothing past durability was acked,
    /// so it rejoins.
    Fenced,
    /// Under partition sharding, another member published a graph commit
    /// while this one folded (the fold partition moved): the new session
    /// re-reads who folds and recovers whatever this fold left.
    CommitRace,
    /// Storage failed in a way that passes (`Error::is_passing_storage_failure`,
    /// docs/decisions/0001-object-storage.md): shards reopen and replay.
    Storage,
}

/// The restart a failure calls for, or `None`: the run stops with it.
pub(super) fn restart_for(e: &Error, sharding: Sharding) -> Option<Restart> {
    if matches!(e, Error::RegistrySchemaGrew { .. }) {
        return Some(Restart::SchemaGrew);
    }
    let partitioned = sharding == Sharding::Partition;
    let storage = e.is_passing_storage_failure();
    let fenced = e.kind() == ErrorKind::Fenced;
    if !(storage || (partitioned && (fenced || e.is_commit_race()))) {
        return None;
    }
    Some(if fenced {
        Restart::Fenced
    } else if e.is_commit_race() && !storage {
        Restart::CommitRace
    } else {
        Restart::Storage
    })
}

impl Restart {
    /// The one log line of a restart.
    pub(super) fn say(self, e: &Error, retry_in: Duration) {
        match self {
            Restart::SchemaGrew => tracing::info!(event = "registry_schema_grew", "{e}"),
            Restart::Fenced => tracing::warn!(
                event = "fenced",
                error = %e,
                ?retry_in,
                "another member claimed a shard of this one (the group moved its \
                 partition): rejoining the group in this process; records not yet \
                 acked are read again by their owner"
            ),
            Restart::CommitRace => tracing::warn!(
                event = "commit_race",
                error = %e,
                ?retry_in,
                "another member published a graph commit while this one folded \
                 (the fold partition moved): restarting the session in this process; \
                 the new folder recovers what this fold left"
            ),
            Restart::Storage => tracing::warn!(
                error = %e,
                ?retry_in,
                "storage failed; restarting the ingest session in this process \
                 (shards reopen and replay; records not yet acked are read again)"
            ),
        }
    }
}

/// The wait before restarting a session that failed: doubling from 250 ms
/// up to `max`, and back to the start after a session that ran a minute
/// (it was not the same outage).
pub(super) struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(250);

    pub(super) fn new(max: Duration) -> Self {
        Backoff {
            next: Self::FIRST,
            max,
        }
    }

    /// The wait before restarting after `why`, for a session that ran
    /// `session_ran`. A grown writer schema is no failure: it neither waits
    /// nor moves the backoff on.
    pub(super) fn next(&mut self, why: Restart, session_ran: Duration) -> Duration {
        if why == Restart::SchemaGrew {
            return Duration::ZERO;
        }
        if session_ran >= Duration::from_secs(60) {
            self.next = Self::FIRST;
        }
        let delay = self.next.min(self.max);
        self.next = (self.next * 2).min(self.max);
        delay
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fenced() -> Error {
        Error::Fenced {
            table: "nodes/A".into(),
            bucket: 0,
            shard: uuid::Uuid::nil(),
            reason: "peer claimed epoch".into(),
        }
    }

    fn wal_down() -> Error {
        Error::WalUnavailable {
            table: "nodes/A".into(),
            bucket: 0,
            shard: uuid::Uuid::nil(),
            reason: "503".into(),
        }
    }

    fn not_authorized() -> Error {
        Error::NotAuthorized {
            needs: "READ on group g".into(),
            code: "GROUP_AUTHORIZATION_FAILED".into(),
        }
    }

    fn race() -> Error {
        Error::CommitConflict {
            expected: "a".into(),
            found: "b".into(),
        }
    }

    #[test]
    fn what_restarts_depends_on_the_failure_and_the_sharding() {
        use Restart::*;
        let grew = Error::RegistrySchemaGrew {
            topic: "t".into(),
            id: 7,
            fields: vec!["f".into()],
        };
        for (sharding, e, want) in [
            (Sharding::Bucket, grew, Some(SchemaGrew)),
            (Sharding::Bucket, wal_down(), Some(Storage)),
            (Sharding::Partition, wal_down(), Some(Storage)),
            // One writer per shard: a fence under bucket sharding is a
            // second process on the same root, and stops the run.
            (Sharding::Bucket, fenced(), None),
            (Sharding::Partition, fenced(), Some(Fenced)),
            (Sharding::Bucket, race(), None),
            (Sharding::Partition, race(), Some(CommitRace)),
            (Sharding::Partition, Error::config("bad"), None),
            (Sharding::Partition, Error::Bug("no rows".into()), None),
            // A refused permission needs an operator: no session cures it.
            (Sharding::Partition, not_authorized(), None),
            (Sharding::Bucket, not_authorized(), None),
        ] {
            assert_eq!(restart_for(&e, sharding), want, "{e} under {sharding:?}");
        }
    }

    #[test]
    fn backoff_doubles_to_its_bound_and_starts_over_after_a_long_session() {
        let mut b = Backoff::new(Duration::from_secs(1));
        let short = Duration::from_secs(1);
        let waits: Vec<_> = (0..4).map(|_| b.next(Restart::Storage, short)).collect();
        assert_eq!(
            waits,
            [250, 500, 1000, 1000].map(Duration::from_millis).to_vec()
        );
        assert_eq!(b.next(Restart::SchemaGrew, short), Duration::ZERO);
        assert_eq!(
            b.next(Restart::Fenced, Duration::from_secs(60)),
            Duration::from_millis(250)
        );
    }
}
