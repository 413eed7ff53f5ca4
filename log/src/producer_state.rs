//! Idempotent producer state of one partition, with Kafka's rules
//! (ProducerStateManager / ProducerAppendInfo): per producer id its epoch and
//! its last five batches' sequence ranges and offsets. Pure logic: the range
//! log calls `check` before an append and `record` after it (and on replay).

use std::collections::{HashMap, VecDeque};

/// Kafka keeps this many batches per producer for duplicate detection.
pub const MAX_BATCHES_PER_PRODUCER: usize = 5;
/// `producerId` of a batch without idempotence.
pub const NO_PRODUCER_ID: i64 = -1;

/// One appended batch of a producer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchMetadata {
    pub first_seq: i32,
    pub last_seq: i32,
    pub first_offset: i64,
    pub last_offset: i64,
    pub timestamp: i64,
}

/// What Kafka keeps per producer id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProducerEntry {
    pub epoch: i16,
    pub batches: VecDeque<BatchMetadata>,
}

/// Why a batch is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SequenceError {
    #[error("producer epoch {got} is older than the current epoch {current}")]
    InvalidProducerEpoch { got: i16, current: i16 },
    #[error("out of order sequence number: expected {expected}, got {got}")]
    OutOfOrderSequence { expected: i32, got: i32 },
}

/// The outcome of checking a batch against the producer state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Append,
    /// A retry of a batch already in the log: answer with its offsets, append nothing.
    Duplicate(BatchMetadata),
}

/// Kafka's `DefaultRecordBatch.incrementSequence`: sequences wrap at i32::MAX to 0.
pub fn increment_sequence(sequence: i32, increment: i32) -> i32 {
    if sequence > i32::MAX - increment {
        increment - (i32::MAX - sequence) - 1
    } else {
        sequence + increment
    }
}

fn in_sequence(last_seq: i32, next_seq: i32) -> bool {
    next_seq == last_seq.wrapping_add(1) || (next_seq == 0 && last_seq == i32::MAX)
}

/// All producers of one partition. Most partitions of a wide range never
/// see an idempotent producer, so the map is allocated on first use: an
/// empty state is one pointer wide.
#[derive(Clone, Debug, Default)]
pub struct ProducerStates {
    // Boxed so that the empty state is one pointer, not a whole HashMap.
    #[allow(clippy::box_collection)]
    producers: Option<Box<HashMap<i64, ProducerEntry>>>,
}

impl PartialEq for ProducerStates {
    fn eq(&self, other: &Self) -> bool {
        // An allocated but empty map equals no map.
        self.len() == other.len() && self.iter().all(|(id, e)| other.get(id) == Some(e))
    }
}

impl Eq for ProducerStates {}

impl ProducerStates {
    pub fn get(&self, producer_id: i64) -> Option<&ProducerEntry> {
        self.producers.as_ref()?.get(&producer_id)
    }

    pub fn len(&self) -> usize {
        self.producers.as_ref().map_or(0, |m| m.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every producer id with its state (DescribeProducers).
    pub fn iter(&self) -> impl Iterator<Item = (i64, &ProducerEntry)> {
        self.producers
            .iter()
            .flat_map(|m| m.iter())
            .map(|(id, e)| (*id, e))
    }

    fn map_mut(&mut self) -> &mut HashMap<i64, ProducerEntry> {
        self.producers.get_or_insert_with(Default::default)
    }

    /// Sets a producer's whole entry (loading a snapshot).
    pub(crate) fn insert(&mut self, producer_id: i64, entry: ProducerEntry) {
        self.map_mut().insert(producer_id, entry);
    }

    /// Checks a client's batch. An unknown producer (no state, e.g. a new
    /// one or one whose state was lost) may start at any sequence, as in Kafka.
    pub fn check(
        &self,
        producer_id: i64,
        epoch: i16,
        first_seq: i32,
        last_seq: i32,
    ) -> Result<Verdict, SequenceError> {
        let Some(entry) = self.get(producer_id) else {
            return Ok(Verdict::Append);
        };
        if epoch < entry.epoch {
            return Err(SequenceError::InvalidProducerEpoch {
                got: epoch,
                current: entry.epoch,
            });
        }
        if epoch > entry.epoch {
            // A new epoch starts its sequences over.
            return if first_seq == 0 {
                Ok(Verdict::Append)
            } else {
                Err(SequenceError::OutOfOrderSequence {
                    expected: 0,
                    got: first_seq,
                })
            };
        }
        if let Some(dup) = entry
            .batches
            .iter()
            .find(|b| b.first_seq == first_seq && b.last_seq == last_seq)
        {
            return Ok(Verdict::Duplicate(*dup));
        }
        let last = entry.batches.back().map_or(-1, |b| b.last_seq);
        if in_sequence(last, first_seq) {
            Ok(Verdict::Append)
        } else {
            Err(SequenceError::OutOfOrderSequence {
                expected: last.wrapping_add(1),
                got: first_seq,
            })
        }
    }

    /// Records a transaction marker (control batch) of `producer_id`, as
    /// Kafka's `appendEndTxnMarker` does: the marker's epoch becomes the
    /// producer's, and a new epoch starts with no batches (its first batch
    /// is sequence 0). A coordinator fences a producer by aborting its
    /// transaction under a bumped epoch; from then on this partition
    /// refuses the old epoch's batches. Without it, a fenced producer's
    /// write after its successor's InitProducerId joined the successor's
    /// transaction here and was committed with it (3 nodes, the
    /// coordinator on another broker than the partition's leader). A
    /// marker never lowers the epoch.
    pub fn record_marker(&mut self, producer_id: i64, epoch: i16) {
        let entry = self
            .map_mut()
            .entry(producer_id)
            .or_insert_with(|| ProducerEntry {
                epoch,
                batches: VecDeque::new(),
            });
        if epoch > entry.epoch {
            entry.epoch = epoch;
            entry.batches.clear();
        }
    }

    /// Records an appended (or replayed) batch.
    pub fn record(&mut self, producer_id: i64, epoch: i16, batch: BatchMetadata) {
        let entry = self.map_mut().entry(producer_id).or_default();
        if epoch != entry.epoch {
            entry.epoch = epoch;
            entry.batches.clear();
        }
        entry.batches.push_back(batch);
        while entry.batches.len() > MAX_BATCHES_PER_PRODUCER {
            entry.batches.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn meta(first_seq: i32, last_seq: i32, first_offset: i64) -> BatchMetadata {
        BatchMetadata {
            first_seq,
            last_seq,
            first_offset,
            last_offset: first_offset + (last_seq - first_seq) as i64,
            timestamp: 0,
        }
    }

    #[test]
    fn unknown_producer_may_start_anywhere() {
        let s = ProducerStates::default();
        assert_eq!(s.check(7, 0, 0, 4), Ok(Verdict::Append));
        assert_eq!(s.check(7, 0, 42, 50), Ok(Verdict::Append));
    }

    #[test]
    fn in_order_duplicate_and_gap() {
        let mut s = ProducerStates::default();
        s.record(1, 0, meta(0, 4, 100));
        assert_eq!(s.check(1, 0, 5, 9), Ok(Verdict::Append));
        assert_eq!(s.check(1, 0, 0, 4), Ok(Verdict::Duplicate(meta(0, 4, 100))));
        assert_eq!(
            s.check(1, 0, 6, 9),
            Err(SequenceError::OutOfOrderSequence {
                expected: 5,
                got: 6
            })
        );
    }

    #[test]
    fn only_last_five_batches_are_duplicates() {
        let mut s = ProducerStates::default();
        for i in 0..6 {
            s.record(1, 0, meta(i * 2, i * 2 + 1, i as i64 * 2));
        }
        // The first batch (0..1) fell out of the window: now it is out of order.
        assert!(matches!(
            s.check(1, 0, 0, 1),
            Err(SequenceError::OutOfOrderSequence { .. })
        ));
        assert!(matches!(s.check(1, 0, 2, 3), Ok(Verdict::Duplicate(_))));
    }

    #[test]
    fn epochs_fence_and_reset() {
        let mut s = ProducerStates::default();
        s.record(1, 3, meta(0, 0, 0));
        assert_eq!(
            s.check(1, 2, 1, 1),
            Err(SequenceError::InvalidProducerEpoch { got: 2, current: 3 })
        );
        assert_eq!(s.check(1, 4, 0, 3), Ok(Verdict::Append));
        assert!(matches!(
            s.check(1, 4, 1, 3),
            Err(SequenceError::OutOfOrderSequence { .. })
        ));
        s.record(1, 4, meta(0, 3, 10));
        assert_eq!(s.get(1).unwrap().batches.len(), 1);
    }

    /// The coordinator fences a producer by aborting its transaction under
    /// a bumped epoch: the marker's epoch is the producer's from then on.
    #[test]
    fn a_marker_under_a_bumped_epoch_fences_the_old_epoch() {
        let mut s = ProducerStates::default();
        s.record(1, 0, meta(0, 0, 0));
        s.record_marker(1, 1);
        assert_eq!(
            s.check(1, 0, 1, 1),
            Err(SequenceError::InvalidProducerEpoch { got: 0, current: 1 })
        );
        // The new epoch starts at sequence 0, with its own batches only.
        assert_eq!(s.check(1, 2, 0, 0), Ok(Verdict::Append));
        assert_eq!(s.get(1).unwrap().batches.len(), 0);
        // A marker of the same epoch (a commit by the producer itself)
        // keeps its sequences; an older one lowers nothing.
        s.record(1, 1, meta(0, 4, 5));
        s.record_marker(1, 1);
        s.record_marker(1, 0);
        assert_eq!(s.get(1).unwrap().epoch, 1);
        assert_eq!(s.check(1, 1, 5, 5), Ok(Verdict::Append));
        // A producer this partition never saw a batch of (it added the
        // partition, then was fenced) is fenced too.
        s.record_marker(9, 3);
        assert!(matches!(
            s.check(9, 2, 0, 0),
            Err(SequenceError::InvalidProducerEpoch { .. })
        ));
    }

    #[test]
    fn sequences_wrap() {
        assert_eq!(increment_sequence(i32::MAX, 1), 0);
        assert_eq!(increment_sequence(i32::MAX - 1, 3), 1);
        let mut s = ProducerStates::default();
        s.record(1, 0, meta(i32::MAX - 1, i32::MAX, 0));
        assert_eq!(s.check(1, 0, 0, 2), Ok(Verdict::Append));
    }

    proptest! {
        /// A producer that sends batches in order, retrying some, never gets
        /// an error and every retry of one of its last five batches is a duplicate.
        #[test]
        fn retries_of_recent_batches_are_duplicates(sizes in proptest::collection::vec(1i32..20, 1..30), retry in 0usize..5) {
            let mut s = ProducerStates::default();
            let mut seq = 0;
            let mut offset = 0i64;
            let mut sent = Vec::new();
            for n in sizes {
                let last = increment_sequence(seq, n - 1);
                prop_assert_eq!(s.check(9, 0, seq, last), Ok(Verdict::Append));
                let m = BatchMetadata { first_seq: seq, last_seq: last, first_offset: offset, last_offset: offset + n as i64 - 1, timestamp: 0 };
                s.record(9, 0, m);
                sent.push(m);
                seq = increment_sequence(last, 1);
                offset += n as i64;
            }
            if let Some(m) = sent.iter().rev().nth(retry) {
                prop_assert_eq!(s.check(9, 0, m.first_seq, m.last_seq), Ok(Verdict::Duplicate(*m)));
            }
        }
    }
}
