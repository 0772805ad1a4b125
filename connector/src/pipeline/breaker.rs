//! The reject-rate breaker: rejects are counted per minute, and past
//! `errors.max_rejects_per_minute` fetching pauses for `errors.breaker_pause`
//! (so a poison topic does not fill both reject sinks at full speed). A pure
//! state machine of counts, time and settings; the run loop logs and
//! reports what it says.

use std::time::Duration;

use tokio::time::Instant;

use crate::config::ErrorSettings;

/// How long rejects are counted together.
const WINDOW: Duration = Duration::from_secs(60);

#[derive(Debug, Default)]
pub(super) struct Breaker {
    window_start: Option<Instant>,
    count: u64,
    paused_until: Option<Instant>,
}

/// A trip: the count that passed the limit, and when fetching resumes.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Tripped {
    pub(super) rejects: u64,
    pub(super) until: Instant,
}

impl Breaker {
    /// Counts `n` rejects seen at `now`. Returns the trip when the count of
    /// the current minute passes the limit and fetching is not paused yet.
    pub(super) fn count(
        &mut self,
        n: u64,
        now: Instant,
        errors: &ErrorSettings,
    ) -> Option<Tripped> {
        let limit = errors.max_rejects_per_minute;
        if limit == 0 {
            return None; // off
        }
        match self.window_start {
            Some(t) if now.duration_since(t) < WINDOW => self.count += n,
            _ => {
                self.window_start = Some(now);
                self.count = n;
            }
        }
        if self.count <= limit || self.paused_until.is_some() {
            return None;
        }
        let until = now + errors.breaker_pause;
        self.paused_until = Some(until);
        // The pause ends the window: counting starts afresh after it.
        self.window_start = None;
        Some(Tripped {
            rejects: self.count,
            until,
        })
    }

    /// When fetching resumes, while paused.
    pub(super) fn paused_until(&self) -> Option<Instant> {
        self.paused_until
    }

    /// Ends the pause (its time has come).
    pub(super) fn resume(&mut self) {
        self.paused_until = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(limit: u64) -> ErrorSettings {
        ErrorSettings {
            max_rejects_per_minute: limit,
            breaker_pause: Duration::from_secs(30),
            ..ErrorSettings::default()
        }
    }

    #[test]
    fn trips_once_past_the_limit_within_a_minute() {
        let (t0, s) = (Instant::now(), settings(10));
        let mut b = Breaker::default();
        assert_eq!(b.count(6, t0, &s), None);
        assert_eq!(
            b.count(4, t0 + Duration::from_secs(10), &s),
            None,
            "at the limit"
        );
        let trip = b
            .count(1, t0 + Duration::from_secs(20), &s)
            .expect("past it");
        assert_eq!(trip.rejects, 11);
        assert_eq!(trip.until, t0 + Duration::from_secs(50));
        assert_eq!(b.paused_until(), Some(trip.until));
        // While paused, more rejects (polls already taken) trip nothing,
        // but they open the next window: resuming into them trips again.
        assert_eq!(b.count(100, t0 + Duration::from_secs(21), &s), None);
        b.resume();
        assert_eq!(b.paused_until(), None);
        assert!(b.count(1, t0 + Duration::from_secs(51), &s).is_some());
        b.resume();
        assert_eq!(
            b.count(5, t0 + Duration::from_secs(112), &s),
            None,
            "a new window"
        );
    }

    #[test]
    fn a_new_minute_starts_the_count_afresh() {
        let (t0, s) = (Instant::now(), settings(10));
        let mut b = Breaker::default();
        assert_eq!(b.count(10, t0, &s), None);
        assert_eq!(b.count(10, t0 + Duration::from_secs(60), &s), None);
        assert!(b.count(1, t0 + Duration::from_secs(61), &s).is_some());
    }

    #[test]
    fn a_limit_of_zero_is_off() {
        let mut b = Breaker::default();
        assert_eq!(b.count(u64::MAX, Instant::now(), &settings(0)), None);
        assert_eq!(b.paused_until(), None);
    }
}
