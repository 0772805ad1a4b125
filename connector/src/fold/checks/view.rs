//! The base view: what the checks need of the base tables at one commit,
//! read once before they run. Reads only what this fold's rows can ask
//! about, so a fold's cost follows its rows and its constraints.

use std::collections::{BTreeMap, HashMap, HashSet};

use arrow::array::RecordBatch;

use super::unique::tuples;
use crate::error::{Context, Error, Result};
use crate::fold::read::ReadSet;
use crate::fold::rows::{concat_all, pending_since, read_all, strings};
use crate::graph::Graph;
use crate::schema::{pending_table, EdgeEnds, GraphSchema, GraphType, ID};

/// The base tables at one commit, as far as this fold's checks look.
#[derive(Debug, Default)]
pub(crate) struct BaseView {
    /// Committed ids per node table, among the edge endpoints the fold
    /// asks about (its edges and the deferred ones).
    pub node_ids: HashMap<String, HashSet<String>>,
    /// Every committed edge of each edge table with a `@card`.
    pub card: HashMap<String, Vec<Link>>,
    /// Committed edges that touch a node this fold deletes, per edge table.
    pub links: HashMap<String, Vec<Link>>,
    /// Committed `@unique` tuples per table, one list per constraint (in
    /// the schema's order), in scan order; rows with a null part hold none.
    pub uniques: HashMap<String, Vec<Vec<Held>>>,
    /// Deferred edges per edge table.
    pub pending: HashMap<String, Pending>,
}

/// A committed edge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Link {
    pub id: String,
    pub src: String,
    pub dst: String,
}

/// A committed row holding a `@unique` tuple.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Held {
    pub tuple: String,
    pub id: String,
}

/// The deferred edges of one edge table, in its `_pending/` table's order.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    /// In the edge table's columns.
    pub rows: RecordBatch,
    /// When each was first deferred.
    pub since: Vec<i64>,
}

impl BaseView {
    /// Whether `id` is a committed node of `table` (for ids the fold asked about).
    pub fn has_node(&self, table: &str, id: &str) -> bool {
        self.node_ids.get(table).is_some_and(|s| s.contains(id))
    }
}

/// Reads the view of the tables at `base` (table → pinned version) that the
/// checks of `read` (plus the retried deferred edges) need.
pub(crate) async fn read_view(
    graph: &Graph,
    base: &BTreeMap<String, u64>,
    retry_pending: &[String],
    read: &ReadSet,
) -> Result<BaseView> {
    let mut r = ViewReader {
        graph,
        base,
        read,
        view: BaseView::default(),
        deleted: HashMap::new(),
        wanted: HashMap::new(),
    };
    for ty in graph.schema.nodes() {
        r.node_table(ty).await?;
    }
    for ty in graph.schema.edges() {
        let ends = ty.ends.as_ref().ok_or_else(|| no_ends(ty))?;
        let touched = r.deleted.contains_key(&ends.from) || r.deleted.contains_key(&ends.to);
        if read.contains_key(&ty.table) || touched || retry_pending.contains(&ty.table) {
            r.edge_table(ty, ends, touched).await?;
        }
    }
    for (table, ids) in std::mem::take(&mut r.wanted) {
        if let Some(v) = r.at(&table) {
            let found = existing_ids(graph, &table, v, &ids).await?;
            r.view.node_ids.insert(table, found);
        }
    }
    Ok(r.view)
}

/// The state of one `read_view`.
struct ViewReader<'a> {
    graph: &'a Graph,
    base: &'a BTreeMap<String, u64>,
    read: &'a ReadSet,
    view: BaseView,
    /// Node ids this fold deletes, per node type name.
    deleted: HashMap<String, HashSet<String>>,
    /// Endpoint ids the fold's edges ask about, per node table.
    wanted: HashMap<String, HashSet<String>>,
}

impl ViewReader<'_> {
    fn at(&self, table: &str) -> Option<u64> {
        self.base.get(table).copied()
    }

    /// A node table's committed `@unique` tuples; notes its deletes.
    async fn node_table(&mut self, ty: &GraphType) -> Result<()> {
        let Some(r) = self.read.get(&ty.table) else {
            return Ok(());
        };
        if r.upserts.is_some() && !ty.constraints.uniques.is_empty() {
            if let Some(v) = self.at(&ty.table) {
                let held = read_uniques(self.graph, ty, v).await?;
                self.view.uniques.insert(ty.table.clone(), held);
            }
        }
        if !r.deletes.is_empty() {
            self.deleted
                .insert(ty.name.clone(), r.deletes.iter().cloned().collect());
        }
        Ok(())
    }

    /// An edge table's committed edges (for `@card` and for deleted
    /// nodes), `@unique` tuples and deferred edges; notes its endpoints.
    async fn edge_table(&mut self, ty: &GraphType, ends: &EdgeEnds, touched: bool) -> Result<()> {
        let carded = ends.card_max.is_some() || ends.card_min > 0;
        if let Some(v) = self.at(&ty.table) {
            if touched || carded {
                let links = read_links(self.graph, ty, v).await?;
                if touched {
                    let from = self.deleted.get(&ends.from);
                    let to = self.deleted.get(&ends.to);
                    let hit = |l: &&Link| {
                        from.is_some_and(|d| d.contains(&l.src))
                            || to.is_some_and(|d| d.contains(&l.dst))
                    };
                    let touching = links.iter().filter(hit).cloned().collect();
                    self.view.links.insert(ty.table.clone(), touching);
                }
                if carded {
                    self.view.card.insert(ty.table.clone(), links);
                }
            }
            if !ty.constraints.uniques.is_empty() {
                let held = read_uniques(self.graph, ty, v).await?;
                self.view.uniques.insert(ty.table.clone(), held);
            }
        }
        let pt = pending_table(&ty.table);
        if let Some(pv) = self.at(&pt) {
            if let Some(p) = read_pending(self.graph, ty, &pt, pv).await? {
                self.view.pending.insert(ty.table.clone(), p);
            }
        }
        let read = self.read;
        if let Some(rows) = read.get(&ty.table).and_then(|r| r.upserts.as_ref()) {
            self.want(ends, rows)?;
        }
        if let Some(p) = self.view.pending.get(&ty.table) {
            let rows = p.rows.clone();
            self.want(ends, &rows)?;
        }
        Ok(())
    }

    /// Notes the endpoints of `rows` as ids to look up.
    fn want(&mut self, ends: &EdgeEnds, rows: &RecordBatch) -> Result<()> {
        for (node, col) in [(&ends.from, "src"), (&ends.to, "dst")] {
            let table = node_table(&self.graph.schema, node)?;
            let set = self.wanted.entry(table).or_default();
            set.extend(strings(rows, col)?.iter().flatten().map(str::to_string));
        }
        Ok(())
    }
}

pub(super) fn no_ends(ty: &GraphType) -> Error {
    Error::Corrupt(format!("edge type {} has no endpoints", ty.name))
}

/// The table of node type `name`.
pub(super) fn node_table(schema: &GraphSchema, name: &str) -> Result<String> {
    schema
        .get(name)
        .map(|t| t.table.clone())
        .ok_or_else(|| Error::Corrupt(format!("endpoint type {name} is not in the schema")))
}

async fn read_uniques(graph: &Graph, ty: &GraphType, v: u64) -> Result<Vec<Vec<Held>>> {
    let ds = graph.open_table(&ty.table, Some(v)).await?;
    let mut out = Vec::new();
    for u in &ty.constraints.uniques {
        let cols: Vec<&str> = u.iter().map(String::as_str).collect();
        let mut proj = vec![ID];
        proj.extend(&cols);
        let mut held = Vec::new();
        for b in read_all(&ds, Some(&proj)).await? {
            let ids = strings(&b, ID)?;
            for (i, t) in tuples(&b, &cols)?.into_iter().enumerate() {
                if let Some(tuple) = t {
                    held.push(Held {
                        tuple,
                        id: ids.value(i).to_string(),
                    });
                }
            }
        }
        out.push(held);
    }
    Ok(out)
}

async fn read_links(graph: &Graph, ty: &GraphType, v: u64) -> Result<Vec<Link>> {
    let ds = graph.open_table(&ty.table, Some(v)).await?;
    let mut out = Vec::new();
    for b in read_all(&ds, Some(&[ID, "src", "dst"])).await? {
        let (id, src, dst) = (strings(&b, ID)?, strings(&b, "src")?, strings(&b, "dst")?);
        for i in 0..b.num_rows() {
            out.push(Link {
                id: id.value(i).to_string(),
                src: src.value(i).to_string(),
                dst: dst.value(i).to_string(),
            });
        }
    }
    Ok(out)
}

async fn read_pending(graph: &Graph, ty: &GraphType, pt: &str, v: u64) -> Result<Option<Pending>> {
    let ds = graph.open_table(pt, Some(v)).await?;
    let Some(all) = concat_all(read_all(&ds, None).await?)? else {
        return Ok(None);
    };
    let since = pending_since(&all)?
        .iter()
        .map(|s| s.unwrap_or_default())
        .collect();
    let rows = all
        .project(&(0..ty.table_schema.fields().len()).collect::<Vec<_>>())
        .ctx(pt)?;
    Ok(Some(Pending { rows, since }))
}

/// Which of `ids` exist in `table` at version `v`.
async fn existing_ids(
    graph: &Graph,
    table: &str,
    v: u64,
    ids: &HashSet<String>,
) -> Result<HashSet<String>> {
    let ds = graph.open_table(table, Some(v)).await?;
    let mut found = HashSet::new();
    for b in read_all(&ds, Some(&[ID])).await? {
        for id in strings(&b, ID)?.iter().flatten() {
            if ids.contains(id) {
                found.insert(id.to_string());
            }
        }
    }
    Ok(found)
}
