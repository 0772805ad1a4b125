//! CPU per thread group over one phase, for issue 14's per-stage budget:
//! the measuring process's threads (the bench's, or its backlog child's) grouped by name (tokio workers, Lance's CPU
//! pool, librdkafka's threads, ...) and the broker's, read from
//! `/proc/<pid>/task/<tid>/schedstat`: nanoseconds on a CPU, and waiting
//! for one (runnable but not running: what a saturated machine costs a
//! thread). Linux only; elsewhere the table is empty.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

/// One thread group's share of a phase.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct GroupCpu {
    pub group: String,
    /// Seconds on a CPU.
    pub cpu_secs: f64,
    /// Seconds runnable but waiting for a CPU.
    pub wait_secs: f64,
    /// Threads seen.
    pub threads: usize,
}

#[derive(Clone, Copy, Default)]
struct Sched {
    run_ns: u64,
    wait_ns: u64,
}

/// Per-thread counters of the bench itself and (given) the broker.
pub(crate) struct ThreadCpu {
    broker: Option<u32>,
    start: HashMap<(u32, u64), (String, Sched)>,
    self_ticks: Option<u64>,
}

impl ThreadCpu {
    pub(crate) fn start(broker: Option<u32>) -> ThreadCpu {
        ThreadCpu {
            broker,
            start: snapshot(broker),
            self_ticks: crate::s3::cpu_ticks_self(),
        }
    }

    /// The groups, most CPU first. Threads of the bench that ended during
    /// the phase are one row, "(ended threads)": the process's total less
    /// its live threads (10 ms resolution).
    pub(crate) fn finish(&self) -> Vec<GroupCpu> {
        let end = snapshot(self.broker);
        let mut groups: BTreeMap<String, GroupCpu> = BTreeMap::new();
        let mut live_ns = 0u64;
        for (key, (name, now)) in &end {
            let before = self.start.get(key).map(|(_, s)| *s).unwrap_or_default();
            let run = now.run_ns.saturating_sub(before.run_ns);
            let wait = now.wait_ns.saturating_sub(before.wait_ns);
            if Some(key.0) != self.broker {
                live_ns += run;
            }
            let g = groups.entry(name.clone()).or_insert_with(|| GroupCpu {
                group: name.clone(),
                cpu_secs: 0.0,
                wait_secs: 0.0,
                threads: 0,
            });
            g.cpu_secs += run as f64 / 1e9;
            g.wait_secs += wait as f64 / 1e9;
            g.threads += 1;
        }
        if let Some((a, b)) = self.self_ticks.zip(crate::s3::cpu_ticks_self()) {
            let total = b.saturating_sub(a) as f64 / crate::s3::TICKS_PER_S;
            let ended = total - live_ns as f64 / 1e9;
            if ended > 0.01 {
                groups.insert(
                    "(ended threads)".into(),
                    GroupCpu {
                        group: "(ended threads)".into(),
                        cpu_secs: ended,
                        wait_secs: 0.0,
                        threads: 0,
                    },
                );
            }
        }
        let mut out: Vec<GroupCpu> = groups.into_values().filter(|g| g.cpu_secs > 0.0).collect();
        out.sort_by(|a, b| b.cpu_secs.total_cmp(&a.cpu_secs));
        out
    }
}

/// (pid, tid) → (group name, counters) for the bench and the broker.
fn snapshot(broker: Option<u32>) -> HashMap<(u32, u64), (String, Sched)> {
    let mut out = HashMap::new();
    let me = std::process::id();
    for pid in std::iter::once(me).chain(broker) {
        let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for t in dir.flatten() {
            let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<u64>().ok()) else {
                continue;
            };
            let path = t.path();
            let Some(sched) = std::fs::read_to_string(path.join("schedstat"))
                .ok()
                .and_then(|s| parse_schedstat(&s))
            else {
                continue;
            };
            let name = if pid == me {
                let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
                group_of(comm.trim())
            } else {
                "broker (all threads)".to_string()
            };
            out.insert((pid, tid), (name, sched));
        }
    }
    out
}

fn parse_schedstat(s: &str) -> Option<Sched> {
    let mut f = s.split_whitespace().map(|v| v.parse::<u64>().ok());
    Some(Sched {
        run_ns: f.next()??,
        wait_ns: f.next()??,
    })
}

/// A thread's group: its name without a trailing number (`rdk:broker12`,
/// `tokio-runtime-w`), so a pool is one row.
fn group_of(comm: &str) -> String {
    let g = comm.trim_end_matches(|c: char| c.is_ascii_digit() || c == '-' || c == '_' || c == '#');
    if g.is_empty() {
        comm.to_string()
    } else {
        g.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_group_by_name_and_schedstat_parses() {
        assert_eq!(group_of("rdk:broker12"), "rdk:broker");
        assert_eq!(group_of("tokio-runtime-w"), "tokio-runtime-w");
        assert_eq!(group_of("lance-cpu-1"), "lance-cpu");
        let s = parse_schedstat("123 456 7\n").unwrap();
        assert_eq!((s.run_ns, s.wait_ns), (123, 456));
        // This thread is on a CPU while it runs the test.
        let t = ThreadCpu::start(None);
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert!(x != 1);
        assert!(t.finish().iter().map(|g| g.cpu_secs).sum::<f64>() > 0.0);
    }
}
