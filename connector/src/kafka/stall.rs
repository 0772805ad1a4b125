//! The unassigned-member watch. A member can sit in a STABLE group holding
//! no partition while its topics have lag and nobody consumes them (seen
//! with tansu 0.6 after a broker freeze or a quick restart: the coordinator
//! never assigns the partitions again). Nothing in librdkafka reports that,
//! so the run loop asks: while it holds nothing, do the group's committed
//! offsets still advance toward the end? If not for a whole `bound`, it
//! rejoins once (re-subscribes); if that changes nothing for another
//! `bound`, it gives up loudly so an orchestrator restarts it. Another
//! member that owns the partitions advances their committed offsets, so an
//! idle member of a healthy group is never taken for stalled.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::types::TopicPartition;

/// The group's progress on this member's topics, as offset queries see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GroupProgress {
    /// Committed offset per partition (absent: nothing committed yet).
    pub committed: BTreeMap<TopicPartition, i64>,
    /// Records between the committed offsets (or the start) and the end.
    pub lag: i64,
}

/// What the run loop should do about holding nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Fine,
    /// Stalled for `stalled`: re-subscribe once and say so.
    Rejoin {
        lag: i64,
        stalled: Duration,
    },
    /// Still stalled after a rejoin: fail the run.
    GiveUp {
        lag: i64,
        stalled: Duration,
    },
}

#[derive(Debug)]
pub(crate) struct StallWatch {
    bound: Duration,
    /// Since when the member has held no partition (`None`: it holds some).
    unassigned_since: Option<Instant>,
    /// The progress at the last look, and when it was taken.
    last: Option<(Instant, GroupProgress)>,
    rejoined: bool,
}

impl StallWatch {
    /// Starts unassigned: a member that never gets a partition is watched too.
    pub(crate) fn new(bound: Duration, now: Instant) -> StallWatch {
        StallWatch {
            bound,
            unassigned_since: Some(now),
            last: None,
            rejoined: false,
        }
    }

    pub(crate) fn bound(&self) -> Duration {
        self.bound
    }

    /// How long the member has held no partition (`None`: it holds some).
    pub(crate) fn unassigned_for(&self, now: Instant) -> Option<Duration> {
        self.unassigned_since.map(|t| now.duration_since(t))
    }

    /// After every assignment change.
    pub(crate) fn holds(&mut self, any: bool, now: Instant) {
        match (any, self.unassigned_since) {
            (true, _) => {
                self.unassigned_since = None;
                self.last = None;
                self.rejoined = false;
            }
            (false, None) => self.unassigned_since = Some(now),
            (false, Some(_)) => {}
        }
    }

    /// Whether a look at the group's progress is due: unassigned for a
    /// whole bound, and the last look (if any) a bound old.
    pub(crate) fn due(&self, now: Instant) -> bool {
        let Some(since) = self.unassigned_since else {
            return false;
        };
        now.duration_since(since) >= self.bound
            && self
                .last
                .as_ref()
                .is_none_or(|(t, _)| now.duration_since(*t) >= self.bound)
    }

    /// Judges a look taken at `now`. The first look only records; a stall
    /// is a second look, a bound later, with lag and the same offsets.
    pub(crate) fn judge(&mut self, now: Instant, seen: GroupProgress) -> Verdict {
        let stalled = match &self.last {
            Some((t, prev)) if seen.lag > 0 && prev.committed == seen.committed => {
                Some(now.duration_since(*t))
            }
            _ => None,
        };
        let Some(stalled) = stalled else {
            self.last = Some((now, seen));
            return Verdict::Fine;
        };
        let lag = seen.lag;
        if self.rejoined {
            return Verdict::GiveUp { lag, stalled };
        }
        // The rejoin starts a new watch: a bound to get an assignment, a
        // bound more to show progress.
        self.rejoined = true;
        self.unassigned_since = Some(now);
        self.last = None;
        Verdict::Rejoin { lag, stalled }
    }
}

/// The bound for a `session.timeout.ms` (librdkafka's default 45 s):
/// twice the session, so a dead member's partitions have had time to move.
pub(crate) fn bound_for(session_timeout: Option<&str>) -> Duration {
    let ms = session_timeout
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(45_000);
    Duration::from_millis(ms.saturating_mul(2))
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: Duration = Duration::from_secs(10);

    fn progress(lag: i64, committed: &[i64]) -> GroupProgress {
        GroupProgress {
            committed: committed
                .iter()
                .enumerate()
                .map(|(p, &o)| (("t".to_string(), p as i32), o))
                .collect(),
            lag,
        }
    }

    #[test]
    fn nothing_is_due_while_partitions_are_held_or_before_a_bound() {
        let t0 = Instant::now();
        let mut w = StallWatch::new(B, t0);
        assert!(!w.due(t0 + B / 2));
        assert!(w.due(t0 + B));
        w.holds(true, t0 + B);
        assert!(!w.due(t0 + 10 * B));
        w.holds(false, t0 + 10 * B);
        assert!(!w.due(t0 + 10 * B + B / 2));
        assert!(w.due(t0 + 11 * B));
    }

    #[test]
    fn no_progress_with_lag_rejoins_once_then_gives_up() {
        let t0 = Instant::now();
        let mut w = StallWatch::new(B, t0);
        assert_eq!(w.judge(t0 + B, progress(8004, &[5, 7])), Verdict::Fine);
        assert!(!w.due(t0 + B + B / 2), "the next look waits a bound");
        assert!(w.due(t0 + 2 * B));
        assert_eq!(
            w.judge(t0 + 2 * B, progress(8004, &[5, 7])),
            Verdict::Rejoin {
                lag: 8004,
                stalled: B
            }
        );
        // After the rejoin: a bound to be assigned, one look, one more.
        assert!(!w.due(t0 + 2 * B + B / 2));
        assert_eq!(w.judge(t0 + 3 * B, progress(8004, &[5, 7])), Verdict::Fine);
        assert_eq!(
            w.judge(t0 + 4 * B, progress(8010, &[5, 7])),
            Verdict::GiveUp {
                lag: 8010,
                stalled: B
            }
        );
    }

    #[test]
    fn another_members_progress_or_no_lag_is_not_a_stall() {
        let t0 = Instant::now();
        let mut w = StallWatch::new(B, t0);
        assert_eq!(w.judge(t0 + B, progress(100, &[5, 7])), Verdict::Fine);
        // Another member consumes: offsets move.
        assert_eq!(w.judge(t0 + 2 * B, progress(100, &[50, 7])), Verdict::Fine);
        assert_eq!(w.judge(t0 + 3 * B, progress(90, &[60, 7])), Verdict::Fine);
        // Caught up: same offsets, but nothing waits.
        assert_eq!(w.judge(t0 + 4 * B, progress(0, &[60, 7])), Verdict::Fine);
        assert_eq!(w.judge(t0 + 5 * B, progress(0, &[60, 7])), Verdict::Fine);
    }

    #[test]
    fn an_assignment_after_a_rejoin_clears_it() {
        let t0 = Instant::now();
        let mut w = StallWatch::new(B, t0);
        w.judge(t0 + B, progress(1, &[0]));
        assert!(matches!(
            w.judge(t0 + 2 * B, progress(1, &[0])),
            Verdict::Rejoin { .. }
        ));
        w.holds(true, t0 + 2 * B + Duration::from_secs(1));
        w.holds(false, t0 + 5 * B);
        w.judge(t0 + 6 * B, progress(1, &[0]));
        assert!(
            matches!(
                w.judge(t0 + 7 * B, progress(1, &[0])),
                Verdict::Rejoin { .. }
            ),
            "a fresh stall rejoins again rather than giving up"
        );
    }

    #[test]
    fn the_bound_is_twice_the_session_timeout() {
        assert_eq!(bound_for(Some("6000")), Duration::from_secs(12));
        assert_eq!(bound_for(None), Duration::from_secs(90));
        assert_eq!(bound_for(Some("junk")), Duration::from_secs(90));
    }
}
