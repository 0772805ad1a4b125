//! Retention: deletes what folding has made garbage, and measures storage.
//! Four steps, in this order, each safe to crash in and to repeat:
//! 1. `wal` — WAL entries below each shard's replay mark (the newest kept);
//! 2. `generations::trim` — shard manifests stop naming generations the
//!    published head's compacted markers cover;
//! 3. `generations` — those generation directories are deleted;
//! 4. `versions` — Lance versions no retained graph commit pins (Lance's
//!    cleanup), of every table and of `__manifest`.
//!
//! It reads the graph head and shard manifests; it never folds, never
//! claims a shard, and deletes no row. The fold loop runs it after a
//! publish (`Scheduled`), `graphsink gc` on demand. All I/O goes through
//! Lance's object store, so the same code runs on `s3://` roots.
//! docs/retention.md has the rules and why.

mod generations;
mod storage;
mod versions;
mod wal;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::config::RetentionSettings;
use crate::error::Result;
use crate::failpoints;
use crate::graph::{Graph, GraphCommit};
use crate::schema::MANIFEST_TABLE;
use crate::shards::{self, LiveShards, WalTable};
use crate::types::now_ms;

pub use storage::{graph_storage, TableStorage};

/// What one kind of garbage amounted to: files (WAL entries, generation
/// directories, or Lance versions) and their bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Removed {
    pub count: u64,
    pub bytes: u64,
}

impl Removed {
    fn add(&mut self, other: Removed) {
        self.count += other.count;
        self.bytes += other.bytes;
    }
}

/// What retention deleted (or, in a dry run, would delete) in one table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TableGc {
    /// WAL entry files.
    pub wal: Removed,
    /// Flushed generation directories (bytes of all their files).
    pub generations: Removed,
    /// Generations dropped from shard manifests.
    pub trimmed: u64,
    /// Shard manifest versions pruned (Lance prunes only those a day old).
    pub pruned_manifests: u64,
    /// Old Lance versions (count) and every file their removal freed.
    pub versions: Removed,
}

/// One run of retention.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GcReport {
    pub dry_run: bool,
    /// The published head the run went by.
    pub head_seq: u64,
    /// Graph commits still readable after the run.
    pub retained_commits: usize,
    /// Graph commits whose versions are gone (`show --commit` says so).
    pub expired_commits: usize,
    pub tables: BTreeMap<String, TableGc>,
}

impl GcReport {
    pub fn total(&self) -> TableGc {
        let mut t = TableGc::default();
        for g in self.tables.values() {
            t.wal.add(g.wal);
            t.generations.add(g.generations);
            t.trimmed += g.trimmed;
            t.pruned_manifests += g.pruned_manifests;
            t.versions.add(g.versions);
        }
        t
    }
}

/// Which graph commits stay readable: the `keep_commits` newest, those
/// younger than `keep_for`, and the head (the union).
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub keep_commits: usize,
    pub keep_for_ms: i64,
}

impl From<&RetentionSettings> for Window {
    fn from(s: &RetentionSettings) -> Window {
        Window {
            keep_commits: s.keep_commits,
            keep_for_ms: s.keep_for_ms(),
        }
    }
}

impl Window {
    /// Splits `commits` (any order) into retained and expired, by seq.
    pub(crate) fn retained<'a>(
        &self,
        head: &GraphCommit,
        commits: &'a [GraphCommit],
        now: i64,
    ) -> (Vec<&'a GraphCommit>, usize) {
        let mut by_seq: Vec<&GraphCommit> = commits.iter().collect();
        by_seq.sort_by_key(|c| std::cmp::Reverse(c.seq));
        let since = now.saturating_sub(self.keep_for_ms);
        let (keep, gone): (Vec<_>, Vec<_>) = by_seq
            .into_iter()
            .enumerate()
            .partition(|(i, c)| *i < self.keep_commits || c.created_at >= since || c.id == head.id);
        (keep.into_iter().map(|(_, c)| c).collect(), gone.len())
    }
}

/// Runs the four steps against the published head. `live` names the
/// writers of this process (their own manifest stores trim); without one,
/// a shard's manifest is trimmed by compare-and-swap at its stored epoch.
pub(crate) async fn collect(
    graph: &Graph,
    window: &Window,
    live: &LiveShards,
    dry_run: bool,
) -> Result<GcReport> {
    // Read once, first: everything below goes by this head, and a head
    // published meanwhile only pins newer versions and higher markers.
    let head = graph.head().await?;
    let commits = graph.commits().await?;
    let (retained, expired_commits) = window.retained(&head, &commits, now_ms());
    let mut report = GcReport {
        dry_run,
        head_seq: head.seq,
        retained_commits: retained.len(),
        expired_commits,
        tables: head
            .tables
            .keys()
            .chain([&MANIFEST_TABLE.to_string()])
            .map(|t| (t.clone(), TableGc::default()))
            .collect(),
    };
    let wal_tables = shards::of_commit(graph, &head).await?;
    collect_wal(graph, &wal_tables, dry_run, &mut report).await?;
    failpoints::hit(failpoints::GC_AFTER_WAL)?;
    let covered = trim_generations(graph, &wal_tables, live, dry_run, &mut report).await?;
    failpoints::hit(failpoints::GC_AFTER_TRIM)?;
    collect_generations(graph, &covered, dry_run, &mut report).await?;
    failpoints::hit(failpoints::GC_AFTER_GENERATIONS)?;
    collect_versions(graph, &head, &retained, dry_run, &mut report).await?;
    failpoints::hit(failpoints::GC_AFTER_VERSIONS)?;
    Ok(report)
}

/// Step 1: each shard's WAL entries below its replay mark.
async fn collect_wal(
    graph: &Graph,
    wal_tables: &[WalTable],
    dry_run: bool,
    report: &mut GcReport,
) -> Result<()> {
    for t in wal_tables {
        let ds = graph.open_table(&t.table, None).await?;
        for s in t.shards() {
            let removed = wal::collect(&ds, s.id, dry_run).await?;
            report
                .tables
                .entry(t.table.clone())
                .or_default()
                .wal
                .add(removed);
        }
    }
    Ok(())
}

/// Step 2: each shard's manifest stops naming the generations the head's
/// compacted markers cover (and, unless a dry run, its old manifests pruned);
/// returns the (table, shard, marker) whose directories may go.
async fn trim_generations(
    graph: &Graph,
    wal_tables: &[WalTable],
    live: &LiveShards,
    dry_run: bool,
    report: &mut GcReport,
) -> Result<Vec<(String, uuid::Uuid, u64)>> {
    let mut covered = Vec::new();
    for t in wal_tables {
        let ds = graph.open_table(&t.table, None).await?;
        for s in t.shards() {
            let (shard, Some(marker)) = (s.id, s.folded_upto) else {
                continue; // nothing of this shard is folded yet
            };
            let trimmed = generations::trim(&ds, shard, marker, live.get(&shard), dry_run).await?;
            let entry = report.tables.entry(t.table.clone()).or_default();
            if !dry_run {
                entry.pruned_manifests += generations::prune(&ds, shard, live.get(&shard)).await?;
            }
            // Directories go only once no manifest names them.
            if let Some(n) = trimmed {
                entry.trimmed += n;
                covered.push((t.table.clone(), shard, marker));
            }
        }
    }
    Ok(covered)
}

/// Step 3: the generation directories no trimmed manifest names.
async fn collect_generations(
    graph: &Graph,
    covered: &[(String, uuid::Uuid, u64)],
    dry_run: bool,
    report: &mut GcReport,
) -> Result<()> {
    for (table, shard, marker) in covered {
        let ds = graph.open_table(table, None).await?;
        let removed = generations::collect(&ds, *shard, *marker, dry_run).await?;
        report
            .tables
            .entry(table.clone())
            .or_default()
            .generations
            .add(removed);
    }
    Ok(())
}

/// Step 4: the Lance versions no retained graph commit pins (Lance's
/// cleanup), of every table and of `__manifest`.
async fn collect_versions(
    graph: &Graph,
    head: &GraphCommit,
    retained: &[&GraphCommit],
    dry_run: bool,
    report: &mut GcReport,
) -> Result<()> {
    let plan = versions::plan(head, retained);
    let mut first = true;
    for (table, keep) in &plan {
        let removed = versions::collect(graph, table, keep, dry_run).await?;
        report
            .tables
            .entry(table.clone())
            .or_default()
            .versions
            .add(removed);
        if std::mem::take(&mut first) && removed.count > 0 {
            failpoints::hit(failpoints::GC_VERSIONS_PARTIAL)?;
        }
    }
    Ok(())
}

/// Retention as the fold loop runs it: after a publish, at most once per
/// `interval`.
pub(crate) struct Scheduled {
    window: Window,
    interval: Duration,
    live: LiveShards,
    last: Option<Instant>,
}

impl Scheduled {
    pub(crate) fn new(settings: &RetentionSettings, live: LiveShards) -> Option<Scheduled> {
        settings.enabled.then(|| Scheduled {
            window: settings.into(),
            interval: settings.interval,
            live,
            last: None,
        })
    }

    /// Runs retention if it is due. Its failures are logged, not returned:
    /// garbage left behind is collected next time, and ingest must not stop
    /// because a delete failed.
    pub(crate) async fn after_publish(&mut self, graph: &Graph) {
        let now = Instant::now();
        if !due(self.last, self.interval, now) {
            return;
        }
        self.last = Some(now);
        match collect(graph, &self.window, &self.live, false).await {
            Ok(r) => {
                let t = r.total();
                tracing::info!(
                    wal_files = t.wal.count,
                    generations = t.generations.count,
                    versions = t.versions.count,
                    bytes = t.wal.bytes + t.generations.bytes + t.versions.bytes,
                    "retention collected"
                );
            }
            Err(e) => tracing::warn!(error = %e, "retention failed; the next run retries"),
        }
    }
}

/// The first run after a start is due at once; later ones `interval`
/// after the previous run began.
fn due(last: Option<Instant>, interval: Duration, now: Instant) -> bool {
    last.is_none_or(|t| now.saturating_duration_since(t) >= interval)
}

#[cfg(test)]
mod tests;
