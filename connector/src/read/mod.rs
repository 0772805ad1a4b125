//! Reading rows of one graph type (`graphsink read`, `Graph::read`): at the
//! head commit (the default), at a past commit, or fresh (`fresh`: the
//! head's base table merged with the MemWAL generations no fold has
//! published yet, through Lance's own LSM read). `neighbors` is one hop
//! over the edge tables on the same tiers. docs/reads.md says what a fresh
//! read is and is not.
//!
//! It reads only: no claim, no write, no fence.

mod fresh;
mod neighbors;
mod tail;

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use futures::TryStreamExt;
use lance::dataset::scanner::Scanner;
use lance::Dataset;

use crate::error::{shown, Context, Error, PublicResult, Result};
use crate::graph::{open_pinned, Graph, GraphCommit};
use crate::schema::ID;

pub use neighbors::{one_hop, Direction, Hop, Neighbors, NeighborsRequest};

/// Column a fresh read adds to every row: `base` (the table at the head's
/// pinned version) or `wal` (a MemWAL generation no fold has published).
pub const TIER: &str = "_tier";

/// Which state of the graph a read sees.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ReadAt {
    /// The head commit: every table at the version it pins.
    #[default]
    Head,
    /// A past graph commit, by id.
    Commit(String),
    /// The head's base tables plus every flushed generation not yet folded,
    /// newest row per id (docs/reads.md: not a graph commit).
    Fresh,
}

/// One read of a graph type.
#[derive(Debug, Clone, Default)]
pub struct ReadRequest {
    /// The type's name, as in the `.pg` (`Person`, `Knows`).
    pub type_name: String,
    /// Only these ids (the primary key); empty: every row.
    pub ids: Vec<String>,
    /// A Lance SQL filter on the table's columns (`age > 30`).
    pub filter: Option<String>,
    /// Only these columns, in this order; `None`: every column.
    pub columns: Option<Vec<String>>,
    pub at: ReadAt,
    pub limit: Option<usize>,
}

/// What a read returned.
#[derive(Debug, Clone)]
pub struct Rows {
    /// The commit read (for a fresh read, the head its base tables are at).
    pub commit: GraphCommit,
    /// The table read (`nodes/Person`).
    pub table: String,
    /// The rows' columns (a fresh read ends with `_tier`).
    pub schema: SchemaRef,
    pub batches: Vec<RecordBatch>,
}

impl Rows {
    pub fn num_rows(&self) -> usize {
        self.batches.iter().map(RecordBatch::num_rows).sum()
    }
}

impl Graph {
    /// Rows of one type at the head, at a commit, or fresh.
    pub async fn read(&self, req: &ReadRequest) -> PublicResult<Rows> {
        let (commit, table) = self.read_target(req).await?;
        if req.at == ReadAt::Fresh {
            return Ok(fresh::read(self, commit, table, req).await?);
        }
        let ds = open_pinned(self, &commit, &table).await?;
        let schema = output_schema(&ds, req.columns.as_deref(), false)?;
        let scan = pinned_scanner(&ds, req).await?;
        let stream = scan.try_into_stream().await.ctx(ds.uri())?;
        let batches = stream.try_collect().await.ctx(ds.uri())?;
        Ok(Rows {
            commit,
            table,
            schema,
            batches,
        })
    }

    /// The access path a read takes, as Lance plans it (`graphsink read
    /// --explain`): whether `--id` probes the id index (`ScalarIndexQuery`)
    /// or a fresh lookup goes through the point-lookup planner.
    pub async fn explain(&self, req: &ReadRequest) -> PublicResult<String> {
        let (commit, table) = self.read_target(req).await?;
        if req.at == ReadAt::Fresh {
            return Ok(fresh::explain(self, &commit, &table, req).await?);
        }
        let ds = open_pinned(self, &commit, &table).await?;
        let scan = pinned_scanner(&ds, req).await?;
        Ok(scan.explain_plan(true).await.ctx(ds.uri())?)
    }

    /// The commit a read is at (the head's, for a fresh read: its base)
    /// and the table of the requested type there.
    async fn read_target(&self, req: &ReadRequest) -> Result<(GraphCommit, String)> {
        let commit = match &req.at {
            ReadAt::Commit(id) => self.commit(id).await?,
            ReadAt::Head | ReadAt::Fresh => self.head().await?,
        };
        let table = table_of(&commit, &req.type_name)?;
        Ok((commit, table))
    }
}

/// The table of a graph type the commit pins: `nodes/T` or `edges/T`.
pub(crate) fn table_of(commit: &GraphCommit, type_name: &str) -> Result<String> {
    for kind in ["nodes", "edges"] {
        let t = format!("{kind}/{type_name}");
        if commit.tables.contains_key(&t) {
            return Ok(t);
        }
    }
    let types: Vec<&str> = commit
        .tables
        .keys()
        .filter_map(|t| {
            t.strip_prefix("nodes/")
                .or_else(|| t.strip_prefix("edges/"))
        })
        .collect();
    Err(Error::config(format!(
        "no type {type_name:?} in graph commit {} (types: {})",
        commit.id,
        types.join(", ")
    )))
}

/// The filter a request asks for: its ids as `id IN (...)`, and its own
/// filter, both at once.
pub(crate) fn combined_filter(ids: &[String], filter: Option<&str>) -> Option<String> {
    let ids = (!ids.is_empty()).then(|| id_in(ids));
    match (ids, filter) {
        (Some(i), Some(f)) => Some(format!("({i}) AND ({f})")),
        (Some(i), None) => Some(i),
        (None, Some(f)) => Some(f.to_string()),
        (None, None) => None,
    }
}

/// `id IN ('a', 'b')`, each id a SQL string literal.
pub(crate) fn id_in(ids: &[String]) -> String {
    let lits: Vec<String> = ids.iter().map(|i| sql_string(i)).collect();
    format!("{ID} IN ({})", lits.join(", "))
}

/// A SQL string literal: quotes doubled, so an id is never read as SQL.
pub(crate) fn sql_string(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// A filter Lance refused to plan: the user's to fix, so a config-class
/// error (exit 2), on one line.
pub(crate) fn bad_filter(filter: &str, e: impl std::fmt::Display) -> Error {
    let text = shown(&e);
    let text = text.lines().next().unwrap_or_default();
    Error::config(format!("--filter {filter:?} cannot be read: {text}"))
}

/// Lance parses a filter as the `WHERE` of one statement and drops what
/// follows a complete expression (`age > 1) OR (1 = 1` reads as `age > 1`,
/// `age > 1 LIMIT 0` likewise). A filter must be one whole expression:
/// text left over is refused. What sqlparser's generic dialect cannot
/// parse at all is left for Lance to judge (it accepts `==`, for one).
pub(crate) fn whole_filter(filter: &str) -> Result<()> {
    use lance::deps::datafusion::sql::sqlparser::{
        dialect::GenericDialect, parser::Parser, tokenizer::Token,
    };
    let Ok(mut p) = Parser::new(&GenericDialect {}).try_with_sql(filter) else {
        return Ok(());
    };
    if p.parse_expr().is_err() {
        return Ok(());
    }
    match p.peek_token().token {
        Token::EOF => Ok(()),
        t => Err(bad_filter(
            filter,
            format!("text after the expression, from {t}: a filter is one expression"),
        )),
    }
}

/// Columns of the output: the requested ones (checked against the table,
/// so a typo is named rather than passed to Lance), or every column; a
/// fresh read adds `_tier`.
pub(crate) fn output_schema(
    ds: &Dataset,
    columns: Option<&[String]>,
    fresh: bool,
) -> Result<SchemaRef> {
    let all = Schema::from(ds.schema());
    let mut fields: Vec<Field> = match columns {
        None => all.fields().iter().map(|f| f.as_ref().clone()).collect(),
        Some(cols) => cols
            .iter()
            .map(|c| {
                all.field_with_name(c).cloned().map_err(|_| {
                    let names: Vec<&str> = all.fields().iter().map(|f| f.name().as_str()).collect();
                    Error::config(format!(
                        "--columns: no column {c:?} in {} (columns: {})",
                        ds.uri(),
                        names.join(", ")
                    ))
                })
            })
            .collect::<Result<_>>()?,
    };
    if fresh {
        fields.push(Field::new(TIER, DataType::Utf8, false));
    }
    Ok(Arc::new(Schema::new(fields)))
}

/// A plain Lance scan of a table at its pinned version, planned (so a
/// bad filter is refused here, as the user's).
async fn pinned_scanner(ds: &Dataset, req: &ReadRequest) -> Result<Scanner> {
    let filter = combined_filter(&req.ids, req.filter.as_deref());
    let mut scan = ds.scan();
    if let Some(cols) = &req.columns {
        scan.project(cols).ctx("--columns")?;
    }
    if let Some(f) = &req.filter {
        whole_filter(f)?;
    }
    if let Some(f) = &filter {
        scan.filter(f).map_err(|e| bad_filter(f, e))?;
    }
    if let Some(n) = req.limit {
        scan.limit(Some(n as i64), None).ctx("--limit")?;
    }
    // Planning is where Lance checks a filter's columns and types; a
    // failure there is the filter's, not storage's.
    if let Some(f) = &filter {
        scan.create_plan().await.map_err(|e| bad_filter(f, e))?;
    }
    Ok(scan)
}

/// `batch` with only `schema`'s columns, in its order; `_tier` from
/// `tiers` (one per row) when the schema has it.
pub(crate) fn reproject(
    batch: &RecordBatch,
    schema: &SchemaRef,
    tiers: Option<ArrayRef>,
) -> Result<RecordBatch> {
    let cols: Vec<ArrayRef> = schema
        .fields()
        .iter()
        .map(|f| {
            if f.name() == TIER {
                return tiers
                    .clone()
                    .ok_or_else(|| Error::Bug("a fresh read without tiers".into()));
            }
            batch
                .column_by_name(f.name())
                .cloned()
                .ok_or_else(|| Error::Bug(format!("read lost column {}", f.name())))
        })
        .collect::<Result<_>>()?;
    RecordBatch::try_new(schema.clone(), cols).ctx("reproject a read")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_sql_literals_and_combine_with_a_filter() {
        let ids = vec!["a".to_string(), "o'k".to_string()];
        assert_eq!(id_in(&ids), "id IN ('a', 'o''k')");
        assert_eq!(
            combined_filter(&ids, Some("age > 3")).as_deref(),
            Some("(id IN ('a', 'o''k')) AND (age > 3)")
        );
        assert_eq!(combined_filter(&[], None), None);
    }

    #[test]
    fn a_filter_is_one_whole_expression() {
        for ok in [
            "age > 1",
            "name = 'a''b' AND (age IS NULL OR age < 3)",
            "age == 3",
        ] {
            whole_filter(ok).unwrap();
        }
        for bad in [
            "age > 1) OR (1 = 1",
            "age > 1 LIMIT 0",
            "age > 1; DROP TABLE t",
        ] {
            let e = whole_filter(bad).unwrap_err();
            assert_eq!(e.kind(), crate::error::ErrorKind::BadConfig, "{bad}: {e}");
        }
    }

    #[test]
    fn a_bad_filter_is_one_config_line() {
        let e = bad_filter("x ==", "Invalid SQL\nat line 3");
        assert_eq!(e.kind(), crate::error::ErrorKind::BadConfig);
        assert!(!e.to_string().contains('\n'), "{e}");
    }
}
