//! One poll: take what the consumer holds, decode every topic, put the rows
//! into the shard writers without waiting, put the rejects into the rejects
//! WAL and, together with that, the dead-letter topic; the poll's
//! durability is a future the ack queue resolves in poll order.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use rdkafka::message::{BorrowedMessage, Message};

use super::acks::AckFuture;
use super::run_loop::RunLoop;
use crate::config::Tolerance;
use crate::decode::{Decoded, SourceRecord};
use crate::error::{Error, ErrorKind, Result};
use crate::failpoints;
use crate::kafka::consumer::{GroupConsumer, GroupStream};
use crate::kafka::denied::Refused;
use crate::metrics::{Metrics, PollReport};
use crate::offsets::{PollAck, PollSpans};
use crate::rejects::{self, Reject};
use crate::schema::REJECTS_TABLE;
use crate::shards::PendingWrite;

/// A poll's records by topic, borrowed from its messages.
type ByTopic<'m> = BTreeMap<&'m str, Vec<SourceRecord<'m>>>;

/// Each topic's table and what its records decoded to.
type ByTable = Vec<(String, Decoded)>;

impl RunLoop<'_> {
    /// Takes whatever the consumer already holds, up to the poll limit, as
    /// one poll taken at `taken`, and starts its WAL writes. Returns the
    /// poll's durability.
    pub(super) async fn process_poll<'c>(
        &mut self,
        kafka: &GroupConsumer,
        stream: &mut GroupStream<'c>,
        first: BorrowedMessage<'c>,
        taken: Instant,
    ) -> Result<AckFuture> {
        let msgs = match take_poll(stream, first, self.config.wal.max_poll_records) {
            Ok(msgs) => msgs,
            // Nothing of the poll is acked: read again after the grant.
            Err(r) => return Err(self.refused(r).await),
        };
        // Records whose schema is not known yet hold their partitions.
        let msgs = self.schemas.ready(kafka, &self.decoders, msgs)?;
        let take = taken.elapsed();
        let (by_topic, seen, value_bytes) = sort(&msgs, &self.metrics);
        // Decode every topic before writing anything, so a poll that must
        // stop (errors.tolerance = "none") writes nothing.
        let decode_started = Instant::now();
        let (decoded, rejects) = self.decode(by_topic)?;
        let put_started = Instant::now();
        self.since_cut.took(taken, value_bytes, &seen);
        let ack = seen.ack();
        let mut writes = self.put(decoded).await?;
        let mut reject = Duration::ZERO;
        if !rejects.is_empty() {
            let t = Instant::now();
            writes.extend(self.write_rejects(&rejects).await?);
            reject = t.elapsed();
        }
        self.taken += msgs.len() as u64;
        self.metrics.poll_done(&PollReport {
            records: msgs.len() as u64,
            rejected: rejects.len() as u64,
            take,
            decode: put_started - decode_started,
            put: put_started.elapsed(),
            reject,
            total: taken.elapsed(),
        });
        if self.since_cut.full(&self.config.fold) {
            self.wake.notify_one();
        }
        Ok(self.durability(rejects, writes, ack))
    }

    /// Decodes each topic's records: (table, rows) per topic, and every
    /// reject. A reject under `errors.tolerance = "none"` stops the run.
    fn decode(&mut self, by_topic: ByTopic<'_>) -> Result<(ByTable, Vec<Reject>)> {
        let mut decoded = Vec::with_capacity(by_topic.len());
        let mut rejects = Vec::new();
        for (topic, records) in by_topic {
            let decoder = self
                .decoders
                .get_mut(topic)
                .ok_or_else(|| Error::Bug(format!("record from unmapped topic {topic}")))?;
            let mut d = decoder.decode(&records)?;
            rejects.append(&mut d.rejects);
            decoded.push((decoder.graph_type().table.clone(), d));
        }
        if let Some(r) = rejects.first() {
            if self.config.errors.tolerance == Tolerance::None {
                return Err(r.intolerable());
            }
            self.count_rejects(rejects.len() as u64);
        }
        Ok((decoded, rejects))
    }

    /// Hands each table's upserts and deletes to its shard writers.
    async fn put(&mut self, decoded: ByTable) -> Result<Vec<PendingWrite>> {
        let mut writes = Vec::new();
        for (table, d) in decoded {
            let shards = &self.pool.tables[&table];
            if let Some(rows) = d.upserts {
                self.since_cut.wrote(rows.num_rows() as u64);
                writes.extend(shards.put(rows).await?);
            }
            if let Some(keys) = d.deletes {
                self.since_cut.wrote(keys.num_rows() as u64);
                writes.extend(shards.delete(keys).await?);
            }
        }
        Ok(writes)
    }

    /// Puts a poll's rejects into the rejects WAL.
    async fn write_rejects(&mut self, rejects: &[Reject]) -> Result<Vec<PendingWrite>> {
        self.since_cut.wrote(rejects.len() as u64);
        for r in rejects {
            tracing::debug!(reject_id = %r.reject_id, code = r.code.as_str(), message = %r.message, "rejected");
            self.metrics.rejected(r.stage.as_str(), r.code.as_str());
        }
        Ok(self.pool.tables[REJECTS_TABLE]
            .put(rejects::to_batch(rejects))
            .await?)
    }

    /// Counts rejects; past `errors.max_rejects_per_minute`, pauses fetching.
    fn count_rejects(&mut self, n: u64) {
        let now = tokio::time::Instant::now();
        if let Some(trip) = self.breaker.count(n, now, &self.config.errors) {
            tracing::error!(
                event = "breaker_tripped",
                rejects = trip.rejects,
                limit = self.config.errors.max_rejects_per_minute,
                pause = ?self.config.errors.breaker_pause,
                "reject-rate breaker tripped: more than errors.max_rejects_per_minute; pausing fetches"
            );
            self.metrics.breaker(true);
        }
    }

    /// A poll's durability: in the WAL, and every reject both in the
    /// rejects WAL and acknowledged by the dead-letter topic. The two are
    /// awaited together, not one after the other: a poll with rejects
    /// would otherwise wait a produce round trip plus a WAL flush, and
    /// fill the in-flight window under a reject storm. The ack needs both.
    fn durability(
        &self,
        rejects: Vec<Reject>,
        writes: Vec<PendingWrite>,
        ack: PollAck,
    ) -> AckFuture {
        let dead_letters = self.dead_letters.clone();
        let stop = self.shutdown.clone();
        async move {
            let delivered = async {
                if !rejects.is_empty() {
                    failpoints::hit(failpoints::REJECTS_BEFORE_DEAD_LETTERS)?;
                    dead_letters.deliver(&rejects, None, &stop).await?;
                    failpoints::hit(failpoints::REJECTS_AFTER_DEAD_LETTERS)?;
                }
                Ok::<_, Error>(())
            };
            let written = async {
                let mut moved = Vec::new();
                for w in writes {
                    let (table, bucket) = (w.table.clone(), w.bucket);
                    match w.wait().await.map_err(Error::from) {
                        Ok(()) => {}
                        Err(e) if e.kind() == ErrorKind::Fenced => moved.push((table, bucket, e)),
                        Err(e) => return Err(e),
                    }
                }
                Ok(moved)
            };
            let ((), moved) = futures::try_join!(delivered, written)?;
            Ok((ack, moved))
        }
        .boxed()
    }
}

/// Takes whatever the consumer already holds after `first`, up to `limit`
/// records in all, without waiting for more; a refusal among them stops
/// the session.
fn take_poll<'c>(
    stream: &mut GroupStream<'c>,
    first: BorrowedMessage<'c>,
    limit: usize,
) -> std::result::Result<Vec<BorrowedMessage<'c>>, Refused> {
    let mut msgs = vec![first];
    while msgs.len() < limit {
        match stream.next().now_or_never() {
            Some(Some(Ok(m))) => msgs.push(m),
            Some(Some(Err(e))) => {
                if let Some(r) = Refused::of(&e) {
                    return Err(r);
                }
                tracing::warn!(error = %e, "consumer error inside a poll");
                break;
            }
            // Nothing ready (a Kafka stream never ends).
            Some(None) | None => break,
        }
    }
    Ok(msgs)
}

/// A poll's records by topic, the offsets it spans, and its value bytes;
/// each partition's records, bytes and newest offset go to the metrics.
fn sort<'m>(
    msgs: &'m [BorrowedMessage<'m>],
    metrics: &Metrics,
) -> (ByTopic<'m>, PollSpans<'m>, u64) {
    let mut by_topic: ByTopic<'m> = BTreeMap::new();
    let mut seen = PollSpans::default();
    let mut value_bytes = 0;
    // Per partition: records, key + value bytes, newest offset.
    let mut took: BTreeMap<(&str, i32), (u64, u64, i64)> = BTreeMap::new();
    for m in msgs {
        let r = SourceRecord {
            topic: m.topic(),
            partition: m.partition(),
            offset: m.offset(),
            timestamp: m.timestamp().to_millis(),
            key: m.key(),
            value: m.payload(),
            message: Some(m),
        };
        seen.record(r.topic, r.partition, r.offset);
        value_bytes += r.value.map_or(0, |v| v.len() as u64);
        let t = took.entry((r.topic, r.partition)).or_default();
        t.0 += 1;
        t.1 += (r.key.map_or(0, <[u8]>::len) + r.value.map_or(0, <[u8]>::len)) as u64;
        t.2 = t.2.max(r.offset);
        by_topic.entry(r.topic).or_default().push(r);
    }
    for ((topic, partition), (n, bytes, newest)) in took {
        metrics.polled(&(topic.to_string(), partition), n, bytes, newest + 1);
    }
    (by_topic, seen, value_bytes)
}
