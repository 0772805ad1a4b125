use std::sync::Arc;

use arrow::array::{AsArray, Int32Array, RecordBatch};

use super::table::split_by_bucket;
use super::*;

#[test]
fn a_fence_stringified_into_an_io_error_is_still_a_fence() {
    let shard = Uuid::nil();
    let io =
        |text: &str| lance::Error::io_source(Box::new(std::io::Error::other(text.to_string())));
    let peer = io("Writer fenced (peer claimed epoch): local epoch 6 < stored epoch 7 for shard x");
    assert!(matches!(
        fenced_or(peer, "t", 3, shard, "flush"),
        Error::Fenced { .. }
    ));
    let lost = io("Writer fenced (persistence failure): wal write failed");
    assert!(matches!(
        fenced_or(lost, "t", 3, shard, "flush"),
        Error::WalUnavailable { .. }
    ));
    let other = io("connection reset");
    assert!(matches!(
        fenced_or(other, "t", 3, shard, "flush"),
        Error::Lance { .. }
    ));
}

/// The exit-3 line of a fenced run quotes Lance's fence, and Lance ends
/// its text with the source location that raised it: the line keeps the
/// reason and drops the location (issue 50).
#[test]
fn a_fence_reads_without_lance_source_locations() {
    let shard = Uuid::nil();
    let peer = lance::Error::fenced_by_peer("local epoch 6 < stored epoch 7");
    assert!(
        peer.to_string().contains(".rs:"),
        "Lance appends it: {peer}"
    );
    let lost = lance::Error::writer_poisoned("wal write failed");
    for e in [
        fenced_or(peer, "nodes/P", 3, shard, "put"),
        fenced_or(lost, "nodes/P", 3, shard, "put"),
    ] {
        let text = e.to_string();
        assert!(text.contains("Writer fenced ("), "{text}");
        assert!(!text.contains(".rs:") && !text.contains("/src/"), "{text}");
    }
}

#[test]
fn one_pass_split_keeps_every_row_once_in_order() {
    use arrow::array::StringArray;
    use arrow_schema::{DataType, Field, Schema};
    let ids = StringArray::from(vec!["a", "b", "c", "d", "e"]);
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Utf8, false)]));
    let batch = RecordBatch::try_new(schema, vec![Arc::new(ids)]).unwrap();
    let buckets = Int32Array::from(vec![2, 0, 2, 2, 0]);
    let parts = split_by_bucket(&batch, &buckets, 3, None).unwrap();
    let got: Vec<(usize, Vec<String>)> = parts
        .iter()
        .map(|(b, p)| {
            let c = p.column(0).as_any().downcast_ref::<StringArray>().unwrap();
            (*b, c.iter().map(|v| v.unwrap().to_string()).collect())
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (0, vec!["b".to_string(), "e".to_string()]),
            (2, vec!["a".to_string(), "c".to_string(), "d".to_string()]),
        ]
    );
    // A bucket outside the shard count is corrupt state, not a panic.
    assert!(split_by_bucket(&batch, &Int32Array::from(vec![0, 3, 0, 0, 0]), 3, None).is_err());
}

#[test]
fn each_part_is_sorted_by_key_and_keeps_equal_keys_in_order() {
    use arrow::array::{Int64Array, StringArray};
    use arrow_schema::{DataType, Field, Schema};
    let ids = StringArray::from(vec!["d", "b", "c", "a", "b", "e"]);
    let seq = Int64Array::from(vec![0, 1, 2, 3, 4, 5]);
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("seq", DataType::Int64, false),
    ]));
    let batch = RecordBatch::try_new(schema, vec![Arc::new(ids.clone()), Arc::new(seq)]).unwrap();
    let rows = |p: &RecordBatch| -> Vec<(String, i64)> {
        let k = p.column(0).as_string::<i32>();
        let s = p.column(1).as_primitive::<arrow::datatypes::Int64Type>();
        (0..p.num_rows())
            .map(|i| (k.value(i).to_string(), s.value(i)))
            .collect()
    };
    let one = split_by_bucket(&batch, &Int32Array::from(vec![0; 6]), 1, Some(&ids)).unwrap();
    assert_eq!(
        rows(&one[0].1),
        [("a", 3), ("b", 1), ("b", 4), ("c", 2), ("d", 0), ("e", 5)]
            .map(|(k, s)| (k.to_string(), s))
    );
    let two = split_by_bucket(
        &batch,
        &Int32Array::from(vec![1, 0, 1, 1, 0, 0]),
        2,
        Some(&ids),
    )
    .unwrap();
    assert_eq!(two[0].0, 0);
    assert_eq!(
        rows(&two[0].1),
        [("b", 1), ("b", 4), ("e", 5)].map(|(k, s)| (k.to_string(), s))
    );
    assert_eq!(
        rows(&two[1].1),
        [("a", 3), ("c", 2), ("d", 0)].map(|(k, s)| (k.to_string(), s))
    );
}

#[test]
fn shard_ids_are_deterministic_and_distinct() {
    assert_eq!(shard_id("nodes/A", 0), shard_id("nodes/A", 0));
    assert_ne!(shard_id("nodes/A", 0), shard_id("nodes/A", 1));
    assert_ne!(shard_id("nodes/A", 0), shard_id("nodes/B", 0));
}
