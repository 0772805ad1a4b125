//! The independent checker. It knows graphsink only through what a user
//! sees: the topics (read back with a plain consumer, so it judges what
//! Kafka holds, duplicates from producer retries included), the group's
//! committed offsets, the dead-letter topic, and the graph read with plain
//! Lance at the versions the head graph commit in `__manifest` pins.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use futures::TryStreamExt;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::Value;

use crate::workload::{Topics, EXPECT};

pub(crate) type Res<T> = Result<T, String>;

/// One message as Kafka holds it.
#[derive(Debug, Clone)]
pub(crate) struct Msg {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: BTreeMap<String, String>,
}

impl Msg {
    fn expect(&self) -> &str {
        self.headers.get(EXPECT).map_or("", String::as_str)
    }
    fn key_str(&self) -> Option<String> {
        self.key
            .as_ref()
            .map(|k| String::from_utf8_lossy(k).into_owned())
    }
    fn json(&self) -> Option<Value> {
        self.value
            .as_ref()
            .and_then(|v| serde_json::from_slice(v).ok())
    }
    fn coords(&self) -> (String, i32, i64) {
        (self.topic.clone(), self.partition, self.offset)
    }
}

fn client(bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("enable.auto.commit", "false")
        .set("log_level", "3");
    c
}

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
    pub(crate) fn new(bootstrap: &str, topic: &str, partitions: i32) -> Res<Tail> {
        // read_committed, as a dead-letter consumer reads: fold rejects go
        // out in transactions, and one seen twice fails the check.
        let consumer: BaseConsumer = client(bootstrap)
            .set("group.id", "graphsink-chaos-reader")
            .set("isolation.level", "read_committed")
            .create()
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
        let topic = &self.topic;
        let mut ends = BTreeMap::new();
        for p in 0..self.partitions {
            // Retried: right after a broker restart the first asks fail.
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
                    }
                }
            };
            ends.insert(p, hi.max(at_least.get(&p).copied().unwrap_or(0)));
        }
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
                // Past transaction markers and aborted records, which never
                // come as messages: the position says how far the read is.
                if let Ok(pos) = self.consumer.position() {
                    for e in pos.elements() {
                        if let Offset::Offset(o) = e.offset() {
                            let n = self.next.entry(e.partition()).or_insert(0);
                            *n = (*n).max(o);
                        }
                    }
                }
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
            let mut headers = BTreeMap::new();
            if let Some(h) = m.headers() {
                for hd in h.iter() {
                    let v = hd.value.map(|v| String::from_utf8_lossy(v).into_owned());
                    headers.insert(hd.key.to_string(), v.unwrap_or_default());
                }
            }
            self.next.insert(m.partition(), m.offset() + 1);
            self.msgs.push(Msg {
                topic: topic.clone(),
                partition: m.partition(),
                offset: m.offset(),
                key: m.key().map(<[u8]>::to_vec),
                value: m.payload().map(<[u8]>::to_vec),
                headers,
            });
        }
        Ok(())
    }

    /// The end offsets read so far, per partition.
    pub(crate) fn ends(&self) -> &BTreeMap<i32, i64> {
        &self.next
    }
}

/// The group's committed offsets (next offset to read) of a topic.
pub(crate) fn committed(
    bootstrap: &str,
    group: &str,
    topic: &str,
    partitions: i32,
) -> Res<BTreeMap<i32, i64>> {
    let consumer: BaseConsumer = client(bootstrap)
        .set("group.id", group)
        .create()
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
}

impl CommitSampler {
    pub(crate) fn start(
        bootstrap: &str,
        group: &str,
        topics: Vec<(String, i32)>,
    ) -> Res<CommitSampler> {
        let consumer: BaseConsumer = client(bootstrap)
            .set("group.id", group)
            .create()
            .map_err(|e| format!("sampler client: {e}"))?;
        let mut tpl = TopicPartitionList::new();
        for (t, n) in &topics {
            for p in 0..*n {
                tpl.add_partition(t, p);
            }
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let samples = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (s, out) = (stop.clone(), samples.clone());
        std::thread::spawn(move || {
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(got) = consumer.committed_offsets(tpl.clone(), Duration::from_secs(5)) {
                    let sum = got
                        .elements()
                        .iter()
                        .map(|e| match e.offset() {
                            Offset::Offset(n) => n,
                            _ => 0,
                        })
                        .sum();
                    let ends: Option<i64> = tpl
                        .elements()
                        .iter()
                        .map(|e| {
                            consumer
                                .fetch_watermarks(e.topic(), e.partition(), Duration::from_secs(5))
                                .ok()
                                .map(|(_, high)| high)
                        })
                        .sum();
                    if let Some(ends) = ends {
                        out.lock()
                            .unwrap()
                            .push((std::time::SystemTime::now(), sum, ends));
                    }
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        });
        Ok(CommitSampler { stop, samples })
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

impl Drop for CommitSampler {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The graph at its head commit, read with plain Lance.
pub(crate) struct Snapshot {
    pub seq: u64,
    pub items: BTreeMap<String, Value>,
    pub links: BTreeMap<String, Value>,
    pub pending_links: BTreeMap<String, Value>,
    pub dangles: BTreeMap<String, Value>,
    pub rejects: Vec<Value>,
}

async fn open(root: &str, table: &str, version: Option<u64>) -> Res<lance::Dataset> {
    let uri = format!("{root}/{table}");
    let ds = lance::Dataset::open(&uri)
        .await
        .map_err(|e| format!("open {uri}: {e}"))?;
    match version {
        Some(v) => ds
            .checkout_version(v)
            .await
            .map_err(|e| format!("open {uri} at version {v}: {e}")),
        None => Ok(ds),
    }
}

async fn rows(ds: &lance::Dataset, filter: Option<&str>) -> Res<Vec<Value>> {
    let mut scan = ds.scan();
    if let Some(f) = filter {
        scan.filter(f).map_err(|e| e.to_string())?;
    }
    let batches: Vec<RecordBatch> = scan
        .try_into_stream()
        .await
        .map_err(|e| e.to_string())?
        .try_collect()
        .await
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for b in batches {
        let mut buf = Vec::new();
        let mut w = arrow_json::ArrayWriter::new(&mut buf);
        w.write(&b).map_err(|e| e.to_string())?;
        w.finish().map_err(|e| e.to_string())?;
        if b.num_rows() > 0 {
            let v: Vec<Value> = serde_json::from_slice(&buf).map_err(|e| e.to_string())?;
            out.extend(v);
        }
    }
    Ok(out)
}

fn payload(row: &Value) -> Res<Value> {
    let p = row["payload"]
        .as_str()
        .ok_or_else(|| format!("manifest row without payload: {row}"))?;
    serde_json::from_str(p).map_err(|e| format!("manifest payload: {e}"))
}

/// The schema version of the head graph commit (0 before any schema
/// commit).
pub(crate) async fn schema_version(root: &str) -> Res<u64> {
    let manifest = open(root, "__manifest", None).await?;
    let head = rows(&manifest, Some("object_id = 'graph_head:main'")).await?;
    let head = payload(head.first().ok_or("no graph_head:main in __manifest")?)?;
    Ok(head["schema_version"].as_u64().unwrap_or(0))
}

/// Reads the head graph commit and every table at the version it pins.
/// Also checks the commit log: every commit's pinned versions open, and
/// the commits form one chain of consecutive sequence numbers.
pub(crate) async fn snapshot(root: &str) -> Res<Snapshot> {
    let manifest = open(root, "__manifest", None).await?;
    let head = rows(&manifest, Some("object_id = 'graph_head:main'")).await?;
    let head = payload(head.first().ok_or("no graph_head:main in __manifest")?)?;
    let commits = rows(&manifest, Some("object_id LIKE 'graph_commit:%'")).await?;
    let mut by_id = HashMap::new();
    for c in &commits {
        let c = payload(c)?;
        by_id.insert(c["id"].as_str().unwrap_or_default().to_string(), c);
    }
    // Walk the chain from the head: seq falls by one at each parent, and
    // every commit of the log is on it (a second commit with the same
    // parent would be a fork: two graph commits for one fold).
    let mut at = head.clone();
    let mut on_chain = 1;
    loop {
        let seq = at["seq"].as_u64().ok_or("commit without seq")?;
        match at["parent"].as_str() {
            None => break,
            Some(p) => {
                let parent = by_id
                    .get(p)
                    .ok_or_else(|| format!("commit {seq}: parent {p} is not in the log"))?;
                if parent["seq"].as_u64() != seq.checked_sub(1) {
                    return Err(format!("commit {seq}: parent has seq {}", parent["seq"]));
                }
                at = parent.clone();
                on_chain += 1;
            }
        }
    }
    if on_chain != by_id.len() {
        return Err(format!(
            "the commit log holds {} commits, the head's chain {on_chain}: a fork",
            by_id.len()
        ));
    }
    let tables: BTreeMap<String, u64> =
        serde_json::from_value(head["tables"].clone()).map_err(|e| format!("head tables: {e}"))?;
    let mut read = BTreeMap::new();
    for (table, version) in &tables {
        let ds = open(root, table, Some(*version)).await?;
        read.insert(table.clone(), rows(&ds, None).await?);
    }
    let mut by_id = |table: &str| -> Res<BTreeMap<String, Value>> {
        let mut m = BTreeMap::new();
        for r in read.remove(table).unwrap_or_default() {
            let id = r["id"].as_str().ok_or("row without id")?.to_string();
            if let Some(old) = m.insert(id.clone(), r) {
                return Err(format!("{table}: id {id} twice (also {old})"));
            }
        }
        Ok(m)
    };
    Ok(Snapshot {
        seq: head["seq"].as_u64().unwrap_or(0),
        items: by_id("nodes/Item")?,
        links: by_id("edges/Link")?,
        pending_links: by_id("_pending/Link")?,
        dangles: by_id("edges/Dangle")?,
        rejects: read.remove("_ingest_rejects").unwrap_or_default(),
    })
}

impl Snapshot {
    /// Per topic and partition, one past the newest source offset any row
    /// of the graph names.
    pub(crate) fn offsets_seen(&self) -> BTreeMap<String, BTreeMap<i32, i64>> {
        let mut out: BTreeMap<String, BTreeMap<i32, i64>> = BTreeMap::new();
        let tables = [&self.items, &self.links, &self.pending_links, &self.dangles];
        let rows = tables.into_iter().flat_map(|t| t.values());
        let mut note = |topic: Option<&str>, p: Option<i64>, o: Option<i64>| {
            if let (Some(t), Some(p), Some(o)) = (topic, p, o) {
                let e = out
                    .entry(t.to_string())
                    .or_default()
                    .entry(p as i32)
                    .or_insert(0);
                *e = (*e).max(o + 1);
            }
        };
        for r in rows {
            note(
                r["_src_topic"].as_str(),
                r["_src_partition"].as_i64(),
                r["_src_offset"].as_i64(),
            );
        }
        for r in &self.rejects {
            note(
                r["topic"].as_str(),
                r["partition"].as_i64(),
                r["offset"].as_i64(),
            );
        }
        out
    }
}

/// What the stream says must hold.
pub(crate) struct Expected {
    /// Node id → its accepted records (values and tombstones), Kafka order.
    pub items: BTreeMap<String, Vec<Msg>>,
    pub links: BTreeMap<String, Vec<Msg>>,
    /// Every record that must be rejected: coordinates → expected code.
    pub rejects: BTreeMap<Coords, String>,
    /// Copies of one fold-rejected record (a producer retry wrote it twice:
    /// same topic and key). A fold that sees both keeps one row per edge
    /// id, so one reject among the copies is enough.
    pub copies: BTreeMap<Coords, Vec<Coords>>,
}

type Coords = (String, i32, i64);

/// Groups the stream: per key the accepted records in Kafka order, and
/// the records that must be rejected.
pub(crate) fn expected(msgs: &[Msg], topics: &Topics) -> Expected {
    let mut e = Expected {
        items: BTreeMap::new(),
        links: BTreeMap::new(),
        rejects: BTreeMap::new(),
        copies: BTreeMap::new(),
    };
    let mut sorted: Vec<&Msg> = msgs.iter().collect();
    sorted.sort_by_key(|m| (m.topic.clone(), m.partition, m.offset));
    let mut by_key: BTreeMap<(String, Option<String>), Vec<Coords>> = BTreeMap::new();
    for m in sorted {
        let exp = m.expect();
        if let Some(code) = exp.strip_prefix("reject:") {
            e.rejects.insert(m.coords(), code.to_string());
            continue;
        }
        if let Some(code) = exp.strip_prefix("fold:") {
            e.rejects.insert(m.coords(), code.to_string());
            by_key
                .entry((m.topic.clone(), m.key_str()))
                .or_default()
                .push(m.coords());
            continue;
        }
        let Some(k) = m.key_str() else { continue };
        if m.topic == topics.items {
            e.items.entry(k).or_default().push(m.clone());
        } else if m.topic == topics.links {
            e.links.entry(k).or_default().push(m.clone());
        }
    }
    for group in by_key.into_values().filter(|g| g.len() > 1) {
        for c in &group {
            e.copies.insert(c.clone(), group.clone());
        }
    }
    e
}

/// Tallies of one check, for the report.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub(crate) struct Tally {
    /// Sequence number of the head graph commit.
    pub head_seq: u64,
    pub nodes: usize,
    pub edges: usize,
    pub rejects: usize,
    pub dead_letters: usize,
    /// Record rejects produced again after a crash (at least once, as
    /// Kafka Connect's): their offsets were not committed yet.
    pub dead_letter_duplicates: usize,
}

/// Does `row` hold what `m` says (its fields and its source offset)?
fn row_is(row: &Value, m: &Msg, fields: &[&str]) -> bool {
    let Some(v) = m.json() else { return false };
    row["_src_offset"].as_i64() == Some(m.offset)
        && row["_src_partition"].as_i64() == Some(m.partition as i64)
        && fields.iter().all(|f| row[*f] == v[*f])
}

/// The final check, once everything is consumed and folded: every key
/// holds exactly its last accepted record, no edge lacks an endpoint,
/// nothing stays deferred, every bad record is one reject in the table and
/// at least once on the dead-letter topic, and nothing else is.
pub(crate) fn check_final(
    snap: &Snapshot,
    exp: &Expected,
    dead_letters: &[Msg],
    errors: &mut Vec<String>,
) -> Tally {
    let mut t = Tally::default();
    same_state(
        "nodes/Item",
        &snap.items,
        &BTreeMap::new(),
        &exp.items,
        &["name", "qty"],
        None,
        errors,
    );
    same_state(
        "edges/Link",
        &snap.links,
        &BTreeMap::new(),
        &exp.links,
        &["src", "dst", "w"],
        None,
        errors,
    );
    if !snap.pending_links.is_empty() {
        errors.push(format!(
            "{} Link edges still deferred although every endpoint was produced: {:?}",
            snap.pending_links.len(),
            snap.pending_links.keys().take(5).collect::<Vec<_>>()
        ));
    }
    if !snap.dangles.is_empty() {
        errors.push(format!(
            "{} Dangle edges stored; all should be rejected",
            snap.dangles.len()
        ));
    }
    endpoints(snap, errors);
    let all: BTreeSet<_> = exp.rejects.keys().cloned().collect();
    rejects(snap, exp, &all, Some(dead_letters), errors, &mut t);
    t.nodes = snap.items.len();
    t.edges = snap.links.len();
    t.head_seq = snap.seq;
    t
}

/// After a crash, once everything durable is folded (`graphsink fold`):
/// every record below the committed offsets is in the graph (it, or a
/// later record of its key), and every bad record below them is a reject
/// in the table and on the dead-letter topic.
pub(crate) fn check_committed(
    snap: &Snapshot,
    exp: &Expected,
    committed: &BTreeMap<String, BTreeMap<i32, i64>>,
    dead_letters: &[Msg],
    errors: &mut Vec<String>,
) -> Tally {
    let mut t = Tally::default();
    let below = |m: &Msg| {
        committed
            .get(&m.topic)
            .and_then(|c| c.get(&m.partition))
            .is_some_and(|&c| m.offset < c)
    };
    same_state(
        "nodes/Item",
        &snap.items,
        &BTreeMap::new(),
        &exp.items,
        &["name", "qty"],
        Some(&below),
        errors,
    );
    same_state(
        "edges/Link",
        &snap.links,
        &snap.pending_links,
        &exp.links,
        &["src", "dst", "w"],
        Some(&below),
        errors,
    );
    endpoints(snap, errors);
    let acked: BTreeSet<_> = exp
        .rejects
        .keys()
        .filter(|(topic, p, o)| {
            committed
                .get(topic)
                .and_then(|c| c.get(p))
                .is_some_and(|&c| *o < c)
        })
        .cloned()
        .collect();
    // Fold rejects reach the dead-letter topic when the connector next
    // starts (the offline fold has no producer): only the table is checked.
    let sync: BTreeSet<_> = acked
        .iter()
        .filter(|c| {
            exp.rejects
                .get(*c)
                .is_some_and(|code| code != "endpoint_not_found")
        })
        .cloned()
        .collect();
    rejects(snap, exp, &acked, None, errors, &mut t);
    let below_commit = |c: &Coords| {
        committed
            .get(&c.0)
            .and_then(|p| p.get(&c.1))
            .is_some_and(|&n| c.2 < n)
    };
    dead_letters_cover(
        snap,
        &sync,
        dead_letters,
        Some(&below_commit),
        errors,
        &mut t,
    );
    t.nodes = snap.items.len();
    t.edges = snap.links.len();
    t
}

/// Compares a table with the stream. Without `below`, each key must hold
/// exactly its last accepted record. With it (after a crash), each key
/// must hold a record at or after its last accepted record below the
/// committed offsets: it may hold a newer one that became durable too.
fn same_state(
    table: &str,
    rows: &BTreeMap<String, Value>,
    deferred: &BTreeMap<String, Value>,
    exp: &BTreeMap<String, Vec<Msg>>,
    fields: &[&str],
    below: Option<&dyn Fn(&Msg) -> bool>,
    errors: &mut Vec<String>,
) {
    for (id, recs) in exp {
        // A newer version of an edge may wait in `deferred` while the older
        // one stays in the table: either may hold the record looked for.
        let held: Vec<&Value> = rows.get(id).into_iter().chain(deferred.get(id)).collect();
        let row = held.first().copied();
        let floor = match below {
            None => recs.len() - 1,
            Some(b) => match recs.iter().rposition(b) {
                Some(i) => i,
                None => {
                    // Nothing of this key is acked: any of its records or none.
                    for row in &held {
                        if !recs.iter().any(|m| row_is(row, m, fields)) {
                            errors.push(format!(
                                "{table} {id}: holds {row}, which no record of the key says"
                            ));
                        }
                    }
                    continue;
                }
            },
        };
        let allowed = &recs[floor..];
        let ok = if held.is_empty() {
            allowed.iter().any(|m| m.value.is_none())
        } else {
            held.iter().any(|row| {
                allowed
                    .iter()
                    .any(|m| m.value.is_some() && row_is(row, m, fields))
            })
        };
        if !ok {
            let last = &recs[floor];
            let want = match &last.value {
                Some(v) => String::from_utf8_lossy(v).into_owned(),
                None => "absent (tombstone)".into(),
            };
            errors.push(format!(
                "{table} {id}: {} but the record at {}/{}@{} says {want}{}",
                row.map_or("absent".to_string(), |r| format!("holds {r}")),
                last.topic,
                last.partition,
                last.offset,
                if allowed.len() > 1 {
                    " (or a later one)"
                } else {
                    ""
                }
            ));
        }
    }
    for id in rows.keys().chain(deferred.keys()) {
        if !exp.contains_key(id) {
            errors.push(format!("{table} {id}: a row no accepted record made"));
        }
    }
}

fn endpoints(snap: &Snapshot, errors: &mut Vec<String>) {
    for (id, e) in &snap.links {
        for end in ["src", "dst"] {
            let n = e[end].as_str().unwrap_or_default();
            if !snap.items.contains_key(n) {
                errors.push(format!(
                    "edges/Link {id}: {end} {n} is not a node of the same commit"
                ));
            }
        }
    }
}

/// Every record in `want` is exactly one row of `_ingest_rejects` with the
/// expected code; no row rejects a record that must be accepted.
fn rejects(
    snap: &Snapshot,
    exp: &Expected,
    want: &BTreeSet<(String, i32, i64)>,
    dead_letters: Option<&[Msg]>,
    errors: &mut Vec<String>,
    t: &mut Tally,
) {
    let mut seen: BTreeMap<(String, i32, i64), Vec<&Value>> = BTreeMap::new();
    for r in &snap.rejects {
        let (Some(topic), Some(p), Some(o)) = (
            r["topic"].as_str(),
            r["partition"].as_i64(),
            r["offset"].as_i64(),
        ) else {
            errors.push(format!(
                "_ingest_rejects: a row without its source record: {r}"
            ));
            continue;
        };
        seen.entry((topic.to_string(), p as i32, o))
            .or_default()
            .push(r);
    }
    for (c, rows) in &seen {
        match exp.rejects.get(c) {
            None => errors.push(format!(
                "_ingest_rejects: {}/{}@{} was rejected ({}) but is a good record",
                c.0, c.1, c.2, rows[0]["code"]
            )),
            Some(code) => {
                if rows.len() > 1 {
                    errors.push(format!(
                        "_ingest_rejects: {}/{}@{} rejected {} times",
                        c.0,
                        c.1,
                        c.2,
                        rows.len()
                    ));
                }
                if rows[0]["code"].as_str() != Some(code) {
                    errors.push(format!(
                        "_ingest_rejects: {}/{}@{} has code {} where {code} was expected",
                        c.0, c.1, c.2, rows[0]["code"]
                    ));
                }
            }
        }
    }
    for c in want {
        let copies = exp.copies.get(c).map_or(&[][..], Vec::as_slice);
        if !seen.contains_key(c) && !copies.iter().any(|d| seen.contains_key(d)) {
            errors.push(format!(
                "_ingest_rejects: {}/{}@{} ({}) is missing",
                c.0, c.1, c.2, exp.rejects[c]
            ));
        }
    }
    t.rejects = snap.rejects.len();
    if let Some(dl) = dead_letters {
        dead_letters_cover(snap, want, dl, None, errors, t);
    }
}

/// Every reject of `want` is on the dead-letter topic at least once under
/// its `reject_id`, with its source coordinates and code; every dead
/// letter is a row of the table. After a crash (`acked` given), only dead
/// letters below the committed offsets must have their row: a poll's
/// rejects reach the dead-letter topic before its rejects-WAL write is
/// durable, and such a poll's offset is not committed.
fn dead_letters_cover(
    snap: &Snapshot,
    want: &BTreeSet<Coords>,
    dead_letters: &[Msg],
    acked: Option<&dyn Fn(&Coords) -> bool>,
    errors: &mut Vec<String>,
    t: &mut Tally,
) {
    let mut on_topic: BTreeMap<String, Vec<&Msg>> = BTreeMap::new();
    for m in dead_letters {
        match m.headers.get("graphsink.reject_id") {
            Some(id) => on_topic.entry(id.clone()).or_default().push(m),
            None => errors.push(format!(
                "dead letter at offset {} has no graphsink.reject_id",
                m.offset
            )),
        }
    }
    let mut rows = BTreeMap::new();
    for r in &snap.rejects {
        let id = r["reject_id"].as_str().unwrap_or_default().to_string();
        let c = (
            r["topic"].as_str().unwrap_or_default().to_string(),
            r["partition"].as_i64().unwrap_or(-1) as i32,
            r["offset"].as_i64().unwrap_or(-1),
        );
        if want.contains(&c) && !on_topic.contains_key(&id) {
            errors.push(format!(
                "dead-letter topic: reject {id} ({}/{}@{}, {}) never delivered",
                c.0, c.1, c.2, r["code"]
            ));
        }
        rows.insert(id, (c, r["code"].as_str().unwrap_or_default().to_string()));
    }
    for (id, letters) in &on_topic {
        for m in letters {
            let h = |k: &str| m.headers.get(k).cloned().unwrap_or_default();
            let src: Coords = (
                h("__connect.errors.topic"),
                h("__connect.errors.partition").parse().unwrap_or(-1),
                h("__connect.errors.offset").parse().unwrap_or(-1),
            );
            match rows.get(id) {
                Some((c, code))
                    if *c != src || h("__connect.errors.exception.class.name") != *code =>
                {
                    errors.push(format!(
                        "dead letter {id} says {}/{}@{} {} but its row says {}/{}@{} {code}",
                        src.0,
                        src.1,
                        src.2,
                        h("__connect.errors.exception.class.name"),
                        c.0,
                        c.1,
                        c.2
                    ));
                }
                Some(_) => {}
                None if acked.is_none_or(|a| a(&src)) => {
                    errors.push(format!(
                        "dead-letter topic: reject {id} ({}/{}@{}) is not in _ingest_rejects",
                        src.0, src.1, src.2
                    ));
                }
                None => {}
            }
        }
    }
    // Fold rejects go out once: a re-delivery skips what the topic holds
    // (GraphCommit::dead_letter_since).
    for (id, letters) in &on_topic {
        let fold = letters
            .iter()
            .any(|m| m.headers.get("graphsink.stage").map(String::as_str) == Some("fold"));
        if fold && letters.len() > 1 {
            let offsets: Vec<i64> = letters.iter().map(|m| m.offset).collect();
            errors.push(format!(
                "dead-letter topic: fold reject {id} delivered {} times (offsets {offsets:?})",
                letters.len()
            ));
        }
    }
    t.dead_letters = on_topic.len();
    t.dead_letter_duplicates = on_topic.values().map(|n| n.len() - 1).sum();
}
