//! What each fault of a cluster phase did to ingest, read from the group's
//! committed offsets against the topics' ends (sampled every 250 ms by the
//! admin, whose host no fault touches): the longest stretch with no commit
//! progress from the fault's start, and how long after its end ingest was
//! normal again: everything the partitions held at the end committed, and
//! no partition stalled longer than before the fault
//! (`CommitSampler::recovery`). The producer is held up by the faults that
//! touch the brokers too: a pause is end to end, as a user sees it.

use std::time::{Duration, SystemTime};

use super::{Cluster, Keeper};
use crate::check::{CommitSampler, Res};
use crate::report::{FaultReport, PhaseReport};
use crate::stage::{Env, Stage};

/// Normal ingest before a fault (and after a recovery), so the pauses of
/// two faults do not run together.
const BASELINE: Duration = Duration::from_secs(15);

/// How long a recovery may take before the phase goes on without it (the
/// report then says "not within the phase").
pub(super) const RECOVER_WITHIN: Duration = Duration::from_secs(240);

struct Fault {
    what: String,
    delivered: u32,
    start: SystemTime,
    end: SystemTime,
}

/// The sampler of one phase's group and the faults delivered so far.
pub(crate) struct Meter {
    sampler: CommitSampler,
    faults: Vec<Fault>,
}

impl Meter {
    pub(super) fn start(c: &Cluster, st: &Stage) -> Res<Meter> {
        let topics = st
            .topics
            .mapped()
            .into_iter()
            .map(|(t, p)| (t.to_string(), p))
            .collect();
        Ok(Meter {
            sampler: CommitSampler::start(&c.admin, &st.group, topics)?,
            faults: Vec::new(),
        })
    }

    /// Whether the group has committed anything yet.
    pub(super) fn committing(&self) -> bool {
        self.sampler.committed_now() > 0
    }

    /// Waits until graphsink commits, then [`BASELINE`] of normal ingest.
    pub(super) async fn warm_up(
        &self,
        g: &mut impl Keeper,
        st: &Stage,
        env: &Env,
        r: &mut PhaseReport,
    ) -> Res<()> {
        if !g
            .hold_until(st, env, r, Duration::from_secs(180), || self.committing())
            .await?
        {
            return Err(format!(
                "graphsink committed nothing within 180 s of its start: {}",
                g.tail()
            ));
        }
        g.hold(st, env, r, BASELINE).await
    }

    /// A fault delivered `delivered` times between `start` and `end`.
    pub(super) fn fault(&mut self, what: &str, delivered: u32, start: SystemTime, end: SystemTime) {
        println!(
            "   {what}: {:.1} s",
            end.duration_since(start).unwrap_or_default().as_secs_f64()
        );
        self.faults.push(Fault {
            what: what.to_string(),
            delivered,
            start,
            end,
        });
    }

    /// Whether the last fault is recovered from, and ingest has been
    /// normal for a while since.
    pub(super) fn recovered(&self) -> bool {
        self.faults
            .last()
            .is_none_or(|f| self.sampler.recovery(f.start, f.end, None).settled)
    }

    /// Waits (graphsink supervised) until the last fault is recovered
    /// from, at most [`RECOVER_WITHIN`], then [`BASELINE`] more so the
    /// next fault has normal ingest to compare with.
    pub(super) async fn settle(
        &self,
        g: &mut impl Keeper,
        st: &Stage,
        env: &Env,
        r: &mut PhaseReport,
    ) -> Res<()> {
        g.hold_until(st, env, r, RECOVER_WITHIN, || self.recovered())
            .await?;
        g.hold(st, env, r, BASELINE).await
    }

    /// The faults' figures into the phase's report.
    pub(super) fn report(&self, r: &mut PhaseReport) {
        if let (n @ 1.., last) = self.sampler.failures() {
            r.notes.push(format!(
                "{n} samples of the group's offsets failed (last: {})",
                last.unwrap_or_default()
            ));
        }
        for (i, f) in self.faults.iter().enumerate() {
            // Each fault's figures stop where the next fault starts.
            let until = self.faults.get(i + 1).map(|n| n.start);
            let rec = self.sampler.recovery(f.start, f.end, until);
            r.faults.push(FaultReport {
                what: f.what.clone(),
                delivered: f.delivered,
                seconds: f
                    .end
                    .duration_since(f.start)
                    .unwrap_or_default()
                    .as_secs_f64(),
                longest_pause: rec.longest_pause,
                recovered_after: rec.recovered_after,
            });
        }
    }
}

/// Now, for a fault's start or end.
pub(super) fn now() -> SystemTime {
    SystemTime::now()
}
