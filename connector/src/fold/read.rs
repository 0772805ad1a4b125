//! Read: the newest row per primary key across a plan's WAL generations
//! (ascending), split into upserts (in the base table's columns) and
//! deleted keys. Reads only the plan's generations, so a re-run reads the
//! same rows.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch};
use arrow_schema::{Schema, SchemaRef};
use futures::TryStreamExt;

use super::plan::{FoldPlan, TablePlan};
use super::rows::{pk_of, str_at, strings};
use crate::error::{Context, Error, Result};
use crate::graph::Graph;

const TOMBSTONE: &str = "_tombstone";

/// What a fold read from the WAL of one table: newest row per id.
#[derive(Debug, Clone, Default)]
pub(crate) struct Read {
    pub upserts: Option<RecordBatch>,
    pub deletes: Vec<String>,
}

/// What a fold read, per table.
pub(crate) type ReadSet = BTreeMap<String, Read>;

/// Reads every table of the plan.
pub(crate) async fn read_plan(graph: &Graph, plan: &FoldPlan) -> Result<ReadSet> {
    let mut read = ReadSet::new();
    for tp in &plan.tables {
        read.insert(tp.table.clone(), read_generations(graph, tp).await?);
    }
    Ok(read)
}

/// The newest row per key across the planned generations of one table.
async fn read_generations(graph: &Graph, tp: &TablePlan) -> Result<Read> {
    let pk = pk_of(&graph.schema, &tp.table)?;
    let base = graph.open_table(&tp.table, None).await?;
    let base_schema: SchemaRef = Arc::new(Schema::from(base.schema()));
    let mut batches = scan_generations(graph, tp).await?;
    batches.retain(|b| b.num_rows() > 0);
    if batches.is_empty() {
        return Ok(Read::default());
    }
    let newest = newest_per_key(&batches, pk, &tp.table)?;
    // Looked up once per batch, not once per row.
    let tombstones: Vec<Option<&BooleanArray>> = batches
        .iter()
        .map(|b| {
            b.column_by_name(TOMBSTONE)
                .and_then(|c| c.as_any().downcast_ref::<BooleanArray>())
        })
        .collect();
    let is_tombstone =
        |b: usize, r: usize| tombstones[b].is_some_and(|t| t.is_valid(r) && t.value(r));
    let (deleted, upserted): (Vec<_>, Vec<_>) =
        newest.into_iter().partition(|&(b, r)| is_tombstone(b, r));
    let deletes: Vec<String> = deleted
        .iter()
        .map(|&(b, r)| str_at(&batches[b], pk, r))
        .collect::<Result<_>>()?;
    if upserted.is_empty() {
        return Ok(Read {
            upserts: None,
            deletes,
        });
    }
    let upserts = pick_upserts(batches, &base_schema, &upserted)?;
    Ok(Read {
        upserts: Some(upserts),
        deletes,
    })
}

/// Every row of the plan's generations of one table, in WAL order.
async fn scan_generations(graph: &Graph, tp: &TablePlan) -> Result<Vec<RecordBatch>> {
    let mut batches = Vec::new();
    for s in &tp.shards {
        for (_, path) in &s.generations {
            let uri = format!(
                "{}/_mem_wal/{}/{}",
                graph.table_uri(&tp.table),
                s.shard,
                path
            );
            let gen = graph
                .store()
                .open(&uri)
                .await
                .ctx(format!("open generation {uri}"))?;
            let mut got: Vec<RecordBatch> = gen
                .scan()
                .try_into_stream()
                .await
                .ctx(&uri)?
                .try_collect()
                .await
                .ctx(&uri)?;
            batches.append(&mut got);
        }
    }
    Ok(batches)
}

/// The newest row per key, as (batch, row) in WAL order, without first
/// concatenating the generations: the fold holds the rows it read plus the
/// rows it keeps, not several copies of everything.
fn newest_per_key(batches: &[RecordBatch], pk: &str, table: &str) -> Result<Vec<(usize, usize)>> {
    let mut last: HashMap<&str, (usize, usize)> = HashMap::new();
    for (b, batch) in batches.iter().enumerate() {
        let ids = strings(batch, pk)
            .map_err(|_| Error::Corrupt(format!("{table}: generation without {pk}")))?;
        for r in 0..ids.len() {
            last.insert(ids.value(r), (b, r));
        }
    }
    let mut newest: Vec<(usize, usize)> = last.into_values().collect();
    newest.sort_unstable();
    Ok(newest)
}

/// The picked rows in the base schema. Only the base columns are projected,
/// so the interleave copies nothing it drops. Tombstone rows hold nulls in
/// required columns, so the sources are typed as nullable; the picked
/// upserts must fit the base schema.
fn pick_upserts(
    batches: Vec<RecordBatch>,
    base_schema: &SchemaRef,
    picks: &[(usize, usize)],
) -> Result<RecordBatch> {
    let loose: SchemaRef = Arc::new(Schema::new(
        base_schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect::<Vec<_>>(),
    ));
    let projected: Vec<RecordBatch> = batches
        .iter()
        .map(|batch| {
            let cols: Vec<ArrayRef> = base_schema
                .fields()
                .iter()
                .map(|f| {
                    batch.column_by_name(f.name()).cloned().ok_or_else(|| {
                        Error::Corrupt(format!("generation lacks column {}", f.name()))
                    })
                })
                .collect::<Result<_>>()?;
            RecordBatch::try_new(loose.clone(), cols).ctx("generation columns")
        })
        .collect::<Result<_>>()?;
    drop(batches);
    let picked =
        arrow::compute::interleave_record_batch(&projected.iter().collect::<Vec<_>>(), picks)
            .ctx("newest per id")?;
    RecordBatch::try_new(base_schema.clone(), picked.columns().to_vec())
        .ctx("upserts in base schema")
}
