//! The WAL's tail as a memtable: rows a writer acknowledged (durable in
//! WAL entries past the shard's replay mark) that no flush has put in a
//! generation yet. Another process cannot reach the writer's memtable, so
//! it reads the same entries (Lance's `WalTailer`, no claim) and loads
//! them, in WAL order, into a `BatchStore` with a primary-key index: the
//! shape Lance's LSM read merges as an in-memory memtable (newest row per
//! id by position, tombstones hiding older rows). Lance builds the stores;
//! graphsink only feeds them.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, LazyLock, Mutex};

use arrow::array::RecordBatch;
use futures::{StreamExt, TryStreamExt};
use lance::dataset::mem_wal::scanner::{InMemoryMemTableRef, InMemoryMemTables};
use lance::dataset::mem_wal::write::{BatchStore, IndexStore};
use lance::dataset::mem_wal::{WalReadEntry, WalTailer};
use lance::Dataset;
use lance_index::mem_wal::ShardManifest;
use tokio::sync::Mutex as AsyncMutex;
use uuid::Uuid;

use crate::error::{shown, Context, Error, Result};
use crate::schema::ID;

/// WAL entries read at once per shard.
const ENTRY_READS: usize = 16;

/// What this process has read of one shard's WAL, kept between fresh
/// reads. A WAL entry is written once (put-if-absent at its position) and
/// never changes, so a reader that reads again reads only the entries past
/// those it holds, from the tip it found last, not from the position the
/// shard's manifest last recorded (up to a fold interval of entries back).
/// Entries at or below the replay mark (flushed into a generation) are
/// dropped at each read, so it holds at most one shard's unflushed tail.
struct ShardTail {
    tailer: WalTailer,
    entries: BTreeMap<u64, Vec<RecordBatch>>,
    /// The first position past the WAL's tip when last read (0: not yet).
    tip: u64,
}

/// One shard's tail, read by one fresh read at a time.
type Held = Arc<AsyncMutex<ShardTail>>;

/// Every shard tail this process has read, by the table's location and
/// the shard.
static TAILS: LazyLock<Mutex<HashMap<(String, Uuid), Held>>> = LazyLock::new(Default::default);

/// This process's tail of `shard`, made on its first read.
async fn held(base: &Dataset, shard: Uuid) -> Result<Held> {
    let location = base.branch_location().path;
    let key = (location.to_string(), shard);
    if let Some(memo) = TAILS.lock().expect("not poisoned").get(&key) {
        return Ok(memo.clone());
    }
    let store = base.object_store(None).await.ctx("object store")?;
    let made = Arc::new(AsyncMutex::new(ShardTail {
        tailer: WalTailer::new(store, location, shard),
        entries: BTreeMap::new(),
        tip: 0,
    }));
    let mut tails = TAILS.lock().expect("not poisoned");
    Ok(tails.entry(key).or_insert(made).clone())
}

/// The durable rows of `shard` past `m`'s replay mark, as one memtable at
/// the writer's current generation (above every flushed one); `None`
/// when there are none.
pub(super) async fn wal_memtable(
    base: &Dataset,
    shard: Uuid,
    m: &ShardManifest,
) -> Result<Option<InMemoryMemTables>> {
    let memo = held(base, shard).await?;
    let mut memo = memo.lock().await;
    let from = m.replay_after_wal_entry_position + 1;
    if memo.tip == 0 {
        // The first read of this shard here: Lance's probe, from the
        // cursor the shard's manifest published.
        memo.tip = memo
            .tailer
            .next_position()
            .await
            .ctx(format!("WAL tip of {shard}"))?;
    }
    memo.entries.retain(|&p, _| p >= from);
    // Below the last tip: the entries not held yet. A missing one is a
    // fence sentinel's gap or one a retention run deleted after a flush;
    // the manifest check after the read catches the second.
    let missing: Vec<u64> = (from..memo.tip)
        .filter(|p| !memo.entries.contains_key(p))
        .collect();
    for (pos, entry) in read_entries(&memo.tailer, missing, shard).await? {
        if let Some(e) = entry {
            memo.entries.insert(pos, e.batches);
        }
    }
    let start = memo.tip.max(from);
    memo.tip = read_forward(&mut memo, start, shard).await?;
    let batches: Vec<RecordBatch> = memo
        .entries
        .values()
        .flatten()
        .filter(|b| b.num_rows() > 0)
        .cloned()
        .collect();
    drop(memo);
    let Some(first) = batches.first() else {
        return Ok(None);
    };
    let schema = first.schema();
    if batches.iter().any(|b| b.schema() != schema) {
        return Err(Error::Broker(format!(
            "the WAL of shard {shard} holds entries of two schemas (a schema change is being \
             applied); read again after the next fold"
        )));
    }
    let id_field = base
        .schema()
        .field(ID)
        .ok_or_else(|| Error::Corrupt(format!("{}: no {ID} column", base.uri())))?
        .id;
    let rows = Arc::new(BatchStore::with_capacity(batches.len()));
    let mut index = IndexStore::new();
    index.enable_pk_index(&[(ID.to_string(), id_field)]);
    for b in &batches {
        let (position, offset, _) = rows
            .append(b.clone())
            .map_err(|e| Error::Bug(format!("WAL tail of {shard}: {}", shown(&e))))?;
        index
            .insert_with_batch_position(b, offset, Some(position))
            .ctx(format!("index the WAL tail of {shard}"))?;
    }
    Ok(Some(InMemoryMemTables {
        active: InMemoryMemTableRef {
            batch_store: rows,
            index_store: Arc::new(index),
            schema,
            generation: m.current_generation,
        },
        frozen: Vec::new(),
    }))
}

/// Reads `positions` of a shard's WAL, `ENTRY_READS` at a time (each
/// entry is one object), in order; `None` where there is no entry.
async fn read_entries(
    tailer: &WalTailer,
    positions: Vec<u64>,
    shard: Uuid,
) -> Result<Vec<(u64, Option<WalReadEntry>)>> {
    futures::stream::iter(positions)
        .map(|pos| async move { Ok::<_, lance::Error>((pos, tailer.read_entry(pos).await?)) })
        .buffered(ENTRY_READS)
        .try_collect()
        .await
        .ctx(format!("WAL of {shard}"))
}

/// Reads the entries written since the last tip, in windows of 1, 2, 4,
/// … `ENTRY_READS` positions, until a position has no entry: that is the
/// new tip, as Lance's `WalTailer::next_position` finds it with a `HEAD`
/// per position in turn. Here the probe is the read itself, and a window
/// runs at once: on S3, ~N/16 round trips for N new entries instead of
/// 2·N requests, half of them in turn (docs/reads.md). An entry past the
/// first missing one in a window (written while the window was read) is
/// read again next time.
async fn read_forward(memo: &mut ShardTail, mut pos: u64, shard: Uuid) -> Result<u64> {
    let mut window = 1;
    loop {
        let positions: Vec<u64> = (pos..pos + window).collect();
        for (p, entry) in read_entries(&memo.tailer, positions, shard).await? {
            match entry {
                Some(e) => memo.entries.insert(p, e.batches),
                None => return Ok(p),
            };
        }
        pos += window;
        window = (window * 2).min(ENTRY_READS as u64);
    }
}
