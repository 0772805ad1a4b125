//! The run's totals: plain counts of what a run has done, for whoever
//! started it (tests wait on them, the bench divides by them). The labelled
//! series say the same per partition, table or code; these are their sums
//! over the run, read without a scrape.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// What a run has done so far (`Metrics::totals`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RunTotals {
    /// Records taken from Kafka and written (not yet durable) to the WAL.
    pub consumed: u64,
    /// Records whose poll became durable.
    pub durable: u64,
    /// Records rejected before the WAL (decode, validate).
    pub rejected: u64,
    /// Successful offset commits.
    pub commits: u64,
    /// Ingest sessions restarted in-process.
    pub restarts: u64,
    /// Polls taken, and the run loop's time in them (ns): in all, in
    /// decoding + validating, and in handing rows to the shard writers
    /// (memtable inserts). The loop is one task, so busy ÷ wall time says
    /// how close ingest is to its single-task ceiling.
    pub polls: u64,
    pub poll_ns: u64,
    pub decode_ns: u64,
    pub put_ns: u64,
    /// Of the poll time: taking the records from the consumer, and putting
    /// the poll's rejects into the rejects WAL.
    pub take_ns: u64,
    pub reject_ns: u64,
    /// Outside polls: time with the in-flight window full (no fetching
    /// until an ack), and in the fold's freeze cuts.
    pub window_full_ns: u64,
    pub cut_ns: u64,
}

/// One poll, as the run loop reports it (`Metrics::poll_done`).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PollReport {
    pub(crate) records: u64,
    pub(crate) rejected: u64,
    pub(crate) take: Duration,
    pub(crate) decode: Duration,
    pub(crate) put: Duration,
    pub(crate) reject: Duration,
    pub(crate) total: Duration,
}

/// `RunTotals` as they are counted.
#[derive(Debug, Default)]
pub(super) struct Totals {
    pub(super) consumed: AtomicU64,
    pub(super) durable: AtomicU64,
    pub(super) rejected: AtomicU64,
    pub(super) commits: AtomicU64,
    pub(super) restarts: AtomicU64,
    pub(super) polls: AtomicU64,
    pub(super) poll_ns: AtomicU64,
    pub(super) decode_ns: AtomicU64,
    pub(super) put_ns: AtomicU64,
    pub(super) take_ns: AtomicU64,
    pub(super) reject_ns: AtomicU64,
    pub(super) window_full_ns: AtomicU64,
    pub(super) cut_ns: AtomicU64,
}

impl Totals {
    pub(super) fn add_poll(&self, poll: &PollReport) {
        let add = |c: &AtomicU64, n: u64| c.fetch_add(n, Ordering::Relaxed);
        let ns = |d: Duration| d.as_nanos() as u64;
        add(&self.polls, 1);
        add(&self.consumed, poll.records);
        add(&self.rejected, poll.rejected);
        add(&self.take_ns, ns(poll.take));
        add(&self.decode_ns, ns(poll.decode));
        add(&self.put_ns, ns(poll.put));
        add(&self.reject_ns, ns(poll.reject));
        add(&self.poll_ns, ns(poll.total));
    }

    pub(super) fn snapshot(&self) -> RunTotals {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        RunTotals {
            consumed: get(&self.consumed),
            durable: get(&self.durable),
            rejected: get(&self.rejected),
            commits: get(&self.commits),
            restarts: get(&self.restarts),
            polls: get(&self.polls),
            poll_ns: get(&self.poll_ns),
            decode_ns: get(&self.decode_ns),
            put_ns: get(&self.put_ns),
            take_ns: get(&self.take_ns),
            reject_ns: get(&self.reject_ns),
            window_full_ns: get(&self.window_full_ns),
            cut_ns: get(&self.cut_ns),
        }
    }
}
