//! The workload: deterministic node records (`Item`), produced to the topic
//! before anything is measured, plus a paced producer for the latency phase.
//! Owns record generation and producing; measures nothing itself.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::ClientContext;

use crate::broker::BoxError;

/// The graph schema the bench writes: one node type, keyed by `sku`.
/// `pad` carries the bulk of `--value-bytes`.
pub const SCHEMA: &str = "node Item {\n    sku: String @key\n    seq: I64\n    pad: String\n}\n";
pub const NODE: &str = "Item";

#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub keys: u64,
    pub value_bytes: usize,
}

/// Record `i`'s key and JSON value. Keys are drawn pseudo-randomly from the
/// key space (a fixed-seed xorshift), so with `keys < records` the same key
/// is updated many times in random order, as in a real change stream.
pub fn record(shape: Shape, seed: u64, i: u64) -> (String, String) {
    let mut x = (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    let sku = format!("k{:010}", x % shape.keys.max(1));
    let head = format!("{{\"sku\":\"{sku}\",\"seq\":{i},\"pad\":\"");
    let pad = shape.value_bytes.saturating_sub(head.len() + 2);
    let value = format!("{head}{}\"}}", "x".repeat(pad));
    (sku, value)
}

/// Remembers (partition, offset, timestamp ms) of every delivered record,
/// so latencies can be taken per record later.
#[derive(Default)]
pub struct Deliveries {
    pub acked: Mutex<Vec<(i32, i64, i64)>>,
    pub failed: Mutex<u64>,
}

pub struct Recorder(pub Arc<Deliveries>, pub bool);

impl ClientContext for Recorder {}
impl ProducerContext for Recorder {
    type DeliveryOpaque = ();
    fn delivery(&self, r: &DeliveryResult<'_>, _: ()) {
        match r {
            Ok(m) if self.1 => {
                let ts = m.timestamp().to_millis().unwrap_or(0);
                self.0
                    .acked
                    .lock()
                    .unwrap()
                    .push((m.partition(), m.offset(), ts));
            }
            Ok(_) => {}
            Err(_) => *self.0.failed.lock().unwrap() += 1,
        }
    }
}

pub fn producer(
    bootstrap: &str,
    record: bool,
) -> Result<(BaseProducer<Recorder>, Arc<Deliveries>), BoxError> {
    let d = Arc::new(Deliveries::default());
    let p = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "500000")
        .create_with_context(Recorder(d.clone(), record))?;
    Ok((p, d))
}

/// Sends one record, waiting out a full local queue instead of failing.
pub fn send(
    p: &BaseProducer<Recorder>,
    topic: &str,
    key: &str,
    value: &str,
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

/// Produces the whole backlog and waits for every delivery. Returns records/s.
pub fn produce_backlog(
    bootstrap: &str,
    topic: &str,
    shape: Shape,
    records: u64,
) -> Result<f64, BoxError> {
    let (p, d) = producer(bootstrap, false)?;
    let start = Instant::now();
    for i in 0..records {
        let (k, v) = record(shape, 0x5eed, i);
        send(&p, topic, &k, &v, None)?;
        if i % 1000 == 0 {
            p.poll(Duration::ZERO);
        }
    }
    p.flush(Duration::from_secs(120))?;
    let failed = *d.failed.lock().unwrap();
    if failed > 0 {
        return Err(format!("{failed} records failed to produce").into());
    }
    Ok(records as f64 / start.elapsed().as_secs_f64())
}

/// Produces `rate` records/s for `secs` seconds, each stamped with the wall
/// clock at send time, in 10 ms ticks (so "record timestamp" is when the
/// record entered the system, not when a backlog was written). Blocking;
/// run it on its own thread. Returns every delivered record.
pub fn produce_paced(
    bootstrap: &str,
    topic: &str,
    shape: Shape,
    rate: u64,
    secs: u64,
    first: u64,
) -> Result<Vec<(i32, i64, i64)>, BoxError> {
    let (p, d) = producer(bootstrap, true)?;
    let tick = Duration::from_millis(10);
    let per_tick = (rate / 100).max(1);
    let start = Instant::now();
    let mut i = first;
    for n in 0..(secs * 100) {
        let now = chrono::Utc::now().timestamp_millis();
        for _ in 0..per_tick {
            let (k, v) = record(shape, 0x1a7e, i);
            send(&p, topic, &k, &v, Some(now))?;
            i += 1;
        }
        p.poll(Duration::ZERO);
        let next = start + tick * (n as u32 + 1);
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    p.flush(Duration::from_secs(60))?;
    let acked = std::mem::take(&mut *d.acked.lock().unwrap());
    Ok(acked)
}
