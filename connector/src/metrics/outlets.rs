//! What the outlets report: the dead-letter producer, the schema registry
//! client, and librdkafka's statistics.

use std::sync::atomic::Ordering;

use super::families::{part, BrokerLabels, ResultLabels};
use super::{LagInputs, Metrics};
use crate::types::TopicPartition;

impl Metrics {
    // The dead-letter producer.

    /// Rejects queued for the dead-letter topic.
    pub fn dead_letters_queued(&self, n: usize) {
        self.outlets.dead_letters_pending.inc_by(n as i64);
    }

    /// One round of produce attempts: `ok` acknowledged, `failed` not.
    pub fn dead_letters_sent(&self, ok: usize, failed: usize) {
        let c = |result| {
            self.outlets
                .dead_letters
                .get_or_create(&ResultLabels { result })
        };
        c("succeeded").inc_by(ok as u64);
        c("failed").inc_by(failed as u64);
        self.outlets.dead_letters_pending.dec_by(ok as i64);
    }

    /// Rejects found on the dead-letter topic already (produced before a
    /// crash): not produced again.
    pub fn dead_letters_skipped(&self, n: usize) {
        if n > 0 {
            let c = self
                .outlets
                .dead_letters
                .get_or_create(&ResultLabels { result: "skipped" });
            c.inc_by(n as u64);
            self.outlets.dead_letters_pending.dec_by(n as i64);
        }
    }

    /// Rejects no longer waiting without being delivered (a stop).
    pub fn dead_letters_abandoned(&self, n: usize) {
        self.outlets.dead_letters_pending.dec_by(n as i64);
    }

    /// A delivery started retrying (`true`) or stopped (`false`).
    pub fn dead_letters_retrying(&self, retrying: bool) {
        if retrying {
            if self.dead_letters_retrying.fetch_add(1, Ordering::Relaxed) == 0 {
                self.dead_letters_failing_since
                    .store(self.tick(), Ordering::Relaxed);
            }
        } else if self.dead_letters_retrying.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.dead_letters_failing_since.store(0, Ordering::Relaxed);
        }
    }

    // The schema registry client.

    /// Whether a partition waits on a schema the registry does not give.
    pub fn schema_registry_stalled(&self, stalled: bool) {
        self.schema_registry_stalled
            .store(stalled, Ordering::Relaxed);
    }

    /// One registry request ended with `result` (`registry::Outcome`).
    pub fn schema_registry_request(&self, result: &'static str) {
        self.outlets
            .schema_registry_requests
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    // librdkafka statistics.

    pub fn kafka_partition(&self, tp: &TopicPartition, consumer_lag: i64, end: i64) {
        let l = part(tp);
        if consumer_lag >= 0 {
            self.partitions
                .kafka_consumer_lag
                .get_or_create(&l)
                .set(consumer_lag);
        }
        if end >= 0 {
            self.partitions.end_offset.get_or_create(&l).set(end);
            self.lag_input(tp, |li| li.end = Some(end));
        }
    }

    pub fn kafka_broker_rtt(&self, broker: &str, avg_micros: i64) {
        let l = BrokerLabels {
            broker: broker.to_string(),
        };
        self.outlets
            .kafka_broker_rtt
            .get_or_create(&l)
            .set(avg_micros.max(0) as f64 / 1e6);
    }

    pub fn kafka_fetch_queue(&self, messages: i64) {
        self.outlets.kafka_fetch_queue.set(messages);
    }

    pub(super) fn lag_input(&self, tp: &TopicPartition, f: impl FnOnce(&mut LagInputs)) {
        let mut all = self.lag_inputs.lock().expect("lag");
        let l = all.entry(tp.clone()).or_default();
        f(l);
        if let (Some(c), Some(e)) = (l.committed, l.end) {
            self.partitions
                .lag
                .get_or_create(&part(tp))
                .set((e - c).max(0));
        }
    }
}
