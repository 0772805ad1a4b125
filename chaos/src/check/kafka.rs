//! Kafka as the checker reads it: the topics from the beginning with a
//! plain consumer, the group's committed offsets, and those offsets
//! sampled over time.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use super::{client, Msg, Res};
use crate::reach::Reach;

/// A topic read from the beginning, kept open so each check reads only
/// what was produced since the last one.
pub(crate) struct Tail {
    consumer: BaseConsumer,
    topic: String,
    partitions: i32,
    next: BTreeMap<i32, i64>,
    pub msgs: Vec<Msg>,
}

impl Tail {
    pub(crate) fn new(kafka: &Reach, topic: &str, partitions: i32) -> Res<Tail> {
        // read_committed, as a dead-letter consumer reads: fold rejects go
        // out in transactions, and one seen twice fails the check.
        let consumer: BaseConsumer = kafka
            .create(
                client(kafka)
                    .set("group.id", "graphsink-chaos-reader")
                    .set("isolation.level", "read_committed"),
            )
            .map_err(|e| format!("reader: {e}"))?;
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(topic, p, Offset::Beginning)
                .map_err(|e| e.to_string())?;
        }
        consumer.assign(&tpl).map_err(|e| e.to_string())?;
        Ok(Tail {
            consumer,
            topic: topic.to_string(),
            partitions,
            next: BTreeMap::new(),
            msgs: Vec::new(),
        })
    }

    /// Reads up to the end offsets as they are now, and at least to
    /// `at_least` (tansu 0.6 can report a high watermark below the true end,
    /// and a graph row from past it must still be judged).
    pub(crate) fn catch_up(&mut self, at_least: &BTreeMap<i32, i64>) -> Res<()> {
        let topic = self.topic.clone();
        let topic = &topic;
        let ends = self.ends_now(at_least)?;
        let deadline = Instant::now() + Duration::from_secs(120);
        // Past the ends, read on until a second passes with nothing new:
        // tansu 0.6 reports a high watermark of the last batch's base offset
        // + 1 until another batch comes, so the ends may fall short.
        // A producer that keeps going never leaves a quiet second: past the
        // ends, a second of reading is enough.
        let mut quiet_since: Option<Instant> = None;
        let mut reached_at: Option<Instant> = None;
        let mut last_error = None;
        loop {
            let reached = ends
                .iter()
                .all(|(p, end)| self.next.get(p).copied().unwrap_or(0) >= *end);
            if reached {
                let since = *reached_at.get_or_insert_with(Instant::now);
                let quiet = quiet_since.is_some_and(|t| t.elapsed() > Duration::from_millis(500));
                if quiet || since.elapsed() > Duration::from_secs(1) {
                    break;
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "reading {topic} back: stuck at {:?} of {ends:?} (last error: {last_error:?})",
                    self.next
                ));
            }
            let Some(m) = self.consumer.poll(Duration::from_millis(200)) else {
                quiet_since.get_or_insert_with(Instant::now);
                self.note_position();
                continue;
            };
            quiet_since = None;
            // Broker restarts leave errors (AllBrokersDown) in the queue:
            // librdkafka reconnects by itself; the deadline bounds the wait.
            let m = match m {
                Ok(m) => m,
                Err(e) => {
                    last_error = Some(e.to_string());
                    continue;
                }
            };
            self.next.insert(m.partition(), m.offset() + 1);
            self.msgs.push(Tail::msg(topic, &m));
        }
        Ok(())
    }

    /// Each partition's end offset as the broker reports it now, and at
    /// least `at_least`.
    fn ends_now(&self, at_least: &BTreeMap<i32, i64>) -> Res<BTreeMap<i32, i64>> {
        let topic = &self.topic;
        let mut ends = BTreeMap::new();
        for p in 0..self.partitions {
            // Retried: right after a broker restart the first asks fail.
            // Each retry asks for the topic's metadata first: a reader
            // assigned before its topic existed, or across a broker freeze,
            // can hold a cache that says "unknown partition" until its
            // next periodic refresh (5 minutes), which no retry would reach.
            let mut tries = 0;
            let (_, hi) = loop {
                match self
                    .consumer
                    .fetch_watermarks(topic, p, Duration::from_secs(10))
                {
                    Ok(w) => break w,
                    Err(e) if tries >= 5 => return Err(format!("watermarks of {topic}/{p}: {e}")),
                    Err(_) => {
                        tries += 1;
                        std::thread::sleep(Duration::from_secs(2));
                        let _ = self
                            .consumer
                            .fetch_metadata(Some(topic), Duration::from_secs(10));
                    }
                }
            };
            ends.insert(p, hi.max(at_least.get(&p).copied().unwrap_or(0)));
        }
        Ok(ends)
    }

    /// Moves the read past transaction markers and aborted records, which
    /// never come as messages: the position says how far the read is.
    fn note_position(&mut self) {
        if let Ok(pos) = self.consumer.position() {
            for e in pos.elements() {
                if let Offset::Offset(o) = e.offset() {
                    let n = self.next.entry(e.partition()).or_insert(0);
                    *n = (*n).max(o);
                }
            }
        }
    }

    /// A message as the checker keeps it.
    fn msg(topic: &str, m: &impl Message) -> Msg {
        let mut headers = BTreeMap::new();
        if let Some(h) = m.headers() {
            for hd in h.iter() {
                let v = hd.value.map(|v| String::from_utf8_lossy(v).into_owned());
                headers.insert(hd.key.to_string(), v.unwrap_or_default());
            }
        }
        Msg {
            topic: topic.to_string(),
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(<[u8]>::to_vec),
            value: m.payload().map(<[u8]>::to_vec),
            headers,
        }
    }

    /// The end offsets read so far, per partition.
    pub(crate) fn ends(&self) -> &BTreeMap<i32, i64> {
        &self.next
    }
}

/// The group's committed offsets (next offset to read) of a topic.
pub(crate) fn committed(
    kafka: &Reach,
    group: &str,
    topic: &str,
    partitions: i32,
) -> Res<BTreeMap<i32, i64>> {
    let consumer: BaseConsumer = kafka
        .create(client(kafka).set("group.id", group))
        .map_err(|e| format!("offsets client: {e}"))?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let got = consumer
        .committed_offsets(tpl, Duration::from_secs(30))
        .map_err(|e| format!("committed offsets of {group} on {topic}: {e}"))?;
    Ok(got
        .elements()
        .iter()
        .map(|e| match e.offset() {
            Offset::Offset(n) => (e.partition(), n),
            _ => (e.partition(), 0),
        })
        .collect())
}

/// The group's committed offsets and the topics' end offsets, each summed
/// over `topics`, sampled every 250 ms on a thread of its own until
/// dropped: what the group made durable over time, and how far behind it
/// fell, to see what a rebalance held up.
pub(crate) struct CommitSampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    samples: std::sync::Arc<std::sync::Mutex<Vec<(std::time::SystemTime, i64, i64)>>>,
    /// The same samples per partition: (committed, end) in `topics` order.
    parts: std::sync::Arc<std::sync::Mutex<Vec<PartSample>>>,
    /// Samples that failed (a coordinator or a leader not answering), and
    /// the last error.
    failures: std::sync::Arc<std::sync::Mutex<(u32, Option<String>)>>,
}

/// One sample per partition: its time, and (committed, end) of each.
type PartSample = (std::time::SystemTime, Vec<(i64, i64)>);

/// One sample: each partition's committed offset and end offset.
fn sample(consumer: &BaseConsumer, tpl: &TopicPartitionList) -> Res<Vec<(i64, i64)>> {
    let got = consumer
        .committed_offsets(tpl.clone(), Duration::from_secs(5))
        .map_err(|e| format!("committed offsets: {e}"))?;
    let mut out = Vec::new();
    for e in tpl.elements() {
        let committed = match got
            .find_partition(e.topic(), e.partition())
            .map(|c| c.offset())
        {
            Some(Offset::Offset(n)) => n,
            _ => 0,
        };
        let (_, high) = consumer
            .fetch_watermarks(e.topic(), e.partition(), Duration::from_secs(5))
            .map_err(|err| format!("watermarks of {}/{}: {err}", e.topic(), e.partition()))?;
        out.push((committed, high));
    }
    Ok(out)
}

impl CommitSampler {
    pub(crate) fn start(
        kafka: &Reach,
        group: &str,
        topics: Vec<(String, i32)>,
    ) -> Res<CommitSampler> {
        let consumer: BaseConsumer = kafka
            .create(client(kafka).set("group.id", group))
            .map_err(|e| format!("sampler client: {e}"))?;
        let mut tpl = TopicPartitionList::new();
        for (t, n) in &topics {
            for p in 0..*n {
                tpl.add_partition(t, p);
            }
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let samples = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let parts = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let failures = std::sync::Arc::new(std::sync::Mutex::new((0u32, None)));
        let (s, out, by_part, failed) = (
            stop.clone(),
            samples.clone(),
            parts.clone(),
            failures.clone(),
        );
        std::thread::spawn(move || {
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                match sample(&consumer, &tpl) {
                    Ok(each) => {
                        let now = std::time::SystemTime::now();
                        let committed = each.iter().map(|(c, _)| c).sum();
                        let ends = each.iter().map(|(_, e)| e).sum();
                        out.lock().unwrap().push((now, committed, ends));
                        by_part.lock().unwrap().push((now, each));
                    }
                    Err(e) => {
                        let mut f = failed.lock().unwrap();
                        f.0 += 1;
                        f.1 = Some(e);
                        // A client that never subscribed or assigned does
                        // not refresh the leaders of these topics when one
                        // dies; asking for their metadata does.
                        for (t, _) in &topics {
                            let _ = consumer.fetch_metadata(Some(t), Duration::from_secs(5));
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        });
        Ok(CommitSampler {
            stop,
            samples,
            parts,
            failures,
        })
    }

    /// Over `window` from `at`: records committed per second, the longest
    /// stretch in which the group committed nothing, and the most records
    /// produced but not yet committed.
    pub(crate) fn around(&self, at: std::time::SystemTime, window: Duration) -> (f64, f64, i64) {
        let samples = self.samples.lock().unwrap();
        let end = at + window;
        let inside: Vec<_> = samples
            .iter()
            .filter(|(t, _, _)| *t >= at && *t <= end)
            .collect();
        let (Some(first), Some(last)) = (inside.first(), inside.last()) else {
            return (f64::NAN, f64::NAN, -1);
        };
        let span = last
            .0
            .duration_since(first.0)
            .unwrap_or_default()
            .as_secs_f64();
        let rate = (last.1 - first.1) as f64 / span.max(0.001);
        let (mut pause, mut since) = (0.0f64, first.0);
        for w in inside.windows(2) {
            if w[1].1 > w[0].1 {
                since = w[1].0;
            }
            pause = pause.max(
                w[1].0
                    .duration_since(since)
                    .unwrap_or_default()
                    .as_secs_f64(),
            );
        }
        let lag = inside.iter().map(|s| s.2 - s.1).max().unwrap_or(-1);
        (rate, pause, lag)
    }
}

/// A fault's mark on ingest, from the samples (`CommitSampler::recovery`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Recovery {
    /// The longest stretch from the fault's start in which a partition with
    /// records waiting saw no commit, up to the recovery (or the last
    /// sample), in seconds.
    pub longest_pause: f64,
    /// Seconds from the fault's end until ingest was back to normal; `None`
    /// while it is not.
    pub recovered_after: Option<f64>,
    /// Recovered, and normal for a stall's length since: a kill -9 of a
    /// member leaves its partitions looking normal for a moment, until
    /// their stall outgrows the ones before the fault.
    pub settled: bool,
}

/// A stretch in which one partition had records waiting and its committed
/// offset did not move: from, to (the commit that ended it, or the last
/// sample looked at), and whether a commit ended it.
type Stall = (SystemTime, SystemTime, bool);

fn secs(a: SystemTime, b: SystemTime) -> f64 {
    a.duration_since(b).unwrap_or_default().as_secs_f64()
}

/// The stalls of the samples from `from` to `until` (or the last): per
/// partition, so a stall of some partitions shows while others go on; a
/// partition with nothing to read is idle, not stalled. A failed sample
/// leaves a gap that counts in.
fn stalls(parts: &[PartSample], from: SystemTime, until: Option<SystemTime>) -> Vec<Stall> {
    // The state at `from`: the last sample before it, or the first.
    let Some(before) = parts
        .iter()
        .rev()
        .find(|(t, _)| *t < from)
        .or_else(|| parts.first())
    else {
        return Vec::new();
    };
    let mut last: Vec<i64> = before.1.iter().map(|(c, _)| *c).collect();
    let mut since = vec![from; last.len()];
    let mut waiting = vec![false; last.len()];
    let mut out = Vec::new();
    let mut seen = from;
    for (t, each) in parts.iter().filter(|(t, _)| *t >= from) {
        if until.is_some_and(|u| *t > u) {
            break;
        }
        seen = *t;
        for (p, (c, end)) in each.iter().enumerate() {
            if *c > last[p] {
                out.push((since[p], *t, true));
                (last[p], since[p], waiting[p]) = (*c, *t, false);
            } else if end <= c {
                (since[p], waiting[p]) = (*t, false);
            } else {
                waiting[p] = true;
            }
        }
    }
    for (p, w) in waiting.iter().enumerate() {
        if *w {
            out.push((since[p], seen, false));
        }
    }
    out
}

impl CommitSampler {
    /// What a fault from `start` to `end` did to the group's commits,
    /// looking at the samples up to `until` (the next fault; `None`: all).
    /// Normal is the longest stall in the 20 s before `start` (at least
    /// 1 s). Ingest is recovered at the first sample from `end` on at
    /// which every partition has committed all it held at `end`, and from
    /// which no stall longer than normal (+1 s) is still to end: the
    /// backlog the fault left is ingested and every partition moves again.
    pub(crate) fn recovery(
        &self,
        start: SystemTime,
        end: SystemTime,
        until: Option<SystemTime>,
    ) -> Recovery {
        let parts = self.parts.lock().unwrap();
        let len = |s: &Stall| secs(s.1, s.0);
        let normal = stalls(&parts, start - Duration::from_secs(20), Some(start))
            .iter()
            .map(len)
            .fold(1.0f64, f64::max);
        let held = parts
            .iter()
            .rev()
            .find(|(t, _)| *t <= end)
            .or_else(|| parts.iter().find(|(t, _)| *t > end))
            .map(|(_, each)| each.iter().map(|(_, e)| *e).collect::<Vec<i64>>());
        let caught_up = held.and_then(|held| {
            parts
                .iter()
                .filter(|(t, _)| until.is_none_or(|u| *t <= u))
                .find(|(t, each)| *t >= end && each.iter().zip(&held).all(|((c, _), e)| c >= e))
                .map(|(t, _)| *t)
        });
        let last_seen = parts
            .iter()
            .rev()
            .find(|(t, _)| until.is_none_or(|u| *t <= u))
            .map(|(t, _)| *t);
        let all = stalls(&parts, start, until);
        drop(parts);
        let long: Vec<&Stall> = all.iter().filter(|s| len(s) > normal + 1.0).collect();
        let recovered_at = match caught_up {
            Some(_) if long.iter().any(|s| !s.2) => None,
            Some(t) => Some(long.iter().map(|s| s.1).fold(t, SystemTime::max)),
            None => None,
        };
        let stop = recovered_at.or(last_seen);
        let longest_pause = all
            .iter()
            .map(|s| match stop {
                Some(stop) if s.0 >= stop => 0.0,
                Some(stop) => secs(s.1.min(stop), s.0),
                None => len(s),
            })
            .fold(0.0, f64::max);
        let settled = match (recovered_at, last_seen) {
            (Some(r), Some(l)) => secs(l, r) >= normal + 1.0,
            _ => false,
        };
        Recovery {
            longest_pause,
            recovered_after: recovered_at.map(|t| secs(t, end)),
            settled,
        }
    }

    /// How many samples failed, and the last error.
    pub(crate) fn failures(&self) -> (u32, Option<String>) {
        self.failures.lock().unwrap().clone()
    }

    /// The committed offsets' sum at the last sample (0 before any).
    pub(crate) fn committed_now(&self) -> i64 {
        self.samples.lock().unwrap().last().map_or(0, |s| s.1)
    }
}

impl Drop for CommitSampler {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Two partitions, a sample every 250 ms for 60 s, 3 records a sample
    /// each, committed every other sample; partition 1 commits nothing
    /// from `stall.0` to `stall.1` (seconds), then all it holds.
    fn sampler(stall: (f64, f64)) -> (CommitSampler, SystemTime) {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut parts = Vec::new();
        let (mut ends, mut done) = ([0i64; 2], [0i64; 2]);
        for i in 0..240u32 {
            let at = f64::from(i) * 0.25;
            ends = ends.map(|e| e + 3);
            for (p, (d, e)) in done.iter_mut().zip(ends).enumerate() {
                let held = p == 1 && at >= stall.0 && at < stall.1;
                if i % 2 == 0 && !held {
                    *d = e;
                }
            }
            parts.push((
                t0 + Duration::from_secs_f64(at),
                vec![(done[0], ends[0]), (done[1], ends[1])],
            ));
        }
        let s = CommitSampler {
            stop: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            samples: Arc::new(Mutex::new(Vec::new())),
            parts: Arc::new(Mutex::new(parts)),
            failures: Arc::new(Mutex::new((0, None))),
        };
        (s, t0)
    }

    /// A kill -9 at 30 s of the member holding partition 1, just after
    /// it committed all it held, handed off at 38 s: right after the kill
    /// everything looks caught up (a lag threshold called it recovered at
    /// once); the stall that outgrows the normal ones says otherwise.
    #[test]
    fn a_stall_that_starts_at_an_instant_fault_is_its_pause_and_recovery() {
        let (s, t0) = sampler((30.25, 38.0));
        let at = t0 + Duration::from_secs(30);
        let soon = s.recovery(at, at, Some(t0 + Duration::from_secs_f64(30.5)));
        assert!(!soon.settled, "{soon:?}");
        let rec = s.recovery(at, at, None);
        assert!(rec.settled, "{rec:?}");
        let after = rec.recovered_after.expect("recovered");
        assert!((7.5..=8.5).contains(&after), "{rec:?}");
        assert!((7.5..=8.5).contains(&rec.longest_pause), "{rec:?}");
    }

    /// Without a stall, a fault is recovered from within a commit interval
    /// and pauses no longer than ingest normally does.
    #[test]
    fn normal_ingest_recovers_at_once() {
        let (s, t0) = sampler((100.0, 100.0));
        let (start, end) = (t0 + Duration::from_secs(30), t0 + Duration::from_secs(35));
        let rec = s.recovery(start, end, None);
        assert!(rec.recovered_after.expect("recovered") <= 0.5, "{rec:?}");
        assert!(rec.longest_pause <= 0.5, "{rec:?}");
    }

    /// A partition still stalled at the last sample is not recovered.
    #[test]
    fn a_stall_that_has_not_ended_is_not_recovered() {
        let (s, t0) = sampler((30.0, 100.0));
        let at = t0 + Duration::from_secs(30);
        let rec = s.recovery(at, at, None);
        assert_eq!(rec.recovered_after, None, "{rec:?}");
        assert!(rec.longest_pause >= 29.0, "{rec:?}");
    }
}
