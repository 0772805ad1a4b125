//! What the run loop reports: sessions, polls, durable acks, commits,
//! assignments, sync rejects, the breaker, fencing and the memtables.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::families::{part, RejectLabels, TableLabels};
use super::{Metrics, PollReport};
use crate::types::TopicPartition;

impl Metrics {
    /// A new ingest session starts: it has not joined yet, and its writers
    /// are not (yet) fenced.
    pub fn session_started(&self) {
        self.joined.store(false, Ordering::Relaxed);
        self.fenced.store(false, Ordering::Relaxed);
        self.run.polls_in_flight.set(0);
    }

    pub fn session_restarted(&self) {
        self.run.session_restarts.inc();
        self.totals.restarts.fetch_add(1, Ordering::Relaxed);
    }

    /// The run loop is alive (stamped at every turn of its loop).
    pub fn run_loop_tick(&self) {
        self.run_heartbeat.store(self.tick(), Ordering::Relaxed);
    }

    /// The run loop ended (its probes report it until the process exits).
    pub fn run_loop_stopped(&self) {
        self.run_heartbeat.store(0, Ordering::Relaxed);
        self.joined.store(false, Ordering::Relaxed);
    }

    /// One poll's records of one partition: `next` is one past its newest.
    pub fn polled(&self, tp: &TopicPartition, records: u64, bytes: u64, next: i64) {
        let l = part(tp);
        self.partitions
            .records_consumed
            .get_or_create(&l)
            .inc_by(records);
        self.partitions
            .bytes_consumed
            .get_or_create(&l)
            .inc_by(bytes);
        self.partitions.consumed_offset.get_or_create(&l).set(next);
    }

    /// Polls awaiting durability; a wait that starts restarts the stall clock.
    pub fn polls_in_flight(&self, n: usize) {
        let before = self.run.polls_in_flight.set(n as i64);
        if before == 0 && n > 0 {
            self.durable_progress.store(self.tick(), Ordering::Relaxed);
        }
    }

    /// A poll handed to the writers: its records, its rejects, and where
    /// its time went.
    pub(crate) fn poll_done(&self, poll: &PollReport) {
        self.totals.add_poll(poll);
    }

    /// The run loop served a freeze cut for `took`.
    pub fn cut_served(&self, took: Duration) {
        self.totals
            .cut_ns
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    }

    /// The in-flight window was full (no fetching) for `took`.
    pub fn window_was_full(&self, took: Duration) {
        self.totals
            .window_full_ns
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    }

    /// A poll's durable ack was applied, `taken` after it was taken; it
    /// held `records`.
    pub fn acked(&self, taken: Duration, records: usize) {
        self.run.durable_ack.observe(taken.as_secs_f64());
        self.durable_progress.store(self.tick(), Ordering::Relaxed);
        self.totals
            .durable
            .fetch_add(records as u64, Ordering::Relaxed);
    }

    pub fn durable(&self, tp: &TopicPartition, next: i64) {
        self.partitions
            .durable_offset
            .get_or_create(&part(tp))
            .set(next);
    }

    /// One offset commit: each partition with the offset it names.
    pub fn committed(&self, offsets: &[(TopicPartition, i64)]) {
        for (tp, next) in offsets {
            let next = *next;
            self.partitions
                .committed_offset
                .get_or_create(&part(tp))
                .set(next);
            self.lag_input(tp, |l| l.committed = Some(next));
        }
        self.totals.commits.fetch_add(1, Ordering::Relaxed);
    }

    pub fn assigned(&self, tps: &[TopicPartition]) {
        self.joined.store(true, Ordering::Relaxed);
        for tp in tps {
            self.partitions.assigned.get_or_create(&part(tp)).set(1);
        }
    }

    pub fn revoked(&self, tps: &[TopicPartition]) {
        for tp in tps {
            self.partitions.assigned.get_or_create(&part(tp)).set(0);
        }
    }

    pub fn rejected(&self, stage: &'static str, code: &'static str) {
        self.run
            .rejects
            .get_or_create(&RejectLabels { stage, code })
            .inc();
    }

    pub fn breaker(&self, open: bool) {
        self.run.breaker_open.set(open as i64);
    }

    /// A writer of this connector was fenced by another writer.
    pub fn fenced(&self) {
        self.run.fenced_total.inc();
        self.fenced.store(true, Ordering::Relaxed);
    }

    /// One shard writer's memtable: rows, bytes, and its flush count so far.
    pub fn memtable(&self, table: &str, bucket: u32, rows: u64, bytes: u64, flushes: u64) {
        let l = TableLabels {
            table: table.to_string(),
        };
        let mut seen = self.flushes_seen.lock().expect("flushes");
        let before = seen
            .insert((table.to_string(), bucket), flushes)
            .unwrap_or(0);
        self.run
            .wal_flushes
            .get_or_create(&l)
            .inc_by(flushes.saturating_sub(before));
        drop(seen);
        // Gauges per table: summed over buckets by the caller's order (bucket 0 first).
        let rows_g = self.run.memtable_rows.get_or_create(&l);
        let bytes_g = self.run.memtable_bytes.get_or_create(&l);
        if bucket == 0 {
            rows_g.set(rows as i64);
            bytes_g.set(bytes as i64);
        } else {
            rows_g.inc_by(rows as i64);
            bytes_g.inc_by(bytes as i64);
        }
    }

    /// A reopened writer counts its flushes from 0 again.
    pub fn writers_reopened(&self) {
        self.flushes_seen.lock().expect("flushes").clear();
    }
}
