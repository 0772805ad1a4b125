//! Checks on decoded rows: the `.pg` constraints (enum, `@range`,
//! `@check`, by `validate::Validator`), and `refuse_rows`, which takes
//! refused rows out of the batch as rejects (the partition-key check in
//! keys.rs uses it too).

use arrow::array::RecordBatch;

use crate::error::Result;
use crate::rejects::{self, RefusedRow, Reject, RejectCode};
use crate::schema::row_json;

use super::{RecordDecoder, SourceRecord};

/// Rows that passed a check, their poll indices, and the rejects of those
/// that did not.
pub(super) struct Checked {
    pub(super) rows: Option<RecordBatch>,
    pub(super) up_idx: Vec<usize>,
    pub(super) rejects: Vec<(usize, Reject)>,
}

impl Checked {
    /// Every row kept.
    pub(super) fn unchanged(rows: Option<RecordBatch>, up_idx: Vec<usize>) -> Checked {
        Checked {
            rows,
            up_idx,
            rejects: vec![],
        }
    }
}

impl RecordDecoder {
    /// `.pg` constraints (enum, `@range`, `@check`) over the decoded rows;
    /// violating rows become rejects and leave the batch.
    pub(super) fn check_constraints(
        &self,
        records: &[SourceRecord<'_>],
        upserts: Option<RecordBatch>,
        up_idx: Vec<usize>,
    ) -> Result<Checked> {
        let Some(rows) = upserts.as_ref().filter(|_| !self.validator.is_empty()) else {
            return Ok(Checked::unchanged(upserts, up_idx));
        };
        let violations = self.validator.check(rows);
        if violations.is_empty() {
            return Ok(Checked::unchanged(upserts, up_idx));
        }
        let refused = violations
            .into_iter()
            .map(|v| (v.row, v.code, v.message))
            .collect();
        self.refuse_rows(records, rows, up_idx, refused)
    }

    /// Drops `refused` rows (row, code, message) from `rows`, as rejects
    /// of their records (`rejects::refuse_rows`).
    pub(super) fn refuse_rows(
        &self,
        records: &[SourceRecord<'_>],
        rows: &RecordBatch,
        up_idx: Vec<usize>,
        refused: Vec<(usize, RejectCode, String)>,
    ) -> Result<Checked> {
        let refused =
            (refused.into_iter()).map(|(row, code, message)| RefusedRow { row, code, message });
        let out = rejects::refuse_rows(rows, refused, |r| {
            let i = up_idx[r.row];
            let row = row_json(rows, r.row);
            (i, self.reject(&records[i], r.code, r.message, row))
        })?;
        let up_idx = up_idx
            .into_iter()
            .zip(out.keep)
            .filter_map(|(i, k)| k.then_some(i))
            .collect();
        Ok(Checked {
            rows: Some(out.kept),
            up_idx,
            rejects: out.refused,
        })
    }
}
