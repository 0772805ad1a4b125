//! One delivery as the metrics see it: rejects queued, skipped, sent,
//! failed and abandoned, and whether it is retrying.

use crate::metrics::Metrics;

/// One delivery as the metrics see it: rejects still pending, and whether
/// it is retrying. Dropping it (done, failed or cancelled) settles both.
pub(super) struct Delivery<'a> {
    metrics: &'a Metrics,
    pending: usize,
    retrying: bool,
}

impl<'a> Delivery<'a> {
    pub(super) fn new(metrics: &'a Metrics, n: usize) -> Self {
        metrics.dead_letters_queued(n);
        Delivery {
            metrics,
            pending: n,
            retrying: false,
        }
    }

    /// Rejects found on the topic already: not produced again.
    pub(super) fn skipped(&mut self, n: usize) {
        self.metrics.dead_letters_skipped(n);
        self.pending -= n;
    }

    /// One round of produces; `attempted = false`: the round could not
    /// start (the topics could not be read), and failed all the same.
    pub(super) fn round(&mut self, ok: usize, failed: usize, attempted: bool) {
        if attempted {
            self.metrics.dead_letters_sent(ok, failed);
        }
        self.pending -= ok;
        if failed > 0 && !self.retrying {
            self.retrying = true;
            self.metrics.dead_letters_retrying(true);
        }
    }
}

impl Drop for Delivery<'_> {
    fn drop(&mut self) {
        self.metrics.dead_letters_abandoned(self.pending);
        if self.retrying {
            self.metrics.dead_letters_retrying(false);
        }
    }
}
