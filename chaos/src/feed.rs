//! The continuous producer, and the one-shot producer of a phase's closing
//! records: every record carries what the checker must find
//! (`workload::EXPECT`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::check::Res;
use crate::reach::Reach;
use crate::workload::{self, Generator, Out};

/// The continuous producer: `rate` records a second until stopped.
pub(crate) struct Feed {
    stop: Arc<AtomicBool>,
    handle: tokio::task::JoinHandle<(Generator, u64, u64)>,
}

fn producer(kafka: &Reach) -> Res<FutureProducer> {
    kafka
        .create(
            kafka
                .config()
                .set("acks", "all")
                .set("linger.ms", "5")
                // Outages last up to a minute: keep retrying rather than failing.
                .set("message.timeout.ms", "600000")
                .set("log_level", "3"),
        )
        .map_err(|e| format!("producer: {e}"))
}

fn record(o: &Out) -> FutureRecord<'_, [u8], [u8]> {
    let mut r: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&o.topic)
        .partition(o.partition)
        .headers(OwnedHeaders::new().insert(Header {
            key: workload::EXPECT,
            value: Some(o.expect.as_bytes()),
        }));
    if let Some(k) = &o.key {
        r = r.key(k.as_slice());
    }
    if let Some(v) = &o.value {
        r = r.payload(v.as_slice());
    }
    r
}

impl Feed {
    pub(crate) fn start(kafka: &Reach, mut gen: Generator, rate: u32) -> Res<Feed> {
        let producer = producer(kafka)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let handle = tokio::spawn(async move {
            let (sent, failed) = (AtomicU64::new(0), AtomicU64::new(0));
            let mut inflight = FuturesUnordered::new();
            let per_tick = (rate / 20).max(1);
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            while !stop2.load(Ordering::Relaxed) {
                tick.tick().await;
                for _ in 0..per_tick {
                    let o = gen.next();
                    match producer.send_result(record(&o)) {
                        Ok(f) => inflight.push(f),
                        Err(_) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                while let Some(Some(r)) = inflight.next().now_or_never() {
                    tally(r, &sent, &failed);
                }
            }
            while let Some(r) = inflight.next().await {
                tally(r, &sent, &failed);
            }
            (gen, sent.into_inner(), failed.into_inner())
        });
        Ok(Feed { stop, handle })
    }

    pub(crate) async fn stop(mut self) -> (Generator, u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        (&mut self.handle).await.expect("producer task")
    }
}

impl Drop for Feed {
    /// A phase that failed early must not leave its producer running.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.abort();
    }
}

type Delivered = Result<
    rdkafka::producer::future_producer::OwnedDeliveryResult,
    futures::channel::oneshot::Canceled,
>;

fn tally(r: Delivered, sent: &AtomicU64, failed: &AtomicU64) {
    match r {
        Ok(Ok(_)) => sent.fetch_add(1, Ordering::Relaxed),
        _ => failed.fetch_add(1, Ordering::Relaxed),
    };
}

/// Produces `recs` and waits for every delivery: (sent, failed).
pub(crate) async fn produce_all(kafka: &Reach, recs: Vec<Out>) -> Res<(u64, u64)> {
    let producer = producer(kafka)?;
    let (sent, failed) = (AtomicU64::new(0), AtomicU64::new(0));
    let mut inflight = FuturesUnordered::new();
    for o in &recs {
        match producer.send_result(record(o)) {
            Ok(f) => inflight.push(f),
            Err(_) => {
                failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    while let Some(r) = inflight.next().await {
        tally(r, &sent, &failed);
    }
    Ok((sent.into_inner(), failed.into_inner()))
}
