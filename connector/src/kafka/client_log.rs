//! librdkafka's errors and warnings for the long-lived clients (the group
//! consumer, the dead-letter producer), rate-limited. During a broker
//! outage librdkafka reports `AllBrokersDown` and each failed connection
//! about ten times a second; an operator needs one line per interval that
//! says how often it repeated, not a flood.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use rdkafka::ClientContext;

use super::denied::SeenRefusal;

/// At most one line per kind of message in this interval.
pub(crate) const EVERY: Duration = Duration::from_secs(10);

/// A repeating message's state: when it was last shown, and how often it
/// came since.
struct Seen {
    shown: Instant,
    suppressed: u64,
}

/// Decides which client messages are shown.
pub(crate) struct RateLimit {
    every: Duration,
    seen: Mutex<HashMap<String, Seen>>,
}

impl RateLimit {
    pub(crate) fn new(every: Duration) -> RateLimit {
        RateLimit {
            every,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// `Some(suppressed since the last line)` when a message of `kind` is
    /// to be shown at `now`, `None` when it is counted only.
    pub(crate) fn admit(&self, kind: &str, now: Instant) -> Option<u64> {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        match seen.get_mut(kind) {
            Some(s) if now.duration_since(s.shown) < self.every => {
                s.suppressed += 1;
                None
            }
            Some(s) => {
                let n = std::mem::take(&mut s.suppressed);
                s.shown = now;
                Some(n)
            }
            None => {
                seen.insert(
                    kind.to_string(),
                    Seen {
                        shown: now,
                        suppressed: 0,
                    },
                );
                Some(0)
            }
        }
    }
}

/// The context of graphsink's long-lived clients: errors and warnings at
/// most once per `EVERY` per kind, with a repeat count; the rest at debug.
/// A refusal among the errors (a failed SASL handshake) is noted in a
/// `SeenRefusal` the client's owner keeps (`ClientLog::noting`).
pub(crate) struct ClientLog {
    limit: RateLimit,
    seen: Arc<SeenRefusal>,
}

impl Default for ClientLog {
    fn default() -> Self {
        ClientLog::noting(Arc::default())
    }
}

impl ClientLog {
    /// A context that notes refusals in `seen`, which its client's owner
    /// keeps (rust-rdkafka's producer does not lend its context).
    pub(crate) fn noting(seen: Arc<SeenRefusal>) -> ClientLog {
        ClientLog {
            limit: RateLimit::new(EVERY),
            seen,
        }
    }

    pub(crate) fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        use RDKafkaLogLevel as L;
        let warn = matches!(
            level,
            L::Emerg | L::Alert | L::Critical | L::Error | L::Warning
        );
        if !warn {
            tracing::debug!(target: "librdkafka", fac, "{message}");
            return;
        }
        // The facility and the message's first `:` part (librdkafka starts
        // with the broker's name): one broker's refusals are one kind.
        let kind = format!("log:{fac}:{}", message.split(':').next().unwrap_or(""));
        if let Some(repeated) = self.limit.admit(&kind, Instant::now()) {
            tracing::warn!(target: "librdkafka", fac, repeated, "{message}");
        }
    }

    pub(crate) fn error(&self, error: &KafkaError, reason: &str) {
        self.seen.note(error);
        let kind = format!("error:{:?}", error.rdkafka_error_code());
        if let Some(repeated) = self.limit.admit(&kind, Instant::now()) {
            tracing::error!(target: "librdkafka", %error, repeated, "{reason}");
        }
    }
}

impl ClientContext for ClientLog {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        ClientLog::log(self, level, fac, message)
    }

    fn error(&self, error: KafkaError, reason: &str) {
        ClientLog::error(self, &error, reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeating_message_shows_once_per_interval_with_its_count() {
        let limit = RateLimit::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(limit.admit("AllBrokersDown", t0), Some(0));
        for i in 1..=99 {
            assert_eq!(
                limit.admit("AllBrokersDown", t0 + Duration::from_millis(i * 100)),
                None
            );
        }
        assert_eq!(limit.admit("other", t0), Some(0), "kinds are counted apart");
        assert_eq!(
            limit.admit("AllBrokersDown", t0 + Duration::from_secs(10)),
            Some(99)
        );
        assert_eq!(
            limit.admit("AllBrokersDown", t0 + Duration::from_secs(21)),
            Some(0)
        );
    }
}
