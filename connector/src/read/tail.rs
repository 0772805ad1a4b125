//! The WAL's tail as a memtable: rows a writer acknowledged (durable in
//! WAL entries past the shard's replay mark) that no flush has put in a
//! generation yet. Another process cannot reach the writer's memtable, so
//! it reads the same entries (Lance's `WalTailer`, no claim) and loads
//! them, in WAL order, into a `BatchStore` with a primary-key index: the
//! shape Lance's LSM read merges as an in-memory memtable (newest row per
//! id by position, tombstones hiding older rows). Lance builds the stores;
//! graphsink only feeds them.

use std::sync::Arc;

use arrow::array::RecordBatch;
use futures::{StreamExt, TryStreamExt};
use lance::dataset::mem_wal::scanner::{InMemoryMemTableRef, InMemoryMemTables};
use lance::dataset::mem_wal::write::{BatchStore, IndexStore};
use lance::dataset::mem_wal::WalTailer;
use lance::Dataset;
use lance_index::mem_wal::ShardManifest;
use uuid::Uuid;

use crate::error::{Context, Error, Result};
use crate::schema::ID;

/// WAL entries read at once per shard.
const ENTRY_READS: usize = 16;

/// The durable rows of `shard` past `m`'s replay mark, as one memtable at
/// the writer's current generation (above every flushed one); `None`
/// when there are none.
pub(super) async fn wal_memtable(
    base: &Dataset,
    shard: Uuid,
    m: &ShardManifest,
) -> Result<Option<InMemoryMemTables>> {
    let store = base.object_store(None).await.ctx("object store")?;
    let tail = WalTailer::new(store, base.branch_location().path, shard);
    let end = tail
        .next_position()
        .await
        .ctx(format!("WAL tip of {shard}"))?;
    // Several reads in flight (each entry is one object), kept in WAL
    // order. A missing entry is a fence sentinel's gap or one a retention
    // run deleted after a flush; the manifest check after the read
    // catches the second.
    let entries: Vec<_> = futures::stream::iter(m.replay_after_wal_entry_position + 1..end)
        .map(|pos| tail.read_entry(pos))
        .buffered(ENTRY_READS)
        .try_collect()
        .await
        .ctx(format!("WAL of {shard}"))?;
    let batches: Vec<RecordBatch> = entries
        .into_iter()
        .flatten()
        .flat_map(|e| e.batches)
        .filter(|b| b.num_rows() > 0)
        .collect();
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
            .map_err(|e| Error::Bug(format!("WAL tail of {shard}: {e}")))?;
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
