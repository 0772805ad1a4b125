//! The fold-reject producer: transactional, one `transactional.id` per
//! graph, so a new folder's `InitProducerId` fences the one before it and
//! aborts its open transaction. A broker without transactions falls back
//! to the read-back rule (said once, at ERROR); a broker that refuses the
//! `transactional.id` (an ACL) is no such broker: that refusal stops the
//! run (`denied`, docs/security.md).

use std::collections::HashSet;
use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, Producer};
use tokio_util::sync::CancellationToken;

use super::delivery::Delivery;
use super::{DeadLetters, Held};
use crate::error::{Error, ErrorKind, Result};
use crate::kafka::client_log::ClientLog;
use crate::kafka::denied::Refused;
use crate::rejects::Reject;
use crate::types::PartitionOffsets;

/// How long one transaction call (init, commit, abort) may take.
const TXN_TIMEOUT: Duration = Duration::from_secs(30);

/// The fold-reject producer's `transactional.id` for a graph: one per
/// graph, so each new folder fences the one before it. Derived from the
/// root, which names the graph, in one spelling (`canonical_root`): two
/// members that spell it differently must still fence each other.
pub(crate) fn fold_transactional_id(graph_root: &str) -> String {
    let root = crate::config::canonical_root(graph_root);
    let id = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_URL, root.as_bytes());
    format!("graphsink-fold-{id}")
}

/// How fold rejects reach the topic once.
pub(super) enum FoldMode {
    /// Transactions are wanted; the producer is made and initialised at the
    /// first fold delivery (or when this process becomes the folder).
    Uninitialised,
    /// An initialised transactional producer: it fenced every older folder.
    Transactional(FutureProducer<ClientLog>),
    /// The read-back rule alone: `errors.dead_letter_transactions = false`,
    /// or a broker that refused transactions (said once).
    ReadBack,
}

impl DeadLetters {
    /// Fold rejects, exactly once: each round inits the transactional
    /// producer if it is not (fencing older folders, aborting their open
    /// transaction), reads back what the topics hold committed at or past
    /// `since` and skips it, then produces the rest in one transaction. A
    /// failed round aborts (an unclear commit re-inits, which settles it)
    /// and is retried with backoff; a fenced producer stops: another
    /// process folds now.
    pub(super) async fn deliver_in_transactions(
        &self,
        fold: &mut FoldMode,
        rejects: &[Reject],
        since: &PartitionOffsets,
        stop: &CancellationToken,
    ) -> Result<()> {
        let mut todo: Vec<&Reject> = rejects.iter().collect();
        let mut delivery = Delivery::new(&self.metrics, todo.len());
        let mut delay = Duration::from_millis(100);
        let mut held = Held {
            from: since.clone(),
            ids: HashSet::new(),
            warned: false,
        };
        loop {
            let failure = match self.transactional(fold).await {
                Ok(None) => {
                    // The broker refused transactions: read-back from here on.
                    drop(delivery);
                    return self.deliver_read_back(rejects, Some(since), stop).await;
                }
                Err(e) if e.kind() == ErrorKind::NotAuthorized => return Err(e),
                Err(e) => {
                    delivery.round(0, todo.len(), false);
                    format!("cannot start the transactional producer: {e}")
                }
                Ok(Some(producer)) => match self.skip_delivered(&mut todo, Some(&mut held)).await {
                    Err(e) if e.kind() == ErrorKind::NotAuthorized => return Err(e),
                    Err(e) => {
                        delivery.round(0, todo.len(), false);
                        format!("cannot read what the topic holds: {e}")
                    }
                    Ok(skipped) => {
                        delivery.skipped(skipped);
                        if todo.is_empty() {
                            return Ok(());
                        }
                        crate::failpoints::hit(
                            crate::failpoints::FOLD_DEAD_LETTERS_BEFORE_PRODUCE,
                        )?;
                        match self.transaction(&producer, &todo).await {
                            Ok(()) => {
                                delivery.round(todo.len(), 0, true);
                                return Ok(());
                            }
                            Err(f) => {
                                delivery.round(0, todo.len(), true);
                                if f.fenced {
                                    *fold = FoldMode::Uninitialised;
                                    return Err(Error::ProducerFenced {
                                        transactional_id: self.transactional_id().to_string(),
                                        reason: f.error,
                                    });
                                }
                                if let Some(r) = f.refused {
                                    *fold = FoldMode::Uninitialised;
                                    return Err(self.denied(r, self.topic_for(todo[0]), true));
                                }
                                if f.reinit {
                                    *fold = FoldMode::Uninitialised;
                                }
                                f.error
                            }
                        }
                    }
                },
            };
            tracing::warn!(
                topic = %self.topic_for(todo[0]), rejects = todo.len(), error = %failure,
                "fold-reject transaction failed; retrying (the commit's delivery mark waits)"
            );
            if stop.is_cancelled() {
                return Err(Error::DeadLetter {
                    topic: self.topic_for(todo[0]).to_string(),
                    reason: format!("stopped before delivering fold rejects: {failure}"),
                });
            }
            self.back_off(&mut delay, stop).await?;
        }
    }

    /// When this process becomes the graph's folder: init the fold-reject
    /// producer now, so an older folder's open transaction is aborted (and
    /// the older folder fenced) before anything is re-delivered, instead of
    /// at the first fold with rejects. Errors are retried by that fold;
    /// a refusal waits for the run loop (`DeadLetters::refused`), so a
    /// missing ACL shows at the start, not at the first fold reject.
    /// In the background: a dead-letter cluster that is down must not hold
    /// the start (a delivery waits for it on the same lock).
    pub(crate) fn fence_older_folders(&self) {
        let me = self.clone();
        tokio::spawn(async move {
            let mut fold = me.fold.lock().await;
            match me.transactional(&mut fold).await {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::NotAuthorized => me.refused_meanwhile(e),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot init the fold-reject producer yet; the first fold delivery retries")
                }
            }
        });
    }

    /// The initialised transactional producer; `None` once the broker
    /// refused transactions (the read-back rule from then on, said once).
    /// A refused `transactional.id` is `Error::NotAuthorized`.
    async fn transactional(
        &self,
        fold: &mut FoldMode,
    ) -> Result<Option<FutureProducer<ClientLog>>> {
        let cc = match fold {
            FoldMode::Transactional(p) => return Ok(Some(p.clone())),
            FoldMode::ReadBack => return Ok(None),
            FoldMode::Uninitialised => &self.fold_client,
        };
        let id = self.transactional_id().to_string();
        if cc.get("enable.idempotence").map(str::trim) == Some("false") {
            // A user who turns idempotence off says the broker has no
            // `InitProducerId` (librdkafka refuses a transactional producer
            // without it): no transactions either.
            tracing::error!(transactional_id = %id, "errors.producer sets enable.idempotence = false, which transactions need: fold rejects fall back to the read-back rule (exactly once across crashes, at least once across a frozen folder's late produce); set errors.dead_letter_transactions = false to say so in the config");
            *fold = FoldMode::ReadBack;
            return Ok(None);
        }
        let producer: FutureProducer<ClientLog> =
            cc.create_with_context(ClientLog::noting(self.clients_saw.clone()))?;
        let p = producer.clone();
        let init = tokio::task::spawn_blocking(move || p.init_transactions(TXN_TIMEOUT))
            .await
            .map_err(|e| Error::joined("fold-reject producer init", e))?;
        let e = match init {
            Ok(()) => {
                tracing::info!(transactional_id = %id, "fold-reject producer initialised: any older folder is fenced and its open transaction aborted");
                *fold = FoldMode::Transactional(producer.clone());
                return Ok(Some(producer));
            }
            Err(e) => e,
        };
        // Before the fallback: an ACL refusal is no missing feature.
        if let Some(r) = self.producer_refusal(&producer, Some(&e)) {
            return Err(self.denied(r, &self.topics().join(", "), true));
        }
        if refuses_transactions(&e) {
            tracing::error!(transactional_id = %id, error = %e, "the dead-letter broker does not support transactions: fold rejects fall back to the read-back rule (exactly once across crashes, at least once across a frozen folder's late produce); set errors.dead_letter_transactions = false to say so in the config");
            *fold = FoldMode::ReadBack;
            return Ok(None);
        }
        Err(Error::Broker(format!(
            "kafka: cannot init the fold-reject producer {id}: {e}"
        )))
    }

    /// One transaction: begin, produce every reject, commit. A failed
    /// produce aborts it (what landed is never visible to read_committed
    /// readers); a commit that fails asks for a re-init, which completes or
    /// aborts it at the coordinator before anything else is produced.
    async fn transaction(
        &self,
        producer: &FutureProducer<ClientLog>,
        todo: &[&Reject],
    ) -> std::result::Result<(), TxnFailure> {
        let p = producer.clone();
        blocking(move || p.begin_transaction()).await?;
        let failed = self.send_all(producer, todo).await;
        if let Some(f) = failed.first() {
            let error = format!(
                "{} of {} produces failed: {}",
                failed.len(),
                todo.len(),
                f.error
            );
            let refused = failed.iter().find_map(|f| f.refused);
            let p = producer.clone();
            return match blocking(move || p.abort_transaction(TXN_TIMEOUT)).await {
                Ok(()) => Err(TxnFailure {
                    error,
                    reinit: false,
                    fenced: is_fenced(producer),
                    refused,
                }),
                Err(a) => Err(TxnFailure {
                    error: format!("{error}; abort: {}", a.error),
                    reinit: true,
                    fenced: a.fenced,
                    refused: refused.or(a.refused),
                }),
            };
        }
        crate::failpoints::hit(crate::failpoints::FOLD_DEAD_LETTERS_BEFORE_COMMIT).map_err(
            |e| TxnFailure {
                error: e.to_string(),
                reinit: true,
                fenced: false,
                refused: None,
            },
        )?;
        let p = producer.clone();
        blocking(move || p.commit_transaction(TXN_TIMEOUT))
            .await
            .map_err(|f| TxnFailure { reinit: true, ..f })
    }
}

/// A failed transaction round.
struct TxnFailure {
    error: String,
    /// The producer's state is unclear (a failed commit or abort): make a
    /// new one, whose init settles the open transaction.
    reinit: bool,
    /// A newer folder fenced this producer.
    fenced: bool,
    /// The cluster refused it: the delivery stops (`denied`).
    refused: Option<Refused>,
}

/// A blocking transaction call, off the async workers.
async fn blocking(
    f: impl FnOnce() -> rdkafka::error::KafkaResult<()> + Send + 'static,
) -> std::result::Result<(), TxnFailure> {
    let outcome = tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| TxnFailure {
            error: format!("transaction task: {e}"),
            reinit: true,
            fenced: false,
            refused: None,
        })?;
    outcome.map_err(|e| TxnFailure {
        fenced: is_fenced_error(&e),
        refused: Refused::of(&e),
        reinit: !matches!(&e, KafkaError::Transaction(t) if t.txn_requires_abort() || t.is_retriable()),
        error: e.to_string(),
    })
}

fn code_of(e: &KafkaError) -> Option<RDKafkaErrorCode> {
    match e {
        KafkaError::Transaction(t) => Some(t.code()),
        other => other.rdkafka_error_code(),
    }
}

fn is_fenced_error(e: &KafkaError) -> bool {
    matches!(
        code_of(e),
        Some(
            RDKafkaErrorCode::Fenced
                | RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::InvalidProducerEpoch
        )
    )
}

/// A producer whose fatal error says a newer instance fenced it.
fn is_fenced(producer: &FutureProducer<ClientLog>) -> bool {
    matches!(
        producer.client().fatal_error(),
        Some((
            RDKafkaErrorCode::Fenced
                | RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::InvalidProducerEpoch,
            _
        ))
    )
}

/// An init refused because the broker has no transactions (too old, or a
/// broker such as tansu 0.6 that does not implement them), not because it
/// is unreachable.
fn refuses_transactions(e: &KafkaError) -> bool {
    matches!(
        code_of(e),
        Some(
            RDKafkaErrorCode::UnsupportedVersion
                | RDKafkaErrorCode::UnsupportedFeature
                | RDKafkaErrorCode::UnsupportedForMessageFormat
                | RDKafkaErrorCode::InvalidRequest
        )
    )
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::fold_transactional_id;
    use crate::config::resolve_uri;

    /// Two spellings of one root give one `transactional.id`, or two
    /// folders of one graph would not fence each other and a frozen one's
    /// late produce would show a reject twice.
    #[test]
    fn one_root_spelled_any_way_gives_one_transactional_id() {
        let base = Path::new("/srv/gs");
        let id = |root: &str| fold_transactional_id(&resolve_uri(root, base));
        let one = id("/srv/gs/graph");
        for root in [
            "graph",
            "./graph",
            "graph/",
            "./graph/.",
            "/srv/gs/graph/",
            "/srv/gs/x/../graph",
            "file:///srv/gs/graph",
            "file:///srv/gs/graph/",
            "file:///srv/gs/./graph",
        ] {
            assert_eq!(id(root), one, "{root}");
        }
        assert_ne!(id("/srv/gs/other"), one);
        assert_eq!(id("s3://bucket/g/"), id("s3://bucket/./g"));
        assert_ne!(id("s3://bucket/g"), one);
    }
}
