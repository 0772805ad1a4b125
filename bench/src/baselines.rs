//! The two yardsticks graphsink is measured against, on the same topic with
//! their own consumer groups: (a) a bare rdkafka consume+commit loop, the
//! ceiling of what any consumer gets from this broker; (b) a direct bounded
//! load into a plain Lance table (merge-insert per batch, then commit), the
//! simplest correct sink without a WAL. Each returns records/s measured from
//! its first fetched record until its final offsets are committed.

use std::collections::HashSet;
use std::io::Cursor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{Array, RecordBatch, RecordBatchIterator, StringArray, UInt32Array};
use arrow::compute::{concat_batches, take};
use arrow_schema::{DataType, Field, Schema};
use lance::dataset::{MergeInsertBuilder, WhenMatched, WhenNotMatched};
use lance::Dataset;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use crate::broker::BoxError;
use crate::measure::Target;

pub(crate) struct BaselineRun {
    pub records: u64,
    pub secs: f64,
    pub batches: u64,
}

impl BaselineRun {
    pub(crate) fn rate(&self) -> f64 {
        self.records as f64 / self.secs
    }
}

fn group_config(t: &Target, group: &str) -> ClientConfig {
    // The same consumer defaults graphsink uses (assignment strategy and
    // fetch queue), so the join and the fetching cost the same.
    let mut cc = ClientConfig::new();
    for (k, v) in graphsink::CONSUMER_DEFAULTS {
        cc.set(*k, *v);
    }
    cc.set("bootstrap.servers", &t.bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false");
    for (k, v) in t.security.iter().chain(&t.consumer_props) {
        cc.set(k, v);
    }
    cc
}

fn commit_list(t: &Target, next: &[i64]) -> Result<TopicPartitionList, BoxError> {
    let mut tpl = TopicPartitionList::new();
    for (slot, &n) in next.iter().enumerate() {
        if n > 0 {
            let (topic, p) = t.topics.at(slot);
            tpl.add_partition_offset(topic, p, Offset::Offset(n))?;
        }
    }
    Ok(tpl)
}

fn slot_of(t: &Target, m: &impl Message) -> Result<usize, BoxError> {
    t.topics
        .slot(m.topic(), m.partition())
        .ok_or_else(|| format!("record from unexpected {}/{}", m.topic(), m.partition()).into())
}

fn done(next: &[i64], ends: &[i64]) -> bool {
    next.iter().zip(ends).all(|(n, e)| n >= e)
}

/// (a) Poll, remember the next offset per partition, commit every `commit_every` (`--commit-interval-ms`)
/// (async, as graphsink does), and synchronously at the end.
pub(crate) fn bare(t: &Target, group: &str, ends: &[i64]) -> Result<BaselineRun, BoxError> {
    bare_loop(t, group, &AtomicU64::new(0), &|next| done(next, ends))
}

/// The bare loop until `stop(next offsets)` says so; `seen` counts records
/// as they arrive (the live phase waits on it to know the group joined).
pub(crate) fn bare_loop(
    t: &Target,
    group: &str,
    seen: &AtomicU64,
    stop: &dyn Fn(&[i64]) -> bool,
) -> Result<BaselineRun, BoxError> {
    let c: BaseConsumer = group_config(t, group).create()?;
    c.subscribe(&t.topics.names())?;
    let mut next = vec![0i64; t.topics.slots()];
    let mut records = 0u64;
    let mut first: Option<Instant> = None;
    let mut last_commit = Instant::now();
    let mut commits = 0u64;
    while !stop(&next) {
        if let Some(m) = c.poll(Duration::from_millis(100)) {
            let m = m?;
            first.get_or_insert_with(Instant::now);
            next[slot_of(t, &m)?] = m.offset() + 1;
            records += 1;
            seen.fetch_add(1, Ordering::Relaxed);
        }
        if last_commit.elapsed() >= t.commit_every {
            c.commit(&commit_list(t, &next)?, CommitMode::Async)?;
            last_commit = Instant::now();
            commits += 1;
        }
    }
    c.commit(&commit_list(t, &next)?, CommitMode::Sync)?;
    let first = first.ok_or("bare consumer read nothing")?;
    Ok(BaselineRun {
        records,
        secs: first.elapsed().as_secs_f64(),
        batches: commits + 1,
    })
}

/// The columns the direct load keeps: exactly the JSON values' fields (and,
/// for edges, the id from the Kafka key).
fn item_schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("sku", DataType::Utf8, false),
        Field::new("seq", DataType::Int64, false),
        Field::new("pad", DataType::Utf8, false),
    ]))
}

fn link_value_schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("src", DataType::Utf8, false),
        Field::new("dst", DataType::Utf8, false),
        Field::new("seq", DataType::Int64, false),
        Field::new("pad", DataType::Utf8, false),
    ]))
}

/// Keeps the last row per key (column 0): Lance refuses a merge-insert whose
/// source has two rows for one key, and Kafka order means the last one wins.
fn last_per_key(batch: &RecordBatch) -> Result<RecordBatch, BoxError> {
    let keys = batch
        .column(0)
        .as_any()
        .downcast_ref::<StringArray>()
        .ok_or("key is not utf8")?;
    let mut seen = HashSet::with_capacity(keys.len());
    let mut keep: Vec<u32> = (0..keys.len() as u32)
        .rev()
        .filter(|&i| seen.insert(keys.value(i as usize)))
        .collect();
    keep.reverse();
    let idx = UInt32Array::from(keep);
    let cols = batch
        .columns()
        .iter()
        .map(|c| take(c.as_ref(), &idx, None))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(RecordBatch::try_new(batch.schema(), cols)?)
}

/// One table of the direct load: JSON lines (and Kafka keys) of one batch,
/// merged into a plain Lance table keyed on its first column.
struct DirectTable {
    uri: String,
    key: &'static str,
    value_schema: Arc<Schema>,
    /// Edges: the Kafka key becomes an `id` column in front.
    key_column: bool,
    ds: Option<Arc<Dataset>>,
    json: Vec<u8>,
    keys: Vec<String>,
    /// With `--bad-fraction`: drop records that would fail the batch.
    skip_bad: bool,
}

/// A node value the direct load can take: JSON with a non-negative integer
/// `seq` (what `--bad-fraction`'s bad records are not).
fn good_item(v: Option<&[u8]>) -> bool {
    let Some(v) = v else { return false };
    serde_json::from_slice::<serde_json::Value>(v)
        .ok()
        .and_then(|j| j.get("seq").and_then(serde_json::Value::as_i64))
        .is_some_and(|s| s >= 0)
}

impl DirectTable {
    fn new(uri: String, key: &'static str, value_schema: Arc<Schema>, key_column: bool) -> Self {
        DirectTable {
            uri,
            key,
            value_schema,
            key_column,
            ds: None,
            json: Vec::new(),
            keys: Vec::new(),
            skip_bad: false,
        }
    }

    fn push(&mut self, m: &impl Message) {
        if self.skip_bad && !good_item(m.payload()) {
            return;
        }
        self.json.extend_from_slice(m.payload().unwrap_or(b"null"));
        self.json.push(b'\n');
        if self.key_column {
            let k = m.key().map(String::from_utf8_lossy).unwrap_or_default();
            self.keys.push(k.into_owned());
        }
    }

    async fn merge(&mut self) -> Result<(), BoxError> {
        if self.json.is_empty() {
            return Ok(());
        }
        let reader = arrow_json::ReaderBuilder::new(self.value_schema.clone())
            .with_batch_size(64 * 1024)
            .build(Cursor::new(std::mem::take(&mut self.json)))?;
        let parts = reader.collect::<Result<Vec<_>, _>>()?;
        let mut batch = concat_batches(&self.value_schema, &parts)?;
        if self.key_column {
            let ids = StringArray::from(std::mem::take(&mut self.keys));
            let mut fields = vec![Field::new("id", DataType::Utf8, false)];
            fields.extend(
                self.value_schema
                    .fields()
                    .iter()
                    .map(|f| f.as_ref().clone()),
            );
            let mut cols: Vec<Arc<dyn Array>> = vec![Arc::new(ids)];
            cols.extend(batch.columns().iter().cloned());
            batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), cols)?;
        }
        let rows = last_per_key(&batch)?;
        let schema = rows.schema();
        self.ds = Some(match self.ds.take() {
            None => {
                let it = RecordBatchIterator::new(vec![Ok(rows)], schema);
                Arc::new(Dataset::write(it, &self.uri, None).await?)
            }
            Some(d) => {
                let mut b = MergeInsertBuilder::try_new(d, vec![self.key.into()])?;
                b.when_matched(WhenMatched::UpdateAll)
                    .when_not_matched(WhenNotMatched::InsertAll);
                b.try_build()?.execute_batches(vec![rows]).await?.0
            }
        });
        Ok(())
    }
}

/// (b) Consume up to `batch` records (or to the end), decode the JSON values
/// with arrow-json, merge-insert nodes into one Lance table keyed on `sku`
/// and edges into another keyed on the Kafka key, then commit the batch's
/// offsets synchronously. No WAL, no graph commit, no endpoint checks.
pub(crate) async fn direct(
    t: &Target,
    group: &str,
    ends: &[i64],
    dir: &str,
    batch: usize,
    skip_bad: bool,
) -> Result<BaselineRun, BoxError> {
    let c: StreamConsumer = group_config(t, group).create()?;
    c.subscribe(&t.topics.names())?;
    let mut items = DirectTable::new(format!("{dir}/items.lance"), "sku", item_schema(), false);
    items.skip_bad = skip_bad;
    let mut tables = vec![items];
    if t.topics.edges.is_some() {
        tables.push(DirectTable::new(
            format!("{dir}/links.lance"),
            "id",
            link_value_schema(),
            true,
        ));
    }
    let p = t.topics.partitions as usize;
    let mut next = vec![0i64; t.topics.slots()];
    let (mut records, mut batches) = (0u64, 0u64);
    let mut first: Option<Instant> = None;
    while !done(&next, ends) {
        let mut n = 0usize;
        while n < batch && !done(&next, ends) {
            let m = c.recv().await?;
            first.get_or_insert_with(Instant::now);
            let slot = slot_of(t, &m)?;
            tables[slot / p].push(&m);
            next[slot] = m.offset() + 1;
            n += 1;
        }
        for table in &mut tables {
            table.merge().await?;
        }
        c.commit(&commit_list(t, &next)?, CommitMode::Sync)?;
        records += n as u64;
        batches += 1;
    }
    let first = first.ok_or("direct load read nothing")?;
    Ok(BaselineRun {
        records,
        secs: first.elapsed().as_secs_f64(),
        batches,
    })
}
