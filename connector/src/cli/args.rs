//! Argument types and parsers of the CLI that clap cannot derive alone:
//! the reject filter and its `--stage` and `--since` values; what `read`
//! and `neighbors` read.

use super::rows::RowFormat;
use crate::commands::rejects::RejectFilter;
use crate::read::{Direction, NeighborsRequest, ReadAt, ReadRequest};
use crate::rejects::Stage;
use crate::types::now_ms;

/// Which rejects `rejects` and `replay-rejects` select.
#[derive(clap::Args, Debug, Clone, Default)]
pub(super) struct RejectFilterArgs {
    /// Only rejects of this stage: decode, validate or fold.
    #[arg(long, value_parser = parse_stage)]
    stage: Option<Stage>,
    /// Only rejects of this graph type.
    #[arg(long = "type", value_name = "TYPE")]
    type_name: Option<String>,
    /// Only rejects at or after this time: RFC 3339 (`2026-01-01T00:00:00Z`)
    /// or a duration ago (`10m`, `2h 30m`, `1d`).
    #[arg(long, value_name = "TIME", value_parser = parse_since)]
    since: Option<i64>,
}

impl From<RejectFilterArgs> for RejectFilter {
    fn from(a: RejectFilterArgs) -> RejectFilter {
        RejectFilter {
            stage: a.stage,
            type_name: a.type_name,
            since: a.since,
        }
    }
}

/// What `read` reads and how it prints.
#[derive(clap::Args, Debug, Clone)]
pub(super) struct ReadArgs {
    /// The graph type (`Person`, `Knows`).
    #[arg(long = "type", value_name = "TYPE")]
    type_name: String,
    /// Only this id (the primary key); repeat for several.
    #[arg(long = "id", value_name = "ID")]
    ids: Vec<String>,
    /// A Lance SQL filter on the type's columns (`age > 30 AND name LIKE 'A%'`).
    #[arg(long, value_name = "SQL")]
    filter: Option<String>,
    /// Only these columns, in this order (`id,name`).
    #[arg(long, value_delimiter = ',', value_name = "A,B")]
    columns: Option<Vec<String>>,
    /// Read at this graph commit instead of the head.
    #[arg(long, value_name = "ID", conflicts_with = "fresh")]
    commit: Option<String>,
    /// Also read what is durable in the WAL and not yet folded (each row
    /// gets `_tier`: base or wal). Not a graph commit: docs/reads.md.
    #[arg(long)]
    fresh: bool,
    /// Print at most this many rows.
    #[arg(long, default_value_t = 100)]
    limit: usize,
    #[arg(long, value_enum, default_value_t)]
    pub(super) format: RowFormat,
    /// Print the read's access path (Lance's plan) instead of its rows.
    #[arg(long)]
    pub(super) explain: bool,
}

impl ReadArgs {
    pub(super) fn request(&self) -> ReadRequest {
        ReadRequest {
            type_name: self.type_name.clone(),
            ids: self.ids.clone(),
            filter: self.filter.clone(),
            columns: self.columns.clone(),
            at: at(self.commit.as_deref(), self.fresh),
            limit: Some(self.limit),
        }
    }
}

/// One hop from a node, and how it prints.
#[derive(clap::Args, Debug, Clone)]
pub(super) struct NeighborsArgs {
    /// The node's type.
    #[arg(long = "type", value_name = "TYPE")]
    type_name: String,
    /// The node's id.
    #[arg(long)]
    id: String,
    /// Only edges of this type; repeat for several (default: every edge
    /// type with an end at the node's type).
    #[arg(long = "edge", value_name = "EDGE")]
    edges: Vec<String>,
    #[arg(long, value_enum, default_value = "both")]
    direction: DirectionArg,
    /// Read at this graph commit instead of the head.
    #[arg(long, value_name = "ID", conflicts_with = "fresh")]
    commit: Option<String>,
    /// Also read the WAL tier (docs/reads.md).
    #[arg(long)]
    fresh: bool,
    #[arg(long, value_enum, default_value_t)]
    pub(super) format: RowFormat,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum DirectionArg {
    Out,
    In,
    Both,
}

impl NeighborsArgs {
    pub(super) fn request(&self) -> NeighborsRequest {
        NeighborsRequest {
            type_name: self.type_name.clone(),
            id: self.id.clone(),
            edges: self.edges.clone(),
            direction: match self.direction {
                DirectionArg::Out => Direction::Out,
                DirectionArg::In => Direction::In,
                DirectionArg::Both => Direction::Both,
            },
            at: at(self.commit.as_deref(), self.fresh),
        }
    }
}

fn at(commit: Option<&str>, fresh: bool) -> ReadAt {
    match (commit, fresh) {
        (Some(c), _) => ReadAt::Commit(c.to_string()),
        (None, true) => ReadAt::Fresh,
        (None, false) => ReadAt::Head,
    }
}

fn parse_stage(s: &str) -> std::result::Result<Stage, String> {
    s.parse()
        .map_err(|_| "expected decode, validate or fold".to_string())
}

fn parse_since(s: &str) -> std::result::Result<i64, String> {
    parse_since_at(s, now_ms())
}

/// `--since` as epoch milliseconds: an RFC 3339 time, or `now` minus a
/// humantime duration.
fn parse_since_at(s: &str, now_ms: i64) -> std::result::Result<i64, String> {
    let s = s.trim();
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Ok(t.timestamp_millis());
    }
    match humantime_serde::re::humantime::parse_duration(s) {
        Ok(d) => i64::try_from(d.as_millis())
            .ok()
            .and_then(|d| now_ms.checked_sub(d))
            .filter(|&ms| chrono::DateTime::from_timestamp_millis(ms).is_some())
            .ok_or_else(|| format!("duration {s:?} reaches too far back")),
        Err(e) => Err(format!(
            "expected an RFC 3339 time (2026-01-01T00:00:00Z) or a duration ago (10m, 2h): {e}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z

    #[test]
    fn since_takes_rfc3339_or_a_duration_ago() {
        assert_eq!(parse_since_at("2026-01-01T00:00:00Z", 0), Ok(NOW));
        assert_eq!(
            parse_since_at("2026-01-01T01:00:00.5+01:00", 0),
            Ok(NOW + 500)
        );
        assert_eq!(parse_since_at("10m", NOW), Ok(NOW - 600_000));
        assert_eq!(parse_since_at("1h 30m", NOW), Ok(NOW - 5_400_000));
        assert!(parse_since_at("yesterday", NOW).is_err());
        assert!(parse_since_at("2026-01-01", NOW).is_err());
    }

    #[test]
    fn stages_parse_by_their_lowercase_names() {
        assert_eq!(parse_stage("validate"), Ok(Stage::Validate));
        assert!(parse_stage("Fold").is_err());
    }
}
