//! The process's tokio runtime. The run loop is the future `block_on`
//! drives, so it runs on the main thread; everything it spawns (MemWAL
//! index apply, WAL and flush writes, the fold, the HTTP endpoint) runs on
//! the workers and the blocking pool. Those threads get a lower priority,
//! so a burst of background work cannot keep the one-task run loop, the
//! ingest's critical path, waiting for a core (docs/decisions/0008-thread-priority.md).

use crate::config::RuntimeSettings;

/// A multi-thread runtime whose worker and blocking threads run
/// `settings.background_nice` nice levels below the thread that builds it
/// (at most 19). Threads those threads start inherit it
/// (Lance's CPU pool when a worker starts it first); the main thread and
/// librdkafka's threads (started from it) keep the process's priority.
pub fn build(settings: &RuntimeSettings) -> std::io::Result<tokio::runtime::Runtime> {
    let nice = settings.background_nice;
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if nice != 0 {
        builder.on_thread_start(move || lower_this_thread(nice));
    }
    builder.build()
}

/// Raises the calling thread's nice value by `by` (lower priority). On
/// Linux, nice is per thread: `setpriority(PRIO_PROCESS, tid)` changes only
/// that thread, and a new thread starts with its creator's value. Lowering
/// one's own priority needs no privilege; a failure (a seccomp policy, say)
/// leaves the thread at the process's priority, which is only slower, so
/// it is logged, not fatal.
#[cfg(target_os = "linux")]
fn lower_this_thread(by: i32) {
    let now = this_thread_nice();
    let nice = (now + by).min(19);
    // SAFETY: `gettid` and `setpriority` take and return plain integers;
    // no memory is shared with the callee, so no Rust invariant is at stake.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice) };
    if rc != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), nice, "cannot lower a runtime thread's priority");
    }
}

/// Elsewhere, nice is per process, so setting it would slow the run loop
/// too: the knob does nothing.
#[cfg(not(target_os = "linux"))]
fn lower_this_thread(_nice: i32) {}

/// The nice value of the calling thread. `getpriority` can only fail for
/// a bad `which`/`who`, and these are fixed and valid here, so its -1 is
/// always a real nice value.
#[cfg(target_os = "linux")]
fn this_thread_nice() -> i32 {
    // SAFETY: as above, integers only.
    unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn workers_and_blocking_threads_run_lower_and_the_main_thread_does_not() {
        let before = this_thread_nice();
        let rt = build(&RuntimeSettings { background_nice: 7 }).unwrap();
        let (worker, blocking, main) = rt.block_on(async {
            let worker = tokio::spawn(async { this_thread_nice() }).await.unwrap();
            let blocking = tokio::task::spawn_blocking(this_thread_nice).await.unwrap();
            (worker, blocking, this_thread_nice())
        });
        let lower = (before + 7).min(19);
        assert_eq!((worker, blocking), (lower, lower));
        assert_eq!(main, before, "block_on's thread keeps its priority");
        let off = build(&RuntimeSettings { background_nice: 0 }).unwrap();
        let worker =
            off.block_on(async { tokio::spawn(async { this_thread_nice() }).await.unwrap() });
        assert_eq!(worker, before);
    }
}
