//! Named failpoints at each crash window. Armed by the environment variable
//! `GRAPHSINK_FAILPOINTS="name=action,..."` (action `abort` kills the process
//! on the spot, like `kill -9`; `error` returns an error) or by `arm` in
//! tests. Unarmed, a failpoint costs one atomic load.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::error::{Error, Result};

/// After every table commit of a fold, before its graph commit is published.
pub const FOLD_BEFORE_PUBLISH: &str = "fold.before_publish";
/// After a fold's delete pass, before its upsert pass.
pub const FOLD_BETWEEN_PASSES: &str = "fold.between_passes";
/// After a fold's publish, before its rejects are produced to the dead-letter topic.
pub const FOLD_BEFORE_DEAD_LETTERS: &str = "fold.before_dead_letters";

/// Retention, after its first WAL entry delete (a step cut short).
pub const GC_WAL_PARTIAL: &str = "gc.wal_partial";
/// Retention, after the WAL step.
pub const GC_AFTER_WAL: &str = "gc.after_wal";
/// Retention, after shard manifests are trimmed, before any generation is deleted.
pub const GC_AFTER_TRIM: &str = "gc.after_trim";
/// Retention, after the first file of a generation directory is deleted.
pub const GC_GENERATION_PARTIAL: &str = "gc.generation_partial";
/// Retention, after the generation step.
pub const GC_AFTER_GENERATIONS: &str = "gc.after_generations";
/// Retention, after the first table's old versions are cleaned.
pub const GC_VERSIONS_PARTIAL: &str = "gc.versions_partial";
/// Retention, after every table's old versions are cleaned.
pub const GC_AFTER_VERSIONS: &str = "gc.after_versions";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Abort,
    Error,
}

static ANY_ARMED: AtomicBool = AtomicBool::new(false);
static ARMED: OnceLock<Mutex<HashMap<String, Action>>> = OnceLock::new();

fn armed() -> &'static Mutex<HashMap<String, Action>> {
    ARMED.get_or_init(|| {
        let mut map = HashMap::new();
        if let Ok(spec) = std::env::var("GRAPHSINK_FAILPOINTS") {
            for item in spec.split(',').filter(|s| !s.is_empty()) {
                let (name, action) = item.split_once('=').unwrap_or((item, "abort"));
                let action = if action == "error" {
                    Action::Error
                } else {
                    Action::Abort
                };
                map.insert(name.to_string(), action);
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
pub fn hit(name: &'static str) -> Result<()> {
    if !ANY_ARMED.load(Ordering::Relaxed) && ARMED.get().is_some() {
        return Ok(());
    }
    let action = armed().lock().expect("failpoints").get(name).copied();
    match action {
        None => Ok(()),
        Some(Action::Error) => Err(Error::Failpoint(name)),
        Some(Action::Abort) => {
            eprintln!("graphsink: failpoint {name} fired: aborting");
            std::process::abort()
        }
    }
}
