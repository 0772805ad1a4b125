//! The base view: what the checks need of the base tables at one commit,
//! read once before they run. Keeps only what this fold's rows can ask
//! about: each base table a check needs is streamed once (a column or
//! two, batch by batch) and probed against the fold's own values with a
//! hash set, so memory follows the fold, and a base row costs a hash probe
//! and no allocation (docs/perf/2026-12-02-fold-cost-against-graph-size.md, "Fold cost against graph size").

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{BuildHasher, Hash, Hasher};

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StringArray, UInt32Array};
use arrow::datatypes::UInt64Type;
use futures::TryStreamExt;
use lance::dataset::ProjectionRequest;

use super::unique::{tuples, Held};
use crate::config::Sharding;
use crate::error::{Context, Error, Result};
use crate::fold::keys::{homed, known_ids_at};
use crate::fold::read::ReadSet;
use crate::fold::rows::{concat_all, pending_since, read_all, scan_each, strings, FastSet};
use crate::graph::Graph;
use crate::known_ids::{Hasher as KnownHasher, Kind, KnownIds};

use crate::schema::{
    pending_table, EdgeEnds, GraphSchema, GraphType, Provenance, ID, SRC_PARTITION,
};

/// The base tables at one commit, as far as this fold's checks look.
#[derive(Debug, Default)]
pub(crate) struct BaseView {
    /// Committed ids per node table, among the edge endpoints the fold
    /// asks about (its edges and the deferred ones).
    pub node_ids: HashMap<String, HashSet<String>>,
    /// What `@card` needs of each edge table with one.
    pub card: HashMap<String, CardBase>,
    /// Committed edges that touch a node this fold deletes, per edge table.
    pub links: HashMap<String, Vec<Link>>,
    /// Committed `@unique` tuples per table, one list per constraint (in
    /// the schema's order), in scan order: the rows holding a tuple that
    /// a row of this fold may claim (rows with a null part hold none).
    pub uniques: HashMap<String, Vec<Vec<Held>>>,
    /// Deferred edges per edge table.
    pub pending: HashMap<String, Pending>,
    /// Under partition sharding: per node table, the source partition of
    /// the committed row of each id this fold writes or deletes (ids not
    /// committed are absent).
    pub homes: HashMap<String, HashMap<String, u32>>,
}

/// A committed edge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Link {
    pub id: String,
    pub src: String,
    pub dst: String,
}

/// The committed edges `@card` counts, as far as this fold can change them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CardBase {
    /// Committed edges per `src`, for every `src` of the fold's candidate
    /// edges and of the committed edges it rewrites or deletes (absent: 0).
    /// Under `narrowing`, only the candidates' `src`s: no other count is
    /// read then.
    pub count: HashMap<String, u64>,
    /// The `src` of each committed edge among the fold's candidates, its
    /// deletes and the edges that touch a node it deletes; under
    /// `narrowing`, of those whose `src` a candidate names.
    pub src_of: HashMap<String, String>,
}

impl From<Vec<Link>> for CardBase {
    /// Every edge counted (tests build views from whole tables).
    fn from(links: Vec<Link>) -> CardBase {
        let mut c = CardBase::default();
        for l in links {
            *c.count.entry(l.src.clone()).or_default() += 1;
            c.src_of.insert(l.id, l.src);
        }
        c
    }
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
    pub(crate) fn has_node(&self, table: &str, id: &str) -> bool {
        self.node_ids.get(table).is_some_and(|s| s.contains(id))
    }
}

/// Reads the view of the tables at `base` (table → pinned version) that the
/// checks of `read` (plus the retried deferred edges) need.
pub(crate) async fn read_view(
    graph: &Graph,
    known: &KnownIds,
    base: &BTreeMap<String, u64>,
    retry_pending: &[String],
    read: &ReadSet,
) -> Result<BaseView> {
    let mut r = ViewReader {
        graph,
        known,
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
            let found = existing_ids(graph, known, &table, v, &ids).await?;
            r.view.node_ids.insert(table, found);
        }
    }
    if graph.layout().sharding == Sharding::Partition {
        r.homes().await?;
    }
    Ok(r.view)
}

/// The state of one `read_view`.
struct ViewReader<'a> {
    graph: &'a Graph,
    known: &'a KnownIds,
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

    /// The committed rows' partitions of the ids each node table of the
    /// read writes or deletes, from the known ids (a scan fills them once).
    async fn homes(&mut self) -> Result<()> {
        for ty in self.graph.schema.nodes() {
            let (Some(r), Some(v)) = (self.read.get(&ty.table), self.at(&ty.table)) else {
                continue;
            };
            let mut ids: HashSet<String> = r.deletes.iter().cloned().collect();
            if let Some(rows) = &r.upserts {
                ids.extend(strings(rows, ID)?.iter().flatten().map(str::to_string));
            }
            if ids.is_empty() {
                continue;
            }
            let homes = lookup_ids(self.graph, self.known, &ty.table, v, &ids)
                .await?
                .into_iter()
                .filter_map(|(id, home)| Some((id, home?)))
                .collect();
            self.view.homes.insert(ty.table.clone(), homes);
        }
        Ok(())
    }

    /// A node table's committed `@unique` tuples; notes its deletes. The
    /// rows and deletes of ids read from a second partition count too:
    /// `home::rehome` may keep one of them instead of the lowest
    /// partition's (partition sharding), and the view is read before the
    /// checks decide. Entries no kept row uses change nothing.
    async fn node_table(&mut self, ty: &GraphType) -> Result<()> {
        let Some(r) = self.read.get(&ty.table) else {
            return Ok(());
        };
        let claims: Vec<&RecordBatch> = r.upserts.iter().chain(&r.conflicts.upserts).collect();
        if let Some(v) = self.at(&ty.table) {
            if !claims.is_empty() && !ty.constraints.uniques.is_empty() {
                let held = read_uniques(self.graph, ty, v, &claims).await?;
                self.view.uniques.insert(ty.table.clone(), held);
            }
        }
        let deleted: HashSet<String> = (r.deletes.iter())
            .chain(r.conflicts.deletes.iter().map(|(id, _)| id))
            .cloned()
            .collect();
        if !deleted.is_empty() {
            self.deleted.insert(ty.name.clone(), deleted);
        }
        Ok(())
    }

    /// An edge table's deferred edges, its committed edges that touch a
    /// deleted node, what `@card` and `@unique` need of it; notes the
    /// endpoints its candidates (this fold's edges and the deferred ones)
    /// ask about.
    async fn edge_table(&mut self, ty: &GraphType, ends: &EdgeEnds, touched: bool) -> Result<()> {
        let pt = pending_table(&ty.table);
        if let Some(pv) = self.at(&pt) {
            if let Some(p) = read_pending(self.graph, ty, &pt, pv).await? {
                self.view.pending.insert(ty.table.clone(), p);
            }
        }
        let read = self.read.get(&ty.table);
        let deletes = read.map(|r| r.deletes.as_slice()).unwrap_or_default();
        let pending = self.view.pending.get(&ty.table).map(|p| p.rows.clone());
        let cands: Vec<&RecordBatch> = read
            .and_then(|r| r.upserts.as_ref())
            .into_iter()
            .chain(pending.as_ref())
            .collect();
        if let Some(v) = self.at(&ty.table) {
            self.probe_edges(ty, ends, touched, v, &cands, deletes)
                .await?;
        }
        for rows in cands {
            self.want(ends, rows)?;
        }
        Ok(())
    }

    /// What the committed edges at `v` tell the checks: the edges that
    /// touch a deleted node, `@card`'s counts and `@unique`'s holders of
    /// the candidates' tuples. One scan of the edge table (or a read of
    /// the candidates' `src`s alone, see `narrowing`) feeds every probe
    /// this fold needs.
    async fn probe_edges(
        &mut self,
        ty: &GraphType,
        ends: &EdgeEnds,
        touched: bool,
        v: u64,
        cands: &[&RecordBatch],
        deletes: &[String],
    ) -> Result<()> {
        let ds = self.graph.open_table(&ty.table, Some(v)).await?;
        let carded = ends.card_max.is_some() || ends.card_min > 0;
        let uniques = !ty.constraints.uniques.is_empty() && !cands.is_empty();
        let mut touch = touched
            .then(|| Touching::new(self.deleted.get(&ends.from), self.deleted.get(&ends.to)));
        let mut card = carded.then(|| CardProbe::new(cands, deletes)).transpose()?;
        let mut unique = uniques.then(|| UniqueProbe::new(ty, cands)).transpose()?;
        let cols = probe_cols(touch.is_some(), card.is_some(), unique.as_ref());
        let cols: Vec<&str> = cols.iter().map(String::as_str).collect();
        let mut feed = |b: &RecordBatch| -> Result<()> {
            let hit = match &mut touch {
                Some(t) => t.batch(b)?,
                None => vec![],
            };
            if let Some(c) = &mut card {
                c.batch(b, &hit)?;
            }
            if let Some(u) = &mut unique {
                u.batch(b)?;
            }
            Ok(())
        };
        let needed = touched || carded || uniques;
        match needed
            .then(|| narrowing(ty, ends, touched, cands))
            .transpose()?
        {
            None => {}
            Some(Some(srcs)) => self.read_srcs(ty, &ds, &cols, &srcs, &mut feed).await?,
            Some(None) => scan_each(&ds, &cols, feed).await?,
        }
        if let Some(t) = touch {
            self.view.links.insert(ty.table.clone(), t.links);
        }
        if let Some(c) = card {
            self.view
                .card
                .insert(ty.table.clone(), c.finish(&ds).await?);
        }
        if let Some(u) = unique {
            self.view.uniques.insert(ty.table.clone(), u.held);
        }
        Ok(())
    }

    /// Narrowed: `src` alone is scanned, and only the rows of the fold's
    /// `srcs` are read whole, into `feed` (one string column decoded per
    /// committed edge instead of three).
    async fn read_srcs(
        &self,
        ty: &GraphType,
        ds: &lance::Dataset,
        cols: &[&str],
        srcs: &FastSet<String>,
        feed: &mut impl FnMut(&RecordBatch) -> Result<()>,
    ) -> Result<()> {
        let t = std::time::Instant::now();
        let ids = row_ids_of(self.graph, self.known, &ty.table, ds, srcs).await?;
        let find_s = t.elapsed().as_secs_f64();
        if !ids.is_empty() {
            let proj = ProjectionRequest::from_columns(cols.iter(), ds.schema());
            let rows = ds
                .take_rows(&ids, proj)
                .await
                .ctx("read the committed edges of the fold's srcs")?;
            feed(&rows)?;
        }
        tracing::debug!(
            table = %ty.table, srcs = srcs.len(), edges = ids.len(), find_s,
            read_s = t.elapsed().as_secs_f64() - find_s,
            "read the committed edges of the fold's srcs"
        );
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

/// The columns the probes read: `id`, then `src` for `Touching` and
/// `CardProbe`, `dst` for `Touching`, and every column a `@unique` names.
fn probe_cols(touch: bool, card: bool, unique: Option<&UniqueProbe>) -> Vec<String> {
    let mut cols: Vec<String> = vec![ID.into()];
    if touch || card {
        cols.push("src".into());
    }
    if touch {
        cols.push("dst".into());
    }
    cols.extend(unique.map(|u| u.cols()).unwrap_or_default());
    let mut seen = HashSet::new();
    cols.retain(|c| seen.insert(c.clone()));
    cols
}

/// The `src`s the edge scan can keep to, or `None` to probe every row.
/// When the fold deletes no node, `@card` has no minimum and every
/// `@unique` names `src`, only committed edges whose `src` a candidate
/// names can change a check: `@card` counts just those `src`s (a
/// rewritten or deleted edge elsewhere only lowers a count that has no
/// floor), and a tuple a candidate claims has the candidate's `src`. One
/// probe of `src` then skips every other row, instead of a probe per
/// column per row (the scan of a 10M-edge table: docs/perf/2026-12-02-fold-cost-against-graph-size.md).
fn narrowing(
    ty: &GraphType,
    ends: &EdgeEnds,
    touched: bool,
    cands: &[&RecordBatch],
) -> Result<Option<FastSet<String>>> {
    let uniques_name_src = ty
        .constraints
        .uniques
        .iter()
        .all(|u| u.iter().any(|c| c == "src"));
    if touched || ends.card_min > 0 || !uniques_name_src {
        return Ok(None);
    }
    let mut srcs = FastSet::default();
    for rows in cands {
        srcs.extend(strings(rows, "src")?.iter().flatten().map(str::to_string));
    }
    Ok(Some(srcs))
}

/// The row ids of the committed edges whose `src` is in `srcs`: from the
/// `src` tags known with the table's ids (a pass over them, no decode; a
/// superset on a 64-bit collision, which the probes read past), else a
/// scan of `src` alone.
async fn row_ids_of(
    graph: &Graph,
    known: &KnownIds,
    table: &str,
    ds: &lance::Dataset,
    srcs: &FastSet<String>,
) -> Result<Vec<u64>> {
    let set = known_ids_at(graph, known, table, ds.version().version).await?;
    if let Some(set) = set.filter(|s| s.kind() == Kind::Sourced) {
        let tags: HashSet<u64, KnownHasher> = srcs.iter().map(|s| known.src_tag(s)).collect();
        // Without stable row ids, a row's id is its address.
        let mut ids = known.with_src_tags(&set, &tags);
        ids.sort_unstable();
        return Ok(ids);
    }
    let what = || format!("scan {} for the fold's srcs", ds.uri());
    let mut scan = ds.scan();
    scan.project(&["src"]).ctx(what())?;
    scan.with_row_id();
    let mut stream = scan.try_into_stream().await.ctx(what())?;
    let mut ids = Vec::new();
    while let Some(b) = stream.try_next().await.ctx(what())? {
        let src = strings(&b, "src")?;
        let rid = b
            .column_by_name(lance_core::ROW_ID)
            .and_then(|c| c.as_primitive_opt::<UInt64Type>())
            .ok_or_else(|| {
                Error::Corrupt(format!(
                    "{}: a scan with row ids has no {}",
                    ds.uri(),
                    lance_core::ROW_ID
                ))
            })?;
        ids.extend(
            (0..b.num_rows())
                .filter(|&i| src.is_valid(i) && srcs.contains(src.value(i)))
                .map(|i| rid.value(i)),
        );
    }
    Ok(ids)
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

fn fast_set<'a>(items: impl IntoIterator<Item = &'a str>) -> FastSet<&'a str> {
    items.into_iter().collect()
}

/// The committed rows holding a `@unique` tuple that a row of `claims`
/// may claim, per constraint (a node table's own scan).
async fn read_uniques(
    graph: &Graph,
    ty: &GraphType,
    v: u64,
    claims: &[&RecordBatch],
) -> Result<Vec<Vec<Held>>> {
    let ds = graph.open_table(&ty.table, Some(v)).await?;
    let mut probe = UniqueProbe::new(ty, claims)?;
    let mut cols = vec![ID.to_string()];
    cols.extend(probe.cols().into_iter().filter(|c| c != ID));
    let cols: Vec<&str> = cols.iter().map(String::as_str).collect();
    scan_each(&ds, &cols, |b| probe.batch(b)).await?;
    Ok(probe.held)
}

/// Finds the committed holders of the `@unique` tuples a fold may claim.
/// Each base batch's tuples are hashed column-wise and probed; only the
/// hits (and the rare hash collisions, which the exact comparison in
/// `unique_violations` drops) become strings.
struct UniqueProbe {
    /// Per constraint: its columns and the hashes of the claimed tuples.
    wanted: Vec<(Vec<String>, FastSet<u64>)>,
    hasher: foldhash::fast::RandomState,
    /// Per constraint, in scan order.
    held: Vec<Vec<Held>>,
}

impl UniqueProbe {
    fn new(ty: &GraphType, claims: &[&RecordBatch]) -> Result<UniqueProbe> {
        let hasher = foldhash::fast::RandomState::default();
        let mut wanted = Vec::new();
        for u in &ty.constraints.uniques {
            let cols: Vec<&str> = u.iter().map(String::as_str).collect();
            let mut set = FastSet::default();
            for rows in claims {
                set.extend(tuple_hashes(rows, &cols, &hasher)?.into_iter().flatten());
            }
            wanted.push((u.clone(), set));
        }
        let held = vec![Vec::new(); wanted.len()];
        Ok(UniqueProbe {
            wanted,
            hasher,
            held,
        })
    }

    /// Every column a constraint names.
    fn cols(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for (cols, _) in &self.wanted {
            for c in cols {
                if !out.contains(c) {
                    out.push(c.clone());
                }
            }
        }
        out
    }

    fn batch(&mut self, b: &RecordBatch) -> Result<()> {
        for (k, (cols, wanted)) in self.wanted.iter().enumerate() {
            if wanted.is_empty() {
                continue;
            }
            let cols: Vec<&str> = cols.iter().map(String::as_str).collect();
            let hits: UInt32Array = tuple_hashes(b, &cols, &self.hasher)?
                .into_iter()
                .enumerate()
                .filter(|(_, h)| h.is_some_and(|h| wanted.contains(&h)))
                .map(|(i, _)| Some(i as u32))
                .collect();
            if hits.is_empty() {
                continue;
            }
            let b = arrow::compute::take_record_batch(b, &hits).ctx("@unique holders")?;
            let ids = strings(&b, ID)?;
            for (i, t) in tuples(&b, &cols)?.into_iter().enumerate() {
                if let Some(tuple) = t {
                    let id = ids.value(i).to_string();
                    self.held[k].push(Held { tuple, id });
                }
            }
        }
        Ok(())
    }
}

/// Each row's hash of its `cols` as text (the parts `tuples` spells), or
/// `None` when a part is null: equal tuples hash equal.
fn tuple_hashes(
    rows: &RecordBatch,
    cols: &[&str],
    hasher: &foldhash::fast::RandomState,
) -> Result<Vec<Option<u64>>> {
    let texts: Vec<ArrayRef> = cols
        .iter()
        .map(|c| {
            let col = rows
                .column_by_name(c)
                .ok_or_else(|| Error::Corrupt(format!("no column {c} for @unique")))?;
            arrow::compute::cast(col, &arrow_schema::DataType::Utf8).ctx("@unique to text")
        })
        .collect::<Result<_>>()?;
    let texts: Vec<&StringArray> = texts
        .iter()
        .map(|t| {
            t.as_any()
                .downcast_ref::<StringArray>()
                .expect("cast to Utf8")
        })
        .collect();
    Ok((0..rows.num_rows())
        .map(|i| {
            if texts.iter().any(|t| t.is_null(i)) {
                return None;
            }
            let mut h = hasher.build_hasher();
            for t in &texts {
                t.value(i).hash(&mut h);
            }
            Some(h.finish())
        })
        .collect())
}

/// Finds the committed edges whose `src` is a deleted node of the edge's
/// `from` type or whose `dst` is one of its `to` type.
struct Touching {
    from: FastSet<String>,
    to: FastSet<String>,
    links: Vec<Link>,
}

impl Touching {
    fn new(from: Option<&HashSet<String>>, to: Option<&HashSet<String>>) -> Touching {
        Touching {
            from: from.into_iter().flatten().cloned().collect(),
            to: to.into_iter().flatten().cloned().collect(),
            links: Vec::new(),
        }
    }

    /// Notes the touching rows of `b`; returns their indexes.
    fn batch(&mut self, b: &RecordBatch) -> Result<Vec<usize>> {
        let (id, src, dst) = (strings(b, ID)?, strings(b, "src")?, strings(b, "dst")?);
        let mut hit = Vec::new();
        for i in 0..b.num_rows() {
            if self.from.contains(src.value(i)) || self.to.contains(dst.value(i)) {
                hit.push(i);
                self.links.push(Link {
                    id: id.value(i).to_string(),
                    src: src.value(i).to_string(),
                    dst: dst.value(i).to_string(),
                });
            }
        }
        Ok(hit)
    }
}

/// Finds what `@card` needs of the committed edges: the `src` of every
/// edge the fold may rewrite (its candidates), delete, or cascade (the
/// touching edges), and the edge count of every `src` those and the
/// candidates name.
struct CardProbe {
    ids: FastSet<String>,
    srcs: FastSet<String>,
    out: CardBase,
}

impl CardProbe {
    fn new(cands: &[&RecordBatch], deletes: &[String]) -> Result<CardProbe> {
        let mut ids: FastSet<String> = deletes.iter().cloned().collect();
        let mut srcs = FastSet::default();
        for rows in cands {
            ids.extend(strings(rows, ID)?.iter().flatten().map(str::to_string));
            srcs.extend(strings(rows, "src")?.iter().flatten().map(str::to_string));
        }
        Ok(CardProbe {
            ids,
            srcs,
            out: CardBase::default(),
        })
    }

    /// Counts `b`'s edges of the wanted `src`s and notes the `src` of the
    /// wanted ids and of the `touching` rows.
    fn batch(&mut self, b: &RecordBatch, touching: &[usize]) -> Result<()> {
        let (id, src) = (strings(b, ID)?, strings(b, "src")?);
        for i in 0..b.num_rows() {
            let s = src.value(i);
            if self.srcs.contains(s) {
                bump(&mut self.out.count, s);
            }
            if self.ids.contains(id.value(i)) {
                self.out
                    .src_of
                    .insert(id.value(i).to_string(), s.to_string());
            }
        }
        for &i in touching {
            self.out
                .src_of
                .insert(id.value(i).to_string(), src.value(i).to_string());
        }
        Ok(())
    }

    /// Counts the `src`s of rewritten, deleted or cascaded edges that no
    /// candidate names: a second scan of `src`, only when there are any.
    async fn finish(mut self, ds: &lance::Dataset) -> Result<CardBase> {
        let more: FastSet<String> = self
            .out
            .src_of
            .values()
            .filter(|s| !self.srcs.contains(s.as_str()))
            .cloned()
            .collect();
        if !more.is_empty() {
            let count = &mut self.out.count;
            scan_each(ds, &["src"], |b| {
                for s in strings(b, "src")?.iter().flatten() {
                    if more.contains(s) {
                        bump(count, s);
                    }
                }
                Ok(())
            })
            .await?;
        }
        Ok(self.out)
    }
}

fn bump(count: &mut HashMap<String, u64>, key: &str) {
    match count.get_mut(key) {
        Some(n) => *n += 1,
        None => {
            count.insert(key.to_string(), 1);
        }
    }
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
    // By name: a column added by a schema change is stored after
    // `_pending_since`.
    let cols = (ty.table_schema.fields().iter())
        .map(|f| all.schema().index_of(f.name()))
        .collect::<std::result::Result<Vec<_>, _>>()
        .ctx(pt)?;
    let rows = all.project(&cols).ctx(pt)?;
    Ok(Some(Pending { rows, since }))
}

/// Which of `ids` exist in `table` at version `v`.
async fn existing_ids(
    graph: &Graph,
    known: &KnownIds,
    table: &str,
    v: u64,
    ids: &HashSet<String>,
) -> Result<HashSet<String>> {
    Ok(lookup_ids(graph, known, table, v, ids)
        .await?
        .into_keys()
        .collect())
}

/// Which of `ids` exist in `table` at version `v`, each with its row's
/// source partition under partition sharding (else `None`): from the ids
/// the fold knows for that version (one scan fills them), else, past
/// `fold.known_ids_max`, from a scan of `id` (and `_src_partition`).
async fn lookup_ids(
    graph: &Graph,
    known: &KnownIds,
    table: &str,
    v: u64,
    ids: &HashSet<String>,
) -> Result<HashMap<String, Option<u32>>> {
    if let Some(set) = known_ids_at(graph, known, table, v).await? {
        return Ok(ids
            .iter()
            .filter(|id| known.contains(&set, id))
            .map(|id| (id.clone(), known.home(&set, id)))
            .collect());
    }
    let homed = homed(graph, table);
    let ds = graph.open_table(table, Some(v)).await?;
    let wanted = fast_set(ids.iter().map(String::as_str));
    let mut found = HashMap::new();
    let columns: &[&str] = if homed { &[ID, SRC_PARTITION] } else { &[ID] };
    scan_each(&ds, columns, |b| {
        let homes = homed.then(|| Provenance::partitions(b)).transpose()?;
        for (i, id) in strings(b, ID)?.iter().enumerate() {
            let Some(id) = id.filter(|id| wanted.contains(id)) else {
                continue;
            };
            let home = homes.and_then(|h| h.is_valid(i).then(|| h.value(i) as u32));
            found.insert(id.to_string(), home);
        }
        Ok(())
    })
    .await?;
    Ok(found)
}
