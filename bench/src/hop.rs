//! `--hop-edges N`: what `graphsink neighbors` costs on an edge table of N
//! rows. Its access path is a Lance scan filtered on `src` (or `dst`),
//! which graphsink keeps no index on; this writes an edge-shaped Lance
//! table (`id`, `src`, `dst`, `since`, in 1M-row fragments, over N/10
//! nodes) and times that scan, the same call `Graph::read` makes.

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
    Ok(())
}
