//! What the fold loop reports: each fold, the head it publishes, the
//! deferred edges.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::families::{part, PhaseLabels, TableOpLabels, TypeLabels};
use super::Metrics;
use crate::types::{now_ms, TopicPartition};

impl Metrics {
    pub fn fold_started(&self) {
        self.fold_busy_since.store(self.tick(), Ordering::Relaxed);
    }

    pub fn fold_failed(&self) {
        self.fold_busy_since.store(0, Ordering::Relaxed);
        self.fold.fold_failures.inc();
        self.consecutive_fold_failures
            .fetch_add(1, Ordering::Relaxed);
    }

    /// A fold ended without failing (published, or nothing to fold).
    pub fn fold_ended(&self) {
        self.fold_busy_since.store(0, Ordering::Relaxed);
        self.consecutive_fold_failures.store(0, Ordering::Relaxed);
    }

    /// A published fold: its duration, rows per table, and the oldest of
    /// its records' age.
    pub fn folded(
        &self,
        took: Duration,
        oldest_taken: Option<Instant>,
        rows: impl IntoIterator<Item = (String, [u64; 3])>,
    ) {
        self.fold.folds.inc();
        self.fold.fold_seconds.observe(took.as_secs_f64());
        if let Some(t) = oldest_taken {
            self.fold.graph_visible.observe(t.elapsed().as_secs_f64());
        }
        for (table, [upserted, deleted, rejected]) in rows {
            for (op, n) in [
                ("upserted", upserted),
                ("deleted", deleted),
                ("rejected", rejected),
            ] {
                let l = TableOpLabels {
                    table: table.clone(),
                    op,
                };
                self.fold.fold_rows.get_or_create(&l).inc_by(n);
            }
        }
        self.fold.fold_last_success.set(now_ms() as f64 / 1000.0);
    }

    /// One published fold's wall time by phase (`StageTimes::phases`).
    pub fn fold_phases(&self, phases: impl IntoIterator<Item = (&'static str, f64)>) {
        for (phase, secs) in phases {
            self.fold
                .fold_phase_seconds
                .get_or_create(&PhaseLabels { phase })
                .observe(secs);
        }
    }

    /// The head graph commit (at start and after each publish).
    pub fn head(&self, seq: u64, created_at_ms: i64) {
        self.fold.head_seq.set(seq as i64);
        self.head_created_ms.store(created_at_ms, Ordering::Relaxed);
    }

    /// One past the newest offset a published commit holds of `tp`.
    pub fn folded_offset(&self, tp: &TopicPartition, next: i64) {
        let g = self.partitions.folded_offset.get_or_create(&part(tp));
        if next > g.get() {
            g.set(next);
        }
    }

    /// Deferred edges of one edge type at the head.
    pub fn pending_edges(&self, edge_type: &str, count: u64, oldest_ms: Option<i64>) {
        let l = TypeLabels {
            r#type: edge_type.to_string(),
        };
        self.fold.pending_edges.get_or_create(&l).set(count as i64);
        self.pending_oldest_ms
            .lock()
            .expect("pending")
            .insert(edge_type.to_string(), oldest_ms);
    }
}
