//! Schemas a poll needs before it can be decoded (registry formats).
//!
//! A record framed with a schema id its decoder has not learned holds its
//! partition: the record and those after it in the poll are dropped, the
//! partition is paused and rewound to that record (`kafka::consumer::hold`),
//! and the id is fetched in the background, with backoff, for as long as
//! it takes. Other partitions, and records of ids already learned, flow on.
//! When the registry answers (the schema, or "no such id", which makes the
//! records `unknown_schema_id` rejects), the decoder learns it and the
//! partition fetches again from the held record. Nothing past a held record
//! is acknowledged, so nothing past it is committed, and nothing is lost.
//!
//! A registry that does not answer is not a reject: `/ready` says
//! `schema_registry_stalled`, and the log says so once per interval.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

use rdkafka::message::BorrowedMessage;
use rdkafka::Message;
use tokio::sync::mpsc;

use crate::config::{Config, Evolve, Mapping};
use crate::decode::{Learned, RecordDecoder, Subject};
use crate::error::Result;
use crate::kafka::consumer::{self, GroupConsumer};
use crate::metrics::Metrics;
use crate::registry::{Lookup, Registry};
use crate::types::TopicPartition;

/// How often a stalled registry is named in the log.
const SAY_EVERY: Duration = Duration::from_secs(30);
/// Backoff between asks for one id, doubling from the first.
const BACKOFF_FIRST: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(10);

/// What a background fetch reports.
pub(super) enum SchemaEvent {
    Learned {
        topic: String,
        subject: Subject,
        id: u32,
        schema: Learned,
    },
    /// An ask failed; the fetch goes on after its backoff.
    Failing { id: u32, why: String },
}

/// A partition held at `offset` until its decoder learns `ids` (of keys
/// or values).
struct Held {
    offset: i64,
    ids: BTreeSet<(Subject, u32)>,
}

pub(super) struct SchemaHolds {
    registry: Option<Registry>,
    /// `evolve = "from_registry"`: each registry mapping by topic, whose
    /// new writer fields end the session (`from_registry::grown`).
    grow: HashMap<String, Mapping>,
    held: BTreeMap<TopicPartition, Held>,
    /// (topic, subject, id) being fetched.
    fetching: HashSet<(String, Subject, u32)>,
    tx: mpsc::UnboundedSender<SchemaEvent>,
    pub(super) events: mpsc::UnboundedReceiver<SchemaEvent>,
    /// Ids whose last ask failed, and why.
    failing: BTreeMap<u32, String>,
    said: Option<tokio::time::Instant>,
}

impl SchemaHolds {
    pub(super) fn new(registry: Option<Registry>, config: &Config) -> SchemaHolds {
        let (tx, events) = mpsc::unbounded_channel();
        let grow = (config.mappings.iter())
            .filter(|m| config.graph.evolve == Evolve::FromRegistry && m.format.uses_registry())
            .map(|m| (m.topic.clone(), m.clone()))
            .collect();
        SchemaHolds {
            registry,
            grow,
            held: BTreeMap::new(),
            fetching: HashSet::new(),
            tx,
            events,
            failing: BTreeMap::new(),
            said: None,
        }
    }

    /// The records of a poll that can be decoded now. Each record of a
    /// registry format whose schema id its decoder has not learned holds its
    /// partition from that record on; so does a partition already held.
    pub(super) fn ready<'c>(
        &mut self,
        kafka: &GroupConsumer,
        decoders: &HashMap<String, RecordDecoder>,
        msgs: Vec<BorrowedMessage<'c>>,
    ) -> Result<Vec<BorrowedMessage<'c>>> {
        let Some(registry) = &self.registry else {
            return Ok(msgs);
        };
        let mut keep = Vec::with_capacity(msgs.len());
        let mut newly: Vec<TopicPartition> = Vec::new();
        // Per record this runs on the hot path: the topic's decoder is
        // looked up once per run of records of one topic, and the held set
        // only while a partition is held.
        let mut last: Option<(&str, &RecordDecoder)> = None; // from `decoders`
        for m in msgs {
            let topic = m.topic();
            if !self.held.is_empty() {
                if let Some(h) = self.held.get(&(topic.to_string(), m.partition())) {
                    // Fetched before the hold landed: read again after it.
                    debug_assert!(m.offset() >= h.offset);
                    continue;
                }
            }
            let decoder = match last {
                Some((t, d)) if t == topic => Some(d),
                _ => {
                    last = decoders.get_key_value(topic).map(|(t, d)| (t.as_str(), d));
                    last.map(|(_, d)| d)
                }
            };
            let wanted = decoder.and_then(|d| d.unlearned_subject(m.key(), m.payload()));
            let Some((subject, id)) = wanted else {
                keep.push(m);
                continue;
            };
            let tp = (topic.to_string(), m.partition());
            self.held.insert(
                tp.clone(),
                Held {
                    offset: m.offset(),
                    ids: BTreeSet::from([(subject, id)]),
                },
            );
            newly.push(tp);
            if self.fetching.insert((m.topic().to_string(), subject, id)) {
                // Protobuf asks for the serialized descriptor first.
                let serialized = decoders[m.topic()].wants_descriptor(subject);
                tokio::spawn(fetch(
                    registry.clone(),
                    m.topic().to_string(),
                    subject,
                    id,
                    serialized,
                    self.tx.clone(),
                ));
            }
        }
        for tp in newly {
            let offset = self.held[&tp].offset;
            tracing::debug!(topic = %tp.0, partition = tp.1, offset, "holding for a schema");
            consumer::hold(kafka, &tp, offset)?;
        }
        Ok(keep)
    }

    /// A fetch reported: the decoder learns the schema, and the partitions
    /// that waited for it fetch again.
    pub(super) fn on_event(
        &mut self,
        kafka: &GroupConsumer,
        decoders: &mut HashMap<String, RecordDecoder>,
        metrics: &Metrics,
        ev: SchemaEvent,
    ) -> Result<()> {
        match ev {
            SchemaEvent::Failing { id, why } => {
                self.failing.insert(id, why);
                self.say();
            }
            SchemaEvent::Learned {
                topic,
                subject,
                id,
                schema,
            } => {
                self.fetching.remove(&(topic.clone(), subject, id));
                if self.failing.remove(&id).is_some() && self.failing.is_empty() {
                    tracing::info!(
                        event = "schema_registry_recovered",
                        "the schema registry answers again"
                    );
                }
                if let Some(d) = decoders.get_mut(&topic) {
                    // A writer with a field the graph should take: the
                    // partition stays held, and the next session adds it.
                    if let (Subject::Value, Some(m), Ok(s)) =
                        (subject, self.grow.get(&topic), &schema)
                    {
                        super::from_registry::grown(m, d, id, s)?;
                    }
                    d.learn_subject(subject, id, schema);
                }
                let done: Vec<TopicPartition> = self
                    .held
                    .iter_mut()
                    .filter(|(tp, _)| tp.0 == topic)
                    .filter_map(|(tp, h)| {
                        h.ids.remove(&(subject, id));
                        h.ids.is_empty().then(|| tp.clone())
                    })
                    .collect();
                for tp in done {
                    self.held.remove(&tp);
                    consumer::release(kafka, &tp)?;
                }
            }
        }
        metrics.schema_registry_stalled(!self.failing.is_empty() && !self.held.is_empty());
        Ok(())
    }

    /// Revoked partitions are no longer held (their next owner starts from
    /// the committed offset, which is at or before the held record).
    pub(super) fn forget(&mut self, tps: &[TopicPartition], metrics: &Metrics) {
        for tp in tps {
            self.held.remove(tp);
        }
        metrics.schema_registry_stalled(!self.failing.is_empty() && !self.held.is_empty());
    }

    /// Says once per `SAY_EVERY` which partitions wait, and why.
    fn say(&mut self) {
        let now = tokio::time::Instant::now();
        if self.said.is_some_and(|t| now.duration_since(t) < SAY_EVERY) {
            return;
        }
        self.said = Some(now);
        let held: Vec<String> = self
            .held
            .iter()
            .map(|((t, p), h)| format!("{t}/{p}@{}", h.offset))
            .collect();
        let why: Vec<String> = self
            .failing
            .iter()
            .map(|(id, w)| format!("schema id {id}: {w}"))
            .collect();
        tracing::warn!(
            event = "schema_registry_stalled",
            held = %held.join(", "),
            "no schema from the schema registry; these partitions hold at the record that needs the schema, and nothing past it is committed: {}",
            why.join("; ")
        );
    }
}

/// Fetches `id` until the registry answers, with backoff.
async fn fetch(
    registry: Registry,
    topic: String,
    subject: Subject,
    id: u32,
    serialized: bool,
    tx: mpsc::UnboundedSender<SchemaEvent>,
) {
    let mut backoff = BACKOFF_FIRST;
    loop {
        let asked = match registry.schema(id, serialized).await {
            Ok(s) => registry.with_imports(s).await,
            Err(e) => Err(e),
        };
        let schema = match asked {
            Ok(s) => Ok(s),
            Err(Lookup::NotFound(m)) => Err(m),
            Err(Lookup::Unavailable(why)) => {
                if tx.send(SchemaEvent::Failing { id, why }).is_err() {
                    return; // the session ended
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        let _ = tx.send(SchemaEvent::Learned {
            topic,
            subject,
            id,
            schema,
        });
        return;
    }
}
