//! `read` and `neighbors`: rows of a type, and one hop from a node, at
//! the head, at a commit, or fresh (docs/reads.md). They read only.

use crate::config::Config;
use crate::error::{PublicResult, Result};
use crate::graph::Graph;
use crate::read::{Neighbors, NeighborsRequest, ReadRequest, Rows};
use crate::schema::GraphSchema;

/// Rows of one type of the config's graph.
pub async fn read(config: &Config, req: &ReadRequest) -> PublicResult<Rows> {
    Graph::open_configured(config).await?.read(req).await
}

/// The access path of a read: Lance's plan.
pub(crate) async fn explain(config: &Config, req: &ReadRequest) -> Result<String> {
    Ok(Graph::open_configured(config).await?.explain(req).await?)
}

/// One hop from a node of the config's graph, the edge types' ends as the
/// config's schema declares them.
pub async fn neighbors(config: &Config, req: &NeighborsRequest) -> PublicResult<Neighbors> {
    let graph = Graph::open_configured(config).await?;
    let schema = GraphSchema::load(&config.schema_path())?;
    crate::read::one_hop(&graph, &schema, req).await
}
