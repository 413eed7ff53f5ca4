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

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{now_ms, RangeLog, WriteState};
use crate::cleaner::{CleanParams, Cleaned, OffsetMapBuilder, Pass, SegmentStat};
use crate::error::LogError;
use crate::segment::{self, IndexEntry, Segment, FRAME_HEADER_LEN};
use crate::txn_state::AbortedTxn;

/// `<seq>.cleaned`: a segment's cleaned copy before it replaces the segment.
pub fn cleaned_path(dir: &Path, seq: u32) -> PathBuf {
    dir.join(format!("{seq:010}.cleaned"))
}

/// The cleaner's checkpoint of a range: the first segment not cleaned since
/// it was written (Kafka's `cleaner-offset-checkpoint`, per range). Losing
/// it only makes the next pass see everything as dirty.
fn checkpoint_path(dir: &Path) -> PathBuf {
    dir.join("cleaner-checkpoint")
}

/// Deletes the cleaned copies a crash left before their swap.
pub(super) fn remove_stray_copies(dir: &Path) -> Result<(), LogError> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().ends_with(".cleaned") {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
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

/// One sealed segment as the pass sees it.
struct Snapshot {
    seq: u32,
    file: Arc<File>,
    /// `(partition, entry)` in file order.
    batches: Vec<(u32, IndexEntry)>,
    size: u64,
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
        let segments = inner
            .segments
            .iter()
            .filter(|s| s.sealed)
            .map(|s| {
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
                    stable: s.index.partitions.iter().all(|(p, entries)| {
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
    /// `params`: builds the offset map over all of them, then rewrites each
    /// one whose batches change, oldest first, swapping it in atomically.
    /// `pace` is called with the bytes read or written as the pass goes
    /// (the caller throttles by it). Never touches the active segment.
    pub fn clean(
        &self,
        up_to_seq: u32,
        params: CleanParams,
        pace: &mut dyn FnMut(u64),
    ) -> Result<CleanStats, LogError> {
        let (snapshots, aborted, last_batches) = {
            let inner = self.inner.lock();
            let snapshots: Vec<Snapshot> = inner
                .segments
                .iter()
                .filter(|s| s.sealed && s.seq <= up_to_seq)
                .map(|s| {
                    let mut batches: Vec<(u32, IndexEntry)> = s
                        .index
                        .partitions
                        .iter()
                        .flat_map(|(p, e)| e.iter().map(move |e| (*p, *e)))
                        .collect();
                    batches.sort_unstable_by_key(|(_, e)| e.position);
                    Snapshot {
                        seq: s.seq,
                        file: s.file.clone(),
                        batches,
                        size: s.size,
                    }
                })
                .collect();
            let lo = self.options.lo;
            let mut aborted: HashMap<u32, Vec<AbortedTxn>> = HashMap::new();
            let mut last_batches: HashMap<(u32, i64), i64> = HashMap::new();
            for (pi, (txns, producers)) in inner.txns.iter().zip(&inner.producers).enumerate() {
                let p = lo + pi as u32;
                if !txns.aborted().is_empty() {
                    aborted.insert(p, txns.aborted().to_vec());
                }
                for (id, entry) in producers.iter() {
                    if let Some(b) = entry.batches.back() {
                        last_batches.insert((p, id), b.last_offset);
                    }
                }
            }
            (snapshots, aborted, last_batches)
        };
        let mut stats = CleanStats::default();
        if snapshots.is_empty() {
            return Ok(stats);
        }
        let read =
            |s: &Snapshot, e: &IndexEntry| Segment::read_at(&s.file, e.position, e.length as usize);
        // Pass 1: the offset map.
        let mut builder = OffsetMapBuilder::new(&aborted);
        for s in &snapshots {
            for (p, e) in &s.batches {
                builder.add(*p, &read(s, e)?)?;
                pace(e.length as u64);
                stats.bytes_read += e.length as u64;
            }
        }
        let map = builder.finish();
        stats.keys = map.len();
        // Pass 2: clean each segment, oldest first.
        let mut pass = Pass::new(&map, params, &last_batches, &aborted);
        let dir = &self.options.dir;
        for s in &snapshots {
            let path = cleaned_path(dir, s.seq);
            let mut out = BufWriter::new(File::create(&path)?);
            let mut changed = false;
            let mut written = 0u64;
            for (p, e) in &s.batches {
                let bytes = read(s, e)?;
                pace(e.length as u64);
                stats.bytes_read += e.length as u64;
                let kept = match pass.clean_batch(*p, &bytes)? {
                    Cleaned::Keep => bytes,
                    Cleaned::Drop => {
                        changed = true;
                        continue;
                    }
                    Cleaned::Rewrite(b) => {
                        changed = true;
                        b
                    }
                };
                let mut crc = crc32c::crc32c(&p.to_be_bytes());
                crc = crc32c::crc32c_append(crc, &kept);
                out.write_all(&(kept.len() as u32).to_be_bytes())?;
                out.write_all(&p.to_be_bytes())?;
                out.write_all(&crc.to_be_bytes())?;
                out.write_all(&kept)?;
                written += FRAME_HEADER_LEN + kept.len() as u64;
                pace(FRAME_HEADER_LEN + kept.len() as u64);
            }
            let file = out.into_inner().map_err(|e| e.into_error())?;
            if !changed {
                drop(file);
                std::fs::remove_file(&path)?;
                continue;
            }
            file.sync_all()?;
            drop(file);
            if self.swap_in(s, &path)? {
                stats.rewritten.push(s.seq);
                stats.bytes_before += s.size;
                stats.bytes_after += written;
            }
        }
        tessera_fs::write_atomic(
            &checkpoint_path(dir),
            format!("{}\n", up_to_seq + 1).as_bytes(),
        )?;
        Ok(stats)
    }

    /// Replaces segment `s` by its cleaned copy at `copy`, unless retention
    /// removed it meanwhile. Serialized with retention by `files`.
    fn swap_in(&self, s: &Snapshot, copy: &Path) -> Result<bool, LogError> {
        let _files = self.files.lock();
        let dir = &self.options.dir;
        if self.inner.lock().state == WriteState::Closed {
            // Closed (shutdown, or the range deleted) while this pass ran:
            // the directory is not this log's any more. The copy may be
            // gone already (a reopen removes stray copies).
            let _ = std::fs::remove_file(copy);
            return Err(LogError::Closed);
        }
        let still_there = self
            .inner
            .lock()
            .segments
            .iter()
            .any(|seg| seg.seq == s.seq && Arc::ptr_eq(&seg.file, &s.file));
        if !still_there {
            std::fs::remove_file(copy)?;
            return Ok(false);
        }
        tessera_fs::remove_durably(&segment::index_path(dir, s.seq))?;
        std::fs::rename(copy, segment::log_path(dir, s.seq))?;
        tessera_fs::sync_dir(dir)?;
        // Scans the new file (nothing to trust in a stale index) and writes its .idx.
        let cleaned = Segment::open(dir, s.seq, true, now_ms())?;
        let mut inner = self.inner.lock();
        let Some(slot) = inner.segments.iter_mut().find(|seg| seg.seq == s.seq) else {
            return Ok(false);
        };
        let old_size = slot.size;
        let created_ms = slot.created_ms;
        *slot = Segment {
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
