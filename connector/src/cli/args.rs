//! Argument types and parsers of the CLI that clap cannot derive alone:
//! the reject filter and its `--stage` and `--since` values.

use crate::commands::rejects::RejectFilter;
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
