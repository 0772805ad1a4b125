//! Producing the workload: the backlog, produced before anything is
//! measured; one primer record; a paced producer for the latency phase.
//! Each waits for the broker's acks, which give every phase its end
//! offsets. Owns the producer; the records are `workload`'s, their encoding
//! `formats`'s.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::ClientContext;

use crate::broker::BoxError;
use crate::formats::Codec;
use crate::workload::{node_fields, record_fields, Fields, Kind, Shape, Topics, BACKLOG_SEED};

/// What the broker acknowledged: the end offset per slot (highest acked
/// offset + 1: the stop condition of every phase, exact where tansu's high
/// watermarks are not), and, when recording, (slot, offset, timestamp ms)
/// per record so latencies can be taken per record later.
pub(crate) struct Deliveries {
    pub ends: Mutex<Vec<i64>>,
    pub delivered: Mutex<u64>,
    pub acked: Mutex<Vec<(usize, i64, i64)>>,
    pub failed: Mutex<u64>,
}

pub(crate) struct Recorder {
    pub d: Arc<Deliveries>,
    pub topics: Topics,
    pub record: bool,
}

impl ClientContext for Recorder {}
impl ProducerContext for Recorder {
    type DeliveryOpaque = ();
    fn delivery(&self, r: &DeliveryResult<'_>, _: ()) {
        match r {
            Ok(m) => {
                let Some(slot) = self.topics.slot(m.topic(), m.partition()) else {
                    return;
                };
                {
                    let mut ends = self.d.ends.lock().unwrap();
                    ends[slot] = ends[slot].max(m.offset() + 1);
                }
                *self.d.delivered.lock().unwrap() += 1;
                if self.record {
                    let ts = m.timestamp().to_millis().unwrap_or(0);
                    self.d.acked.lock().unwrap().push((slot, m.offset(), ts));
                }
            }
            Err(_) => *self.d.failed.lock().unwrap() += 1,
        }
    }
}

pub(crate) fn producer(
    bootstrap: &str,
    topics: &Topics,
    record: bool,
) -> Result<(BaseProducer<Recorder>, Arc<Deliveries>), BoxError> {
    let d = Arc::new(Deliveries {
        ends: Mutex::new(vec![0; topics.slots()]),
        delivered: Mutex::new(0),
        acked: Mutex::new(Vec::new()),
        failed: Mutex::new(0),
    });
    let p = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "500000")
        .create_with_context(Recorder {
            d: d.clone(),
            topics: topics.clone(),
            record,
        })?;
    Ok((p, d))
}

/// Sends one record, waiting out a full local queue instead of failing.
pub(crate) fn send(
    p: &BaseProducer<Recorder>,
    topic: &str,
    key: &str,
    value: &[u8],
    ts: Option<i64>,
) -> Result<(), BoxError> {
    loop {
        let mut rec = BaseRecord::to(topic).key(key).payload(value);
        if let Some(ts) = ts {
            rec = rec.timestamp(ts);
        }
        match p.send(rec) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                p.poll(Duration::from_millis(50));
            }
            Err((e, _)) => return Err(e.into()),
        }
    }
}

/// Waits for every delivery; fails if any record was refused.
fn finish(p: &BaseProducer<Recorder>, d: &Deliveries, sent: u64) -> Result<(), BoxError> {
    p.flush(Duration::from_secs(120))?;
    let failed = *d.failed.lock().unwrap();
    let delivered = *d.delivered.lock().unwrap();
    if failed > 0 || delivered != sent {
        return Err(
            format!("{failed} records failed to produce, {delivered} of {sent} acked").into(),
        );
    }
    Ok(())
}

pub(crate) struct Backlog {
    pub records_per_s: f64,
    /// End offset per slot, from the broker's acks.
    pub ends: Vec<i64>,
    /// Mean value size in bytes, as encoded (with any framing).
    pub value_bytes_mean: f64,
}

/// Produces the whole backlog (node and edge records interleaved as the
/// shape says), encoded by `codec` in chunks, and waits for every delivery.
pub(crate) fn produce_backlog(
    bootstrap: &str,
    topics: &Topics,
    shape: Shape,
    records: u64,
    codec: &Codec,
) -> Result<Backlog, BoxError> {
    const CHUNK: u64 = 10_000;
    let (p, d) = producer(bootstrap, topics, false)?;
    let start = Instant::now();
    let mut bytes = 0u64;
    for from in (0..records).step_by(CHUNK as usize) {
        let (keys, recs) = fields_of(shape, BACKLOG_SEED, from..records.min(from + CHUNK));
        let values = codec.encode(&recs)?;
        for ((k, (kind, _)), v) in keys.iter().zip(&recs).zip(&values) {
            bytes += v.len() as u64;
            send(&p, topics.of(*kind), k, v, None)?;
        }
        p.poll(Duration::ZERO);
    }
    finish(&p, &d, records)?;
    let ends = d.ends.lock().unwrap().clone();
    Ok(Backlog {
        records_per_s: records as f64 / start.elapsed().as_secs_f64(),
        ends,
        value_bytes_mean: bytes as f64 / records.max(1) as f64,
    })
}

/// Records `range` of a stream: their keys, and their kinds and fields.
fn fields_of(
    shape: Shape,
    seed: u64,
    range: std::ops::Range<u64>,
) -> (Vec<String>, Vec<(Kind, Fields)>) {
    range
        .map(|i| {
            let (kind, k, f) = record_fields(shape, seed, i);
            (k, (kind, f))
        })
        .unzip()
}

/// Produces one record now (the primer that proves a consumer has joined).
pub(crate) fn produce_one(
    bootstrap: &str,
    topics: &Topics,
    shape: Shape,
    seed: u64,
    codec: &Codec,
) -> Result<(), BoxError> {
    let (p, d) = producer(bootstrap, topics, false)?;
    let (k, f) = node_fields(shape, seed, 0);
    let v = codec.encode(&[(Kind::Node, f)])?;
    send(&p, &topics.nodes, &k, &v[0], None)?;
    finish(&p, &d, 1)
}

/// Produces `rate` records/s for `secs` seconds (the same node/edge mix),
/// each stamped with the wall clock at send time, in 10 ms ticks (so
/// "record timestamp" is when the record entered the system, not when a
/// backlog was written). Blocking; run it on its own thread.
pub(crate) fn produce_paced(
    bootstrap: &str,
    topics: &Topics,
    shape: Shape,
    rate: u64,
    secs: u64,
    seed: u64,
    codec: &Codec,
) -> Result<Paced, BoxError> {
    let (p, d) = producer(bootstrap, topics, true)?;
    let tick = Duration::from_millis(10);
    let per_tick = (rate / 100).max(1);
    let start = Instant::now();
    let mut i = 0;
    for n in 0..(secs * 100) {
        let now = chrono::Utc::now().timestamp_millis();
        let (keys, recs) = fields_of(shape, seed, i..i + per_tick);
        let values = codec.encode(&recs)?;
        for ((k, (kind, _)), v) in keys.iter().zip(&recs).zip(&values) {
            send(&p, topics.of(*kind), k, v, Some(now))?;
        }
        i += per_tick;
        p.poll(Duration::ZERO);
        let next = start + tick * (n as u32 + 1);
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    finish(&p, &d, i)?;
    let records = std::mem::take(&mut *d.acked.lock().unwrap());
    let ends = d.ends.lock().unwrap().clone();
    Ok(Paced { records, ends })
}

/// What a paced producer delivered.
pub(crate) struct Paced {
    /// (slot, offset, timestamp ms) per record.
    pub records: Vec<(usize, i64, i64)>,
    /// End offset per slot, from the broker's acks.
    pub ends: Vec<i64>,
}
