//! Named failpoints at each crash window. Armed by the environment variable
//! `GRAPHSINK_FAILPOINTS="name=action,..."` (action `abort` kills the process
//! on the spot, like `kill -9`; `error` returns an error; `abort@N` aborts at
//! the Nth hit, so a chaos run reaches a window later than its first pass;
//! `error_once` returns an error at the first hit only; `stop` freezes the
//! whole process with SIGSTOP, once, as a paused VM or a
//! long GC would, until someone sends SIGCONT)
//! or by `arm` in tests. Unarmed, a failpoint costs one atomic load.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::error::{Error, Result};

/// After every table commit of a fold, before its graph commit is published.
pub(crate) const FOLD_BEFORE_PUBLISH: &str = "fold.before_publish";
/// After a table's first commit of a fold (its delete pass under
/// merge-insert, its one write by address), before the rest of the fold.
pub(crate) const FOLD_BETWEEN_PASSES: &str = "fold.between_passes";
/// After a fold's publish, before its rejects are produced to the dead-letter topic.
pub(crate) const FOLD_BEFORE_DEAD_LETTERS: &str = "fold.before_dead_letters";

/// Durable records acknowledged (watermarks advanced), before the offset commit.
pub(crate) const COMMIT_BEFORE: &str = "commit.before";
/// Offsets committed, before the run loop goes on.
pub(crate) const COMMIT_AFTER: &str = "commit.after";
/// A poll's sync rejects are queued to the rejects WAL, before the dead-letter produce.
pub(crate) const REJECTS_BEFORE_DEAD_LETTERS: &str = "rejects.before_dead_letters";
/// A poll's sync rejects were acknowledged by the dead-letter topic, before
/// the poll's ack.
pub(crate) const REJECTS_AFTER_DEAD_LETTERS: &str = "rejects.after_dead_letters";
/// In the revoke callback, before the revoked partitions' offsets are committed.
pub(crate) const REVOKE_BEFORE_COMMIT: &str = "revoke.before_commit";
/// In the revoke callback, after the commit, before the run loop hears of it.
pub(crate) const REVOKE_AFTER_COMMIT: &str = "revoke.after_commit";
/// Shutdown: in-flight durability awaited, before the final sync commit.
pub(crate) const DRAIN_BEFORE_COMMIT: &str = "drain.before_commit";
/// Shutdown: committed, before the final fold.
pub(crate) const DRAIN_BEFORE_FOLD: &str = "drain.before_fold";
/// Shutdown: the final fold done, before the writers are closed.
pub(crate) const DRAIN_BEFORE_CLOSE: &str = "drain.before_close";
/// After a fold's rejects were produced, before the delivery mark is written.
pub(crate) const FOLD_BEFORE_DELIVERED_MARK: &str = "fold.before_delivered_mark";
/// Fold rejects read back from the dead-letter topic, before the rest are
/// produced (in a transaction, or plainly without transactions).
pub(crate) const FOLD_DEAD_LETTERS_BEFORE_PRODUCE: &str = "fold.dead_letters_before_produce";
/// Fold rejects produced inside their transaction, before it is committed
/// (`error` here fails the commit: the round is redone after a re-init).
pub(crate) const FOLD_DEAD_LETTERS_BEFORE_COMMIT: &str = "fold.dead_letters_before_commit";

/// Retention, after its first WAL entry delete (a step cut short).
pub(crate) const GC_WAL_PARTIAL: &str = "gc.wal_partial";
/// Retention, after the WAL step.
pub(crate) const GC_AFTER_WAL: &str = "gc.after_wal";
/// Retention, after shard manifests are trimmed, before any generation is deleted.
pub(crate) const GC_AFTER_TRIM: &str = "gc.after_trim";
/// Retention, after the first file of a generation directory is deleted.
pub(crate) const GC_GENERATION_PARTIAL: &str = "gc.generation_partial";
/// A schema change, after one table is altered or created, before the rest
/// (`graph/migrate.rs`).
pub(crate) const MIGRATE_AFTER_TABLE: &str = "migrate.after_table";
/// A schema change, every table altered or created, before the schema
/// commit.
pub(crate) const MIGRATE_BEFORE_COMMIT: &str = "migrate.before_commit";
/// Retention, after the generation step.
pub(crate) const GC_AFTER_GENERATIONS: &str = "gc.after_generations";
/// Retention, after the first table's old versions are cleaned.
pub(crate) const GC_VERSIONS_PARTIAL: &str = "gc.versions_partial";
/// Retention, after every table's old versions are cleaned.
pub(crate) const GC_AFTER_VERSIONS: &str = "gc.after_versions";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Abort,
    Error,
    /// Abort at the Nth hit (1 = the first).
    AbortAt(u32),
    /// SIGSTOP to the whole process at the first hit; later hits pass.
    Stop,
    /// An error at the first hit; later hits pass.
    ErrorOnce,
}

static ANY_ARMED: AtomicBool = AtomicBool::new(false);
static ARMED: OnceLock<Mutex<HashMap<String, Action>>> = OnceLock::new();

fn parse(action: &str) -> Action {
    match action {
        "error" => Action::Error,
        "stop" => Action::Stop,
        "error_once" => Action::ErrorOnce,
        a => match a.strip_prefix("abort@").and_then(|n| n.parse().ok()) {
            Some(n) => Action::AbortAt(n),
            None => Action::Abort,
        },
    }
}

fn armed() -> &'static Mutex<HashMap<String, Action>> {
    ARMED.get_or_init(|| {
        let mut map = HashMap::new();
        if let Ok(spec) = std::env::var("GRAPHSINK_FAILPOINTS") {
            for item in spec.split(',').filter(|s| !s.is_empty()) {
                let (name, action) = item.split_once('=').unwrap_or((item, "abort"));
                map.insert(name.to_string(), parse(action));
            }
        }
        if !map.is_empty() {
            ANY_ARMED.store(true, Ordering::SeqCst);
        }
        Mutex::new(map)
    })
}

/// Arms a failpoint in this process (tests).
pub fn arm(name: &str, action: Action) {
    armed()
        .lock()
        .expect("failpoints")
        .insert(name.to_string(), action);
    ANY_ARMED.store(true, Ordering::SeqCst);
}

pub fn disarm(name: &str) {
    armed().lock().expect("failpoints").remove(name);
}

/// Passes unless `name` is armed.
pub(crate) fn hit(name: &'static str) -> Result<()> {
    if !ANY_ARMED.load(Ordering::Relaxed) && ARMED.get().is_some() {
        return Ok(());
    }
    let action = {
        let mut map = armed().lock().expect("failpoints");
        match map.get_mut(name) {
            Some(Action::AbortAt(n)) if *n > 1 => {
                *n -= 1;
                return Ok(());
            }
            Some(a @ (Action::Stop | Action::ErrorOnce)) => {
                let a = *a;
                map.remove(name);
                Some(a)
            }
            a => a.copied(),
        }
    };
    match action {
        None => Ok(()),
        Some(Action::Error | Action::ErrorOnce) => Err(Error::Failpoint(name)),
        Some(Action::Abort | Action::AbortAt(_)) => {
            eprintln!("graphsink: failpoint {name} fired: aborting");
            std::process::abort()
        }
        Some(Action::Stop) => {
            eprintln!("graphsink: failpoint {name} fired: stopping (SIGSTOP) until SIGCONT");
            // SAFETY: raise(3) with a constant signal touches no memory.
            unsafe { libc::raise(libc::SIGSTOP) };
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_parse() {
        assert_eq!(parse("abort"), Action::Abort);
        assert_eq!(parse("error"), Action::Error);
        assert_eq!(parse("abort@3"), Action::AbortAt(3));
        assert_eq!(parse("abort@x"), Action::Abort);
        assert_eq!(parse("stop"), Action::Stop);
        assert_eq!(parse("error_once"), Action::ErrorOnce);
    }

    #[test]
    fn abort_at_n_passes_the_first_hits() {
        const FP: &str = "test.abort_at";
        arm(FP, Action::AbortAt(3));
        assert!(hit(FP).is_ok());
        assert!(hit(FP).is_ok());
        // The third would abort; the counter says it is next.
        assert_eq!(
            armed().lock().unwrap().get(FP).copied(),
            Some(Action::AbortAt(1))
        );
        disarm(FP);
    }
}
