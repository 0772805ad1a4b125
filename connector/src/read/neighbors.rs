//! One hop: a node's edges (by `src` going out, by `dst` coming in) and
//! the nodes at their other ends, each read as `Graph::read` reads (the
//! head, a commit, or fresh). The edges are found by a filtered scan of
//! the edge table (graphsink keeps no index on `src`/`dst`; docs/reads.md
//! gives the cost), the nodes by an `--id` lookup.

use std::collections::BTreeSet;

use arrow::array::{Array, StringArray};

use super::{sql_string, ReadAt, ReadRequest, Rows};
use crate::error::{Error, PublicResult, Result};
use crate::graph::Graph;
use crate::schema::GraphSchema;

/// Which edges of a node: those it starts (`out`), ends (`in`), or both.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Direction {
    Out,
    In,
    #[default]
    Both,
}

/// One hop from a node.
#[derive(Debug, Clone, Default)]
pub struct NeighborsRequest {
    /// The node's type and id.
    pub type_name: String,
    pub id: String,
    /// Only these edge types; empty: every edge type with an end at the
    /// node's type.
    pub edges: Vec<String>,
    pub direction: Direction,
    pub at: ReadAt,
}

/// The edges of one type in one direction, and the nodes at their other ends.
#[derive(Debug, Clone)]
pub struct Hop {
    pub edge_type: String,
    /// `Out`: the node is `src`; `In`: it is `dst`.
    pub direction: Direction,
    pub edges: Rows,
    /// The type at the other end, and its rows for the edges' other ids
    /// (an id with no row here is an edge whose other end is not, or not
    /// yet, a node: possible in a fresh read).
    pub node_type: String,
    pub nodes: Rows,
}

/// What `neighbors` found: one hop per (edge type, direction).
#[derive(Debug, Clone)]
pub struct Neighbors {
    pub hops: Vec<Hop>,
}

impl Graph {
    /// One hop from a node, with the graph's schema (a graph opened for
    /// reading without one must use `one_hop` with the config's).
    pub async fn neighbors(&self, req: &NeighborsRequest) -> PublicResult<Neighbors> {
        one_hop(self, &self.schema.clone(), req).await
    }
}

/// One hop from a node, the edge types' ends taken from `schema`.
pub async fn one_hop(
    graph: &Graph,
    schema: &GraphSchema,
    req: &NeighborsRequest,
) -> PublicResult<Neighbors> {
    let node = schema
        .nodes()
        .find(|t| t.name == req.type_name)
        .ok_or_else(|| Error::config(format!("no node type {:?} in the schema", req.type_name)))?;
    for e in &req.edges {
        if !schema.edges().any(|t| &t.name == e) {
            return Err(Error::config(format!("--edge: no edge type {e:?} in the schema")).into());
        }
    }
    let mut hops = Vec::new();
    for edge in schema.edges() {
        if !req.edges.is_empty() && !req.edges.contains(&edge.name) {
            continue;
        }
        let Some(ends) = &edge.ends else { continue };
        let mut ways = Vec::new();
        if req.direction != Direction::In && ends.from == node.name {
            ways.push((Direction::Out, "src", "dst", ends.to.clone()));
        }
        if req.direction != Direction::Out && ends.to == node.name {
            ways.push((Direction::In, "dst", "src", ends.from.clone()));
        }
        for (direction, this_end, other_end, node_type) in ways {
            let edges = graph
                .read(&ReadRequest {
                    type_name: edge.name.clone(),
                    filter: Some(format!("{this_end} = {}", sql_string(&req.id))),
                    at: req.at.clone(),
                    ..Default::default()
                })
                .await?;
            let others = column_values(&edges, other_end)?;
            // No ids would read every node: no edges, no node rows.
            let limit = others.is_empty().then_some(0);
            let nodes = graph
                .read(&ReadRequest {
                    type_name: node_type.clone(),
                    ids: others.into_iter().collect(),
                    limit,
                    // Both sides at the edges' commit (a fresh read: the
                    // head the edges were merged over, or a newer one).
                    at: match &req.at {
                        ReadAt::Fresh => ReadAt::Fresh,
                        _ => ReadAt::Commit(edges.commit.id.clone()),
                    },
                    ..Default::default()
                })
                .await?;
            hops.push(Hop {
                edge_type: edge.name.clone(),
                direction,
                edges,
                node_type,
                nodes,
            });
        }
    }
    Ok(Neighbors { hops })
}

/// The distinct values of a string column of some rows.
fn column_values(rows: &Rows, column: &str) -> Result<BTreeSet<String>> {
    let mut out = BTreeSet::new();
    for b in &rows.batches {
        let col = b
            .column_by_name(column)
            .and_then(|c| c.as_any().downcast_ref::<StringArray>())
            .ok_or_else(|| Error::Bug(format!("edge rows without a text {column}")))?;
        out.extend(
            (0..col.len())
                .filter(|&i| col.is_valid(i))
                .map(|i| col.value(i).to_string()),
        );
    }
    Ok(out)
}
