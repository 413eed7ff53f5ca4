//! The producer state a follower needs when it does not hold the segments
//! before the one it follows (it joined the range's replica set later: a
//! spare after a failover, a re-placed or healed replica).
//!
//! Kafka rebuilds a leader's idempotent-producer and open-transaction state
//! from its own log; a broker without the range's older segments cannot.
//! The primary keeps the snapshot of that state where each segment starts
//! (`<seq>.snapshot`, written at a roll and when a replicated range opens on
//! a new segment); the follower fetches it with `ReadSnapshot` and keeps it
//! in its range directory, where the range log's reload finds it if this
//! broker becomes the range's primary.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use tessera_log::aborted_index_file::{self, aborted_path};
use tessera_log::producer_snapshot_file::{self, snapshot_path, SnapshotSection};

use crate::auth::Connector;
use crate::protocol::{Message, ProtocolError, SegmentKey};
use crate::service::{call, Directory};

/// What a follower of segment `seq` of a range holds locally.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalHistory {
    /// A copy (or log segment) of `seq - 1`: the producer state can be
    /// rebuilt from local data, as the segments before it are held too.
    pub holds_previous: bool,
    /// `<seq>.snapshot` is in the range directory already.
    pub holds_snapshot: bool,
    /// The range is a split or merge child and this broker does not hold
    /// its parents' logs: the history before its segment 0 is elsewhere.
    pub ancestors_elsewhere: bool,
}

/// Whether a follower of segment `seq` must fetch the snapshot where it
/// starts. Segment 0 has no history in its range: a split or merge child
/// takes its producers from its parents, which only a broker that holds
/// their logs can read (any other one fetches `<0>.snapshot`, which the
/// child's first primary wrote from them).
#[must_use]
pub fn needs_snapshot(seq: u32, local: LocalHistory) -> bool {
    (seq > 0 || local.ancestors_elsewhere) && !local.holds_previous && !local.holds_snapshot
}

/// Which producer snapshot a broker about to open a replicated range as its
/// primary must have first: `<K>.snapshot`, K the first segment of the
/// unbroken run of `local` segments (sorted, the active one included) that
/// ends at the newest, when segments of the range before K (from `first`,
/// the range's oldest in the image) are not local and no snapshot is where
/// a segment of that run starts (`has_snapshot`). `None`: its own segments
/// and snapshots rebuild the producer state (the whole history since
/// `first` is local, K is the range's first segment, or a snapshot is here).
///
/// Leading without it would forget the idempotent producers, epochs and
/// open or aborted transactions of the history held elsewhere: a retried
/// batch would be appended again at a new offset.
#[must_use]
pub fn snapshot_needed_to_lead(
    first: u32,
    local: &[u32],
    ancestors_elsewhere: bool,
    has_snapshot: impl Fn(u32) -> bool,
) -> Option<u32> {
    let newest = *local.last()?;
    let mut start = newest;
    for &seq in local.iter().rev().skip(1) {
        if seq + 1 != start {
            break;
        }
        start = seq;
    }
    let local = LocalHistory {
        // Nothing of the range lies before its first segment (retention
        // deleted it, or it is segment 0).
        holds_previous: start <= first && !(start == 0 && ancestors_elsewhere),
        holds_snapshot: (start..=newest).any(has_snapshot),
        ancestors_elsewhere: start == 0 && ancestors_elsewhere,
    };
    needs_snapshot(start, local).then_some(start)
}

/// The brokers to ask for `<seq>.snapshot`, in order: the other replicas of
/// segment `seq` (its primary wrote it as the segment opened; a follower
/// may have fetched it), then those of `seq - 1` (its primary wrote it at
/// the roll or the seal that ended `seq - 1`).
#[must_use]
pub fn snapshot_sources(me: i32, replicas: &[i32], previous_replicas: &[i32]) -> Vec<i32> {
    let mut sources = Vec::new();
    for &r in replicas.iter().chain(previous_replicas) {
        if r != me && !sources.contains(&r) {
            sources.push(r);
        }
    }
    sources
}

/// Whether a producer snapshot was taken where its segment starts: each
/// partition's offset in it is the one `starts` gives (where the image's
/// sealed segments before it end; a partition not listed is not checked).
/// A snapshot taken at a longer end describes batches the log does not
/// hold: a zombie primary's own roll past the seal a failover committed,
/// or a copy's roll cut back to its seal (seed 8 of the fault harness). A
/// leader loading it answers a producer's retry of such a batch as a
/// duplicate (acknowledged, not stored) or refuses the producer's next
/// batches as out of order.
#[must_use]
pub fn taken_at_start(sections: &[SnapshotSection], starts: &BTreeMap<u32, i64>) -> bool {
    sections.iter().all(|s| {
        starts
            .get(&s.partition)
            .is_none_or(|&start| start == s.offset)
    })
}

/// Serves `ReadSnapshot`: the bytes of `<seq>.snapshot` and `<seq>.aborted`
/// in the range's directory, or `Refused` when this broker has no snapshot.
pub fn serve(segment: SegmentKey, dir: &dyn Directory) -> Message {
    let refused = |reason: String| Message::Refused {
        segment,
        retry: false,
        reason,
    };
    let Some(range_dir) = dir.range_dir(segment) else {
        return refused("range not known here".into());
    };
    // The aborted file is written first, so one read after the snapshot
    // sees it whenever the primary wrote both.
    match std::fs::read(snapshot_path(&range_dir, segment.seq)) {
        Ok(bytes) => Message::SnapshotData {
            segment,
            bytes: bytes.into(),
            aborted: std::fs::read(aborted_path(&range_dir, segment.seq))
                .unwrap_or_default()
                .into(),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            refused("no producer snapshot for the segment here".into())
        }
        Err(e) => refused(e.to_string()),
    }
}

/// Fetches `<seq>.snapshot` (and `<seq>.aborted`) of `segment` from the
/// broker at `addr` (connecting with `connector`) and keeps them durably in `range_dir`, the snapshot
/// last: its presence says the transfer is done. Both are checked before
/// they are written (a corrupt or truncated reply is an error, never a file),
/// and a snapshot not taken at the segment's `starts` ([`taken_at_start`])
/// is refused.
pub async fn fetch(
    connector: &dyn Connector,
    addr: &str,
    segment: SegmentKey,
    range_dir: &Path,
    starts: &BTreeMap<u32, i64>,
    timeout: Duration,
) -> Result<(), ProtocolError> {
    match call(connector, addr, &Message::ReadSnapshot { segment }, timeout).await? {
        Message::SnapshotData {
            segment: s,
            bytes,
            aborted,
        } if s == segment => {
            let sections = producer_snapshot_file::decode(&bytes)
                .map_err(|_| ProtocolError::Malformed("corrupt producer snapshot"))?;
            if !taken_at_start(&sections, starts) {
                return Err(ProtocolError::SnapshotNotAtStart);
            }
            if !aborted.is_empty() {
                aborted_index_file::decode(&aborted)
                    .map_err(|_| ProtocolError::Malformed("corrupt aborted transactions"))?;
            }
            std::fs::create_dir_all(range_dir)?;
            if !aborted.is_empty() {
                tessera_fs::write_atomic(&aborted_path(range_dir, segment.seq), &aborted)?;
            }
            tessera_fs::write_atomic(&snapshot_path(range_dir, segment.seq), &bytes)?;
            Ok(())
        }
        Message::Refused { reason, .. } => Err(ProtocolError::Refused(reason)),
        _ => Err(ProtocolError::Malformed("unexpected reply to ReadSnapshot")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_is_kept_only_if_taken_where_the_segment_starts() {
        let section = |partition, offset| SnapshotSection {
            partition,
            offset,
            rows: Vec::new(),
        };
        let starts = BTreeMap::from([(0, 100), (1, 40)]);
        assert!(taken_at_start(&[], &starts));
        assert!(taken_at_start(&[section(0, 100), section(1, 40)], &starts));
        // Partition 2's data was deleted by retention: not checked.
        assert!(taken_at_start(&[section(0, 100), section(2, 7)], &starts));
        // Taken past the seal (a longer roll), or before it.
        assert!(!taken_at_start(&[section(0, 130), section(1, 40)], &starts));
        assert!(!taken_at_start(&[section(1, 39)], &starts));
    }

    #[test]
    fn only_a_follower_without_the_previous_segment_or_the_snapshot_fetches() {
        let local = |holds_previous, holds_snapshot| LocalHistory {
            ancestors_elsewhere: false,
            holds_previous,
            holds_snapshot,
        };
        assert!(needs_snapshot(3, local(false, false)));
        assert!(!needs_snapshot(3, local(true, false)));
        assert!(!needs_snapshot(3, local(false, true)));
        assert!(!needs_snapshot(0, local(false, false)));
        // Segment 0 of a child whose parents' logs are not here.
        let child = |holds_snapshot| LocalHistory {
            ancestors_elsewhere: true,
            holds_previous: false,
            holds_snapshot,
        };
        assert!(needs_snapshot(0, child(false)));
        assert!(!needs_snapshot(0, child(true)));
    }

    #[test]
    fn a_child_led_without_its_parents_needs_a_snapshot_of_its_own_history() {
        // A follower of a merge child since its segment 0, failed over to:
        // its copies are the child's whole history, not the parents'.
        assert_eq!(
            snapshot_needed_to_lead(0, &[0, 1, 2], true, |_| false),
            Some(0)
        );
        assert_eq!(
            snapshot_needed_to_lead(0, &[0, 1, 2], true, |s| s == 0),
            None
        );
        assert_eq!(
            snapshot_needed_to_lead(0, &[0, 1, 2], true, |s| s == 2),
            None
        );
        // A run after a gap needs its own snapshot anyway.
        assert_eq!(
            snapshot_needed_to_lead(0, &[0, 2, 3], true, |s| s == 0),
            Some(2)
        );
    }

    #[test]
    fn a_primary_needs_the_snapshot_where_its_last_unbroken_run_starts() {
        let none = |_| false;
        // The whole history is local.
        assert_eq!(snapshot_needed_to_lead(0, &[0, 1, 2], false, none), None);
        // A spare that followed segment 1 leads segment 2.
        assert_eq!(snapshot_needed_to_lead(0, &[1, 2], false, none), Some(1));
        assert_eq!(snapshot_needed_to_lead(0, &[1, 2], false, |s| s == 1), None);
        // A snapshot where a later segment of the run starts does as well.
        assert_eq!(
            snapshot_needed_to_lead(0, &[1, 2, 3], false, |s| s == 2),
            None
        );
        // Away for segment 2: the run after the gap counts, an older
        // snapshot does not.
        assert_eq!(
            snapshot_needed_to_lead(0, &[0, 1, 3, 4], false, |s| s == 1),
            Some(3)
        );
        // Retention deleted what came before the local run.
        assert_eq!(snapshot_needed_to_lead(5, &[5, 6], false, none), None);
        assert_eq!(snapshot_needed_to_lead(5, &[2, 5, 6], false, none), None);
        // Only the new active segment is local.
        assert_eq!(snapshot_needed_to_lead(0, &[4], false, none), Some(4));
        assert_eq!(snapshot_needed_to_lead(0, &[0], false, none), None);
        assert_eq!(snapshot_needed_to_lead(0, &[], false, none), None);
    }

    #[test]
    fn snapshot_sources_ask_the_segments_replicas_then_the_previous_ones() {
        assert_eq!(
            snapshot_sources(3, &[1, 2, 3], &[4, 1, 5]),
            vec![1, 2, 4, 5]
        );
        assert_eq!(snapshot_sources(3, &[3], &[]), Vec::<i32>::new());
    }
}
