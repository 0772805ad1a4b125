//! The split search: the records that passed the screen are decoded as one
//! batch (the fast path); when a bad record fails the batch, the search
//! finds it, so that each bad record is refused alone and every good one
//! still becomes a row.

use crate::error::Result;
use crate::rejects::{Reject, RejectCode};

use super::rows::Part;
use super::{Fail, RecordDecoder, SourceRecord};

/// What `part_or_split` made of some records: their rows, and the records
/// refused, by index into the records it was given.
#[derive(Default)]
pub(super) struct Sorted {
    pub(super) part: Part,
    pub(super) rejects: Vec<(usize, Reject)>,
}

impl Sorted {
    /// Adds the part decoded from the records at `idx`.
    fn add(&mut self, p: Part, idx: &[usize]) {
        self.part.rows.extend(p.rows);
        self.part.up_idx.extend(p.up_idx.iter().map(|&i| idx[i]));
        self.part.del_ids.extend(p.del_ids);
        self.part.del_idx.extend(p.del_idx.iter().map(|&i| idx[i]));
    }
}

impl RecordDecoder {
    /// The records at `ok` (those the screen let through) as rows and
    /// rejects, by index into `records` (the poll).
    pub(super) fn rows_of(&mut self, records: &[SourceRecord<'_>], ok: &[usize]) -> Result<Sorted> {
        let screened: Vec<SourceRecord<'_>> = ok.iter().map(|&i| records[i]).collect();
        let mut sorted = self.part_or_split(&screened)?;
        // Back to poll indices.
        let part = &mut sorted.part;
        part.up_idx.iter_mut().for_each(|j| *j = ok[*j]);
        part.del_idx.iter_mut().for_each(|j| *j = ok[*j]);
        sorted.rejects.iter_mut().for_each(|(j, _)| *j = ok[*j]);
        Ok(sorted)
    }

    /// Decodes `records` as one batch. When that fails, one pass over the
    /// batch names the records that fail on their own terms (`suspect`):
    /// the rest are decoded again as one batch and each suspect alone. So a
    /// poll with b bad records of n costs about two batch decodes plus b
    /// single ones, not a re-decode per halving level (which made a 1 %
    /// reject storm cost ~7 decodes of the poll). A failure the pass cannot
    /// name falls back to halving, until each bad record fails alone.
    fn part_or_split(&mut self, records: &[SourceRecord<'_>]) -> Result<Sorted> {
        let mut out = Sorted::default();
        // Indices of records to decode as one batch, and whether they were
        // already looked at one by one.
        let mut todo: Vec<(Vec<usize>, bool)> = vec![((0..records.len()).collect(), false)];
        while let Some((idx, looked)) = todo.pop() {
            if idx.is_empty() {
                continue;
            }
            self.decodes += 1;
            let step = if idx.len() == records.len() {
                self.part(records)
            } else {
                let batch: Vec<SourceRecord<'_>> = idx.iter().map(|&i| records[i]).collect();
                self.part(&batch)
            };
            match step {
                Ok(p) => out.add(p, &idx),
                Err(Fail::System(e)) => return Err(e),
                Err(Fail::Record(code, m)) => {
                    if let [i] = idx[..] {
                        let r = &records[i];
                        // A batch decode's errors are generic (arrow-json's
                        // are): the format's `classify` names the field and
                        // tells a type from an overflow.
                        let generic =
                            matches!(code, RejectCode::WrongType | RejectCode::NotAnObject);
                        let (code, m) = match self.classify(r) {
                            Some(better) if generic => better,
                            _ => (code, m),
                        };
                        out.rejects.push((i, self.reject(r, code, m, None)));
                        continue;
                    }
                    if !looked {
                        // A suspect is only decoded alone, not refused: a
                        // value the pass faults that arrow-json takes is kept.
                        let (suspects, rest): (Vec<usize>, Vec<usize>) =
                            idx.iter().partition(|&&i| self.suspect(&records[i]));
                        if !suspects.is_empty() {
                            todo.push((rest, true));
                            todo.extend(suspects.into_iter().rev().map(|i| (vec![i], true)));
                            continue;
                        }
                    }
                    let mid = idx.len() / 2;
                    todo.push((idx[mid..].to_vec(), true));
                    todo.push((idx[..mid].to_vec(), true));
                }
            }
        }
        Ok(out)
    }

    /// Whether a record would fail a batch decode on its own: a tombstone
    /// without a usable key, or a value the format finds fault with.
    fn suspect(&self, r: &SourceRecord<'_>) -> bool {
        match r.value {
            None => self.tombstone_id(r).is_err(),
            Some(_) => self.classify(r).is_some(),
        }
    }

    /// The format's precise code and message for a record's value.
    fn classify(&self, r: &SourceRecord<'_>) -> Option<(RejectCode, String)> {
        self.format.classify(r.value?)
    }

    /// Batch decodes so far (tests: a bad record must not cost a decode per
    /// record of its poll).
    #[cfg(test)]
    pub(super) fn decodes(&self) -> u64 {
        self.decodes
    }
}
