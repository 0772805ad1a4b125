//! Fold: merges flushed WAL generations into the base tables, checks what
//! needs graph state, and publishes exactly one graph commit per fold.
//!
//! The stages, in order:
//! 1. `plan` — which generations of which shards, which deferred edges to
//!    retry, and the parent commit's table versions to check against;
//! 2. `read` — the newest row per id across the planned generations;
//! 3. `checks` — a pre-read view of the base (`read_view`), then pure graph
//!    checks (endpoints, `@card`, `@unique`, referenced deletes, deferral);
//! 4. `write` — delete and upsert passes per table, each commit carrying
//!    the plan, so a crash before the publish is finished by `recover`;
//!    then the table's compaction and its id index (`index`), in commits
//!    of the plan too;
//! 5. `publish` — the graph commit, a compare-and-swap on the head.
//!
//! Around them: `task` (the fold loop of a running connector), `offline`
//! (`graphsink fold`), `recover` (roll an unpublished fold forward) and
//! `redeliver` (fold rejects a crash kept from the dead-letter topic).
//! Reading and checking see only the plan's generations and the tables at
//! the versions of the commit they check against, so they give the same
//! answer every time.

mod checks;
mod index;
pub(crate) use index::keep as keep_id_index;
mod keys;
mod migrate;
mod offline;
mod plan;
mod policy;
mod publish;
mod read;
mod recover;
mod redeliver;
mod report;
mod rows;
mod task;
mod write;

use crate::config::Tolerance;
use crate::error::{Error, PublicResult, Result};
use crate::failpoints;
use crate::graph::{Graph, GraphCommit};
use crate::rejects::Reject;

use checks::{Checked, Ctx, Decision};
use publish::Published;
use read::ReadSet;

pub(crate) use keys::known_ids_agree;
pub(crate) use migrate::migrate;
pub use offline::fold_offline;
pub(crate) use plan::oldest_pending;
pub use plan::{plan, FoldPlan};

pub use policy::Policies;
pub(crate) use recover::recover;
pub(crate) use redeliver::redeliver;
pub(crate) use report::Report;
pub(crate) use task::{CutRequest, Duty, FoldLoop, FoldTask, FreezeCut, FromFold};
pub use write::COMPACT_FRAGMENTS;

/// How many times a publish may find the head moved (and re-check) before
/// the fold gives up.
const MOVES: usize = 8;

/// A published fold: its commit, and its rejects (now in `_ingest_rejects`),
/// which the caller delivers to the dead-letter topic.
#[derive(Debug)]
pub struct Folded {
    pub commit: GraphCommit,
    pub rejects: Vec<Reject>,
    /// Where the fold's wall time went.
    pub stages: StageTimes,
}

/// Wall time of each phase of one fold, in seconds: the fold loop's (`cut`,
/// `plan`, `dead_letters`) and `execute`'s. They add up to the fold's wall
/// time; exported as `graphsink_fold_phase_seconds` and in the fold's log
/// line, and read by the bench.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct StageTimes {
    /// The cut: the run loop's freeze of the memtables and the wait for
    /// their flushes.
    pub cut: f64,
    /// The head and the plan (under partition sharding, a new folder's
    /// recovery too).
    pub plan: f64,
    /// Reading the planned generations (`read`).
    pub read: f64,
    /// Reading the base view the checks need (`checks::read_view`).
    pub view: f64,
    /// The checks themselves, on what was read.
    pub check: f64,
    /// The delete and upsert passes (the merge into the base tables).
    pub write: f64,
    /// In-fold compaction of small fragments.
    pub compact: f64,
    /// The id index kept current (`index`).
    pub index: f64,
    /// The graph commit (with any re-check on a moved head).
    pub publish: f64,
    /// The fold's rejects handed to the dead-letter topic, and the mark.
    pub dead_letters: f64,
}

impl StageTimes {
    /// Each phase by its name in `graphsink_fold_phase_seconds`.
    pub fn phases(&self) -> [(&'static str, f64); 10] {
        [
            ("cut", self.cut),
            ("plan", self.plan),
            ("read", self.read),
            ("view", self.view),
            ("check", self.check),
            ("write", self.write),
            ("compact", self.compact),
            ("index", self.index),
            ("publish", self.publish),
            ("dead_letters", self.dead_letters),
        ]
    }
}

/// Executes a plan: read → check → write → publish. Idempotent: tables
/// whose last pass of this plan is committed are not written again.
pub async fn execute(graph: &Graph, policies: &Policies, plan: &FoldPlan) -> PublicResult<Folded> {
    // The policies the plan was made under, whoever executes it: a
    // roll-forward that decided otherwise would skip the tables the
    // interrupted attempt wrote (its `_ingest_rejects` among them) and
    // write the rest by another decision, losing the rejects in between.
    let policies = plan.policies(policies);
    let policies: &Policies = &policies;
    let mut stages = StageTimes::default();
    let mut clock = std::time::Instant::now();
    let mut lap = |slot: &mut f64| {
        *slot = clock.elapsed().as_secs_f64();
        clock = std::time::Instant::now();
    };
    let read = read::read_plan(graph, plan).await?;
    lap(&mut stages.read);
    let view = checks::read_view(
        graph,
        &policies.known_ids,
        &plan.base,
        &plan.retry_pending,
        &read,
    )
    .await?;
    lap(&mut stages.view);
    let checked = check_with(graph, policies, plan, &read, &view)?;
    lap(&mut stages.check);
    let rejects: Vec<Reject> = checked
        .rejections
        .iter()
        .map(|r| r.to_reject(&plan.commit_id, plan.created_at))
        .collect::<Result<_>>()?;
    if policies.tolerance == Tolerance::None {
        if let Some(r) = rejects.first() {
            return Err(r.intolerable().into());
        }
    }
    // A record read again after a crash is folded again, into a later
    // commit, and refused under the same reject id: the first commit's row
    // and its dead-letter delivery stand, so the id is delivered once.
    let rejects = rows::unrecorded(graph, &plan.base, rejects).await?;
    // Kept (batches are shared, not copied) for a re-check on a moved head;
    // its id sets are built only then, not on every fold.
    let changes = write::with_rejects(checked.changes.clone(), plan, &read, &rejects)?;
    let outcomes = write::write_all(graph, &policies.known_ids, plan, changes, &mut stages).await?;
    lap(&mut stages.write);
    // `write_all` timed its compactions and index updates on their own.
    stages.write = (stages.write - stages.compact - stages.index).max(0.0);
    failpoints::hit(failpoints::FOLD_BEFORE_PUBLISH)?;
    let commit = publish_checked(graph, policies, plan, &read, &checked, &outcomes).await?;
    lap(&mut stages.publish);
    Ok(Folded {
        commit,
        rejects,
        stages,
    })
}

/// Reads the base view at `base` and runs the checks on `read`.
async fn check_on(
    graph: &Graph,
    policies: &Policies,
    plan: &FoldPlan,
    read: &ReadSet,
    base: &std::collections::BTreeMap<String, u64>,
) -> Result<Checked> {
    let view =
        checks::read_view(graph, &policies.known_ids, base, &plan.retry_pending, read).await?;
    check_with(graph, policies, plan, read, &view)
}

/// Runs the checks on `read` over a base view already read.
fn check_with(
    graph: &Graph,
    policies: &Policies,
    plan: &FoldPlan,
    read: &ReadSet,
    view: &checks::BaseView,
) -> Result<Checked> {
    checks::check(&Ctx {
        schema: &graph.schema,
        policies,
        now: plan.created_at,
        retry_pending: &plan.retry_pending,
        read,
        view,
    })
}

/// Publishes, re-checking on a moved head. The fold's tables are written
/// already, so a rebase is sound only if the checks, run against the new
/// head, decide exactly what they decided against the parent: then the
/// written rows are what a fold planned on the new head would have written.
/// Otherwise the publish is refused (`rebase`), loudly: the unpublished
/// fold stays behind the head's pins, where `recover` meets it again.
async fn publish_checked(
    graph: &Graph,
    policies: &Policies,
    plan: &FoldPlan,
    read: &ReadSet,
    checked: &Checked,
    outcomes: &write::Outcomes,
) -> Result<GraphCommit> {
    let mut checked_on = plan.parent.clone();
    let mut decision: Option<Decision> = None;
    for _ in 0..MOVES {
        let head = match publish::publish(graph, plan, outcomes, &checked_on).await? {
            Published::Done(commit) => return Ok(commit),
            Published::Moved(head) => head,
        };
        let again = check_on(graph, policies, plan, read, &head.tables).await?;
        let before = match decision.take() {
            Some(d) => d,
            None => checked.decision()?,
        };
        let after = again.decision()?;
        rebase(&checked_on, &head, &before, &after)?;
        decision = Some(after);
        tracing::warn!(expected = %checked_on, found = %head.id, "head moved before publish; the checks agree on the new head, rebasing");
        checked_on = head.id;
    }
    Err(Error::CommitConflict {
        expected: checked_on,
        found: "a head that keeps moving".into(),
    })
}

/// Whether a fold checked against `checked_on` may rebase onto `head`:
/// only when the re-check against `head` decided the same.
fn rebase(checked_on: &str, head: &GraphCommit, before: &Decision, after: &Decision) -> Result<()> {
    if before == after {
        return Ok(());
    }
    tracing::error!(expected = %checked_on, found = %head.id, "head moved before publish and the checks disagree on the new head; refusing to publish");
    Err(Error::CommitConflict {
        expected: checked_on.to_string(),
        found: head.id.clone(),
    })
}
