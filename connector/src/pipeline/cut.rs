//! What was written since the last freeze cut: the offsets, when the
//! oldest record was taken, rows and bytes. Polls add to it; a cut hands it
//! to the fold task once its freeze succeeded.

use std::time::Instant;

use crate::config::FoldSettings;
use crate::fold::FreezeCut;
use crate::offsets::{PollSpans, WrittenSpans};
use crate::shards::FrozenShard;

#[derive(Default)]
pub(super) struct SinceCut {
    spans: WrittenSpans,
    /// When the oldest record since the cut was taken (graph-visible latency).
    oldest_taken: Option<Instant>,
    rows: u64,
    bytes: u64,
}

impl SinceCut {
    /// A poll taken at `taken`, of `value_bytes`, spanning `seen`.
    pub(super) fn took(&mut self, taken: Instant, value_bytes: u64, seen: &PollSpans<'_>) {
        self.oldest_taken.get_or_insert(taken);
        self.bytes += value_bytes;
        seen.add_to(&mut self.spans);
    }

    /// Rows handed to the writers (upserts, deletes, rejects).
    pub(super) fn wrote(&mut self, rows: u64) {
        self.rows += rows;
    }

    /// Past `fold.max_pending_rows` or `max_pending_bytes`: fold early.
    pub(super) fn full(&self, fold: &FoldSettings) -> bool {
        self.rows >= fold.max_pending_rows || self.bytes >= fold.max_pending_bytes
    }

    /// The cut of `frozen`: what was written since the last one goes with
    /// it, and counting starts again.
    pub(super) fn cut(&mut self, frozen: Vec<FrozenShard>) -> FreezeCut {
        let since = std::mem::take(self);
        FreezeCut {
            frozen,
            spans: since.spans,
            oldest_taken: since.oldest_taken,
        }
    }
}
