//! The log of one range: a chain of segments shared by the partitions
//! `[lo, hi)`, each partition with its own dense offsets inside it.
//!
//! Appends are serialized by one lock per range and go to the page cache; a
//! flusher task makes them durable with group commit (one `fdatasync` covers
//! every append that arrived while the previous one ran) and then advances
//! each partition's high watermark. Reads copy stored batch bytes as they are.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::{watch, Notify};

use crate::aborted_index_file;
use crate::batch;
use crate::error::{BatchError, LogError};
use crate::producer_snapshot_file::{self, EmptySnapshot};
use crate::producer_state::{
    increment_sequence, BatchMetadata, ProducerStates, SequenceError, Verdict,
};
use crate::segment::{self, IndexEntry, Segment};
use crate::txn_state::{AbortedTxn, TxnState};

mod cleaning;
pub use crate::clean_pass::{CleanedCopy, PreparedPass};
pub use cleaning::{cleaned_path, CleanStats, CleaningView};

/// How a range log is opened.
#[derive(Clone, Debug)]
pub struct RangeLogOptions {
    pub dir: PathBuf,
    pub lo: u32,
    pub hi: u32,
    /// `segment.bytes`: roll the active segment once it reaches this size.
    pub segment_bytes: u64,
    /// `segment.ms`: roll a non-empty active segment older than this.
    pub segment_ms: i64,
    /// Written into every stored batch's partitionLeaderEpoch.
    pub leader_epoch: i32,
    /// Log start offset per partition (index `p - lo`); empty means all 0.
    pub log_start_offsets: Vec<i64>,
    /// What a range created by a split or merge inherits from its parents.
    pub seed: Option<RangeSeed>,
    /// Per partition (index `p - lo`), an offset the partition's next offset
    /// is at least: what the metadata's sealed spans say the partition
    /// reached, for a primary that does not hold every segment locally.
    pub min_next_offsets: Vec<i64>,
    /// Set when some of the range's segments before a local one live only
    /// on other replicas (this broker joined the range later, or missed
    /// segments while away): per local segment sequence, each partition's
    /// next offset (index `p - lo`) where that segment starts, as the
    /// metadata's sealed spans record it. The producer-state reload takes
    /// them as the segment bases and treats the missing history as Kafka
    /// treats remote storage, so the snapshot at such a base (fetched from
    /// the primary that wrote it) loads.
    pub remote_history: Option<BTreeMap<u32, Vec<i64>>>,
    /// Open a sealed range read-only: every segment sealed, appends refused.
    pub sealed: bool,
    /// The active segment has followers: the high watermark (and what
    /// acks=-1 waits for) moves only by [`RangeLog::commit`], when a quorum
    /// of replicas is durable, not by the local fsync alone.
    pub replicated: bool,
    /// Nothing past the newest segment the metadata log records (see
    /// [`RangeLog::set_recorded_active`]) is committed: a replicated
    /// topic's layout, whose restart discards the segments the image never
    /// recorded. With followers they refuse such a segment anyway; without
    /// (the active set shrank to the primary) the local fsync would
    /// otherwise acknowledge records a crash before the roll's record
    /// deletes.
    pub commit_recorded_only: bool,
}

impl RangeLogOptions {
    /// A plain range `[lo, hi)` in `dir`: no roll by size or time, leader
    /// epoch 0, log starts at 0, nothing inherited, local durability, not
    /// sealed. Callers set what differs with struct update syntax.
    pub fn new(dir: &std::path::Path, lo: u32, hi: u32) -> RangeLogOptions {
        RangeLogOptions {
            dir: dir.to_path_buf(),
            lo,
            hi,
            segment_bytes: u64::MAX / 2,
            segment_ms: i64::MAX / 2,
            leader_epoch: 0,
            log_start_offsets: Vec::new(),
            seed: None,
            min_next_offsets: Vec::new(),
            remote_history: None,
            sealed: false,
            replicated: false,
            commit_recorded_only: false,
        }
    }
}

/// The state a child range takes over from its parents, per partition
/// (index `p - lo`): where its offsets continue, and the idempotent
/// producer state, so retries across a split or merge are still caught.
#[derive(Clone, Debug, Default)]
pub struct RangeSeed {
    pub next_offsets: Vec<i64>,
    pub producers: Vec<ProducerStates>,
    /// Open transactions carried over, and the aborted ones of the
    /// history: a broker leading the child without its parents' logs
    /// answers read_committed fetches of that history from the child's
    /// list, and the child's `<seq>.aborted` files list the whole history
    /// as their readers expect.
    pub txns: Vec<TxnState>,
}

/// A segment that was sealed by a roll: what the metadata log must record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SealedSegment {
    pub seq: u32,
    pub size_bytes: u64,
    /// `(partition, start offset, end offset exclusive)`.
    pub spans: Vec<(u32, i64, i64)>,
    /// The sequence number of the segment that is active now.
    pub next_seq: u32,
    /// The leader epoch of the log that reports it: its metadata seal is
    /// for the image's segment of this number at this epoch only.
    pub leader_epoch: i32,
}

/// What one append did.
#[derive(Clone, Debug)]
pub struct AppendOutcome {
    pub base_offset: i64,
    pub last_offset: i64,
    /// Range-wide logical position the append ends at; wait for it to be durable.
    pub end_position: u64,
    /// Set when this append rolled the active segment first.
    pub rolled: Option<SealedSegment>,
    /// Set when the batch was a retry of one already stored: nothing was appended.
    pub duplicate: bool,
}

/// Stored frames of one segment, as a primary ships them to followers.
#[derive(Clone, Debug)]
pub struct FrameChunk {
    pub bytes: Bytes,
    /// The segment's size when read.
    pub segment_size: u64,
    pub sealed: bool,
}

/// Offsets of one partition.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PartitionOffsets {
    pub log_start: i64,
    pub high_watermark: i64,
    pub log_end: i64,
    /// The last stable offset: the high watermark, or the first offset of
    /// the oldest open transaction if that is lower.
    pub last_stable: i64,
}

/// The result of a read.
#[derive(Debug, Default)]
pub struct ReadOutcome {
    pub records: Bytes,
    pub offsets: PartitionOffsets,
}

#[derive(Clone, Copy, Debug, Default)]
struct PartitionState {
    /// The first offset of this partition that lives in this range (the
    /// seed inherited at a split or merge; 0 for a topic's first range).
    base_offset: i64,
    log_start: i64,
    next_offset: i64,
    high_watermark: i64,
}

struct Pending {
    end_position: u64,
    partition_index: usize,
    next_offset: i64,
}

/// Whether a range log takes appends. Decided under the range lock only, so
/// an append and a seal are ordered: once `seal` returns, no append succeeds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WriteState {
    /// Appends are accepted.
    Open,
    /// Sealed for a split or merge: appends get `Closed` (clients see
    /// NOT_LEADER_OR_FOLLOWER); `reopen` undoes it if the move fails.
    Sealed,
    /// Shut down or deleted: appends get `Closed`, the flusher stops.
    Closed,
}

struct Inner {
    state: WriteState,
    segments: Vec<Segment>,
    partitions: Vec<PartitionState>,
    /// Idempotent producer state per partition (index `p - lo`).
    producers: Vec<ProducerStates>,
    /// Transaction state per partition (index `p - lo`).
    txns: Vec<TxnState>,
    /// Logical position of the start of the active segment.
    active_base_position: u64,
    /// Bytes of the segments retention removed since open: range-wide
    /// positions keep counting them, so [`RangeLog::position_of`] starts here.
    removed_bytes: u64,
    pending: VecDeque<Pending>,
    /// The furthest position a commit was asked for (the cap of
    /// `commit_recorded_only` may hold part of it back).
    wanted_commit: u64,
}

impl Inner {
    /// The range-wide position where local segment `seq` starts.
    fn position_of(&self, seq: u32) -> Option<u64> {
        let mut base = self.removed_bytes;
        for seg in &self.segments {
            if seg.seq == seq {
                return Some(base);
            }
            base += seg.size;
        }
        None
    }

    fn offsets(&self, pi: usize) -> PartitionOffsets {
        let state = self.partitions[pi];
        let last_stable = self.txns[pi]
            .first_unstable_offset()
            .map_or(state.high_watermark, |first| {
                first.min(state.high_watermark)
            });
        PartitionOffsets {
            log_start: state.log_start,
            high_watermark: state.high_watermark,
            log_end: state.next_offset,
            last_stable,
        }
    }

    fn active(&mut self) -> &mut Segment {
        self.segments
            .last_mut()
            .expect("a range log always has an active segment")
    }
    fn written_position(&self) -> u64 {
        self.active_base_position + self.segments.last().map_or(0, |s| s.size)
    }
    /// Applies durability up to `position`: every append ending there is now
    /// visible below the high watermark.
    fn advance_durable(&mut self, position: u64) -> bool {
        let mut moved = false;
        while let Some(p) = self.pending.front() {
            if p.end_position > position {
                break;
            }
            let p = self.pending.pop_front().unwrap();
            let state = &mut self.partitions[p.partition_index];
            if p.next_offset > state.high_watermark {
                state.high_watermark = p.next_offset;
                moved = true;
            }
        }
        moved
    }
}

/// How long after it opens a replicated log answers an out-of-order
/// idempotent batch as "not the leader" (retriable, nothing stored) rather
/// than OUT_OF_ORDER_SEQUENCE_NUMBER: longer than the grace a closed log's
/// waiting appends get (`RangeLog::wait_durable`) plus a client's retry.
pub const SUCCESSOR_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);

/// The log of one range.
pub struct RangeLog {
    options: RangeLogOptions,
    /// Roll limits, from `options` and changed by [`RangeLog::set_roll_limits`]
    /// (a topic's `segment.bytes` / `segment.ms` altered while it is open).
    roll_bytes: AtomicU64,
    roll_ms: AtomicI64,
    /// The newest segment the metadata image records for this log (see
    /// [`RangeLog::set_recorded_active`]); the active one at open.
    recorded_active: std::sync::atomic::AtomicU32,
    /// When this log opened (see [`SUCCESSOR_WINDOW`]).
    opened_at: std::time::Instant,
    inner: Mutex<Inner>,
    flush_wanted: Notify,
    /// Committed position: durable on a quorum of the active segment's
    /// replicas (on this broker alone without followers). Moves the high
    /// watermark; acks=-1 waits for it.
    durable: watch::Sender<u64>,
    /// Fsynced on this broker (acks=1 waits for it; a primary's followers
    /// count it as the primary's durable end).
    local_durable: watch::Sender<u64>,
    /// Written position (page cache), for the replicators shipping frames.
    written: watch::Sender<u64>,
    failed: AtomicBool,
    /// Set by the primary's replication while fewer replicas than a commit
    /// needs are in sync: acks=-1 waits end with
    /// `NotEnoughReplicasAfterAppend` instead of waiting for a commit that
    /// may never come (Kafka's NOT_ENOUGH_REPLICAS_AFTER_APPEND).
    short_of_replicas: watch::Sender<bool>,
    /// Batch bytes appended since open, for the load-driven range policy.
    bytes_appended: AtomicU64,
    /// Bumped whenever a high watermark moves, to wake long-polling fetches.
    hw_listener: watch::Sender<u64>,
    /// Serializes the cleaner's segment swaps with retention's deletions.
    files: Mutex<()>,
    #[cfg(test)]
    hooks: TestHooks,
}

/// Points where a test can stop a thread to force an interleaving.
#[cfg(test)]
#[derive(Default)]
struct TestHooks {
    before_append_lock: Mutex<Option<Arc<dyn Fn() + Send + Sync>>>,
    /// fdatasync calls of the flusher.
    flusher_syncs: AtomicU64,
}

#[cfg(test)]
impl TestHooks {
    fn before_append_lock(&self) {
        let hook = self.before_append_lock.lock().clone();
        if let Some(hook) = hook {
            hook();
        }
    }
}

/// Local rolls of a replicated log not yet recorded in the image, at most.
const MAX_UNRECORDED_ROLLS: u32 = 8;

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Sequences of the segment files (`<seq>.log`) in a range directory,
/// oldest first; none when the directory does not exist.
pub fn local_segment_seqs(dir: &Path) -> Result<Vec<u32>, LogError> {
    match list_segments(dir) {
        Err(LogError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        other => other,
    }
}

fn list_segments(dir: &Path) -> Result<Vec<u32>, LogError> {
    let mut seqs = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        if let Some(stem) = name.strip_suffix(".log") {
            if let Ok(seq) = stem.parse::<u32>() {
                seqs.push(seq);
            }
        }
    }
    seqs.sort_unstable();
    Ok(seqs)
}

/// Sequences of the producer snapshots (`<seq>.snapshot`) in `dir`.
fn list_snapshots(dir: &Path) -> Result<Vec<u32>, LogError> {
    let mut seqs = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        if let Some(seq) = name
            .to_string_lossy()
            .strip_suffix(".snapshot")
            .and_then(|stem| stem.parse::<u32>().ok())
        {
            seqs.push(seq);
        }
    }
    Ok(seqs)
}

/// What a replica holding none of a replicated range's segments before
/// `seq` fetches to know that history: its aborted transactions
/// (`<seq>.aborted`) and the producer snapshot (`<seq>.snapshot`, written
/// last and even when empty: its presence says both are complete).
fn write_history_state(
    dir: &Path,
    seq: u32,
    lo: u32,
    next_offsets: impl Iterator<Item = i64>,
    producers: &[ProducerStates],
    txns: &[TxnState],
) -> Result<(), LogError> {
    aborted_index_file::write(dir, seq, lo, txns)?;
    producer_snapshot_file::write_range_snapshot(
        dir,
        seq,
        lo,
        next_offsets,
        producers,
        txns,
        EmptySnapshot::Write,
    )
}

fn remove_if_exists(path: &Path) -> Result<(), LogError> {
    tessera_fs::remove_if_exists(path)?;
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<(), LogError> {
    Ok(tessera_fs::sync_dir(dir)?)
}

impl RangeLog {
    /// Opens (or creates) a range log and recovers it: sealed segments load
    /// their sidecar index, the active one is scanned and its torn tail cut.
    /// Must be called inside a tokio runtime: it starts the flusher task.
    pub fn open(
        options: RangeLogOptions,
        hw_listener: watch::Sender<u64>,
    ) -> Result<Arc<RangeLog>, LogError> {
        std::fs::create_dir_all(&options.dir)?;
        cleaning::remove_stray_copies(&options.dir)?;
        let now = now_ms();
        let seqs = list_segments(&options.dir)?;
        let mut segments = Vec::with_capacity(seqs.len().max(1));
        for (i, &seq) in seqs.iter().enumerate() {
            let sealed = options.sealed || i + 1 < seqs.len();
            segments.push(Segment::open(&options.dir, seq, sealed, now)?);
        }
        if segments.is_empty() {
            segments.push(Segment::create(&options.dir, 0, now)?);
            sync_dir(&options.dir)?;
        }
        // Everything recovered is made durable before it becomes visible.
        segments.last().unwrap().file.sync_data()?;

        let width = (options.hi - options.lo) as usize;
        let mut partitions = vec![PartitionState::default(); width];
        for (i, state) in partitions.iter_mut().enumerate() {
            let start = options.log_start_offsets.get(i).copied().unwrap_or(0);
            let seeded = options
                .seed
                .as_ref()
                .and_then(|s| s.next_offsets.get(i).copied());
            state.log_start = start;
            state.base_offset = seeded.unwrap_or(start).max(start);
            state.next_offset = state.base_offset;
        }
        for seg in &segments {
            for (p, entries) in &seg.index.partitions {
                if let (Some(i), Some(last)) = (p.checked_sub(options.lo), entries.last()) {
                    if let Some(state) = partitions.get_mut(i as usize) {
                        state.next_offset = state.next_offset.max(last.last_offset + 1);
                    }
                }
            }
        }
        for (state, &min) in partitions.iter_mut().zip(&options.min_next_offsets) {
            state.next_offset = state.next_offset.max(min);
        }
        for state in &mut partitions {
            state.high_watermark = state.next_offset;
        }
        // Producer state: what the parents handed over, then this range's
        // own batches, from the newest usable snapshot on (Kafka's rules).
        let seed_producers = options
            .seed
            .as_ref()
            .map(|s| s.producers.clone())
            .filter(|p| p.len() == width)
            .unwrap_or_else(|| vec![ProducerStates::default(); width]);
        let seed_txns = options
            .seed
            .as_ref()
            .map(|s| s.txns.clone())
            .filter(|t| t.len() == width)
            .unwrap_or_else(|| vec![TxnState::default(); width]);
        let starts: Vec<(i64, i64)> = partitions
            .iter()
            .map(|s| (s.base_offset, s.log_start))
            .collect();
        let (producers, txns) = producer_snapshot_file::reload_range(
            &options.dir,
            options.lo,
            &segments,
            &starts,
            &seed_producers,
            &seed_txns,
            options.seed.is_some() || options.remote_history.is_some(),
            options.remote_history.as_ref(),
        )?;
        // Files past the segment after the newest local one are another
        // incarnation's (a closed log's rolls); those before it are the
        // history's (retention removes them with their segments).
        let newest_local = segments.last().map_or(0, |s| s.seq);
        aborted_index_file::remove_unless(&options.dir, |seq| {
            seq <= newest_local.saturating_add(1)
        })?;
        let active = segments.last().unwrap();
        let seeded_child = options.seed.is_some() && active.seq == 0;
        if (options.replicated || seeded_child) && !options.sealed && active.size == 0 {
            // A follower of this new segment that lacks the older ones
            // fetches the producer state where it starts (written after the
            // reload, which drops snapshots no partition keeps). So does a
            // broker an unreplicated child moves to (`primary_move`): only
            // this log read the parents it inherits from.
            let written = write_history_state(
                &options.dir,
                active.seq,
                options.lo,
                partitions.iter().map(|s| s.next_offset),
                &producers,
                &txns,
            );
            if let Err(e) = written {
                tracing::warn!(dir = %options.dir.display(), seq = active.seq, error = %e, "writing producer snapshot failed");
            }
        }
        let active_base_position = segments[..segments.len() - 1].iter().map(|s| s.size).sum();
        let active_seq_at_open = active.seq;
        let inner = Inner {
            state: if options.sealed {
                WriteState::Sealed
            } else {
                WriteState::Open
            },
            segments,
            partitions,
            producers,
            txns,
            active_base_position,
            removed_bytes: 0,
            pending: VecDeque::new(),
            wanted_commit: 0,
        };
        let written = inner.written_position();
        let log = Arc::new(RangeLog {
            recorded_active: std::sync::atomic::AtomicU32::new(active_seq_at_open),
            opened_at: std::time::Instant::now(),
            roll_bytes: AtomicU64::new(options.segment_bytes),
            roll_ms: AtomicI64::new(options.segment_ms),
            options,
            inner: Mutex::new(inner),
            flush_wanted: Notify::new(),
            durable: watch::channel(written).0,
            local_durable: watch::channel(written).0,
            written: watch::channel(written).0,
            failed: AtomicBool::new(false),
            short_of_replicas: watch::channel(false).0,
            bytes_appended: AtomicU64::new(0),
            hw_listener,
            files: Mutex::new(()),
            #[cfg(test)]
            hooks: TestHooks::default(),
        });
        // The flusher owns a reference until `close()` or `delete()`: a range
        // log lives until then (also while sealed by a move, which `reopen`
        // can undo). A range opened sealed takes no writes and needs none.
        if !log.options.sealed {
            tokio::spawn(flusher(log.clone()));
        }
        Ok(log)
    }

    pub fn lo(&self) -> u32 {
        self.options.lo
    }
    pub fn hi(&self) -> u32 {
        self.options.hi
    }
    pub fn dir(&self) -> &Path {
        &self.options.dir
    }
    /// The leader epoch this log was opened at: every segment it writes
    /// (its own rolls included) belongs to that epoch.
    pub fn leader_epoch(&self) -> i32 {
        self.options.leader_epoch
    }

    fn index_of(&self, partition: u32) -> Result<usize, LogError> {
        if partition < self.options.lo || partition >= self.options.hi {
            return Err(LogError::PartitionNotInRange(partition));
        }
        Ok((partition - self.options.lo) as usize)
    }

    /// Assigns offsets to one validated batch of `partition` and appends it.
    /// `batch_bytes` is rewritten in place (baseOffset, leader epoch, and the
    /// LogAppendTime fields when `log_append_time` is set).
    pub fn append(
        &self,
        partition: u32,
        batch_bytes: &mut [u8],
        log_append_time: Option<i64>,
    ) -> Result<AppendOutcome, LogError> {
        self.append_inner(partition, batch_bytes, log_append_time, false)
    }

    /// Migration only: appends one validated batch copied from another
    /// cluster at **its own** base offset instead of assigning one. The
    /// offset must be at or above the partition's log end (offsets are
    /// never reused); the partition's next offset jumps over the gap, as
    /// a source log that was compacted or holds transaction markers has
    /// gaps. The batch is stored byte for byte (only partitionLeaderEpoch
    /// is rewritten); the idempotence check is skipped (the source
    /// accepted these batches) but producer and transaction state are
    /// recorded as for any append, so read_committed and duplicates of
    /// later producers work as if the batch had been produced here.
    pub fn append_at_source_offset(
        &self,
        partition: u32,
        batch_bytes: &mut [u8],
    ) -> Result<AppendOutcome, LogError> {
        self.append_inner(partition, batch_bytes, None, true)
    }

    fn append_inner(
        &self,
        partition: u32,
        batch_bytes: &mut [u8],
        log_append_time: Option<i64>,
        at_source_offset: bool,
    ) -> Result<AppendOutcome, LogError> {
        let pi = self.index_of(partition)?;
        let header = batch::parse_header(batch_bytes)?;
        // Control batches (transaction markers) are written by the broker
        // and carry no sequence.
        let idempotent = header.producer_id >= 0 && !header.is_control();
        let last_seq = increment_sequence(header.base_sequence, header.last_offset_delta);
        #[cfg(test)]
        self.hooks.before_append_lock();
        let mut inner = self.inner.lock();
        // Decided under the lock that `seal` holds: an append that lost the
        // race to a seal is refused here, never written after it.
        if self.failed.load(Ordering::Relaxed) {
            return Err(LogError::StorageFailed);
        }
        if inner.state != WriteState::Open {
            return Err(LogError::Closed);
        }
        if at_source_offset && header.base_offset.checked_add(i64::MAX / 2).is_none() {
            return Err(BatchError::Corrupt("base offset out of range").into());
        }
        if at_source_offset && header.base_offset < inner.partitions[pi].next_offset {
            return Err(LogError::OffsetBelowLogEnd {
                offset: header.base_offset,
                log_end: inner.partitions[pi].next_offset,
            });
        }
        if idempotent && !at_source_offset {
            let verdict = match inner.producers[pi].check(
                header.producer_id,
                header.producer_epoch,
                header.base_sequence,
                last_seq,
            ) {
                // A replicated log that just opened (the broker leads the
                // range on after a seal) may get the tail of a pipeline the
                // old log answered: batch R1 kept by the seal but failed
                // NOT_LEADER_OR_FOLLOWER, R2 refused while no log was open,
                // R3 here. OUT_OF_ORDER_SEQUENCE_NUMBER for R3 would make
                // librdkafka bump the epoch and resend R1 under new
                // sequence numbers (stored twice); "not the leader yet"
                // makes it drain and resend R1, R2, R3 in order instead.
                Err(SequenceError::OutOfOrderSequence { .. })
                    if self.options.replicated && self.opened_at.elapsed() < SUCCESSOR_WINDOW =>
                {
                    return Err(LogError::Closed);
                }
                other => other?,
            };
            if let Verdict::Duplicate(original) = verdict {
                let end_position = inner.written_position();
                return Ok(AppendOutcome {
                    base_offset: original.first_offset,
                    last_offset: original.last_offset,
                    end_position,
                    rolled: None,
                    duplicate: true,
                });
            }
        }
        let rolled = self.maybe_roll(&mut inner)?;
        let base_offset = if at_source_offset {
            header.base_offset
        } else {
            inner.partitions[pi].next_offset
        };
        let last_offset = base_offset + header.last_offset_delta as i64;
        batch::set_base_offset(batch_bytes, base_offset);
        batch::set_partition_leader_epoch(batch_bytes, self.options.leader_epoch);
        let max_ts = match log_append_time {
            Some(now) => {
                batch::set_log_append_time(batch_bytes, now);
                now
            }
            None => header.max_timestamp,
        };
        let flags = batch::index_flags(&header, batch_bytes);
        let entry = IndexEntry::for_batch(&header, base_offset, max_ts, batch_bytes.len(), flags);
        match inner.active().append(partition, batch_bytes, entry) {
            Ok(_) => {}
            // Nothing was written (a second line of defence; unreachable
            // while the state check above holds).
            Err(e @ LogError::SegmentSealed) => return Err(e),
            Err(e) => {
                // A failed write may have left a partial frame: refuse further
                // writes rather than append after garbage. Restart recovery cuts it.
                self.latch_failure("appending", &e);
                return Err(e);
            }
        }
        inner.partitions[pi].next_offset = last_offset + 1;
        self.bytes_appended
            .fetch_add(batch_bytes.len() as u64, Ordering::Relaxed);
        if idempotent {
            inner.producers[pi].record(
                header.producer_id,
                header.producer_epoch,
                batch_metadata(&entry),
            );
        } else if header.is_control() && header.producer_id >= 0 {
            inner.producers[pi].record_marker(header.producer_id, header.producer_epoch);
        }
        inner.txns[pi].on_batch(header.producer_id, base_offset, last_offset, flags);
        let end_position = inner.written_position();
        inner.pending.push_back(Pending {
            end_position,
            partition_index: pi,
            next_offset: last_offset + 1,
        });
        drop(inner);
        self.written.send_replace(end_position);
        self.flush_wanted.notify_one();
        Ok(AppendOutcome {
            base_offset,
            last_offset,
            end_position,
            rolled,
            duplicate: false,
        })
    }

    /// Rolls the active segment when it is full or old. The sealed segment is
    /// fsynced and its index written before the next one opens.
    fn maybe_roll(&self, inner: &mut Inner) -> Result<Option<SealedSegment>, LogError> {
        let now = now_ms();
        let active = inner.segments.last().unwrap();
        let full = active.size >= self.roll_bytes.load(Ordering::Relaxed);
        let old =
            active.size > 0 && now - active.created_ms >= self.roll_ms.load(Ordering::Relaxed);
        if !(full || old) {
            return Ok(None);
        }
        // A replicated log rolls at most a few segments ahead of what the
        // image records: followers take a segment only once the image
        // shows it, and each roll is recorded only once the segment before
        // it is committed, so a primary rolling further ahead would hold
        // segments nobody can replicate yet (the active one grows past
        // segment.bytes meanwhile).
        if self.options.replicated
            && active.seq >= self.recorded_active.load(Ordering::Acquire) + MAX_UNRECORDED_ROLLS
        {
            return Ok(None);
        }
        // A file of the next number already here is another incarnation's
        // copy (this broker follows the segment a failover opened while this
        // log, a zombie's, still takes appends): rolling would append this
        // log's batches to it. The log is stale; nothing more goes in.
        if (self.options.replicated || self.options.commit_recorded_only)
            && segment::log_path(&self.options.dir, active.seq + 1).exists()
        {
            return Err(LogError::Closed);
        }
        self.roll_locked(inner, now).map(Some)
    }

    /// The newest segment of this log the image records (see
    /// [`RangeLog::set_recorded_active`]).
    pub fn recorded_active(&self) -> u32 {
        self.recorded_active.load(Ordering::Acquire)
    }

    /// The metadata image records segment `seq` of this log as the range's
    /// active segment (its roll was recorded): a replicated log may roll it.
    pub fn set_recorded_active(&self, seq: u32) {
        let before = self.recorded_active.fetch_max(seq, Ordering::AcqRel);
        if seq > before && self.options.commit_recorded_only {
            // What the cap held back may be committed now.
            let mut inner = self.inner.lock();
            let wanted = inner.wanted_commit;
            self.commit_locked(&mut inner, wanted);
        }
    }

    fn roll_locked(&self, inner: &mut Inner, now: i64) -> Result<SealedSegment, LogError> {
        let rolled = self
            .seal_active(inner, false)
            .and_then(|sealed| self.open_next_segment(inner, &sealed, now).map(|()| sealed));
        rolled.inspect_err(|e| self.latch_failure("rolling a segment", e))
    }

    /// A write, fsync or file operation failed: from now on the log refuses
    /// every append and every durability wait fails (Kafka takes the log
    /// dir offline). Never retried in place: after a failed fsync the kernel
    /// may have dropped the dirty pages and report the next fsync as a
    /// success, so nothing written before it may ever be acknowledged.
    fn latch_failure(&self, what: &str, e: &LogError) {
        if !self.failed.swap(true, Ordering::SeqCst) {
            tracing::error!(
                dir = %self.options.dir.display(), error = %e,
                "{what} failed; range log stops accepting writes"
            );
        }
        self.durable.send_modify(|_| {});
        self.local_durable.send_modify(|_| {});
    }

    /// Opens the segment after the sealed active one and makes it active.
    fn open_next_segment(
        &self,
        inner: &mut Inner,
        sealed: &SealedSegment,
        now: i64,
    ) -> Result<(), LogError> {
        let next = Segment::create(&self.options.dir, sealed.next_seq, now)?;
        sync_dir(&self.options.dir)?;
        inner.active_base_position += sealed.size_bytes;
        inner.segments.push(next);
        let position = inner.active_base_position;
        self.publish_durable(inner, position);
        Ok(())
    }

    /// Fsyncs and indexes the active segment, marks it sealed and writes the
    /// producer-state snapshot for where the next segment starts.
    /// `range_seal`: the range stops here (a split, merge or move), and a
    /// broker that holds none of it may go on from this end: the history
    /// state is written whole even for an unreplicated log.
    fn seal_active(&self, inner: &mut Inner, range_seal: bool) -> Result<SealedSegment, LogError> {
        let active = inner.active();
        active.file.sync_data()?;
        active.write_index(&self.options.dir)?;
        active.sealed = true;
        let sealed = SealedSegment {
            seq: active.seq,
            size_bytes: active.size,
            spans: active.index.spans(),
            next_seq: active.seq + 1,
            leader_epoch: self.options.leader_epoch,
        };
        self.write_snapshot(inner, sealed.next_seq, range_seal);
        Ok(sealed)
    }

    /// Everything up to `position` is on this broker's disk. Without
    /// followers that commits it; with followers [`RangeLog::commit`] does.
    fn publish_durable(&self, inner: &mut Inner, position: u64) {
        self.local_durable.send_if_modified(|d| {
            let moved = *d < position;
            *d = (*d).max(position);
            moved
        });
        if !self.options.replicated {
            self.commit_locked(inner, position);
        }
    }

    /// Everything up to `position` is committed: move the high watermarks
    /// and wake whoever waits for them.
    fn commit_locked(&self, inner: &mut Inner, position: u64) {
        inner.wanted_commit = inner.wanted_commit.max(position);
        let position = if self.options.commit_recorded_only {
            let unrecorded = self.recorded_active.load(Ordering::Acquire) + 1;
            inner
                .position_of(unrecorded)
                .map_or(position, |cap| position.min(cap))
        } else {
            position
        };
        if inner.advance_durable(position) {
            self.hw_listener.send_modify(|v| *v += 1);
        }
        self.durable.send_if_modified(|d| {
            let moved = *d < position;
            *d = (*d).max(position);
            moved
        });
    }

    /// A quorum of the active segment's replicas is durable up to
    /// `position` (range-wide, as [`RangeLog::position_of`] maps it): the
    /// high watermark moves and acks=-1 appends up to it are answered.
    pub fn commit(&self, position: u64) {
        let mut inner = self.inner.lock();
        let position = position.min(inner.written_position());
        self.commit_locked(&mut inner, position);
    }

    /// Whether nothing past the newest segment the image records is
    /// committed (the replicated layout). Without it (an unreplicated
    /// range that never moved) the log acknowledges past its own rolls
    /// before the metadata log records them.
    pub fn commits_recorded_only(&self) -> bool {
        self.options.commit_recorded_only
    }

    /// Whether the active segment has followers (the commit is a quorum's).
    pub fn is_replicated(&self) -> bool {
        self.options.replicated
    }

    /// The primary's replication says whether fewer replicas than a commit
    /// needs are in sync (see `short_of_replicas`).
    pub fn set_short_of_replicas(&self, short: bool) {
        self.short_of_replicas.send_if_modified(|s| {
            let changed = *s != short;
            *s = short;
            changed
        });
    }

    /// The local segments from `seq` on, oldest first, as `(seq, size,
    /// sealed)`; the last one is the active segment.
    pub fn segments_from(&self, seq: u32) -> Vec<(u32, u64, bool)> {
        let inner = self.inner.lock();
        inner
            .segments
            .iter()
            .filter(|s| s.seq >= seq)
            .map(|s| (s.seq, s.size, s.sealed))
            .collect()
    }

    /// Range-wide position of byte `position` of local segment `seq`.
    pub fn position_of(&self, seq: u32, position: u64) -> Option<u64> {
        let inner = self.inner.lock();
        let base = inner.position_of(seq)?;
        let size = inner.segments.iter().find(|s| s.seq == seq)?.size;
        Some(base + position.min(size))
    }

    /// The local durable end as `(active seq, bytes of it fsynced)`.
    pub fn local_durable_end(&self) -> (u32, u64) {
        let inner = self.inner.lock();
        let durable = *self.local_durable.borrow();
        let active = inner.segments.last().unwrap();
        let base = inner.active_base_position;
        (active.seq, durable.saturating_sub(base).min(active.size))
    }

    /// Stored frames of local segment `seq` from byte `from`: whole frames,
    /// about `max` bytes (one frame at least, whatever its size). Also the
    /// segment's current size and whether it is sealed. `None` if this log
    /// does not hold the segment.
    pub fn frames(&self, seq: u32, from: u64, max: usize) -> Result<Option<FrameChunk>, LogError> {
        let (file, size, sealed) = {
            let inner = self.inner.lock();
            let Some(seg) = inner.segments.iter().find(|s| s.seq == seq) else {
                return Ok(None);
            };
            (seg.file.clone(), seg.size, seg.sealed)
        };
        if from >= size {
            return Ok(Some(FrameChunk {
                bytes: Bytes::new(),
                segment_size: size,
                sealed,
            }));
        }
        let bytes = segment::read_frames(&file, from, size, max)?;
        Ok(Some(FrameChunk {
            bytes,
            segment_size: size,
            sealed,
        }))
    }

    /// Subscribes to the written position (moves on every append).
    pub fn subscribe_written(&self) -> watch::Receiver<u64> {
        self.written.subscribe()
    }

    /// Subscribes to the local durable position.
    pub fn subscribe_local_durable(&self) -> watch::Receiver<u64> {
        self.local_durable.subscribe()
    }

    /// Waits until everything up to `position` is fsynced on this broker
    /// (acks=1), whether or not followers have it yet.
    pub async fn wait_local_durable(&self, position: u64) -> Result<(), LogError> {
        let mut rx = self.local_durable.subscribe();
        loop {
            if *rx.borrow_and_update() >= position {
                return Ok(());
            }
            if self.failed.load(Ordering::Relaxed) {
                return Err(LogError::StorageFailed);
            }
            if self.inner.lock().state != WriteState::Open && *rx.borrow() < position {
                // Sealed or closed before it was durable here: it never will be.
                return Err(LogError::Closed);
            }
            if rx.changed().await.is_err() {
                return Err(LogError::Closed);
            }
        }
    }

    /// True when this log holds segment `seq`, sealed.
    pub fn holds_sealed(&self, seq: u32) -> bool {
        self.inner
            .lock()
            .segments
            .iter()
            .any(|s| s.seq == seq && s.sealed)
    }

    /// The size of sealed segment `seq`, if this log holds it.
    pub fn sealed_size(&self, seq: u32) -> Option<u64> {
        self.inner
            .lock()
            .segments
            .iter()
            .find(|s| s.seq == seq && s.sealed)
            .map(|s| s.size)
    }

    /// Seals the active segment now, if it holds anything.
    pub fn roll(&self) -> Result<Option<SealedSegment>, LogError> {
        let mut inner = self.inner.lock();
        if self.failed.load(Ordering::Relaxed) {
            return Err(LogError::StorageFailed);
        }
        if inner.state != WriteState::Open {
            return Err(LogError::Closed);
        }
        if inner.segments.last().unwrap().size == 0 {
            return Ok(None);
        }
        self.roll_locked(&mut inner, now_ms()).map(Some)
    }

    /// Waits until everything up to `position` is committed (durable on a
    /// quorum of the replicas; on this disk without followers). Once the log
    /// is sealed or closed a commit may never come (a fenced primary): the
    /// wait gives up after a short grace with `Closed`, which clients see
    /// as NOT_LEADER_OR_FOLLOWER and retry at the new leader.
    pub async fn wait_durable(&self, position: u64) -> Result<(), LogError> {
        const GRACE_AFTER_SEAL: std::time::Duration = std::time::Duration::from_secs(2);
        let mut rx = self.durable.subscribe();
        let mut short = self.short_of_replicas.subscribe();
        let mut deadline: Option<tokio::time::Instant> = None;
        loop {
            if *rx.borrow_and_update() >= position {
                return Ok(());
            }
            if self.failed.load(Ordering::Relaxed) {
                return Err(LogError::StorageFailed);
            }
            if *short.borrow_and_update() {
                return Err(LogError::NotEnoughReplicasAfterAppend);
            }
            if deadline.is_none() && self.inner.lock().state != WriteState::Open {
                deadline = Some(tokio::time::Instant::now() + GRACE_AFTER_SEAL);
            }
            let at = deadline.unwrap_or_else(tokio::time::Instant::now);
            tokio::select! {
                changed = rx.changed() => if changed.is_err() { return Err(LogError::Closed) },
                changed = short.changed() => if changed.is_err() { return Err(LogError::Closed) },
                _ = tokio::time::sleep_until(at), if deadline.is_some() => return Err(LogError::Closed),
            }
        }
    }

    /// Moves `partition`'s log start offset forward to `offset` (DeleteRecords
    /// or retention, as the metadata log recorded it); never back. Reads
    /// below it get `OffsetOutOfRange` from then on. The batches below it
    /// stay on disk until retention removes whole segments.
    pub fn advance_log_start(&self, partition: u32, offset: i64) -> Result<(), LogError> {
        let pi = self.index_of(partition)?;
        let mut inner = self.inner.lock();
        let state = &mut inner.partitions[pi];
        state.log_start = state.log_start.max(offset);
        Ok(())
    }

    /// Retention: drops every sealed segment with a sequence below `seq`
    /// (never the active one) from the log and deletes its files (`.log`,
    /// `.idx`) and the producer snapshots below `seq` (the one at `seq`, the
    /// state where the oldest kept segment starts, stays: a reopen reloads
    /// producers from it). Each partition's log start moves up to the end of
    /// its data in the removed segments, so no read reaches into the gap
    /// even before the metadata's log start arrives. Returns the sequences
    /// removed.
    pub fn delete_segments_below(&self, seq: u32) -> Result<Vec<u32>, LogError> {
        let _files = self.files.lock();
        let removed: Vec<Segment> = {
            let mut inner = self.inner.lock();
            let last = inner.segments.len() - 1;
            let n = inner.segments[..last]
                .iter()
                .take_while(|s| s.sealed && s.seq < seq)
                .count();
            if n == 0 {
                return Ok(Vec::new());
            }
            let removed: Vec<Segment> = inner.segments.drain(..n).collect();
            for seg in &removed {
                inner.removed_bytes += seg.size;
                for (p, entries) in &seg.index.partitions {
                    let (Some(pi), Some(e)) = (p.checked_sub(self.options.lo), entries.last())
                    else {
                        continue;
                    };
                    if let Some(state) = inner.partitions.get_mut(pi as usize) {
                        state.log_start = state.log_start.max(e.last_offset + 1);
                    }
                }
            }
            removed
        };
        let dir = &self.options.dir;
        let mut seqs = Vec::with_capacity(removed.len());
        for seg in &removed {
            for path in [
                segment::log_path(dir, seg.seq),
                segment::index_path(dir, seg.seq),
            ] {
                remove_if_exists(&path)?;
            }
            seqs.push(seg.seq);
        }
        for old in list_snapshots(dir)? {
            if old < seq {
                remove_if_exists(&producer_snapshot_file::snapshot_path(dir, old))?;
            }
        }
        aborted_index_file::remove_unless(dir, |old| old >= seq)?;
        sync_dir(dir)?;
        Ok(seqs)
    }

    /// Per local sealed segment `(seq, size, largest timestamp)` (-1 when
    /// it holds no batch), oldest first, and the active segment's size: what
    /// retention decides by.
    pub fn retention_view(&self) -> (Vec<(u32, u64, i64)>, u64) {
        let inner = self.inner.lock();
        let sealed = inner
            .segments
            .iter()
            .filter(|s| s.sealed)
            .map(|s| {
                let max_ts = s
                    .index
                    .partitions
                    .values()
                    .flat_map(|entries| entries.iter())
                    .map(|e| e.max_timestamp)
                    .max()
                    .unwrap_or(-1);
                (s.seq, s.size, max_ts)
            })
            .collect();
        (sealed, inner.segments.last().map_or(0, |s| s.size))
    }

    /// True when segment `seq` is one of this log's local segments (sealed
    /// or active), whatever its size (a cleaned segment is smaller than
    /// its seal recorded).
    pub fn holds_segment(&self, seq: u32) -> bool {
        self.inner.lock().segments.iter().any(|s| s.seq == seq)
    }

    /// Bytes of stored batches of `partition` in this range's local
    /// segments (the per-partition index's batch lengths, frame headers
    /// not counted), for DescribeLogDirs.
    pub fn partition_size(&self, partition: u32) -> Result<u64, LogError> {
        self.index_of(partition)?;
        let inner = self.inner.lock();
        Ok(inner
            .segments
            .iter()
            .filter_map(|seg| seg.index.partitions.get(&partition))
            .flat_map(|entries| entries.iter())
            .map(|e| u64::from(e.length))
            .sum())
    }

    pub fn offsets(&self, partition: u32) -> Result<PartitionOffsets, LogError> {
        let pi = self.index_of(partition)?;
        let inner = self.inner.lock();
        Ok(inner.offsets(pi))
    }

    /// Aborted transactions of `partition` whose marker this range holds and
    /// that overlap `[from, to)` (for read_committed fetches).
    pub fn aborted_transactions(
        &self,
        partition: u32,
        from: i64,
        to: i64,
    ) -> Result<Vec<AbortedTxn>, LogError> {
        let pi = self.index_of(partition)?;
        Ok(self.inner.lock().txns[pi].aborted_overlapping(from, to))
    }

    /// The idempotent producer state of `partition` (read-only copy).
    pub fn producers(
        &self,
        partition: u32,
    ) -> Result<Vec<(i64, crate::producer_state::ProducerEntry)>, LogError> {
        let pi = self.index_of(partition)?;
        let inner = self.inner.lock();
        Ok(inner.producers[pi]
            .iter()
            .map(|(id, e)| (id, e.clone()))
            .collect())
    }

    /// Open transactions of `partition` as `(producer id, first offset)`.
    pub fn ongoing_transactions(&self, partition: u32) -> Result<Vec<(i64, i64)>, LogError> {
        let pi = self.index_of(partition)?;
        Ok(self.inner.lock().txns[pi].ongoing().collect())
    }

    /// Reads `partition`'s batches from the one holding `offset`, below the
    /// high watermark, up to `max_bytes` (the first batch always, whatever its size).
    pub fn read(
        &self,
        partition: u32,
        offset: i64,
        max_bytes: usize,
    ) -> Result<ReadOutcome, LogError> {
        self.read_below(partition, offset, max_bytes, i64::MAX)
    }

    /// Like [`RangeLog::read`], returning only batches that start below
    /// `upper` as well (the last stable offset, for read_committed).
    pub fn read_below(
        &self,
        partition: u32,
        offset: i64,
        max_bytes: usize,
        upper: i64,
    ) -> Result<ReadOutcome, LogError> {
        let pi = self.index_of(partition)?;
        let mut plan: Vec<(Arc<File>, IndexEntry)> = Vec::new();
        let offsets;
        {
            let inner = self.inner.lock();
            let state = inner.partitions[pi];
            offsets = inner.offsets(pi);
            let limit = state.high_watermark.min(upper);
            if offset < state.log_start.max(state.base_offset) || offset > state.next_offset {
                return Err(LogError::OffsetOutOfRange {
                    offset,
                    log_start: state.log_start,
                    log_end: state.next_offset,
                });
            }
            let mut total = 0usize;
            'segments: for seg in &inner.segments {
                let Some(entries) = seg.index.partitions.get(&partition) else {
                    continue;
                };
                if entries.last().is_none_or(|e| e.last_offset < offset) {
                    continue;
                }
                let start = entries.partition_point(|e| e.last_offset < offset);
                for e in &entries[start..] {
                    if e.base_offset >= limit {
                        break 'segments;
                    }
                    if !plan.is_empty() && total + e.length as usize > max_bytes {
                        break 'segments;
                    }
                    total += e.length as usize;
                    plan.push((seg.file.clone(), *e));
                }
            }
        }
        Ok(ReadOutcome {
            records: read_plan(&plan)?,
            offsets,
        })
    }

    /// The first stored batch of `partition` ending at or after `from` (the
    /// log start offset) whose max timestamp is at or after `timestamp`,
    /// with its bytes (the caller finds the record in it).
    pub fn batch_at_timestamp(
        &self,
        partition: u32,
        timestamp: i64,
        from: i64,
    ) -> Result<Option<Bytes>, LogError> {
        self.find_batch(partition, |entries, hw| {
            entries
                .iter()
                .find(|e| {
                    e.base_offset < hw && e.last_offset >= from && e.max_timestamp >= timestamp
                })
                .copied()
        })
    }

    /// The stored batch of `partition` holding its largest timestamp (the
    /// earliest such batch on ties, as Kafka picks the first max).
    pub fn batch_with_max_timestamp(&self, partition: u32) -> Result<Option<Bytes>, LogError> {
        let pi = self.index_of(partition)?;
        let inner = self.inner.lock();
        let hw = inner.partitions[pi].high_watermark;
        let mut best: Option<(Arc<File>, IndexEntry)> = None;
        for seg in &inner.segments {
            if let Some(entries) = seg.index.partitions.get(&partition) {
                for e in entries.iter().filter(|e| e.base_offset < hw) {
                    if best
                        .as_ref()
                        .is_none_or(|(_, b)| e.max_timestamp > b.max_timestamp)
                    {
                        best = Some((seg.file.clone(), *e));
                    }
                }
            }
        }
        drop(inner);
        best.map(|b| read_plan(&[b])).transpose()
    }

    fn find_batch(
        &self,
        partition: u32,
        pick: impl Fn(&[IndexEntry], i64) -> Option<IndexEntry>,
    ) -> Result<Option<Bytes>, LogError> {
        let pi = self.index_of(partition)?;
        let inner = self.inner.lock();
        let hw = inner.partitions[pi].high_watermark;
        for seg in &inner.segments {
            if let Some(entries) = seg.index.partitions.get(&partition) {
                if let Some(e) = pick(entries, hw) {
                    let file = seg.file.clone();
                    drop(inner);
                    return read_plan(&[(file, e)]).map(Some);
                }
            }
        }
        Ok(None)
    }

    /// Number of segments (sealed and active) this range holds.
    /// Changes the size and age at which the active segment rolls (checked
    /// at the next append).
    pub fn set_roll_limits(&self, segment_bytes: u64, segment_ms: i64) {
        self.roll_bytes.store(segment_bytes, Ordering::Relaxed);
        self.roll_ms.store(segment_ms, Ordering::Relaxed);
    }

    pub fn segment_count(&self) -> usize {
        self.inner.lock().segments.len()
    }

    /// The sealed segments and the active one's sequence, for reconciling with metadata.
    pub fn local_segments(&self) -> (Vec<SealedSegment>, u32) {
        let inner = self.inner.lock();
        let active_seq = inner.segments.last().unwrap().seq;
        let sealed = inner
            .segments
            .iter()
            .filter(|s| s.sealed)
            .map(|s| SealedSegment {
                seq: s.seq,
                size_bytes: s.size,
                spans: s.index.spans(),
                next_seq: s.seq + 1,
                leader_epoch: self.options.leader_epoch,
            })
            .collect();
        (sealed, active_seq)
    }

    /// Batch bytes appended since this log was opened.
    pub fn bytes_appended(&self) -> u64 {
        self.bytes_appended.load(Ordering::Relaxed)
    }

    /// The first offset of `partition` stored in this range (below it, the
    /// partition's history lives in an ancestor range).
    pub fn base_offset(&self, partition: u32) -> Result<i64, LogError> {
        let pi = self.index_of(partition)?;
        Ok(self.inner.lock().partitions[pi].base_offset)
    }

    /// True once the range takes no more appends (sealed, closed or opened sealed).
    pub fn is_sealed(&self) -> bool {
        self.options.sealed || self.inner.lock().state != WriteState::Open
    }

    /// Seals the whole range for a split or merge: from the moment this
    /// returns no append succeeds (they get `Closed`, which clients see as
    /// NOT_LEADER_OR_FOLLOWER); every append that won the race is in the
    /// final segment, fsynced, indexed and below the high watermark. Returns
    /// the final segment as the metadata log must record it. An fsync failure
    /// here latches the log as failed (Kafka takes the log dir offline).
    pub fn seal(&self) -> Result<SealedSegment, LogError> {
        let mut inner = self.inner.lock();
        if self.failed.load(Ordering::Relaxed) {
            return Err(LogError::StorageFailed);
        }
        if inner.state != WriteState::Open {
            return Err(LogError::Closed);
        }
        // No append can run while we hold the lock; it stays Open (and
        // refuses nothing yet) only if sealing fails before the state flips.
        let sealed = self
            .seal_active(&mut inner, true)
            .inspect_err(|e| self.latch_failure("sealing the range", e))?;
        inner.state = WriteState::Sealed;
        let position = inner.written_position();
        self.publish_durable(&mut inner, position);
        self.durable.send_modify(|_| {});
        Ok(sealed)
    }

    /// Undoes [`RangeLog::seal`] when the split or merge it was for did not
    /// commit: the range serves again, in a new segment after the sealed
    /// one (same leader epoch). Returns the sealed segment, which the
    /// metadata log records as an ordinary roll.
    pub fn reopen(&self) -> Result<SealedSegment, LogError> {
        let mut inner = self.inner.lock();
        if self.options.sealed || inner.state != WriteState::Sealed {
            return Err(LogError::Closed);
        }
        if self.failed.load(Ordering::Relaxed) {
            return Err(LogError::StorageFailed);
        }
        let last = inner.segments.last().unwrap();
        let sealed = SealedSegment {
            seq: last.seq,
            size_bytes: last.size,
            spans: last.index.spans(),
            next_seq: last.seq + 1,
            leader_epoch: self.options.leader_epoch,
        };
        self.open_next_segment(&mut inner, &sealed, now_ms())
            .inspect_err(|e| self.latch_failure("reopening the range", e))?;
        inner.state = WriteState::Open;
        Ok(sealed)
    }

    /// What a child covering `[lo, hi)` (inside this range) inherits: each
    /// partition's next offset, producer state and transactions (open and
    /// aborted). Index `p - lo`.
    pub fn seed_for(&self, lo: u32, hi: u32) -> Result<RangeSeed, LogError> {
        let first = self.index_of(lo)?;
        self.index_of(hi.saturating_sub(1).max(lo))?;
        let inner = self.inner.lock();
        let n = (hi - lo) as usize;
        Ok(RangeSeed {
            next_offsets: inner.partitions[first..first + n]
                .iter()
                .map(|s| s.next_offset)
                .collect(),
            producers: inner.producers[first..first + n].to_vec(),
            txns: inner.txns[first..first + n].to_vec(),
        })
    }

    /// Stops the flusher; further appends fail with `Closed`. A clean
    /// shutdown: the active segment is fsynced and the producer state
    /// snapshotted at the log end, so the next open replays nothing.
    pub fn close(&self) {
        // A cleaner's segment swap in progress finishes first; later ones
        // see the log closed and stop (the directory may be reopened).
        let _files = self.files.lock();
        let mut inner = self.inner.lock();
        let was = std::mem::replace(&mut inner.state, WriteState::Closed);
        if was == WriteState::Open && !self.options.sealed && !self.failed.load(Ordering::Relaxed) {
            let active = inner.segments.last().unwrap();
            match active.file.sync_data() {
                Ok(()) => self.write_snapshot(&inner, active.seq + 1, false),
                Err(e) => tracing::warn!(
                    dir = %self.options.dir.display(),
                    error = %e,
                    "fsync at close failed; no producer snapshot written"
                ),
            }
        }
        drop(inner);
        self.flush_wanted.notify_one();
        self.durable.send_modify(|_| {});
        self.local_durable.send_modify(|_| {});
    }

    /// Snapshots every partition's producer state at its current end as
    /// `<seq>.snapshot`. Only durable data may be described: callers fsync
    /// first. A failure costs a longer replay at the next open, nothing else.
    /// `whole`: with the aborted transactions, and kept even when empty, as
    /// a replicated log always writes it (another broker may lead from here).
    fn write_snapshot(&self, inner: &Inner, seq: u32, whole: bool) {
        let next_offsets = inner.partitions.iter().map(|s| s.next_offset);
        let (dir, lo) = (&self.options.dir, self.options.lo);
        let written = if self.options.replicated || self.options.commit_recorded_only || whole {
            write_history_state(dir, seq, lo, next_offsets, &inner.producers, &inner.txns)
        } else {
            producer_snapshot_file::write_range_snapshot(
                dir,
                seq,
                lo,
                next_offsets,
                &inner.producers,
                &inner.txns,
                EmptySnapshot::Remove,
            )
        };
        if let Err(e) = written {
            tracing::warn!(dir = %self.options.dir.display(), seq, error = %e, "writing producer snapshot failed");
        }
    }

    /// The producer state of `partition` (a copy).
    pub fn producer_states(&self, partition: u32) -> Result<ProducerStates, LogError> {
        let pi = self.index_of(partition)?;
        Ok(self.inner.lock().producers[pi].clone())
    }

    /// The transaction state of `partition` (a copy).
    pub fn txn_state(&self, partition: u32) -> Result<TxnState, LogError> {
        let pi = self.index_of(partition)?;
        Ok(self.inner.lock().txns[pi].clone())
    }

    /// Closes the log and removes its files.
    pub fn delete(&self) -> Result<(), LogError> {
        let _files = self.files.lock();
        self.inner.lock().state = WriteState::Closed;
        self.flush_wanted.notify_one();
        // Whoever waits for a commit in it learns that none will come.
        self.durable.send_modify(|_| {});
        self.local_durable.send_modify(|_| {});
        match std::fs::remove_dir_all(&self.options.dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        }
    }

    pub fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }
}

pub(crate) fn batch_metadata(e: &IndexEntry) -> BatchMetadata {
    BatchMetadata {
        first_seq: e.base_sequence,
        last_seq: increment_sequence(e.base_sequence, (e.last_offset - e.base_offset) as i32),
        first_offset: e.base_offset,
        last_offset: e.last_offset,
        timestamp: e.max_timestamp,
    }
}

/// Reads `partition`'s batches from one sealed segment on its own (a
/// follower's copy, read for a fetch from a follower): from the batch
/// holding `offset`, up to `max_bytes` (the first batch always).
pub fn read_sealed_segment(
    segment: &Segment,
    partition: u32,
    offset: i64,
    max_bytes: usize,
) -> Result<Bytes, LogError> {
    let Some(entries) = segment.index.partitions.get(&partition) else {
        return Ok(Bytes::new());
    };
    let start = entries.partition_point(|e| e.last_offset < offset);
    let mut plan = Vec::new();
    let mut total = 0usize;
    for e in &entries[start..] {
        if !plan.is_empty() && total + e.length as usize > max_bytes {
            break;
        }
        total += e.length as usize;
        plan.push((segment.file.clone(), *e));
    }
    read_plan(&plan)
}

/// A batch at least this large is read straight into its place in the
/// answer (one copy from the page cache; its frame header is not part of
/// the answer, so batches next to each other cannot share one read
/// without a second copy).
const READ_IN_PLACE_AT_LEAST: u32 = 32 * 1024;

/// Reads the planned batches into one contiguous buffer: large ones each
/// straight into place, runs of small ones next to each other in the same
/// file with one read.
fn read_plan(plan: &[(Arc<File>, IndexEntry)]) -> Result<Bytes, LogError> {
    let total: usize = plan.iter().map(|(_, e)| e.length as usize).sum();
    let mut out = Vec::with_capacity(total);
    let mut i = 0;
    while i < plan.len() {
        let (file, first) = &plan[i];
        if first.length >= READ_IN_PLACE_AT_LEAST {
            Segment::read_into(file, first.position, first.length as usize, &mut out)?;
            i += 1;
            continue;
        }
        // Small batches: extend the run while the next small batch follows
        // this one's frame directly, read the run at once and copy each
        // batch out of it (one read instead of one per batch).
        let mut j = i + 1;
        let mut end = first.position + first.length as u64;
        while j < plan.len()
            && Arc::ptr_eq(&plan[j].0, file)
            && plan[j].1.length < READ_IN_PLACE_AT_LEAST
            && plan[j].1.position == end + segment::FRAME_HEADER_LEN
            && plan[j].1.position - first.position < (8 << 20)
        {
            end = plan[j].1.position + plan[j].1.length as u64;
            j += 1;
        }
        let region = Segment::read_at(file, first.position, (end - first.position) as usize)?;
        for (_, e) in &plan[i..j] {
            let at = (e.position - first.position) as usize;
            out.extend_from_slice(&region[at..at + e.length as usize]);
        }
        i = j;
    }
    Ok(Bytes::from(out))
}

/// Group commit: while appends are outstanding, fsync the active file and
/// publish the position that is now durable. One fsync covers every append
/// that arrived while the previous one ran.
async fn flusher(log: Arc<RangeLog>) {
    loop {
        let (file, position) = {
            let inner = log.inner.lock();
            if inner.state == WriteState::Closed {
                return;
            }
            (
                inner.segments.last().unwrap().file.clone(),
                inner.written_position(),
            )
        };
        // The local fsync is the flusher's job; the commit (what a quorum
        // holds) may stay behind for long when followers are down, and
        // waiting on it here would fsync an unchanged file in a loop.
        let up_to_date = *log.local_durable.borrow() >= position;
        if up_to_date {
            log.flush_wanted.notified().await;
            continue;
        }
        let strong = &log;
        #[cfg(test)]
        log.hooks.flusher_syncs.fetch_add(1, Ordering::Relaxed);
        let synced = tokio::task::spawn_blocking(move || file.sync_data()).await;
        match synced {
            Ok(Ok(())) => {
                let mut inner = strong.inner.lock();
                strong.publish_durable(&mut inner, position);
            }
            Ok(Err(e)) => {
                strong.latch_failure("fsync", &LogError::Io(e));
                return;
            }
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::testing::make_batch;
    use std::sync::Barrier;

    fn options(dir: &Path) -> RangeLogOptions {
        RangeLogOptions {
            segment_bytes: 1 << 30,
            segment_ms: i64::MAX,
            ..RangeLogOptions::new(dir, 0, 2)
        }
    }

    fn open(dir: &Path) -> Arc<RangeLog> {
        RangeLog::open(options(dir), watch::channel(0).0).unwrap()
    }

    /// Every offset of partition 0 readable below the high watermark.
    fn read_offsets(log: &RangeLog) -> Vec<i64> {
        let read = log.read(0, 0, usize::MAX).unwrap();
        let mut out = Vec::new();
        for r in batch::split_batches(&read.records).unwrap() {
            let h = batch::parse_header(&read.records[r]).unwrap();
            out.extend(h.base_offset..=h.last_offset());
        }
        out
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_flusher_does_not_spin_while_the_commit_cannot_move() {
        // A replicated log whose followers are all down: appends are
        // fsynced here once, and the commit never comes.
        let dir = tempfile::tempdir().unwrap();
        let log = RangeLog::open(
            RangeLogOptions {
                replicated: true,
                ..options(dir.path())
            },
            watch::channel(0).0,
        )
        .unwrap();
        let out = log.append(0, &mut make_batch(2, 1), None).unwrap();
        log.wait_local_durable(out.end_position).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let syncs = log.hooks.flusher_syncs.load(Ordering::Relaxed);
        assert!(syncs <= 2, "{syncs} fsyncs of an unchanged segment");
        assert_eq!(log.offsets(0).unwrap().high_watermark, 0, "not committed");
    }

    /// A replicated log whose followers never answer: an append waits for
    /// a commit that the end of the log (`end`: its topic deleted, or
    /// leadership moved away and the log closed) makes impossible; the
    /// wait ends with `Closed` (clients retry at the new leader).
    async fn a_commit_wait_ends_when(end: impl FnOnce(&RangeLog)) {
        let dir = tempfile::tempdir().unwrap();
        let log = RangeLog::open(
            RangeLogOptions {
                replicated: true,
                ..options(&dir.path().join("range"))
            },
            watch::channel(0).0,
        )
        .unwrap();
        let out = log.append(0, &mut make_batch(2, 1), None).unwrap();
        let waiter = tokio::spawn({
            let log = log.clone();
            async move { log.wait_durable(out.end_position).await }
        });
        log.wait_local_durable(out.end_position).await.unwrap();
        end(&log);
        let ended = tokio::time::timeout(std::time::Duration::from_secs(30), waiter).await;
        let result = ended.expect("the wait outlived its log").unwrap();
        assert!(matches!(result, Err(LogError::Closed)), "{result:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_commit_wait_ends_when_its_log_is_deleted() {
        a_commit_wait_ends_when(|log| log.delete().unwrap()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_commit_wait_ends_when_its_log_is_closed() {
        a_commit_wait_ends_when(RangeLog::close).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_replicated_log_never_rolls_into_a_file_that_is_already_there() {
        let dir = tempfile::tempdir().unwrap();
        let log = RangeLog::open(
            RangeLogOptions {
                replicated: true,
                segment_bytes: 1,
                ..options(dir.path())
            },
            watch::channel(0).0,
        )
        .unwrap();
        log.append(0, &mut make_batch(1, 1), None).unwrap();
        // This broker's copy of another incarnation's segment 1.
        let copy = crate::segment::log_path(dir.path(), 1);
        std::fs::write(&copy, b"someone else's segment").unwrap();
        let refused = log.append(0, &mut make_batch(1, 1), None);
        assert!(matches!(refused, Err(LogError::Closed)), "{refused:?}");
        assert_eq!(std::fs::read(&copy).unwrap(), b"someone else's segment");
        assert_eq!(log.segment_count(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn nothing_in_an_unrecorded_roll_is_committed_in_a_replicated_layout() {
        // A replicated topic's range whose active set shrank to its primary:
        // the local fsync commits, but a restart discards segments the
        // metadata never recorded, so records there wait for the record.
        let dir = tempfile::tempdir().unwrap();
        let log = RangeLog::open(
            RangeLogOptions {
                commit_recorded_only: true,
                segment_bytes: 1,
                ..options(dir.path())
            },
            watch::channel(0).0,
        )
        .unwrap();
        let first = log.append(0, &mut make_batch(1, 1), None).unwrap();
        log.wait_durable(first.end_position).await.unwrap();
        // The next append rolls to segment 1 first (segment 0 is full).
        let second = log.append(0, &mut make_batch(1, 1), None).unwrap();
        assert!(second.rolled.is_some(), "{second:?}");
        log.wait_local_durable(second.end_position).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert_eq!(log.offsets(0).unwrap().high_watermark, 1, "held back");
        log.set_recorded_active(1);
        log.wait_durable(second.end_position).await.unwrap();
        assert_eq!(log.offsets(0).unwrap().high_watermark, 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_segment_file_tells_the_leader_epoch_that_wrote_it() {
        use crate::segment::first_batch_leader_epoch;
        let dir = tempfile::tempdir().unwrap();
        let log = RangeLog::open(
            RangeLogOptions {
                leader_epoch: 7,
                ..options(dir.path())
            },
            watch::channel(0).0,
        )
        .unwrap();
        assert_eq!(
            first_batch_leader_epoch(dir.path(), 0).unwrap(),
            None,
            "empty"
        );
        log.append(0, &mut make_batch(2, 1), None).unwrap();
        assert_eq!(first_batch_leader_epoch(dir.path(), 0).unwrap(), Some(7));
        assert_eq!(
            first_batch_leader_epoch(dir.path(), 1).unwrap(),
            None,
            "no file"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reopened_replicated_log_keeps_the_empty_producer_snapshots_of_its_segments() {
        // No idempotent producer writes here (a group coordinator's
        // offsets, a plain producer): every snapshot has no section, and
        // its file is what tells a replica that joins at that segment
        // "no producer state there". A reopen (restart, leadership back)
        // must not delete them: a broker whose history starts at one of
        // these segments could never lead the range again.
        let dir = tempfile::tempdir().unwrap();
        let replicated = |dir: &Path| RangeLogOptions {
            replicated: true,
            segment_bytes: 1,
            ..options(dir)
        };
        let log = RangeLog::open(replicated(dir.path()), watch::channel(0).0).unwrap();
        for _ in 0..3 {
            log.append(0, &mut make_batch(1, 1), None).unwrap();
        }
        let segments: Vec<u32> = (0..log.segment_count() as u32).collect();
        assert!(segments.len() >= 3, "{segments:?}");
        let snapshots = |dir: &Path| -> Vec<u32> {
            segments
                .iter()
                .copied()
                .filter(|&seq| producer_snapshot_file::snapshot_path(dir, seq).exists())
                .collect()
        };
        assert_eq!(
            snapshots(dir.path()),
            segments,
            "written at open and at each roll"
        );
        log.close();
        drop(log);
        let log = RangeLog::open(replicated(dir.path()), watch::channel(0).0).unwrap();
        assert_eq!(snapshots(dir.path()), segments, "kept by the reload");
        drop(log);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_replicated_log_rolls_at_most_a_few_segments_ahead_of_the_image() {
        let dir = tempfile::tempdir().unwrap();
        let log = RangeLog::open(
            RangeLogOptions {
                replicated: true,
                segment_bytes: 1,
                ..options(dir.path())
            },
            watch::channel(0).0,
        )
        .unwrap();
        for _ in 0..20 {
            log.append(0, &mut make_batch(1, 1), None).unwrap();
        }
        assert_eq!(log.segment_count() as u32, MAX_UNRECORDED_ROLLS + 1);
        log.set_recorded_active(3);
        for _ in 0..20 {
            log.append(0, &mut make_batch(1, 1), None).unwrap();
        }
        assert_eq!(log.segment_count() as u32, MAX_UNRECORDED_ROLLS + 4);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_just_opened_replicated_log_refuses_a_sequence_gap_as_not_leader() {
        use crate::batch::testing::make_idempotent_batch;
        let dir = tempfile::tempdir().unwrap();
        let replicated = RangeLog::open(
            RangeLogOptions {
                replicated: true,
                ..options(dir.path())
            },
            watch::channel(0).0,
        )
        .unwrap();
        replicated
            .append(0, &mut make_idempotent_batch(2, 1, 7, 0, 0), None)
            .unwrap();
        // Sequence 5 after 0..=1: the tail of a pipeline whose middle the
        // old log refused. Retriable, nothing stored.
        let gap = replicated.append(0, &mut make_idempotent_batch(1, 1, 7, 0, 5), None);
        assert!(matches!(gap, Err(LogError::Closed)), "{gap:?}");
        assert_eq!(replicated.offsets(0).unwrap().log_end, 2);
        // In order, it is taken.
        let next = replicated
            .append(0, &mut make_idempotent_batch(1, 1, 7, 0, 2), None)
            .unwrap();
        assert_eq!(next.base_offset, 2);
        // A log without followers has no such predecessor: the gap is
        // Kafka's OUT_OF_ORDER_SEQUENCE_NUMBER at once.
        let dir = tempfile::tempdir().unwrap();
        let single = open(dir.path());
        single
            .append(0, &mut make_idempotent_batch(2, 1, 7, 0, 0), None)
            .unwrap();
        let gap = single.append(0, &mut make_idempotent_batch(1, 1, 7, 0, 5), None);
        assert!(
            matches!(
                gap,
                Err(LogError::Sequence(SequenceError::OutOfOrderSequence { .. }))
            ),
            "{gap:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn changed_roll_limits_apply_to_the_next_append() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(dir.path());
        for _ in 0..3 {
            log.append(0, &mut make_batch(2, 1), None).unwrap();
        }
        assert_eq!(log.segment_count(), 1);
        log.set_roll_limits(14, i64::MAX);
        log.append(0, &mut make_batch(2, 1), None).unwrap();
        assert_eq!(log.segment_count(), 2);
        log.append(0, &mut make_batch(2, 1), None).unwrap();
        assert_eq!(log.segment_count(), 3);
        log.set_roll_limits(1 << 30, i64::MAX);
        let last = log.append(0, &mut make_batch(2, 1), None).unwrap();
        assert_eq!(log.segment_count(), 3);
        log.wait_durable(last.end_position).await.unwrap();
        assert_eq!(read_offsets(&log), (0..12).collect::<Vec<_>>());
    }

    fn at(mut batch: Vec<u8>, base_offset: i64) -> Vec<u8> {
        batch::set_base_offset(&mut batch, base_offset);
        batch
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn source_offset_appends_keep_offsets_gaps_and_bytes() {
        use crate::batch::testing::{make_control_batch, make_transactional_batch};
        let dir = tempfile::tempdir().unwrap();
        let log = open(dir.path());
        let first = at(make_batch(2, 1), 3);
        let mut stored = first.clone();
        log.append_at_source_offset(0, &mut stored).unwrap();
        // A transaction at 10..12 aborted by the marker at 12; a gap at 5..10.
        log.append_at_source_offset(0, &mut at(make_transactional_batch(2, 1, 7, 0, 0), 10))
            .unwrap();
        log.append_at_source_offset(0, &mut at(make_control_batch(7, 0, false), 12))
            .unwrap();
        // Below the log end: refused, nothing written.
        let err = log
            .append_at_source_offset(0, &mut at(make_batch(1, 1), 12))
            .unwrap_err();
        assert!(matches!(
            err,
            LogError::OffsetBelowLogEnd {
                offset: 12,
                log_end: 13
            }
        ));
        let last = log
            .append_at_source_offset(0, &mut at(make_batch(1, 1), 20))
            .unwrap();
        log.wait_durable(last.end_position).await.unwrap();
        assert_eq!(read_offsets(&log), vec![3, 4, 10, 11, 12, 20]);
        // Reads from inside a gap start at the next batch.
        assert_eq!(read_from(&log, 6).unwrap(), vec![10, 11, 12, 20]);
        let read = log.read(0, 0, usize::MAX).unwrap();
        assert_eq!(read.offsets.log_end, 21);
        // Stored byte for byte apart from the leader epoch (outside the CRC).
        let mut expected = first.clone();
        batch::set_partition_leader_epoch(&mut expected, 0);
        assert_eq!(&read.records[..first.len()], &expected[..]);
        let aborted = log.aborted_transactions(0, 0, 21).unwrap();
        assert_eq!(aborted.len(), 1);
        assert_eq!((aborted[0].first_offset, aborted[0].last_offset), (10, 12));
        // Normal produce continues after the copied offsets; a reopen keeps them.
        assert_eq!(
            log.append(0, &mut make_batch(1, 1), None)
                .unwrap()
                .base_offset,
            21
        );
        log.close();
        drop(log);
        let log = open(dir.path());
        assert_eq!(log.offsets(0).unwrap().log_end, 22);
        assert_eq!(read_offsets(&log), vec![3, 4, 10, 11, 12, 20, 21]);
    }

    /// A read gives back a partition's batches byte for byte whatever
    /// their sizes: large ones read in place, runs of small ones read
    /// together, with the other partition's batches between them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_of_large_and_small_batches_are_the_stored_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(dir.path());
        let mut stored = Vec::new();
        let mut end = 0;
        // 5,000 records of make_batch are about 40 KiB, over the in-place size.
        for (i, count) in [1, 6_000, 2, 3, 5_000, 7_000, 1, 4, 9_000]
            .into_iter()
            .enumerate()
        {
            let mut mine = make_batch(count, 1);
            end = log.append(0, &mut mine, None).unwrap().end_position;
            stored.extend_from_slice(&mine);
            if i % 3 != 2 {
                let mut other = make_batch(if i % 2 == 0 { 3 } else { 6_000 }, 1);
                end = log.append(1, &mut other, None).unwrap().end_position;
            }
        }
        log.wait_durable(end).await.unwrap();
        let read = log.read(0, 0, usize::MAX).unwrap();
        assert_eq!(read.records.len(), stored.len());
        assert!(
            read.records[..] == stored[..],
            "partition 0 read back differs"
        );
        // From a later batch on, the same bytes from that batch.
        let ranges = batch::split_batches(&stored).unwrap();
        let from = batch::parse_header(&stored[ranges[4].clone()])
            .unwrap()
            .base_offset;
        let read = log.read(0, from, usize::MAX).unwrap();
        assert!(
            read.records[..] == stored[ranges[4].start..],
            "read from {from} differs"
        );
    }

    /// Offsets of partition 0 readable from `from`.
    fn read_from(log: &RangeLog, from: i64) -> Result<Vec<i64>, LogError> {
        let read = log.read(0, from, usize::MAX)?;
        let mut out = Vec::new();
        for r in batch::split_batches(&read.records).unwrap() {
            let h = batch::parse_header(&read.records[r]).unwrap();
            out.extend(h.base_offset..=h.last_offset());
        }
        Ok(out)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn retention_deletes_the_oldest_sealed_segments_and_a_reopen_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(dir.path());
        log.set_roll_limits(14, i64::MAX);
        // Every append rolls the previous one's segment: segments 0..=4,
        // partition 0 at offsets 2*seq..2*seq+2, 4 the active one.
        for _ in 0..5 {
            let out = log.append(0, &mut make_batch(2, 1), None).unwrap();
            log.wait_durable(out.end_position).await.unwrap();
        }
        assert_eq!(log.segment_count(), 5);
        let (sealed, active) = log.retention_view();
        assert_eq!(sealed.iter().map(|s| s.0).collect::<Vec<_>>(), [0, 1, 2, 3]);
        assert!(sealed.iter().all(|s| s.2 == 1) && active > 0);
        // (No idempotent producer wrote here: stand-in snapshot files.)
        for seq in [1, 2] {
            std::fs::write(producer_snapshot_file::snapshot_path(dir.path(), seq), b"x").unwrap();
        }

        assert_eq!(log.delete_segments_below(2).unwrap(), [0, 1]);
        assert_eq!(log.segment_count(), 3);
        for seq in [0, 1] {
            assert!(!segment::log_path(dir.path(), seq).exists());
            assert!(!segment::index_path(dir.path(), seq).exists());
            assert!(!producer_snapshot_file::snapshot_path(dir.path(), seq).exists());
        }
        // The snapshot where the oldest kept segment starts stays.
        assert!(producer_snapshot_file::snapshot_path(dir.path(), 2).exists());
        assert!(segment::log_path(dir.path(), 2).exists());
        assert_eq!(log.offsets(0).unwrap().log_start, 4);
        assert!(matches!(
            read_from(&log, 0),
            Err(LogError::OffsetOutOfRange { log_start: 4, .. })
        ));
        assert!(read_from(&log, 3).is_err());
        assert_eq!(read_from(&log, 4).unwrap(), (4..10).collect::<Vec<_>>());
        // Never the active segment, whatever the bound.
        assert_eq!(log.delete_segments_below(100).unwrap(), [2, 3]);
        assert_eq!(log.segment_count(), 1);
        assert_eq!(log.offsets(0).unwrap().log_start, 8);
        // Positions stay consistent: appends still become durable.
        log.set_roll_limits(1 << 30, i64::MAX);
        let out = log.append(0, &mut make_batch(2, 1), None).unwrap();
        log.wait_durable(out.end_position).await.unwrap();
        assert_eq!(read_from(&log, 8).unwrap(), (8..12).collect::<Vec<_>>());
        log.close();

        // A reopen with the log start the metadata recorded.
        let log = RangeLog::open(
            RangeLogOptions {
                log_start_offsets: vec![8, 0],
                ..options(dir.path())
            },
            watch::channel(0).0,
        )
        .unwrap();
        assert_eq!(log.segment_count(), 1);
        assert!(read_from(&log, 2).is_err());
        assert_eq!(read_from(&log, 8).unwrap(), (8..12).collect::<Vec<_>>());
        let out = log.append(0, &mut make_batch(1, 1), None).unwrap();
        assert_eq!(out.base_offset, 12);
        log.close();
    }

    /// The interleaving that used to lose records: an append gets past its
    /// checks, a seal runs to completion, then the append continues. It
    /// must be refused, not written into the sealed segment.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_append_that_loses_the_race_to_a_seal_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(dir.path());
        let first = log.append(0, &mut make_batch(2, 1), None).unwrap();
        log.wait_durable(first.end_position).await.unwrap();

        let barrier = Arc::new(Barrier::new(2));
        let hook_barrier = barrier.clone();
        *log.hooks.before_append_lock.lock() = Some(Arc::new(move || {
            hook_barrier.wait(); // reached the lock
            hook_barrier.wait(); // the seal is done
        }));
        let racer = {
            let log = log.clone();
            std::thread::spawn(move || log.append(0, &mut make_batch(3, 2), None))
        };
        barrier.wait();
        let sealed = log.seal().unwrap();
        barrier.wait();
        let raced = racer.join().unwrap();
        *log.hooks.before_append_lock.lock() = None;

        assert!(matches!(raced, Err(LogError::Closed)), "{raced:?}");
        assert_eq!(sealed.spans, vec![(0, 0, 2)]);
        let offsets = log.offsets(0).unwrap();
        assert_eq!((offsets.log_end, offsets.high_watermark), (2, 2));
        assert_eq!(read_offsets(&log), vec![0, 1]);
        // And after the seal nothing gets in by any path.
        assert!(matches!(
            log.append(0, &mut make_batch(1, 3), None),
            Err(LogError::Closed)
        ));
        log.close();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn appends_racing_seals_never_strand_a_record() {
        // Many appenders against a seal: every append that succeeded is
        // durable, readable and inside the sealed spans; every other one
        // was refused. Offsets are dense.
        for round in 0..20 {
            let dir = tempfile::tempdir().unwrap();
            let log = open(dir.path());
            let appenders: Vec<_> = (0..4)
                .map(|t| {
                    let log = log.clone();
                    std::thread::spawn(move || {
                        let mut ok = Vec::new();
                        for i in 0..200 {
                            match log.append(0, &mut make_batch(1, t * 1000 + i), None) {
                                Ok(out) => ok.push(out),
                                Err(LogError::Closed) => break,
                                Err(e) => panic!("unexpected {e}"),
                            }
                        }
                        ok
                    })
                })
                .collect();
            std::thread::sleep(std::time::Duration::from_micros(50 * round));
            let sealed = log.seal().unwrap();
            let mut acked: Vec<i64> = Vec::new();
            for a in appenders {
                for out in a.join().unwrap() {
                    log.wait_durable(out.end_position).await.unwrap();
                    acked.push(out.base_offset);
                }
            }
            acked.sort_unstable();
            let end = acked.len() as i64;
            assert_eq!(acked, (0..end).collect::<Vec<_>>());
            let expected_spans = if end == 0 { vec![] } else { vec![(0, 0, end)] };
            assert_eq!(sealed.spans, expected_spans);
            assert_eq!(log.offsets(0).unwrap().high_watermark, end);
            assert_eq!(read_offsets(&log), (0..end).collect::<Vec<_>>());
            log.close();
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reopen_undoes_a_seal_in_a_new_segment() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(dir.path());
        log.append(0, &mut make_batch(3, 1), None).unwrap();
        let sealed = log.seal().unwrap();
        assert!(log.is_sealed());
        let recorded = log.reopen().unwrap();
        assert_eq!(recorded, sealed);
        assert!(!log.is_sealed());
        assert!(matches!(log.reopen(), Err(LogError::Closed)));
        let out = log.append(0, &mut make_batch(2, 2), None).unwrap();
        assert_eq!(out.base_offset, 3);
        log.wait_durable(out.end_position).await.unwrap();
        assert_eq!(log.segment_count(), 2);
        assert_eq!(read_offsets(&log), vec![0, 1, 2, 3, 4]);
        log.close();
        // Restart: both segments recovered, offsets continue.
        let log = open(dir.path());
        assert_eq!(read_offsets(&log), vec![0, 1, 2, 3, 4]);
        assert_eq!(
            log.append(0, &mut make_batch(1, 3), None)
                .unwrap()
                .base_offset,
            5
        );
        log.close();
    }

    #[test]
    fn a_sealed_segment_refuses_appends() {
        let dir = tempfile::tempdir().unwrap();
        let mut segment = Segment::create(dir.path(), 0, 0).unwrap();
        let b = make_batch(1, 1);
        let h = batch::parse_header(&b).unwrap();
        let entry = IndexEntry::for_batch(&h, 0, 1, b.len(), 0);
        segment.append(0, &b, entry).unwrap();
        segment.sealed = true;
        let size = segment.size;
        assert!(matches!(
            segment.append(0, &b, entry),
            Err(LogError::SegmentSealed)
        ));
        assert_eq!(segment.size, size);
        assert_eq!(segment.file.metadata().unwrap().len(), size);
    }
}
