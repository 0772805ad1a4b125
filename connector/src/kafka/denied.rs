//! Refusals: which librdkafka error codes mean that the cluster refused
//! graphsink a permission (an ACL) or its credentials, in Kafka's words,
//! and the `Error::NotAuthorized` made of one, which names what graphsink
//! needs in its own (`READ on topic people`). The callers know what they
//! asked for of which resource (`consumer::refusal` finds the topic a
//! group consumer's error does not name); this file knows the codes and
//! the words, and imports nothing else of `kafka`. Every refusal stops the
//! run (exit 5): docs/security.md.

use std::sync::atomic::{AtomicU8, Ordering};

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use crate::error::Error;

/// A refusal, by the kind of resource Kafka refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    Topic,
    Group,
    TransactionalId,
    Cluster,
    /// The credentials themselves (SASL).
    Credentials,
}

impl Refused {
    /// The refusal a librdkafka error code stands for, if it is one.
    pub(crate) fn of_code(code: RDKafkaErrorCode) -> Option<Refused> {
        use RDKafkaErrorCode as C;
        Some(match code {
            C::TopicAuthorizationFailed => Refused::Topic,
            C::GroupAuthorizationFailed => Refused::Group,
            C::TransactionalIdAuthorizationFailed => Refused::TransactionalId,
            C::ClusterAuthorizationFailed => Refused::Cluster,
            // The broker's answer, and librdkafka's own name for a failed
            // SASL handshake (what a wrong password gives a client).
            C::SaslAuthenticationFailed | C::Authentication => Refused::Credentials,
            _ => return None,
        })
    }

    /// The refusal a librdkafka error stands for, if it is one.
    pub(crate) fn of(e: &KafkaError) -> Option<Refused> {
        e.rdkafka_error_code().and_then(Refused::of_code)
    }

    /// Kafka's name of the refusal (its protocol error name).
    pub(crate) fn code(self) -> &'static str {
        match self {
            Refused::Topic => "TOPIC_AUTHORIZATION_FAILED",
            Refused::Group => "GROUP_AUTHORIZATION_FAILED",
            Refused::TransactionalId => "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
            Refused::Cluster => "CLUSTER_AUTHORIZATION_FAILED",
            Refused::Credentials => "SASL_AUTHENTICATION_FAILED",
        }
    }

    /// The run's error: graphsink `needs` this (its words), refused so.
    pub(crate) fn needs(self, needs: impl Into<String>) -> Error {
        Error::NotAuthorized {
            needs: needs.into(),
            code: self.code().to_string(),
        }
    }
}

/// The refusal a crate error carries, if it is one (a librdkafka error
/// that came through `?`).
pub(crate) fn refusal_in(e: &Error) -> Option<Refused> {
    match e {
        Error::Kafka(k) => Refused::of(k),
        _ => None,
    }
}

/// What graphsink needs, in its words (docs/security.md lists each).
pub(crate) fn read_topic(topic: &str) -> String {
    format!("READ on topic {topic}")
}

pub(crate) fn read_topics(topics: &[String]) -> String {
    match topics {
        [one] => read_topic(one),
        _ => format!("READ on topics {}", topics.join(", ")),
    }
}

pub(crate) fn read_group(group: &str) -> String {
    format!("READ on group {group}")
}

pub(crate) fn write_topic(topic: &str) -> String {
    format!("WRITE on topic {topic}")
}

pub(crate) fn create_topic(topic: &str) -> String {
    format!("CREATE on topic {topic} (or the topic created by an operator)")
}

pub(crate) fn write_transactional_id(id: &str) -> String {
    format!("WRITE on transactional id {id}")
}

/// Valid credentials for the client's SASL user; never the password.
pub(crate) fn credentials(username: Option<&str>) -> String {
    match username {
        Some(u) => format!("valid SASL credentials for user {u}"),
        None => "valid SASL credentials (sasl.username is not set)".into(),
    }
}

/// The refusal a client's callbacks reported (librdkafka reports a failed
/// SASL handshake there, and only there, for every client but the group
/// consumer), for the caller that sees the client's request fail.
#[derive(Debug, Default)]
pub(crate) struct SeenRefusal(AtomicU8);

impl SeenRefusal {
    pub(crate) fn note(&self, e: &KafkaError) {
        if let Some(r) = Refused::of(e) {
            self.0.store(r as u8 + 1, Ordering::Relaxed);
        }
    }

    pub(crate) fn get(&self) -> Option<Refused> {
        use Refused::*;
        [Topic, Group, TransactionalId, Cluster, Credentials]
            .into_iter()
            .find(|r| *r as u8 + 1 == self.0.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refusal_has_its_kafka_name() {
        use RDKafkaErrorCode as C;
        for (code, want) in [
            (C::TopicAuthorizationFailed, "TOPIC_AUTHORIZATION_FAILED"),
            (C::GroupAuthorizationFailed, "GROUP_AUTHORIZATION_FAILED"),
            (
                C::TransactionalIdAuthorizationFailed,
                "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
            ),
            (
                C::ClusterAuthorizationFailed,
                "CLUSTER_AUTHORIZATION_FAILED",
            ),
            (C::SaslAuthenticationFailed, "SASL_AUTHENTICATION_FAILED"),
            (C::Authentication, "SASL_AUTHENTICATION_FAILED"),
        ] {
            let r = Refused::of_code(code).unwrap_or_else(|| panic!("{code:?} is a refusal"));
            assert_eq!(r.code(), want, "{code:?}");
        }
    }

    /// Passing trouble, and the broker's "no transactions here", are no
    /// refusal: they must not stop a run as if an ACL were missing.
    #[test]
    fn passing_trouble_is_no_refusal() {
        use RDKafkaErrorCode as C;
        for code in [
            C::AllBrokersDown,
            C::BrokerTransportFailure,
            C::NotCoordinator,
            C::UnknownTopicOrPartition,
            C::RequestTimedOut,
            C::UnsupportedVersion,
            C::UnsupportedFeature,
            C::Fatal,
            C::Fenced,
        ] {
            assert_eq!(Refused::of_code(code), None, "{code:?}");
        }
    }

    #[test]
    fn errors_of_every_kind_carry_their_refusal() {
        use RDKafkaErrorCode as C;
        let consumed = KafkaError::MessageConsumption(C::GroupAuthorizationFailed);
        assert_eq!(Refused::of(&consumed), Some(Refused::Group));
        let commit = KafkaError::ConsumerCommit(C::TopicAuthorizationFailed);
        assert_eq!(refusal_in(&Error::from(commit)), Some(Refused::Topic));
        let global = KafkaError::Global(C::Authentication);
        assert_eq!(Refused::of(&global), Some(Refused::Credentials));
        assert_eq!(refusal_in(&Error::Broker("x".into())), None);
    }

    #[test]
    fn the_line_names_the_permission_in_both_words_and_never_a_password() {
        let e = Refused::Topic.needs(read_topic("people"));
        let line = e.to_string();
        assert!(
            line.contains("graphsink needs READ on topic people (TOPIC_AUTHORIZATION_FAILED)"),
            "{line}"
        );
        assert_eq!(e.kind(), crate::error::ErrorKind::NotAuthorized);
        let e = Refused::Credentials.needs(credentials(Some("gs")));
        assert!(
            e.to_string()
                .contains("valid SASL credentials for user gs (SASL_AUTHENTICATION_FAILED)"),
            "{e}"
        );
    }

    #[test]
    fn a_client_remembers_the_refusal_its_callbacks_saw() {
        let seen = SeenRefusal::default();
        assert_eq!(seen.get(), None);
        seen.note(&KafkaError::Global(RDKafkaErrorCode::AllBrokersDown));
        assert_eq!(seen.get(), None);
        seen.note(&KafkaError::Global(RDKafkaErrorCode::Authentication));
        assert_eq!(seen.get(), Some(Refused::Credentials));
    }
}
