//! One table's shards: routing rows to buckets (Lance's sharding spec, or
//! the source partition) and the WAL writes, each with its durability
//! watcher.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Array, AsArray, Int32Array, RecordBatch, StringArray, UInt32Array};
use arrow::datatypes::Int32Type;
use lance::dataset::mem_wal::{evaluate_sharding_spec, BatchDurableWatcher, ShardWriter};
use lance_index::mem_wal::ShardingSpec;
use uuid::Uuid;

use crate::error::{shown, Context, Error, PublicResult, Result};
use crate::graph::ShardLayout;
use crate::schema::SRC_PARTITION;

/// How a table's rows find their shard.
pub(super) enum Router {
    /// `bucket(id, N)`, by Lance's own sharding spec.
    Spec {
        spec: ShardingSpec,
        lance_schema: lance_core::datatypes::Schema,
    },
    /// The row's source partition (`partition` sharding of a type table).
    Partition,
    /// The row's (topic, partition), numbered by the layout (`partition`
    /// sharding of the rejects table).
    Source(Arc<ShardLayout>),
}

/// One open writer and where it belongs.
pub struct Shard {
    pub table: String,
    pub bucket: u32,
    pub writer: Arc<ShardWriter>,
}

/// The writers of one table plus what routing needs.
pub struct TableShards {
    pub table: String,
    pub(super) router: Router,
    /// The primary-key column each put is sorted by (see `route`).
    pub(super) pk: Option<String>,
    /// Shards N, as the graph was created with.
    pub(super) n: u32,
    /// The writers this process holds, by bucket.
    pub shards: BTreeMap<u32, Shard>,
}

/// Durability of one put or delete, with where it went (for error messages).
pub struct PendingWrite {
    pub table: String,
    pub bucket: u32,
    pub shard: Uuid,
    pub watcher: Option<BatchDurableWatcher>,
}

impl PendingWrite {
    pub async fn wait(self) -> PublicResult<()> {
        if let Some(mut w) = self.watcher {
            w.wait()
                .await
                .map_err(|e| fenced_or(e, &self.table, self.bucket, self.shard, "WAL write"))?;
        }
        Ok(())
    }
}

impl TableShards {
    /// Splits `batch` by `bucket(id, N)` as Lance computes it, each part
    /// sorted by its key. MemWAL indexes every put row by key (a skiplist,
    /// a bloom filter, at flush a B-tree): inserting keys in order is the
    /// cheapest way in (lance-memwal.md §12 measured ~40 % less CPU per
    /// row). The sort is stable, so if a batch held one key twice its later
    /// row would stay last and still win.
    pub fn route(&self, batch: &RecordBatch) -> PublicResult<Vec<(usize, RecordBatch)>> {
        if batch.num_rows() == 0 {
            return Ok(vec![]);
        }
        let col = self.shard_of_rows(batch)?;
        let keys = self
            .pk
            .as_deref()
            .and_then(|pk| batch.column_by_name(pk))
            .and_then(|c| c.as_string_opt::<i32>());
        Ok(split_by_bucket(batch, &col, self.n as usize, keys)?)
    }

    /// Each row's shard index, by the table's router.
    fn shard_of_rows(&self, batch: &RecordBatch) -> Result<Int32Array> {
        let column = |name: &str| {
            batch.column_by_name(name).ok_or_else(|| {
                Error::Corrupt(format!("rows of {} lack {name} to route by", self.table))
            })
        };
        match &self.router {
            Router::Spec { spec, lance_schema } => {
                let buckets = evaluate_sharding_spec(batch, spec, lance_schema)
                    .ctx(format!("route rows of {}", self.table))?;
                buckets
                    .column(0)
                    .as_any()
                    .downcast_ref::<Int32Array>()
                    .cloned()
                    .ok_or_else(|| Error::Corrupt("sharding spec did not yield Int32".into()))
            }
            Router::Partition => column(SRC_PARTITION)?
                .as_primitive_opt::<Int32Type>()
                .cloned()
                .ok_or_else(|| Error::Corrupt(format!("{SRC_PARTITION} is not Int32"))),
            Router::Source(layout) => {
                let topics = column("topic")?.as_string_opt::<i32>().cloned();
                let parts = column("partition")?
                    .as_primitive_opt::<Int32Type>()
                    .cloned();
                let (Some(topics), Some(parts)) = (topics, parts) else {
                    return Err(Error::Corrupt("rejects' topic/partition columns".into()));
                };
                Ok((0..batch.num_rows())
                    .map(|i| {
                        let (t, p) = (topics.is_valid(i), parts.is_valid(i));
                        (t && p)
                            .then(|| layout.source_shard(topics.value(i), parts.value(i)))
                            .flatten()
                            .map(|s| s as i32)
                    })
                    .collect())
            }
        }
    }

    /// Starts the WAL write of `batch` (rows) without waiting for durability.
    pub async fn put(&self, batch: RecordBatch) -> PublicResult<Vec<PendingWrite>> {
        Ok(self.write(batch, Write::Put).await?)
    }

    /// Starts the WAL write of tombstones for the keys in `keys` (an `id` column).
    pub async fn delete(&self, keys: RecordBatch) -> PublicResult<Vec<PendingWrite>> {
        Ok(self.write(keys, Write::Delete).await?)
    }

    async fn write(&self, batch: RecordBatch, kind: Write) -> Result<Vec<PendingWrite>> {
        let mut out = Vec::new();
        for (b, part) in self.route(&batch)? {
            let s = self.shards.get(&(b as u32)).ok_or_else(|| {
                Error::Bug(format!(
                    "rows of {} for shard {b}, which this process does not hold",
                    self.table
                ))
            })?;
            let id = s.writer.shard_id();
            let started = match kind {
                Write::Put => s.writer.put_no_wait(vec![part]).await,
                Write::Delete => s.writer.delete_no_wait(vec![part]).await,
            };
            let (_, watcher) =
                started.map_err(|e| fenced_or(e, &self.table, s.bucket, id, kind.name()))?;
            out.push(PendingWrite {
                table: self.table.clone(),
                bucket: s.bucket,
                shard: id,
                watcher,
            });
        }
        Ok(out)
    }
}

/// One pass over the bucket column collects each bucket's row indices,
/// sorted (stably) by `keys` when given; one `take` per non-empty bucket
/// then builds its batch. A part already in order is not copied.
pub(super) fn split_by_bucket(
    batch: &RecordBatch,
    buckets: &Int32Array,
    n: usize,
    keys: Option<&StringArray>,
) -> Result<Vec<(usize, RecordBatch)>> {
    let mut rows: Vec<Vec<u32>> = vec![Vec::new(); n];
    for (i, b) in buckets.iter().enumerate() {
        let b = b
            .and_then(|b| usize::try_from(b).ok())
            .filter(|&b| b < n)
            .ok_or_else(|| Error::Corrupt(format!("row {i} routed to bucket {b:?} of {n}")))?;
        rows[b].push(i as u32);
    }
    rows.into_iter()
        .enumerate()
        .filter(|(_, idx)| !idx.is_empty())
        .map(|(b, mut idx)| {
            if let Some(k) = keys {
                let key = |i: u32| k.value(i as usize);
                if !idx.windows(2).all(|w| key(w[0]) <= key(w[1])) {
                    idx.sort_by(|&x, &y| key(x).cmp(key(y)));
                }
            }
            if idx.len() == batch.num_rows() && idx.iter().enumerate().all(|(i, &r)| r == i as u32)
            {
                return Ok((b, batch.clone()));
            }
            let idx = UInt32Array::from(idx);
            let part = arrow::compute::take_record_batch(batch, &idx).ctx("split by bucket")?;
            Ok((b, part))
        })
        .collect()
}

/// The table's primary key column, when it is one string column (every
/// graphsink table's is).
pub(super) fn single_pk(schema: &lance_core::datatypes::Schema) -> Option<String> {
    match schema.unenforced_primary_key()[..] {
        [f] if f.data_type() == arrow_schema::DataType::Utf8 => Some(f.name.clone()),
        _ => None,
    }
}

#[derive(Clone, Copy)]
enum Write {
    Put,
    Delete,
}

impl Write {
    fn name(self) -> &'static str {
        match self {
            Write::Put => "put",
            Write::Delete => "delete",
        }
    }
}

/// A writer fenced by a peer becomes `Error::Fenced` naming the shard and
/// epochs; one that gave up on its own WAL store, `Error::WalUnavailable`
/// (reopening it replays whatever landed).
pub(crate) fn fenced_or(
    e: lance::Error,
    table: &str,
    bucket: u32,
    shard: Uuid,
    what: &str,
) -> Error {
    match e.fence_reason().or_else(|| stringified_fence(&e)) {
        Some(lance_core::FenceReason::PersistenceFailure) => Error::WalUnavailable {
            table: table.to_string(),
            bucket,
            shard,
            reason: shown(&e),
        },
        Some(_) => Error::Fenced {
            table: table.to_string(),
            bucket,
            shard,
            reason: shown(&e),
        },
        None => Error::Lance {
            context: format!("{what} on shard {shard} ({table} bucket {bucket})"),
            source: e,
        },
    }
}

/// A fence that reached us as text: a memtable flush runs in Lance's
/// background task, and its error comes back as an IO error carrying the
/// fence's message (seen in the chaos `members` phase: a member frozen past
/// its session exited on "LanceError(IO): Writer fenced (peer claimed
/// epoch)" instead of rejoining). Lance keeps the `Writer fenced (<reason>)`
/// prefix for such readers.
fn stringified_fence(e: &lance::Error) -> Option<lance_core::FenceReason> {
    let text = e.to_string();
    if text.contains("Writer fenced (peer claimed epoch)") {
        Some(lance_core::FenceReason::PeerClaimedEpoch)
    } else if text.contains("Writer fenced (persistence failure)") {
        Some(lance_core::FenceReason::PersistenceFailure)
    } else {
        None
    }
}
