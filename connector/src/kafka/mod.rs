//! All librdkafka plumbing, for the run loop and the CLI alike: client
//! configs, the group consumer, the dead-letter producer, reject → record,
//! topic creation, offset queries, and what the cluster's refusals (an
//! ACL, the credentials) are called (`denied`). It decides nothing about
//! durability (`offsets`), rejects (`decode`, `validate`, `fold`) or the
//! graph (`graph`).

pub(crate) mod admin;
pub(crate) mod client;
pub(crate) mod client_log;
pub(crate) mod consumer;
pub(crate) mod dead_letters;
pub(crate) mod delivered;
pub(crate) mod denied;
pub(crate) mod produce;
pub(crate) mod queries;
pub(crate) mod record;
pub(crate) mod stall;

pub(crate) use dead_letters::DeadLetters;
pub(crate) use queries::{partition_counts, OffsetQueries};

use tokio::runtime::{Handle, RuntimeFlavor};

/// Runs a blocking librdkafka call from async code without stalling the
/// other tasks of a runtime worker: `block_in_place` hands them to another
/// worker first. On a current-thread runtime (where `block_in_place`
/// panics) or outside any runtime, the call runs inline.
pub(crate) fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::blocking;

    #[test]
    fn blocking_runs_outside_a_runtime() {
        assert_eq!(blocking(|| 7), 7);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn blocking_runs_inline_on_a_current_thread_runtime() {
        assert_eq!(blocking(|| 7), 7);
    }

    /// On the only worker, another task still runs while the call blocks
    /// (without `block_in_place` it would wait behind the blocked worker).
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn blocking_frees_the_worker_on_a_multi_thread_runtime() {
        let (tx, rx) = std::sync::mpsc::channel();
        let worker = tokio::spawn(async move {
            blocking(|| rx.recv_timeout(std::time::Duration::from_secs(5)).is_ok())
        });
        let other = tokio::spawn(async move {
            let _ = tx.send(());
        });
        assert!(worker.await.unwrap(), "the other task ran meanwhile");
        other.await.unwrap();
    }
}
