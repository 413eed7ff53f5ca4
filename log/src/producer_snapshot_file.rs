//! Producer-state snapshot files of a range log, and the reload at open.
//!
//! A range's log holds many partitions, so one snapshot file belongs to one
//! segment roll or seal of the range (or a clean shutdown) and holds a
//! section per partition that has producer state: the partition's snapshot
//! offset (its next offset at that point) and its producer entries. The file
//! is `<seq>.snapshot`, `seq` being the segment that starts at that point
//! (the next one after a roll, seal or shutdown), written atomically
//! (temp file, fsync, rename, directory fsync) after the log data it
//! describes is durable.
//!
//! Layout (big-endian), as Kafka's snapshot file version 1 with sections:
//! `[version i16 = 1][crc32c u32 of everything after it][section count u32]`
//! then per section `[partition u32][offset i64][row count u32]` and rows of
//! Kafka's v1 entry fields `[producer id i64][epoch i16][last sequence i32]
//! [last offset i64][offset delta i32][timestamp i64][coordinator epoch i32]
//! [current txn first offset i64]`. Kafka keeps one batch per producer in
//! its snapshot; Tessera keeps the last five for duplicate detection, so a
//! producer is one row per retained batch, oldest first, and only its newest
//! row carries the open transaction.
//!
//! Reload (per partition, Kafka's rules from [`crate::producer_snapshot`]):
//! the partition's next offset at the start of each local segment are the
//! segment base offsets; stray snapshots are dropped, then every snapshot
//! outside `(log_start, log_end]`; the newest left that decodes and
//! validates is loaded (corrupt ones are skipped, the next newest tried);
//! the index entries from `max(local start, snapshot offset, log start)`
//! are replayed on top. Files no partition keeps are deleted. The aborted
//! transactions are not producer state: like Kafka's transaction index they
//! are rebuilt from every segment's index (transactional entries only).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};

use crate::error::LogError;
use crate::producer_snapshot::{
    producer_snapshot_entry_valid, producer_snapshot_latest_index, producer_snapshot_reload_keeps,
    producer_snapshot_reload_log_start, producer_snapshot_replay_start, producer_snapshot_strays,
    ProducerReloadRange, ProducerSnapshotEntryFacts,
};
use crate::producer_state::{
    BatchMetadata, ProducerEntry, ProducerStates, MAX_BATCHES_PER_PRODUCER,
};
use crate::segment::{IndexEntry, Segment};
use crate::txn_state::{AbortedTxn, TxnState, FLAG_CONTROL, FLAG_TRANSACTIONAL};

pub const SNAPSHOT_VERSION: i16 = 1;
const HEADER_LEN: usize = 2 + 4 + 4;
const SECTION_HEADER_LEN: usize = 4 + 8 + 4;
const ROW_LEN: usize = 8 + 2 + 4 + 8 + 4 + 8 + 4 + 8;

/// The producer state of one partition: producers and open transactions.
pub type PartitionProducerState = (ProducerStates, TxnState);

pub fn snapshot_path(dir: &Path, seq: u32) -> PathBuf {
    dir.join(format!("{seq:010}.snapshot"))
}

/// One row: one retained batch of one producer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotRow {
    pub facts: ProducerSnapshotEntryFacts,
    pub timestamp: i64,
}

/// One partition's part of a snapshot file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotSection {
    pub partition: u32,
    /// The partition's next offset when the snapshot was taken.
    pub offset: i64,
    pub rows: Vec<SnapshotRow>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("corrupt producer snapshot: {0}")]
pub struct CorruptSnapshot(pub &'static str);

/// The inverse of `increment_sequence`: the first sequence of a batch whose
/// last sequence is `last` and that spans `delta + 1` sequences.
fn decrement_sequence(last: i32, delta: i32) -> i32 {
    if last >= delta {
        last - delta
    } else {
        i32::MAX - (delta - last) + 1
    }
}

/// The rows describing `producers` and the open transactions of `txns`.
pub fn rows_of(producers: &ProducerStates, txns: &TxnState) -> Vec<SnapshotRow> {
    let open: HashMap<i64, i64> = txns.ongoing().collect();
    let mut ids: Vec<i64> = producers.iter().map(|(id, _)| id).collect();
    ids.sort_unstable();
    let mut rows = Vec::new();
    for id in ids {
        let entry = producers.get(id).expect("listed above");
        if entry.batches.is_empty() {
            // An epoch a transaction marker set, with no batch of it yet:
            // Kafka's marker-only row.
            rows.push(SnapshotRow {
                facts: ProducerSnapshotEntryFacts {
                    producer_id: id,
                    producer_epoch: entry.epoch,
                    last_sequence: -1,
                    last_offset: -1,
                    offset_delta: 0,
                    coordinator_epoch: -1,
                    current_txn_first_offset: -1,
                },
                timestamp: -1,
            });
            continue;
        }
        let newest = entry.batches.len().saturating_sub(1);
        for (k, b) in entry.batches.iter().enumerate() {
            rows.push(SnapshotRow {
                facts: ProducerSnapshotEntryFacts {
                    producer_id: id,
                    producer_epoch: entry.epoch,
                    last_sequence: b.last_seq,
                    last_offset: b.last_offset,
                    offset_delta: i32::try_from(b.last_offset - b.first_offset).unwrap_or(-1),
                    coordinator_epoch: -1,
                    current_txn_first_offset: if k == newest {
                        open.get(&id).copied().unwrap_or(-1)
                    } else {
                        -1
                    },
                },
                timestamp: b.timestamp,
            });
        }
    }
    rows
}

/// Rebuilds a partition's state from a section's rows, validating every row
/// against the snapshot offset; `None` when any check fails (the section is
/// corrupt and the reload skips it).
pub fn state_of(offset: i64, rows: &[SnapshotRow]) -> Option<PartitionProducerState> {
    let mut producers = ProducerStates::default();
    let mut txns = TxnState::default();
    let mut seen = HashSet::new();
    let mut txn_firsts = HashSet::new();
    let mut i = 0;
    while i < rows.len() {
        let pid = rows[i].facts.producer_id;
        let epoch = rows[i].facts.producer_epoch;
        if !seen.insert(pid) {
            return None;
        }
        let mut entry = ProducerEntry {
            epoch,
            batches: VecDeque::new(),
        };
        let mut txn_first = None;
        // Kafka's marker-only row (an epoch with no batch yet) stands alone.
        if rows[i].facts.last_offset == -1 {
            if !producer_snapshot_entry_valid(offset, rows[i].facts)
                || rows.get(i + 1).is_some_and(|r| r.facts.producer_id == pid)
            {
                return None;
            }
            producers.insert(pid, entry);
            i += 1;
            continue;
        }
        while i < rows.len() && rows[i].facts.producer_id == pid {
            let row = rows[i];
            let f = row.facts;
            if !producer_snapshot_entry_valid(offset, f)
                || f.last_offset < 0
                || f.producer_epoch != epoch
            {
                return None;
            }
            let first_offset = f.last_offset - i64::from(f.offset_delta);
            if entry
                .batches
                .back()
                .is_some_and(|b| b.last_offset >= first_offset)
            {
                return None;
            }
            if f.current_txn_first_offset >= 0 {
                if txn_first.is_some() || !txn_firsts.insert(f.current_txn_first_offset) {
                    return None;
                }
                txn_first = Some(f.current_txn_first_offset);
            }
            entry.batches.push_back(BatchMetadata {
                first_seq: decrement_sequence(f.last_sequence, f.offset_delta),
                last_seq: f.last_sequence,
                first_offset,
                last_offset: f.last_offset,
                timestamp: row.timestamp,
            });
            i += 1;
        }
        if entry.batches.len() > MAX_BATCHES_PER_PRODUCER {
            return None;
        }
        producers.insert(pid, entry);
        if let Some(first) = txn_first {
            txns.on_batch(pid, first, first, FLAG_TRANSACTIONAL);
        }
    }
    Some((producers, txns))
}

/// The section for a partition at `offset`, or `None` when it has no
/// producer state or its state would not load back exactly as it is (then
/// the reload replays that partition from an older point instead).
pub fn section_of(
    partition: u32,
    offset: i64,
    producers: &ProducerStates,
    txns: &TxnState,
) -> Option<SnapshotSection> {
    if producers.is_empty() && txns.ongoing().next().is_none() {
        return None;
    }
    let rows = rows_of(producers, txns);
    let (loaded_producers, loaded_txns) = state_of(offset, &rows)?;
    if loaded_producers != *producers || loaded_txns != txns.inherited() {
        tracing::debug!(
            partition,
            offset,
            "producer state does not round-trip through a snapshot; left out"
        );
        return None;
    }
    Some(SnapshotSection {
        partition,
        offset,
        rows,
    })
}

pub fn encode(sections: &[SnapshotSection]) -> Vec<u8> {
    let rows: usize = sections.iter().map(|s| s.rows.len()).sum();
    let mut buf =
        Vec::with_capacity(HEADER_LEN + sections.len() * SECTION_HEADER_LEN + rows * ROW_LEN);
    buf.extend_from_slice(&SNAPSHOT_VERSION.to_be_bytes());
    buf.extend_from_slice(&0u32.to_be_bytes());
    buf.extend_from_slice(&(sections.len() as u32).to_be_bytes());
    for s in sections {
        buf.extend_from_slice(&s.partition.to_be_bytes());
        buf.extend_from_slice(&s.offset.to_be_bytes());
        buf.extend_from_slice(&(s.rows.len() as u32).to_be_bytes());
        for r in &s.rows {
            let f = &r.facts;
            buf.extend_from_slice(&f.producer_id.to_be_bytes());
            buf.extend_from_slice(&f.producer_epoch.to_be_bytes());
            buf.extend_from_slice(&f.last_sequence.to_be_bytes());
            buf.extend_from_slice(&f.last_offset.to_be_bytes());
            buf.extend_from_slice(&f.offset_delta.to_be_bytes());
            buf.extend_from_slice(&r.timestamp.to_be_bytes());
            buf.extend_from_slice(&f.coordinator_epoch.to_be_bytes());
            buf.extend_from_slice(&f.current_txn_first_offset.to_be_bytes());
        }
    }
    let crc = crc32c::crc32c(&buf[6..]);
    buf[2..6].copy_from_slice(&crc.to_be_bytes());
    buf
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], CorruptSnapshot> {
        let end = self.at.checked_add(N).filter(|e| *e <= self.buf.len());
        let end = end.ok_or(CorruptSnapshot("truncated"))?;
        let bytes = self.buf[self.at..end].try_into().expect("N bytes");
        self.at = end;
        Ok(bytes)
    }
    fn i16(&mut self) -> Result<i16, CorruptSnapshot> {
        self.take().map(i16::from_be_bytes)
    }
    fn i32(&mut self) -> Result<i32, CorruptSnapshot> {
        self.take().map(i32::from_be_bytes)
    }
    fn u32(&mut self) -> Result<u32, CorruptSnapshot> {
        self.take().map(u32::from_be_bytes)
    }
    fn i64(&mut self) -> Result<i64, CorruptSnapshot> {
        self.take().map(i64::from_be_bytes)
    }
}

pub fn decode(buf: &[u8]) -> Result<Vec<SnapshotSection>, CorruptSnapshot> {
    let mut r = Reader { buf, at: 0 };
    if r.i16()? != SNAPSHOT_VERSION {
        return Err(CorruptSnapshot("unknown version"));
    }
    let crc = r.u32()?;
    if crc32c::crc32c(&buf[6..]) != crc {
        return Err(CorruptSnapshot("CRC mismatch"));
    }
    let count = r.u32()? as usize;
    let mut sections = Vec::with_capacity(count.min(buf.len() / SECTION_HEADER_LEN));
    for _ in 0..count {
        let partition = r.u32()?;
        let offset = r.i64()?;
        let rows = r.u32()? as usize;
        if rows > (buf.len() - r.at) / ROW_LEN {
            return Err(CorruptSnapshot("truncated"));
        }
        let mut section = SnapshotSection {
            partition,
            offset,
            rows: Vec::with_capacity(rows),
        };
        for _ in 0..rows {
            let producer_id = r.i64()?;
            let producer_epoch = r.i16()?;
            let last_sequence = r.i32()?;
            let last_offset = r.i64()?;
            let offset_delta = r.i32()?;
            let timestamp = r.i64()?;
            let coordinator_epoch = r.i32()?;
            let current_txn_first_offset = r.i64()?;
            section.rows.push(SnapshotRow {
                facts: ProducerSnapshotEntryFacts {
                    producer_id,
                    producer_epoch,
                    last_sequence,
                    last_offset,
                    offset_delta,
                    coordinator_epoch,
                    current_txn_first_offset,
                },
                timestamp,
            });
        }
        sections.push(section);
    }
    if r.at != buf.len() {
        return Err(CorruptSnapshot("trailing bytes"));
    }
    Ok(sections)
}

/// Writes `<seq>.snapshot` atomically; with no section, removes it instead.
pub fn write_snapshot(dir: &Path, seq: u32, sections: &[SnapshotSection]) -> Result<(), LogError> {
    let path = snapshot_path(dir, seq);
    if sections.is_empty() {
        return Ok(tessera_fs::remove_durably(&path)?);
    }
    Ok(tessera_fs::write_atomic(&path, &encode(sections))?)
}

/// Whether a range snapshot without producer state is written as a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EmptySnapshot {
    /// No file (and an older one at that sequence is removed).
    Remove,
    /// A file with no section: a replicated range's follower that does not
    /// hold the older segments fetches it, and must tell "no producer
    /// state there" from "not written".
    Write,
}

/// The snapshot of a whole range at its current end: a section per
/// partition (index `p - lo`) that has producer state.
pub(crate) fn write_range_snapshot(
    dir: &Path,
    seq: u32,
    lo: u32,
    next_offsets: impl Iterator<Item = i64>,
    producers: &[ProducerStates],
    txns: &[TxnState],
    empty: EmptySnapshot,
) -> Result<(), LogError> {
    let sections: Vec<SnapshotSection> = next_offsets
        .zip(producers.iter().zip(txns))
        .enumerate()
        .filter_map(|(i, (offset, (p, t)))| section_of(lo + i as u32, offset, p, t))
        .collect();
    if sections.is_empty() && empty == EmptySnapshot::Write {
        return Ok(tessera_fs::write_atomic(
            &snapshot_path(dir, seq),
            &encode(&[]),
        )?);
    }
    write_snapshot(dir, seq, &sections)
}

/// Snapshot files in `dir` by sequence number; leftover temp files go.
fn list_snapshots(dir: &Path) -> Result<Vec<u32>, LogError> {
    let mut seqs = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.ends_with(".snapshot.tmp") {
            let _ = std::fs::remove_file(entry.path());
        } else if let Some(seq) = name.strip_suffix(".snapshot").and_then(|s| s.parse().ok()) {
            seqs.push(seq);
        }
    }
    seqs.sort_unstable();
    Ok(seqs)
}

/// What the reload of one partition starts from.
pub struct PartitionLayout<'a> {
    /// The partition's index entries in each local segment, oldest first,
    /// the active segment last (empty where it has none).
    pub segments: Vec<&'a [IndexEntry]>,
    /// The partition's first offset in this range.
    pub base_offset: i64,
    pub log_start: i64,
    /// Earlier offsets live in ancestor ranges (a split or merge child) or
    /// on other replicas (segments this broker does not hold): like Kafka's
    /// remote storage for the reload log start.
    pub has_ancestors: bool,
    /// Per local segment, the partition's next offset where it starts as
    /// the metadata records it, when segments before it are not local
    /// (empty: every segment is, and the bases follow from the entries).
    pub segment_starts: Vec<i64>,
}

impl PartitionLayout<'_> {
    /// The partition's next offset at the start of each local segment, and
    /// its log end.
    pub fn segment_bases(&self) -> (Vec<i64>, i64) {
        let mut next = self.base_offset;
        let mut bases = Vec::with_capacity(self.segments.len());
        for (i, entries) in self.segments.iter().enumerate() {
            next = next.max(self.segment_starts.get(i).copied().unwrap_or(i64::MIN));
            bases.push(next);
            if let Some(last) = entries.last() {
                next = next.max(last.last_offset + 1);
            }
        }
        (bases, next)
    }

    /// Per local segment, whether some of the partition's offsets before it
    /// are in no local segment (the metadata's start is past what the
    /// local entries reach).
    pub fn gaps(&self) -> Vec<bool> {
        let mut next = self.base_offset;
        let mut gaps = Vec::with_capacity(self.segments.len());
        for (i, entries) in self.segments.iter().enumerate() {
            let start = self.segment_starts.get(i).copied().unwrap_or(i64::MIN);
            gaps.push(start > next);
            next = next.max(start);
            if let Some(last) = entries.last() {
                next = next.max(last.last_offset + 1);
            }
        }
        gaps
    }

    pub fn reload_range(&self) -> ProducerReloadRange {
        let (bases, log_end) = self.segment_bases();
        let first_base = bases.first().copied().unwrap_or(self.base_offset);
        let local_start = first_base.max(self.log_start);
        ProducerReloadRange {
            log_start: producer_snapshot_reload_log_start(
                self.has_ancestors,
                Some(self.log_start),
                local_start,
            ),
            local_start,
            log_end,
        }
    }
}

/// The outcome of one partition's reload.
#[derive(Debug)]
pub struct PartitionReload {
    pub producers: ProducerStates,
    /// Open transactions (the aborted ones are not producer state).
    pub txns: TxnState,
    /// The offset of the loaded snapshot.
    pub loaded: Option<i64>,
    pub replay_from: i64,
    /// The candidates (indexes into the input) the reload keeps.
    pub kept: Vec<usize>,
}

/// Replays index entries whose last offset is at or after `from`.
pub fn replay(state: &mut PartitionProducerState, segments: &[&[IndexEntry]], from: i64) {
    for entries in segments {
        let start = entries.partition_point(|e| e.last_offset < from);
        for e in entries[start..].iter().filter(|e| e.producer_id >= 0) {
            if e.flags & FLAG_CONTROL == 0 {
                state.0.record(
                    e.producer_id,
                    e.producer_epoch,
                    crate::range_log::batch_metadata(e),
                );
            } else {
                state.0.record_marker(e.producer_id, e.producer_epoch);
            }
            state
                .1
                .on_batch(e.producer_id, e.base_offset, e.last_offset, e.flags);
        }
    }
}

/// Kafka's reload for one partition. `candidates` are the offsets of the
/// partition's snapshot sections, in the order to try when several share an
/// offset; `load` decodes one (`None`: corrupt). `seed` is the state before
/// the range's first offset (what a split or merge child inherited).
pub fn reload_partition(
    layout: &PartitionLayout<'_>,
    seed: &PartitionProducerState,
    candidates: &[i64],
    load: &mut dyn FnMut(usize) -> Option<PartitionProducerState>,
) -> PartitionReload {
    let (bases, _) = layout.segment_bases();
    let range = layout.reload_range();
    let mut by_offset: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
    for (i, &offset) in candidates.iter().enumerate() {
        by_offset.entry(offset).or_default().push(i);
    }
    // removeStraySnapshots, then truncateAndReload's range check.
    let offsets: Vec<i64> = by_offset.keys().copied().collect();
    let strays = producer_snapshot_strays(&offsets, &bases);
    for (offset, stray) in offsets.iter().zip(strays) {
        if stray || !producer_snapshot_reload_keeps(*offset, range) {
            by_offset.remove(offset);
        }
    }
    // loadFromSnapshot: the newest left; a corrupt one is dropped and the
    // next newest tried.
    let mut loaded = None;
    while loaded.is_none() {
        let offsets: Vec<i64> = by_offset.keys().copied().collect();
        let Some(newest) = producer_snapshot_latest_index(&offsets, range) else {
            break;
        };
        let offset = offsets[newest];
        let group = by_offset.get_mut(&offset).expect("listed above");
        let mut corrupt = Vec::new();
        for &candidate in group.iter() {
            match load(candidate) {
                Some(state) => {
                    loaded = Some((offset, state));
                    break;
                }
                None => corrupt.push(candidate),
            }
        }
        group.retain(|c| !corrupt.contains(c));
        if group.is_empty() {
            by_offset.remove(&offset);
        }
    }
    let loaded_offset = loaded.as_ref().map(|(o, _)| *o);
    let replay_from = producer_snapshot_replay_start(range, loaded_offset)
        .unwrap_or(range.local_start.max(range.log_start));
    let mut state = match loaded {
        Some((_, state)) => state,
        None => (seed.0.clone(), seed.1.inherited()),
    };
    replay(&mut state, &layout.segments, replay_from);
    PartitionReload {
        producers: state.0,
        txns: state.1,
        loaded: loaded_offset,
        replay_from,
        kept: by_offset.into_values().flatten().collect(),
    }
}

/// Rebuilds every partition's producer and transaction state at open.
/// `partitions` holds `(base offset, log start)` per partition (index
/// `p - lo`); `seed` the inherited state per partition, if any;
/// `segment_starts`, when some earlier segments are not local, each local
/// segment's start per partition (see [`PartitionLayout::segment_starts`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn reload_range(
    dir: &Path,
    lo: u32,
    segments: &[Segment],
    partitions: &[(i64, i64)],
    seed_producers: &[ProducerStates],
    seed_txns: &[TxnState],
    has_ancestors: bool,
    segment_starts: Option<&BTreeMap<u32, Vec<i64>>>,
) -> Result<(Vec<ProducerStates>, Vec<TxnState>), LogError> {
    // Newest file first: among sections at the same offset it is tried first.
    let mut files: Vec<(u32, Option<Vec<SnapshotSection>>)> = Vec::new();
    for seq in list_snapshots(dir)?.into_iter().rev() {
        let path = snapshot_path(dir, seq);
        let decoded = std::fs::read(&path)
            .map_err(|_| CorruptSnapshot("unreadable"))
            .and_then(|b| decode(&b));
        match decoded {
            Ok(sections) => files.push((seq, Some(sections))),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "skipping producer snapshot");
                files.push((seq, None));
            }
        }
    }
    let mut sections_of: HashMap<u32, Vec<(usize, usize)>> = HashMap::new();
    for (fi, (_, sections)) in files.iter().enumerate() {
        for (si, s) in sections.iter().flatten().enumerate() {
            sections_of.entry(s.partition).or_default().push((fi, si));
        }
    }
    let mut file_kept = vec![false; files.len()];
    // The `<seq>.aborted` files up to the segment after the newest local
    // one (each lists the aborted transactions of the whole history before
    // its segment; one fetched before leading may be of a segment this
    // broker holds no copy of, e.g. one sealed empty), read once.
    let newest_local = segments.last().map_or(0, |s| s.seq);
    let aborted_files: Vec<u32> = crate::aborted_index_file::list(dir)?
        .into_iter()
        .filter(|&seq| seq <= newest_local.saturating_add(1))
        .collect();
    let mut history_aborted: HashMap<u32, Vec<(u32, AbortedTxn)>> = HashMap::new();
    let mut producers = Vec::with_capacity(partitions.len());
    let mut txns = Vec::with_capacity(partitions.len());
    for (i, &(base_offset, log_start)) in partitions.iter().enumerate() {
        let p = lo + i as u32;
        let layout = PartitionLayout {
            segments: segments
                .iter()
                .map(|s| s.index.partitions.get(&p).map_or(&[][..], Vec::as_slice))
                .collect(),
            base_offset,
            log_start,
            has_ancestors,
            segment_starts: segment_starts
                .map(|starts| {
                    segments
                        .iter()
                        .map(|s| {
                            starts
                                .get(&s.seq)
                                .and_then(|per_partition| per_partition.get(i).copied())
                                .unwrap_or(i64::MIN)
                        })
                        .collect()
                })
                .unwrap_or_default(),
        };
        let seed_state = (
            seed_producers.get(i).cloned().unwrap_or_default(),
            seed_txns.get(i).cloned().unwrap_or_default(),
        );
        let found = sections_of.remove(&p).unwrap_or_default();
        let section = |&(fi, si): &(usize, usize)| &files[fi].1.as_ref().expect("decoded")[si];
        let offsets: Vec<i64> = found.iter().map(|c| section(c).offset).collect();
        let mut load = |c: usize| {
            let s = section(&found[c]);
            let state = state_of(s.offset, &s.rows);
            if state.is_none() {
                tracing::warn!(
                    partition = p,
                    seq = files[found[c].0].0,
                    "skipping corrupt producer snapshot section"
                );
            }
            state
        };
        let reload = reload_partition(&layout, &seed_state, &offsets, &mut load);
        for c in &reload.kept {
            file_kept[found[*c].0] = true;
        }
        // The aborted transactions, from every local entry (the transaction
        // index). After offsets no local segment holds, the transactions
        // open where the next local segment starts are those of the
        // snapshot there (Kafka's currentTxnFirstOffset): an abort marked
        // in a local segment may cover data on other replicas only.
        let (bases, _) = layout.segment_bases();
        let reload_range = layout.reload_range();
        let gaps = layout.gaps();
        let mut all_txns = seed_state.1;
        for ((entries, &gap), base) in layout.segments.iter().zip(&gaps).zip(bases) {
            let open_there = gap.then(|| {
                offsets
                    .iter()
                    .enumerate()
                    .filter(|&(_, &o)| o == base && producer_snapshot_reload_keeps(o, reload_range))
                    .find_map(|(c, _)| load(c))
            });
            if let Some(open_there) = open_there {
                // Without a snapshot there, which transactions are open
                // after the gap is unknown: carrying those open before it
                // would date a later abort back to a transaction the gap
                // closed (the files below list what the gap hides).
                let aborted = all_txns.aborted().to_vec();
                all_txns = open_there.map(|(_, open)| open).unwrap_or_default();
                all_txns.set_aborted(aborted);
            }
            replay_txns(&mut all_txns, &[entries]);
        }
        let aborted = all_txns.aborted().to_vec();
        // Those of the history no local segment holds (before a gap, or
        // the ancestors' of a child led here without their logs): each
        // local `<seq>.aborted` lists the whole history before its segment
        // (a broker that followed a later segment first and received
        // copies of older ones afterwards has a later file than the one
        // where its local segments resume after the gap).
        // Every file's entries are history: all of them are taken. One
        // written after the local segment before the last gap covers the
        // gap (the segments between it and the gap's end that are not
        // here hold none of the partition's data, or it would say so).
        if let Some(after_gap) = gaps.iter().rposition(|&g| g) {
            let before_gap = after_gap.checked_sub(1).map(|i| segments[i].seq);
            if !aborted_files
                .iter()
                .any(|&seq| before_gap.is_none_or(|before| seq > before))
            {
                tracing::warn!(
                    dir = %dir.display(),
                    partition = p,
                    seq = segments[after_gap].seq,
                    "no aborted-transaction file covers the history before this segment"
                );
            }
        }
        let mut from_files = Vec::new();
        for &seq in &aborted_files {
            let entries = history_aborted
                .entry(seq)
                .or_insert_with(|| crate::aborted_index_file::read(dir, seq));
            from_files.extend(entries.iter().filter(|(q, _)| *q == p).map(|(_, a)| *a));
        }
        let aborted = merge_aborted(from_files, aborted);
        let mut t = reload.txns;
        t.set_aborted(aborted);
        producers.push(reload.producers);
        txns.push(t);
    }
    // A file without sections says "no producer state where this segment
    // starts": no partition keeps it, yet a replica whose local history
    // starts there (or one that joins the range there and fetches it) has
    // nothing else to lead from. Kept while its segment is local, or is
    // the next one (the snapshot a clean close writes at the log end).
    let local_span = segments.first().zip(segments.last());
    for ((seq, sections), kept) in files.iter().zip(file_kept) {
        let empty_here = sections.as_ref().is_some_and(Vec::is_empty)
            && local_span.is_some_and(|(first, last)| (first.seq..=last.seq + 1).contains(seq));
        if !kept && !empty_here {
            let path = snapshot_path(dir, *seq);
            tracing::debug!(path = %path.display(), "deleting unused producer snapshot");
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(path = %path.display(), error = %e, "could not delete producer snapshot");
            }
        }
    }
    Ok((producers, txns))
}

/// One entry per abort marker (producer and marker offset), in marker
/// order: `authoritative`'s (written by a primary that held the whole
/// history) where both name a marker, `local`'s otherwise.
fn merge_aborted(authoritative: Vec<AbortedTxn>, local: Vec<AbortedTxn>) -> Vec<AbortedTxn> {
    let mut by_marker: BTreeMap<(i64, i64), AbortedTxn> = BTreeMap::new();
    for a in local {
        by_marker.insert((a.last_offset, a.producer_id), a);
    }
    for a in authoritative {
        by_marker.insert((a.last_offset, a.producer_id), a);
    }
    by_marker.into_values().collect()
}

fn replay_txns(txns: &mut TxnState, segments: &[&[IndexEntry]]) {
    for entries in segments {
        for e in entries.iter().filter(|e| e.flags != 0) {
            txns.on_batch(e.producer_id, e.base_offset, e.last_offset, e.flags);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_starts_fill_the_bases_after_segments_not_held() {
        // Local segments: [0, 3) then, after offsets held elsewhere, [7, 8)
        // and an empty active one the metadata starts at 8.
        let first = [entry(0, 3, 7, 0, 0, 0)];
        let later = [entry(7, 1, 7, 0, 3, 0)];
        let mut layout = PartitionLayout {
            segments: vec![&first[..], &later[..], &[]],
            base_offset: 0,
            log_start: 0,
            has_ancestors: true,
            segment_starts: vec![0, 7, 8],
        };
        assert_eq!(layout.segment_bases(), (vec![0, 7, 8], 8));
        assert_eq!(layout.gaps(), vec![false, true, false]);
        // Without them the bases follow the entries, and nothing is missing.
        layout.segment_starts.clear();
        assert_eq!(layout.segment_bases(), (vec![0, 3, 8], 8));
        assert_eq!(layout.gaps(), vec![false, false, false]);
    }
    use crate::producer_state::increment_sequence;
    use crate::txn_state::FLAG_COMMIT;
    use proptest::prelude::*;

    fn entry(base: i64, count: i64, pid: i64, epoch: i16, seq: i32, flags: u8) -> IndexEntry {
        IndexEntry {
            base_offset: base,
            last_offset: base + count - 1,
            position: 0,
            length: 0,
            max_timestamp: 1000 + base,
            producer_id: pid,
            producer_epoch: epoch,
            base_sequence: seq,
            flags,
        }
    }

    /// A producer 7 writing one 2-record idempotent batch per step.
    fn idempotent_log(batches: usize) -> Vec<IndexEntry> {
        (0..batches)
            .map(|i| entry(2 * i as i64, 2, 7, 0, 2 * i as i32, 0))
            .collect()
    }

    fn state_at(entries: &[IndexEntry], offset: i64) -> PartitionProducerState {
        let mut s = PartitionProducerState::default();
        let upto: Vec<IndexEntry> = entries
            .iter()
            .copied()
            .filter(|e| e.last_offset < offset)
            .collect();
        replay(&mut s, &[&upto], i64::MIN);
        s
    }

    fn encoded(offset: i64, state: &PartitionProducerState) -> Vec<u8> {
        encode(&[section_of(0, offset, &state.0, &state.1).expect("has state")])
    }

    fn load_bytes(bytes: &[u8]) -> Option<PartitionProducerState> {
        let sections = decode(bytes).ok()?;
        state_of(sections[0].offset, &sections[0].rows)
    }

    #[test]
    fn codec_round_trips_batches_transactions_and_wrapped_sequences() {
        let log = vec![
            entry(0, 3, 1, 0, i32::MAX - 1, 0), // sequences wrap inside the batch
            entry(3, 1, 2, 4, 0, FLAG_TRANSACTIONAL),
            entry(4, 2, 1, 0, 1, 0),
            entry(6, 1, 3, 0, 0, FLAG_TRANSACTIONAL),
            entry(7, 1, 3, 0, -1, FLAG_CONTROL | FLAG_COMMIT),
        ];
        let state = state_at(&log, 8);
        assert_eq!(state.1.ongoing().collect::<Vec<_>>(), vec![(2, 3)]);
        let bytes = encoded(8, &state);
        let loaded = load_bytes(&bytes).unwrap();
        assert_eq!(loaded.0, state.0);
        assert_eq!(loaded.1, state.1.inherited());
        // The same state claimed at an offset its batches reach is invalid.
        let mut sections = decode(&bytes).unwrap();
        sections[0].offset = 5;
        assert!(state_of(5, &sections[0].rows).is_none());
    }

    /// A coordinator fenced producer 2 by aborting its transaction under
    /// epoch 4: the marker-only state (epoch 4, no batch) survives a
    /// snapshot as Kafka's sentinel row, so a reload still refuses epoch 3.
    #[test]
    fn an_epoch_set_by_a_marker_round_trips_as_a_marker_only_row() {
        let log = vec![
            entry(0, 1, 1, 0, 0, 0),
            entry(1, 1, 2, 3, 0, FLAG_TRANSACTIONAL),
            entry(2, 1, 2, 4, -1, FLAG_CONTROL),
        ];
        let state = state_at(&log, 3);
        let fenced = state.0.get(2).unwrap();
        assert_eq!((fenced.epoch, fenced.batches.len()), (4, 0));
        assert_eq!(state.1.ongoing().count(), 0);
        let bytes = encoded(3, &state);
        let loaded = load_bytes(&bytes).unwrap();
        assert_eq!(loaded.0, state.0);
        assert!(matches!(
            loaded.0.check(2, 3, 1, 1),
            Err(crate::producer_state::SequenceError::InvalidProducerEpoch { .. })
        ));
        // A marker-only row next to a batch row of the same producer is not
        // a state Tessera writes: the section is corrupt.
        let mut sections = decode(&bytes).unwrap();
        let sentinel = sections[0]
            .rows
            .iter()
            .position(|r| r.facts.producer_id == 2)
            .unwrap();
        let mut batch_row = sections[0].rows[0];
        batch_row.facts.producer_id = 2;
        batch_row.facts.producer_epoch = 4;
        sections[0].rows.insert(sentinel + 1, batch_row);
        assert!(state_of(3, &sections[0].rows).is_none());
    }

    #[test]
    fn corrupt_files_fail_to_decode() {
        // ProducerStateManagerTest.testLoadFromCorruptSnapshotFile,
        // testLoadFromTruncatedSnapshotFile, testLoadFromEmptySnapshotFile.
        let log = idempotent_log(3);
        let bytes = encoded(6, &state_at(&log, 6));
        assert!(decode(&bytes).is_ok());
        let mut garbage = bytes.clone();
        let mid = garbage.len() / 2;
        garbage[mid..mid + 3].copy_from_slice(&[1, 2, 3]);
        assert!(decode(&garbage).is_err());
        assert!(decode(&bytes[..bytes.len() / 2]).is_err());
        assert!(decode(&[]).is_err());
        let mut version = bytes.clone();
        version[1] = 2;
        assert!(decode(&version).is_err());
        let mut trailing = bytes;
        trailing.push(0);
        assert!(decode(&trailing).is_err());
    }

    fn layout(segments: Vec<&[IndexEntry]>) -> PartitionLayout<'_> {
        PartitionLayout {
            segments,
            base_offset: 0,
            log_start: 0,
            has_ancestors: false,
            segment_starts: vec![],
        }
    }

    #[test]
    fn corrupt_newest_snapshot_is_skipped_and_the_next_newest_loaded() {
        // ProducerStateManagerTest.testLoadFromCorruptSnapshotFile: the
        // corrupt newest snapshot is deleted and the older one loads.
        let log = idempotent_log(6);
        let segments: Vec<&[IndexEntry]> = vec![&log[0..2], &log[2..4], &log[4..6]];
        let good_4 = encoded(4, &state_at(&log, 4));
        let mut bad_8 = encoded(8, &state_at(&log, 8));
        let at = bad_8.len() - 5;
        bad_8[at] ^= 0xff;
        let files = [good_4, bad_8];
        let reload = reload_partition(
            &layout(segments.clone()),
            &Default::default(),
            &[4, 8],
            &mut |i| load_bytes(&files[i]),
        );
        assert_eq!(reload.loaded, Some(4));
        assert_eq!(reload.replay_from, 4);
        assert_eq!(reload.kept, vec![0]);
        assert_eq!(reload.producers, state_at(&log, 12).0);
        // A section at the same offset in another file is tried next.
        let good_8 = encoded(8, &state_at(&log, 8));
        let files = [files[1].clone(), good_8];
        let reload = reload_partition(
            &layout(segments.clone()),
            &Default::default(),
            &[8, 8],
            &mut |i| load_bytes(&files[i]),
        );
        assert_eq!((reload.loaded, reload.kept), (Some(8), vec![1]));
        assert_eq!(reload.producers, state_at(&log, 12).0);
        // Nothing usable: a full replay.
        let reload = reload_partition(&layout(segments), &Default::default(), &[8], &mut |_| None);
        assert_eq!((reload.loaded, reload.replay_from), (None, 0));
        assert_eq!(reload.producers, state_at(&log, 12).0);
    }

    #[test]
    fn clean_shutdown_snapshot_is_kept_and_strays_dropped() {
        // LogLoaderTest.testLoadingLogKeepsLargestStrayProducerStateSnapshot:
        // segments at 0, 2, 4 (one producer batch of 2 records each, the
        // active one holding two); snapshots at 2 and 4 (rolls), 8 (close)
        // and an injected stray at 6: 6 goes, 8 loads, nothing is replayed.
        let log = idempotent_log(4);
        let segments: Vec<&[IndexEntry]> = vec![&log[0..1], &log[1..2], &log[2..4]];
        let offsets = [2, 4, 6, 8];
        let files: Vec<Vec<u8>> = offsets
            .iter()
            .map(|&o| encoded(o, &state_at(&log, o)))
            .collect();
        let reload = reload_partition(&layout(segments), &Default::default(), &offsets, &mut |i| {
            load_bytes(&files[i])
        });
        assert_eq!(reload.loaded, Some(8));
        assert_eq!(reload.replay_from, 8);
        let mut kept = reload.kept.clone();
        kept.sort_unstable();
        assert_eq!(kept, vec![0, 1, 3]);
        assert_eq!(reload.producers, state_at(&log, 8).0);
    }

    #[test]
    fn a_child_without_snapshots_starts_from_its_seed() {
        // The seed is the state at the child's first offset (10).
        let parent = idempotent_log(5);
        let seed = state_at(&parent, 10);
        let own = [entry(10, 2, 7, 0, 10, 0), entry(12, 1, 8, 0, 0, 0)];
        let l = PartitionLayout {
            segments: vec![&own[..]],
            base_offset: 10,
            log_start: 0,
            has_ancestors: true,
            segment_starts: vec![],
        };
        assert_eq!(
            l.reload_range(),
            ProducerReloadRange {
                log_start: 0,
                local_start: 10,
                log_end: 13
            }
        );
        let mut all = parent.clone();
        all.extend_from_slice(&own);
        let reload = reload_partition(&l, &seed, &[], &mut |_| None);
        assert_eq!(reload.replay_from, 10);
        assert_eq!(reload.producers, state_at(&all, 13).0);
        // A snapshot at the child's base (taken before it wrote) loads too.
        let at_base = encoded(10, &seed);
        let reload = reload_partition(&l, &seed, &[10], &mut |_| load_bytes(&at_base));
        assert_eq!(reload.loaded, Some(10));
        assert_eq!(reload.producers, state_at(&all, 13).0);
    }

    #[test]
    fn log_start_past_producer_batches_matches_kafka() {
        // LogLoaderTest.testLoadProducersAfterDeleteRecordsOnSegment: with
        // no snapshot above the log start, producers whose batches all lie
        // below it are gone after a reload; one above it keeps them (Kafka's
        // truncateAndReload: "in-memory and on-disk state can diverge").
        let log = [entry(0, 1, 1, 0, 0, 0), entry(1, 1, 2, 0, 0, 0)];
        let l = PartitionLayout {
            segments: vec![&log[0..1], &log[1..2]],
            base_offset: 0,
            log_start: 1,
            has_ancestors: false,
            segment_starts: vec![],
        };
        let reload = reload_partition(&l, &Default::default(), &[1], &mut |_| {
            load_bytes(&encoded(1, &state_at(&log, 1)))
        });
        assert_eq!(
            reload.loaded, None,
            "a snapshot at the log start is dropped"
        );
        assert_eq!(reload.producers.len(), 1);
        assert!(reload.producers.get(2).is_some());
        let reload = reload_partition(&l, &Default::default(), &[2], &mut |_| {
            load_bytes(&encoded(2, &state_at(&log, 2)))
        });
        assert_eq!(reload.loaded, Some(2));
        assert_eq!(reload.producers.len(), 2);
    }

    /// One generated batch: kind (0 plain, 1 idempotent, 2 transactional,
    /// 3 marker), producer, record count, and a flag (epoch bump / commit).
    type Op = (u8, usize, i64, bool);

    fn build_log(ops: &[Op]) -> Vec<IndexEntry> {
        let mut seq = [0, 0, i32::MAX - 3];
        let mut epoch = [0i16; 3];
        let mut offset = 0;
        let mut out = Vec::new();
        for &(kind, pid, count, flag) in ops {
            let e = match kind {
                0 => entry(offset, count, -1, -1, -1, 0),
                1 | 2 => {
                    if flag && kind == 1 {
                        epoch[pid] += 1;
                        seq[pid] = 0;
                    }
                    let flags = if kind == 2 { FLAG_TRANSACTIONAL } else { 0 };
                    let e = entry(offset, count, pid as i64, epoch[pid], seq[pid], flags);
                    seq[pid] = increment_sequence(seq[pid], count as i32);
                    e
                }
                _ => {
                    let flags = FLAG_CONTROL | if flag { FLAG_COMMIT } else { 0 };
                    entry(offset, 1, pid as i64, epoch[pid], -1, flags)
                }
            };
            offset = e.last_offset + 1;
            out.push(e);
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        /// Whatever snapshots lie around (at segment bases, stray, above the
        /// log end from a longer history, corrupt, duplicated), the reload
        /// ends in the state a full replay from the log start builds.
        #[test]
        fn reload_equals_full_replay(
            ops in proptest::collection::vec((0u8..4, 0usize..3, 1i64..4, proptest::bool::weighted(0.2)), 0..40),
            parent_frac in 0usize..3,
            log_frac in 0usize..=4,
            cuts in proptest::collection::vec(0usize..40, 0..5),
            log_start_frac in 0i64..=4,
            snaps in proptest::collection::vec((proptest::bool::ANY, 0usize..64, 0u8..6, 0usize..1000), 0..8),
        ) {
            let history = build_log(&ops);
            let n = history.len();
            // Entries [0, c) are the parent's (the seed), [c, m) this
            // range's log, [m, n) a lost future (stale snapshots).
            let c = if parent_frac == 0 { 0 } else { n * parent_frac / 6 };
            let m = c + (n - c) * log_frac / 4;
            let end_of = |j: usize| if j == 0 { 0 } else { history[j - 1].last_offset + 1 };
            let base_offset = end_of(c);
            let log_start = base_offset * log_start_frac / 4;
            let seed = state_at(&history, base_offset);
            let local = &history[c..m];
            let mut cuts: Vec<usize> = cuts.into_iter().map(|x| x % (local.len() + 1)).collect();
            cuts.sort_unstable();
            let mut segments: Vec<&[IndexEntry]> = Vec::new();
            let mut from = 0;
            for cut in cuts.into_iter().chain([local.len()]) {
                segments.push(&local[from..cut]);
                from = cut;
            }
            let l = PartitionLayout { segments, base_offset, log_start, has_ancestors: c > 0, segment_starts: vec![] };
            let (bases, _) = l.segment_bases();
            let boundaries: Vec<i64> = (0..=n).map(end_of).collect();
            let mut offsets = Vec::new();
            let mut files = Vec::new();
            for (at_base, idx, corruption, pos) in snaps {
                let offset = if at_base { bases[idx % bases.len()] } else { boundaries[idx % boundaries.len()] };
                let state = state_at(&history, offset);
                let Some(mut section) = section_of(0, offset, &state.0, &state.1) else { continue };
                let mut bytes = match corruption {
                    // Valid CRC, invalid entry: caught by the entry rule.
                    4 => {
                        section.rows[0].facts.producer_epoch = -1;
                        encode(&[section])
                    }
                    _ => encode(&[section]),
                };
                match corruption {
                    // A flipped byte anywhere.
                    3 => { let at = pos % bytes.len(); bytes[at] ^= 0x5a; }
                    // A torn write.
                    5 => bytes.truncate(pos % bytes.len()),
                    _ => {}
                }
                offsets.push(offset);
                files.push(bytes);
            }
            let reload = reload_partition(&l, &seed, &offsets, &mut |i| load_bytes(&files[i]));
            let mut full = (seed.0.clone(), seed.1.inherited());
            replay(&mut full, &l.segments, log_start.max(base_offset));
            prop_assert_eq!(&reload.producers, &full.0);
            prop_assert_eq!(
                reload.txns.ongoing().collect::<BTreeMap<_, _>>(),
                full.1.ongoing().collect::<BTreeMap<_, _>>()
            );
            if let Some(loaded) = reload.loaded {
                prop_assert!(reload.replay_from >= loaded);
            }
        }
    }
}
