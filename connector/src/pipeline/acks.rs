//! Polls in flight, finalized in poll order. Shaped like Vector's
//! `OrderedFinalizer` (`lib/vector-common/src/finalizer.rs`): each poll's
//! durability is a future, and the queue yields them in the order the
//! polls were taken, whatever order they become durable in. So a
//! partition's watermark only ever moves over records that are all
//! durable, and a committed offset never skips an undurable one. What a
//! durable poll does to the watermarks is `offsets::OffsetBook`'s.

use std::collections::VecDeque;
use std::time::Instant;

use futures::future::BoxFuture;
use futures::stream::FuturesOrdered;
use futures::StreamExt;

use crate::error::{Error, Result};
use crate::offsets::PollAck;

/// Writes of a poll that failed because another writer claimed their
/// shard: (table, shard, the fencing). Under partition sharding the shard
/// may have moved with its partition (`RunLoop::on_moved` decides).
pub(super) type Moved = Vec<(String, u32, Error)>;

/// A poll's durability: its ack once every write and reject is durable.
pub(super) type AckFuture = BoxFuture<'static, Result<(PollAck, Moved)>>;

/// A poll that became durable, in poll order.
pub(super) struct Durable {
    pub(super) ack: PollAck,
    pub(super) moved: Moved,
    /// When the poll was taken from the consumer (durable-ack latency).
    pub(super) taken: Instant,
}

pub(super) struct AckQueue {
    in_flight: FuturesOrdered<AckFuture>,
    /// When each in-flight poll was taken, in poll order.
    taken: VecDeque<Instant>,
}

impl AckQueue {
    pub(super) fn new() -> AckQueue {
        AckQueue {
            in_flight: FuturesOrdered::new(),
            taken: VecDeque::new(),
        }
    }

    /// Queues a poll taken at `taken` behind every poll before it.
    pub(super) fn push(&mut self, taken: Instant, durability: AckFuture) {
        self.in_flight.push_back(durability);
        self.taken.push_back(taken);
    }

    pub(super) fn len(&self) -> usize {
        self.in_flight.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.in_flight.is_empty()
    }

    /// The oldest poll's durability, once it and every poll before it are
    /// durable; `None` when nothing is in flight.
    pub(super) async fn next(&mut self) -> Option<Result<Durable>> {
        let resolved = self.in_flight.next().await?;
        let taken = self.taken.pop_front().expect("one taken time per poll");
        Some(resolved.map(|(ack, moved)| Durable { ack, moved, taken }))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::offsets::OffsetBook;
    use futures::FutureExt;
    use tokio::sync::oneshot;

    fn poll(offsets: &[(&str, i32, i64)]) -> PollAck {
        let mut ack = PollAck::default();
        for (t, p, o) in offsets {
            ack.record(t, *p, *o);
        }
        ack
    }

    /// A poll whose durability the test decides.
    fn pending(q: &mut AckQueue, ack: PollAck) -> oneshot::Sender<()> {
        let (tx, rx) = oneshot::channel::<()>();
        q.push(
            Instant::now(),
            async move {
                rx.await.map_err(|_| Error::Bug("dropped".into()))?;
                Ok((ack, Vec::new()))
            }
            .boxed(),
        );
        tx
    }

    #[tokio::test]
    async fn acks_resolve_in_poll_order_whatever_order_they_become_durable_in() {
        let book = OffsetBook::default();
        let mut q = AckQueue::new();
        let assigned: BTreeSet<_> = [("t".to_string(), 0)].into();
        let first = pending(&mut q, poll(&[("t", 0, 0), ("t", 0, 1)]));
        let second = pending(&mut q, poll(&[("t", 0, 2)]));
        let third = pending(&mut q, poll(&[("t", 0, 3)]));
        third.send(()).unwrap();
        second.send(()).unwrap();
        assert!(
            q.next().now_or_never().is_none(),
            "the first is not durable"
        );
        assert!(book.to_commit(&assigned).is_empty());
        first.send(()).unwrap();
        let mut seen = Vec::new();
        while let Some(d) = q.next().await {
            let d = d.unwrap();
            seen.push(book.durable(d.ack, &assigned));
        }
        let tp = ("t".to_string(), 0);
        assert_eq!(
            seen,
            vec![
                vec![(tp.clone(), 2)],
                vec![(tp.clone(), 3)],
                vec![(tp.clone(), 4)]
            ]
        );
        assert_eq!(
            book.to_commit_on_revoke(std::slice::from_ref(&tp)),
            vec![(tp.clone(), 4)]
        );
        assert_eq!(book.to_commit(&assigned), vec![(tp.clone(), 4)]);
        book.committed(&[(tp.clone(), 4)]);
        assert!(book.to_commit(&assigned).is_empty());
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn a_revoked_partition_takes_no_ack_and_a_failure_stays_in_its_place() {
        let book = OffsetBook::default();
        let mut q = AckQueue::new();
        let assigned: BTreeSet<_> = [("t".to_string(), 1)].into();
        let a = pending(&mut q, poll(&[("t", 0, 5), ("t", 1, 9)]));
        let b = pending(&mut q, poll(&[("t", 1, 10)]));
        drop(b); // this poll's durability fails
        a.send(()).unwrap();
        let d = q.next().await.unwrap().unwrap();
        assert_eq!(
            book.durable(d.ack, &assigned),
            vec![(("t".to_string(), 1), 10)]
        );
        assert_eq!(
            book.watermark(&("t".to_string(), 0)),
            None,
            "revoked: not applied"
        );
        assert!(q.next().await.unwrap().is_err());
        book.forget(&[("t".to_string(), 1)]);
        assert!(book.to_commit_on_revoke(&[("t".to_string(), 1)]).is_empty());
        assert!(book.watermarks().is_empty());
    }
}
