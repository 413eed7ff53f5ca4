//! Producer-snapshot selection, validation, replay and deletion decisions:
//! pure functions with Kafka's semantics, from three places in Kafka's source:
//!
//! - `LogLoader.load` picks the log start the reload runs against and first
//!   calls `ProducerStateManager.removeStraySnapshots` with the base offset of
//!   every local segment;
//! - `ProducerStateManager.truncateAndReload(logStartOffset, logEndOffset, _)`
//!   deletes every snapshot outside `(logStartOffset, logEndOffset]`, then
//!   `loadFromSnapshot` loads the newest snapshot left (a corrupt one is
//!   deleted and the next newest tried);
//! - `UnifiedLog.rebuildProducerState` replays each local segment from
//!   `max(segment.baseOffset, mapEndOffset, logStartOffset)`.
//!
//! The range log applies them per partition (`producer_snapshot_file`).

/// The offsets one producer-state reload runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProducerReloadRange {
    /// The `logStartOffset` handed to `truncateAndReload`, as
    /// [`producer_snapshot_reload_log_start`] picks it.
    pub log_start: i64,
    /// The first offset a local segment serves: the greater of the oldest
    /// local segment's base offset and the log start.
    pub local_start: i64,
    /// The log end offset the state is rebuilt up to.
    pub log_end: i64,
}

/// One decoded producer-state snapshot entry, field for field as Kafka's
/// snapshot schema (version 1) lays it out, minus the timestamp, which no
/// validity rule reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProducerSnapshotEntryFacts {
    pub producer_id: i64,
    pub producer_epoch: i16,
    /// `last_sequence`, or -1 for a producer that only wrote markers.
    pub last_sequence: i32,
    /// `last_offset`, or -1 with the same meaning.
    pub last_offset: i64,
    /// `offset_delta`: the last batch's record count less one.
    pub offset_delta: i32,
    /// `coordinator_epoch`, or -1 before any marker.
    pub coordinator_epoch: i32,
    /// `current_txn_first_offset`, or -1 with no open transaction.
    pub current_txn_first_offset: i64,
}

/// The log start a producer-state reload runs against, as `LogLoader.load`
/// picks it: with remote storage (for Tessera: the partition's earlier
/// offsets live in ancestor ranges) the established log start, 0 when there
/// is none, which may lie below every local segment; otherwise the local log
/// start (the greater of the checkpoint and the oldest local segment's base).
#[must_use]
pub fn producer_snapshot_reload_log_start(
    remote_storage_enable: bool,
    established: Option<i64>,
    local_log_start: i64,
) -> i64 {
    if remote_storage_enable {
        established.unwrap_or(0)
    } else {
        local_log_start
    }
}

/// Whether `removeStraySnapshots` deletes the snapshot at `snapshots[index]`
/// given every local segment's base offset: it does unless a segment starts
/// at its offset, or it is the newest snapshot and lies at or above every
/// segment base (the snapshot a clean shutdown leaves at the log end). The
/// snapshot offsets must be distinct; their order does not matter.
#[must_use]
pub fn producer_snapshot_stray(snapshots: &[i64], index: usize, segment_bases: &[i64]) -> bool {
    let offset = snapshots[index];
    if segment_bases.contains(&offset) {
        return false;
    }
    let newest = snapshots.iter().all(|&s| s <= offset);
    let above_every_base = segment_bases.iter().all(|&b| b < offset);
    !(newest && above_every_base)
}

/// `removeStraySnapshots` itself, walked as Kafka walks it: snapshots in
/// offset order, each stray one deleted as soon as a later stray one turns
/// up, the last stray one deleted when it lies below the greatest segment
/// base. Returns, per input index, whether that snapshot is deleted (the
/// same answer as [`producer_snapshot_stray`] for every index).
#[must_use]
pub fn producer_snapshot_strays(snapshots: &[i64], segment_bases: &[i64]) -> Vec<bool> {
    let mut order: Vec<usize> = (0..snapshots.len()).collect();
    order.sort_by_key(|&i| snapshots[i]);
    let mut deleted = vec![false; snapshots.len()];
    let mut latest_stray: Option<usize> = None;
    for i in order {
        if !segment_bases.contains(&snapshots[i]) {
            if let Some(previous) = latest_stray {
                deleted[previous] = true;
            }
            latest_stray = Some(i);
        }
    }
    if let (Some(stray), Some(&max_base)) = (latest_stray, segment_bases.iter().max()) {
        if snapshots[stray] < max_base {
            deleted[stray] = true;
        }
    }
    deleted
}

/// Whether `truncateAndReload` keeps a snapshot: when it lies in
/// `(log_start, log_end]`. A snapshot at the log start describes no record
/// still in the log, so it goes too.
#[must_use]
pub fn producer_snapshot_reload_keeps(offset: i64, range: ProducerReloadRange) -> bool {
    range.log_start < offset && offset <= range.log_end
}

/// The index of the snapshot `loadFromSnapshot` loads after
/// `truncateAndReload`: the newest one in `(log_start, log_end]`.
#[must_use]
pub fn producer_snapshot_latest_index(
    offsets: &[i64],
    range: ProducerReloadRange,
) -> Option<usize> {
    offsets
        .iter()
        .enumerate()
        .filter(|(_, &o)| producer_snapshot_reload_keeps(o, range))
        .max_by_key(|(_, &o)| o)
        .map(|(i, _)| i)
}

/// Whether a decoded entry can truthfully describe a producer in a snapshot
/// taken at `snapshot_offset` (exclusive): a real producer id and epoch, a
/// coordinator epoch that is real or -1, a last batch that is either Kafka's
/// no-record sentinel `(-1, -1, 0)` or a real batch ending before the
/// snapshot offset with room for its delta, and an open transaction that is
/// absent (-1) or starts before the snapshot offset and no later than the
/// producer's last record.
#[must_use]
pub fn producer_snapshot_entry_valid(
    snapshot_offset: i64,
    entry: ProducerSnapshotEntryFacts,
) -> bool {
    let sentinel = entry.last_offset == -1 && entry.last_sequence == -1 && entry.offset_delta == 0;
    let real_batch = entry.last_offset >= 0
        && entry.last_sequence >= 0
        && entry.offset_delta >= 0
        && entry.last_offset >= i64::from(entry.offset_delta)
        && entry.last_offset < snapshot_offset;
    let txn = entry.current_txn_first_offset == -1
        || (entry.current_txn_first_offset >= 0
            && entry.current_txn_first_offset < snapshot_offset
            && entry.current_txn_first_offset <= entry.last_offset);
    snapshot_offset >= 0
        && entry.producer_id >= 0
        && entry.producer_epoch >= 0
        && entry.coordinator_epoch >= -1
        && (sentinel || real_batch)
        && txn
}

/// Where the replay starts after a reload loaded `snapshot` (its offset) or
/// none: `max(local segment base, mapEndOffset, logStartOffset)`, where
/// `mapEndOffset` is the snapshot's offset, or the log start with none.
/// `None` when the range is inconsistent (negative, or a start above the
/// end) or the snapshot is one the reload would not keep.
///
/// The cursor may fall inside a batch (a log start moved mid-batch); the
/// batch holding it is replayed whole, as `LogSegment.read` returns it.
#[must_use]
pub fn producer_snapshot_replay_start(
    range: ProducerReloadRange,
    snapshot: Option<i64>,
) -> Option<i64> {
    if range.log_start < 0
        || range.local_start < 0
        || range.log_start > range.log_end
        || range.local_start > range.log_end
    {
        return None;
    }
    let map_end = match snapshot {
        None => range.log_start,
        Some(offset) if producer_snapshot_reload_keeps(offset, range) => offset,
        Some(_) => return None,
    };
    Some(map_end.max(range.local_start))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn range(log_start: i64, local_start: i64, log_end: i64) -> ProducerReloadRange {
        ProducerReloadRange {
            log_start,
            local_start,
            log_end,
        }
    }

    #[test]
    fn reload_log_start_follows_log_loader() {
        for (remote, established, local, expected) in [
            // Remote storage: the checkpoint, below the local segments.
            (true, Some(3), 8, 3),
            // Remote storage, no checkpoint: Kafka reads it as 0.
            (true, None, 8, 0),
            // Local only: the local log start, whatever the checkpoint said.
            (false, Some(3), 8, 8),
            (false, None, 8, 8),
            (false, Some(0), 0, 0),
        ] {
            assert_eq!(
                producer_snapshot_reload_log_start(remote, established, local),
                expected,
                "{remote} {established:?} {local}"
            );
        }
    }

    #[test]
    fn stray_rules() {
        type Case<'a> = (&'a str, &'a [i64], &'a [i64], &'a [bool]);
        let cases: &[Case] = &[
            // ProducerStateManagerTest.testRemoveStraySnapshotsKeepCleanShutdownSnapshot:
            // snapshots 5, 2, 42 and one segment at 5: 2 goes, 42 (newest,
            // above every base) stays.
            (
                "keep clean shutdown",
                &[5, 2, 42],
                &[5],
                &[false, true, false],
            ),
            // ProducerStateManagerTest.testRemoveAllStraySnapshots: snapshots
            // 5, 2, 42 and one segment at 42: 5 and 2 go.
            (
                "remove all strays",
                &[5, 2, 42],
                &[42],
                &[true, true, false],
            ),
            // Both at segment bases: only 2 goes.
            ("two bases", &[5, 2, 42], &[5, 42], &[false, true, false]),
            // LogLoaderTest.testLoadingLogKeepsLargestStrayProducerStateSnapshot:
            // segments 0, 1, 2; snapshots 1, 2 (rolls), 4 (close), 3 (injected).
            (
                "largest stray kept",
                &[1, 2, 3, 4],
                &[0, 1, 2],
                &[false, false, true, false],
            ),
            // The newest stray below the newest segment base goes.
            ("newest stray below bases", &[3, 7], &[0, 10], &[true, true]),
            // At a segment base is never stray, even if below others.
            ("at base", &[0, 10], &[0, 10], &[false, false]),
            // The newest snapshot equal to the newest base is not stray.
            ("equal newest base", &[4, 10], &[10], &[true, false]),
            // No segments: the newest stray is kept (Kafka's empty max).
            ("no segments", &[3, 9], &[], &[true, false]),
            // A newest stray that is not above every base goes even if it is
            // above the oldest one.
            ("between bases", &[7], &[5, 10], &[true]),
            ("none", &[], &[0, 5], &[]),
        ];
        for (name, snaps, bases, expected) in cases {
            assert_eq!(
                &producer_snapshot_strays(snaps, bases)[..],
                *expected,
                "{name}"
            );
            for (i, want) in expected.iter().enumerate() {
                assert_eq!(
                    producer_snapshot_stray(snaps, i, bases),
                    *want,
                    "{name} {i}"
                );
            }
        }
    }

    #[test]
    fn reload_keeps_and_latest() {
        // ProducerStateManagerTest.testTruncateAndReloadRemovesOutOfRangeSnapshots:
        // snapshots 1..=5, truncateAndReload(1, 3): 2 and 3 remain, 3 loads.
        let r = range(1, 1, 3);
        let offsets = [1, 2, 3, 4, 5];
        let kept: Vec<i64> = offsets
            .iter()
            .copied()
            .filter(|&o| producer_snapshot_reload_keeps(o, r))
            .collect();
        assert_eq!(kept, vec![2, 3]);
        assert_eq!(producer_snapshot_latest_index(&offsets, r), Some(2));
        for (name, offsets, r, expected) in [
            // The log start itself is out: nothing to load.
            ("at log start", &[5][..], range(5, 5, 10), None),
            ("at log end", &[5, 10], range(5, 5, 10), Some(1)),
            // Above the log end (a stale snapshot): out.
            ("above end", &[7, 11], range(5, 5, 10), Some(0)),
            // Order does not matter.
            ("unordered", &[9, 6, 8], range(5, 5, 10), Some(0)),
            ("empty", &[], range(0, 0, 10), None),
            // LogLoaderTest.testLoadProducersAfterDeleteRecordsMidSegment:
            // the log start moved to 1 inside the only segment; the clean
            // shutdown snapshot at 2 still loads.
            ("delete records mid segment", &[2], range(1, 1, 2), Some(0)),
            // LogLoaderTest.testLoadProducersAfterDeleteRecordsOnSegment:
            // segments 0 and 1 with snapshots 1 (roll) and 2 (close); log
            // start 1 after the first segment went: 1 is out, 2 loads.
            (
                "delete records on segment",
                &[1, 2],
                range(1, 1, 2),
                Some(1),
            ),
        ] {
            assert_eq!(
                producer_snapshot_latest_index(offsets, r),
                expected,
                "{name}"
            );
        }
    }

    fn facts(
        last_offset: i64,
        last_sequence: i32,
        delta: i32,
        txn: i64,
    ) -> ProducerSnapshotEntryFacts {
        ProducerSnapshotEntryFacts {
            producer_id: 7,
            producer_epoch: 0,
            last_sequence,
            last_offset,
            offset_delta: delta,
            coordinator_epoch: -1,
            current_txn_first_offset: txn,
        }
    }

    #[test]
    fn entry_validity() {
        let ok = facts(9, 4, 4, -1);
        let cases = [
            ("plain", 10, ok, true),
            // The last offset must lie below the snapshot's offset.
            ("last offset at snapshot offset", 9, ok, false),
            ("negative snapshot offset", -1, ok, false),
            (
                "negative producer id",
                10,
                ProducerSnapshotEntryFacts {
                    producer_id: -1,
                    ..ok
                },
                false,
            ),
            (
                "negative epoch",
                10,
                ProducerSnapshotEntryFacts {
                    producer_epoch: -1,
                    ..ok
                },
                false,
            ),
            (
                "coordinator epoch -1",
                10,
                ProducerSnapshotEntryFacts {
                    coordinator_epoch: -1,
                    ..ok
                },
                true,
            ),
            (
                "coordinator epoch -2",
                10,
                ProducerSnapshotEntryFacts {
                    coordinator_epoch: -2,
                    ..ok
                },
                false,
            ),
            // Kafka's marker-only sentinel (ProducerStateManagerTest.
            // testRecoverFromSnapshotFinishedTransaction writes one).
            ("sentinel", 10, facts(-1, -1, 0, -1), true),
            ("bad sentinel delta", 10, facts(-1, -1, 1, -1), false),
            ("negative sequence", 10, facts(9, -1, 0, -1), false),
            ("delta beyond offset", 10, facts(2, 4, 3, -1), false),
            ("negative delta", 10, facts(9, 4, -1, -1), false),
            // ProducerStateManagerTest.testRecoverFromSnapshotUnfinishedTransaction:
            // an open transaction starting at or before the last record.
            ("open txn", 10, facts(9, 4, 4, 5), true),
            ("open txn at last offset", 10, facts(9, 4, 4, 9), true),
            ("open txn after last offset", 20, facts(9, 4, 4, 12), false),
            ("open txn at snapshot offset", 10, facts(9, 4, 4, 10), false),
            ("open txn -2", 10, facts(9, 4, 4, -2), false),
            ("sentinel with open txn", 10, facts(-1, -1, 0, 3), false),
        ];
        for (name, offset, entry, expected) in cases {
            assert_eq!(
                producer_snapshot_entry_valid(offset, entry),
                expected,
                "{name}"
            );
        }
    }

    #[test]
    fn replay_start_rules() {
        for (name, r, snapshot, expected) in [
            // No snapshot: from the log start, or the local start above it.
            ("no snapshot", range(0, 0, 10), None, Some(0)),
            ("no snapshot, ancestors", range(0, 6, 10), None, Some(6)),
            // LogLoaderTest.testLoadProducersAfterDeleteRecordsMidSegment:
            // the log start inside the segment.
            (
                "no snapshot, log start mid segment",
                range(3, 3, 10),
                None,
                Some(3),
            ),
            // A snapshot above the local start: from the snapshot.
            ("snapshot", range(0, 0, 10), Some(7), Some(7)),
            ("snapshot at log end", range(0, 0, 10), Some(10), Some(10)),
            // A snapshot below the local start (tiered: the snapshot was
            // taken before the local segments begin): from the local start.
            ("snapshot below local", range(0, 6, 10), Some(4), Some(6)),
            // A snapshot the reload would have deleted is rejected.
            ("snapshot at log start", range(4, 4, 10), Some(4), None),
            ("snapshot above end", range(0, 0, 10), Some(11), None),
            ("inconsistent range", range(5, 5, 4), None, None),
            ("local start above end", range(0, 11, 10), None, None),
            ("negative", range(-1, 0, 10), None, None),
        ] {
            assert_eq!(
                producer_snapshot_replay_start(r, snapshot),
                expected,
                "{name}"
            );
        }
    }

    proptest! {
        /// The closed form and Kafka's walk agree on every input.
        #[test]
        fn stray_walk_matches_closed_form(
            snaps in proptest::collection::btree_set(0i64..40, 0..8),
            bases in proptest::collection::vec(0i64..40, 0..6),
        ) {
            let mut snaps: Vec<i64> = snaps.into_iter().collect();
            // Order must not matter: reverse half of them.
            if snaps.len().is_multiple_of(2) { snaps.reverse(); }
            let walked = producer_snapshot_strays(&snaps, &bases);
            for (i, deleted) in walked.iter().enumerate() {
                prop_assert_eq!(*deleted, producer_snapshot_stray(&snaps, i, &bases));
            }
        }
    }
}
