//! The graph as plain Lance reads it: the head graph commit in
//! `__manifest`, its chain of commits, and every table at the version the
//! head pins.

use std::collections::{BTreeMap, HashMap};

use arrow_array::RecordBatch;
use futures::TryStreamExt;
use graphsink_testkit::Host;
use serde_json::Value;

use super::Res;

/// Where a graph is and how plain Lance reaches it: a local path, or an
/// `s3://` root with the object store's options, served from a network
/// namespace (`host`) that the harness's own threads must enter to reach.
#[derive(Clone)]
pub(crate) struct GraphRoot {
    pub uri: String,
    pub storage: HashMap<String, String>,
    pub host: Option<Host>,
}

impl GraphRoot {
    pub(crate) fn local(path: &str) -> GraphRoot {
        GraphRoot {
            uri: path.to_string(),
            storage: HashMap::new(),
            host: None,
        }
    }

    /// Runs `read` against this root: here, or on a thread of its own that
    /// entered the host's namespace, with a runtime of its own (the object
    /// store's connections are made where its tasks run).
    async fn read<T, F>(&self, read: impl FnOnce(GraphRoot) -> F + Send + 'static) -> Res<T>
    where
        T: Send + 'static,
        F: std::future::Future<Output = Res<T>>,
    {
        let Some(host) = self.host.clone() else {
            return read(self.clone()).await;
        };
        let root = self.clone();
        tokio::task::spawn_blocking(move || {
            host.enter(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| format!("runtime: {e}"))?;
                rt.block_on(read(root))
            })?
        })
        .await
        .map_err(|e| format!("graph read: {e}"))?
    }
}

/// The graph at its head commit, read with plain Lance.
pub(crate) struct Snapshot {
    pub seq: u64,
    pub items: BTreeMap<String, Value>,
    pub links: BTreeMap<String, Value>,
    pub pending_links: BTreeMap<String, Value>,
    pub dangles: BTreeMap<String, Value>,
    pub rejects: Vec<Value>,
}

async fn open(root: &GraphRoot, table: &str, version: Option<u64>) -> Res<lance::Dataset> {
    let uri = format!("{}/{table}", root.uri);
    let ds = lance::dataset::builder::DatasetBuilder::from_uri(&uri)
        .with_storage_options(root.storage.clone())
        .load()
        .await
        .map_err(|e| format!("open {uri}: {e}"))?;
    match version {
        Some(v) => ds
            .checkout_version(v)
            .await
            .map_err(|e| format!("open {uri} at version {v}: {e}")),
        None => Ok(ds),
    }
}

async fn rows(ds: &lance::Dataset, filter: Option<&str>) -> Res<Vec<Value>> {
    let mut scan = ds.scan();
    if let Some(f) = filter {
        scan.filter(f).map_err(|e| e.to_string())?;
    }
    let batches: Vec<RecordBatch> = scan
        .try_into_stream()
        .await
        .map_err(|e| e.to_string())?
        .try_collect()
        .await
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for b in batches {
        let mut buf = Vec::new();
        let mut w = arrow_json::ArrayWriter::new(&mut buf);
        w.write(&b).map_err(|e| e.to_string())?;
        w.finish().map_err(|e| e.to_string())?;
        if b.num_rows() > 0 {
            let v: Vec<Value> = serde_json::from_slice(&buf).map_err(|e| e.to_string())?;
            out.extend(v);
        }
    }
    Ok(out)
}

fn payload(row: &Value) -> Res<Value> {
    let p = row["payload"]
        .as_str()
        .ok_or_else(|| format!("manifest row without payload: {row}"))?;
    serde_json::from_str(p).map_err(|e| format!("manifest payload: {e}"))
}

/// The schema version of the head graph commit (0 before any schema
/// commit).
pub(crate) async fn schema_version(root: &GraphRoot) -> Res<u64> {
    root.read(|root| async move { schema_version_here(&root).await })
        .await
}

async fn schema_version_here(root: &GraphRoot) -> Res<u64> {
    let manifest = open(root, "__manifest", None).await?;
    let head = rows(&manifest, Some("object_id = 'graph_head:main'")).await?;
    let head = payload(head.first().ok_or("no graph_head:main in __manifest")?)?;
    Ok(head["schema_version"].as_u64().unwrap_or(0))
}

/// Reads the head graph commit and every table at the version it pins.
/// Also checks the commit log: every commit's pinned versions open, and
/// the commits form one chain of consecutive sequence numbers.
pub(crate) async fn snapshot(root: &GraphRoot) -> Res<Snapshot> {
    root.read(|root| async move { snapshot_here(&root).await })
        .await
}

async fn snapshot_here(root: &GraphRoot) -> Res<Snapshot> {
    let manifest = open(root, "__manifest", None).await?;
    let head = rows(&manifest, Some("object_id = 'graph_head:main'")).await?;
    let head = payload(head.first().ok_or("no graph_head:main in __manifest")?)?;
    let commits = rows(&manifest, Some("object_id LIKE 'graph_commit:%'")).await?;
    let mut by_id = HashMap::new();
    for c in &commits {
        let c = payload(c)?;
        by_id.insert(c["id"].as_str().unwrap_or_default().to_string(), c);
    }
    // Walk the chain from the head: seq falls by one at each parent, and
    // every commit of the log is on it (a second commit with the same
    // parent would be a fork: two graph commits for one fold).
    let mut at = head.clone();
    let mut on_chain = 1;
    loop {
        let seq = at["seq"].as_u64().ok_or("commit without seq")?;
        match at["parent"].as_str() {
            None => break,
            Some(p) => {
                let parent = by_id
                    .get(p)
                    .ok_or_else(|| format!("commit {seq}: parent {p} is not in the log"))?;
                if parent["seq"].as_u64() != seq.checked_sub(1) {
                    return Err(format!("commit {seq}: parent has seq {}", parent["seq"]));
                }
                at = parent.clone();
                on_chain += 1;
            }
        }
    }
    if on_chain != by_id.len() {
        return Err(format!(
            "the commit log holds {} commits, the head's chain {on_chain}: a fork",
            by_id.len()
        ));
    }
    let tables: BTreeMap<String, u64> =
        serde_json::from_value(head["tables"].clone()).map_err(|e| format!("head tables: {e}"))?;
    let mut read = BTreeMap::new();
    for (table, version) in &tables {
        let ds = open(root, table, Some(*version)).await?;
        read.insert(table.clone(), rows(&ds, None).await?);
    }
    let mut by_id = |table: &str| -> Res<BTreeMap<String, Value>> {
        let mut m = BTreeMap::new();
        for r in read.remove(table).unwrap_or_default() {
            let id = r["id"].as_str().ok_or("row without id")?.to_string();
            if let Some(old) = m.insert(id.clone(), r) {
                return Err(format!("{table}: id {id} twice (also {old})"));
            }
        }
        Ok(m)
    };
    Ok(Snapshot {
        seq: head["seq"].as_u64().unwrap_or(0),
        items: by_id("nodes/Item")?,
        links: by_id("edges/Link")?,
        pending_links: by_id("_pending/Link")?,
        dangles: by_id("edges/Dangle")?,
        rejects: read.remove("_ingest_rejects").unwrap_or_default(),
    })
}

impl Snapshot {
    /// Per topic and partition, one past the newest source offset any row
    /// of the graph names.
    pub(crate) fn offsets_seen(&self) -> BTreeMap<String, BTreeMap<i32, i64>> {
        let mut out: BTreeMap<String, BTreeMap<i32, i64>> = BTreeMap::new();
        let tables = [&self.items, &self.links, &self.pending_links, &self.dangles];
        let rows = tables.into_iter().flat_map(|t| t.values());
        let mut note = |topic: Option<&str>, p: Option<i64>, o: Option<i64>| {
            if let (Some(t), Some(p), Some(o)) = (topic, p, o) {
                let e = out
                    .entry(t.to_string())
                    .or_default()
                    .entry(p as i32)
                    .or_insert(0);
                *e = (*e).max(o + 1);
            }
        };
        for r in rows {
            note(
                r["_src_topic"].as_str(),
                r["_src_partition"].as_i64(),
                r["_src_offset"].as_i64(),
            );
        }
        for r in &self.rejects {
            note(
                r["topic"].as_str(),
                r["partition"].as_i64(),
                r["offset"].as_i64(),
            );
        }
        out
    }
}
