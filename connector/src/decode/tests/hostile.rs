//! The hostile corpus (graphsink-testkit's generator) against the decoder
//! alone: every record, decoded alone and within its whole feed as one
//! poll, gives exactly what the corpus says (one reject with a typed code,
//! or a row), and nothing panics.

use super::*;
use arrow::array::Int64Array;
use graphsink_testkit::hostile::{self, Expect, Feed};

fn decoder(feed: Feed) -> RecordDecoder {
    let schema = GraphSchema::parse(hostile::SCHEMA, "hostile.pg").unwrap();
    let m = super::mapping(&format!("topic = 't'\n{}", feed.mapping()));
    RecordDecoder::new(&schema, &m, 1000, hostile::MAX_RECORD_BYTES).unwrap()
}

fn record(h: &hostile::Hostile, offset: i64) -> SourceRecord<'_> {
    SourceRecord {
        topic: "t",
        partition: 0,
        offset,
        timestamp: Some(1),
        key: h.key.as_deref(),
        value: h.value.as_deref(),
        message: None,
    }
}

/// What came out for the record at `offset`: its reject codes, and
/// whether it became a row (or a delete).
fn outcome(
    out: &Decoded,
    offset: i64,
    id_of: &dyn Fn(&RecordBatch, usize) -> i64,
) -> (Vec<&'static str>, bool) {
    let codes = out
        .rejects
        .iter()
        .filter(|r| r.offset == Some(offset))
        .map(|r| r.code.as_str())
        .collect();
    let row = out
        .upserts
        .as_ref()
        .is_some_and(|b| (0..b.num_rows()).any(|i| id_of(b, i) == offset));
    (codes, row)
}

fn offset_at(b: &RecordBatch, i: usize) -> i64 {
    b.column_by_name("_src_offset")
        .and_then(|c| c.as_any().downcast_ref::<Int64Array>().map(|a| a.value(i)))
        .expect("provenance offset")
}

fn judge(
    h: &hostile::Hostile,
    (codes, row): (Vec<&'static str>, bool),
    how: &str,
) -> Option<String> {
    let ok = match &h.expect {
        Expect::Reject(allowed) => codes.len() == 1 && allowed.contains(&codes[0]) && !row,
        Expect::Accept => codes.is_empty() && (row || h.value.is_none()),
    };
    (!ok).then(|| {
        format!(
            "{} ({how}): expected {:?}, got rejects {codes:?}, row {row}",
            h.name, h.expect
        )
    })
}

#[test]
fn every_hostile_record_gives_exactly_its_outcome() {
    let corpus = hostile::corpus();
    let mut wrong = Vec::new();
    for feed in Feed::ALL {
        let mine: Vec<_> = corpus.iter().filter(|h| h.feed == feed).collect();
        // Alone: one poll per record.
        for h in &mine {
            let out = decoder(feed)
                .decode(&[record(h, 0)])
                .expect("decode never fails the poll");
            wrong.extend(judge(h, outcome(&out, 0, &offset_at), "alone"));
        }
        // Together: the whole feed as one poll (the halving path).
        let recs: Vec<_> = mine
            .iter()
            .enumerate()
            .map(|(i, h)| record(h, i as i64))
            .collect();
        let out = decoder(feed)
            .decode(&recs)
            .expect("decode never fails the poll");
        for (i, h) in mine.iter().enumerate() {
            wrong.extend(judge(h, outcome(&out, i as i64, &offset_at), "in one poll"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} cases:\n{}",
        wrong.len(),
        corpus.len() * 2,
        wrong.join("\n")
    );
}
