//! Log compaction decisions, as Kafka's `LogCleaner` makes them: pure
//! functions from stored batches (and the pass's inputs) to the batches a
//! cleaned segment holds. No I/O here; `RangeLog::clean` reads and writes
//! the files.
//!
//! A pass over a range's cleanable sealed segments:
//! 1. [`OffsetMap::build`]: per partition, the offset of the last record of
//!    every key (records of aborted transactions and control batches left
//!    out), read in offset order over every batch being cleaned.
//! 2. [`Pass::clean_batch`] on each batch, in the same order: a record stays
//!    if it is the last of its key, and a tombstone (null value) only until
//!    its batch's delete horizon (KIP-534: a batch holding tombstones or a
//!    marker of an emptied transaction is stamped with `now +
//!    delete.retention.ms` the first time it is cleaned; a later pass past
//!    that time drops them). Aborted transactional data goes; a transaction
//!    marker stays until no data of its transaction is left, then until its
//!    horizon. A batch whose records all go is dropped, except the last batch
//!    of an active producer, kept empty (its sequence and epoch are producer
//!    state). A batch that keeps every record and needs no horizon stays byte
//!    for byte; otherwise it is re-encoded with its base offset, last offset
//!    delta, producer id/epoch, base sequence and leader epoch kept and a new
//!    CRC-32C.
//!
//! Every decision depends only on the batches and [`CleanParams`] (the
//! aborted transactions and producers' last batches come from the batches
//! too: [`TxnInputs`]), so two replicas holding the same bytes and given
//! the same parameters produce the same cleaned bytes.

use std::collections::{HashMap, HashSet};

use bytes::Bytes;

use crate::batch::{self, BatchHeader};
use crate::error::BatchError;
use crate::segment::IndexEntry;
use crate::txn_state::AbortedTxn;

pub use crate::records::{decode_records, encode_batch, Record, DELETE_HORIZON_BIT};

/// The inputs of one cleaning pass besides the batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CleanParams {
    /// The pass's clock: tombstones and markers whose horizon is at or
    /// before it go; new horizons are `now_ms + delete_retention_ms`.
    pub now_ms: i64,
    /// `delete.retention.ms`.
    pub delete_retention_ms: i64,
}

/// The batch's delete horizon, if a previous pass stamped one.
pub fn delete_horizon(header: &BatchHeader) -> Option<i64> {
    (header.attributes & DELETE_HORIZON_BIT != 0).then_some(header.base_timestamp)
}

/// Kafka's `CleanedTransactionMetadata`: which transactional batches of a
/// partition belong to aborted transactions, and whether a marker's
/// transaction still has batches in the pass. Fed in offset order.
#[derive(Default, Debug, Clone)]
struct TxnTracker {
    /// Aborted transactions not reached yet, by first offset (reversed: pop from the end).
    pending_aborted: Vec<AbortedTxn>,
    /// Producer -> an aborted transaction in progress, and whether one of its batches was seen.
    ongoing_aborted: HashMap<i64, bool>,
    ongoing_committed: HashSet<i64>,
}

impl TxnTracker {
    fn new(mut aborted: Vec<AbortedTxn>) -> TxnTracker {
        aborted.sort_by_key(|a| std::cmp::Reverse(a.first_offset));
        TxnTracker {
            pending_aborted: aborted,
            ..TxnTracker::default()
        }
    }

    fn consume_aborted_up_to(&mut self, offset: i64) {
        while self
            .pending_aborted
            .last()
            .is_some_and(|a| a.first_offset <= offset)
        {
            let a = self.pending_aborted.pop().unwrap();
            self.ongoing_aborted.insert(a.producer_id, false);
        }
    }

    /// A data batch: true when it belongs to an aborted transaction.
    fn on_batch(&mut self, h: &BatchHeader) -> bool {
        self.consume_aborted_up_to(h.last_offset());
        if !h.is_transactional() {
            return false;
        }
        match self.ongoing_aborted.get_mut(&h.producer_id) {
            Some(seen) => {
                *seen = true;
                true
            }
            None => {
                self.ongoing_committed.insert(h.producer_id);
                false
            }
        }
    }

    /// A control batch: true when no batch of its transaction is left in
    /// the pass (the marker may go once past its horizon).
    fn on_control(&mut self, h: &BatchHeader, commit: bool) -> bool {
        self.consume_aborted_up_to(h.last_offset());
        if commit {
            !self.ongoing_committed.remove(&h.producer_id)
        } else {
            !matches!(self.ongoing_aborted.remove(&h.producer_id), Some(true))
        }
    }
}

/// Per partition, the offset of the last record of each key among the
/// batches of a pass.
#[derive(Default, Debug, Clone)]
pub struct OffsetMap {
    latest: HashMap<u32, HashMap<Bytes, i64>>,
}

impl OffsetMap {
    /// Reads `batches` (`(partition, batch bytes)`, each partition's in
    /// offset order) with each partition's aborted transactions.
    pub fn build<'a>(
        batches: impl IntoIterator<Item = (u32, &'a [u8])>,
        aborted: &HashMap<u32, Vec<AbortedTxn>>,
    ) -> Result<OffsetMap, BatchError> {
        let mut builder = OffsetMapBuilder::new(aborted);
        for (p, bytes) in batches {
            builder.add(p, bytes)?;
        }
        Ok(builder.finish())
    }

    /// The offset of the last record of `key` in `partition`.
    pub fn get(&self, partition: u32, key: &[u8]) -> Option<i64> {
        self.latest.get(&partition)?.get(key).copied()
    }

    /// Number of distinct keys over all partitions.
    pub fn len(&self) -> usize {
        self.latest.values().map(HashMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Builds an [`OffsetMap`] one batch at a time (so a pass never holds the
/// segments in memory).
pub struct OffsetMapBuilder<'a> {
    map: OffsetMap,
    txns: HashMap<u32, TxnTracker>,
    aborted: &'a HashMap<u32, Vec<AbortedTxn>>,
}

impl<'a> OffsetMapBuilder<'a> {
    pub fn new(aborted: &'a HashMap<u32, Vec<AbortedTxn>>) -> OffsetMapBuilder<'a> {
        OffsetMapBuilder {
            map: OffsetMap::default(),
            txns: HashMap::new(),
            aborted,
        }
    }

    /// The next batch of `partition` (in offset order).
    pub fn add(&mut self, p: u32, bytes: &[u8]) -> Result<(), BatchError> {
        let h = batch::parse_header(bytes)?;
        let aborted = self.aborted;
        let tracker = self
            .txns
            .entry(p)
            .or_insert_with(|| TxnTracker::new(aborted.get(&p).cloned().unwrap_or_default()));
        if h.is_control() {
            tracker.on_control(&h, batch::control_marker_is_commit(bytes) == Some(true));
            return Ok(());
        }
        if tracker.on_batch(&h) {
            return Ok(());
        }
        let keys = self.map.latest.entry(p).or_default();
        for r in decode_records(bytes)? {
            if let Some(k) = r.key {
                keys.insert(k, r.offset);
            }
        }
        Ok(())
    }

    pub fn finish(self) -> OffsetMap {
        self.map
    }
}

/// What becomes of one stored batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cleaned {
    /// Written as it was.
    Keep,
    /// Removed.
    Drop,
    /// Replaced by these bytes (some records removed, or a horizon stamped).
    Rewrite(Vec<u8>),
}

/// The second half of a pass: the decision for each batch, in offset order.
pub struct Pass<'m> {
    map: &'m OffsetMap,
    params: CleanParams,
    /// `(partition, producer id)` -> last offset of the producer's last
    /// batch in the partition (its producer state): that batch is kept,
    /// empty if need be.
    last_batches: &'m HashMap<(u32, i64), i64>,
    txns: HashMap<u32, TxnTracker>,
    aborted: &'m HashMap<u32, Vec<AbortedTxn>>,
}

impl<'m> Pass<'m> {
    pub fn new(
        map: &'m OffsetMap,
        params: CleanParams,
        last_batches: &'m HashMap<(u32, i64), i64>,
        aborted: &'m HashMap<u32, Vec<AbortedTxn>>,
    ) -> Pass<'m> {
        Pass {
            map,
            params,
            last_batches,
            txns: HashMap::new(),
            aborted,
        }
    }

    /// Decides one batch (Kafka's `LogCleaner` filter and `MemoryRecords.filterTo`).
    pub fn clean_batch(&mut self, partition: u32, bytes: &[u8]) -> Result<Cleaned, BatchError> {
        let h = batch::parse_header(bytes)?;
        let aborted = self.aborted;
        let tracker = self.txns.entry(partition).or_insert_with(|| {
            TxnTracker::new(aborted.get(&partition).cloned().unwrap_or_default())
        });
        let horizon = delete_horizon(&h);
        let past_horizon = horizon.is_some_and(|t| t <= self.params.now_ms);
        let new_horizon = self
            .params
            .now_ms
            .saturating_add(self.params.delete_retention_ms);
        let last_of_producer = h.producer_id >= 0
            && self.last_batches.get(&(partition, h.producer_id)) == Some(&h.last_offset());
        if h.is_control() {
            let commit = batch::control_marker_is_commit(bytes) == Some(true);
            let txn_empty = tracker.on_control(&h, commit);
            if txn_empty && past_horizon && !last_of_producer {
                return Ok(Cleaned::Drop);
            }
            if txn_empty && horizon.is_none() {
                // The marker of an emptied transaction: stamp its horizon.
                let records = decode_records(bytes)?;
                return Ok(Cleaned::Rewrite(encode_batch(
                    &h,
                    &records,
                    Some(new_horizon),
                )?));
            }
            return Ok(Cleaned::Keep);
        }
        let aborted_batch = tracker.on_batch(&h);
        let records = decode_records(bytes)?;
        let total = records.len();
        let kept: Vec<Record> = if aborted_batch {
            Vec::new()
        } else {
            records
                .into_iter()
                .filter(|r| {
                    let Some(key) = &r.key else { return false };
                    let latest = self
                        .map
                        .get(partition, key)
                        .is_none_or(|found| r.offset >= found);
                    latest && (r.value.is_some() || !past_horizon)
                })
                .collect()
        };
        if kept.is_empty() {
            if last_of_producer {
                if total == 0 && h.record_count == 0 {
                    return Ok(Cleaned::Keep);
                }
                return Ok(Cleaned::Rewrite(encode_batch(&h, &[], None)?));
            }
            return Ok(Cleaned::Drop);
        }
        let has_tombstones = kept.iter().any(|r| r.value.is_none());
        let stamp = has_tombstones && horizon.is_none();
        if kept.len() == total && !stamp {
            return Ok(Cleaned::Keep);
        }
        Ok(Cleaned::Rewrite(encode_batch(
            &h,
            &kept,
            stamp.then_some(new_horizon),
        )?))
    }
}

/// The transaction and producer inputs of a pass, read from the index
/// entries of the segments being cleaned, in file order (never from a
/// log's in-memory state, which differs between a primary and its
/// followers): every replica of the same bytes derives the same.
#[derive(Default, Debug, Clone, PartialEq, Eq)]
pub struct TxnInputs {
    /// Per partition, the transactions whose ABORT marker is in the pass.
    pub aborted: HashMap<u32, Vec<AbortedTxn>>,
    /// `(partition, producer id)` -> last offset of the producer's last
    /// data batch in the pass (kept, empty if need be, as Kafka keeps an
    /// active producer's last batch).
    pub last_batches: HashMap<(u32, i64), i64>,
    /// `(partition, producer id)` -> first offset of a transaction with
    /// no marker yet.
    open: HashMap<(u32, i64), i64>,
}

impl TxnInputs {
    /// The next batch of `partition` (each partition's in offset order).
    pub fn add(&mut self, partition: u32, e: &IndexEntry) {
        use crate::txn_state::{FLAG_COMMIT, FLAG_CONTROL, FLAG_TRANSACTIONAL};
        if e.producer_id < 0 {
            return;
        }
        let key = (partition, e.producer_id);
        if e.flags & FLAG_CONTROL != 0 {
            if let Some(first_offset) = self.open.remove(&key) {
                if e.flags & FLAG_COMMIT == 0 {
                    self.aborted.entry(partition).or_default().push(AbortedTxn {
                        producer_id: e.producer_id,
                        first_offset,
                        last_offset: e.last_offset,
                    });
                }
            }
            return;
        }
        self.last_batches.insert(key, e.last_offset);
        if e.flags & FLAG_TRANSACTIONAL != 0 {
            self.open.entry(key).or_insert(e.base_offset);
        }
    }

    /// A transaction begun in the batches so far has no marker yet: a
    /// pass must not end here (its data would be judged without its outcome).
    pub fn has_open_transaction(&self) -> bool {
        !self.open.is_empty()
    }
}

/// What the planner of a pass knows about one sealed segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentStat {
    pub seq: u32,
    pub size: u64,
    /// Largest timestamp of its batches (-1 when it holds none).
    pub max_timestamp: i64,
    /// The timestamp of its first batch (the earliest of each partition's
    /// first batch; -1 when it holds none): Kafka's
    /// `getFirstBatchTimestamp`, which `max.compaction.lag.ms` measures.
    pub first_batch_timestamp: i64,
    /// Every batch in it is below its partition's last stable offset (no
    /// open transaction reaches into it), and no transaction of the
    /// segments up to it is still open at its end (a pass ending here
    /// would not see the transaction's outcome: [`TxnInputs`]).
    pub stable: bool,
}

/// The topic's cleaning configs, and the clock.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CleanPolicy {
    pub now_ms: i64,
    /// `min.compaction.lag.ms`: a segment with a record younger than this is not cleaned yet.
    pub min_compaction_lag_ms: i64,
    /// `min.cleanable.dirty.ratio`.
    pub min_cleanable_dirty_ratio: f64,
    /// `max.compaction.lag.ms`: a dirty segment whose first batch is older
    /// than this is cleaned whatever the dirty ratio (KIP-354).
    pub max_compaction_lag_ms: i64,
}

/// Which sealed segments a pass cleans (Kafka's `LogCleanerManager`
/// choice, per range): the oldest-first run of sealed segments that are
/// stable and older than `min.compaction.lag.ms`; cleaned only when the
/// bytes at or above `first_dirty_seq` (not cleaned since they were
/// written) are at least `min.cleanable.dirty.ratio` of that run's bytes,
/// or when a dirty one's first batch is older than `max.compaction.lag.ms`
/// (Kafka's `needCompactionNow`). Returns the sequence of the last segment
/// to clean.
pub fn plan_pass(
    segments: &[SegmentStat],
    first_dirty_seq: u32,
    policy: &CleanPolicy,
) -> Option<u32> {
    let horizon = policy
        .now_ms
        .saturating_sub(policy.min_compaction_lag_ms.max(0));
    let cleanable: Vec<&SegmentStat> = segments
        .iter()
        .take_while(|s| s.stable && s.max_timestamp <= horizon)
        .collect();
    let last = cleanable.last()?;
    let total: u64 = cleanable.iter().map(|s| s.size).sum();
    let dirty: u64 = cleanable
        .iter()
        .filter(|s| s.seq >= first_dirty_seq)
        .map(|s| s.size)
        .sum();
    if dirty == 0 || total == 0 {
        return None;
    }
    let ratio = dirty as f64 / total as f64;
    let overdue_before = policy
        .now_ms
        .saturating_sub(policy.max_compaction_lag_ms.max(0));
    let overdue = cleanable.iter().any(|s| {
        s.seq >= first_dirty_seq
            && s.first_batch_timestamp > 0
            && s.first_batch_timestamp < overdue_before
    });
    (ratio >= policy.min_cleanable_dirty_ratio || overdue).then_some(last.seq)
}

/// How long to wait after `bytes` were read or written in `elapsed` to stay
/// under `rate` bytes per second (`log.cleaner.io.max.bytes.per.second`).
pub fn throttle_delay(bytes: u64, elapsed: std::time::Duration, rate: f64) -> std::time::Duration {
    if !(rate.is_finite() && rate > 0.0) {
        return std::time::Duration::ZERO;
    }
    let due = bytes as f64 / rate;
    let left = due - elapsed.as_secs_f64();
    if left > 0.0 {
        std::time::Duration::from_secs_f64(left.min(3600.0))
    } else {
        std::time::Duration::ZERO
    }
}

#[cfg(test)]
mod tests;

/// Builders for tests in this and other crates.
#[doc(hidden)]
pub mod testing {
    /// An uncompressed batch of `(key, value)` records (value `None`: a
    /// tombstone) at base offset 0 with `timestamp`, no producer id.
    pub fn keyed_batch(records: &[(&[u8], Option<&[u8]>)], timestamp: i64) -> Vec<u8> {
        let records: Vec<crate::records::KeyValue<'_>> =
            records.iter().map(|(k, v)| (Some(*k), *v)).collect();
        crate::records::build_batch(-1, -1, -1, 0, timestamp, &records)
    }
}
