//! One cleaning pass over sealed segment files (I/O around the pure
//! decisions of [`crate::cleaner`]), shared by a range log cleaning its own
//! sealed segments and a follower cleaning its copies in a range directory:
//! the same bytes and [`CleanParams`] give the same files, byte for byte,
//! wherever the pass runs.
//!
//! A pass is prepared first: each segment whose batches change gets its
//! cleaned copy written beside it as `<seq>.cleaned` and fsynced, and every
//! segment's outcome (size before and after, CRC-32C of the cleaned file)
//! is reported. The copies are swapped in afterwards ([`swap_copy`]), oldest
//! first, so a primary can record the pass in the metadata log before it
//! changes any segment, and a crash before a swap leaves the original (a
//! stray `.cleaned` is deleted at the next open).

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::cleaner::{CleanParams, Cleaned, OffsetMapBuilder, Pass, TxnInputs};
use crate::error::LogError;
use crate::segment::{self, IndexEntry, Segment, FRAME_HEADER_LEN};

/// `<seq>.cleaned`: a segment's cleaned copy before it replaces the segment.
pub fn cleaned_path(dir: &Path, seq: u32) -> PathBuf {
    dir.join(format!("{seq:010}.cleaned"))
}

/// Deletes the cleaned copies a crash left before their swap.
pub fn remove_stray_copies(dir: &Path) -> Result<(), LogError> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().ends_with(".cleaned") {
            match std::fs::remove_file(entry.path()) {
                // Swapped in or discarded since the listing.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                other => other?,
            }
        }
    }
    Ok(())
}

/// One sealed segment as a pass reads it.
pub struct PassSegment {
    pub seq: u32,
    pub file: Arc<File>,
    /// `(partition, entry)` in file order.
    pub batches: Vec<(u32, IndexEntry)>,
    pub size: u64,
}

impl PassSegment {
    pub fn of(s: &Segment) -> PassSegment {
        let mut batches: Vec<(u32, IndexEntry)> = s
            .index
            .partitions
            .iter()
            .flat_map(|(p, e)| e.iter().map(move |e| (*p, *e)))
            .collect();
        batches.sort_unstable_by_key(|(_, e)| e.position);
        PassSegment {
            seq: s.seq,
            file: s.file.clone(),
            batches,
            size: s.size,
        }
    }
}

/// What a pass makes of one segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CleanedCopy {
    pub seq: u32,
    pub size_before: u64,
    pub size_after: u64,
    /// CRC-32C of the whole cleaned file (of the segment itself when unchanged).
    pub crc32c: u32,
    /// A `<seq>.cleaned` copy was written and waits for its swap.
    pub changed: bool,
}

/// A prepared pass: every segment's outcome, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PreparedPass {
    pub copies: Vec<CleanedCopy>,
    /// Bytes of the segments read (twice: once for the map, once to clean).
    pub bytes_read: u64,
    /// Distinct keys in the offset map.
    pub keys: usize,
}

/// The transaction inputs of a pass over `segments` (their index entries).
pub fn txn_inputs(segments: &[PassSegment]) -> TxnInputs {
    let mut inputs = TxnInputs::default();
    for s in segments {
        for (p, e) in &s.batches {
            inputs.add(*p, e);
        }
    }
    inputs
}

/// Runs both phases of a pass over `segments` (oldest first, consecutive)
/// and writes the cleaned copy of each one whose batches change. `pace` is
/// called with the bytes read or written as the pass goes.
pub fn prepare(
    dir: &Path,
    segments: &[PassSegment],
    params: CleanParams,
    pace: &mut dyn FnMut(u64),
) -> Result<PreparedPass, LogError> {
    let mut out = PreparedPass::default();
    let inputs = txn_inputs(segments);
    let read =
        |s: &PassSegment, e: &IndexEntry| Segment::read_at(&s.file, e.position, e.length as usize);
    // Pass 1: the offset map.
    let mut builder = OffsetMapBuilder::new(&inputs.aborted);
    for s in segments {
        for (p, e) in &s.batches {
            builder.add(*p, &read(s, e)?)?;
            pace(e.length as u64);
            out.bytes_read += e.length as u64;
        }
    }
    let map = builder.finish();
    out.keys = map.len();
    // Pass 2: each segment's cleaned copy.
    let mut pass = Pass::new(&map, params, &inputs.last_batches, &inputs.aborted);
    for s in segments {
        let path = cleaned_path(dir, s.seq);
        let mut file = BufWriter::new(File::create(&path)?);
        let mut changed = false;
        let mut written = 0u64;
        let mut crc = 0u32;
        for (p, e) in &s.batches {
            let bytes = read(s, e)?;
            pace(e.length as u64);
            out.bytes_read += e.length as u64;
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
            let header = segment::frame_header(*p, &kept);
            file.write_all(&header)?;
            file.write_all(&kept)?;
            crc = crc32c::crc32c_append(crc32c::crc32c_append(crc, &header), &kept);
            written += FRAME_HEADER_LEN + kept.len() as u64;
            pace(FRAME_HEADER_LEN + kept.len() as u64);
        }
        let file = file.into_inner().map_err(|e| e.into_error())?;
        if changed {
            file.sync_all()?;
        } else {
            drop(file);
            std::fs::remove_file(&path)?;
        }
        out.copies.push(CleanedCopy {
            seq: s.seq,
            size_before: s.size,
            size_after: written,
            crc32c: crc,
            changed,
        });
    }
    Ok(out)
}

/// Deletes the cleaned copies of a prepared pass that will not be swapped in.
pub fn discard(dir: &Path, prepared: &PreparedPass) {
    for c in prepared.copies.iter().filter(|c| c.changed) {
        let _ = std::fs::remove_file(cleaned_path(dir, c.seq));
    }
}

/// Replaces `<seq>.log` by its cleaned copy: the old index removed
/// durably, the copy renamed over the segment, the directory fsynced, and
/// the new file scanned into a fresh index (written as `.idx`). A crash
/// before the rename leaves the original; after it, the cleaned file with
/// no index, which the next open scans.
pub fn swap_copy(dir: &Path, seq: u32, now_ms: i64) -> Result<Segment, LogError> {
    tessera_fs::remove_durably(&segment::index_path(dir, seq))?;
    std::fs::rename(cleaned_path(dir, seq), segment::log_path(dir, seq))?;
    tessera_fs::sync_dir(dir)?;
    Segment::open(dir, seq, true, now_ms)
}

/// Size and CRC-32C of a whole file (a copy's identity, compared with the
/// image's after a pass).
pub fn file_digest(path: &Path) -> Result<(u64, u32), LogError> {
    let mut file = File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    let (mut size, mut crc) = (0u64, 0u32);
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok((size, crc));
        }
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        size += n as u64;
    }
}

/// Applies a pass to the sealed segment files `seqs` of `dir` that no
/// range log has open (a follower's copies): prepares it, then swaps every
/// changed copy in, oldest first. The caller drops any handle it holds on
/// the old files.
pub fn clean_files(
    dir: &Path,
    seqs: &[u32],
    params: CleanParams,
    pace: &mut dyn FnMut(u64),
) -> Result<PreparedPass, LogError> {
    let now = crate::now_ms();
    let mut segments = Vec::with_capacity(seqs.len());
    for &seq in seqs {
        segments.push(PassSegment::of(&Segment::open(dir, seq, true, now)?));
    }
    let prepared = prepare(dir, &segments, params, pace)?;
    drop(segments);
    for c in prepared.copies.iter().filter(|c| c.changed) {
        swap_copy(dir, c.seq, now)?;
    }
    Ok(prepared)
}
