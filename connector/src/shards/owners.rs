//! Who claimed each shard: the notes a claiming process leaves beside the
//! graph, for `status`.

use uuid::Uuid;

use crate::error::{shown, Context, Result};
use crate::graph::Graph;

/// Who claimed a shard last, as that process noted it beside the graph
/// (`_graphsink_owners/<shard>.json`): MemWAL's manifest keeps the epoch
/// but not who holds it, and tansu's group description names no member's
/// host or partitions. A note whose epoch is not the manifest's is stale.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ShardOwner {
    pub epoch: u64,
    /// `<host> pid <pid>` of the claiming process.
    pub holder: String,
    /// Epoch ms of the claim.
    pub claimed_at: i64,
}

fn owner_uri(graph: &Graph, shard: Uuid) -> String {
    format!("{}/_graphsink_owners/{shard}.json", graph.root())
}

/// This process as a shard owner names it.
pub fn holder() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into the buffer.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let host = match ok {
        true => String::from_utf8_lossy(&buf[..end]).into_owned(),
        false => "unknown-host".to_string(),
    };
    format!("{host} pid {}", std::process::id())
}

/// Notes this process as the claimant of each `(shard, epoch)`, all at
/// once. Informational (`status`), so a failure is logged, not fatal, and
/// a slow store cannot hold a session's start for more than a few seconds.
pub(super) async fn note_owners(graph: &Graph, claimed: &[(Uuid, u64)]) {
    const BOUND: std::time::Duration = std::time::Duration::from_secs(5);
    let (me, at) = (holder(), crate::types::now_ms());
    let writes = claimed.iter().map(|&(shard, epoch)| {
        let owner = ShardOwner {
            epoch,
            holder: me.clone(),
            claimed_at: at,
        };
        let body = serde_json::to_vec(&owner).expect("serializable");
        async move {
            if let Err(e) = graph.store().put(&owner_uri(graph, shard), &body).await {
                tracing::warn!(%shard, error = %shown(&e), "could not note this process as the shard's claimant");
            }
        }
    });
    if tokio::time::timeout(BOUND, futures::future::join_all(writes))
        .await
        .is_err()
    {
        tracing::warn!(
            "shard claimant notes not written within {BOUND:?}; status may not name this process"
        );
    }
}

/// The last owner note of `shard`, if any (and readable).
pub(crate) async fn shard_owner(graph: &Graph, shard: Uuid) -> Result<Option<ShardOwner>> {
    let uri = owner_uri(graph, shard);
    let got = graph.store().get(&uri).await.ctx(format!("read {uri}"))?;
    Ok(got.and_then(|b| serde_json::from_slice(&b).ok()))
}
