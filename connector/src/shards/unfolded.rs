//! What the MemWAL tier holds that the published graph does not (a run
//! with nothing assigned asks before it says the graph is caught up).

use lance::dataset::mem_wal::WalTailer;

use crate::error::{Context, Result};
use crate::graph::Graph;

use super::{latest_manifest, of_commit};

/// What is durable in the MemWAL tier but not in the published graph.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unfolded {
    /// Flushed generations past the head's compacted markers.
    pub generations: usize,
    /// Shards with rows in WAL entries past their replay mark (a live
    /// memtable, or a crashed writer's, that no flush has covered yet).
    pub wal_shards: usize,
}

impl Unfolded {
    pub(crate) fn is_empty(&self) -> bool {
        self.generations == 0 && self.wal_shards == 0
    }
}

/// Everything durable the head commit has not folded, over every shard of
/// every table it pins. WAL entries are read with Lance's `WalTailer` (no
/// claim, nothing written); a fence sentinel has no rows and does not count.
pub(crate) async fn unfolded(graph: &Graph) -> Result<Unfolded> {
    let head = graph.head().await?;
    let mut out = Unfolded::default();
    for t in of_commit(graph, &head).await? {
        let store = t.ds.object_store(None).await.ctx("object store")?;
        for s in t.shards() {
            let shard = s.id;
            let Some(m) = latest_manifest(&t.ds, shard).await? else {
                continue;
            };
            let upto = s.folded_upto.unwrap_or(0);
            out.generations += m.sstables.iter().filter(|g| g.generation > upto).count();
            let tail = WalTailer::new(store.clone(), t.ds.branch_location().path, shard);
            let end = tail
                .next_position()
                .await
                .ctx(format!("WAL tip of {shard}"))?;
            for pos in m.replay_after_wal_entry_position + 1..end {
                let entry = tail.read_entry(pos).await.ctx(format!("WAL of {shard}"))?;
                if entry.is_some_and(|e| e.batches.iter().any(|b| b.num_rows() > 0)) {
                    out.wal_shards += 1;
                    break;
                }
            }
        }
    }
    Ok(out)
}
