//! What a primary's range log leaves behind in its directory when it
//! closes because leadership moved (a failover, a leader move, a
//! re-placement, or a pause that made this broker a zombie primary).
//!
//! While a log is open its directory holds its own writes: segments it
//! rolled that the metadata log never recorded, and a sealed segment
//! longer than the seal a quorum committed (the primary's tail that no
//! follower acknowledged). Once the log is closed the files of that
//! directory are read as the follower copies of the image's segments, so
//! a leftover with the number of one of them would stand for it: a
//! zombie's own segment N+1 taken as this broker's copy of the failover's
//! segment N+1 (acknowledged as held, reported at a fence, led later),
//! or the producer snapshot a zombie's longer segment ended with loaded
//! as the state where the real next segment starts (a retry answered as a
//! duplicate of a batch that is not in the log). [`leftovers`] decides
//! which files go (pure); [`Broker::discard_leftovers`] removes them.
//!
//! A log that never closed (kill -9, a crash) leaves its own rolls too: at
//! restart, files past the image's newest segment go
//! (`reconcile::discard_unrecorded_segments`), but a roll whose number a
//! failover reused is not past it. Every batch a range log stores carries
//! its leader epoch, so a file whose batches were written at another epoch
//! than the image records for its segment is not that segment:
//! [`other_epoch_files`] finds them (pure) and
//! [`Broker::discard_other_epoch_files`] replaces them by empty copies to
//! repair, or removes them, before any stream or seal takes them as copies.

use std::collections::BTreeSet;
use std::path::Path;

use tessera_log::RangeLog;
use tessera_metadata::{MetadataImage, RangeId, SegmentId};

use super::Broker;

/// One local segment of a closed log, as the log held it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LocalSegment {
    pub seq: u32,
    pub size: u64,
    pub sealed: bool,
}

/// The files a lost log must not leave behind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Leftovers {
    /// Segments whose every file goes (the log's own rolls the image does
    /// not record as this log's): `<seq>.log`, its index, fence marker,
    /// and the producer snapshot and aborted list it starts with.
    pub segments: BTreeSet<u32>,
    /// Segments whose starting producer snapshot and aborted list go: the
    /// one before them ended here at another size than its seal.
    pub snapshots: BTreeSet<u32>,
}

/// The closed log, as far as [`leftovers`] needs it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LostLog {
    /// This broker.
    pub broker: i32,
    /// The leader epoch the log wrote at.
    pub epoch: i32,
    /// Its newest segment it knows the image records.
    pub recorded_active: u32,
}

/// Decides what goes, for `log` of `range`.
pub(crate) fn leftovers(
    image: &MetadataImage,
    range: RangeId,
    log: LostLog,
    local: &[LocalSegment],
) -> Leftovers {
    let mut out = Leftovers::default();
    for s in local {
        let recorded = image.segments.get(&SegmentId::new(range, s.seq));
        // Past the newest segment this log knows the image records as its
        // own, a segment is the log's own roll, even where the image has a
        // segment of that number opened for this broker (a re-placement
        // keeping this broker primary opens the next segment, one epoch up
        // since the planner's `seal_and_replace`, and it is not this
        // file; images from before that kept the epoch). A roll recorded
        // before the log heard so stays if the image has already sealed
        // it as this broker's, at the log's epoch: a fence of it answered
        // by this log may be where its seal came from (found by the
        // replication simulation: the seal's source had deleted it).
        let own_sealed = recorded.is_some_and(|r| {
            r.is_sealed() && r.leader_epoch == log.epoch && r.primary() == Some(log.broker)
        });
        // Recorded and still open, as this broker's at the log's epoch, with
        // the segment before it sealed where this log ended it: the image's
        // segment is this log's own roll (a seal by quorum in flight may
        // take this very copy as its source: seed 4 lost a segment whose
        // only copy its primary deleted here). A re-placement's segment of
        // that number follows a seal at another size.
        let own_open = recorded.is_some_and(|r| {
            !r.is_sealed() && r.leader_epoch == log.epoch && r.primary() == Some(log.broker)
        }) && s.seq > 0
            && local.iter().any(|prev| {
                prev.seq + 1 == s.seq
                    && prev.sealed
                    && image
                        .segments
                        .get(&SegmentId::new(range, prev.seq))
                        .and_then(|p| p.sealed.as_ref().map(|i| (p.clean_pass(), i.size_bytes)))
                        == Some((0, prev.size))
            });
        if s.seq > log.recorded_active && !own_sealed && !own_open {
            out.segments.insert(s.seq);
            out.snapshots.insert(s.seq);
            continue;
        }
        let Some(seal) = recorded.and_then(|r| r.sealed.as_ref().map(|i| (r, i))) else {
            continue;
        };
        let (segment, info) = seal;
        // A cleaning pass changes sizes on purpose; only a segment as
        // its primary wrote it is compared with its seal.
        if s.sealed && segment.clean_pass() == 0 && s.size != info.size_bytes {
            out.snapshots.insert(s.seq + 1);
        }
    }
    out
}

impl Broker {
    /// Removes what [`leftovers`] names for `log`, just closed, and has
    /// this broker's copies of the range's sealed segments checked against
    /// their seals again (the log held them; a longer one is cut).
    pub(super) fn discard_leftovers(
        &self,
        image: &MetadataImage,
        range: RangeId,
        log: &RangeLog,
    ) -> anyhow::Result<()> {
        let (sealed, active) = log.local_segments();
        let mut local: Vec<LocalSegment> = sealed
            .iter()
            .map(|s| LocalSegment {
                seq: s.seq,
                size: s.size_bytes,
                sealed: true,
            })
            .collect();
        let (_, active_size) = log.local_durable_end();
        local.push(LocalSegment {
            seq: active,
            size: active_size,
            sealed: false,
        });
        let lost = LostLog {
            broker: self.config.node_id,
            epoch: log.leader_epoch(),
            recorded_active: log.recorded_active(),
        };
        let found = leftovers(image, range, lost, &local);
        let dir = log.dir();
        for &seq in &found.segments {
            tracing::warn!(range, seq, epoch = log.leader_epoch(), "discarding a segment this broker wrote as primary that the metadata log never recorded as its own");
            self.replicas.store.discard(
                tessera_replication::protocol::SegmentKey { range, seq },
                dir,
            )?;
        }
        for &seq in found.snapshots.iter() {
            remove_start_files(dir, seq)?;
        }
        if !found.segments.is_empty() || !found.snapshots.is_empty() {
            tessera_fs::sync_dir(dir)?;
        }
        self.replicas
            .sealed_copies
            .lock()
            .retain(|id| id.range != range);
        Ok(())
    }
}

/// The segments among `local` (`(seq, leader epoch of its first batch)`,
/// `None` for an empty file) whose file was written at another leader epoch
/// than `image_epoch` says the image's segment of that number has (`None`:
/// not in the image; those are left to the other rules).
pub(crate) fn other_epoch_files(
    local: &[(u32, Option<i32>)],
    image_epoch: impl Fn(u32) -> Option<i32>,
) -> Vec<u32> {
    local
        .iter()
        .filter(|(seq, epoch)| {
            epoch
                .zip(image_epoch(*seq))
                .is_some_and(|(file, image)| file != image)
        })
        .map(|(seq, _)| *seq)
        .collect()
}

impl Broker {
    /// Drops this broker's files of `range`'s segments (in `dir`) that were
    /// written at another leader epoch than the image's segment of that
    /// number: a crashed primary's own unrecorded roll whose number a
    /// failover reused. Each file is read once per segment incarnation; a
    /// range whose log is open here is left alone (its files are its own).
    /// A sealed segment this broker is a replica of gets an empty copy in
    /// place (repaired from its replicas), an active one is shipped again.
    pub(super) fn discard_other_epoch_files(
        &self,
        image: &MetadataImage,
        range: RangeId,
        dir: &Path,
    ) -> anyhow::Result<()> {
        if self.log_of(range).is_some() || !dir.exists() {
            return Ok(());
        }
        let mut local = Vec::new();
        for seq in tessera_log::range_log::local_segment_seqs(dir)? {
            let id = SegmentId::new(range, seq);
            let Some(seg) = image.segments.get(&id) else {
                continue;
            };
            if self
                .replicas
                .epoch_checked
                .lock()
                .insert((id, seg.leader_epoch))
            {
                local.push((
                    seq,
                    tessera_log::segment::first_batch_leader_epoch(dir, seq)?,
                ));
            }
        }
        let stale = other_epoch_files(&local, |seq| {
            image
                .segments
                .get(&SegmentId::new(range, seq))
                .map(|s| s.leader_epoch)
        });
        let me = self.config.node_id;
        for seq in stale {
            let id = SegmentId::new(range, seq);
            let seg = &image.segments[&id];
            tracing::warn!(segment = %id, epoch = seg.leader_epoch, "discarding a file of this segment number written at another leader epoch (this broker's own roll, never recorded, from before a restart)");
            let key = super::replicas::key(id);
            self.replicas.store.discard(key, dir)?;
            remove_start_files(dir, seq)?;
            if seg.is_sealed() && seg.replicas.contains(&me) {
                self.replicas.store.copy(key, dir)?;
            }
            self.replicas.sealed_copies.lock().remove(&id);
            self.replicas.read_copies.lock().remove(&id);
        }
        Ok(())
    }
}

/// Removes the producer snapshot and the aborted-transaction list that
/// segment `seq` starts with.
pub(super) fn remove_start_files(dir: &Path, seq: u32) -> std::io::Result<()> {
    for path in [
        tessera_log::producer_snapshot_file::snapshot_path(dir, seq),
        tessera_log::aborted_index_file::aborted_path(dir, seq),
    ] {
        if tessera_fs::remove_if_exists(&path)? {
            tracing::info!(file = %path.display(), "removed a producer-state file a lost log left");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_written_at_another_epoch_than_the_images_segment_are_found() {
        // 3 at epoch 2 (the image's), 4 at epoch 2 while the image's 4 is
        // at epoch 3 (a failover reused the number), 5 empty, 6 unknown.
        let image_epoch = |seq: u32| match seq {
            3 => Some(2),
            4 | 5 => Some(3),
            _ => None,
        };
        let local = [(3, Some(2)), (4, Some(2)), (5, None), (6, Some(1))];
        assert_eq!(other_epoch_files(&local, image_epoch), vec![4]);
    }
    use tessera_metadata::{SealInfo, SegmentImage};

    const RANGE: RangeId = 1;

    /// Segments of range 1 as `(seq, primary, epoch, sealed size)`.
    fn image(segments: &[(u32, i32, i32, Option<u64>)]) -> MetadataImage {
        let mut image = MetadataImage::empty();
        for &(seq, primary, epoch, sealed) in segments {
            let id = SegmentId::new(RANGE, seq);
            let sealed = sealed.map(|size_bytes| SealInfo {
                size_bytes,
                spans: Vec::new(),
                cleaned: None,
            });
            image.segments.insert(
                id,
                std::sync::Arc::new(SegmentImage {
                    id,
                    replicas: vec![primary, 7, 8],
                    leader_epoch: epoch,
                    sealed,
                    in_sync: None,
                }),
            );
        }
        image
    }

    /// Broker 2's log at epoch 3.
    fn lost(recorded_active: u32) -> LostLog {
        LostLog {
            broker: 2,
            epoch: 3,
            recorded_active,
        }
    }

    fn local(segments: &[(u32, u64, bool)]) -> Vec<LocalSegment> {
        segments
            .iter()
            .map(|&(seq, size, sealed)| LocalSegment { seq, size, sealed })
            .collect()
    }

    #[test]
    fn a_zombies_own_roll_goes_even_where_the_image_has_a_segment_of_that_number() {
        // Broker 2 led segment 4 at epoch 3 and rolled to 5 on its own;
        // a failover sealed 4 at 900 and opened 5 at epoch 4 on broker 3.
        let image = image(&[(4, 2, 3, Some(900)), (5, 3, 4, None)]);
        let found = leftovers(
            &image,
            RANGE,
            lost(4),
            &local(&[(4, 1000, true), (5, 300, false)]),
        );
        assert_eq!(found.segments, BTreeSet::from([5]));
        // Segment 4 ended here 100 bytes past its seal: the snapshot its
        // roll wrote for 5 is not the state where the image's 5 starts.
        assert_eq!(found.snapshots, BTreeSet::from([5]));
    }

    #[test]
    fn a_recorded_roll_and_a_matching_seal_stay() {
        // The roll to 5 was recorded (the image's 5 is this log's), then
        // a leader move sealed 5 and opened 6 elsewhere.
        let image = image(&[(4, 2, 3, Some(1000)), (5, 2, 3, Some(300)), (6, 3, 4, None)]);
        let found = leftovers(
            &image,
            RANGE,
            lost(5),
            &local(&[(4, 1000, true), (5, 300, false)]),
        );
        assert_eq!(found, Leftovers::default());
    }

    #[test]
    fn a_re_placement_keeping_the_primary_does_not_make_an_unrecorded_roll_its_segment() {
        // The log rolled to 5 on its own; a re-placement sealed 4 at 900
        // and opened 5 for this same broker at the same epoch.
        let image = image(&[(4, 2, 3, Some(900)), (5, 2, 3, None)]);
        let found = leftovers(
            &image,
            RANGE,
            lost(4),
            &local(&[(4, 1000, true), (5, 300, false)]),
        );
        assert_eq!(found.segments, BTreeSet::from([5]));
    }

    #[test]
    fn a_roll_recorded_and_sealed_from_this_log_before_it_heard_stays() {
        // The log rolled to 5; the roll was recorded, then a fence of 5
        // (answered by this log, at 300) sealed it and opened 6 elsewhere,
        // all before the log learned of the record (recorded_active 4).
        let image = image(&[(4, 2, 3, Some(1000)), (5, 2, 3, Some(300)), (6, 3, 4, None)]);
        let found = leftovers(
            &image,
            RANGE,
            lost(4),
            &local(&[(4, 1000, true), (5, 300, false)]),
        );
        assert_eq!(found, Leftovers::default());
    }

    #[test]
    fn a_recorded_roll_still_open_stays_before_the_log_heard() {
        // The log rolled 4 -> 5 at 1000; the roll was recorded (4 sealed at
        // 1000, 5 open for this broker at the log's epoch) before the log
        // heard so (recorded_active 4). A seal by quorum of 5 may take this
        // copy as its source: it stays (fault run seed 4 lost segment 2/94
        // when its primary deleted it here).
        let image = image(&[(4, 2, 3, Some(1000)), (5, 2, 3, None)]);
        let found = leftovers(
            &image,
            RANGE,
            lost(4),
            &local(&[(4, 1000, true), (5, 300, false)]),
        );
        assert_eq!(found, Leftovers::default());
    }

    #[test]
    fn an_unrecorded_roll_nobody_else_numbered_goes() {
        let image = image(&[(4, 2, 3, Some(1000)), (5, 3, 4, None)]);
        let found = leftovers(
            &image,
            RANGE,
            lost(4),
            &local(&[(4, 1000, true), (5, 10, true), (6, 0, false)]),
        );
        assert_eq!(found.segments, BTreeSet::from([5, 6]));
        assert_eq!(found.snapshots, BTreeSet::from([5, 6]));
    }
}
