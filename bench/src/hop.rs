//! `--hop-edges N`: what `graphsink neighbors` costs on an edge table of N
//! rows. Its access path is a Lance scan filtered on `src` (or `dst`),
//! which graphsink keeps no index on; this writes an edge-shaped Lance
//! table (`id`, `src`, `dst`, `since`, in 1M-row fragments, over N/10
//! nodes) and times that scan, the same call `Graph::read` makes. Then
//! the id index the fold keeps (`fold/index.rs`): its first build, a
//! lookup through it, and what it adds to a fold (a delta segment of one
//! fold's rows; at 8 segments a tiered merge).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use arrow_array::{Int32Array, RecordBatch, RecordBatchIterator, StringArray};
use arrow_schema::{DataType, Field, Schema};
use futures::TryStreamExt;
use lance::dataset::{Dataset, WriteMode, WriteParams};

use crate::broker::BoxError;
use crate::measure::percentiles;

pub(crate) async fn run(dir: &Path, n: u64) -> Result<(), BoxError> {
    let uri = dir.join("hop-edges").to_string_lossy().into_owned();
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("src", DataType::Utf8, false),
        Field::new("dst", DataType::Utf8, false),
        Field::new("since", DataType::Int32, true),
    ]));
    let nodes = (n / 10).max(1);
    let chunk = 1_000_000u64;
    let t0 = Instant::now();
    let mut lo = 0;
    while lo < n {
        let hi = (lo + chunk).min(n);
        let ids: Vec<String> = (lo..hi).map(|i| format!("edges/0/{i}")).collect();
        let src: Vec<String> = (lo..hi)
            .map(|i| format!("n{}", (i * 7919) % nodes))
            .collect();
        let dst: Vec<String> = (lo..hi)
            .map(|i| format!("n{}", (i * 104_729) % nodes))
            .collect();
        let since: Vec<i32> = (lo..hi).map(|i| i as i32).collect();
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from(ids)),
                Arc::new(StringArray::from(src)),
                Arc::new(StringArray::from(dst)),
                Arc::new(Int32Array::from(since)),
            ],
        )?;
        let params = WriteParams {
            mode: if lo == 0 {
                WriteMode::Create
            } else {
                WriteMode::Append
            },
            ..Default::default()
        };
        let rows = RecordBatchIterator::new([Ok(batch)], schema.clone());
        Dataset::write(rows, &uri, Some(params)).await?;
        lo = hi;
    }
    eprintln!("wrote {n} edges in {:.1} s", t0.elapsed().as_secs_f64());
    let ds = Dataset::open(&uri).await?;
    println!("| edges | filter | edges found | p50 ms | p99 ms | max ms |");
    println!("|---|---|---|---|---|---|");
    for (what, filter) in [
        ("out (src)", "src = 'n42'"),
        ("in (dst)", "dst = 'n42'"),
        ("by id", "id = 'edges/0/4242'"),
    ] {
        let mut ms = Vec::new();
        let mut found = 0;
        for _ in 0..7 {
            let t = Instant::now();
            let mut scan = ds.scan();
            scan.filter(filter)?;
            let batches: Vec<RecordBatch> = scan.try_into_stream().await?.try_collect().await?;
            found = batches.iter().map(RecordBatch::num_rows).sum::<usize>();
            ms.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        let (a, b, c) = percentiles(ms).unwrap_or_default();
        println!("| {n} | {what}: `{filter}` | {found} | {a:.0} | {b:.0} | {c:.0} |");
    }
    index_costs(&uri, n, ds).await
}

/// Rows one fold adds in the delta-segment measure: 5 s at 5,000/s.
const FOLD_ROWS: u64 = 25_000;

/// The id index's costs on the table `run` wrote.
async fn index_costs(uri: &str, n: u64, ds: Dataset) -> Result<(), BoxError> {
    let t = Instant::now();
    let mut ds = graphsink::testing::keep_id_index(Arc::new(ds)).await?;
    println!(
        "\nfirst build of the id index over {n} rows: {:.0} ms",
        ms(t)
    );
    lookups(&ds, n, "by id, id index").await?;
    let schema = Arc::new(Schema::from(ds.schema()));
    let mut deltas = Vec::new();
    for k in 0..24u64 {
        let lo = n + k * FOLD_ROWS;
        let ids: Vec<String> = (lo..lo + FOLD_ROWS)
            .map(|i| format!("edges/0/{i}"))
            .collect();
        let other: Vec<String> = (lo..lo + FOLD_ROWS).map(|i| format!("n{i}")).collect();
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from(ids)),
                Arc::new(StringArray::from(other.clone())),
                Arc::new(StringArray::from(other)),
                Arc::new(Int32Array::from(vec![0; FOLD_ROWS as usize])),
            ],
        )?;
        let params = WriteParams {
            mode: WriteMode::Append,
            ..Default::default()
        };
        let rows = RecordBatchIterator::new([Ok(batch)], schema.clone());
        let appended = Dataset::write(rows, uri, Some(params)).await?;
        let t = Instant::now();
        ds = graphsink::testing::keep_id_index(Arc::new(appended)).await?;
        deltas.push(ms(t));
    }
    let (a, b, c) = percentiles(deltas.clone()).unwrap_or_default();
    let slow: Vec<String> = deltas.iter().map(|d| format!("{d:.0}")).collect();
    println!(
        "24 folds of {FOLD_ROWS} new rows each, the index's part (a delta segment; at 8 \
         segments a tiered merge): p50 {a:.0} ms, p99 {b:.0} ms, max {c:.0} ms; in order: {}",
        slow.join(" ")
    );
    lookups(&ds, n, "by id, after 24 folds").await
}

/// 7 lookups of one id; the table row printed.
async fn lookups(ds: &Dataset, n: u64, what: &str) -> Result<(), BoxError> {
    let filter = "id = 'edges/0/4242'";
    let mut times = Vec::new();
    for _ in 0..7 {
        let t = Instant::now();
        let mut scan = ds.scan();
        scan.filter(filter)?;
        let batches: Vec<RecordBatch> = scan.try_into_stream().await?.try_collect().await?;
        assert_eq!(batches.iter().map(RecordBatch::num_rows).sum::<usize>(), 1);
        times.push(ms(t));
    }
    let (a, b, c) = percentiles(times).unwrap_or_default();
    println!("| {n} | {what}: `{filter}` | 1 | {a:.0} | {b:.0} | {c:.0} |");
    Ok(())
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}
