//! What the dead-letter topics already hold: the reject ids produced at or
//! past given offsets. A folder reads them before it produces a commit's
//! fold rejects, so a crash between a produce and its delivery mark, or a
//! new folder re-delivering a crashed one's commits, does not deliver a
//! reject twice. With transactions (`errors.dead_letter_transactions`) it
//! reads `read_committed`: after the folder's `InitProducerId` fenced any
//! older folder and aborted its open transaction, what it reads is all that
//! will ever be committed before its own produce (docs/dead-letters.md).

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use super::client::{self, QuietContext};
use super::denied::{self, Refused};
use super::record::headers::GS_REJECT_ID;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::types::PartitionOffsets;

/// One metadata or watermark request.
const TIMEOUT: Duration = Duration::from_secs(10);
/// A read that receives nothing for this long fails (it ends at the
/// offsets it found at its start, however many there are).
const READ_STALL: Duration = Duration::from_secs(30);
/// How long the start's probe of the READ permission listens at most.
const PROBE_FOR: Duration = Duration::from_secs(10);
/// Without transactions, after the ends it found, a read listens this long
/// for more: tansu 0.6 can report a high watermark below the records it has
/// acknowledged (the chaos `kills` phase saw a restart miss a crashed
/// folder's last produces and deliver them again). Apache Kafka's high
/// watermark is right (docs/kafka.md), and a `read_committed` read ends at
/// the last stable offset: no tail.
const UNCOMMITTED_TAIL: Duration = Duration::from_millis(700);

/// What one read found.
#[derive(Debug, Default)]
pub(crate) struct Found {
    /// `graphsink.reject_id` of every message read.
    pub reject_ids: HashSet<String>,
    /// Each partition's end when the read started: later produces land past
    /// it.
    pub ends: PartitionOffsets,
    /// Partitions with no offset to start from, and topics the cluster does
    /// not know (partition -1): not read (a reject produced there before is
    /// produced again: at least once).
    pub unbounded: Vec<(String, i32)>,
}

/// A consumer that only assigns partitions to itself: it never joins the
/// group and never commits. Cheap to clone.
#[derive(Clone)]
pub(crate) struct DeliveredReader {
    consumer: Arc<Mutex<BaseConsumer<QuietContext>>>,
    tail: Duration,
    /// `sasl.username` and `group.id`, to name in a refusal.
    username: Option<String>,
    group: String,
}

impl DeliveredReader {
    /// `committed`: read what transactions committed (the fold rejects'
    /// producer is transactional), ending at each partition's last stable
    /// offset; else every record, with the `UNCOMMITTED_TAIL`.
    pub(crate) fn new(config: &Config, committed: bool) -> Result<DeliveredReader> {
        // The dead letters' cluster: `errors.producer` may name another one
        // than `[kafka]` (its producer-only properties are ignored here).
        let mut cc = client::consumer_config(config);
        for (k, v) in &config.errors.producer {
            cc.set(k, v);
        }
        cc.set("enable.partition.eof", "true");
        // A fetch at a partition's end answers (EOF) after this, not after
        // librdkafka's 500 ms: the probes and the ends are read sooner.
        cc.set("fetch.wait.max.ms", "50");
        // Without transactions, every record there is: an idempotent
        // producer's last batches must be seen (tansu 0.6's stable offset
        // can trail them). With them, only what was committed: an aborted
        // attempt's rejects are not on the topic for any reader that counts.
        // The watermark queries follow the same isolation (librdkafka's
        // ListOffsets), so a partition's end is its last stable offset.
        let (isolation, tail) = if committed {
            ("read_committed", Duration::ZERO)
        } else {
            ("read_uncommitted", UNCOMMITTED_TAIL)
        };
        cc.set("isolation.level", isolation);
        Ok(DeliveredReader {
            consumer: Arc::new(Mutex::new(cc.create_with_context(QuietContext::default())?)),
            tail,
            username: cc.get("sasl.username").map(str::to_string),
            // librdkafka assigns only with a group: it never joins or
            // commits, but asks for the group's coordinator.
            group: cc.get("group.id").unwrap_or_default().to_string(),
        })
    }

    /// The reject ids on `topics` at or past `since` (a partition `since`
    /// does not name is not read: `Found::unbounded`), or with `since =
    /// None` only the ends, and a probe that reading is allowed (a fetch
    /// at each end). A topic that does not exist holds nothing. A refusal
    /// is `Error::NotAuthorized` (`READ on topic …`).
    pub(crate) async fn read(
        &self,
        topics: Vec<String>,
        since: Option<PartitionOffsets>,
    ) -> Result<Found> {
        let consumer = self.consumer.clone();
        let tail = self.tail;
        let (username, group) = (self.username.clone(), self.group.clone());
        tokio::task::spawn_blocking(move || {
            let c = consumer.lock().unwrap_or_else(|e| e.into_inner());
            let read = read_blocking(&c, &topics, since.as_ref(), tail);
            // The credentials or the group refused: said by a poll
            // (`fail`), or still in the queue; named here, where the user
            // and the group are known.
            let refused = |e: &Error| match e {
                Error::NotAuthorized { code, .. } if code == Refused::Group.code() => {
                    Some(Refused::Group)
                }
                Error::NotAuthorized { code, .. } if code == Refused::Credentials.code() => {
                    Some(Refused::Credentials)
                }
                Error::NotAuthorized { .. } => None,
                _ => client::queued_refusal(&c).filter(|r| *r == Refused::Credentials),
            };
            match read {
                Err(e) => Err(match refused(&e) {
                    Some(Refused::Group) => Refused::Group.needs(denied::read_group(&group)),
                    Some(r) => r.needs(denied::credentials(username.as_deref())),
                    None => e,
                }),
                read => read,
            }
        })
        .await
        .map_err(|e| Error::Bug(format!("dead-letter read task: {e}")))?
    }
}

/// A failed call of the read of `topic` (several: the ones assigned).
/// The credentials or the group refused are named by `read`, which knows
/// the user and the group.
fn fail(what: String, topic: &str) -> impl FnOnce(KafkaError) -> Error + '_ {
    move |e| match Refused::of(&e) {
        Some(r @ Refused::Topic) => r.needs(denied::read_topic(topic)),
        Some(r @ (Refused::Credentials | Refused::Group)) => r.needs(String::new()),
        _ => Error::Broker(format!("kafka: cannot {what}: {e}")),
    }
}

/// The read, on a blocking thread: the ends and starts of each topic's
/// partitions, then every message from the starts to the ends (and the
/// tail).
fn read_blocking(
    c: &BaseConsumer<QuietContext>,
    topics: &[String],
    since: Option<&PartitionOffsets>,
    tail: Duration,
) -> Result<Found> {
    let mut found = Found::default();
    let mut tpl = TopicPartitionList::new();
    // The end each assigned partition is read up to.
    let mut todo: Todo = BTreeMap::new();
    for t in topics {
        plan_topic(c, t, since, &mut found, &mut tpl, &mut todo)?;
    }
    if since.is_none() {
        probe(c, &found)?;
        return Ok(found);
    }
    // Partitions already at their reported end are read too, for the tail.
    if let (Some(since), false) = (since, tail.is_zero()) {
        assign_for_tail(&found, since, &todo, &mut tpl)?;
    }
    if tpl.count() == 0 {
        // Nothing past `since`: still a fetch, so a missing READ shows at
        // every delivery that relies on the read-back, not only at start.
        probe(c, &found)?;
        return Ok(found);
    }
    let names = topics.join(", ");
    c.assign(&tpl)
        .map_err(fail("assign dead-letter partitions".into(), &names))?;
    let outcome = drain(c, found, todo, tail, &names);
    let _ = c.unassign();
    outcome
}

/// The end each assigned partition is read up to, by (topic, partition).
type Todo = BTreeMap<(String, i32), i64>;

/// One topic's partitions: each one's end into `found`, and (with `since`)
/// each with something to read into `tpl` and `todo`, from its start.
fn plan_topic(
    c: &BaseConsumer<QuietContext>,
    t: &str,
    since: Option<&PartitionOffsets>,
    found: &mut Found,
    tpl: &mut TopicPartitionList,
    todo: &mut Todo,
) -> Result<()> {
    let md = c
        .fetch_metadata(Some(t), TIMEOUT)
        .map_err(fail(format!("fetch metadata of dead-letter topic {t}"), t))?;
    // A topic the reader's cluster does not know holds nothing it can
    // skip: said as unbounded (partition -1), so a delivery warns.
    let Some(mt) = md.topics().iter().find(|x| x.name() == t) else {
        found.unbounded.push((t.to_string(), -1));
        return Ok(());
    };
    match mt.error().map(RDKafkaErrorCode::from) {
        None => {}
        Some(RDKafkaErrorCode::UnknownTopicOrPartition) => {
            found.unbounded.push((t.to_string(), -1));
            return Ok(());
        }
        Some(e) => {
            return Err(match Refused::of_code(e) {
                Some(r @ Refused::Topic) => r.needs(denied::read_topic(t)),
                _ => Error::Broker(format!("kafka: dead-letter topic {t}: metadata error {e}")),
            })
        }
    }
    for p in mt.partitions() {
        let (low, high) = c
            .fetch_watermarks(t, p.id(), TIMEOUT)
            .map_err(fail(format!("fetch watermarks of {t}/{}", p.id()), t))?;
        found
            .ends
            .entry(t.to_string())
            .or_default()
            .insert(p.id(), high);
        let Some(since) = since else { continue };
        let Some(&bound) = since.get(t).and_then(|m| m.get(&p.id())) else {
            found.unbounded.push((t.to_string(), p.id()));
            continue;
        };
        let from = if bound > high {
            // Offsets only grow, unless the topic was deleted and made
            // again: read what it holds.
            tracing::warn!(topic = %t, partition = p.id(), bound, high, "dead-letter partition ends below the offset recorded for it (recreated?); reading it from its start");
            low
        } else {
            bound.max(low)
        };
        if from < high {
            tpl.add_partition_offset(t, p.id(), Offset::Offset(from))
                .map_err(fail(format!("assign {t}/{}", p.id()), t))?;
            todo.insert((t.to_string(), p.id()), high);
        }
    }
    Ok(())
}

/// Assigns the partitions `since` names that are already at their
/// reported end, so the tail hears what lies past it.
fn assign_for_tail(
    found: &Found,
    since: &PartitionOffsets,
    todo: &Todo,
    tpl: &mut TopicPartitionList,
) -> Result<()> {
    for (t, parts) in &found.ends {
        for (&p, &high) in parts {
            if !todo.contains_key(&(t.clone(), p)) && since.get(t).and_then(|m| m.get(&p)).is_some()
            {
                let from = since[t][&p].min(high).max(0);
                tpl.add_partition_offset(t, p, Offset::Offset(from))
                    .map_err(fail(format!("assign {t}/{p}"), t))?;
            }
        }
    }
    Ok(())
}

/// Polls the assigned partitions until each is read to its end and the
/// tail has passed, noting each message's reject id.
fn drain(
    c: &BaseConsumer<QuietContext>,
    mut found: Found,
    mut todo: Todo,
    tail: Duration,
    names: &str,
) -> Result<Found> {
    let mut last_message = Instant::now();
    let mut tail_from: Option<Instant> = None;
    loop {
        if todo.is_empty() {
            let since = *tail_from.get_or_insert_with(Instant::now);
            if since.elapsed() >= tail {
                return Ok(found);
            }
        }
        if last_message.elapsed() > READ_STALL {
            return Err(Error::Broker(format!(
                "reading the dead-letter topics: nothing received for {READ_STALL:?}; {} partitions unread",
                todo.len()
            )));
        }
        match c.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                last_message = Instant::now();
                note_message(&m, &mut found, &mut todo);
            }
            // At a partition's end, or idle: positions tell which are done
            // (a gap of control records or compaction never yields its
            // last offset as a message).
            Some(Err(KafkaError::PartitionEOF(_))) | None => {
                if let Ok(pos) = c.position() {
                    for e in pos.elements() {
                        let tp = (e.topic().to_string(), e.partition());
                        if let (Offset::Offset(o), Some(&end)) = (e.offset(), todo.get(&tp)) {
                            if o >= end {
                                todo.remove(&tp);
                            }
                        }
                    }
                }
            }
            // librdkafka reconnects by itself; READ_STALL bounds the wait.
            Some(Err(e)) if passing(&e) => {}
            Some(Err(e)) => return Err(fail("read the dead-letter topics".into(), names)(e)),
        }
    }
}

/// Trouble with a connection, which librdkafka reports and then retries by
/// itself, as the run loop's consumer treats it: a broker that restarted
/// (the reader is kept between reads, so its failed connection is reported
/// at the next read's first poll), a handshake a proxy cut, every broker
/// down for a while. A read goes on through it; anything else fails it.
fn passing(e: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(
            C::BrokerTransportFailure
                | C::AllBrokersDown
                | C::Resolve
                | C::OperationTimedOut
                | C::RequestTimedOut
        )
    )
}

/// Whether reading is allowed: a fetch at each partition's end, until
/// each has answered (its end, or a record produced meanwhile) or
/// `PROBE_FOR` has passed. Only a refusal fails it. The ends alone need
/// no more than DESCRIBE, which WRITE gives too: without the probe a
/// missing READ would not show while there is nothing to read back.
fn probe(c: &BaseConsumer<QuietContext>, found: &Found) -> Result<()> {
    let mut tpl = TopicPartitionList::new();
    for (t, parts) in &found.ends {
        for (&p, &high) in parts {
            tpl.add_partition_offset(t, p, Offset::Offset(high))
                .map_err(fail(format!("assign {t}/{p}"), t))?;
        }
    }
    if tpl.count() == 0 {
        return Ok(());
    }
    let names: Vec<&str> = found.ends.keys().map(String::as_str).collect();
    let names = names.join(", ");
    c.assign(&tpl)
        .map_err(fail("assign dead-letter partitions".into(), &names))?;
    let started = Instant::now();
    let mut answered = 0;
    let outcome = loop {
        if answered >= tpl.count() || started.elapsed() > PROBE_FOR {
            break Ok(());
        }
        match c.poll(Duration::from_millis(200)) {
            Some(Ok(_)) | Some(Err(KafkaError::PartitionEOF(_))) => answered += 1,
            Some(Err(e)) if Refused::of(&e).is_some() => {
                break Err(fail("read the dead-letter topics".into(), &names)(e))
            }
            Some(Err(_)) | None => {}
        }
    };
    let _ = c.unassign();
    outcome
}

/// One message read: its reject id, its partition done if it is the last
/// before the end, and the end moved past it.
fn note_message(m: &BorrowedMessage<'_>, found: &mut Found, todo: &mut Todo) {
    if let Some(hs) = m.headers() {
        for h in hs.iter().filter(|h| h.key == GS_REJECT_ID) {
            if let Some(v) = h.value {
                found
                    .reject_ids
                    .insert(String::from_utf8_lossy(v).into_owned());
            }
        }
    }
    let tp = (m.topic().to_string(), m.partition());
    if todo.get(&tp).is_some_and(|&end| m.offset() + 1 >= end) {
        todo.remove(&tp);
    }
    // Past the reported end: the true end is further.
    let end = found
        .ends
        .entry(tp.0.clone())
        .or_default()
        .entry(tp.1)
        .or_insert(0);
    *end = (*end).max(m.offset() + 1);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read of the dead-letter topics goes on through connection
    /// trouble librdkafka retries (the chaos cluster phases saw a reader
    /// kept across a rolling restart fail its next read, and a stop then
    /// exit 1), and stops at anything else.
    #[test]
    fn connection_trouble_passes_and_nothing_else() {
        use RDKafkaErrorCode as C;
        for code in [
            C::BrokerTransportFailure,
            C::AllBrokersDown,
            C::Resolve,
            C::OperationTimedOut,
            C::RequestTimedOut,
        ] {
            assert!(passing(&KafkaError::MessageConsumption(code)), "{code:?}");
            assert!(passing(&KafkaError::Global(code)), "{code:?}");
        }
        for code in [
            C::TopicAuthorizationFailed,
            C::SaslAuthenticationFailed,
            C::UnknownTopicOrPartition,
            C::OffsetOutOfRange,
            C::Fatal,
        ] {
            assert!(!passing(&KafkaError::MessageConsumption(code)), "{code:?}");
        }
    }
}
