//! One segment file of a range's log, and its per-partition index.
//!
//! A segment file is a sequence of frames, one per stored batch:
//! `[batch_len u32][partition u32][crc32c u32][batch bytes]`. The frame CRC
//! covers the partition and the whole batch (baseOffset included, which the
//! batch's own CRC leaves out), so recovery can cut a torn or corrupt tail at
//! the first frame that does not check out.
//!
//! The index maps, per partition, each batch to its offsets, file position and
//! max timestamp (so it is also the time index). The active segment keeps it in
//! memory and rebuilds it by scanning on restart; a sealed segment writes it to
//! a sidecar `.idx` file so that it is never rescanned.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufReader, IoSlice, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::batch;
use crate::error::LogError;

pub const FRAME_HEADER_LEN: u64 = 12;
const INDEX_MAGIC: &[u8; 4] = b"TSIX";
const INDEX_VERSION: u16 = 3;
const INDEX_ENTRY_LEN: usize = 4 + 8 + 8 + 8 + 4 + 8 + 8 + 2 + 4 + 1;

/// Where one stored batch lives and what it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    pub base_offset: i64,
    pub last_offset: i64,
    /// File position of the batch bytes (just past the frame header).
    pub position: u64,
    pub length: u32,
    pub max_timestamp: i64,
    /// Idempotence fields of the batch, so producer state can be rebuilt
    /// from the index without reading the log.
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    /// Transactional / control / commit bits (`txn_state::FLAG_*`), so
    /// transaction state is rebuilt from the index too.
    pub flags: u8,
}

impl IndexEntry {
    /// The index entry of a batch about to be stored (position filled in on append).
    pub fn for_batch(
        header: &batch::BatchHeader,
        base_offset: i64,
        max_timestamp: i64,
        length: usize,
        flags: u8,
    ) -> IndexEntry {
        IndexEntry {
            base_offset,
            last_offset: base_offset + header.last_offset_delta as i64,
            position: 0,
            length: length as u32,
            max_timestamp,
            producer_id: header.producer_id,
            producer_epoch: header.producer_epoch,
            base_sequence: header.base_sequence,
            flags,
        }
    }
}

/// Per-partition batch index of one segment.
#[derive(Default, Debug, Clone, PartialEq)]
pub struct SegmentIndex {
    pub partitions: HashMap<u32, Vec<IndexEntry>>,
}

impl SegmentIndex {
    pub fn push(&mut self, partition: u32, entry: IndexEntry) {
        self.partitions.entry(partition).or_default().push(entry);
    }

    /// `(partition, first offset, end offset exclusive)` for every partition with data.
    pub fn spans(&self) -> Vec<(u32, i64, i64)> {
        let mut spans: Vec<_> = self
            .partitions
            .iter()
            .filter_map(|(p, e)| Some((*p, e.first()?.base_offset, e.last()?.last_offset + 1)))
            .collect();
        spans.sort_unstable();
        spans
    }
}

pub fn log_path(dir: &Path, seq: u32) -> PathBuf {
    dir.join(format!("{seq:010}.log"))
}

pub fn index_path(dir: &Path, seq: u32) -> PathBuf {
    dir.join(format!("{seq:010}.idx"))
}

/// The partitionLeaderEpoch of the first batch in `<seq>.log` in `dir`.
/// A range log writes its leader epoch into every batch it stores, so this
/// tells which incarnation of a segment number wrote the file (a zombie
/// primary's own unrecorded roll, or the image's segment of that number).
/// `None` for a missing file or one too short to hold a batch header.
pub fn first_batch_leader_epoch(dir: &Path, seq: u32) -> std::io::Result<Option<i32>> {
    let file = match File::open(log_path(dir, seq)) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    // Frame header, then the batch's baseOffset and batchLength.
    const AT: u64 = FRAME_HEADER_LEN + 8 + 4;
    let mut epoch = [0u8; 4];
    match file.read_exact_at(&mut epoch, AT) {
        Ok(()) => Ok(Some(i32::from_be_bytes(epoch))),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e),
    }
}

/// One segment: its file, its size and its index.
pub struct Segment {
    pub seq: u32,
    pub file: Arc<File>,
    pub size: u64,
    pub index: SegmentIndex,
    pub sealed: bool,
    /// Wall-clock creation time in ms, for `segment.ms`.
    pub created_ms: i64,
}

impl Segment {
    /// Creates a new, empty active segment file.
    pub fn create(dir: &Path, seq: u32, now_ms: i64) -> Result<Segment, LogError> {
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .truncate(false)
            .open(log_path(dir, seq))?;
        let size = file.metadata()?.len();
        Ok(Segment {
            seq,
            file: Arc::new(file),
            size,
            index: SegmentIndex::default(),
            sealed: false,
            created_ms: now_ms,
        })
    }

    /// Opens a segment found on disk. A sealed segment loads its sidecar index
    /// when present and matching the file size; otherwise (active segment, or a
    /// missing/stale index) the file is scanned and cut at the first bad frame.
    pub fn open(dir: &Path, seq: u32, sealed: bool, now_ms: i64) -> Result<Segment, LogError> {
        let path = log_path(dir, seq);
        let file = OpenOptions::new().read(true).append(true).open(&path)?;
        let file_size = file.metadata()?.len();
        if sealed {
            if let Some(index) = read_index(&index_path(dir, seq), file_size) {
                return Ok(Segment {
                    seq,
                    file: Arc::new(file),
                    size: file_size,
                    index,
                    sealed,
                    created_ms: now_ms,
                });
            }
        }
        let (index, valid_len) = scan(&file)?;
        if valid_len < file_size {
            tracing::warn!(
                path = %path.display(),
                valid_len,
                file_size,
                "cutting torn or corrupt tail of segment"
            );
            file.set_len(valid_len)?;
            file.sync_all()?;
        }
        let segment = Segment {
            seq,
            file: Arc::new(file),
            size: valid_len,
            index,
            sealed,
            created_ms: now_ms,
        };
        if sealed {
            segment.write_index(dir)?;
        }
        Ok(segment)
    }

    /// Appends one framed batch. The caller holds the range lock, so appends
    /// are serialized; the write goes to the page cache and the flusher makes it durable.
    /// A sealed segment refuses the append and writes nothing.
    pub fn append(
        &mut self,
        partition: u32,
        batch_bytes: &[u8],
        mut entry: IndexEntry,
    ) -> Result<u64, LogError> {
        if self.sealed {
            return Err(LogError::SegmentSealed);
        }
        // One writev of the header and the batch where it lies: copying
        // them into one frame first was a second copy of every produced
        // byte before the one into the page cache.
        let header = frame_header(partition, batch_bytes);
        write_all_vectored(
            &*self.file,
            &mut [IoSlice::new(&header), IoSlice::new(batch_bytes)],
        )?;
        let position = self.size + FRAME_HEADER_LEN;
        self.size += FRAME_HEADER_LEN + batch_bytes.len() as u64;
        entry.position = position;
        self.index.push(partition, entry);
        Ok(self.size)
    }

    /// Appends frames a primary stored (a follower's copy): they are parsed
    /// and checked first, and written only if every one checks out.
    pub fn append_frames(&mut self, frames: &[u8]) -> Result<u64, LogError> {
        if self.sealed {
            return Err(LogError::SegmentSealed);
        }
        let entries = parse_frames(frames, self.size)?;
        (&*self.file).write_all(frames)?;
        self.size += frames.len() as u64;
        for (partition, entry) in entries {
            self.index.push(partition, entry);
        }
        Ok(self.size)
    }

    /// Cuts the segment to `size` bytes (a frame boundary: a replica longer
    /// than its sealed length drops what was never acknowledged), durably.
    pub fn truncate(&mut self, size: u64) -> Result<(), LogError> {
        if size >= self.size {
            return Ok(());
        }
        self.file.set_len(size)?;
        self.file.sync_all()?;
        self.size = size;
        for entries in self.index.partitions.values_mut() {
            entries.retain(|e| e.position + e.length as u64 <= size);
        }
        self.index.partitions.retain(|_, e| !e.is_empty());
        Ok(())
    }

    /// Writes the sidecar index (atomically: temp file, fsync, rename, directory fsync).
    pub fn write_index(&self, dir: &Path) -> Result<(), LogError> {
        let mut buf = Vec::new();
        buf.extend_from_slice(INDEX_MAGIC);
        buf.extend_from_slice(&INDEX_VERSION.to_be_bytes());
        buf.extend_from_slice(&self.size.to_be_bytes());
        let count: usize = self.index.partitions.values().map(Vec::len).sum();
        buf.extend_from_slice(&(count as u64).to_be_bytes());
        let mut partitions: Vec<_> = self.index.partitions.iter().collect();
        partitions.sort_unstable_by_key(|(p, _)| **p);
        for (p, entries) in partitions {
            for e in entries {
                buf.extend_from_slice(&p.to_be_bytes());
                buf.extend_from_slice(&e.base_offset.to_be_bytes());
                buf.extend_from_slice(&e.last_offset.to_be_bytes());
                buf.extend_from_slice(&e.position.to_be_bytes());
                buf.extend_from_slice(&e.length.to_be_bytes());
                buf.extend_from_slice(&e.max_timestamp.to_be_bytes());
                buf.extend_from_slice(&e.producer_id.to_be_bytes());
                buf.extend_from_slice(&e.producer_epoch.to_be_bytes());
                buf.extend_from_slice(&e.base_sequence.to_be_bytes());
                buf.push(e.flags);
            }
        }
        let crc = crc32c::crc32c(&buf);
        buf.extend_from_slice(&crc.to_be_bytes());
        tessera_fs::write_atomic(&index_path(dir, self.seq), &buf)?;
        Ok(())
    }

    /// Reads `length` bytes at `position`.
    pub fn read_at(file: &File, position: u64, length: usize) -> Result<Vec<u8>, LogError> {
        let mut buf = Vec::with_capacity(length);
        Segment::read_into(file, position, length, &mut buf)?;
        Ok(buf)
    }

    /// Appends the `length` bytes at `position` to `buf`.
    ///
    /// Into memory that is not zeroed first: every fetch reads up to
    /// `max.partition.fetch.bytes` per partition this way, and zeroing
    /// the buffer only to overwrite it cost a sixth of a consuming
    /// broker's CPU (docs/BENCHMARKS.md).
    pub fn read_into(
        file: &File,
        position: u64,
        length: usize,
        buf: &mut Vec<u8>,
    ) -> Result<(), LogError> {
        use std::os::fd::AsRawFd;
        buf.reserve(length);
        let end = buf.len() + length;
        while buf.len() < end {
            let done = buf.len();
            let at = position + (done + length - end) as u64;
            let at = libc::off_t::try_from(at)
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
            // SAFETY: pread writes at most `end - done` bytes into the
            // vector's spare capacity (reserved above), and only the bytes
            // it reports written are added to the length.
            let n = unsafe {
                libc::pread(
                    file.as_raw_fd(),
                    buf.as_mut_ptr().add(done).cast(),
                    end - done,
                    at,
                )
            };
            match n {
                0 => {
                    buf.truncate(end - length);
                    return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
                }
                n if n < 0 => {
                    let e = std::io::Error::last_os_error();
                    if e.kind() != std::io::ErrorKind::Interrupted {
                        buf.truncate(end - length);
                        return Err(e.into());
                    }
                }
                // SAFETY: the first `done + n` bytes are initialized now.
                n => unsafe { buf.set_len(done + n as usize) },
            }
        }
        Ok(())
    }
}

/// Whole frames of `file` from `from` (below `size`), about `max` bytes, at
/// least one frame.
pub fn read_frames(
    file: &std::fs::File,
    from: u64,
    size: u64,
    max: usize,
) -> Result<bytes::Bytes, LogError> {
    let header = FRAME_HEADER_LEN as usize;
    let want = ((size - from) as usize).min(max.max(header));
    let region = Segment::read_at(file, from, want)?;
    let mut end = 0usize;
    while end + header <= region.len() {
        let len = u32::from_be_bytes(region[end..end + 4].try_into().unwrap()) as usize;
        if end + header + len > region.len() {
            break;
        }
        end += header + len;
    }
    if end > 0 {
        return Ok(bytes::Bytes::from(region).slice(..end));
    }
    let len = u32::from_be_bytes(region[..4].try_into().unwrap()) as u64;
    let whole = (header as u64 + len).min(size - from);
    Ok(bytes::Bytes::from(Segment::read_at(
        file,
        from,
        whole as usize,
    )?))
}

/// Reads a sidecar index; `None` when missing, corrupt, or for another file size.
fn read_index(path: &Path, file_size: u64) -> Option<SegmentIndex> {
    let buf = std::fs::read(path).ok()?;
    if buf.len() < 4 + 2 + 8 + 8 + 4 || &buf[0..4] != INDEX_MAGIC {
        return None;
    }
    let (body, crc) = buf.split_at(buf.len() - 4);
    if crc32c::crc32c(body) != u32::from_be_bytes(crc.try_into().ok()?) {
        return None;
    }
    if u16::from_be_bytes(body[4..6].try_into().ok()?) != INDEX_VERSION {
        return None;
    }
    if u64::from_be_bytes(body[6..14].try_into().ok()?) != file_size {
        return None;
    }
    let count = u64::from_be_bytes(body[14..22].try_into().ok()?) as usize;
    let entries = &body[22..];
    if entries.len() != count.checked_mul(INDEX_ENTRY_LEN)? {
        return None;
    }
    let mut index = SegmentIndex::default();
    for e in entries.chunks_exact(INDEX_ENTRY_LEN) {
        let p = u32::from_be_bytes(e[0..4].try_into().unwrap());
        index.push(
            p,
            IndexEntry {
                base_offset: i64::from_be_bytes(e[4..12].try_into().unwrap()),
                last_offset: i64::from_be_bytes(e[12..20].try_into().unwrap()),
                position: u64::from_be_bytes(e[20..28].try_into().unwrap()),
                length: u32::from_be_bytes(e[28..32].try_into().unwrap()),
                max_timestamp: i64::from_be_bytes(e[32..40].try_into().unwrap()),
                producer_id: i64::from_be_bytes(e[40..48].try_into().unwrap()),
                producer_epoch: i16::from_be_bytes(e[48..50].try_into().unwrap()),
                base_sequence: i32::from_be_bytes(e[50..54].try_into().unwrap()),
                flags: e[54],
            },
        );
    }
    Some(index)
}

/// The header of `batch_bytes`'s frame: its length, its partition, and a
/// CRC-32C of the partition and the batch.
pub(crate) fn frame_header(partition: u32, batch_bytes: &[u8]) -> [u8; FRAME_HEADER_LEN as usize] {
    let crc = crc32c::crc32c_append(crc32c::crc32c(&partition.to_be_bytes()), batch_bytes);
    let mut header = [0u8; FRAME_HEADER_LEN as usize];
    header[..4].copy_from_slice(&(batch_bytes.len() as u32).to_be_bytes());
    header[4..8].copy_from_slice(&partition.to_be_bytes());
    header[8..].copy_from_slice(&crc.to_be_bytes());
    header
}

/// Writes every byte of `bufs`, in order, with as few writev calls as the
/// file takes (a regular file takes them whole, short writes are resumed).
fn write_all_vectored(mut out: impl Write, mut bufs: &mut [IoSlice<'_>]) -> std::io::Result<()> {
    while !bufs.is_empty() {
        match out.write_vectored(bufs) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Checks one frame (`header` + `batch`) and returns its partition and index
/// entry (position filled in by the caller); `None` when its length, CRC-32C
/// or batch header does not check out.
fn check_frame(header: &[u8], batch_bytes: &[u8]) -> Option<(u32, IndexEntry)> {
    let len = u32::from_be_bytes(header[0..4].try_into().unwrap()) as usize;
    let partition = u32::from_be_bytes(header[4..8].try_into().unwrap());
    let crc = u32::from_be_bytes(header[8..12].try_into().unwrap());
    if len != batch_bytes.len() {
        return None;
    }
    let actual = crc32c::crc32c_append(crc32c::crc32c(&partition.to_be_bytes()), batch_bytes);
    if actual != crc {
        return None;
    }
    let h = batch::parse_header(batch_bytes).ok()?;
    if h.total_len() != len {
        return None;
    }
    let flags = batch::index_flags(&h, batch_bytes);
    Some((
        partition,
        IndexEntry::for_batch(&h, h.base_offset, h.max_timestamp, len, flags),
    ))
}

fn frame_len(header: &[u8]) -> Option<usize> {
    let len = u32::from_be_bytes(header[0..4].try_into().unwrap()) as usize;
    (batch::BATCH_HEADER_LEN..=1 << 30)
        .contains(&len)
        .then_some(len)
}

/// Parses stored frames (as a primary ships them to a follower) that start at
/// file position `base`: every frame must check out and the bytes must end
/// on a frame boundary. Returns each frame's partition and index entry.
pub fn parse_frames(frames: &[u8], base: u64) -> Result<Vec<(u32, IndexEntry)>, LogError> {
    let mut out = Vec::new();
    let mut at = 0usize;
    let header_len = FRAME_HEADER_LEN as usize;
    while at < frames.len() {
        let bad = || {
            LogError::Batch(crate::BatchError::Corrupt(
                "replicated frame does not check out",
            ))
        };
        let header = frames.get(at..at + header_len).ok_or_else(bad)?;
        let len = frame_len(header).ok_or_else(bad)?;
        let body = frames
            .get(at + header_len..at + header_len + len)
            .ok_or_else(bad)?;
        let (partition, mut entry) = check_frame(header, body).ok_or_else(bad)?;
        entry.position = base + (at + header_len) as u64;
        out.push((partition, entry));
        at += header_len + len;
    }
    Ok(out)
}

/// Scans a segment file from the start, indexing every frame whose length,
/// CRC and batch header check out. Returns the index and the length of the
/// valid prefix: everything after it is a torn or corrupt tail.
fn scan(file: &File) -> Result<(SegmentIndex, u64), LogError> {
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let mut index = SegmentIndex::default();
    let mut position = 0u64;
    let mut header = [0u8; FRAME_HEADER_LEN as usize];
    let mut batch_buf = Vec::new();
    loop {
        if read_full(&mut reader, &mut header)? < header.len() {
            break;
        }
        let Some(len) = frame_len(&header) else {
            break;
        };
        batch_buf.resize(len, 0);
        if read_full(&mut reader, &mut batch_buf)? < len {
            break;
        }
        let Some((partition, mut entry)) = check_frame(&header, &batch_buf) else {
            break;
        };
        entry.position = position + FRAME_HEADER_LEN;
        index.push(partition, entry);
        position += FRAME_HEADER_LEN + len as u64;
    }
    Ok((index, position))
}

fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> Result<usize, LogError> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..])? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::Segment;
    use std::io::Write;

    #[test]
    fn read_at_reads_exactly_the_range_and_refuses_past_the_end() {
        let mut file = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
        file.write_all(&data).unwrap();
        for (position, length) in [(0, 0), (0, 1), (7, 65_536), (1, 299_999), (250_000, 50_000)] {
            let read = Segment::read_at(&file, position as u64, length).unwrap();
            assert_eq!(
                read,
                &data[position..position + length],
                "{position}+{length}"
            );
        }
        assert!(Segment::read_at(&file, 299_000, 1_001).is_err());
        assert!(Segment::read_at(&file, 400_000, 1).is_err());
        // Appended after what the buffer holds.
        let mut buf = b"head".to_vec();
        Segment::read_into(&file, 1_000, 70_000, &mut buf).unwrap();
        Segment::read_into(&file, 5, 3, &mut buf).unwrap();
        assert_eq!(&buf[..4], b"head");
        assert_eq!(&buf[4..70_004], &data[1_000..71_000]);
        assert_eq!(&buf[70_004..], &data[5..8]);
    }
}
