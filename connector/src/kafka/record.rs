//! A reject as a Kafka record, in one place: the original key, value,
//! headers and timestamp, plus Kafka Connect's and graphsink's headers for
//! the dead-letter topic, or without them for a replay. It produces nothing.

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;

use crate::rejects::Reject;

/// Header names of a dead-letter message (README lists them).
pub(crate) mod headers {
    pub(crate) const TOPIC: &str = "__connect.errors.topic";
    pub(crate) const PARTITION: &str = "__connect.errors.partition";
    pub(crate) const OFFSET: &str = "__connect.errors.offset";
    pub(crate) const CONNECTOR: &str = "__connect.errors.connector.name";
    pub(crate) const TASK: &str = "__connect.errors.task.id";
    pub(crate) const STAGE: &str = "__connect.errors.stage";
    pub(crate) const CLASS: &str = "__connect.errors.class.name";
    pub(crate) const EXCEPTION_CLASS: &str = "__connect.errors.exception.class.name";
    pub(crate) const EXCEPTION_MESSAGE: &str = "__connect.errors.exception.message";
    pub(crate) const GS_STAGE: &str = "graphsink.stage";
    pub(crate) const GS_CODE: &str = "graphsink.code";
    pub(crate) const GS_TYPE: &str = "graphsink.type";
    pub(crate) const GS_REJECT_ID: &str = "graphsink.reject_id";
    pub(crate) const GS_COMMIT: &str = "graphsink.graph_commit";
    /// The original length of a key or value cut to fit the producer's
    /// `message.max.bytes` (the whole bytes stay in `_ingest_rejects`).
    pub(crate) const GS_KEY_TRUNCATED: &str = "graphsink.key_truncated";
    pub(crate) const GS_VALUE_TRUNCATED: &str = "graphsink.value_truncated";
    /// Headers graphsink adds; a replay strips them.
    pub(crate) fn is_ours(name: &str) -> bool {
        name.starts_with("__connect.errors.") || name.starts_with("graphsink.")
    }
}

/// What the record is for.
pub(crate) enum Purpose<'a> {
    /// The dead-letter topic: graphsink's headers added, naming `connector`
    /// (`graph.actor`); fold rejects carry their row as the value. Key and
    /// value are cut to fit `max_bytes` (the producer's
    /// `message.max.bytes`): a record the producer can never send would
    /// hold its offset, and every later one, forever.
    DeadLetter {
        connector: &'a str,
        max_bytes: usize,
    },
    /// `replay-rejects`: the original record only, graphsink's headers
    /// stripped.
    Replay,
}

/// The record of `r` for `topic`.
pub(crate) fn reject_record<'a>(
    r: &'a Reject,
    topic: &'a str,
    purpose: &Purpose<'_>,
) -> FutureRecord<'a, [u8], [u8]> {
    let mut h = OwnedHeaders::new_with_capacity(r.headers.len() + 14);
    let originals = r.headers.iter().filter(|(k, _)| match purpose {
        Purpose::DeadLetter { .. } => true,
        Purpose::Replay => !headers::is_ours(k),
    });
    for (k, v) in originals {
        h = h.insert(Header {
            key: k,
            value: v.as_deref(),
        });
    }
    let (key, value) = match purpose {
        Purpose::DeadLetter {
            connector,
            max_bytes,
        } => {
            h = dead_letter_headers(h, r, connector);
            // Fold rejects have no original bytes: the row stands in for them.
            let value = r.value.as_deref().or(r.row.as_deref().map(str::as_bytes));
            let (key, value, cut) = fit(r, r.key.as_deref(), value, *max_bytes);
            for (name, len) in cut {
                h = h.insert(Header {
                    key: name,
                    value: Some(&len.to_string()),
                });
            }
            (key, value)
        }
        Purpose::Replay => (r.key.as_deref(), r.value.as_deref()),
    };
    let mut rec: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).headers(h);
    if let Some(k) = key {
        rec = rec.key(k);
    }
    if let Some(v) = value {
        rec = rec.payload(v);
    }
    if let Some(ts) = r.timestamp {
        rec = rec.timestamp(ts);
    }
    rec
}

/// A key or a value, if the record has one.
type Bytes<'a> = Option<&'a [u8]>;

/// Room kept in a dead letter for graphsink's headers and the record's
/// framing.
const HEADROOM: usize = 16 * 1024;

/// Key and value cut so the dead letter fits `max_bytes`, with the headers
/// that say what was cut (by its original length). The value gives way
/// first; the key keeps at most half.
fn fit<'a>(
    r: &Reject,
    key: Option<&'a [u8]>,
    value: Option<&'a [u8]>,
    max_bytes: usize,
) -> (Bytes<'a>, Bytes<'a>, Vec<(&'static str, usize)>) {
    let originals: usize = r
        .headers
        .iter()
        .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
        .sum();
    let room = max_bytes.saturating_sub(HEADROOM + originals + r.message.len());
    let (k, v) = (key.map_or(0, <[u8]>::len), value.map_or(0, <[u8]>::len));
    if k + v <= room {
        return (key, value, vec![]);
    }
    let mut cut = Vec::new();
    let key = key.map(|b| {
        let keep = b.len().min((room / 2).max(room.saturating_sub(v)));
        if keep < b.len() {
            cut.push((headers::GS_KEY_TRUNCATED, b.len()));
        }
        &b[..keep]
    });
    let left = room.saturating_sub(key.map_or(0, <[u8]>::len));
    let value = value.map(|b| {
        if left < b.len() {
            cut.push((headers::GS_VALUE_TRUNCATED, b.len()));
        }
        &b[..left.min(b.len())]
    });
    (key, value, cut)
}

/// Kafka Connect's `__connect.errors.*` headers, then graphsink's own.
fn dead_letter_headers(h: OwnedHeaders, r: &Reject, connector: &str) -> OwnedHeaders {
    use headers::*;
    let partition = r.partition.map(|p| p.to_string());
    let offset = r.offset.map(|o| o.to_string());
    let fields: [(&str, Option<&str>); 14] = [
        (TOPIC, r.topic.as_deref()),
        (PARTITION, partition.as_deref()),
        (OFFSET, offset.as_deref()),
        (CONNECTOR, Some(connector)),
        (TASK, Some("0")),
        (STAGE, Some(r.stage.as_str())),
        (CLASS, Some("graphsink")),
        (EXCEPTION_CLASS, Some(r.code.as_str())),
        (EXCEPTION_MESSAGE, Some(&r.message)),
        (GS_STAGE, Some(r.stage.as_str())),
        (GS_CODE, Some(r.code.as_str())),
        (GS_TYPE, r.type_name.as_deref()),
        (GS_REJECT_ID, Some(&r.reject_id)),
        (GS_COMMIT, r.graph_commit.as_deref()),
    ];
    fields.into_iter().fold(h, |h, (key, value)| match value {
        Some(v) => h.insert(Header {
            key,
            value: Some(v),
        }),
        None => h,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rejects::{FoldRefusal, Origin, RejectCode};
    use rdkafka::message::Headers;

    fn sync_reject() -> Reject {
        Reject::of_record(
            Origin {
                topic: "people".into(),
                partition: 2,
                offset: 7,
                timestamp: Some(5),
                key: Some(b"k".to_vec()),
                value: Some(b"v".to_vec()),
                headers: vec![
                    ("trace".into(), Some(b"t-1".to_vec())),
                    ("graphsink.code".into(), Some(b"old".to_vec())),
                    ("empty".into(), None),
                ],
            },
            "Person",
            RejectCode::Range,
            "age 200 outside 0..150",
            None,
        )
    }

    fn header_list(rec: &FutureRecord<'_, [u8], [u8]>) -> Vec<(String, Option<String>)> {
        let h = rec.headers.as_ref().expect("headers");
        h.iter()
            .map(|x| {
                let v = x.value.map(|v| String::from_utf8_lossy(v).into_owned());
                (x.key.to_string(), v)
            })
            .collect()
    }

    /// `r`'s dead letter on topic `dlq`, from connector `gs`.
    fn dead_letter(r: &Reject, max_bytes: usize) -> FutureRecord<'_, [u8], [u8]> {
        let purpose = Purpose::DeadLetter {
            connector: "gs",
            max_bytes,
        };
        reject_record(r, "dlq", &purpose)
    }

    #[test]
    fn a_dead_letter_keeps_the_original_and_adds_connect_headers() {
        let r = sync_reject();
        let rec = dead_letter(&r, 1_000_000);
        assert_eq!(rec.topic, "dlq");
        assert_eq!(rec.key, Some(&b"k"[..]));
        assert_eq!(rec.payload, Some(&b"v"[..]));
        assert_eq!(rec.timestamp, Some(5));
        let h = header_list(&rec);
        let get = |k: &str| h.iter().find(|(n, _)| n == k).and_then(|(_, v)| v.clone());
        assert_eq!(
            h[0],
            ("trace".into(), Some("t-1".into())),
            "originals first"
        );
        assert_eq!(h[2], ("empty".into(), None));
        assert_eq!(get(headers::TOPIC).as_deref(), Some("people"));
        assert_eq!(get(headers::PARTITION).as_deref(), Some("2"));
        assert_eq!(get(headers::OFFSET).as_deref(), Some("7"));
        assert_eq!(get(headers::CONNECTOR).as_deref(), Some("gs"));
        assert_eq!(get(headers::EXCEPTION_CLASS).as_deref(), Some("range"));
        assert_eq!(get(headers::GS_TYPE).as_deref(), Some("Person"));
        assert_eq!(get(headers::GS_REJECT_ID), Some(r.reject_id.clone()));
        assert_eq!(
            get(headers::GS_COMMIT),
            None,
            "a sync reject has no commit yet"
        );
        assert_eq!(h.len(), 3 + 13);
    }

    #[test]
    fn a_fold_reject_carries_its_row_as_the_value() {
        let r = Reject::of_fold(FoldRefusal {
            commit_id: "c1",
            what: "edges/Knows:e1",
            type_name: "Knows",
            code: RejectCode::EndpointNotFound,
            message: "no such node".into(),
            row: Some(r#"{"id":"e1"}"#.into()),
            source: None,
            created_at: 9,
        });
        let rec = dead_letter(&r, 1_000_000);
        assert_eq!(rec.payload, Some(&br#"{"id":"e1"}"#[..]));
        assert_eq!(rec.key, None);
        let h = header_list(&rec);
        assert!(h.contains(&(headers::GS_COMMIT.into(), Some("c1".into()))));
        assert!(!h.iter().any(|(k, _)| k == headers::TOPIC));
        let replay = reject_record(&r, "t", &Purpose::Replay);
        assert_eq!(replay.payload, None, "a replay sends original bytes only");
    }

    #[test]
    fn a_dead_letter_too_big_to_produce_is_cut_and_says_so() {
        let mut r = sync_reject();
        let room = 100_000
            - HEADROOM
            - r.message.len()
            - "trace".len()
            - 3
            - "graphsink.code".len()
            - 3
            - "empty".len();
        // A big value: the key stays whole, the value fills the rest.
        r.value = Some(vec![b'v'; 200_000]);
        let rec = dead_letter(&r, 100_000);
        assert_eq!(rec.key.map(<[u8]>::len), Some(1));
        assert_eq!(rec.payload.map(<[u8]>::len), Some(room - 1));
        let h = header_list(&rec);
        assert!(h.contains(&(headers::GS_VALUE_TRUNCATED.into(), Some("200000".into()))));
        assert!(!h.iter().any(|(k, _)| k == headers::GS_KEY_TRUNCATED));
        // A big key and a big value: half each.
        r.key = Some(vec![b'k'; 200_000]);
        let rec = dead_letter(&r, 100_000);
        assert_eq!(rec.key.map(<[u8]>::len), Some(room / 2));
        assert_eq!(rec.payload.map(<[u8]>::len), Some(room - room / 2));
        let h = header_list(&rec);
        assert!(h.contains(&(headers::GS_KEY_TRUNCATED.into(), Some("200000".into()))));
        // Small enough: untouched.
        r.key = Some(b"k".to_vec());
        r.value = Some(vec![b'v'; room - 1]);
        let rec = dead_letter(&r, 100_000);
        assert_eq!(rec.payload.map(<[u8]>::len), Some(room - 1));
        assert!(!header_list(&rec)
            .iter()
            .any(|(k, _)| k.ends_with("_truncated")));
    }

    #[test]
    fn a_replay_strips_graphsinks_headers() {
        let r = sync_reject();
        let rec = reject_record(&r, "people", &Purpose::Replay);
        assert_eq!(rec.key, Some(&b"k"[..]));
        assert_eq!(rec.payload, Some(&b"v"[..]));
        assert_eq!(rec.timestamp, Some(5));
        assert_eq!(
            header_list(&rec),
            vec![("trace".into(), Some("t-1".into())), ("empty".into(), None)]
        );
    }
}
