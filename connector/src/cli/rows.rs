//! Printing rows (`read`, `neighbors`) as a table, JSON lines or CSV.
//! JSON is arrow-json's, as every row graphsink prints as JSON (a
//! reject's `row`); CSV and the table use Arrow's display of each value.

use std::io::Write;

use arrow::array::RecordBatch;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use arrow_schema::{ArrowError, SchemaRef};

use crate::error::{Context, Error, Result};
use crate::read::{Direction, Neighbors, Rows};

/// How `read` and `neighbors` print rows.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum RowFormat {
    /// A boxed table, for people.
    #[default]
    Table,
    /// One JSON object per row.
    Jsonl,
    /// A header line, then one line per row (RFC 4180 quoting; null is empty).
    Csv,
}

/// Rows in `format` to stdout; a summary line to stderr.
pub(super) fn rows(r: &Rows, format: RowFormat) -> Result<()> {
    let mut out = std::io::stdout().lock();
    write_rows(&mut out, &r.schema, &r.batches, format)?;
    eprintln!(
        "{} row(s) of {} at graph commit {} (seq {})",
        r.num_rows(),
        r.table,
        r.commit.id,
        r.commit.seq
    );
    Ok(())
}

/// One hop, per (edge type, direction): the edges, then their other ends.
/// As JSON lines, one object per edge (`edge`, `direction`, `row`) and
/// one per node (`node`, `row`).
pub(super) fn neighbors(n: &Neighbors, format: RowFormat) -> Result<()> {
    let mut out = std::io::stdout().lock();
    for h in &n.hops {
        let dir = match h.direction {
            Direction::Out => "out",
            Direction::In => "in",
            Direction::Both => "both",
        };
        match format {
            RowFormat::Jsonl => {
                for (kind, name, rows) in [
                    ("edge", &h.edge_type, &h.edges),
                    ("node", &h.node_type, &h.nodes),
                ] {
                    for line in json_lines(&rows.batches)? {
                        let head = format!(
                            "{{\"{kind}\":{},\"direction\":\"{dir}\",\"row\":",
                            serde_json::Value::from(name.as_str())
                        );
                        writeln!(out, "{head}{line}}}")
                            .map_err(ArrowError::from)
                            .ctx("stdout")?;
                    }
                }
            }
            _ => {
                writeln!(
                    out,
                    "{} ({dir}): {} edge(s)",
                    h.edge_type,
                    h.edges.num_rows()
                )
                .map_err(ArrowError::from)
                .ctx("stdout")?;
                write_rows(&mut out, &h.edges.schema, &h.edges.batches, format)?;
                writeln!(
                    out,
                    "{} at the other end: {} node(s)",
                    h.node_type,
                    h.nodes.num_rows()
                )
                .map_err(ArrowError::from)
                .ctx("stdout")?;
                write_rows(&mut out, &h.nodes.schema, &h.nodes.batches, format)?;
            }
        }
    }
    Ok(())
}

pub(super) fn write_rows(
    out: &mut impl Write,
    schema: &SchemaRef,
    batches: &[RecordBatch],
    format: RowFormat,
) -> Result<()> {
    match format {
        RowFormat::Table => {
            let t = arrow::util::pretty::pretty_format_batches_with_schema(schema.clone(), batches)
                .ctx("format rows")?;
            writeln!(out, "{t}").map_err(ArrowError::from).ctx("stdout")
        }
        RowFormat::Jsonl => {
            for line in json_lines(batches)? {
                writeln!(out, "{line}")
                    .map_err(ArrowError::from)
                    .ctx("stdout")?;
            }
            Ok(())
        }
        RowFormat::Csv => {
            let names: Vec<String> = schema
                .fields()
                .iter()
                .map(|f| csv_field(f.name()))
                .collect();
            writeln!(out, "{}", names.join(","))
                .map_err(ArrowError::from)
                .ctx("stdout")?;
            let opts = FormatOptions::default();
            for b in batches {
                let cols: Vec<ArrayFormatter<'_>> = b
                    .columns()
                    .iter()
                    .map(|c| ArrayFormatter::try_new(c.as_ref(), &opts))
                    .collect::<std::result::Result<_, _>>()
                    .ctx("format rows")?;
                for i in 0..b.num_rows() {
                    let cells: Vec<String> = b
                        .columns()
                        .iter()
                        .zip(&cols)
                        .map(|(c, f)| {
                            if c.is_null(i) {
                                String::new()
                            } else {
                                csv_field(&f.value(i).to_string())
                            }
                        })
                        .collect();
                    writeln!(out, "{}", cells.join(","))
                        .map_err(ArrowError::from)
                        .ctx("stdout")?;
                }
            }
            Ok(())
        }
    }
}

/// Each row as one JSON object (arrow-json: the canonical JSON of a row).
fn json_lines(batches: &[RecordBatch]) -> Result<Vec<String>> {
    let mut w = arrow_json::LineDelimitedWriter::new(Vec::new());
    for b in batches {
        w.write(b).ctx("rows as JSON")?;
    }
    w.finish().ctx("rows as JSON")?;
    let text = String::from_utf8(w.into_inner()).map_err(|e| Error::Bug(e.to_string()))?;
    Ok(text.lines().map(str::to_string).collect())
}

/// A CSV field, quoted when it holds a comma, a quote or a line break.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use arrow::array::{Int32Array, StringArray};
    use arrow_schema::{DataType, Field, Schema};

    fn batch() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, false),
            Field::new("age", DataType::Int32, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(vec!["a,b", "say \"hi\""])),
                Arc::new(Int32Array::from(vec![Some(3), None])),
            ],
        )
        .unwrap()
    }

    fn printed(format: RowFormat) -> String {
        let b = batch();
        let mut out = Vec::new();
        write_rows(&mut out, &b.schema(), &[b], format).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn csv_quotes_what_needs_it_and_prints_null_as_empty() {
        assert_eq!(
            printed(RowFormat::Csv),
            "id,age\n\"a,b\",3\n\"say \"\"hi\"\"\",\n"
        );
    }

    #[test]
    fn jsonl_is_one_object_per_row_without_nulls() {
        assert_eq!(
            printed(RowFormat::Jsonl),
            "{\"id\":\"a,b\",\"age\":3}\n{\"id\":\"say \\\"hi\\\"\"}\n"
        );
    }

    #[test]
    fn a_table_has_the_header_even_without_rows() {
        let b = batch();
        let mut out = Vec::new();
        write_rows(&mut out, &b.schema(), &[], RowFormat::Table).unwrap();
        assert!(String::from_utf8(out).unwrap().contains("| id | age |"));
    }
}
