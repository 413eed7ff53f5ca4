//! The primary side of replication (I/O; Kafka's leader side of
//! `ReplicaManager` + `Partition.maybeIncrementLeaderHW`): one shipping
//! task per follower streams the range log's stored frames, in order and
//! pipelined, and the acks move the range's committed position (the high
//! watermark) to what a commit quorum of the segment's replicas — the
//! primary's own fsync included — holds durably, segment by segment.
//!
//! A shipping task never gives up while the log is open: a refusal, a lost
//! connection or a segment retention deleted restarts or moves the stream
//! on, and a follower that stays behind is visible as out of sync
//! ([`Replication::in_sync`], [`Replication::out_of_sync_for`]) so that the
//! broker replaces it at a segment boundary.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tessera_log::RangeLog;
use tokio::sync::watch;

use crate::auth::{Connector, PeerStream};
use crate::protocol::{connect, read_message, write_message, Message, SegmentKey};
use crate::quorum::{commit_quorum, committed_across};

/// Bytes shipped to one follower and not yet acknowledged, at most.
const WINDOW_BYTES: u64 = 16 << 20;
/// Frames per `Append`, about.
const CHUNK_BYTES: usize = 1 << 20;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const RETRY_MIN: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(1);
/// How long a follower that asked to retry later is left alone.
const REFUSED_PAUSE: Duration = Duration::from_millis(25);
/// How often the primary looks at its followers without an event (the
/// in-sync set changes with time alone).
const MONITOR_TICK: Duration = Duration::from_millis(250);

/// Where a follower's Kafka listener is (from the metadata image), and
/// how to connect to it.
pub trait PeerAddresses: Send + Sync + 'static {
    fn address_of(&self, broker: i32) -> Option<String>;
    /// Authenticates the connections to peers (see [`crate::auth`]).
    fn connector(&self) -> Arc<dyn Connector>;
}

#[derive(Clone, Debug, Default)]
struct FollowerProgress {
    /// The follower's durable end in each segment, as it acknowledged it.
    /// A follower that skipped a segment's tail (it repairs it from a peer)
    /// has a short entry there, whatever it holds of later segments.
    durable: BTreeMap<u32, u64>,
    /// Where its stream resumes after a reconnect: the segment it was
    /// last shipped.
    ship_seq: u32,
    /// Set at its first acknowledgement: a follower that never answered is
    /// not in sync, however idle the range.
    answered: bool,
    /// Last time it held everything the primary had fsynced.
    caught_up: Option<Instant>,
}

impl FollowerProgress {
    fn end_in(&self, seq: u32, size: u64) -> u64 {
        self.durable.get(&seq).copied().unwrap_or(0).min(size)
    }
}

struct Progress {
    /// Segments before this one are committed; the commit is computed from here.
    base_seq: u32,
    followers: HashMap<i32, FollowerProgress>,
}

/// The followers of a range log's segments from `from_seq` on (the
/// active segment the image records with them).
///
/// Segments before `from_seq` were committed by the replicas that held
/// them (a roll that changes the set is recorded only once the rolled
/// segment is committed). Those from `from_seq` on are shipped to these
/// followers and committed by them, including any the log rolled to
/// before the image recorded them: counting from the log's own active
/// segment instead would commit the segments in between on the primary's
/// copy alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FollowerSet {
    pub followers: Vec<i32>,
    pub from_seq: u32,
}

impl FollowerSet {
    pub fn new(followers: Vec<i32>, from_seq: u32) -> Self {
        FollowerSet {
            followers,
            from_seq,
        }
    }
}

/// Replication of one range log's active segment to its followers.
pub struct Replication {
    log: Arc<RangeLog>,
    range: u64,
    me: i32,
    replicas: usize,
    followers: Vec<i32>,
    /// The topic's `min.insync.replicas` (dynamic: set on every reconcile).
    min_insync: AtomicUsize,
    /// `replica.lag.time.max.ms`.
    lag: Duration,
    /// When shipping started: the lag clock of a follower never caught up.
    started: Instant,
    progress: Mutex<Progress>,
    stop: watch::Sender<bool>,
}

impl Replication {
    /// Starts shipping `log` (the range's log, this broker the primary of
    /// its active segment) to `set`. A commit needs [`commit_quorum`] of
    /// the replicas; a follower is in sync while it caught up within `lag`.
    pub fn start(
        log: Arc<RangeLog>,
        range: u64,
        me: i32,
        set: FollowerSet,
        peers: Arc<dyn PeerAddresses>,
        min_insync: usize,
        lag: Duration,
    ) -> Arc<Replication> {
        Replication::unlaunched(log, range, me, min_insync, lag).launch(set, HashMap::new(), peers)
    }

    /// A replication of `log` with no followers yet, for [`Replication::launch`].
    fn unlaunched(
        log: Arc<RangeLog>,
        range: u64,
        me: i32,
        min_insync: usize,
        lag: Duration,
    ) -> Replication {
        Replication {
            log,
            range,
            me,
            replicas: 0,
            min_insync: AtomicUsize::new(min_insync),
            lag,
            started: Instant::now(),
            progress: Mutex::new(Progress {
                base_seq: 0,
                followers: HashMap::new(),
            }),
            followers: Vec::new(),
            stop: watch::channel(false).0,
        }
    }

    /// This log's shipping continued on another set (a roll placed the
    /// next segment on other followers): this one stops, and followers in
    /// both sets keep their acknowledged ends and in-sync clocks in the
    /// new one, so a follower swap costs the others nothing (acks=all
    /// with `min.insync.replicas` sees no gap in the in-sync set).
    pub fn continue_on(&self, set: FollowerSet, peers: Arc<dyn PeerAddresses>) -> Arc<Replication> {
        self.stop();
        let kept: HashMap<i32, FollowerProgress> = {
            let progress = self.progress.lock();
            set.followers
                .iter()
                .filter_map(|f| progress.followers.get(f).map(|p| (*f, p.clone())))
                .collect()
        };
        Replication::unlaunched(
            self.log.clone(),
            self.range,
            self.me,
            self.min_insync.load(Ordering::Relaxed),
            self.lag,
        )
        .launch(set, kept, peers)
    }

    /// Sets up the progress of `set` (from `kept` where given) and starts
    /// one shipping task per follower and the monitor.
    fn launch(
        mut self,
        set: FollowerSet,
        mut kept: HashMap<i32, FollowerProgress>,
        peers: Arc<dyn PeerAddresses>,
    ) -> Arc<Replication> {
        let FollowerSet {
            followers,
            from_seq,
        } = set;
        let (active_seq, _) = self.log.local_durable_end();
        let start_seq = from_seq.min(active_seq);
        let progress = followers
            .iter()
            .map(|f| {
                let mut p = kept.remove(f).unwrap_or_default();
                p.durable.retain(|s, _| *s >= start_seq);
                p.ship_seq = p.ship_seq.max(start_seq);
                (*f, p)
            })
            .collect();
        self.replicas = followers.len() + 1;
        self.progress = Mutex::new(Progress {
            base_seq: start_seq,
            followers: progress,
        });
        self.followers = followers;
        let r = Arc::new(self);
        for &f in &r.followers {
            tokio::spawn(ship(r.clone(), f, peers.clone()));
        }
        tokio::spawn(monitor(r.clone()));
        r
    }

    pub fn stop(&self) {
        self.stop.send_replace(true);
        self.log.set_short_of_replicas(false);
    }

    pub fn log(&self) -> &Arc<RangeLog> {
        &self.log
    }

    pub fn followers(&self) -> &[i32] {
        &self.followers
    }

    /// The topic's `min.insync.replicas` changed.
    pub fn set_min_insync(&self, min_insync: usize) {
        if self.min_insync.swap(min_insync, Ordering::Relaxed) != min_insync {
            self.recompute();
        }
    }

    /// Replicas whose durable copies commit a byte (see [`commit_quorum`]).
    pub fn commit_quorum(&self) -> usize {
        commit_quorum(self.replicas, self.min_insync.load(Ordering::Relaxed))
    }

    /// Replicas in sync: the primary, and followers that answered and had
    /// everything the primary had fsynced within `replica.lag.time.max.ms`
    /// (Kafka's ISR).
    pub fn in_sync(&self) -> Vec<i32> {
        let now = Instant::now();
        let mut out = vec![self.me];
        let progress = self.progress.lock();
        for f in &self.followers {
            if progress.followers[f]
                .caught_up
                .is_some_and(|t| now.duration_since(t) <= self.lag)
            {
                out.push(*f);
            }
        }
        out
    }

    /// Followers out of sync, and for how long (since they were last
    /// caught up, or since shipping started for one that never was).
    pub fn out_of_sync_for(&self) -> Vec<(i32, Duration)> {
        let now = Instant::now();
        let progress = self.progress.lock();
        self.followers
            .iter()
            .filter_map(|f| {
                let since = progress.followers[f].caught_up.unwrap_or(self.started);
                let behind = now.duration_since(since);
                (behind > self.lag).then_some((*f, behind))
            })
            .collect()
    }

    /// Recomputes the committed position from every replica's durable end
    /// in each segment, and who is caught up.
    fn recompute(&self) {
        let mut progress = self.progress.lock();
        let segments = self.log.segments_from(progress.base_seq);
        if segments.is_empty() {
            return;
        }
        let (active, local) = self.log.local_durable_end();
        let own_end = |seq: u32, size: u64| if seq < active { size } else { local.min(size) };
        let table: Vec<(u64, Vec<u64>)> = segments
            .iter()
            .map(|&(seq, size, _)| {
                let mut ends = vec![own_end(seq, size)];
                ends.extend(
                    self.followers
                        .iter()
                        .map(|f| progress.followers[f].end_in(seq, size)),
                );
                (size, ends)
            })
            .collect();
        let quorum = self.commit_quorum();
        if let Some((i, bytes)) = committed_across(&table, quorum) {
            let (seq, _, _) = segments[i];
            if let Some(position) = self.log.position_of(seq, bytes) {
                self.log.commit(position);
            }
            // Older segments are committed: forget them.
            if seq > progress.base_seq {
                progress.base_seq = seq;
                for p in progress.followers.values_mut() {
                    p.durable.retain(|s, _| *s >= seq);
                }
            }
        }
        // Caught up: holds, without a gap, everything the primary fsynced
        // in the segments the image records (a follower cannot take a
        // segment whose roll is not recorded yet).
        let now = Instant::now();
        let recorded = self.log.recorded_active();
        let own: Vec<u64> = segments
            .iter()
            .map(|&(seq, size, _)| {
                if seq > recorded {
                    0
                } else {
                    own_end(seq, size)
                }
            })
            .collect();
        for f in &self.followers {
            let p = progress.followers.get_mut(f).expect("every follower");
            let caught_up = p.answered
                && segments
                    .iter()
                    .zip(&own)
                    .all(|(&(seq, size, _), &own)| p.end_in(seq, size) >= own);
            if caught_up {
                p.caught_up = Some(now);
            }
        }
        drop(progress);
        // Acks=all waits end early only once so many followers have been
        // out of sync for `replica.lag.time.max.ms` that the rest cannot
        // make a commit quorum (a follower that just started is given that
        // time to answer, as Kafka keeps a new leader's ISR).
        let reachable = self.replicas - self.out_of_sync_for().len();
        self.log.set_short_of_replicas(reachable < quorum);
    }

    fn acked(&self, follower: i32, seq: u32, durable: u64) {
        if let Some(p) = self.progress.lock().followers.get_mut(&follower) {
            let e = p.durable.entry(seq).or_insert(0);
            *e = (*e).max(durable);
            p.answered = true;
        }
        self.recompute();
    }

    fn shipping(&self, follower: i32, seq: u32) {
        if let Some(p) = self.progress.lock().followers.get_mut(&follower) {
            p.ship_seq = p.ship_seq.max(seq);
        }
    }

    fn stopped(&self) -> bool {
        *self.stop.borrow()
    }
}

/// The primary's own fsyncs count too, and the in-sync set changes with
/// time alone (a follower falls out after `replica.lag.time.max.ms`).
async fn monitor(r: Arc<Replication>) {
    let mut local = r.log.subscribe_local_durable();
    let mut stop = r.stop.subscribe();
    loop {
        r.recompute();
        tokio::select! {
            changed = local.changed() => if changed.is_err() { return },
            _ = stop.changed() => return,
            _ = tokio::time::sleep(MONITOR_TICK) => {}
        }
    }
}

/// Keeps one follower's copy in step: connect, stream, reconnect, for as
/// long as the log is open and shipping is not stopped.
async fn ship(r: Arc<Replication>, follower: i32, peers: Arc<dyn PeerAddresses>) {
    let mut backoff = RETRY_MIN;
    let mut stop = r.stop.subscribe();
    let mut failures = 0u32;
    while !r.stopped() {
        let outcome = match peers.address_of(follower) {
            Some(addr) => stream_to(&r, follower, &addr, &*peers.connector()).await,
            None => Err(format!("no address for broker {follower}")),
        };
        match outcome {
            Ok(()) => return,
            Err(reason) => {
                failures += 1;
                if failures.is_multiple_of(50) {
                    tracing::warn!(range = r.range, follower, failures, %reason, "replication stream keeps failing; retrying");
                } else {
                    tracing::debug!(range = r.range, follower, %reason, "replication stream ended; retrying");
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.changed() => return,
        }
        backoff = (backoff * 2).min(RETRY_MAX);
    }
}

/// One connection's life. `Ok` when replication of this log is over (we
/// were stopped or the log is gone), `Err` to reconnect.
async fn stream_to(
    r: &Arc<Replication>,
    follower: i32,
    addr: &str,
    connector: &dyn Connector,
) -> Result<(), String> {
    let conn = connect(connector, addr, CONNECT_TIMEOUT)
        .await
        .map_err(|e| format!("connect to {addr}: {e}"))?;
    let (mut reader, mut writer) = tokio::io::split(conn);
    write_message(&mut writer, &Message::Hello { from: r.me })
        .await
        .map_err(|e| e.to_string())?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Message>();
    let read_task = tokio::spawn(async move {
        loop {
            match read_message(&mut reader).await {
                Ok(Some(m)) => {
                    if tx.send(m).is_err() {
                        return;
                    }
                }
                _ => return,
            }
        }
    });
    let result = pump(r, follower, &mut writer, &mut rx).await;
    read_task.abort();
    result
}

/// The first segment after `seq` the log holds, if any.
fn next_held(log: &RangeLog, seq: u32) -> Option<u32> {
    log.segments_from(seq + 1).first().map(|s| s.0)
}

async fn pump(
    r: &Arc<Replication>,
    follower: i32,
    writer: &mut tokio::io::WriteHalf<PeerStream>,
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<Message>,
) -> Result<(), String> {
    let mut written = r.log.subscribe_written();
    let mut stop = r.stop.subscribe();
    // Start where the follower was last durable; an empty append probes
    // (the follower answers with its durable end, a later mismatch names
    // its real end) and pipelining starts once it answered.
    let (mut seq, mut pos) = {
        let progress = r.progress.lock();
        let p = &progress.followers[&follower];
        let seq = p.ship_seq.max(progress.base_seq);
        (seq, p.durable.get(&seq).copied().unwrap_or(0))
    };
    let mut acked = pos;
    // Every (re)start of a segment's stream begins with an empty append:
    // the follower answers with its durable end (or a refusal), and
    // pipelining starts once it answered.
    let mut synced = false;
    let mut probing = false;
    // Set when the follower asked to retry later (its image is behind).
    let mut paused_until: Option<tokio::time::Instant> = None;
    loop {
        if r.stopped() {
            return Ok(());
        }
        if paused_until.is_some_and(|t| tokio::time::Instant::now() >= t) {
            paused_until = None;
        }
        r.shipping(follower, seq);
        if !synced && !probing && paused_until.is_none() {
            let probe = Message::Append {
                segment: SegmentKey {
                    range: r.range,
                    seq,
                },
                epoch: r.log.leader_epoch(),
                position: pos,
                frames: bytes::Bytes::new(),
            };
            write_message(writer, &probe)
                .await
                .map_err(|e| e.to_string())?;
            probing = true;
        }
        // Send what we may (a segment we moved on to is probed first).
        let mut moved_on = false;
        while !probing && paused_until.is_none() && pos.saturating_sub(acked) < WINDOW_BYTES {
            let chunk = match r.log.frames(seq, pos, CHUNK_BYTES) {
                Ok(Some(c)) => c,
                Ok(None) => {
                    // Retention deleted the segment (it was committed, so
                    // the follower does not need it for the commit): go on
                    // with the oldest one the log still holds.
                    match next_held(&r.log, seq) {
                        Some(next) => {
                            tracing::info!(
                                range = r.range,
                                follower,
                                seq,
                                next,
                                "segment no longer held here; shipping the next one"
                            );
                            seq = next;
                            pos = 0;
                            acked = 0;
                            synced = false;
                            moved_on = true;
                            break;
                        }
                        None => return Err(format!("segment {seq} no longer held")),
                    }
                }
                Err(e) => return Err(e.to_string()),
            };
            if chunk.bytes.is_empty() {
                if chunk.sealed && pos >= chunk.segment_size {
                    if let Some(next) = next_held(&r.log, seq) {
                        // Rolled: the next segment starts at 0 on the follower too.
                        seq = next;
                        pos = 0;
                        acked = 0;
                        synced = false;
                        moved_on = true;
                        break;
                    }
                }
                break;
            }
            let len = chunk.bytes.len() as u64;
            let msg = Message::Append {
                segment: SegmentKey {
                    range: r.range,
                    seq,
                },
                epoch: r.log.leader_epoch(),
                position: pos,
                frames: chunk.bytes,
            };
            write_message(writer, &msg)
                .await
                .map_err(|e| e.to_string())?;
            pos += len;
        }
        if moved_on {
            continue;
        }
        tokio::select! {
            m = rx.recv() => match m {
                None => return Err("connection closed".into()),
                Some(Message::Ack { segment, durable }) => {
                    if segment.seq == seq {
                        acked = acked.max(durable);
                        synced = true;
                        probing = false;
                    }
                    r.acked(follower, segment.seq, durable);
                }
                Some(Message::Mismatch { segment, end }) => {
                    if segment.seq == seq {
                        pos = end;
                        acked = end;
                        synced = false;
                        probing = false;
                    }
                }
                Some(Message::Refused { retry: true, reason, segment }) => {
                    // Typically a segment the follower's image does not
                    // hold yet (its roll is recorded once the previous
                    // segment is committed). The connection stays: acks
                    // still in flight for earlier data must arrive.
                    if segment.seq == seq {
                        tracing::debug!(range = r.range, follower, seq, %reason, "follower not ready; retrying shortly");
                        pos = acked;
                        synced = false;
                        probing = false;
                        paused_until = Some(tokio::time::Instant::now() + REFUSED_PAUSE);
                    }
                }
                Some(Message::Refused { retry: false, reason, segment }) => {
                    if segment.seq == seq && r.log.holds_sealed(seq) {
                        if let Some(next) = next_held(&r.log, seq) {
                            // A rolled segment whose seal the follower saw
                            // before the rest of its stream (it repairs the
                            // tail from a peer; its short end there keeps
                            // counting as short): go on with the next one.
                            tracing::debug!(range = r.range, follower, seq, %reason, "follower has the rolled segment sealed; moving on");
                            seq = next;
                            pos = 0;
                            acked = 0;
                            synced = false;
                            probing = false;
                            continue;
                        }
                    }
                    // Anything else (an I/O error there, a fenced copy, a
                    // segment its image does not give it) ends this
                    // connection, not the shipping: it reconnects.
                    return Err(format!("follower refused segment {}: {reason}", segment.seq));
                }
                Some(other) => return Err(format!("unexpected {other:?}")),
            },
            changed = written.changed() => if changed.is_err() { return Ok(()) },
            _ = stop.changed() => return Ok(()),
            // A roll or a missed wakeup: look again now and then.
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}
