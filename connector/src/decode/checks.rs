//! Checks on decoded rows: the `.pg` constraints (enum, `@range`,
//! `@check`, by `validate::Validator`), and `refuse_rows`, which takes
//! refused rows out of the batch as rejects (the partition-key check in
//! keys.rs uses it too).

use arrow::array::{BooleanArray, RecordBatch};
use arrow::compute::filter_record_batch;

use crate::error::{Context, Result};
use crate::rejects::{Reject, RejectCode};
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

    /// Drops `refused` rows (row, code, message) from `rows`, as rejects.
    pub(super) fn refuse_rows(
        &self,
        records: &[SourceRecord<'_>],
        rows: &RecordBatch,
        up_idx: Vec<usize>,
        refused: Vec<(usize, RejectCode, String)>,
    ) -> Result<Checked> {
        let mut rejects = Vec::with_capacity(refused.len());
        let mut keep = vec![true; rows.num_rows()];
        for (r, code, message) in refused {
            keep[r] = false;
            let i = up_idx[r];
            let row = row_json(rows, r);
            rejects.push((i, self.reject(&records[i], code, message, row)));
        }
        let mask = BooleanArray::from(keep.clone());
        let kept = filter_record_batch(rows, &mask).ctx("drop invalid rows")?;
        let up_idx = up_idx
            .into_iter()
            .zip(keep)
            .filter_map(|(i, k)| k.then_some(i))
            .collect();
        Ok(Checked {
            rows: Some(kept),
            up_idx,
            rejects,
        })
    }
}
