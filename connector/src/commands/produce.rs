//! `produce`: JSON-lines records (`{"key": …, "value": …}`, value `null` =
//! a tombstone) to a topic, creating it if missing. For samples and tests;
//! the connector never produces source records.

use std::path::Path;

use crate::config::Config;
use crate::error::{Error, PublicResult, Result};
use crate::kafka::produce::{self, KeyValue};

/// One line of a `produce` file.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct LineRecord {
    #[serde(default)]
    key: Option<serde_json::Value>,
    #[serde(default)]
    value: Option<serde_json::Value>,
}

/// Produces every record of `file` to `topic` (created with `partitions`
/// when missing); returns how many.
pub async fn produce_file(
    config: &Config,
    topic: &str,
    file: &Path,
    partitions: i32,
) -> PublicResult<usize> {
    produce::ensure_topic(config, topic, partitions).await?;
    let text = std::fs::read_to_string(file)
        .map_err(|e| Error::config(format!("cannot read {}: {e}", file.display())))?;
    let records = parse_lines(&text, &file.display().to_string())?;
    produce::produce(config, topic, &records).await?;
    Ok(records.len())
}

/// The records of a JSON-lines text; blank lines are skipped. A string key
/// is sent as is, any other JSON as its text.
fn parse_lines(text: &str, name: &str) -> Result<Vec<KeyValue>> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(n, line)| {
            let rec: LineRecord = serde_json::from_str(line)
                .map_err(|e| Error::config(format!("{name}:{}: {e}", n + 1)))?;
            let key = rec.key.map(|k| match k {
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            });
            let value = rec.value.filter(|v| !v.is_null()).map(|v| v.to_string());
            Ok(KeyValue { key, value })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_become_records_and_a_bad_line_is_named() {
        let text = "{\"key\": \"a\", \"value\": {\"n\": 1}}\n\n{\"key\": [\"x\", 7], \"value\": null}\n{\"value\": 2}\n";
        let kv = |k: Option<&str>, v: Option<&str>| KeyValue {
            key: k.map(str::to_string),
            value: v.map(str::to_string),
        };
        assert_eq!(
            parse_lines(text, "f.jsonl").unwrap(),
            vec![
                kv(Some("a"), Some("{\"n\":1}")),
                kv(Some("[\"x\",7]"), None),
                kv(None, Some("2")),
            ]
        );
        let e = parse_lines("{}\n{\"kee\": 1}\n", "f.jsonl").unwrap_err();
        assert!(e.to_string().contains("f.jsonl:2"), "{e}");
    }
}
