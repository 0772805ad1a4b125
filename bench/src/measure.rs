//! Measuring graphsink itself, in-process through `run_with`: throughput,
//! durable-ack and graph-visible latency, fold cost, peak RSS. Owns the
//! samplers (committed offsets, first fetch, published commits) and the
//! arithmetic on them; the phases are driven from kafka/.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use graphsink::GraphCommit;
use graphsink::Metrics;

use crate::broker::BoxError;
use crate::workload::Topics;

/// Wall clock in fractional milliseconds since the epoch: the unit of Kafka
/// record timestamps, so latencies are plain differences.
pub(crate) fn now_ms() -> f64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    d.as_secs_f64() * 1e3
}

/// What every phase shares: the broker and the workload's topics.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Target {
    pub bootstrap: String,
    /// librdkafka's security properties for every client of the phase
    /// (`security.protocol`, `ssl.*`, `sasl.*`; none for plaintext). In
    /// graphsink's config a `sasl.password` is `${GRAPHSINK_BENCH_SASL_PASSWORD}`.
    #[serde(default)]
    pub security: Vec<(String, String)>,
    pub topics: Topics,
    /// Extra librdkafka properties for every measured consumer (graphsink
    /// and both baselines alike), e.g. `fetch.wait.max.ms`.
    pub consumer_props: Vec<(String, String)>,
    /// Extra librdkafka properties for graphsink's dead-letter producer
    /// (`[errors.producer]`), e.g. `linger.ms`.
    pub dead_letter_props: Vec<(String, String)>,
    /// Extra `[wal]` settings of graphsink (key, TOML value).
    pub wal_props: Vec<(String, String)>,
    /// Offset commit cadence of graphsink (`offsets.commit_interval`) and
    /// of the bare loop alike.
    pub commit_every: std::time::Duration,
    /// graphsink's `wal.flush_interval`.
    pub wal_flush: std::time::Duration,
    /// The mappings' `coerce` ("strict" checks numbers in the value screen).
    pub coerce: String,
    /// The values' format (`--format`) and, for the registry formats, the
    /// registry and the schema ids the producers frame with.
    pub values: crate::formats::Values,
}

/// (time ms, committed offset per slot), in time order.
pub(crate) type Samples = Vec<(f64, Vec<i64>)>;

/// Polls the group's committed offsets (OffsetFetch, like `kafka-consumer-
/// groups --describe`) every `every` on its own thread. Its resolution is
/// the poll interval plus one broker round trip; a commit is seen at the
/// first poll after the broker stored it.
pub(crate) struct CommitSampler {
    stop: Arc<AtomicBool>,
    latest: Arc<Mutex<Vec<i64>>>,
    thread: Option<std::thread::JoinHandle<Result<Samples, String>>>,
}

impl CommitSampler {
    pub(crate) fn start(
        t: &Target,
        group: &str,
        every: Duration,
    ) -> Result<CommitSampler, BoxError> {
        let mut cc = ClientConfig::new();
        cc.set("bootstrap.servers", &t.bootstrap)
            .set("group.id", group)
            .set("enable.auto.commit", "false");
        for (k, v) in &t.security {
            cc.set(k, v);
        }
        let c: BaseConsumer = cc.create()?;
        let mut tpl = TopicPartitionList::new();
        for topic in t.topics.names() {
            for p in 0..t.topics.partitions {
                tpl.add_partition(topic, p);
            }
        }
        let topics = t.topics.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let n = t.topics.slots();
        let latest = Arc::new(Mutex::new(vec![0i64; n]));
        let shared = latest.clone();
        // Never subscribes, so it never joins the group it watches.
        let thread = std::thread::spawn(move || {
            let mut samples = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                let got = c
                    .committed_offsets(tpl.clone(), Duration::from_secs(5))
                    .map_err(|e| e.to_string())?;
                let t = now_ms();
                let mut row = vec![0i64; n];
                for e in got.elements() {
                    if let (Offset::Offset(o), Some(slot)) =
                        (e.offset(), topics.slot(e.topic(), e.partition()))
                    {
                        row[slot] = o;
                    }
                }
                shared.lock().unwrap().clone_from(&row);
                samples.push((t, row));
                std::thread::sleep(every);
            }
            Ok(samples)
        });
        Ok(CommitSampler {
            stop,
            latest,
            thread: Some(thread),
        })
    }

    /// The most recent committed offsets seen, per partition.
    pub(crate) fn latest(&self) -> Vec<i64> {
        self.latest.lock().unwrap().clone()
    }

    pub(crate) fn finish(mut self) -> Result<Vec<(f64, Vec<i64>)>, BoxError> {
        self.stop.store(true, Ordering::Relaxed);
        let h = self.thread.take().expect("finished once");
        Ok(h.join().map_err(|_| "commit sampler panicked")??)
    }
}

impl Drop for CommitSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// First sample at which every slot's committed offset reached `ends`.
pub(crate) fn all_committed_at(samples: &[(f64, Vec<i64>)], ends: &[i64]) -> Option<f64> {
    samples
        .iter()
        .find(|(_, row)| row.iter().zip(ends).all(|(c, e)| c >= e))
        .map(|(t, _)| *t)
}

/// Per record: when its offset was first seen committed (`None`: never).
pub(crate) fn commit_latencies(
    samples: &[(f64, Vec<i64>)],
    records: &[(usize, i64, i64)],
) -> Vec<f64> {
    records
        .iter()
        .filter_map(|&(slot, off, ts)| {
            // Samples are in time order and committed offsets only grow, so
            // the first sample past `off` is found by binary search.
            let i = samples.partition_point(|(_, row)| row[slot] <= off);
            samples.get(i).map(|(t, _)| t - ts as f64)
        })
        .collect()
}

/// Watches the run's `consumed` total at 1 ms and returns (time, count) when it
/// first moves. The counter moves only once the first poll (up to
/// `max_poll_records`) is decoded and handed to the WAL, so the fetch of
/// those records happened earlier; callers therefore time only the records
/// after that count, from that moment (otherwise a full first poll
/// would be "free" and inflate small runs).
pub(crate) fn first_fetch(stats: Arc<Metrics>) -> tokio::task::JoinHandle<(f64, u64)> {
    tokio::spawn(async move {
        loop {
            let n = stats.totals().consumed;
            if n > 0 {
                return (now_ms(), n);
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
}

/// Watches the run's `durable` total at 1 ms until `stop` and returns when it last
/// grew: the moment the phase's last poll became durable. The distance from
/// it to "all offsets committed" is the commit cadence's share of the
/// phase (graphsink commits on `offsets.commit_interval`; the bare loop
/// commits synchronously the moment it has read the last record).
pub(crate) fn last_durable(
    stats: Arc<Metrics>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<f64> {
    tokio::spawn(async move {
        let (mut seen, mut at) = (0, now_ms());
        while !stop.is_cancelled() {
            let n = stats.totals().durable;
            if n > seen {
                (seen, at) = (n, now_ms());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        at
    })
}

/// Every published commit with the time this task saw it. A `watch` keeps
/// only the latest value, so a commit replaced before we woke is missed; the
/// seq numbers tell, and `missed` counts them (their records are then
/// attributed to the next commit seen: an overestimate, never an under-).
#[derive(Default, Clone)]
pub(crate) struct Published {
    pub seen: Vec<(f64, GraphCommit)>,
    pub missed: u64,
}

pub(crate) fn watch_published(
    mut rx: watch::Receiver<Option<GraphCommit>>,
) -> (Arc<Mutex<Published>>, tokio::task::JoinHandle<()>) {
    let out = Arc::new(Mutex::new(Published::default()));
    let sink = out.clone();
    let h = tokio::spawn(async move {
        while rx.changed().await.is_ok() {
            let t = now_ms();
            let Some(c) = rx.borrow_and_update().clone() else {
                continue;
            };
            let mut p = sink.lock().unwrap();
            if let Some((_, last)) = p.seen.last() {
                p.missed += c.seq.saturating_sub(last.seq + 1);
            }
            p.seen.push((t, c));
        }
    });
    (out, h)
}

/// When the graph first held every record below `ends` (slot → end
/// offset): the latest of each partition's last record's first covering
/// commit.
pub(crate) fn all_visible_at(published: &Published, topics: &Topics, ends: &[i64]) -> Option<f64> {
    let mut at = 0f64;
    for (slot, &end) in ends.iter().enumerate().filter(|(_, &e)| e > 0) {
        let (topic, p) = topics.at(slot);
        at = at.max(first_covering(published, topic, p, end - 1)?);
    }
    Some(at)
}

/// When the first seen commit holding offset `off` of `topic`/`p` was seen.
/// A missed commit's ranges are not in `seen`; a later one covering higher
/// offsets of the partition also proves visibility (commits are
/// cumulative: the head includes every earlier commit).
fn first_covering(published: &Published, topic: &str, p: i32, off: i64) -> Option<f64> {
    published.seen.iter().find_map(|(t, c)| {
        c.offsets
            .iter()
            .any(|r| r.topic == topic && r.partition == p && r.last >= off)
            .then_some(*t)
    })
}

/// Per record: the first seen commit at or after which it is in the graph.
pub(crate) fn visible_latencies(
    published: &Published,
    topics: &Topics,
    records: &[(usize, i64, i64)],
) -> (Vec<f64>, usize) {
    let mut out = Vec::with_capacity(records.len());
    let mut unseen = 0;
    for &(slot, off, ts) in records {
        let (topic, p) = topics.at(slot);
        match first_covering(published, topic, p, off) {
            Some(t) => out.push(t - ts as f64),
            None => unseen += 1,
        }
    }
    (out, unseen)
}

/// (p50, p99, max) of a sample, in the sample's unit.
pub(crate) fn percentiles(mut v: Vec<f64>) -> Option<(f64, f64, f64)> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize];
    Some((at(0.50), at(0.99), v[v.len() - 1]))
}

/// Resets the kernel's peak-RSS mark (Linux ≥ 4.0: writing 5 to clear_refs),
/// so each phase's VmHWM is its own peak rather than the bench's lifetime
/// peak. Memory the allocator kept from earlier phases still counts.
pub(crate) fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// VmHWM in MiB.
pub(crate) fn peak_rss_mib() -> Option<f64> {
    status_mib("VmHWM:")
}

/// VmRSS in MiB.
pub(crate) fn rss_mib() -> Option<f64> {
    status_mib("VmRSS:")
}

fn status_mib(field: &str) -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// The connector config for one phase, as the TOML a user would write.
pub(crate) fn graphsink_config(
    t: &Target,
    dir: &Path,
    root: &crate::s3::Root,
    group: &str,
    buckets: u32,
    fold: &str,
) -> Result<graphsink::Config, BoxError> {
    std::fs::write(dir.join("bench.pg"), crate::workload::SCHEMA)?;
    let text = config_text(t, root, group, buckets, fold);
    // Kept beside the graph, so the fold can run in a child process from it.
    std::fs::write(dir.join(format!("{group}.toml")), &text)?;
    Ok(graphsink::Config::from_toml(&text, dir)?)
}

/// The config's TOML text.
fn config_text(
    t: &Target,
    root: &crate::s3::Root,
    group: &str,
    buckets: u32,
    fold: &str,
) -> String {
    // Only the registry formats name theirs: a JSON run's config is the
    // one the bench always wrote.
    let format = match t.values.format {
        crate::formats::Format::Json => t.values.envelope.config_lines().to_string(),
        f => format!("format = \"{}\"\n", f.config_name()),
    };
    format!(
        r#"
[graph]
root = "{root}"
schema = "bench.pg"
actor = "graphsink-bench"

{storage}

[kafka]
"bootstrap.servers" = "{bs}"
"group.id" = "{group}"
{security}{extra}

[wal]
buckets = {buckets}
flush_interval = "{flush_ms}ms"
{wal_extra}

[offsets]
commit_interval = "{commit_ms}ms"

[fold]
{fold}

[errors.producer]
{dead_letter}
{registry}
[[mapping]]
topic = "{topic}"
node = "{node}"
key = "value"
coerce = "{coerce}"
{format}{edges}
"#,
        root = root.uri,
        storage = root.storage_toml,
        bs = t.bootstrap,
        commit_ms = t.commit_every.as_millis(),
        flush_ms = t.wal_flush.as_millis(),
        topic = t.topics.nodes,
        node = crate::workload::NODE,
        edges = edge_mapping(t, &format),
        format = format,
        registry = t
            .values
            .registry_url
            .as_ref()
            .map_or(String::new(), |u| format!(
                "[schema_registry]\nurl = \"{u}\"\n"
            )),
        coerce = t.coerce,
        wal_extra = t
            .wal_props
            .iter()
            .map(|(k, v)| format!("{k} = {v}\n"))
            .collect::<String>(),
        dead_letter = quoted(&t.dead_letter_props),
        extra = quoted(&t.consumer_props),
        security = quoted(&in_config(&t.security)),
    )
}

/// The security properties as graphsink's config holds them: the SCRAM
/// password named, not written (graphsink reads it from the environment).
fn in_config(security: &[(String, String)]) -> Vec<(String, String)> {
    security
        .iter()
        .map(|(k, v)| {
            let v = if k == "sasl.password" {
                format!("${{{}}}", crate::cluster::PASSWORD_VAR)
            } else {
                v.clone()
            };
            (k.clone(), v)
        })
        .collect()
}

/// The edge topic's `[[mapping]]`, if there is one. Edge ids are the Kafka
/// key; endpoints that are not folded yet wait (the default `defer`), as
/// in production.
fn edge_mapping(t: &Target, format: &str) -> String {
    t.topics.edges.as_ref().map_or(String::new(), |e| {
        format!(
        "[[mapping]]\ntopic = \"{e}\"\nedge = \"{}\"\nkey = \"kafka\"\ncoerce = \"{}\"\n{format}",
        crate::workload::EDGE,
        t.coerce,
    )
    })
}

/// librdkafka properties as TOML lines, keys and values quoted.
fn quoted(props: &[(String, String)]) -> String {
    props
        .iter()
        .map(|(k, v)| format!("{k:?} = {v:?}\n"))
        .collect::<String>()
}

/// One phase of graphsink's folds in a run: how many folds, and the mean
/// wall time per fold (`graphsink_fold_phase_seconds`).
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct FoldPhase {
    pub phase: String,
    pub folds: u64,
    pub mean_s: f64,
}

/// The fold phases of a run, in the fold's order, from graphsink's own
/// metrics (what a Prometheus scrape sees).
pub(crate) fn fold_phases(metrics: &Metrics) -> Vec<FoldPhase> {
    let text = metrics.encode();
    let value = |kind: &str, phase: &str| -> f64 {
        let start = format!("graphsink_fold_phase_seconds_{kind}{{phase=\"{phase}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(start.as_str()))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    graphsink::testing::StageTimes::default()
        .phases()
        .iter()
        .map(|(phase, _)| {
            let folds = value("count", phase) as u64;
            FoldPhase {
                phase: phase.to_string(),
                folds,
                mean_s: value("sum", phase) / folds.max(1) as f64,
            }
        })
        .collect()
}
