//! Log compaction of a range's sealed segments: the I/O around the pure
//! decisions of [`crate::cleaner`].
//!
//! Crash safety: a segment's cleaned copy is written beside it as
//! `<seq>.cleaned` and fsynced; then the old `.idx` is removed (durably),
//! the copy renamed over `<seq>.log` and the directory fsynced; the new
//! `.idx` is written last. A crash before the rename leaves the original
//! (a stray `.cleaned` is deleted at the next open); after it, the cleaned
//! segment with no index, which the open scans. Segments are swapped
//! oldest first, so a crash between two swaps never leaves an older value
//! of a key whose newer one (or tombstone) was already cleaned away.

use std::path::{Path, PathBuf};

use super::{now_ms, RangeLog, WriteState};
use crate::clean_pass::{self, PassSegment, PreparedPass};
use crate::cleaner::{CleanParams, SegmentStat, TxnInputs};
use crate::error::LogError;

pub use crate::clean_pass::cleaned_path;

/// The cleaner's checkpoint of a range: the first segment not cleaned since
/// it was written (Kafka's `cleaner-offset-checkpoint`, per range). Losing
/// it only makes the next pass see everything as dirty.
fn checkpoint_path(dir: &Path) -> PathBuf {
    dir.join("cleaner-checkpoint")
}

pub(super) fn remove_stray_copies(dir: &Path) -> Result<(), LogError> {
    clean_pass::remove_stray_copies(dir)
}

/// What the cleaner decides a pass on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CleaningView {
    /// Sealed segments, oldest first.
    pub segments: Vec<SegmentStat>,
    /// The first segment not cleaned since it was written.
    pub first_dirty_seq: u32,
}

/// What a pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CleanStats {
    /// Segments rewritten.
    pub rewritten: Vec<u32>,
    /// Bytes of the segments read (twice: once for the map, once to clean).
    pub bytes_read: u64,
    /// Bytes of the segments before and after (the segments cleaned).
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// Distinct keys in the offset map.
    pub keys: usize,
}

impl RangeLog {
    /// The sealed segments with what [`crate::cleaner::plan_pass`] needs.
    pub fn cleaning_view(&self) -> CleaningView {
        let first_dirty_seq = std::fs::read_to_string(checkpoint_path(&self.options.dir))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        let inner = self.inner.lock();
        let lo = self.options.lo;
        let mut txns = TxnInputs::default();
        let segments = inner
            .segments
            .iter()
            .filter(|s| s.sealed)
            .map(|s| {
                for (p, e) in PassSegment::of(s).batches {
                    txns.add(p, &e);
                }
                let entries = || s.index.partitions.values().flat_map(|e| e.iter());
                SegmentStat {
                    seq: s.seq,
                    size: s.size,
                    max_timestamp: entries().map(|e| e.max_timestamp).max().unwrap_or(-1),
                    first_batch_timestamp: s
                        .index
                        .partitions
                        .values()
                        .filter_map(|e| e.first().map(|e| e.max_timestamp))
                        .min()
                        .unwrap_or(-1),
                    stable: !txns.has_open_transaction()
                        && s.index.partitions.iter().all(|(p, entries)| {
                            let Some(pi) = p.checked_sub(lo) else {
                                return false;
                            };
                            let Some(last) = entries.last() else {
                                return true;
                            };
                            (pi as usize) < inner.partitions.len()
                                && last.last_offset < inner.offsets(pi as usize).last_stable
                        }),
                }
            })
            .collect();
        CleaningView {
            segments,
            first_dirty_seq,
        }
    }

    /// Cleans the sealed segments up to `up_to_seq` (inclusive) with
    /// `params`: [`RangeLog::prepare_pass`] then [`RangeLog::swap_prepared`].
    /// Never touches the active segment.
    pub fn clean(
        &self,
        up_to_seq: u32,
        params: CleanParams,
        pace: &mut dyn FnMut(u64),
    ) -> Result<CleanStats, LogError> {
        let seqs = self.sealed_seqs_up_to(up_to_seq);
        let prepared = self.prepare_pass(&seqs, params, pace)?;
        self.swap_prepared(&prepared)
    }

    /// The sealed segments held, up to `up_to_seq` (inclusive).
    pub fn sealed_seqs_up_to(&self, up_to_seq: u32) -> Vec<u32> {
        self.inner
            .lock()
            .segments
            .iter()
            .filter(|s| s.sealed && s.seq <= up_to_seq)
            .map(|s| s.seq)
            .collect()
    }

    /// Prepares a pass over the sealed segments `seqs` (oldest first):
    /// builds the offset map over all of them and writes the cleaned copy
    /// of each one whose batches change beside it, without swapping
    /// anything in (see [`crate::clean_pass`]). A segment not held is an
    /// error: a pass is defined by all of its segments.
    pub fn prepare_pass(
        &self,
        seqs: &[u32],
        params: CleanParams,
        pace: &mut dyn FnMut(u64),
    ) -> Result<PreparedPass, LogError> {
        let segments: Vec<PassSegment> = {
            let inner = self.inner.lock();
            seqs.iter()
                .map(|seq| {
                    inner
                        .segments
                        .iter()
                        .find(|s| s.sealed && s.seq == *seq)
                        .map(PassSegment::of)
                        .ok_or(LogError::SegmentNotFound(*seq))
                })
                .collect::<Result<_, _>>()?
        };
        clean_pass::prepare(&self.options.dir, &segments, params, pace)
    }

    /// Swaps the changed copies of a prepared pass in, oldest first, and
    /// moves the cleaner's checkpoint past its last segment.
    pub fn swap_prepared(&self, prepared: &PreparedPass) -> Result<CleanStats, LogError> {
        let mut stats = CleanStats {
            bytes_read: prepared.bytes_read,
            keys: prepared.keys,
            ..CleanStats::default()
        };
        let mut copies = prepared.copies.iter();
        while let Some(c) = copies.next() {
            if !c.changed {
                continue;
            }
            match self.swap_in(c.seq) {
                Ok(true) => {
                    stats.rewritten.push(c.seq);
                    stats.bytes_before += c.size_before;
                    stats.bytes_after += c.size_after;
                }
                Ok(false) => {}
                Err(e) => {
                    for c in copies.filter(|c| c.changed) {
                        let _ = std::fs::remove_file(cleaned_path(&self.options.dir, c.seq));
                    }
                    return Err(e);
                }
            }
        }
        if let Some(last) = prepared.copies.last() {
            tessera_fs::write_atomic(
                &checkpoint_path(&self.options.dir),
                format!("{}\n", last.seq + 1).as_bytes(),
            )?;
        }
        Ok(stats)
    }

    /// Replaces segment `seq` by its cleaned copy, unless retention
    /// removed it meanwhile. Serialized with retention by `files`.
    fn swap_in(&self, seq: u32) -> Result<bool, LogError> {
        let _files = self.files.lock();
        let dir = &self.options.dir;
        let copy = cleaned_path(dir, seq);
        if self.inner.lock().state == WriteState::Closed {
            // Closed (shutdown, or the range deleted) while this pass ran:
            // the directory is not this log's any more. The copy may be
            // gone already (a reopen removes stray copies).
            let _ = std::fs::remove_file(&copy);
            return Err(LogError::Closed);
        }
        let still_there = self
            .inner
            .lock()
            .segments
            .iter()
            .any(|seg| seg.seq == seq && seg.sealed);
        if !still_there {
            std::fs::remove_file(&copy)?;
            return Ok(false);
        }
        let cleaned = clean_pass::swap_copy(dir, seq, now_ms())?;
        let mut inner = self.inner.lock();
        let Some(slot) = inner.segments.iter_mut().find(|seg| seg.seq == seq) else {
            return Ok(false);
        };
        let old_size = slot.size;
        let created_ms = slot.created_ms;
        *slot = crate::segment::Segment {
            created_ms,
            ..cleaned
        };
        let new_size = slot.size;
        // Range-wide positions (replication, durability waits) keep
        // counting the bytes cleaning removed, as retention's do.
        inner.removed_bytes += old_size.saturating_sub(new_size);
        Ok(true)
    }
}
