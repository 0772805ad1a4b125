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
    /// The shard (bucket, or source partition) each of `deletes` came from.
    pub delete_shards: Vec<u32>,
    /// Ids read from more than one shard (under partition sharding, a
    /// producer that did not key by id): the lowest shard's newest row is
    /// in `upserts`/`deletes`, each other shard's newest is here, for the
    /// checks to refuse as `shard_conflict`.
    pub conflicts: Conflicts,
}

/// The rows of ids a fold read from a second shard.
#[derive(Debug, Clone, Default)]
pub(crate) struct Conflicts {
    /// Upserted rows, in the base schema (with provenance).
    pub upserts: Option<RecordBatch>,
    /// Tombstones, which carry no provenance: (id, shard's bucket).
    pub deletes: Vec<(String, u32)>,
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
    let (batches, buckets): (Vec<RecordBatch>, Vec<u32>) = scan_generations(graph, tp)
        .await?
        .into_iter()
        .filter(|(b, _)| b.num_rows() > 0)
        .unzip();
    if batches.is_empty() {
        return Ok(Read::default());
    }
    let (newest, seconds) = newest_per_key(&batches, &buckets, pk, &tp.table)?;
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
    let delete_shards = deleted.iter().map(|&(b, _)| buckets[b]).collect();
    let (second_deleted, second_upserted): (Vec<_>, Vec<_>) =
        seconds.into_iter().partition(|&(b, r)| is_tombstone(b, r));
    let mut conflicts = Conflicts {
        upserts: None,
        deletes: second_deleted
            .iter()
            .map(|&(b, r)| Ok((str_at(&batches[b], pk, r)?, buckets[b])))
            .collect::<Result<_>>()?,
    };
    if !second_upserted.is_empty() {
        conflicts.upserts = Some(pick_upserts(&batches, &base_schema, &second_upserted)?);
    }
    if upserted.is_empty() {
        return Ok(Read {
            upserts: None,
            deletes,
            delete_shards,
            conflicts,
        });
    }
    let upserts = pick_upserts(&batches, &base_schema, &upserted)?;
    drop(batches);
    Ok(Read {
        upserts: Some(upserts),
        deletes,
        delete_shards,
        conflicts,
    })
}

/// Every row of the plan's generations of one table, in WAL order, shard
/// by shard (ascending bucket), each batch with its shard's bucket.
async fn scan_generations(graph: &Graph, tp: &TablePlan) -> Result<Vec<(RecordBatch, u32)>> {
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
            batches.extend(got.drain(..).map(|b| (b, s.bucket)));
        }
    }
    Ok(batches)
}

/// The newest row per key, as (batch, row) in WAL order, without first
/// concatenating the generations: the fold holds the rows it read plus the
/// rows it keeps, not several copies of everything. A key is owned by the
/// first shard (lowest bucket) it appears in; for each other shard it
/// appears in, that shard's newest row is returned second, as a conflict.
/// `buckets[b]` is batch b's shard, non-decreasing.
type Newest = (Vec<(usize, usize)>, Vec<(usize, usize)>);
fn newest_per_key(
    batches: &[RecordBatch],
    buckets: &[u32],
    pk: &str,
    table: &str,
) -> Result<Newest> {
    let mut last: HashMap<&str, (usize, usize)> = HashMap::new();
    let mut second: HashMap<(&str, u32), (usize, usize)> = HashMap::new();
    for (b, batch) in batches.iter().enumerate() {
        let ids = strings(batch, pk)
            .map_err(|_| Error::Corrupt(format!("{table}: generation without {pk}")))?;
        for r in 0..ids.len() {
            let id = ids.value(r);
            match last.get_mut(id) {
                Some(home) if buckets[home.0] != buckets[b] => {
                    second.insert((id, buckets[b]), (b, r));
                }
                Some(home) => *home = (b, r),
                None => {
                    last.insert(id, (b, r));
                }
            }
        }
    }
    let mut newest: Vec<(usize, usize)> = last.into_values().collect();
    newest.sort_unstable();
    let mut seconds: Vec<(usize, usize)> = second.into_values().collect();
    seconds.sort_unstable();
    Ok((newest, seconds))
}

/// The picked rows in the base schema. Only the base columns are projected,
/// so the interleave copies nothing it drops. Tombstone rows hold nulls in
/// required columns, so the sources are typed as nullable; the picked
/// upserts must fit the base schema.
fn pick_upserts(
    batches: &[RecordBatch],
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
                .map(|f| match batch.column_by_name(f.name()) {
                    Some(c) => Ok(c.clone()),
                    // A generation flushed before a schema change added
                    // this column: its rows hold null, as Lance's own
                    // reads give them.
                    None if f.is_nullable() => Ok(arrow::array::new_null_array(
                        f.data_type(),
                        batch.num_rows(),
                    )),
                    None => Err(Error::Corrupt(format!(
                        "generation lacks column {}",
                        f.name()
                    ))),
                })
                .collect::<Result<_>>()?;
            RecordBatch::try_new(loose.clone(), cols).ctx("generation columns")
        })
        .collect::<Result<_>>()?;
    let picked =
        arrow::compute::interleave_record_batch(&projected.iter().collect::<Vec<_>>(), picks)
            .ctx("newest per id")?;
    RecordBatch::try_new(base_schema.clone(), picked.columns().to_vec())
        .ctx("upserts in base schema")
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::StringArray;
    use arrow_schema::{DataType, Field};

    fn ids(v: &[&str]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Utf8, false)]));
        RecordBatch::try_new(schema, vec![Arc::new(StringArray::from(v.to_vec()))]).unwrap()
    }

    #[test]
    fn an_id_in_two_shards_stays_with_the_lowest_and_the_other_is_a_conflict() {
        // Shard 0: a, b, then a again; shard 1: a twice, c; shard 2: a.
        let batches = [
            ids(&["a", "b"]),
            ids(&["a"]),
            ids(&["a", "c", "a"]),
            ids(&["a"]),
        ];
        let (newest, seconds) = newest_per_key(&batches, &[0, 0, 1, 2], "id", "t").unwrap();
        assert_eq!(newest, [(0, 1), (1, 0), (2, 1)], "b, a of shard 0, c");
        assert_eq!(
            seconds,
            [(2, 2), (3, 0)],
            "a's newest row in shards 1 and 2"
        );
        // One shard: no conflicts, last write wins.
        let (newest, seconds) = newest_per_key(&batches[..2], &[3, 3], "id", "t").unwrap();
        assert_eq!(newest, [(0, 1), (1, 0)]);
        assert!(seconds.is_empty());
    }
}
