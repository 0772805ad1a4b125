//! One rule for librdkafka client configs built from `[kafka]`: a consumer
//! gets every property plus graphsink's offset settings; a producer or an
//! admin client gets every property except the consumer-only ones, so the
//! user's connection and producer tuning pass through. It creates no clients.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

use super::denied::{Refused, SeenRefusal};
use crate::config::{Config, Sharding};

/// librdkafka properties that only a consumer understands.
const CONSUMER_ONLY: &[&str] = &[
    "group.id",
    "group.instance.id",
    "group.protocol",
    "group.remote.assignor",
    "auto.offset.reset",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "auto.commit.interval.ms",
    "partition.assignment.strategy",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "max.poll.interval.ms",
    "isolation.level",
    "enable.partition.eof",
    "check.crcs",
];

/// Whether `key` is a property only a consumer understands.
fn is_consumer_only(key: &str) -> bool {
    CONSUMER_ONLY.contains(&key) || key.starts_with("fetch.") || key.starts_with("queued.")
}

/// graphsink's consumer defaults; any `[kafka]` property overrides them.
///
/// The fetch-queue ones are chosen by measurement (docs/perf/2026-12-02-consumer-fetch-queue-defaults.md,
/// docs/decisions/0003-consumer-defaults.md). graphsink stops draining librdkafka's queue
/// for moments (it waits on in-flight durability and on freeze cuts); with
/// librdkafka's own defaults, the pre-fetch queue then reaches
/// `queued.min.messages` and fetching backs off for a whole second, so the
/// consumer starves once it has caught up with its queue.
pub const CONSUMER_DEFAULTS: &[(&str, &str)] = &[
    ("auto.offset.reset", "earliest"),
    ("partition.assignment.strategy", "cooperative-sticky"),
    // librdkafka: 1000 ms. A full queue is re-checked after 10 ms, not 1 s.
    ("fetch.queue.backoff.ms", "10"),
    // librdkafka: 100000 messages per partition. Fewer is enough to keep
    // a poll of `wal.max_poll_records` ready, and holds less memory.
    ("queued.min.messages", "20000"),
    // librdkafka: 65536 KiB. Bounds the pre-fetch queue's memory at large
    // values (invariant 8: bounded memory).
    ("queued.max.messages.kbytes", "32768"),
];

/// The group consumer's settings: graphsink's defaults, the user's
/// pass-through properties over them, and the offset settings graphsink
/// cannot give up.
pub(crate) fn consumer_config(config: &Config) -> ClientConfig {
    let mut cc = ClientConfig::new();
    // KIP-848's protocol assigns on the broker: librdkafka refuses a
    // client-side strategy (and session or heartbeat settings) with it.
    let next_gen = config.kafka.get("group.protocol").map(|p| p.trim()) == Some("consumer");
    for (k, v) in CONSUMER_DEFAULTS {
        if !(next_gen && *k == "partition.assignment.strategy") {
            cc.set(*k, *v);
        }
    }
    if config.wal.sharding == Sharding::Partition {
        // A shard has one writer, and co-partitioned topics must go to one
        // member together: `range` does both (docs/kafka.md has the
        // figures that chose it over `cooperative-sticky` and KIP-848's
        // protocol; docs/decisions/0007-scale-out.md the tansu history). Users may still
        // override it.
        match next_gen {
            true => cc.set("group.remote.assignor", "range"),
            false => cc.set("partition.assignment.strategy", "range"),
        };
    }
    for (k, v) in &config.kafka {
        cc.set(k, v);
    }
    // Only graphsink stores and commits offsets, after durability.
    cc.set("enable.auto.commit", "false");
    cc.set("enable.auto.offset.store", "false");
    cc
}

/// A producer's or an admin client's settings: every `[kafka]` property but
/// the consumer-only ones.
pub(crate) fn producer_config(kafka: &BTreeMap<String, String>) -> ClientConfig {
    let mut cc = ClientConfig::new();
    for (k, v) in kafka.iter().filter(|(k, _)| !is_consumer_only(k)) {
        cc.set(k, v);
    }
    cc
}

/// The dead-letter producer: `[kafka]` as for any producer, idempotent with
/// `acks=all`, then `errors.producer` over it.
pub(crate) fn dead_letter_config(config: &Config) -> ClientConfig {
    let mut cc = producer_config(&config.kafka);
    cc.set("acks", "all")
        .set("enable.idempotence", "true")
        .set("message.timeout.ms", "10000");
    for (k, v) in &config.errors.producer {
        cc.set(k, v);
    }
    cc
}

/// `bootstrap.servers`, for error messages.
pub(crate) fn servers(config: &Config) -> &str {
    config
        .kafka
        .get("bootstrap.servers")
        .map_or("", String::as_str)
}

/// A client context for one-shot clients (CLI commands, offset queries):
/// librdkafka's connection errors and logs go to debug, since the caller
/// reports a failure once, as its error (`RUST_LOG=rdkafka=debug` shows them).
/// A refusal among them (a failed SASL handshake) is kept for that error
/// (`QuietContext::refused`).
#[derive(Default)]
pub(crate) struct QuietContext {
    seen: SeenRefusal,
}

impl QuietContext {
    /// The refusal librdkafka reported to this client, if any.
    pub(crate) fn refused(&self) -> Option<Refused> {
        self.seen.get()
    }
}

impl rdkafka::ClientContext for QuietContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        tracing::debug!(target: "rdkafka::client", ?level, fac, "librdkafka: {message}");
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        self.seen.note(&error);
        tracing::debug!(target: "rdkafka::client", "librdkafka: {error}: {reason}");
    }
}

impl rdkafka::consumer::ConsumerContext for QuietContext {}

/// The refusal a one-shot consumer met: librdkafka queues a failed SASL
/// handshake as an error event on the consumer's queue (no callback fires
/// until it is polled), so the queue is drained here, without waiting.
pub(crate) fn queued_refusal(c: &BaseConsumer<QuietContext>) -> Option<Refused> {
    // Bounded: an error event per failed connection attempt at most.
    for _ in 0..64 {
        match c.poll(Duration::ZERO) {
            Some(Err(e)) => {
                if let Some(r) = Refused::of(&e) {
                    return Some(r);
                }
            }
            Some(Ok(_)) => {}
            None => break,
        }
    }
    c.context().refused()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kafka(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_producer_gets_every_property_but_the_consumer_only_ones() {
        let cc = producer_config(&kafka(&[
            ("bootstrap.servers", "b:9092"),
            ("group.id", "g"),
            ("session.timeout.ms", "6000"),
            ("fetch.wait.max.ms", "5"),
            ("queued.min.messages", "10"),
            ("security.protocol", "sasl_ssl"),
            ("sasl.username", "u"),
            ("linger.ms", "20"),
            ("compression.type", "zstd"),
            ("client.id", "c"),
        ]));
        for (k, v) in [
            ("bootstrap.servers", "b:9092"),
            ("security.protocol", "sasl_ssl"),
            ("sasl.username", "u"),
            ("linger.ms", "20"),
            ("compression.type", "zstd"),
            ("client.id", "c"),
        ] {
            assert_eq!(cc.get(k), Some(v), "{k} passes through");
        }
        for k in [
            "group.id",
            "session.timeout.ms",
            "fetch.wait.max.ms",
            "queued.min.messages",
        ] {
            assert_eq!(cc.get(k), None, "{k} is consumer-only");
        }
    }

    /// A minimal config with `[kafka]` replaced by `pairs`.
    fn config(pairs: &[(&str, &str)]) -> Config {
        let text = "[graph]\nroot = \"g\"\nschema = \"s.pg\"\n[kafka]\n\"bootstrap.servers\" = \"b:9092\"\n\"group.id\" = \"g\"\n[[mapping]]\ntopic = \"t\"\nnode = \"P\"\n";
        let mut c = Config::from_toml(text, std::path::Path::new("/")).unwrap();
        c.kafka = kafka(pairs);
        c
    }

    #[test]
    fn errors_producer_overrides_the_dead_letter_defaults() {
        let mut config = config(&[("bootstrap.servers", "b:9092"), ("group.id", "g")]);
        config.errors.producer = kafka(&[("message.timeout.ms", "1000"), ("linger.ms", "5")]);
        let cc = dead_letter_config(&config);
        assert_eq!(cc.get("acks"), Some("all"));
        assert_eq!(cc.get("enable.idempotence"), Some("true"));
        assert_eq!(cc.get("message.timeout.ms"), Some("1000"));
        assert_eq!(cc.get("linger.ms"), Some("5"));
        assert_eq!(cc.get("bootstrap.servers"), Some("b:9092"));
        assert_eq!(cc.get("group.id"), None);
    }

    #[test]
    fn a_consumer_never_auto_commits() {
        let config = config(&[
            ("bootstrap.servers", "b:9092"),
            ("group.id", "g"),
            ("enable.auto.offset.store", "true"),
            ("auto.offset.reset", "latest"),
        ]);
        let cc = consumer_config(&config);
        assert_eq!(cc.get("enable.auto.commit"), Some("false"));
        assert_eq!(cc.get("enable.auto.offset.store"), Some("false"));
        assert_eq!(cc.get("auto.offset.reset"), Some("latest"));
        assert_eq!(
            cc.get("partition.assignment.strategy"),
            Some("cooperative-sticky")
        );
        assert_eq!(cc.get("group.id"), Some("g"));
    }

    #[test]
    fn kip_848s_protocol_gets_no_client_side_strategy_and_range_on_the_broker() {
        let pairs = [
            ("bootstrap.servers", "b:9092"),
            ("group.id", "g"),
            ("group.protocol", "consumer"),
        ];
        let cc = consumer_config(&config(&pairs));
        assert_eq!(cc.get("partition.assignment.strategy"), None);
        assert_eq!(cc.get("group.remote.assignor"), None, "the broker's choice");
        let mut sharded = config(&pairs);
        sharded.wal.sharding = Sharding::Partition;
        let cc = consumer_config(&sharded);
        assert_eq!(cc.get("partition.assignment.strategy"), None);
        assert_eq!(cc.get("group.remote.assignor"), Some("range"));
        // librdkafka itself accepts what is left.
        let consumer: Result<rdkafka::consumer::BaseConsumer, _> = cc.create();
        assert!(consumer.is_ok(), "{:?}", consumer.err());
        // The classic protocol under partition sharding: eager `range`.
        let mut classic = config(&pairs[..2]);
        classic.wal.sharding = Sharding::Partition;
        let cc = consumer_config(&classic);
        assert_eq!(cc.get("partition.assignment.strategy"), Some("range"));
        assert_eq!(producer_config(&kafka(&pairs)).get("group.protocol"), None);
    }

    #[test]
    fn the_fetch_queue_defaults_apply_unless_the_user_sets_them() {
        let cc = consumer_config(&config(&[
            ("bootstrap.servers", "b:9092"),
            ("group.id", "g"),
        ]));
        assert_eq!(cc.get("fetch.queue.backoff.ms"), Some("10"));
        assert_eq!(cc.get("queued.min.messages"), Some("20000"));
        assert_eq!(cc.get("queued.max.messages.kbytes"), Some("32768"));
        let cc = consumer_config(&config(&[
            ("bootstrap.servers", "b:9092"),
            ("group.id", "g"),
            ("fetch.queue.backoff.ms", "1000"),
            ("queued.min.messages", "100000"),
        ]));
        assert_eq!(cc.get("fetch.queue.backoff.ms"), Some("1000"));
        assert_eq!(cc.get("queued.min.messages"), Some("100000"));
        assert_eq!(cc.get("queued.max.messages.kbytes"), Some("32768"));
    }
}
