//! Old Lance versions, through Lance's own cleanup (`Dataset::cleanup` with
//! an exact set of versions), which deletes a version's manifest and every
//! file no remaining version references. A table keeps every version a
//! retained graph commit pins, and every version from the head's pin up:
//! recovery reads the transactions after the pin, and the latest is
//! Lance's own floor. `__manifest` is pinned by nothing; it keeps the
//! versions written since the oldest retained commit, so a reader that
//! opened it inside the window is not cut off mid-read.
//!
//! Lance keeps, on its own, files no manifest references that are younger
//! than 7 days (they may belong to a commit in flight, e.g. a fold of
//! another process); graphsink never overrides that guard.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use lance::dataset::cleanup::CleanupPolicy;
use lance::dataset::Version;

use super::Removed;
use crate::error::{Context, Result};
use crate::graph::{Graph, GraphCommit};
use crate::schema::MANIFEST_TABLE;

/// Which versions of one table stay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Keep {
    /// Versions at or above `floor` (the head's pin), and those `pinned` by
    /// a retained commit.
    Pinned { floor: u64, pinned: BTreeSet<u64> },
    /// Versions written at or after this time (epoch ms).
    Since(i64),
}

impl Keep {
    fn keeps(&self, v: &Version) -> bool {
        match self {
            Keep::Pinned { floor, pinned } => v.version >= *floor || pinned.contains(&v.version),
            Keep::Since(ms) => v.timestamp.timestamp_millis() >= *ms,
        }
    }
}

/// What every table keeps, given the head and the retained commits.
pub(super) fn plan(head: &GraphCommit, retained: &[&GraphCommit]) -> BTreeMap<String, Keep> {
    let mut out: BTreeMap<String, Keep> = head
        .tables
        .iter()
        .map(|(t, &floor)| {
            let pinned = retained
                .iter()
                .filter_map(|c| c.tables.get(t).copied())
                .collect();
            (t.clone(), Keep::Pinned { floor, pinned })
        })
        .collect();
    let oldest = retained
        .iter()
        .map(|c| c.created_at)
        .min()
        .unwrap_or(head.created_at);
    out.insert(MANIFEST_TABLE.to_string(), Keep::Since(oldest));
    out
}

/// The versions of a table `keep` lets go (never the latest).
pub(super) fn doomed(versions: &[Version], latest: u64, keep: &Keep) -> HashSet<u64> {
    versions
        .iter()
        .filter(|v| v.version != latest && !keep.keeps(v))
        .map(|v| v.version)
        .collect()
}

/// Cleans (or, dry, explains) the versions of `table` that `keep` lets go.
pub(super) async fn collect(
    graph: &Graph,
    table: &str,
    keep: &Keep,
    dry_run: bool,
) -> Result<Removed> {
    let ds = graph.open_table(table, None).await?;
    let versions = ds
        .versions()
        .await
        .ctx(format!("list versions of {table}"))?;
    let doomed = doomed(&versions, ds.version().version, keep);
    if doomed.is_empty() {
        return Ok(Removed::default());
    }
    let policy = CleanupPolicy {
        versions: Some(doomed),
        // An operator's tag keeps its version (Lance skips tagged ones).
        error_if_tagged_old_versions: false,
        ..Default::default()
    };
    let op = ds.cleanup(policy);
    let what = format!("clean old versions of {table}");
    let stats = if dry_run {
        op.with_max_candidate_files(0)
            .explain()
            .await
            .ctx(what)?
            .stats
    } else {
        op.execute().await.ctx(what)?
    };
    Ok(Removed {
        count: stats.old_versions,
        bytes: stats.bytes_removed,
    })
}
