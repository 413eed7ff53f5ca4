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

use std::path::Path;
use std::time::Duration;

use tessera_log::aborted_index_file::{self, aborted_path};
use tessera_log::producer_snapshot_file::{self, snapshot_path};

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
}

/// Whether a follower of segment `seq` must fetch the snapshot where it
/// starts. Segment 0 has no history in its range (a split or merge child
/// takes its producers from its parents).
#[must_use]
pub fn needs_snapshot(seq: u32, local: LocalHistory) -> bool {
    seq > 0 && !local.holds_previous && !local.holds_snapshot
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
/// broker at `addr` and keeps them durably in `range_dir`, the snapshot
/// last: its presence says the transfer is done. Both are checked before
/// they are written (a corrupt or truncated reply is an error, never a file).
pub async fn fetch(
    addr: &str,
    segment: SegmentKey,
    range_dir: &Path,
    timeout: Duration,
) -> Result<(), ProtocolError> {
    match call(addr, &Message::ReadSnapshot { segment }, timeout).await? {
        Message::SnapshotData {
            segment: s,
            bytes,
            aborted,
        } if s == segment => {
            producer_snapshot_file::decode(&bytes)
                .map_err(|_| ProtocolError::Malformed("corrupt producer snapshot"))?;
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
    fn only_a_follower_without_the_previous_segment_or_the_snapshot_fetches() {
        let local = |holds_previous, holds_snapshot| LocalHistory {
            holds_previous,
            holds_snapshot,
        };
        assert!(needs_snapshot(3, local(false, false)));
        assert!(!needs_snapshot(3, local(true, false)));
        assert!(!needs_snapshot(3, local(false, true)));
        assert!(!needs_snapshot(0, local(false, false)));
    }
}
