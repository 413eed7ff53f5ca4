//! The broker's side of per-segment replication: shipping the ranges it is
//! primary of to their followers, serving the streams of the primaries it
//! follows, applying committed seals to its copies (truncate or repair),
//! and seal-by-quorum when a primary is lost or restarts.
//!
//! The protocol and its rules are `tessera_replication`'s; this module
//! connects them to the image (who is primary, who follows, where a range's
//! directory is) and to the metadata log (the seal and the next segment are
//! one entry planned by `tessera_planner::seal_by_quorum`).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tessera_log::producer_snapshot_file::snapshot_path;
use tessera_log::RangeLog;
use tessera_metadata::{MetadataImage, PartitionSpan, RangeId, SegmentId, SegmentImage};
use tessera_replication::auth::Connector;
use tessera_replication::primary::{FollowerSet, PeerAddresses, Replication};
use tessera_replication::protocol::{Message, ProtocolError, SegmentKey};
use tessera_replication::replica_store::ReplicaStore;
use tessera_replication::service::{self, Directory, Refusal};
use tessera_replication::snapshot_transfer;
use tessera_replication::{seal_point, FenceReport, SealAction};

use super::{Broker, PartitionRoute};
use crate::error::ApiError;

/// How long one fence or repair exchange may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a seal-by-quorum waits for the other replicas' fence answers
/// once a quorum has answered.
const QUORUM_GRACE: Duration = Duration::from_millis(300);
/// Pause between attempts of a seal or repair that could not finish.
const RETRY: Duration = Duration::from_millis(500);

/// Replication state of one broker.
#[derive(Default)]
pub(crate) struct Replicas {
    /// The broker itself, for the tasks and the follower service.
    me: OnceLock<Weak<Broker>>,
    pub(crate) store: Arc<ReplicaStore>,
    /// Ranges this broker ships to followers (it is their primary).
    shipping: Mutex<HashMap<RangeId, Arc<Replication>>>,
    /// Segments a seal-by-quorum runs for (one task each).
    sealing: Mutex<HashSet<SegmentId>>,
    /// Follower copies being repaired (one task each).
    pub(super) repairing: Mutex<HashSet<SegmentId>>,
    /// Producer snapshots being fetched, and ranges waiting for one before
    /// they are led here (one lock: a fetch task decides to end and a
    /// range starts waiting on it atomically).
    snapshots: Mutex<SnapshotFetches>,
    /// Seals already applied to this broker's copies.
    pub(super) sealed_copies: Mutex<HashSet<SegmentId>>,
    /// Ranges a cleaning pass runs on here (planned as primary, or applied
    /// to this broker's copies): one at a time, and no log opens meanwhile.
    pub(super) cleaning: Mutex<HashSet<RangeId>>,
    /// When this broker, as primary, last planned a pass over a range's
    /// oldest run of sealed segments (see `Broker::plan_cleaning`).
    pub(super) oldest_run_cleaned: Mutex<HashMap<RangeId, std::time::Instant>>,
    /// Sealed segments not on this broker, checked for a stale copy (by
    /// replica set: healing may list this broker again later).
    foreign_checked: Mutex<HashSet<(SegmentId, Vec<i32>)>>,
    /// When the copying budget (`replica.heal.max.bytes.per.sec`) is free
    /// again, shared by every repair and healing copy of this broker.
    copy_pace: Mutex<Option<std::time::Instant>>,
    /// Ranges this broker is to lead that wait for copies of their sealed
    /// segments to be repaired here first.
    awaiting_history: Mutex<HashSet<RangeId>>,
    /// Segment incarnations (id, leader epoch) whose local file was checked
    /// for another epoch's batches (see `Broker::discard_other_epoch_files`).
    pub(super) epoch_checked: Mutex<HashSet<(SegmentId, i32)>>,
    /// Complete sealed copies opened for fetches from followers.
    pub(super) read_copies: Mutex<HashMap<SegmentId, Arc<tessera_log::segment::Segment>>>,
}

#[derive(Default)]
struct SnapshotFetches {
    /// Segments whose `<seq>.snapshot` is being fetched (one fetch each:
    /// a background task, or the attempt of a reconcile pass).
    running: HashSet<SegmentId>,
    /// Ranges this broker is primary of whose log does not open until the
    /// snapshot at this segment is here (`Broker::producer_state_to_lead`).
    awaiting: HashMap<RangeId, u32>,
}

/// How long a reconcile pass waits for one replica's answer when it
/// fetches the snapshot a range it is to lead needs, for all of them, and
/// for those of every range of the pass (the rest go to background tasks).
/// Rounds of asking for a producer snapshot needed to lead (about
/// `RETRY` apart, so half a minute or more) before the range is handed to
/// another replica: long enough for a replica that restarts to serve it.
const RESIGN_AFTER_ATTEMPTS: u32 = 60;
const LEAD_SNAPSHOT_CALL_TIMEOUT: Duration = Duration::from_secs(1);
const LEAD_SNAPSHOT_BUDGET: Duration = Duration::from_secs(2);
pub(super) const LEAD_SNAPSHOT_PASS_BUDGET: Duration = Duration::from_secs(5);

pub(super) fn key(id: SegmentId) -> SegmentKey {
    SegmentKey {
        range: id.range,
        seq: id.seq,
    }
}

/// The follower service's view of the broker.
struct View(Weak<Broker>);

impl Directory for View {
    fn copy_clean_pass(&self, segment: SegmentKey) -> Option<u64> {
        let broker = self.0.upgrade()?;
        broker.copy_clean_pass(&broker.image(), SegmentId::new(segment.range, segment.seq))
    }

    fn follower_dir(
        &self,
        segment: SegmentKey,
        primary: i32,
        epoch: i32,
    ) -> Result<PathBuf, Refusal> {
        let broker = self.0.upgrade().ok_or_else(|| Refusal {
            retry: false,
            reason: "broker shutting down".into(),
        })?;
        let image = broker.image();
        let id = SegmentId::new(segment.range, segment.seq);
        let behind = |reason: &str| Refusal {
            retry: true,
            reason: reason.into(),
        };
        let seg = image
            .segments
            .get(&id)
            .ok_or_else(|| behind("segment not in this broker's metadata yet"))?;
        if seg.is_sealed() {
            return Err(Refusal {
                retry: false,
                reason: format!("segment {id} is sealed"),
            });
        }
        if seg.primary() != Some(primary) || !seg.replicas[1..].contains(&broker.config.node_id) {
            return Err(behind("not a follower of this segment for that primary"));
        }
        if seg.leader_epoch != epoch {
            // An older epoch is a zombie primary's segment of the same
            // number; a newer one, this broker's image behind.
            return Err(Refusal {
                retry: seg.leader_epoch < epoch,
                reason: format!(
                    "segment {id} is at leader epoch {}, not {epoch}",
                    seg.leader_epoch
                ),
            });
        }
        if own_log_holds(&broker, segment) {
            return Err(behind(
                "this broker's own log still holds a segment of that number",
            ));
        }
        broker
            .range_dir_of(&image, segment.range)
            .ok_or_else(|| behind("range not known yet"))
    }

    fn range_dir(&self, segment: SegmentKey) -> Option<PathBuf> {
        let broker = self.0.upgrade()?;
        broker.range_dir_of(&broker.image(), segment.range)
    }

    fn sealed_copy(&self, segment: SegmentKey, primary: i32, epoch: i32) -> Option<(PathBuf, u64)> {
        let broker = self.0.upgrade()?;
        let image = broker.image();
        let seg = image
            .segments
            .get(&SegmentId::new(segment.range, segment.seq))?;
        let sealed = seg.sealed.as_ref()?;
        // Only the bytes the primary wrote: not once a cleaning pass
        // rewrote the segment (the repair reads the cleaned bytes then).
        let as_written =
            seg.clean_pass() == 0 && !broker.replicas.cleaning.lock().contains(&segment.range);
        if seg.primary() != Some(primary)
            || seg.leader_epoch != epoch
            || !seg.replicas[1..].contains(&broker.config.node_id)
            || !as_written
            || own_log_holds(&broker, segment)
        {
            return None;
        }
        let dir = broker.range_dir_of(&image, segment.range)?;
        Some((dir, sealed.size_bytes))
    }

    fn segment_sealed(&self, segment: SegmentKey) -> Option<bool> {
        let broker = self.0.upgrade()?;
        let image = broker.image();
        image
            .segments
            .get(&SegmentId::new(segment.range, segment.seq))
            .map(|s| s.is_sealed())
    }

    fn segment_epoch(&self, segment: SegmentKey) -> Option<i32> {
        let broker = self.0.upgrade()?;
        let image = broker.image();
        image
            .segments
            .get(&SegmentId::new(segment.range, segment.seq))
            .map(|s| s.leader_epoch)
    }

    fn primary_log(&self, range: u64) -> Option<Arc<RangeLog>> {
        self.0.upgrade()?.log_of(range)
    }

    fn is_registered_broker(&self, broker: i32) -> bool {
        self.0
            .upgrade()
            .is_some_and(|b| b.image().brokers.contains_key(&broker))
    }
}

/// Whether this broker's open range log (as a primary, maybe a zombie one
/// that has not reconciled yet) holds a segment of `segment`'s number: its
/// file is that log's, not a copy of the image's segment, until the log
/// closes and discards what nobody recorded.
fn own_log_holds(broker: &Broker, segment: SegmentKey) -> bool {
    broker
        .log_of(segment.range)
        .is_some_and(|log| log.holds_segment(segment.seq))
}

impl PeerAddresses for View {
    fn address_of(&self, broker: i32) -> Option<String> {
        let b = self.0.upgrade()?;
        let image = b.image();
        let r = &image.brokers.get(&broker)?.registration;
        Some(format!("{}:{}", r.host, r.port))
    }

    fn connector(&self) -> Arc<dyn Connector> {
        match self.0.upgrade() {
            Some(b) => b.inter_broker.clone(),
            // Shutting down: nothing to connect as.
            None => Arc::new(tessera_replication::auth::Plaintext),
        }
    }
}

impl Broker {
    /// Called once at start, with the broker's own `Arc`.
    pub(super) fn init_replicas(self: &Arc<Self>) {
        let _ = self.replicas.me.set(Arc::downgrade(self));
    }

    pub(super) fn weak(&self) -> Weak<Broker> {
        self.replicas.me.get().cloned().unwrap_or_default()
    }

    /// Serves an upgraded replication connection (see `server.rs`).
    pub async fn serve_replication<R, W>(&self, reader: R, writer: W)
    where
        R: tokio::io::AsyncRead + Unpin + Send + 'static,
        W: tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let dir: Arc<dyn Directory> = Arc::new(View(self.weak()));
        service::serve(reader, writer, self.replicas.store.clone(), dir).await;
    }

    pub(crate) fn range_dir_of(&self, image: &MetadataImage, range: RangeId) -> Option<PathBuf> {
        let r = image.ranges.get(&range)?;
        let topic = image.topics.get(&r.topic_id)?;
        Some(self.range_dir(topic, range))
    }

    /// acks=-1 needs `min.insync.replicas` in-sync replicas of the range's
    /// active segment (the primary counts; without followers it is alone).
    pub(crate) fn check_in_sync(&self, route: &PartitionRoute) -> Result<(), ApiError> {
        let required = route.config.min_insync_replicas;
        if required <= 1 {
            return Ok(());
        }
        let in_sync = self
            .replicas
            .shipping
            .lock()
            .get(&route.range_id)
            .map_or(1, |r| r.in_sync().len());
        if in_sync < required {
            return Err(ApiError::NotEnoughReplicas { in_sync, required });
        }
        Ok(())
    }

    /// Starts shipping `log` to the followers of `segment` (its active
    /// segment, this broker its primary), replacing a replication of an
    /// older log of the range.
    /// `min_insync` is the topic's `min.insync.replicas` now.
    pub(super) fn ship(
        &self,
        range: RangeId,
        log: &Arc<RangeLog>,
        segment: &SegmentImage,
        min_insync: usize,
    ) {
        let mut shipping = self.replicas.shipping.lock();
        let followers: Vec<i32> = segment.replicas[1..].to_vec();
        let peers: Arc<dyn PeerAddresses> = Arc::new(View(self.weak()));
        if let Some(r) = shipping.get(&range) {
            let same_log = Arc::ptr_eq(r.log(), log);
            if same_log && r.followers() == followers.as_slice() {
                r.set_min_insync(min_insync);
                return;
            }
            if same_log && !followers.is_empty() {
                // A roll placed the next segment on another set.
                let next = r.continue_on(FollowerSet::new(followers, segment.id.seq), peers);
                next.set_min_insync(min_insync);
                shipping.insert(range, next);
                return;
            }
            r.stop();
        }
        if followers.is_empty() {
            shipping.remove(&range);
            return;
        }
        shipping.insert(
            range,
            Replication::start(
                log.clone(),
                range,
                self.config.node_id,
                FollowerSet::new(followers, segment.id.seq),
                peers,
                min_insync,
                Duration::from_millis(self.config.replica_lag_time_max_ms),
            ),
        );
    }

    /// Partitions of the ranges this broker ships whose followers are not
    /// all in sync (Kafka's `UnderReplicatedPartitions`).
    pub fn under_replicated_partitions(&self) -> u64 {
        self.replicas
            .shipping
            .lock()
            .values()
            .filter(|r| r.in_sync().len() < r.followers().len() + 1)
            .map(|r| {
                let log = r.log();
                u64::from(log.hi() - log.lo())
            })
            .sum()
    }

    /// The followers of ranges this broker ships that have been out of
    /// sync longer than `replica.lag.time.max.ms` (by active segment, as
    /// the image names it; a stream this broker no longer ships is left
    /// out).
    pub(super) fn out_of_sync_followers(
        &self,
        image: &MetadataImage,
    ) -> std::collections::BTreeSet<(SegmentId, i32)> {
        let mut out = std::collections::BTreeSet::new();
        for (seg, r) in self.shipped_to_image_followers(image) {
            for (f, behind) in r.out_of_sync_for() {
                tracing::debug!(
                    range = seg.id.range,
                    follower = f,
                    behind_ms = behind.as_millis() as u64,
                    "follower out of sync"
                );
                out.insert((seg.id, f));
            }
        }
        out
    }

    /// The active segments this broker leads and ships to the followers the
    /// image names (whose in-sync replicas it reports).
    pub(super) fn shipped_segments(
        &self,
        image: &MetadataImage,
    ) -> std::collections::BTreeSet<SegmentId> {
        self.shipped_to_image_followers(image)
            .into_iter()
            .map(|(seg, _)| seg.id)
            .collect()
    }

    /// The ranges this broker ships whose active segment, in `image`, it
    /// leads with the followers it ships to (a stream the image moved past
    /// is left out).
    fn shipped_to_image_followers(
        &self,
        image: &MetadataImage,
    ) -> Vec<(Arc<tessera_metadata::SegmentImage>, Arc<Replication>)> {
        let me = self.config.node_id;
        self.replicas
            .shipping
            .lock()
            .iter()
            .filter_map(|(range, r)| {
                let seg = image.active_segment(*range)?;
                (seg.primary() == Some(me) && seg.replicas[1..] == *r.followers())
                    .then(|| (seg, r.clone()))
            })
            .collect()
    }

    /// The followers of `range` this broker ships to that have been out of
    /// sync longer than `replica.lag.time.max.ms` (none when it ships
    /// nothing).
    pub(super) fn out_of_sync_of(&self, range: RangeId) -> Vec<i32> {
        self.replicas
            .shipping
            .lock()
            .get(&range)
            .map(|r| r.out_of_sync_for().into_iter().map(|(f, _)| f).collect())
            .unwrap_or_default()
    }

    /// Stops shipping a range (its log closed, or leadership moved).
    pub(super) fn stop_shipping(&self, range: RangeId) {
        if let Some(r) = self.replicas.shipping.lock().remove(&range) {
            r.stop();
        }
    }

    /// Retention deleted the segments of `range` below `first` (the oldest
    /// one the image still has): drop them from the open log, or delete
    /// the follower copies (and producer snapshots) left in its directory.
    pub(super) fn drop_deleted_segments(
        &self,
        image: &MetadataImage,
        range: RangeId,
        first: u32,
    ) -> anyhow::Result<()> {
        if first == 0 {
            return Ok(());
        }
        if let Some(log) = self.log_of(range) {
            let removed = log.delete_segments_below(first)?;
            if !removed.is_empty() {
                tracing::info!(range, segments = ?removed, "retention: deleted segment files");
            }
            return Ok(());
        }
        let Some(dir) = self.range_dir_of(image, range) else {
            return Ok(());
        };
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Ok(());
        };
        let mut old = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            let Some((stem, ext)) = name.split_once('.') else {
                continue;
            };
            match (stem.parse::<u32>(), ext) {
                (Ok(seq), "log") if seq < first => old.push(seq),
                (Ok(seq), "snapshot" | "aborted" | "log.replaced" | "idx.replaced")
                    if seq < first =>
                {
                    std::fs::remove_file(entry.path())?;
                }
                _ => {}
            }
        }
        for seq in old {
            self.replicas
                .store
                .discard(key(SegmentId::new(range, seq)), &dir)?;
            self.replicas
                .sealed_copies
                .lock()
                .remove(&SegmentId::new(range, seq));
            tracing::info!(range, seq, "retention: deleted a follower copy");
        }
        Ok(())
    }

    /// Applies committed seals to this broker's follower copies: cut what
    /// is past the seal, repair what is short (from another replica).
    pub(super) fn apply_seals(&self, image: &MetadataImage, range: RangeId) -> anyhow::Result<()> {
        let me = self.config.node_id;
        for seg in image.segments_of(range) {
            let Some(info) = &seg.sealed else { continue };
            if self.replicas.sealed_copies.lock().contains(&seg.id) {
                continue;
            }
            let Some(dir) = self.range_dir_of(image, range) else {
                continue;
            };
            if !seg.replicas.contains(&me) {
                // Healing moved this copy elsewhere while this broker was
                // gone: what is left here (possibly longer than the seal,
                // never truncated) is not read as the segment, and is
                // deleted once every listed replica holds all of it (the
                // new copies may still be repairing, or never get there:
                // deleting at once lost a cleaned segment of
                // __consumer_offsets in fault run seed 9).
                let in_log = self
                    .log_of(range)
                    .is_some_and(|l| l.holds_sealed(seg.id.seq));
                if in_log {
                    continue;
                }
                if self.replicas.store.set_aside(key(seg.id), &dir)? {
                    tracing::info!(segment = %seg.id, replicas = ?seg.replicas, "set aside a copy no longer in the segment's replica set (deleted once the listed replicas hold the segment)");
                }
                if !ReplicaStore::has_set_aside(key(seg.id), &dir) {
                    continue;
                }
                if self
                    .replicas
                    .foreign_checked
                    .lock()
                    .insert((seg.id, seg.replicas.clone()))
                {
                    tokio::spawn(discard_once_replicated(self.weak(), seg.clone(), dir));
                }
                continue;
            }
            if self.replicas.store.restore(key(seg.id), &dir)? {
                tracing::info!(segment = %seg.id, "the replica set lists this broker again: its copy set aside is back");
            }
            if seg.replicas == [me] {
                // The only copy is this broker's own log segment: no peer
                // to repair it from or cut it to, and its size may differ
                // from the seal's once the log cleaner compacted it.
                self.replicas.sealed_copies.lock().insert(seg.id);
                continue;
            }
            if !tessera_log::segment::log_path(&dir, seg.id.seq).exists()
                && self.replicas.store.get(key(seg.id)).is_none()
                && seg.primary() == Some(me)
            {
                // Our own roll, in a log since deleted or never ours: nothing here.
                self.replicas.sealed_copies.lock().insert(seg.id);
                continue;
            }
            if self
                .log_of(range)
                .is_some_and(|l| l.holds_sealed(seg.id.seq))
            {
                self.replicas.sealed_copies.lock().insert(seg.id);
                continue;
            }
            if self
                .log_of(range)
                .is_some_and(|l| l.holds_segment(seg.id.seq))
            {
                // The open log still writes this file: a copy opened on it
                // would be a second writer appending to the same file. The
                // log is closed as lost (its active segment sealed under
                // it), and the next pass takes the file as a copy.
                continue;
            }
            if self.clean_pass_pending(&dir, &seg) {
                // The image's size is the cleaned one: the copy is compared
                // with it once the pass is applied here (clean_passes.rs).
                continue;
            }
            if let Some(cleaned) = info.cleaned {
                // A copy of a cleaned segment is the image's bytes or not
                // at all: one left from before a pass this broker missed
                // (it was not a replica of the segment then, and the pass
                // marker of the range moved on) would be cut to the
                // cleaned size, or repaired with the cleaned bytes, and be
                // neither. Compared once: the seal is then applied.
                let path = tessera_log::segment::log_path(&dir, seg.id.seq);
                let size = std::fs::metadata(&path).map_or(0, |m| m.len());
                if size >= info.size_bytes
                    && !self.replicas.repairing.lock().contains(&seg.id)
                    && tessera_log::clean_pass::file_digest(&path).ok()
                        != Some((info.size_bytes, cleaned.crc32c))
                {
                    self.refetch_copy(&dir, &seg, false)?;
                }
            }
            let copy = self.replicas.store.copy(key(seg.id), &dir)?;
            let action = copy.lock().seal(info.size_bytes)?;
            match action {
                SealAction::Complete | SealAction::Truncate { .. } => {
                    if let SealAction::Truncate { size } = action {
                        tracing::info!(segment = %seg.id, size, "truncated a replica past its sealed length");
                        // The producer state where the next segment starts,
                        // if this broker wrote one, was taken at the longer
                        // end (its own roll before a crash: a closed log's
                        // is dropped by `discard_leftovers`): it counts
                        // batches the log does not hold, and served to a
                        // new leader it refuses the producers' retries of
                        // them (OUT_OF_ORDER_SEQUENCE_NUMBER, seed 8) or
                        // answers them as duplicates. Fetched again from a
                        // replica whose copy ended at the seal.
                        let next = seg.id.seq + 1;
                        if !self.log_of(range).is_some_and(|l| l.holds_segment(next)) {
                            super::lost_log::remove_start_files(&dir, next)?;
                        }
                    }
                    self.replicas.sealed_copies.lock().insert(seg.id);
                }
                SealAction::Repair { from, size } => {
                    if self.replicas.repairing.lock().insert(seg.id) {
                        tracing::info!(segment = %seg.id, from, size, "repairing a short replica");
                        tokio::spawn(repair(self.weak(), seg.clone()));
                    }
                }
            }
        }
        Ok(())
    }

    /// If this broker follows `segment` (a range's active segment) and its
    /// own copies do not rebuild the range's producer state (the run of
    /// segments it holds starts after the range's first, and no snapshot is
    /// where a segment of that run starts), fetches the producer snapshot
    /// where that run starts from a replica that has it, unless already
    /// being fetched. Without it, this broker leading the range later would
    /// not know the idempotent producers and open transactions of the
    /// history it does not hold. The run's start, not the active segment's:
    /// a follower that joined at segment K and first looked after K rolled
    /// holds K's copy and needs `<K>.snapshot` all the same (seed 15).
    pub(super) fn fetch_producer_snapshot(&self, image: &MetadataImage, segment: &SegmentImage) {
        let me = self.config.node_id;
        if segment.is_sealed()
            || !segment.replicas[1..].contains(&me)
            || !self.config.replica_producer_snapshot_prefetch_enable
        {
            return;
        }
        let Some(dir) = self.range_dir_of(image, segment.id.range) else {
            return;
        };
        // The common case, one stat: the snapshot where the active segment
        // starts is here.
        if snapshot_path(&dir, segment.id.seq).exists() {
            return;
        }
        let Ok(Some(seq)) = self.snapshot_missing(image, segment, &dir) else {
            return;
        };
        let id = SegmentId::new(segment.id.range, seq);
        if self.replicas.snapshots.lock().running.insert(id) {
            tokio::spawn(fetch_snapshot(self.weak(), id));
        }
    }

    /// The producer snapshot (`<K>.snapshot`) this broker lacks to rebuild
    /// the producer state of `active`'s range from what it holds in `dir`
    /// (see [`snapshot_transfer::snapshot_needed_to_lead`]); `None` when
    /// its own segments and snapshots do.
    fn snapshot_missing(
        &self,
        image: &MetadataImage,
        active: &SegmentImage,
        dir: &std::path::Path,
    ) -> anyhow::Result<Option<u32>> {
        let range = active.id.range;
        let mut local = tessera_log::range_log::local_segment_seqs(dir)?;
        // Segments sealed empty hold no history: held, as far as the
        // producer state goes, wherever their files are.
        local.extend(
            image
                .segments_of(range)
                .iter()
                .filter(|s| s.is_sealed_empty())
                .map(|s| s.id.seq),
        );
        local.push(active.id.seq);
        local.sort_unstable();
        local.dedup();
        let first = image
            .segments_of(range)
            .first()
            .map_or(active.id.seq, |s| s.id.seq);
        let ancestors_elsewhere = self.ancestors_elsewhere_of(image, range);
        Ok(snapshot_transfer::snapshot_needed_to_lead(
            first,
            &local,
            ancestors_elsewhere,
            |seq| snapshot_path(dir, seq).exists(),
        ))
    }

    /// Whether this broker may open `range` as the primary of its active
    /// segment `active` now: its producer state must not miss the history
    /// it does not hold (see [`snapshot_transfer::snapshot_needed_to_lead`]).
    /// When `<K>.snapshot` is missing, one bounded attempt fetches it from
    /// a live replica that has it (within what is left of the pass's
    /// `budget`); failing that the range waits (produce gets
    /// NOT_LEADER_OR_FOLLOWER, as the log is not open), a task keeps
    /// fetching and requests a reconcile pass once it has it.
    pub(super) async fn producer_state_to_lead(
        &self,
        image: &MetadataImage,
        active: &SegmentImage,
        dir: &std::path::Path,
        budget: &mut Duration,
    ) -> anyhow::Result<bool> {
        let range = active.id.range;
        let Some(seq) = self.snapshot_missing(image, active, dir)? else {
            self.replicas.snapshots.lock().awaiting.remove(&range);
            return Ok(true);
        };
        let id = SegmentId::new(range, seq);
        {
            let mut fetches = self.replicas.snapshots.lock();
            if fetches.running.contains(&id) {
                // A task is on it (it sees this range waiting, under the
                // same lock, before it ends).
                if fetches.awaiting.insert(range, seq) != Some(seq) {
                    drop(fetches);
                    self.start_waiting(id);
                }
                return Ok(false);
            }
            fetches.running.insert(id);
        }
        let live = |b: &i32| image.brokers.get(b).is_some_and(|b| !b.fenced);
        let attempt = fetch_snapshot_once(
            self.weak(),
            image,
            id,
            dir,
            LEAD_SNAPSHOT_CALL_TIMEOUT,
            &live,
        );
        let started = std::time::Instant::now();
        let fetched = tokio::time::timeout(LEAD_SNAPSHOT_BUDGET.min(*budget), attempt).await;
        *budget = budget.saturating_sub(started.elapsed());
        if let Ok(Some(peer)) = fetched {
            tracing::info!(segment = %id, from = peer, "fetched the producer snapshot of the history held elsewhere before leading the range");
            let mut fetches = self.replicas.snapshots.lock();
            fetches.running.remove(&id);
            fetches.awaiting.remove(&range);
            return Ok(true);
        }
        let new = self.replicas.snapshots.lock().awaiting.insert(range, seq) != Some(seq);
        if new {
            self.start_waiting(id);
        }
        // The task owns the fetch slot taken above.
        tokio::spawn(fetch_snapshot(self.weak(), id));
        Ok(false)
    }

    /// Whether this broker, primary of `range`'s active segment in
    /// `image`, is to open the range (it has not yet).
    fn leads_next(&self, image: &MetadataImage, range: RangeId) -> bool {
        image
            .active_segment(range)
            .is_some_and(|s| s.primary() == Some(self.config.node_id))
            && self.log_of(range).is_none()
    }

    /// Whether every sealed segment of `range` this broker keeps a copy of
    /// in `dir` is complete here (its seal applied: cut, or repaired to the
    /// sealed size, and at the image's cleaning pass). A broker leads a
    /// range only with every byte of the history it claims: a short copy
    /// opened as the log's history would serve the next segment's batches
    /// for the offsets of its missing tail, and rebuild producer state
    /// without them. The copies that are not complete yet are being
    /// repaired (or cleaned); the pass that finishes them reconciles again.
    pub(super) fn history_complete_to_lead(
        &self,
        image: &MetadataImage,
        range: RangeId,
        dir: &std::path::Path,
    ) -> anyhow::Result<bool> {
        let me = self.config.node_id;
        let complete = self.replicas.sealed_copies.lock();
        let short = tessera_replication::short_copies(
            tessera_log::range_log::local_segment_seqs(dir)?,
            |seq| {
                image
                    .segments
                    .get(&SegmentId::new(range, seq))
                    .is_some_and(|s| s.is_sealed() && s.replicas.contains(&me))
            },
            |seq| complete.contains(&SegmentId::new(range, seq)),
        );
        drop(complete);
        if short.is_empty() {
            self.replicas.awaiting_history.lock().remove(&range);
            return Ok(true);
        }
        if self.replicas.awaiting_history.lock().insert(range) {
            crate::metrics::Metrics::add(&self.metrics.history_repair_waits, 1);
            tracing::warn!(range, segments = ?short, "not leading the range yet: copies of its sealed segments here are incomplete (repairing them first; produce answers NOT_LEADER_OR_FOLLOWER meanwhile)");
        }
        Ok(false)
    }

    /// Hands `range` on when this broker is the primary of its active
    /// segment, has not opened it, and no replica serves the producer
    /// snapshot it needs: perhaps none has it (the segment where its local
    /// history starts was never opened by its primary), while another
    /// replica holds the history and can lead. The active segment, empty
    /// (nothing was appended: the log never opened), is sealed by quorum
    /// avoiding this broker as the next primary. Found by the simulation
    /// (`replication/tests/simulation.rs`, resignations).
    fn resign_unopened_range(&self, image: &MetadataImage, range: RangeId) {
        let me = self.config.node_id;
        let Some(active) = image.active_segment(range) else {
            return;
        };
        let others_live = active.replicas[1..]
            .iter()
            .any(|r| image.brokers.get(r).is_some_and(|b| !b.fenced));
        if active.primary() == Some(me) && self.log_of(range).is_none() && others_live {
            tracing::warn!(segment = %active.id, "handing the range to another replica: this broker cannot rebuild its producer state");
            crate::metrics::Metrics::add(&self.metrics.producer_snapshot_resignations, 1);
            // One attempt: while the others are away it cannot complete,
            // and the next resignation (or a snapshot served meanwhile)
            // decides again from the image of then.
            if self.replicas.sealing.lock().insert(active.id) {
                let broker = self.weak();
                let segment = active.clone();
                tokio::spawn(async move {
                    let Some(b) = broker.upgrade() else { return };
                    let purpose = SealFor::Failover { avoid: Some(me) };
                    if let Err(e) = b.try_seal(&b.image(), &segment, &purpose).await {
                        tracing::info!(segment = %segment.id, error = %e, "handing the range on did not complete");
                    }
                    b.replicas.sealing.lock().remove(&segment.id);
                });
            }
        }
    }

    /// A range starts waiting for the producer snapshot at `id`.
    fn start_waiting(&self, id: SegmentId) {
        crate::metrics::Metrics::add(&self.metrics.producer_snapshot_waits, 1);
        tracing::warn!(segment = %id, "not leading the range yet: no replica served the producer snapshot of the history before this segment (produce answers NOT_LEADER_OR_FOLLOWER until it is here)");
    }

    /// Forgets the waits of ranges this broker no longer is to lead, or
    /// leads now.
    pub(super) fn retain_lead_waits(&self, image: &MetadataImage) {
        let me = self.config.node_id;
        let open: HashSet<RangeId> = self.logs.read().keys().copied().collect();
        self.replicas.snapshots.lock().awaiting.retain(|range, _| {
            !open.contains(range)
                && image
                    .active_segment(*range)
                    .is_some_and(|s| s.primary() == Some(me))
        });
    }

    /// Reserves `bytes` of the copying budget; returns when they may have
    /// been copied at `replica.heal.max.bytes.per.sec`.
    fn copy_pace(&self, bytes: usize) -> std::time::Instant {
        let rate = self.config.replica_heal_max_bytes_per_sec.max(1) as f64;
        let cost = Duration::from_secs_f64(bytes as f64 / rate);
        let now = std::time::Instant::now();
        let mut next = self.replicas.copy_pace.lock();
        let done = next.map_or(now, |n| n.max(now)) + cost;
        *next = Some(done);
        done
    }

    /// Starts a seal-by-quorum of `segment` unless one is running.
    pub(crate) fn seal_by_quorum(&self, segment: SegmentId) {
        self.seal_by_quorum_avoiding(segment, None);
    }

    /// Like [`Broker::seal_by_quorum`], preferring any replica but `avoid`
    /// as the next primary when their copies end at the same place (a
    /// controlled shutdown moves leadership off the broker that stops).
    pub(crate) fn seal_by_quorum_avoiding(&self, segment: SegmentId, avoid: Option<i32>) {
        if self.replicas.sealing.lock().insert(segment) {
            tokio::spawn(seal_task(self.weak(), segment, SealFor::Failover { avoid }));
        }
    }

    /// Re-places a range at a segment boundary (planned by
    /// `tessera_planner::plan_replacements`): its active segment is sealed
    /// by quorum, preferring the primary as the holder, and the next one
    /// opens on the planned replicas. False if a seal of that segment is
    /// already running.
    pub(crate) fn replace_segment(&self, plan: tessera_planner::Replacement) -> bool {
        let segment = plan.segment;
        if !self.replicas.sealing.lock().insert(segment) {
            return false;
        }
        tokio::spawn(seal_task(self.weak(), segment, SealFor::Replace(plan)));
        true
    }

    /// Hands a range's leadership to a follower of its active segment
    /// (planned by `tessera_planner::plan_leader_moves`): the primary is
    /// fenced first, the follower gets a moment to catch up to its end,
    /// then the others are fenced and, among equal ends, the follower is
    /// the holder that leads the next segment. If it still lags, the seal
    /// is an ordinary one (the holder leads). False if a seal of that
    /// segment is already running.
    /// An unreplicated range has no follower to hand to: it moves whole
    /// (`Replacement::primary_move`, its history read remotely).
    pub(crate) fn move_leader(&self, plan: tessera_planner::LeaderMove) -> bool {
        let segment = plan.segment;
        if let Some(whole) = plan.as_primary_move(&self.image()) {
            return self.replace_segment(whole);
        }
        if !self.replicas.sealing.lock().insert(segment) {
            return false;
        }
        tokio::spawn(seal_task(self.weak(), segment, SealFor::MoveLeader(plan)));
        true
    }

    /// Seals by quorum running on this broker (failovers, moves).
    pub(crate) fn seals_in_flight(&self) -> usize {
        self.replicas.sealing.lock().len()
    }

    /// The ranges this broker ships to followers, with their logs.
    pub(super) fn shipped_logs(&self) -> Vec<(RangeId, Arc<RangeLog>)> {
        self.replicas
            .shipping
            .lock()
            .iter()
            .map(|(id, r)| (*id, r.log().clone()))
            .collect()
    }
}

/// Writes repaired frames to a copy (its lock is not held across awaits).
fn write_repair(
    copy: &Mutex<tessera_replication::replica_store::ReplicaCopy>,
    position: u64,
    frames: &[u8],
) -> Result<bool, tessera_log::LogError> {
    copy.lock().repair(position, frames)
}

/// How long a copy healing replaced waits before asking the listed
/// replicas again whether they hold the segment.
const FOREIGN_RECHECK: Duration = Duration::from_secs(10);

/// Deletes this broker's copy of `seg`, which its replica set no longer
/// lists, once every listed replica answers that it holds a complete copy
/// at the image's cleaning pass; otherwise keeps it and lets a later
/// reconcile pass ask again.
async fn discard_once_replicated(broker: Weak<Broker>, seg: Arc<SegmentImage>, dir: PathBuf) {
    let Some(b) = broker.upgrade() else { return };
    let me = b.config.node_id;
    let Some(sealed) = &seg.sealed else { return };
    let ask = Message::ReadCopyState {
        segment: key(seg.id),
        pass: seg.clean_pass(),
        epoch: seg.leader_epoch,
        size: sealed.size_bytes,
    };
    let mut lacking = Vec::new();
    for &peer in seg.replicas.iter().filter(|r| **r != me) {
        let holds = match View(broker.clone()).address_of(peer) {
            Some(addr) => matches!(
                service::call(&*b.inter_broker, &addr, &ask, CALL_TIMEOUT).await,
                Ok(Message::CopyState { complete: true, .. })
            ),
            None => false,
        };
        if !holds {
            lacking.push(peer);
        }
    }
    let image = b.image();
    let unchanged = image
        .segments
        .get(&seg.id)
        .is_some_and(|now| now.replicas == seg.replicas && now.clean_pass() == seg.clean_pass());
    if unchanged && !lacking.is_empty() && set_aside_copy_complete(&seg, &dir) {
        // No listed replica has the segment and this broker does: it takes
        // a listed place again (the others then repair from it).
        if let Some(record) = tessera_planner::reinstate_copy(&image, seg.id, me, &lacking) {
            tracing::warn!(segment = %seg.id, ?lacking, "no listed replica holds the segment: this broker's copy, set aside by healing, is listed again");
            if let Err(e) = b.controller.write(vec![record]).await {
                tracing::warn!(segment = %seg.id, error = %e, "could not list this broker's copy again");
            }
        }
    }
    if lacking.is_empty() && unchanged {
        match ReplicaStore::discard_set_aside(key(seg.id), &dir) {
            Ok(true) => {
                tracing::info!(segment = %seg.id, replicas = ?seg.replicas, "deleted a copy no longer in the segment's replica set (every replica holds it)")
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(segment = %seg.id, error = %e, "could not delete a copy no longer in the segment's replica set")
            }
        }
        return;
    }
    drop(b);
    tracing::debug!(segment = %seg.id, "keeping a copy no longer in the segment's replica set: not every replica holds the segment yet");
    tokio::time::sleep(FOREIGN_RECHECK).await;
    if let Some(b) = broker.upgrade() {
        b.replicas
            .foreign_checked
            .lock()
            .remove(&(seg.id, seg.replicas.clone()));
        b.request_reconcile();
    }
}

/// Whether the copy of `seg` set aside in `dir` holds the whole segment as
/// the image records it: every byte up to the seal (an uncleaned copy
/// longer than the seal is cut to it when listed again), or the cleaned
/// bytes themselves (size and CRC) for a segment a cleaning pass rewrote.
fn set_aside_copy_complete(seg: &SegmentImage, dir: &std::path::Path) -> bool {
    let Some(sealed) = &seg.sealed else {
        return false;
    };
    let path = ReplicaStore::set_aside_path(key(seg.id), dir);
    match sealed.cleaned {
        None => std::fs::metadata(&path).is_ok_and(|m| m.len() >= sealed.size_bytes),
        Some(cleaned) => {
            tessera_log::clean_pass::file_digest(&path).ok()
                == Some((sealed.size_bytes, cleaned.crc32c))
        }
    }
}

/// Copies the missing tail of a sealed segment from another replica, as
/// of the segment's cleaning pass in the image.
async fn repair(broker: Weak<Broker>, seg: Arc<SegmentImage>) {
    let pass = seg.clean_pass();
    let done = loop {
        let Some(b) = broker.upgrade() else { return };
        let image = b.image();
        let Some(now) = image.segments.get(&seg.id) else {
            break true; // deleted meanwhile
        };
        if now.clean_pass() != pass {
            // A pass rewrote the segment meanwhile: what was copied so far
            // is of the old bytes. Start over at the new pass.
            if let Some(dir) = b.range_dir_of(&image, seg.id.range) {
                if let Err(e) = b.replicas.store.discard(key(seg.id), &dir) {
                    tracing::warn!(segment = %seg.id, error = %e, "could not drop a stale partial copy");
                }
            }
            break false;
        }
        let Some(copy) = b.replicas.store.get(key(seg.id)) else {
            // The copy was closed or replaced under the repair (a cleaning
            // pass swapped its file): not repaired; the next reconcile pass
            // applies the seal to what is on disk and repairs again.
            break false;
        };
        let (written, size) = {
            let c = copy.lock();
            let s = c.state();
            (s.written, s.sealed_size.unwrap_or(0))
        };
        if written >= size {
            break true;
        }
        let mut progressed = false;
        let (mut restart, mut mismatched) = (false, 0);
        for &peer in seg.replicas.iter().filter(|r| **r != b.config.node_id) {
            let Some(addr) = View(broker.clone()).address_of(peer) else {
                continue;
            };
            let read = Message::Read {
                segment: key(seg.id),
                from: written,
                max: service::MAX_READ_BYTES,
                pass,
                epoch: seg.leader_epoch,
            };
            match service::call(&*b.inter_broker, &addr, &read, CALL_TIMEOUT).await {
                Ok(Message::Data {
                    position, frames, ..
                }) if !frames.is_empty() => match write_repair(&copy, position, &frames) {
                    Ok(true) => {
                        progressed = true;
                        // A copy this broker needs to lead its range is
                        // copied at full speed: the range waits for it.
                        let pace = b.copy_pace(frames.len());
                        if !b.leads_next(&image, seg.id.range) {
                            tokio::time::sleep_until(pace.into()).await;
                        }
                        break;
                    }
                    Ok(false) => {}
                    Err(tessera_log::LogError::Batch(reason)) => {
                        // The peer's bytes do not continue this copy: one
                        // of the two is another history. Try the others.
                        tracing::debug!(segment = %seg.id, peer, %reason, "repair bytes do not continue this copy");
                        mismatched += 1;
                    }
                    Err(e) => tracing::warn!(segment = %seg.id, error = %e, "repair write failed"),
                },
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(segment = %seg.id, peer, error = %e, "repair read failed")
                }
            }
        }
        if !progressed && mismatched > 0 && written > 0 {
            // No peer's bytes continue this copy: its prefix is another
            // history (written before a cleaning pass this broker missed,
            // or by a zombie), while the image's bytes are on the peers.
            // Start the copy over; the next reconcile pass seals the empty
            // copy and repairs it from the start. (An empty copy no peer
            // continues has nothing to drop: a peer's copy is bad, and the
            // others are waited for.)
            tracing::warn!(segment = %seg.id, written, "no replica's bytes continue this copy; fetching it again from the start");
            if let Some(dir) = b.range_dir_of(&image, seg.id.range) {
                if let Err(e) = b.refetch_copy(&dir, &seg, false) {
                    tracing::warn!(segment = %seg.id, error = %e, "could not drop the copy");
                }
            }
            restart = true;
        }
        drop(b);
        if restart {
            break false;
        }
        if !progressed {
            tokio::time::sleep(RETRY).await;
        }
    };
    if let Some(b) = broker.upgrade() {
        b.replicas.repairing.lock().remove(&seg.id);
        if done {
            b.replicas.sealed_copies.lock().insert(seg.id);
            tracing::info!(segment = %seg.id, "replica repaired");
        }
        // A range waiting for this copy to lead, or the copy left for the
        // next pass to repair again.
        b.request_reconcile();
    }
}

/// Fetches the producer snapshot of `id` (see
/// [`Broker::fetch_producer_snapshot`] and [`Broker::producer_state_to_lead`])
/// until it is here or this broker neither follows the segment as active
/// nor waits for it to lead the range. Holds the segment's fetch slot.
async fn fetch_snapshot(broker: Weak<Broker>, id: SegmentId) {
    let mut attempts = 0u32;
    loop {
        let Some(b) = broker.upgrade() else { return };
        let image = b.image();
        let me = b.config.node_id;
        let dir = b.range_dir_of(&image, id.range);
        let done = dir
            .as_ref()
            .is_some_and(|dir| snapshot_path(dir, id.seq).exists());
        // Still following the range and still lacking this snapshot (not
        // some other one: copies repaired or retention moved the run).
        let following = image.active_segment(id.range).is_some_and(|active| {
            !active.is_sealed()
                && active.replicas[1..].contains(&me)
                && dir.as_ref().is_some_and(|dir| {
                    b.snapshot_missing(&image, &active, dir).ok().flatten() == Some(id.seq)
                })
        });
        {
            let mut fetches = b.replicas.snapshots.lock();
            let awaited = fetches.awaiting.get(&id.range) == Some(&id.seq);
            if done || dir.is_none() || !(following || awaited) {
                fetches.running.remove(&id);
                drop(fetches);
                if done && awaited {
                    b.request_reconcile();
                } else if !done {
                    tracing::info!(segment = %id, attempts, "no longer following or leading the segment's range; producer snapshot not fetched");
                }
                return;
            }
        }
        let Some(dir) = dir else { return };
        attempts += 1;
        match fetch_snapshot_once(broker.clone(), &image, id, &dir, CALL_TIMEOUT, &|_| true).await {
            Some(peer) => {
                tracing::info!(segment = %id, from = peer, "fetched the producer snapshot where the segment starts");
                // The next turn ends the task (and reconciles if a range waits).
                continue;
            }
            None if attempts.is_multiple_of(20) => {
                tracing::warn!(segment = %id, attempts, "no replica served the producer snapshot yet");
                if attempts.is_multiple_of(RESIGN_AFTER_ATTEMPTS) {
                    b.resign_unopened_range(&image, id.range);
                }
            }
            None => {}
        }
        drop(b);
        tokio::time::sleep(RETRY).await;
    }
}

/// One round of asking the replicas of `id` and of the segment before it
/// (those `ask` allows) for `<id.seq>.snapshot`, kept in `dir` on success.
/// The broker that served it.
async fn fetch_snapshot_once(
    broker: Weak<Broker>,
    image: &MetadataImage,
    id: SegmentId,
    dir: &std::path::Path,
    timeout: Duration,
    ask: &(dyn Fn(&i32) -> bool + Sync),
) -> Option<i32> {
    let replicas_of = |seq: u32| {
        image
            .segments
            .get(&SegmentId::new(id.range, seq))
            .map(|s| s.replicas.clone())
            .unwrap_or_default()
    };
    let previous = id.seq.checked_sub(1).map(replicas_of).unwrap_or_default();
    let node_id = broker.upgrade()?.config.node_id;
    // Where the segment starts, which the snapshot must have been taken at.
    let starts = image
        .ranges
        .get(&id.range)
        .map(|range| super::reconcile::segment_start_offsets(image, range, id.seq))
        .unwrap_or_default();
    let view = View(broker);
    for peer in snapshot_transfer::snapshot_sources(node_id, &replicas_of(id.seq), &previous) {
        if !ask(&peer) {
            continue;
        }
        let Some(addr) = view.address_of(peer) else {
            continue;
        };
        match snapshot_transfer::fetch(&*view.connector(), &addr, key(id), dir, &starts, timeout)
            .await
        {
            Ok(()) => return Some(peer),
            Err(ProtocolError::SnapshotNotAtStart) => {
                tracing::warn!(segment = %id, peer, "refused a producer snapshot taken at another offset than where the segment starts (a roll the image never recorded)")
            }
            Err(e) => {
                tracing::debug!(segment = %id, peer, error = %e, "producer snapshot fetch failed")
            }
        }
    }
    None
}

/// Why a segment is sealed by quorum.
#[derive(Clone, Debug)]
enum SealFor {
    /// Its primary is lost or stopping: the next segment opens on the
    /// holder of the end (preferring any replica but `avoid`).
    Failover { avoid: Option<i32> },
    /// Re-placement: the next segment opens on the planned replicas.
    Replace(tessera_planner::Replacement),
    /// Leadership balance: the planned follower leads the next segment.
    MoveLeader(tessera_planner::LeaderMove),
}

/// How long a leader move gives the follower, after the primary stopped
/// taking appends, to receive what the primary had shipped but it had not
/// acknowledged yet, before it is fenced too (a follower with the same end
/// as the primary leads next).
const LEADER_MOVE_CATCH_UP: Duration = Duration::from_millis(300);

/// Fences the replicas of `segment`, and once a quorum has reported, seals
/// it at the largest durable end among them and opens the next segment on
/// the replica holding that end (one metadata entry). Retried until the
/// image shows the segment sealed.
async fn seal_task(broker: Weak<Broker>, id: SegmentId, purpose: SealFor) {
    loop {
        let Some(b) = broker.upgrade() else { return };
        let image = b.image();
        let seg = match image.segments.get(&id) {
            Some(s) if !s.is_sealed() => s.clone(),
            _ => break,
        };
        match b.try_seal(&image, &seg, &purpose).await {
            Ok(()) => {}
            Err(e) => {
                tracing::info!(segment = %id, error = %e, "seal-by-quorum not done yet; retrying")
            }
        }
        drop(b);
        tokio::time::sleep(RETRY).await;
    }
    if let Some(b) = broker.upgrade() {
        b.replicas.sealing.lock().remove(&id);
    }
}

impl Broker {
    async fn try_seal(
        &self,
        image: &MetadataImage,
        seg: &SegmentImage,
        purpose: &SealFor,
    ) -> anyhow::Result<()> {
        let (avoid, prefer) = match purpose {
            SealFor::Failover { avoid } => (*avoid, None),
            SealFor::Replace(plan) => (None, plan.current.first().copied()),
            SealFor::MoveLeader(plan) => (None, Some(plan.to)),
        };
        // A leader move fences the primary first (no append lands after
        // this), then the others once the follower had time to catch up.
        let fence_first = match purpose {
            SealFor::MoveLeader(plan) if seg.primary() == Some(plan.from) => Some(plan.from),
            _ => None,
        };
        let me = self.config.node_id;
        let k = key(seg.id);
        let seg_epoch = seg.leader_epoch;
        let view = View(self.weak());
        let mut calls = tokio::task::JoinSet::new();
        let (first_fenced, first_fenced_rx) = tokio::sync::watch::channel(fence_first.is_none());
        let first_fenced = Arc::new(first_fenced);
        for &r in &seg.replicas {
            let addr = view.address_of(r);
            let store = self.replicas.store.clone();
            let view = View(self.weak());
            let connector = self.inter_broker.clone();
            let is_first = Some(r) == fence_first;
            let first_done = is_first.then(|| first_fenced.clone());
            let mut wait_first = first_fenced_rx.clone();
            calls.spawn(async move {
                if !is_first && !*wait_first.borrow() {
                    // The primary's answer (or its failure) first; then the
                    // catch-up moment. A primary that does not answer at
                    // all is waited for at most one call timeout.
                    let _ = tokio::time::timeout(CALL_TIMEOUT, wait_first.wait_for(|f| *f)).await;
                    tokio::time::sleep(LEADER_MOVE_CATCH_UP).await;
                }
                let reply = if r == me {
                    Ok(service::fence(k, seg_epoch, &store, &view))
                } else {
                    match addr {
                        Some(a) => service::call(
                            &*connector,
                            &a,
                            &Message::Fence {
                                segment: k,
                                epoch: seg_epoch,
                            },
                            CALL_TIMEOUT,
                        )
                        .await
                        .map_err(|e| e.to_string()),
                        None => Err("no address".into()),
                    }
                };
                if let Some(done) = first_done {
                    done.send_replace(true);
                }
                (r, reply)
            });
        }
        // Any quorum's largest end covers every committed byte, so a quorum
        // of answers is enough; the others get a moment more (a live
        // holder is better than a fenced one) but a dead replica's call
        // timing out does not hold the failover up.
        let quorum = tessera_replication::fence_quorum(seg.replicas.len());
        let mut replies = Vec::new();
        let mut answered = 0;
        let mut grace: Option<tokio::time::Instant> = None;
        loop {
            let next = match grace {
                Some(deadline) => {
                    match tokio::time::timeout_at(deadline, calls.join_next()).await {
                        Ok(next) => next,
                        Err(_) => break,
                    }
                }
                None => calls.join_next().await,
            };
            let Some(Ok((r, reply))) = next else {
                if next.is_none() {
                    break;
                }
                continue;
            };
            if matches!(reply, Ok(Message::Fenced { .. })) {
                answered += 1;
                if answered >= quorum && grace.is_none() {
                    grace = Some(tokio::time::Instant::now() + QUORUM_GRACE);
                }
            }
            replies.push((r, reply));
        }
        calls.abort_all();
        // Live brokers first, so that the next primary is one that is up;
        // then any but `avoid` (seal_point gives ties to the earliest).
        let fenced = |id: &i32| image.brokers.get(id).is_none_or(|b| b.fenced);
        let mut reports = Vec::new();
        let mut spans: HashMap<i32, Vec<(u32, i64, i64)>> = HashMap::new();
        for (r, reply) in replies {
            match reply {
                Ok(Message::Fenced { end, spans: s, .. }) => {
                    reports.push(FenceReport { replica: r, end });
                    spans.insert(r, s);
                }
                Ok(other) => {
                    tracing::debug!(segment = %seg.id, replica = r, ?other, "fence not answered")
                }
                Err(e) => {
                    tracing::debug!(segment = %seg.id, replica = r, error = %e, "fence failed")
                }
            }
        }
        reports.sort_by_key(|r| {
            (
                fenced(&r.replica),
                Some(r.replica) == avoid,
                prefer.is_some_and(|p| p != r.replica),
                r.replica != me,
            )
        });
        let Some(point) = seal_point(&reports, seg.replicas.len()) else {
            anyhow::bail!(
                "{} of {} replicas answered the fence",
                reports.len(),
                seg.replicas.len()
            );
        };
        let seal = tessera_planner::QuorumSeal {
            segment: seg.id,
            size_bytes: point.end,
            spans: spans
                .remove(&point.replica)
                .unwrap_or_default()
                .into_iter()
                .map(|(partition, start_offset, end_offset)| PartitionSpan {
                    partition,
                    start_offset,
                    end_offset,
                })
                .collect(),
            holder: point.replica,
        };
        let records = match purpose {
            SealFor::Failover { .. } | SealFor::MoveLeader(_) => {
                tessera_planner::seal_by_quorum(image, &seal)?
            }
            SealFor::Replace(plan) => tessera_planner::seal_and_replace(image, &seal, plan)?,
        };
        let next_replicas = records.iter().find_map(|r| match r {
            tessera_metadata::MetadataRecord::OpenSegment(o) => Some(o.replicas.clone()),
            _ => None,
        });
        tracing::info!(segment = %seg.id, size = point.end, next_primary = point.replica, ?next_replicas, "sealing by quorum");
        let outcome = self.controller.write_detailed(records).await?;
        if let SealFor::MoveLeader(plan) = purpose {
            if outcome.skipped.is_empty() && point.replica == plan.to {
                crate::metrics::Metrics::add(&self.metrics.leader_moves_done, 1);
                tracing::info!(segment = %seg.id, from = plan.from, to = plan.to, "leader move: the follower leads the range's next segment");
            } else {
                tracing::info!(segment = %seg.id, to = plan.to, holder = point.replica, "leader move: the follower did not hold the end; sealed as an ordinary seal");
            }
        }
        if let SealFor::Replace(plan) = purpose {
            if !outcome.skipped.is_empty() {
                tracing::info!(segment = %seg.id, "re-placement: lost a race with another seal of the segment");
            } else if next_replicas.as_ref() == Some(&plan.replicas) {
                crate::metrics::Metrics::add(&self.metrics.segments_replaced, 1);
                tracing::info!(
                    segment = %seg.id,
                    from = plan.from,
                    to = plan.to,
                    replicas = ?plan.replicas,
                    "re-placement: the range's next segment opened on the new replicas"
                );
            } else {
                tracing::info!(segment = %seg.id, "re-placement: the image moved on; sealed as a failover instead");
            }
        }
        Ok(())
    }
}
