//! The phases, one file each, and the crash windows they aim at; the
//! `cluster` set in `cluster/`.

pub(crate) mod cluster;
mod disk;
mod kills;
mod members;
mod migrate;
mod outage;

use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;

use crate::check::Res;
use crate::report::PhaseReport;
use crate::stage::Env;
use outage::Outage;

/// The single-broker phases, in the order a full run takes them.
pub(crate) const SINGLE: &[&str] = &[
    "kills",
    "freeze",
    "dead-letters",
    "restarts",
    "disk",
    "members",
    "migrate",
];

/// The crash windows graphsink names (docs/ARCHITECTURE.md, "Failpoints").
/// A test below keeps this list and that table the same.
const FAILPOINTS: &[&str] = &[
    "fold.before_publish",
    "fold.between_passes",
    "fold.before_dead_letters",
    "fold.before_delivered_mark",
    "fold.dead_letters_before_produce",
    "fold.dead_letters_before_commit",
    "commit.before",
    "commit.after",
    "rejects.before_dead_letters",
    "rejects.after_dead_letters",
    "revoke.before_commit",
    "revoke.after_commit",
    "drain.before_commit",
    "drain.before_fold",
    "drain.before_close",
    "gc.wal_partial",
    "gc.after_wal",
    "gc.after_trim",
    "gc.generation_partial",
    "gc.after_generations",
    "gc.versions_partial",
    "gc.after_versions",
];

/// The crash windows of a schema change (`migrate`), aimed at by the
/// `migrate` phase only: nothing else reaches them.
const MIGRATE_FAILPOINTS: &[&str] = &["migrate.after_table", "migrate.before_commit"];

/// Runs the phase named `phase` (`--phases`), filling `r`.
pub(crate) async fn run(env: &Env, phase: &str, seed: u64, r: &mut PhaseReport) -> Res<()> {
    match phase {
        "kills" => kills::kills(env, seed, r).await,
        "freeze" => outage::outage(env, seed, Outage::Freeze, r).await,
        "dead-letters" => outage::outage(env, seed, Outage::DeadLetters, r).await,
        "restarts" => outage::outage(env, seed, Outage::Restarts, r).await,
        "disk" => disk::disk(env, seed, r).await,
        "members" => members::members(env, seed, r).await,
        "migrate" => migrate::migrate(env, seed, r).await,
        other => Err(format!("unknown phase {other}")),
    }
}

/// A moment between `lo` and `hi` seconds from now, chosen by `rng`.
fn secs(rng: &mut StdRng, lo: f64, hi: f64) -> Duration {
    Duration::from_secs_f64(rng.random_range(lo..hi))
}

#[cfg(test)]
mod tests {
    /// The failpoints aimed at are the ones docs/ARCHITECTURE.md names.
    #[test]
    fn failpoints_match_the_architecture_page() {
        let doc = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/ARCHITECTURE.md"
        ))
        .unwrap();
        let section = doc
            .split("## Failpoints")
            .nth(1)
            .unwrap()
            .split("\n## ")
            .next()
            .unwrap();
        let mut named: Vec<&str> = Vec::new();
        for line in section.lines().filter(|l| l.starts_with("| `")) {
            let cell = line.split('|').nth(1).unwrap();
            named.extend(cell.split('`').skip(1).step_by(2));
        }
        let mut ours = super::FAILPOINTS.to_vec();
        ours.extend(super::MIGRATE_FAILPOINTS);
        ours.sort();
        named.sort();
        assert_eq!(ours, named);
    }
}
