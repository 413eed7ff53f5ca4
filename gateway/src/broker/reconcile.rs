//! Brokers follow the image they subscribe to. Every image the controller
//! publishes runs one reconcile pass (serialized; a failed pass is retried):
//!
//! 1. logs: open a log for every active range whose active segment this
//!    broker is primary of (a split or merge child seeded from its parents),
//!    keep sealed ranges open read-only for their history, seal a log whose
//!    range the image sealed, delete logs (and topic directories) the image
//!    no longer has, and record segment rolls a crash left unrecorded; a
//!    replicated range whose history before this broker's local segments
//!    is held elsewhere opens only once the producer snapshot where they
//!    start is here (fetched from a replica; until then the range is not
//!    led here, and the pass goes on with the others);
//! 2. coordinators: the group and transaction coordinators load the
//!    internal partitions (`__consumer_offsets`, `__transaction_state`) this
//!    broker now leads and drop those it no longer leads.
//!
//! A write that must be served by this broker before it is answered (a new
//! topic, a split) waits with [`Broker::await_reconciled`] for the pass that
//! covers its offset.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tessera_log::{RangeLog, RangeLogOptions, RangeSeed, SealedSegment};
use tessera_metadata::{
    MetadataImage, PartitionSpan, RangeId, RangeImage, SegmentId, SegmentSealRecord,
};
use tessera_replication::replica_store::ReplicaStore;
use tokio::sync::{mpsc, watch};

use super::Broker;
use crate::error::ApiError;
use crate::internal_topics::CONSUMER_OFFSETS;
use crate::topic_config::EffectiveTopicConfig;
use crate::txn::TRANSACTION_STATE;

/// How long a failed pass waits before it is tried again.
const RETRY_FAILED_PASS: Duration = Duration::from_secs(1);
/// A pass runs at least this often, whether or not the image moved: the
/// broker follows the state it finds, not only the events it is told of
/// (a seal-by-quorum whose sealer died after fencing a live primary leaves
/// no new entry behind, and the primary must notice its log is fenced).
const RECONCILE_AT_LEAST_EVERY: Duration = Duration::from_secs(2);

/// Where reconciliation stands.
#[derive(Default)]
pub(super) struct Reconciler {
    /// One pass at a time.
    pass: tokio::sync::Mutex<()>,
    /// The image offset the last pass covered, and its error if it failed.
    done: watch::Sender<Reconciled>,
    /// Internal partitions whose coordinator state is loaded here.
    led: parking_lot::Mutex<Led>,
    /// Set at shutdown: no pass runs after it.
    stopped: AtomicBool,
    /// Active segments this broker is primary of that another broker's
    /// seal-by-quorum fenced, whose entry the image does not show yet.
    fenced_unrecorded: parking_lot::Mutex<HashMap<SegmentId, std::time::Instant>>,
    /// A pass is wanted although the image did not move (a range waiting
    /// for its producer snapshot has it now): set, then `wake`.
    requested: AtomicBool,
    wake: Arc<tokio::sync::Notify>,
}

#[derive(Clone, Debug, Default)]
struct Reconciled {
    offset: i64,
    error: Option<String>,
}

#[derive(Default)]
struct Led {
    groups: BTreeMap<i32, Leadership>,
    txns: BTreeMap<i32, Leadership>,
}

/// The range and leader epoch an internal partition was led at when its
/// coordinator state was loaded (or last seen still led without a break).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Leadership {
    range: RangeId,
    epoch: i32,
}

impl Broker {
    /// One reconcile pass against the current image.
    pub(crate) async fn reconcile(&self) -> anyhow::Result<()> {
        let _pass = self.reconciler.pass.lock().await;
        if self.reconciler.stopped.load(Ordering::Acquire) {
            return Ok(());
        }
        let image = self.image();
        let mut result = self.reconcile_logs(&image).await;
        if result.is_ok() {
            result = self.reconcile_coordinators(&image).await;
        }
        self.reconciler.done.send_replace(Reconciled {
            offset: image.offset,
            error: result.as_ref().err().map(|e| format!("{e:#}")),
        });
        result
    }

    /// Waits until a reconcile pass covered image offset `offset` (the
    /// offset of a committed write). Its error, if that pass failed.
    pub(crate) async fn await_reconciled(&self, offset: i64) -> Result<(), ApiError> {
        let mut done = self.reconciler.done.subscribe();
        loop {
            {
                let r = done.borrow_and_update();
                if r.offset >= offset {
                    return match &r.error {
                        None => Ok(()),
                        Some(e) => Err(ApiError::Storage(e.clone())),
                    };
                }
            }
            if self.reconciler.stopped.load(Ordering::Acquire) {
                return Err(ApiError::Storage("the broker is shutting down".into()));
            }
            if done.changed().await.is_err() {
                return Err(ApiError::Storage("the broker is shutting down".into()));
            }
        }
    }

    /// Asks [`follow_images`] for a pass against the current image.
    pub(super) fn request_reconcile(&self) {
        self.reconciler.requested.store(true, Ordering::Release);
        self.reconciler.wake.notify_one();
    }

    /// No pass runs after this returns (the one running, if any, finished).
    pub(super) async fn stop_reconciling(&self) {
        self.reconciler.stopped.store(true, Ordering::Release);
        let _pass = self.reconciler.pass.lock().await;
        self.reconciler.done.send_modify(|_| {});
    }

    async fn reconcile_logs(&self, image: &MetadataImage) -> anyhow::Result<()> {
        let mut missing_records = Vec::new();
        // How long this pass may wait, over all ranges, for producer
        // snapshots of ranges it is to lead (see `producer_state_to_lead`).
        let mut snapshot_budget = super::replicas::LEAD_SNAPSHOT_PASS_BUDGET;
        let gone: Vec<RangeId> = self
            .logs
            .read()
            .keys()
            .filter(|id| !image.ranges.contains_key(id))
            .copied()
            .collect();
        for id in gone {
            if let Some(log) = self.logs.write().remove(&id) {
                log.delete()?;
            }
        }
        self.replicas
            .store
            .close_ranges_except(|range| image.ranges.contains_key(&range));
        // Topic directories no longer in the image (deleted while we were down).
        if let Ok(entries) = std::fs::read_dir(self.topics_dir()) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().to_string();
                let known = image
                    .topics
                    .values()
                    .any(|t| name == format!("{}-{}", t.name, t.id.simple()));
                if !known {
                    tracing::info!(dir = %entry.path().display(), "removing data of deleted topic");
                    std::fs::remove_dir_all(entry.path())?;
                }
            }
        }
        // Ranges in id order: a split or merge child always has a larger id
        // than its parents, so parents are open before their children seed
        // from them. Sealed ranges stay open read-only: they hold history.
        let me = self.config.node_id;
        for range in image.ranges.values() {
            let Some(topic) = image.topics.get(&range.topic_id) else {
                continue;
            };
            let segments = image.segments_of(range.id);
            let Some(last) = segments.last() else {
                continue;
            };
            // Segments retention deleted go first, before any log opens.
            self.drop_deleted_segments(image, range.id, segments[0].id.seq)?;
            // Files of its own rolls from before a restart whose numbers a
            // failover reused: not copies of the image's segments.
            self.discard_other_epoch_files(image, range.id, &self.range_dir(topic, range.id))?;
            // Copies of sealed segments this broker follows: cut or repair
            // them to the committed seal before any log opens on them.
            self.apply_seals(image, range.id)?;
            let primary_here = last.primary() == Some(me);
            // A follower without the older segments keeps the producer
            // state where its segment starts, in case it leads later.
            self.fetch_producer_snapshot(image, last);
            if let Some(log) = self.log_of(range.id) {
                if !range.active && !log.is_sealed() {
                    log.seal()?;
                }
                // A log opened at another leader epoch than the image's
                // active segment is a zombie's: leadership moved away (and
                // maybe back) while this broker was not looking.
                // So is one whose active segment the image has sealed under
                // it (every seal of a live log's segment fences the log first).
                let active_sealed_under_it = image
                    .segments
                    .get(&SegmentId::new(range.id, log.local_durable_end().0))
                    .is_some_and(|s| s.is_sealed());
                let lost = range.active
                    && (!primary_here
                        || log.is_sealed()
                        || log.leader_epoch() != last.leader_epoch
                        || active_sealed_under_it);
                if !lost {
                    if range.active {
                        // segment.bytes / segment.ms (or their broker
                        // synonyms) may have been altered since it opened.
                        let effective = EffectiveTopicConfig::resolve(
                            &topic.configs,
                            &crate::dynamic_config::BrokerView::new(&self.config, image),
                        );
                        log.set_roll_limits(effective.segment_bytes, effective.segment_ms);
                        log.set_recorded_active(last.id.seq);
                        self.ship(range.id, &log, last, effective.min_insync_replicas);
                    }
                    continue;
                }
                // Leadership moved (a failover, or this broker was fenced
                // and its segment sealed by a quorum): stop serving the old log.
                self.stop_shipping(range.id);
                log.close();
                if last.replicas.len() > 1 || topic.replication_factor > 1 {
                    // Before the log leaves `logs`: until then no stream
                    // takes this directory's files as copies.
                    self.discard_leftovers(image, range.id, &log)?;
                }
                self.logs.write().remove(&range.id);
                tracing::info!(range = range.id, primary = ?last.primary(), epoch = last.leader_epoch, "no longer primary of the range");
                // The copies the log held are checked against their seals
                // now, before anything reads them as this broker's copies.
                self.apply_seals(image, range.id)?;
                // (Only when the log's own newest segment is the image's
                // active one: once the image shows the next segment, the
                // seal is recorded and the range opens again at once.)
                let fenced_here_unrecorded = log.local_durable_end().0 == last.id.seq;
                if primary_here && !last.is_sealed() && log.is_sealed() && fenced_here_unrecorded {
                    // A seal-by-quorum fenced the active segment here (a
                    // re-placement keeping this broker primary, or a
                    // failover racing it) and its entry is not in this
                    // image yet. Its fencer records the seal; the files
                    // its fence left (the producer snapshot where the
                    // next segment starts) are what the next log opens
                    // on. Only if the seal never comes is it sealed here.
                    self.reconciler
                        .fenced_unrecorded
                        .lock()
                        .insert(last.id, std::time::Instant::now());
                    tokio::spawn(seal_if_still_fenced(self.weak(), last.id));
                }
            }
            if primary_here && !last.is_sealed() && self.log_of(range.id).is_none() {
                let waiting = self
                    .reconciler
                    .fenced_unrecorded
                    .lock()
                    .get(&last.id)
                    .is_some_and(|t| t.elapsed() < FENCED_SEAL_WAIT);
                if waiting {
                    continue;
                }
            }
            let dir = self.range_dir(topic, range.id);
            let replicated = last.replicas.len() > 1;
            // A topic with replicas keeps the replicated layout (every
            // boundary opens a new segment file; a restarted primary never
            // resumes one) also while its active set shrank to the
            // primary alone (its followers were fenced with no broker to
            // replace them): its segments are recorded per boundary.
            // So does an unreplicated range that moved
            // (`Replacement::primary_move`): some of its history is on
            // another broker, its producer state comes from the snapshot
            // where its local segments start, and a boundary must be
            // recorded before anything past it is acknowledged (a move
            // fences the primary at the image's active segment).
            let moved = segments.iter().any(|s| s.replicas != last.replicas);
            let replicated_layout = replicated || topic.replication_factor > 1 || moved;
            if replicated_layout && range.active {
                // Segments past the image's newest are rolls this broker
                // made as primary and never got recorded: followers refuse
                // a segment the image does not have, so nothing in them was
                // committed, and a stale file must not become a copy later.
                // "The image" is the newest one, not this pass's: a stream
                // takes a segment as soon as this broker's image records
                // it, which may be after this pass began (seed 11: a copy
                // removed under its stream, its acknowledged bytes gone).
                let newest = self
                    .image()
                    .segments_of(range.id)
                    .last()
                    .map_or(last.id.seq, |s| s.id.seq.max(last.id.seq));
                discard_unrecorded_segments(&dir, range.id, newest, &self.replicas.store)?;
            }
            if !primary_here {
                continue;
            }
            if self.replicas.cleaning.lock().contains(&range.id) && self.log_of(range.id).is_none()
            {
                // A cleaning pass rewrites this range's copies: the log
                // opens on them once it is done (it reconciles again).
                continue;
            }
            if range.active && replicated_layout {
                if last.is_sealed() {
                    continue;
                }
                if tessera_log::segment::log_path(&dir, last.id.seq).exists() {
                    // A primary that restarts never resumes its segment: its
                    // unsynced tail may be gone while followers acknowledged
                    // it. The segment is sealed by a quorum and the range
                    // reopens in a new one.
                    tracing::info!(segment = %last.id, "resuming a replicated segment: sealing it by quorum first");
                    self.seal_by_quorum(last.id);
                    continue;
                }
                // Without the history before its local segments, the
                // producer state comes from the snapshot where they start:
                // not served as primary until it is here (before the
                // active segment's file exists: that would read as a
                // segment to resume).
                if !self
                    .producer_state_to_lead(image, last, &dir, &mut snapshot_budget)
                    .await?
                {
                    continue;
                }
                // Every byte of the history it holds, or not yet.
                if !self.history_complete_to_lead(image, range.id, &dir)? {
                    continue;
                }
            }
            // What a split or merge child inherits, before any file of its
            // active segment exists (a pass that fails after creating it
            // would read it as a segment to resume, and seal it again).
            let ancestors_elsewhere = self.ancestors_elsewhere(image, range);
            let seed = if range.parents.is_empty() {
                None
            } else if ancestors_elsewhere {
                // Led here without the parents' logs (a failover to a
                // follower of the child): their ends come from the image,
                // the producer state from the child's own snapshot, which
                // `producer_state_to_lead` made sure is here.
                Some(seed_from_image(image, range))
            } else {
                Some(self.seed_from_parents(image, range)?)
            };
            if range.active && replicated_layout {
                // The follower copies of this range's sealed segments become
                // the log's history; the active segment starts empty.
                self.replicas.store.close_range(range.id);
                std::fs::create_dir_all(&dir)?;
                std::fs::File::create(tessera_log::segment::log_path(&dir, last.id.seq))?;
                tessera_fs::sync_dir(&dir)?;
            }
            let effective = EffectiveTopicConfig::resolve(
                &topic.configs,
                &crate::dynamic_config::BrokerView::new(&self.config, image),
            );
            // Segments of the range this broker never held (it joined the
            // replica set later, or was away) are read from the replicas
            // that hold them; its producer state comes from the snapshot
            // fetched where its next local segment starts.
            let local = tessera_log::range_log::local_segment_seqs(&dir)?;
            let remote_history = remote_history(image, range, &local, ancestors_elsewhere);
            let log = RangeLog::open(
                RangeLogOptions {
                    dir,
                    lo: range.lo,
                    hi: range.hi,
                    segment_bytes: effective.segment_bytes,
                    segment_ms: effective.segment_ms,
                    leader_epoch: last.leader_epoch,
                    log_start_offsets: (range.lo..range.hi)
                        .map(|p| image.log_start_offset(topic.id, p))
                        .collect(),
                    seed,
                    min_next_offsets: sealed_ends(image, range, None),
                    remote_history,
                    sealed: !range.active,
                    replicated: range.active && replicated,
                    commit_recorded_only: range.active && replicated_layout,
                },
                self.hw_events.clone(),
            )?;
            if range.active {
                missing_records.extend(local_segment_records(image, range.id, &log));
                self.ship(range.id, &log, last, effective.min_insync_replicas);
            }
            self.logs.write().insert(range.id, log);
        }
        self.reconciler
            .fenced_unrecorded
            .lock()
            .retain(|id, _| image.segments.get(id).is_some_and(|s| !s.is_sealed()));
        self.retain_lead_waits(image);
        self.apply_log_starts(image)?;
        if !missing_records.is_empty() {
            self.controller.write(missing_records).await?;
        }
        Ok(())
    }

    /// Every open log (active and ancestors) takes the log start offsets
    /// the image records for its partitions (DeleteRecords): a log opened
    /// before they moved learns them here, one opened after gets them in
    /// its options.
    fn apply_log_starts(&self, image: &MetadataImage) -> anyhow::Result<()> {
        let logs: Vec<(RangeId, Arc<RangeLog>)> = self
            .logs
            .read()
            .iter()
            .map(|(id, log)| (*id, log.clone()))
            .collect();
        for (id, log) in logs {
            let Some(range) = image.ranges.get(&id) else {
                continue;
            };
            let starts = image
                .log_start_offsets
                .range((range.topic_id, range.lo)..(range.topic_id, range.hi));
            for (&(_, partition), &offset) in starts {
                log.advance_log_start(partition, offset)?;
            }
        }
        Ok(())
    }

    /// Whether `range` is a split or merge child some of whose parents'
    /// logs this broker does not hold open (it follows the child, not
    /// them): it cannot read its inheritance from them.
    pub(super) fn ancestors_elsewhere(&self, image: &MetadataImage, range: &RangeImage) -> bool {
        let logs = self.logs.read();
        range.parents.iter().any(|parent_id| {
            image.ranges.get(parent_id).is_some_and(|parent| {
                parent.lo.max(range.lo) < parent.hi.min(range.hi) && !logs.contains_key(parent_id)
            })
        })
    }

    /// [`Broker::ancestors_elsewhere`] for the image's range `range`.
    pub(super) fn ancestors_elsewhere_of(&self, image: &MetadataImage, range: RangeId) -> bool {
        image
            .ranges
            .get(&range)
            .is_some_and(|r| self.ancestors_elsewhere(image, r))
    }

    /// What a split or merge child inherits: for each of its partitions, the
    /// next offset and producer state of the parent that held it.
    fn seed_from_parents(
        &self,
        image: &MetadataImage,
        range: &RangeImage,
    ) -> anyhow::Result<RangeSeed> {
        let width = (range.hi - range.lo) as usize;
        let mut seed = RangeSeed {
            next_offsets: vec![0; width],
            producers: vec![Default::default(); width],
            txns: vec![Default::default(); width],
        };
        for parent_id in &range.parents {
            let Some(parent) = image.ranges.get(parent_id) else {
                continue;
            };
            let (lo, hi) = (parent.lo.max(range.lo), parent.hi.min(range.hi));
            if lo >= hi {
                continue;
            }
            let log = self.logs.read().get(parent_id).cloned().ok_or_else(|| {
                anyhow::anyhow!("parent range {parent_id} of range {} is not open", range.id)
            })?;
            let part = log.seed_for(lo, hi)?;
            let at = (lo - range.lo) as usize;
            seed.next_offsets[at..at + part.next_offsets.len()].copy_from_slice(&part.next_offsets);
            for (i, p) in part.producers.into_iter().enumerate() {
                seed.producers[at + i] = p;
            }
            for (i, t) in part.txns.into_iter().enumerate() {
                seed.txns[at + i] = t;
            }
        }
        Ok(seed)
    }

    /// Loads the coordinator state of the internal partitions this broker
    /// leads now and did not before (groups first: transactions complete
    /// the pending offsets they load), and drops the state of those it lost.
    async fn reconcile_coordinators(&self, image: &MetadataImage) -> anyhow::Result<()> {
        let groups = self.led_partitions(image, CONSUMER_OFFSETS);
        let txns = self.led_partitions(image, TRANSACTION_STATE);
        let (groups_before, txns_before) = {
            let led = self.reconciler.led.lock();
            (led.groups.clone(), led.txns.clone())
        };
        let (lost, gained) = self.coordinator_changes(image, &groups_before, &groups);
        if !lost.is_empty() {
            self.groups.unload_partitions(&lost);
        }
        let mut groups = groups;
        // All at once, else one partition at a time: one whose history
        // cannot be read now keeps only its own groups without a coordinator (NOT_COORDINATOR)
        // until the next pass (at most `RECONCILE_AT_LEAST_EVERY` away)
        // loads it again. The rest of the broker goes on.
        if !gained.is_empty() && self.groups.load_partitions(self, &gained).await.is_err() {
            for p in gained {
                if let Err(e) = self.groups.load_partitions(self, &[p]).await {
                    tracing::warn!(partition = p, error = %format!("{e:#}"), "loading a group coordinator partition failed; retrying");
                    groups.remove(&p);
                }
            }
        }
        self.reconciler.led.lock().groups = groups;
        let (lost, gained) = self.coordinator_changes(image, &txns_before, &txns);
        if !lost.is_empty() {
            self.txns.unload_partitions(&lost);
        }
        let mut txns = txns;
        if !gained.is_empty() && self.txns.load_partitions(self, &gained).await.is_err() {
            for p in gained {
                if let Err(e) = self.txns.load_partitions(self, &[p]).await {
                    tracing::warn!(partition = p, error = %format!("{e:#}"), "loading a transaction coordinator partition failed; retrying");
                    txns.remove(&p);
                }
            }
        }
        self.reconciler.led.lock().txns = txns;
        Ok(())
    }

    /// The coordinator partitions to unload (no longer led here, or led
    /// again after another broker may have led them: a new range, or a
    /// later segment with another primary) and to load (newly led, or led
    /// again), between what was loaded and what `image` says.
    fn coordinator_changes(
        &self,
        image: &MetadataImage,
        before: &BTreeMap<i32, Leadership>,
        now: &BTreeMap<i32, Leadership>,
    ) -> (Vec<i32>, Vec<i32>) {
        let me = self.config.node_id;
        let kept = |p: &i32, was: &Leadership| {
            now.get(p).is_some_and(|is| {
                is.range == was.range
                    && tessera_planner::led_throughout(image, is.range, was.epoch, me)
            })
        };
        let lost: Vec<i32> = before
            .iter()
            .filter(|(p, was)| !kept(p, was))
            .map(|(p, _)| *p)
            .collect();
        let gained: Vec<i32> = now
            .keys()
            .filter(|p| !before.contains_key(p) || lost.contains(p))
            .copied()
            .collect();
        (lost, gained)
    }

    /// The partitions of internal topic `name` this broker leads in `image`.
    fn led_partitions(&self, image: &MetadataImage, name: &str) -> BTreeMap<i32, Leadership> {
        let Some(topic) = image.topic_by_name(name) else {
            return BTreeMap::new();
        };
        (0..topic.partitions as i32)
            .filter_map(|p| {
                let route = self.route(image, topic, p).ok()?;
                Some((
                    p,
                    Leadership {
                        range: route.range_id,
                        epoch: route.leader_epoch,
                    },
                ))
            })
            .collect()
    }
}

/// How long a segment fenced by another broker's seal-by-quorum may stay
/// unrecorded before its primary seals it itself.
const FENCED_SEAL_WAIT: Duration = Duration::from_secs(5);

/// See the fenced case in `reconcile_logs`.
async fn seal_if_still_fenced(broker: Weak<Broker>, segment: SegmentId) {
    tokio::time::sleep(FENCED_SEAL_WAIT).await;
    let Some(b) = broker.upgrade() else { return };
    b.reconciler.fenced_unrecorded.lock().remove(&segment);
    let image = b.image();
    let unsealed = image
        .segments
        .get(&segment)
        .is_some_and(|s| !s.is_sealed() && s.primary() == Some(b.config.node_id));
    if unsealed && b.log_of(segment.range).is_none() {
        tracing::info!(%segment, "a fenced segment's seal was not recorded; sealing it by quorum");
        b.seal_by_quorum(segment);
    }
}

/// Removes the files of segments after `newest` in a range directory,
/// except those of a segment a replication stream holds a copy of open
/// (checked and removed under the store's opening lock: see
/// [`ReplicaStore::unless_open`]).
fn discard_unrecorded_segments(
    dir: &std::path::Path,
    range: RangeId,
    newest: u32,
    store: &ReplicaStore,
) -> std::io::Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    let mut removed = false;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let seq = name
            .split('.')
            .next()
            .and_then(|stem| stem.parse::<u32>().ok());
        let Some(seq) = seq.filter(|&seq| seq > newest) else {
            continue;
        };
        let key = tessera_replication::protocol::SegmentKey { range, seq };
        let path = entry.path();
        let outcome = store.unless_open(key, || {
            tracing::warn!(file = %path.display(), "removing a segment the metadata log never recorded");
            std::fs::remove_file(&path)
        });
        match outcome {
            Some(result) => {
                result?;
                removed = true;
            }
            None => {
                tracing::info!(file = %path.display(), "keeping a copy a replication stream holds open (its segment is newer than this pass's image)")
            }
        }
    }
    if removed {
        tessera_fs::sync_dir(dir)?;
    }
    Ok(())
}

/// When some of `range`'s segments before a `local` one are not local: per
/// local segment, each partition's next offset where it starts (the ends
/// of the image's sealed spans before it, the ancestors' included). `None`
/// when the local segments run from the range's first one without a gap.
fn remote_history(
    image: &MetadataImage,
    range: &RangeImage,
    local: &[u32],
    ancestors_elsewhere: bool,
) -> Option<BTreeMap<u32, Vec<i64>>> {
    let segments = image.segments_of(range.id);
    let first = segments.first()?.id.seq;
    let held: Vec<u32> = local.iter().copied().filter(|&s| s >= first).collect();
    let from_first = held.iter().copied().eq(first..first + held.len() as u32);
    if from_first && !(first == 0 && ancestors_elsewhere) {
        return None;
    }
    let mut ends = sealed_ends(image, range, Some(0));
    let mut starts = BTreeMap::new();
    for seg in segments {
        if held.contains(&seg.id.seq) {
            starts.insert(seg.id.seq, ends.clone());
        }
        for span in seg.sealed.iter().flat_map(|s| &s.spans) {
            if range.contains(span.partition) {
                let e = &mut ends[(span.partition - range.lo) as usize];
                *e = (*e).max(span.end_offset);
            }
        }
    }
    Some(starts)
}

/// A child's inheritance as the image knows it: its partitions' next
/// offsets where the parents ended, and no producer state (that comes from
/// the child's own producer snapshot).
fn seed_from_image(image: &MetadataImage, range: &RangeImage) -> RangeSeed {
    let width = (range.hi - range.lo) as usize;
    RangeSeed {
        next_offsets: sealed_ends(image, range, Some(0)),
        producers: vec![Default::default(); width],
        txns: vec![Default::default(); width],
    }
}

/// Per partition of `range`, the end of its data in the sealed segments the
/// image records for the range (those below `below` only, when given) and
/// its ancestors.
fn sealed_ends(image: &MetadataImage, range: &RangeImage, below: Option<u32>) -> Vec<i64> {
    known_sealed_ends(image, range, below)
        .into_iter()
        .map(|e| e.unwrap_or(0))
        .collect()
}

/// Where segment `seq` of `range` starts, for each partition the image
/// still records data of (in the range's sealed segments before `seq` or
/// its ancestors'): the offset a producer snapshot taken there must carry.
/// A partition whose data retention deleted is not listed.
pub(super) fn segment_start_offsets(
    image: &MetadataImage,
    range: &RangeImage,
    seq: u32,
) -> std::collections::BTreeMap<u32, i64> {
    known_sealed_ends(image, range, Some(seq))
        .into_iter()
        .enumerate()
        .filter_map(|(i, e)| e.map(|e| (range.lo + i as u32, e)))
        .collect()
}

/// [`sealed_ends`], `None` for a partition no sealed segment has data of.
fn known_sealed_ends(
    image: &MetadataImage,
    range: &RangeImage,
    below: Option<u32>,
) -> Vec<Option<i64>> {
    let mut ends = vec![None::<i64>; (range.hi - range.lo) as usize];
    let mut stack = vec![range.id];
    let mut seen = BTreeSet::new();
    while let Some(id) = stack.pop() {
        if !seen.insert(id) {
            continue;
        }
        for seg in image.segments_of(id) {
            if id == range.id && below.is_some_and(|b| seg.id.seq >= b) {
                continue;
            }
            for span in seg.sealed.iter().flat_map(|s| &s.spans) {
                if range.contains(span.partition) {
                    let e = &mut ends[(span.partition - range.lo) as usize];
                    *e = Some(e.map_or(span.end_offset, |e| e.max(span.end_offset)));
                }
            }
        }
        if let Some(r) = image.ranges.get(&id) {
            stack.extend(r.parents.iter().copied());
        }
    }
    ends
}

/// The records that bring the image up to date with `log`'s local segments
/// (see [`tessera_planner::record_local_segments`]).
pub(crate) fn local_segment_records(
    image: &MetadataImage,
    range: RangeId,
    log: &RangeLog,
) -> Vec<tessera_metadata::MetadataRecord> {
    let (sealed, active_seq) = log.local_segments();
    let seals: Vec<SegmentSealRecord> = sealed.iter().map(|s| seal_of(range, s)).collect();
    let active = (!log.is_sealed()).then_some(active_seq);
    tessera_planner::record_local_segments(image, range, &seals, active)
}

/// The metadata form of a segment the log sealed.
pub(crate) fn seal_of(range: RangeId, s: &SealedSegment) -> SegmentSealRecord {
    SegmentSealRecord {
        segment: SegmentId { range, seq: s.seq },
        size_bytes: s.size_bytes,
        spans: s
            .spans
            .iter()
            .map(|&(partition, start_offset, end_offset)| PartitionSpan {
                partition,
                start_offset,
                end_offset,
            })
            .collect(),
        leader_epoch: Some(s.leader_epoch),
    }
}

/// Runs a reconcile pass for every image the controller publishes, again
/// after a delay while the last pass failed, when one is requested
/// ([`Broker::request_reconcile`]), and every
/// [`RECONCILE_AT_LEAST_EVERY`] in any case. Ends with the broker.
pub(super) async fn follow_images(broker: Arc<Broker>) {
    let mut images = broker.controller.subscribe();
    let wake = broker.reconciler.wake.clone();
    let weak: Weak<Broker> = Arc::downgrade(&broker);
    drop(broker);
    let mut last_pass = std::time::Instant::now();
    loop {
        let Some(broker) = weak.upgrade() else { return };
        if broker.reconciler.stopped.load(Ordering::Acquire) {
            return;
        }
        let (behind, failed) = {
            let done = broker.reconciler.done.borrow();
            (done.offset < broker.image().offset, done.error.is_some())
        };
        let requested = broker.reconciler.requested.swap(false, Ordering::AcqRel);
        let due = last_pass.elapsed() >= RECONCILE_AT_LEAST_EVERY;
        if behind || failed || requested || due {
            last_pass = std::time::Instant::now();
            if let Err(e) = broker.reconcile().await {
                tracing::warn!(error = %format!("{e:#}"), "reconcile pass failed; retrying");
            }
        }
        let failed = broker.reconciler.done.borrow().error.is_some();
        drop(broker);
        // A request made since the check above left a permit.
        tokio::select! {
            changed = images.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(RETRY_FAILED_PASS), if failed => {}
            _ = wake.notified() => {}
            _ = tokio::time::sleep(RECONCILE_AT_LEAST_EVERY) => {}
        }
    }
}

/// Records local segment rolls in the metadata log, in the order they happened.
pub(super) async fn record_rolls(
    broker: Arc<Broker>,
    mut rx: mpsc::UnboundedReceiver<(RangeId, SealedSegment)>,
) {
    // One worker per range: its rolls are recorded in order, and a range
    // waiting for its followers holds up no other range.
    let mut workers: HashMap<RangeId, mpsc::UnboundedSender<SealedSegment>> = HashMap::new();
    while let Some((range, sealed)) = rx.recv().await {
        workers.retain(|_, tx| !tx.is_closed());
        let tx = workers.entry(range).or_insert_with(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(record_range_rolls(Arc::downgrade(&broker), range, rx));
            tx
        });
        let _ = tx.send(sealed);
    }
}

/// How often a roll waiting for its segment's commit says so.
const ROLL_COMMIT_WARN: Duration = Duration::from_secs(30);

async fn record_range_rolls(
    broker_weak: std::sync::Weak<Broker>,
    range: RangeId,
    mut rx: mpsc::UnboundedReceiver<SealedSegment>,
) {
    'rolls: while let Some(sealed) = rx.recv().await {
        let Some(broker) = broker_weak.upgrade() else {
            return;
        };
        // A replicated segment is sealed in the image only once a quorum
        // holds all of it: followers still receiving it would otherwise
        // refuse the rest of its stream as sealed, and its tail would be
        // committed by nobody.
        // Never recorded before that: a sealed segment the image records
        // is committed, whatever a follower does with it later. A roll
        // whose followers are gone waits until they are replaced (the
        // replacement seals the segment by quorum; this record is then
        // skipped) or the log closes.
        // (The log says whether it is replicated: the image may not show
        // this segment yet when rolls come fast, each one recorded only
        // after the one before it.)
        // Only the log that rolled is waited on and recorded for: once it
        // closed, the range's log here (if any) is another one, at a new
        // epoch that may reuse the rolled segment's number, and its
        // positions say nothing of this roll. A closed log's segments are
        // sealed by a quorum, or recorded when a log opens on them again.
        let Some(log) = broker
            .log_of(range)
            .filter(|log| log.leader_epoch() == sealed.leader_epoch)
        else {
            tracing::info!(
                range,
                seq = sealed.seq,
                epoch = sealed.leader_epoch,
                "rolled segment of a log that closed; its seal is left to seal-by-quorum"
            );
            continue 'rolls;
        };
        drop(broker);
        if let (true, Some(end)) = (log.is_replicated(), log.position_of(sealed.next_seq, 0)) {
            loop {
                match tokio::time::timeout(ROLL_COMMIT_WARN, log.wait_durable(end)).await {
                    Ok(Ok(())) => break,
                    Ok(Err(tessera_log::LogError::NotEnoughReplicasAfterAppend)) => {
                        // Short of replicas: wait for the commit or the close.
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Ok(Err(e)) => {
                        tracing::info!(range, seq = sealed.seq, error = %e, "rolled segment not committed before its log closed; its seal is left to seal-by-quorum");
                        continue 'rolls;
                    }
                    Err(_) => tracing::warn!(
                        range,
                        seq = sealed.seq,
                        "rolled segment not committed yet; waiting for a quorum of its replicas"
                    ),
                }
            }
        }
        // Until the roll is recorded nothing this log writes past it can
        // commit (`commit_recorded_only`), so a write that failed (a
        // controller failover under it, a forward whose outcome is unknown)
        // is tried again, from the image as it is then, for as long as this
        // log leads the range: left alone, the range would take appends and
        // acknowledge none of them until some fault moved its leadership.
        let mut pause = ROLL_RECORD_RETRY_MIN;
        loop {
            let Some(broker) = broker_weak.upgrade() else {
                return;
            };
            if !broker.log_of(range).is_some_and(|l| Arc::ptr_eq(&l, &log)) {
                tracing::info!(range, seq = sealed.seq, "rolled segment of a log that closed before its roll was recorded; its seal is left to seal-by-quorum");
                continue 'rolls;
            }
            let image = broker.image();
            // Every boundary is a placement decision: the next segment
            // opens without followers on drained or lagging brokers, and
            // on a less loaded broker when one holds clearly fewer.
            let rolled = SegmentId::new(range, sealed.seq);
            let out_of_sync = broker
                .out_of_sync_of(range)
                .into_iter()
                .map(|f| (rolled, f))
                .collect();
            let placed = broker
                .config
                .replica_placement_roll_enable
                .then(|| tessera_planner::place_at_roll(&image, rolled, &out_of_sync))
                .flatten();
            let records = tessera_planner::record_roll(
                &image,
                range,
                &seal_of(range, &sealed),
                sealed.next_seq,
                placed,
            );
            if records.is_empty() {
                // Recorded already (a reopen, or a write whose outcome was
                // unknown, recorded it), unless leadership moved on.
                if roll_is_recorded(&image, range, &sealed) {
                    log.set_recorded_active(sealed.next_seq);
                }
                continue 'rolls;
            }
            let placed_elsewhere = placed_elsewhere(&image, rolled, &records);
            if let Some(placed) = &placed_elsewhere {
                tracing::info!(
                    segment = %SegmentId::new(range, sealed.next_seq),
                    from = ?image.segments.get(&rolled).map(|s| s.replicas.clone()),
                    to = ?placed,
                    "segment roll: the next segment is placed on other replicas"
                );
            }
            match broker.controller.write(records).await {
                Ok(_) => {
                    log.set_recorded_active(sealed.next_seq);
                    if placed_elsewhere.is_some() {
                        crate::metrics::Metrics::add(&broker.metrics.roll_placements, 1);
                    }
                    continue 'rolls;
                }
                Err(e) => {
                    tracing::warn!(range, seq = sealed.seq, error = %e, retry_in_ms = pause.as_millis() as u64, "could not record a segment roll in the metadata log; retrying");
                }
            }
            drop(broker);
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(ROLL_RECORD_RETRY_MAX);
        }
    }
}

/// The replicas the roll's `records` open the next segment on, when they
/// differ from the rolled segment's.
fn placed_elsewhere(
    image: &MetadataImage,
    rolled: SegmentId,
    records: &[tessera_metadata::MetadataRecord],
) -> Option<Vec<i32>> {
    let current = &image.segments.get(&rolled)?.replicas;
    records.iter().find_map(|r| match r {
        tessera_metadata::MetadataRecord::OpenSegment(open)
            if open.segment.seq == rolled.seq + 1 && open.replicas != *current =>
        {
            Some(open.replicas.clone())
        }
        _ => None,
    })
}

/// How long a failed roll record waits before its first retry, and at most.
const ROLL_RECORD_RETRY_MIN: Duration = Duration::from_millis(100);
const ROLL_RECORD_RETRY_MAX: Duration = Duration::from_secs(2);

/// True when the image has the segment after `sealed` open at the leader
/// epoch of the log that rolled: its roll is recorded.
fn roll_is_recorded(image: &MetadataImage, range: RangeId, sealed: &SealedSegment) -> bool {
    image
        .segments
        .get(&SegmentId::new(range, sealed.next_seq))
        .is_some_and(|s| s.leader_epoch == sealed.leader_epoch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_metadata::{BrokerRegistration, MetadataRecord};

    /// One broker, one topic of partitions [0, 2) in range 1, segments 0-2
    /// sealed (partition 0: [0, 3), [3, 7), [7, 9); partition 1: [0, 2) in
    /// segment 1) and 3 active.
    fn image() -> MetadataImage {
        fn commit(image: &mut MetadataImage, records: Vec<MetadataRecord>) {
            let offset = image.offset + 1;
            for r in &records {
                image.apply(r, offset);
            }
        }
        let mut image = MetadataImage::empty();
        commit(
            &mut image,
            tessera_planner::register_broker(BrokerRegistration {
                broker_id: 1,
                incarnation_id: uuid::Uuid::new_v4(),
                host: "h".into(),
                port: 1,
                rack: None,
            }),
        );
        commit(
            &mut image,
            vec![MetadataRecord::UnfenceBroker { broker_id: 1 }],
        );
        let spec = tessera_planner::TopicSpec {
            topic_id: uuid::Uuid::new_v4(),
            name: "t".into(),
            partitions: 2,
            replication_factor: 1,
            configs: Default::default(),
        };
        let records = tessera_planner::create_topic(&image, spec).unwrap();
        commit(&mut image, records);
        let range = *image.ranges.keys().next().unwrap();
        let seal = |seq, spans: &[(u32, i64, i64)]| SegmentSealRecord {
            segment: SegmentId::new(range, seq),
            size_bytes: 100,
            spans: spans
                .iter()
                .map(|&(partition, start_offset, end_offset)| PartitionSpan {
                    partition,
                    start_offset,
                    end_offset,
                })
                .collect(),
            leader_epoch: Some(0),
        };
        let seals = [
            seal(0, &[(0, 0, 3)]),
            seal(1, &[(0, 3, 7), (1, 0, 2)]),
            seal(2, &[(0, 7, 9)]),
        ];
        let records = tessera_planner::record_local_segments(&image, range, &seals, Some(3));
        commit(&mut image, records);
        image
    }

    /// A follower's copy of a segment that this pass's image does not
    /// record yet (its stream took it on the newer image) stays: before,
    /// the pass removed the file under the open copy, which went on
    /// acknowledging bytes that were on no disk (seed 11: the copy's
    /// broker became primary and found no history to lead with). A stale
    /// file nobody holds is still removed.
    #[test]
    fn an_unrecorded_segment_is_kept_while_a_stream_holds_its_copy() {
        let dir = tempfile::tempdir().unwrap();
        let store = ReplicaStore::default();
        let held = tessera_replication::protocol::SegmentKey { range: 1, seq: 5 };
        let copy = store.copy(held, dir.path()).unwrap();
        let stale = tessera_log::segment::log_path(dir.path(), 6);
        std::fs::write(&stale, b"a roll the image never recorded").unwrap();

        discard_unrecorded_segments(dir.path(), 1, 4, &store).unwrap();

        assert!(
            tessera_log::segment::log_path(dir.path(), 5).exists(),
            "the held copy stays"
        );
        assert!(!stale.exists(), "the stale file goes");
        drop(copy);
        store.close_range(1);
        discard_unrecorded_segments(dir.path(), 1, 4, &store).unwrap();
        assert!(
            !tessera_log::segment::log_path(dir.path(), 5).exists(),
            "once no stream holds it, an unrecorded segment goes too"
        );
    }

    #[test]
    fn remote_history_gives_each_local_segment_its_start_after_a_gap() {
        let image = image();
        let range = image.ranges.values().next().unwrap();
        assert_eq!(image.segments_of(range.id).len(), 4);
        // The whole history is local.
        assert_eq!(remote_history(&image, range, &[0, 1, 2, 3], false), None);
        // ... unless the range's parents are not here: then every local
        // segment's start is given, segment 0's at the parents' ends.
        assert_eq!(
            remote_history(&image, range, &[0, 1, 2, 3], true),
            Some(BTreeMap::from([
                (0, vec![0, 0]),
                (1, vec![3, 0]),
                (2, vec![7, 2]),
                (3, vec![9, 2])
            ]))
        );
        // Joined at segment 2.
        assert_eq!(
            remote_history(&image, range, &[2, 3], false),
            Some(BTreeMap::from([(2, vec![7, 2]), (3, vec![9, 2])]))
        );
        // Away for segment 1.
        assert_eq!(
            remote_history(&image, range, &[0, 2, 3], false),
            Some(BTreeMap::from([
                (0, vec![0, 0]),
                (2, vec![7, 2]),
                (3, vec![9, 2])
            ]))
        );
    }
}
