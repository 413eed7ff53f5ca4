//! Deterministic simulation of per-segment replication (DESIGN.md,
//! "Replication (per segment)") with a safety checker.
//!
//! One range's log is a chain of segments. Each segment has a replica set
//! (first = primary) among 5 nodes, replication factor 1, 3 or 5 (chosen by
//! the seed). The primary appends records (unit = one record: a segment
//! position is a record count, a record is a unique id) and pipelines
//! `Append`s to its followers over a network that drops, delays, duplicates
//! and reorders messages and can cut a set of nodes off (from each other's
//! complement and from the controller). Nodes fsync at random steps, crash
//! (losing whatever was not durable, their volatile roles, and some of their
//! in-flight messages) and restart. A controller (the metadata quorum,
//! always up) watches heartbeats and fences the active segment when its
//! primary is unreachable, restarted, or at random (a voluntary failover);
//! it seals the segment at `seal_point` of the fence reports, tells every
//! replica to seal (truncate or repair from the chosen replica) and opens the
//! next segment with the chosen replica as primary.
//!
//! Everything a replica decides goes through the crate's real pure pieces:
//! `FollowerSegment::{offer, wrote, synced, fence, seal, repaired,
//! recovered}` for every copy (the primary's own copy included), and
//! `committed_end` / `seal_point` / `place_replicas` for the primary's
//! commit and the controller's seal and placement.
//!
//! Primaries also roll on their own (`segment.bytes`, a few dozen
//! records): the rolled segment keeps being shipped and committed while
//! appends go to the next one, which followers refuse until the controller
//! records the roll; the primary asks for that record only once a quorum
//! holds all of the rolled segment, and the next segment opens on the same
//! replicas at the same epoch. Every controller-decided open is one epoch
//! up. A log that closes (fenced, sealed, refused) drops its unrecorded
//! roll (`lost_log`), keeps it where the image recorded and sealed it at
//! its epoch, never rolls into a number it holds a copy of, and a restart
//! drops files the image does not record or records at another epoch.
//!
//! Clients also read: any node that believes it is a primary (a zombie
//! too) serves offsets below its high watermark as the broker's range log
//! does, from its own copies in segment order (a short copy's missing tail
//! is not there, so the next segment's record comes back) and from another
//! replica for segments it keeps none of. A node opens a segment it is to
//! lead only once `short_copies` (the broker's own rule) finds none of its
//! copies of older sealed segments short; until then it waits for repairs.
//!
//! Producers retry: a client sometimes resends a record not acknowledged
//! yet (a recent one, or the oldest: a producer retries its oldest batch
//! until it is acknowledged), and a primary stores it only if its producer
//! state does not know it; a retry it knows is answered as a duplicate,
//! which the producer takes as stored. That state is rebuilt at open as the broker's range log does: from
//! the newest producer snapshot in its local run of segments, then its
//! copies. A primary writes the snapshot where its segment starts at open,
//! and the one where the next starts as its log closes at a fence (kept only
//! if the seal is at its end); a follower without the segment before its
//! own fetches the snapshot (`needs_snapshot`), and a node opens only when
//! `snapshot_needed_to_lead` is satisfied, asking the replicas
//! `snapshot_sources` names, keeping a fetched snapshot only if it was
//! taken where the image says the segment starts. A local roll writes the
//! snapshot where the next segment starts (durable once the rolled segment
//! is fsynced); a copy cut to its seal drops it. A segment sealed empty
//! counts as held by every node. A node that finds no replica with the snapshot resigns: the
//! controller seals its unopened segment preferring any other replica (and
//! with RF 1 places the next one elsewhere).
//!
//! Checker (after every run): no acknowledged record lost; no offset holds
//! two different records on any two copies; every replica that finished
//! its seal holds exactly the sealed size, durably; a read returns the
//! record at the offset asked for, the one acknowledged there and the one
//! the final log has there; no record is stored twice; a retry answered as
//! a duplicate is held by some copy; and, after the
//! faults stop, the system settles (every seal completes, new records are
//! acknowledged). Mutations (seal
//! at the minimum, ack on the primary's own durable end, a primary resuming
//! its segment after a restart, a seal reported done before it is fsynced,
//! a primary leading with a short copy, a primary leading without its
//! producer snapshot, a roll recorded before its commit, a restart keeping
//! another epoch's file, acks of an unrecorded roll, a fetched snapshot
//! kept whatever offset it was taken at) show the checker fails
//! when the protocol is wrong.
//!
//! The default sweep is 600 seeds x 2500 steps (a few seconds in a debug
//! build); `chaos_sweep_large` (ignored) runs 20000 x 5000.
//!
//! Replay one seed with a trace:
//! `TESSERA_SIM_SEED=42 [TESSERA_SIM_BUG=seal-at-min] cargo test -p
//! tessera-replication --test simulation replay -- --ignored --nocapture`.

use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashSet};

use tessera_replication::snapshot_transfer::{
    needs_snapshot, snapshot_needed_to_lead, snapshot_sources, LocalHistory,
};
use tessera_replication::{
    committed_end, place_replicas, quorum_size, seal_point, short_copies, BrokerCandidate,
    FenceReport, FollowerSegment, Offer, SealAction,
};

const NODES: usize = 5;
/// The controller's address on the network.
const CTRL: usize = NODES;
/// Records a primary keeps in flight to a follower past the follower's durable ack.
const WINDOW: u64 = 32;
/// Records per `Append`.
const CHUNK: u64 = 6;
/// Steps between the controller's resends (Open, Fence, Seal).
const RESEND: u64 = 8;
/// Steps without a heartbeat after which the controller deems a node gone.
const TIMEOUT: u64 = 15;
/// Steps of calm (no faults, all nodes up) before and after the late appends.
const SETTLE: u64 = 400;
/// Steps of appends after the faults stop (these records must all be acknowledged).
const LATE: u64 = 100;

// ---------------------------------------------------------------- rng

/// splitmix64: tiny, seedable, good enough to pick faults.
#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5851_f42d_4c95_7f2d)
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.unit() < p
    }
    fn between(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }
}

// ---------------------------------------------------------------- configuration

/// A deliberately broken variant of the protocol, to show the checker fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bug {
    None,
    /// The controller seals at the smallest end of a quorum of reports.
    SealAtMin,
    /// The primary acknowledges records once its own copy is durable.
    AckOwnDurable,
    /// A primary keeps its role across a crash and resumes appending to its
    /// (unfenced, recovered) copy after the restart.
    ResumeAfterRestart,
    /// A replica reports its seal done without fsyncing the sealed copy.
    SealWithoutSync,
    /// A node opens the segment it is to lead while copies of older sealed
    /// segments it keeps are still short (the read then skips their tail).
    LeadWithShortCopy,
    /// A node leads without the producer snapshot where its local history
    /// starts (it knows only the producers of the segments it holds).
    LeadWithoutSnapshot,
    /// A primary asks the controller to record its local roll at once, not
    /// once a quorum holds all of the rolled segment.
    RecordRollBeforeCommit,
    /// A restart keeps a copy whose number the image records at another
    /// epoch (a crashed primary's own unrecorded roll a failover reused).
    KeepOtherEpochAtRestart,
    /// With RF 1, records of an unrecorded roll are acknowledged on the
    /// local fsync (a restart deletes unrecorded rolls).
    AckUnrecordedRoll,
    /// A repair read is served from a copy of an older epoch than the
    /// segment's (a zombie primary's unrecorded roll under the same number).
    ReadAnyEpoch,
    /// A fetched producer snapshot is kept whatever offset it was taken at
    /// (a zombie primary's own roll serves one taken past the seal).
    AcceptAnySnapshot,
}

impl Bug {
    fn parse(s: &str) -> Bug {
        match s {
            "" | "none" => Bug::None,
            "seal-at-min" => Bug::SealAtMin,
            "ack-own-durable" => Bug::AckOwnDurable,
            "resume-after-restart" => Bug::ResumeAfterRestart,
            "seal-without-sync" => Bug::SealWithoutSync,
            "lead-with-short-copy" => Bug::LeadWithShortCopy,
            "lead-without-snapshot" => Bug::LeadWithoutSnapshot,
            "record-roll-before-commit" => Bug::RecordRollBeforeCommit,
            "keep-other-epoch-at-restart" => Bug::KeepOtherEpochAtRestart,
            "ack-unrecorded-roll" => Bug::AckUnrecordedRoll,
            "read-any-epoch" => Bug::ReadAnyEpoch,
            "accept-any-snapshot" => Bug::AcceptAnySnapshot,
            other => panic!("unknown bug {other:?}"),
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Faults {
    /// Per message.
    drop: f64,
    dup: f64,
    /// Per message: delivered after a delay uniform in `1..=max_delay`
    /// steps instead of the next step (so it overtakes or is overtaken).
    reorder: f64,
    max_delay: u64,
    /// Per step, per node: the controller hears its heartbeat (a miss
    /// for `TIMEOUT` steps in a row is a spurious failover).
    heartbeat: f64,
    /// Per step: one live node crashes (while fewer than `max_down` are down).
    crash: f64,
    max_down: usize,
    /// Per step, per down node.
    restart: f64,
    /// Per step while no partition is on.
    partition: f64,
    /// Per step: the controller fails the active segment over anyway.
    failover: f64,
}

impl Faults {
    /// No faults: messages are only delayed (and some reordered).
    fn calm(max_delay: u64, reorder: f64) -> Faults {
        Faults {
            drop: 0.0,
            dup: 0.0,
            reorder,
            max_delay,
            heartbeat: 1.0,
            crash: 0.0,
            max_down: 0,
            restart: 0.0,
            partition: 0.0,
            failover: 0.0,
        }
    }

    fn chaos(rng: &mut Rng) -> Faults {
        Faults {
            drop: rng.between(0.0, 0.15),
            dup: rng.between(0.0, 0.1),
            reorder: rng.between(0.0, 0.3),
            max_delay: rng.range(1, 8),
            heartbeat: rng.between(0.4, 0.9),
            crash: rng.between(0.002, 0.012),
            max_down: 2,
            restart: rng.between(0.02, 0.12),
            partition: rng.between(0.0, 0.012),
            failover: rng.between(0.002, 0.012),
        }
    }
}

/// Whether the controller sealed segment `seg` with no record in it.
fn sealed_empty(segs: &[SegMeta], seg: usize) -> bool {
    matches!(segs[seg].state, SegState::Sealed { size: 0, .. })
}

fn rf_of(seed: u64) -> usize {
    match seed % 4 {
        0 => 1,
        3 => 5,
        _ => 3,
    }
}

// ---------------------------------------------------------------- network

#[derive(Clone, Debug)]
enum Msg {
    /// Primary → follower.
    Append {
        seg: usize,
        epoch: u64,
        pos: u64,
        recs: Vec<u64>,
    },
    /// Follower → primary: durable end of its copy.
    Ack {
        seg: usize,
        durable: u64,
    },
    /// Follower → primary: resend from `end`.
    Mismatch {
        seg: usize,
        end: u64,
    },
    /// Controller → the new primary.
    Open {
        seg: usize,
        base: u64,
        replicas: Vec<usize>,
    },
    OpenAck {
        seg: usize,
    },
    /// Controller → replica, and the report back.
    Fence {
        seg: usize,
    },
    Fenced {
        seg: usize,
        end: u64,
    },
    /// Controller → replica: the seal is committed; `SealDone` once the copy is exactly it.
    Seal {
        seg: usize,
        size: u64,
        source: usize,
    },
    SealDone {
        seg: usize,
    },
    /// Primary → controller: it cannot open `seg`; seal it, avoiding it.
    Resign {
        seg: usize,
    },
    /// Primary → controller: record its local roll of `seg` at `size`
    /// (the next segment opens on the same replicas at the same epoch).
    RecordRoll {
        seg: usize,
        epoch: u64,
        size: u64,
    },
    /// Repair: replica → the seal's source, and the bytes back.
    Read {
        seg: usize,
        from: u64,
        to: u64,
    },
    Data {
        seg: usize,
        pos: u64,
        recs: Vec<u64>,
    },
    /// Producer snapshot transfer: the ids stored before segment `seg`.
    ReadSnapshot {
        seg: usize,
    },
    SnapshotData {
        seg: usize,
        ids: Vec<u64>,
    },
}

#[derive(Debug)]
struct Envelope {
    at: u64,
    order: u64,
    src: usize,
    src_inc: u64,
    dst: usize,
    dst_inc: u64,
    msg: Msg,
}

impl PartialEq for Envelope {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.order) == (other.at, other.order)
    }
}
impl Eq for Envelope {}
impl PartialOrd for Envelope {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Envelope {
    /// Reversed: the heap pops the earliest delivery first, in sending order within a step.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (other.at, other.order).cmp(&(self.at, self.order))
    }
}

/// A message a handler wants sent (`dst_inc`: the incarnation the sender
/// addresses; `None` = whatever the destination is now).
struct Out {
    src: usize,
    dst: usize,
    dst_inc: Option<u64>,
    msg: Msg,
}

fn out(src: usize, dst: usize, msg: Msg) -> Out {
    Out {
        src,
        dst,
        dst_inc: None,
        msg,
    }
}

// ---------------------------------------------------------------- nodes

/// One node's copy of one segment: the crate's state machine plus the records.
#[derive(Clone, Debug)]
struct Replica {
    seg: FollowerSegment,
    data: Vec<u64>,
    /// The leader epoch of the incarnation of the segment number it holds
    /// (what the broker reads from its batches).
    epoch: u64,
    /// Where to send acks (volatile, learned from the appends).
    primary: Option<usize>,
}

impl Replica {
    fn empty(epoch: u64) -> Replica {
        Replica {
            seg: FollowerSegment::default(),
            data: Vec::new(),
            epoch,
            primary: None,
        }
    }
}

/// The primary's volatile state for the segment it leads.
#[derive(Clone, Debug)]
struct Primary {
    seg: usize,
    epoch: u64,
    base: u64,
    replicas: Vec<usize>,
    /// Per replica index (0 = this node, unused): next position to send.
    sent_to: Vec<u64>,
    /// Per replica index: largest durable end acked.
    durable: Vec<u64>,
    last_reset: Vec<Option<(u64, u64)>>,
    last_progress: Vec<u64>,
    /// Records acknowledged to clients (a position in the segment).
    acked: u64,
    /// The idempotent producer state: every record id stored in the log
    /// before and in this segment, as this primary knows it (a retry of
    /// one is not stored again).
    known: HashSet<u64>,
}

#[derive(Clone, Debug)]
struct Unrecorded {
    seg: usize,
    epoch: u64,
    base: u64,
    /// The rolled segment's size.
    rolled_at: u64,
    known: HashSet<u64>,
    /// Acknowledged on the local fsync (the `AckUnrecordedRoll` bug only).
    acked: u64,
    /// When the controller was last asked to record the roll.
    record_sent: Option<u64>,
}

#[derive(Clone, Debug, Default)]
struct Node {
    alive: bool,
    /// Bumped at every crash; messages addressed to an older one are lost.
    inc: u64,
    copies: BTreeMap<usize, Replica>,
    primary: Option<Primary>,
    /// Copies with written bytes not yet fsynced.
    dirty: BTreeSet<usize>,
    /// Copies neither fenced nor sealed (they ack their primary after fsyncs).
    open_copies: BTreeSet<usize>,
    /// Producer snapshots (durable): per segment, the ids stored before it.
    snapshots: BTreeMap<usize, Vec<u64>>,
    /// Per segment it is to lead, how many Opens it put off for a snapshot.
    snapshot_waits: BTreeMap<usize, u32>,
    /// A primary's local roll the controller has not recorded yet: the
    /// segment it appends to now (not shipped: followers refuse a segment
    /// the image does not have), while `primary` still ships and commits
    /// the rolled one.
    next: Option<Unrecorded>,
    /// The producer snapshot a primary wrote as its log closed at a fence
    /// (segment, its end, the ids up to there): the one where the next
    /// segment starts, kept only if the seal is at that end.
    closed: Option<(usize, u64, Vec<u64>)>,
}

impl Node {
    /// Its log closes (fenced, sealed, refused): the roll it made on its own
    /// and never got recorded goes with it (`lost_log`).
    fn drop_own_roll(&mut self) -> Option<Unrecorded> {
        let x = self.next.take()?;
        self.copies.remove(&x.seg);
        self.open_copies.remove(&x.seg);
        self.dirty.remove(&x.seg);
        // With the files it starts with (`lost_log::leftovers`).
        self.snapshots.remove(&x.seg);
        Some(x)
    }

    /// The image fences or seals segment `seg` (at `epoch`) while this
    /// node's own roll has that number: at the same epoch it is the roll,
    /// recorded before the Open came (the file is the image's segment now);
    /// at another, a zombie's roll, which goes with its log.
    fn adopt_or_drop_roll(&mut self, seg: usize, epoch: u64) {
        match &self.next {
            Some(x) if x.seg == seg && x.epoch == epoch => {
                self.next = None;
                self.primary = None;
            }
            Some(x) if x.seg == seg => {
                self.primary = None;
                self.drop_own_roll();
            }
            _ => {}
        }
    }

    fn copy(&mut self, seg: usize, epoch: u64) -> &mut Replica {
        if !self.copies.contains_key(&seg) {
            self.open_copies.insert(seg);
        }
        self.copies
            .entry(seg)
            .or_insert_with(|| Replica::empty(epoch))
    }
}

// ---------------------------------------------------------------- controller

#[derive(Clone, Debug)]
enum SegState {
    Active,
    Fencing {
        reports: Vec<FenceReport>,
        /// A replica that is not to lead the next segment (it resigned).
        avoid: Option<usize>,
    },
    Sealed {
        size: u64,
        source: usize,
        done: Vec<bool>,
        /// Recorded from its primary's local roll (a quorum holds it, not
        /// necessarily the primary itself: repairs ask every replica).
        rolled: bool,
    },
}

#[derive(Clone, Debug)]
struct SegMeta {
    replicas: Vec<usize>,
    base: u64,
    /// Bumped by every open the controller decides; a recorded roll keeps it.
    epoch: u64,
    /// The primary's incarnation when the segment was opened.
    primary_inc: u64,
    opened: bool,
    state: SegState,
}

#[derive(Clone, Debug)]
struct Controller {
    segs: Vec<SegMeta>,
    last_heard: [u64; NODES],
    seen_inc: [u64; NODES],
    /// Sealed segments with replicas not yet done.
    pending_seals: BTreeSet<usize>,
    /// A node that resigned from the last segment: not the next primary.
    avoid_next: Option<usize>,
}

#[derive(Clone, Copy, Debug)]
enum Reason {
    Unreachable,
    Restarted,
    Voluntary,
    /// The primary cannot lead (no replica serves the producer snapshot it
    /// needs) and asks for a seal that hands the next segment to another.
    Resigned,
}

// ---------------------------------------------------------------- the simulation

#[derive(Clone, Debug, Default)]
struct Stats {
    runs: u64,
    steps: u64,
    messages: u64,
    drops: u64,
    dups: u64,
    cut_drops: u64,
    mismatches: u64,
    crashes: u64,
    restarts: u64,
    partitions: u64,
    failovers_unreachable: u64,
    failovers_restarted: u64,
    failovers_voluntary: u64,
    seals: u64,
    truncations: u64,
    /// Producer snapshots a truncation dropped (a roll's at the longer end).
    snapshots_dropped: u64,
    /// Fetched producer snapshots refused (taken at another offset).
    snapshots_refused: u64,
    /// Repair transfers applied (a `Data` message landing on a short copy).
    repairs: u64,
    /// Opens a node put off until its copies of older segments were complete.
    lead_waits: u64,
    /// Client reads served by a primary, and those of older segments.
    reads: u64,
    history_reads: u64,
    /// Retries of unacknowledged records, and those a primary knew.
    retries: u64,
    duplicates_refused: u64,
    /// Opens put off for a producer snapshot, and snapshots transferred.
    snapshot_waits: u64,
    /// Primaries that handed their unopened segment on for want of one.
    resignations: u64,
    /// Active controllers replaced (what they held only in memory lost).
    controller_failovers: u64,
    /// Local rolls, and those the controller recorded.
    rolls: u64,
    rolls_recorded: u64,
    /// Recorded rolls that opened the next segment on another replica set.
    rolls_placed: u64,
    /// Files a restart dropped (unrecorded rolls, other epochs).
    stale_files: u64,
    snapshot_transfers: u64,
    segments: u64,
    appended: u64,
    acked: u64,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.runs += o.runs;
        self.steps += o.steps;
        self.messages += o.messages;
        self.drops += o.drops;
        self.dups += o.dups;
        self.cut_drops += o.cut_drops;
        self.mismatches += o.mismatches;
        self.crashes += o.crashes;
        self.restarts += o.restarts;
        self.partitions += o.partitions;
        self.controller_failovers += o.controller_failovers;
        self.failovers_unreachable += o.failovers_unreachable;
        self.failovers_restarted += o.failovers_restarted;
        self.failovers_voluntary += o.failovers_voluntary;
        self.seals += o.seals;
        self.truncations += o.truncations;
        self.snapshots_dropped += o.snapshots_dropped;
        self.snapshots_refused += o.snapshots_refused;
        self.repairs += o.repairs;
        self.lead_waits += o.lead_waits;
        self.reads += o.reads;
        self.history_reads += o.history_reads;
        self.retries += o.retries;
        self.duplicates_refused += o.duplicates_refused;
        self.snapshot_waits += o.snapshot_waits;
        self.resignations += o.resignations;
        self.rolls += o.rolls;
        self.rolls_recorded += o.rolls_recorded;
        self.rolls_placed += o.rolls_placed;
        self.stale_files += o.stale_files;
        self.snapshot_transfers += o.snapshot_transfers;
        self.segments += o.segments;
        self.appended += o.appended;
        self.acked += o.acked;
    }
}

struct Sim {
    rf: usize,
    /// Records per segment before its primary rolls it (`segment.bytes`).
    roll_at: u64,
    bug: Bug,
    faults: Faults,
    rng: Rng,
    /// Draws controller failovers in chaos runs, apart from `rng` so that
    /// the other faults of a seed stay what they were before they existed.
    ctrl_failover_rng: Option<Rng>,
    /// Draws of the placement at recorded rolls (its own stream: the other
    /// draws stay as they were).
    roll_placement_rng: Rng,
    now: u64,
    nodes: Vec<Node>,
    ctrl: Controller,
    net: BinaryHeap<Envelope>,
    /// Messages sent so far (orders deliveries due at the same step).
    sent: u64,
    outbox: Vec<Out>,
    /// Nodes cut off from the others and from the controller (bitmask).
    cut: u32,
    cut_until: u64,
    appending: bool,
    next_id: u64,
    appended: Vec<u64>,
    /// offset → record id, for every record acknowledged to a client.
    acked: BTreeMap<u64, u64>,
    /// offset → record id, for every record a client read.
    read: BTreeMap<u64, u64>,
    /// The ids of `acked`.
    acked_ids: HashSet<u64>,
    /// Where in `appended` the oldest record not acknowledged is.
    oldest_unacked: usize,
    stats: Stats,
    violations: Vec<String>,
    trace: bool,
}

macro_rules! trace {
    ($sim:expr, $($arg:tt)*) => {
        if $sim.trace {
            eprintln!("[{:>5}] {}", $sim.now, format!($($arg)*));
        }
    };
}

impl Sim {
    fn new(seed: u64, bug: Bug, faulty: bool) -> Sim {
        let mut rng = Rng::new(seed);
        let rf = rf_of(seed);
        let faults = if faulty {
            Faults::chaos(&mut rng)
        } else {
            Faults::calm(rng.range(1, 6), 0.2)
        };
        let nodes = (0..NODES)
            .map(|_| Node {
                alive: true,
                ..Node::default()
            })
            .collect();
        let roll_at = rng.range(25, 90);
        let mut sim = Sim {
            rf,
            roll_at,
            bug,
            faults,
            rng,
            ctrl_failover_rng: faulty.then(|| Rng::new(seed ^ 0x00c0_ffee_0000_0001)),
            roll_placement_rng: Rng::new(seed ^ 0x0000_0000_7011_0001),
            now: 0,
            nodes,
            ctrl: Controller {
                segs: Vec::new(),
                last_heard: [0; NODES],
                seen_inc: [0; NODES],
                pending_seals: BTreeSet::new(),
                avoid_next: None,
            },
            net: BinaryHeap::new(),
            sent: 0,
            outbox: Vec::new(),
            cut: 0,
            cut_until: 0,
            appending: true,
            next_id: 1,
            appended: Vec::new(),
            acked: BTreeMap::new(),
            read: BTreeMap::new(),
            acked_ids: HashSet::new(),
            oldest_unacked: 0,
            stats: Stats {
                runs: 1,
                ..Stats::default()
            },
            violations: Vec::new(),
            trace: false,
        };
        sim.open_segment(None, 0);
        sim.flush();
        sim
    }

    fn violation(&mut self, what: String) {
        trace!(self, "VIOLATION {what}");
        if self.violations.len() < 20 {
            self.violations.push(what);
        }
    }

    // ------------------------------------------------------------ network

    fn side(&self, x: usize) -> bool {
        x != CTRL && self.cut & (1 << x) != 0
    }

    fn cut_between(&self, a: usize, b: usize) -> bool {
        self.side(a) != self.side(b)
    }

    fn inc_of(&self, x: usize) -> u64 {
        if x == CTRL {
            0
        } else {
            self.nodes[x].inc
        }
    }

    fn flush(&mut self) {
        for o in std::mem::take(&mut self.outbox) {
            self.stats.messages += 1;
            if self.rng.chance(self.faults.drop) {
                self.stats.drops += 1;
                continue;
            }
            let copies = if self.rng.chance(self.faults.dup) {
                self.stats.dups += 1;
                2
            } else {
                1
            };
            let dst_inc = o.dst_inc.unwrap_or_else(|| self.inc_of(o.dst));
            for _ in 0..copies {
                self.sent += 1;
                let env = Envelope {
                    at: self.now
                        + if self.rng.chance(self.faults.reorder) {
                            self.rng.range(1, self.faults.max_delay)
                        } else {
                            1
                        },
                    order: self.sent,
                    src: o.src,
                    src_inc: self.inc_of(o.src),
                    dst: o.dst,
                    dst_inc,
                    msg: o.msg.clone(),
                };
                self.net.push(env);
            }
        }
    }

    fn deliver_due(&mut self) {
        while self.net.peek().is_some_and(|e| e.at <= self.now) {
            let env = self.net.pop().expect("peeked");
            if self.cut_between(env.src, env.dst) {
                self.stats.cut_drops += 1;
                continue;
            }
            if env.dst == CTRL {
                self.ctrl_receive(env.src, env.msg);
            } else {
                let node = &self.nodes[env.dst];
                if !node.alive || node.inc != env.dst_inc {
                    continue;
                }
                self.node_receive(env.dst, env.src, env.msg);
            }
            self.flush();
        }
    }

    // ------------------------------------------------------------ faults

    fn inject_faults(&mut self) {
        if self.cut != 0 && self.now >= self.cut_until {
            trace!(self, "partition healed");
            self.cut = 0;
        }
        if self.cut == 0 && self.rng.chance(self.faults.partition) {
            // 1 to 3 of the 5 nodes: the controller may be left with a minority.
            let size = self.rng.range(1, 3) as usize;
            while (self.cut.count_ones() as usize) < size {
                self.cut |= 1 << self.rng.below(NODES as u64);
            }
            self.cut_until = self.now + self.rng.range(10, 150);
            self.stats.partitions += 1;
            trace!(
                self,
                "partition: cut {:05b} until {}",
                self.cut,
                self.cut_until
            );
        }
        let down = self.nodes.iter().filter(|n| !n.alive).count();
        if down < self.faults.max_down && self.rng.chance(self.faults.crash) {
            let n = self.rng.below(NODES as u64) as usize;
            if self.nodes[n].alive {
                self.crash(n);
            }
        }
        for n in 0..NODES {
            if !self.nodes[n].alive && self.rng.chance(self.faults.restart) {
                self.restart(n);
            }
        }
    }

    fn crash(&mut self, n: usize) {
        self.stats.crashes += 1;
        let node = &mut self.nodes[n];
        node.alive = false;
        node.inc += 1;
        for r in node.copies.values_mut() {
            // What survives a crash is what was fsynced; fences and seals are durable.
            r.data.truncate(r.seg.durable as usize);
            r.seg = FollowerSegment::recovered(r.seg.durable, r.seg.fenced, r.seg.sealed_size);
            r.primary = None;
        }
        node.dirty.clear();
        // A roll's producer snapshot is written once the rolled segment is
        // fsynced: without that, the crash took both.
        if let Some(x) = node.next.take() {
            let synced = node
                .copies
                .get(&(x.seg - 1))
                .is_some_and(|r| r.seg.durable >= x.rolled_at);
            if !synced {
                node.snapshots.remove(&x.seg);
            }
        }
        if self.bug == Bug::ResumeAfterRestart {
            if let Some(p) = node.primary.as_mut() {
                p.sent_to.iter_mut().for_each(|s| *s = 0);
            }
        } else {
            node.primary = None;
        }
        // Its messages still in flight: some were on the wire, some die with it.
        let mut kept = Vec::with_capacity(self.net.len());
        for env in std::mem::take(&mut self.net).into_vec() {
            if env.src == n && env.src_inc + 1 == self.nodes[n].inc && self.rng.chance(0.5) {
                continue;
            }
            kept.push(env);
        }
        self.net = BinaryHeap::from(kept);
        trace!(self, "node {n} crashed");
    }

    fn restart(&mut self, n: usize) {
        self.stats.restarts += 1;
        self.nodes[n].alive = true;
        // Files of segments the image never recorded go (its own rolls), and
        // files of a number the image records at another epoch
        // (`lost_log::other_epoch_files`; a sealed one is repaired afresh),
        // and an empty one of such a number it is no replica of.
        let bug = self.bug;
        let segs = &self.ctrl.segs;
        let node = &mut self.nodes[n];
        let stale: Vec<usize> = node
            .copies
            .iter()
            .filter(|(&seg, r)| {
                segs.get(seg).is_none_or(|m| {
                    (m.epoch != r.epoch && bug != Bug::KeepOtherEpochAtRestart && !r.data.is_empty())
                        // Not a replica of it (the broker's foreign-copy check).
                        || (!m.replicas.contains(&n) && r.epoch != m.epoch)
                })
            })
            .map(|(&seg, _)| seg)
            .collect();
        for seg in stale {
            let r = node.copies.remove(&seg).expect("listed");
            node.open_copies.remove(&seg);
            // With the files it starts with where the broker removes them
            // (`discard_unrecorded_segments`, `discard_other_epoch_files`;
            // the foreign-copy check removes the copy alone).
            if segs
                .get(seg)
                .is_none_or(|m| m.epoch != r.epoch && !r.data.is_empty())
            {
                node.snapshots.remove(&seg);
            }
            if let Some(m) = segs.get(seg) {
                if matches!(m.state, SegState::Sealed { .. }) && m.replicas.contains(&n) {
                    node.copies.insert(seg, Replica::empty(m.epoch));
                }
            }
            self.stats.stale_files += 1;
        }
        trace!(
            self,
            "node {n} restarted (incarnation {})",
            self.nodes[n].inc
        );
    }

    // ------------------------------------------------------------ nodes

    fn node_receive(&mut self, n: usize, src: usize, msg: Msg) {
        match msg {
            Msg::Append {
                seg,
                epoch,
                pos,
                recs,
            } => self.on_append(n, src, seg, epoch, pos, recs),
            Msg::Ack { seg, durable } => self.on_ack(n, src, seg, durable),
            Msg::Mismatch { seg, end } => self.on_mismatch(n, src, seg, end),
            Msg::Open {
                seg,
                base,
                replicas,
            } => self.on_open(n, seg, base, replicas),
            Msg::Fence { seg } => self.on_fence(n, seg),
            Msg::Seal { seg, size, source } => self.on_seal(n, seg, size, source),
            Msg::Read { seg, from, to } => self.on_read(n, src, seg, from, to),
            Msg::Data { seg, pos, recs } => self.on_data(n, seg, pos, recs),
            Msg::ReadSnapshot { seg } => {
                if let Some(ids) = self.nodes[n].snapshots.get(&seg) {
                    let ids = ids.clone();
                    self.outbox
                        .push(out(n, src, Msg::SnapshotData { seg, ids }));
                }
            }
            Msg::SnapshotData { seg, ids } => {
                // Kept only if taken where the image says the segment
                // starts (the broker compares each partition's offset in
                // the file with the image's sealed ends): a zombie
                // primary's own roll, or a copy's roll past its seal,
                // describes records the log does not hold. A snapshot here
                // holds every record before its segment, one per offset,
                // so its length is the offset it was taken at.
                if ids.len() as u64 != self.ctrl.segs[seg].base
                    && self.bug != Bug::AcceptAnySnapshot
                {
                    self.stats.snapshots_refused += 1;
                    trace!(
                        self,
                        "node {n} refuses a producer snapshot of segment {seg} taken at {}",
                        ids.len()
                    );
                    return;
                }
                if self.nodes[n].snapshots.insert(seg, ids).is_none() {
                    self.stats.snapshot_transfers += 1;
                }
            }
            other => self.violation(format!("node {n} got a controller message {other:?}")),
        }
    }

    fn on_append(
        &mut self,
        n: usize,
        src: usize,
        seg: usize,
        epoch: u64,
        pos: u64,
        recs: Vec<u64>,
    ) {
        // A follower takes appends only for the image's active segment at
        // that epoch (the broker's `follower_dir`), and none into a segment
        // its own log holds (`own_log_holds`).
        let imaged = self.ctrl.segs.get(seg).is_some_and(|m| {
            m.epoch == epoch
                && !matches!(m.state, SegState::Sealed { .. })
                && m.replicas[1..].contains(&n)
        });
        let node = &mut self.nodes[n];
        if !imaged
            || node.primary.as_ref().is_some_and(|p| p.seg == seg)
            || node.next.as_ref().is_some_and(|x| x.seg == seg)
        {
            return;
        }
        // An existing file is taken as the copy whatever wrote it (the
        // broker's replica store does; a restart drops another epoch's).
        let r = node.copy(seg, epoch);
        if r.data.is_empty() {
            // The first batch written tells the file's epoch.
            r.epoch = epoch;
        }
        r.primary = Some(src);
        match r.seg.offer(pos, recs.len() as u64) {
            Offer::Accept => {
                r.data.extend_from_slice(&recs);
                r.seg.wrote(recs.len() as u64);
                node.dirty.insert(seg);
            }
            Offer::Mismatch { end } => {
                self.stats.mismatches += 1;
                self.outbox.push(out(n, src, Msg::Mismatch { seg, end }));
            }
            Offer::Refused => {}
        }
    }

    fn on_ack(&mut self, n: usize, src: usize, seg: usize, durable: u64) {
        let now = self.now;
        let Some(p) = self.nodes[n].primary.as_mut() else {
            return;
        };
        if p.seg != seg {
            return;
        }
        let Some(i) = p.replicas.iter().position(|&r| r == src) else {
            return;
        };
        if durable > p.durable[i] {
            p.durable[i] = durable;
            p.last_progress[i] = now;
        }
        self.pump(n, i);
        self.advance_commit(n);
    }

    fn on_mismatch(&mut self, n: usize, src: usize, seg: usize, end: u64) {
        let now = self.now;
        let quiet = 2 * self.faults.max_delay + 2;
        let Some(p) = self.nodes[n].primary.as_mut() else {
            return;
        };
        if p.seg != seg {
            return;
        }
        let Some(i) = p.replicas.iter().position(|&r| r == src) else {
            return;
        };
        // Reordered appends produce a burst of mismatches: resend once per
        // round trip unless the follower went back (it restarted); the
        // retransmit timer covers what this skips.
        if let Some((e, t)) = p.last_reset[i] {
            if end >= e && now - t < quiet {
                return;
            }
        }
        p.sent_to[i] = end;
        p.last_reset[i] = Some((end, now));
        self.pump(n, i);
    }

    /// Sends follower `i` what it lacks, within the window.
    fn pump(&mut self, n: usize, i: usize) {
        let node = &mut self.nodes[n];
        let Some(p) = node.primary.as_mut() else {
            return;
        };
        let r = &node.copies[&p.seg];
        let written = r.data.len() as u64;
        while p.sent_to[i] < written && p.sent_to[i] < p.durable[i] + WINDOW {
            let from = p.sent_to[i];
            let to = written.min(from + CHUNK).min(p.durable[i] + WINDOW);
            self.outbox.push(out(
                n,
                p.replicas[i],
                Msg::Append {
                    seg: p.seg,
                    epoch: p.epoch,
                    pos: from,
                    recs: r.data[from as usize..to as usize].to_vec(),
                },
            ));
            p.sent_to[i] = to;
        }
    }

    /// The primary acknowledges to clients what a majority holds durably.
    fn advance_commit(&mut self, n: usize) {
        let rf = self.rf;
        let bug = self.bug;
        let node = &mut self.nodes[n];
        let Some(p) = node.primary.as_mut() else {
            return;
        };
        let r = &node.copies[&p.seg];
        let own = r.seg.durable;
        let mut committed = if bug == Bug::AckOwnDurable {
            own
        } else {
            let mut ends = Vec::with_capacity(p.replicas.len());
            ends.push(own);
            ends.extend_from_slice(&p.durable[1..]);
            committed_end(&ends, quorum_size(rf))
        };
        let mut bad = None;
        if committed > r.data.len() as u64 {
            if bug == Bug::None {
                bad = Some(format!(
                    "primary {n} of segment {} computed committed end {committed} past its own copy ({})",
                    p.seg,
                    r.data.len()
                ));
            }
            committed = r.data.len() as u64;
        }
        let mut acks = Vec::new();
        while p.acked < committed {
            acks.push((p.seg, p.base, p.acked, r.data[p.acked as usize]));
            p.acked += 1;
        }
        if let Some(b) = bad {
            self.violation(b);
        }
        for (seg, base, pos, id) in acks {
            self.record_ack(seg, base, pos, id);
        }
        self.maybe_record_roll(n);
    }

    /// The `AckUnrecordedRoll` bug: records of an unrecorded roll
    /// acknowledged once durable here (a primary without followers).
    fn ack_unrecorded(&mut self, n: usize) {
        let node = &mut self.nodes[n];
        let Some(x) = node.next.as_mut() else {
            return;
        };
        let r = &node.copies[&x.seg];
        let mut acks = Vec::new();
        while x.acked < r.seg.durable {
            acks.push((x.base + x.acked, r.data[x.acked as usize]));
            x.acked += 1;
        }
        for (offset, id) in acks {
            self.stats.acked += 1;
            self.acked_ids.insert(id);
            self.acked.insert(offset, id);
        }
    }

    /// A rolled segment is recorded once a quorum holds all of it (the
    /// broker's `record_range_rolls` waits for its commit): a sealed size in
    /// the image is then durable on a quorum, whatever crashes next.
    fn maybe_record_roll(&mut self, n: usize) {
        let now = self.now;
        let bug = self.bug;
        let node = &mut self.nodes[n];
        let (Some(p), Some(next)) = (node.primary.as_ref(), node.next.as_mut()) else {
            return;
        };
        if next.record_sent.is_some_and(|t| now - t < RESEND) {
            return;
        }
        if p.acked >= next.rolled_at || bug == Bug::RecordRollBeforeCommit {
            next.record_sent = Some(now);
            let msg = Msg::RecordRoll {
                seg: p.seg,
                epoch: p.epoch,
                size: next.rolled_at,
            };
            self.outbox.push(out(n, CTRL, msg));
        }
    }

    fn record_ack(&mut self, seg: usize, base: u64, pos: u64, id: u64) {
        let meta = &self.ctrl.segs[seg];
        let offset = base + pos;
        if meta.base != base {
            let b = meta.base;
            self.violation(format!(
                "the primary of segment {seg} puts it at offset {base}, the controller at {b}"
            ));
        }
        let meta = &self.ctrl.segs[seg];
        if let SegState::Sealed { size, .. } = meta.state {
            if pos >= size {
                self.violation(format!(
                    "record {id} acknowledged at offset {offset} (segment {seg} position {pos}) after the segment was sealed at {size}"
                ));
            }
        }
        self.stats.acked += 1;
        self.acked_ids.insert(id);
        if let Some(prev) = self.acked.insert(offset, id) {
            if prev != id {
                self.violation(format!(
                    "offset {offset} acknowledged as record {prev} and as record {id}"
                ));
            }
        }
    }

    fn on_open(&mut self, n: usize, seg: usize, base: u64, replicas: Vec<usize>) {
        let epoch = self.ctrl.segs[seg].epoch;
        let now = self.now;
        let node = &mut self.nodes[n];
        // Its own roll, recorded: it ships and commits it from now on.
        if let Some(x) = node.next.take_if(|x| x.seg == seg) {
            if x.epoch == epoch && x.base == base {
                let k = replicas.len();
                let held: HashSet<u64> = node.copies[&seg].data.iter().copied().collect();
                let mut before: Vec<u64> = x
                    .known
                    .iter()
                    .copied()
                    .filter(|id| !held.contains(id))
                    .collect();
                before.sort_unstable();
                node.snapshots.entry(seg).or_insert(before);
                node.primary = Some(Primary {
                    seg,
                    epoch,
                    base,
                    replicas,
                    sent_to: vec![0; k],
                    durable: vec![0; k],
                    last_reset: vec![None; k],
                    last_progress: vec![now; k],
                    acked: 0,
                    known: x.known,
                });
                self.stats.rolls_recorded += 1;
                trace!(self, "node {n}'s roll to segment {seg} is recorded");
                self.outbox.push(out(n, CTRL, Msg::OpenAck { seg }));
                for i in 1..k {
                    self.pump(n, i);
                }
                self.advance_commit(n);
                return;
            }
            // Another incarnation of the number: its own roll goes.
            node.copies.remove(&seg);
            node.open_copies.remove(&seg);
            node.dirty.remove(&seg);
            node.snapshots.remove(&seg);
        }
        let node = &mut self.nodes[n];
        if node.primary.as_ref().is_none_or(|p| p.seg != seg) {
            if node
                .copies
                .get(&seg)
                .is_some_and(|r| r.seg.fenced || r.seg.sealed_size.is_some())
            {
                return;
            }
            // The history it keeps must be complete first (the controller
            // resends the Open; the seals' resends drive the repairs).
            let sealed = |s: u32| match &self.ctrl.segs[s as usize].state {
                SegState::Sealed { size, .. } => Some(*size),
                _ => None,
            };
            let short = short_copies(
                node.copies
                    .keys()
                    .map(|&s| s as u32)
                    .filter(|&s| (s as usize) < seg),
                |s| sealed(s).is_some() && self.ctrl.segs[s as usize].replicas.contains(&n),
                |s| {
                    let r = &node.copies[&(s as usize)].seg;
                    r.is_complete() && r.sealed_size == sealed(s)
                },
            );
            if !short.is_empty() && self.bug != Bug::LeadWithShortCopy {
                self.stats.lead_waits += 1;
                trace!(
                    self,
                    "node {n} waits to open segment {seg}: copies {short:?} are short"
                );
                return;
            }
            // The producer state of the history it does not hold: the
            // snapshot where its local run starts (the broker's rule).
            // A segment sealed empty holds no history: every node holds it.
            let mut local: Vec<u32> = node
                .copies
                .keys()
                .map(|&s| s as u32)
                .filter(|&s| (s as usize) <= seg)
                .chain((0..seg as u32).filter(|&s| sealed_empty(&self.ctrl.segs, s as usize)))
                .collect();
            local.sort_unstable();
            local.dedup();
            if !local.contains(&(seg as u32)) {
                local.push(seg as u32);
            }
            let needed = snapshot_needed_to_lead(0, &local, false, |s| {
                node.snapshots.contains_key(&(s as usize))
            });
            if let Some(k) = needed.filter(|_| self.bug != Bug::LeadWithoutSnapshot) {
                let k = k as usize;
                let replicas_of = |s: usize| -> Vec<i32> {
                    self.ctrl.segs[s]
                        .replicas
                        .iter()
                        .map(|&r| r as i32)
                        .collect()
                };
                let previous = k.checked_sub(1).map(replicas_of).unwrap_or_default();
                for peer in snapshot_sources(n as i32, &replicas_of(k), &previous) {
                    self.outbox
                        .push(out(n, peer as usize, Msg::ReadSnapshot { seg: k }));
                }
                self.stats.snapshot_waits += 1;
                trace!(
                    self,
                    "node {n} waits to open segment {seg}: no snapshot at {k}"
                );
                // Nobody may have it (the segment's primary never opened
                // it): after a few tries, hand the range to a replica that
                // can lead (the broker's rule, `RESIGN_AFTER_ATTEMPTS`).
                let waits = self.nodes[n].snapshot_waits.entry(seg).or_default();
                *waits += 1;
                if waits.is_multiple_of(3) {
                    self.outbox.push(out(n, CTRL, Msg::Resign { seg }));
                }
                return;
            }
            // Kafka's reload: the newest snapshot in the local run, then the
            // local segments from there (or all of them, from the start).
            let from = local
                .iter()
                .rev()
                .map(|&s| s as usize)
                .find(|s| node.snapshots.contains_key(s));
            let mut known: HashSet<u64> = from
                .map(|s| node.snapshots[&s].iter().copied().collect())
                .unwrap_or_default();
            for r in node.copies.range(from.unwrap_or(0)..seg).map(|(_, r)| r) {
                known.extend(r.data.iter().copied());
            }
            let node = &mut self.nodes[n];
            let mut ids: Vec<u64> = known.iter().copied().collect();
            ids.sort_unstable();
            node.snapshots.insert(seg, ids);
            node.copy(seg, epoch);
            let k = replicas.len();
            node.primary = Some(Primary {
                seg,
                epoch,
                base,
                replicas,
                sent_to: vec![0; k],
                durable: vec![0; k],
                last_reset: vec![None; k],
                last_progress: vec![self.now; k],
                acked: 0,
                known,
            });
            trace!(self, "node {n} opens segment {seg} at offset {base}");
        }
        self.outbox.push(out(n, CTRL, Msg::OpenAck { seg }));
    }

    fn on_fence(&mut self, n: usize, seg: usize) {
        let epoch = self.ctrl.segs[seg].epoch;
        let node = &mut self.nodes[n];
        // A roll past the fenced segment is this log's own, never recorded
        // (followers refused it): it goes as the log closes (`lost_log`).
        if node.next.as_ref().is_some_and(|x| x.seg == seg + 1) {
            node.drop_own_roll();
        }
        // Its roll was recorded (the image fences it) and the Open has not
        // come yet: the file is the image's segment now, and is fenced as
        // such (the broker's `lost_log` keeps it: a seal may come from it).
        node.adopt_or_drop_roll(seg, epoch);
        let r = node.copy(seg, epoch);
        // `fence` persists the flag and fsyncs everything written first.
        let end = r.seg.fence();
        node.dirty.remove(&seg);
        node.open_copies.remove(&seg);
        if let Some(p) = node.primary.take_if(|p| p.seg == seg) {
            // The snapshot a clean close writes where the next segment
            // starts (after a roll, `known` stopped at the rolled end).
            let mut ids: Vec<u64> = p.known.into_iter().collect();
            ids.sort_unstable();
            node.closed = Some((seg, end, ids));
        }
        self.outbox.push(out(n, CTRL, Msg::Fenced { seg, end }));
    }

    fn on_seal(&mut self, n: usize, seg: usize, size: u64, source: usize) {
        let bug = self.bug;
        let epoch = self.ctrl.segs[seg].epoch;
        let node = &mut self.nodes[n];
        // Its own roll, recorded and now sealed before the Open came: the
        // file is the image's segment (as at a fence).
        node.adopt_or_drop_roll(seg, epoch);
        if let Some((_, end, ids)) = node.closed.take_if(|c| c.0 == seg) {
            // A longer end than the seal: the tail it describes is cut.
            if end == size {
                node.snapshots.entry(seg + 1).or_insert(ids);
            }
        }
        let r = node.copy(seg, epoch);
        let action = r.seg.seal(size);
        let mut done = false;
        let mut truncated = false;
        let mut read = None;
        match action {
            SealAction::Complete => {
                // Done means durable: fsync what the seal keeps.
                if bug != Bug::SealWithoutSync {
                    r.seg.synced(size);
                }
                done = true;
            }
            SealAction::Truncate { size } => {
                r.data.truncate(size as usize);
                if bug != Bug::SealWithoutSync {
                    r.seg.synced(size);
                }
                done = true;
                truncated = true;
            }
            SealAction::Repair { from, size } => read = Some((from, size)),
        }
        let (written, len) = (r.seg.written, r.data.len() as u64);
        node.open_copies.remove(&seg);
        if node.primary.as_ref().is_some_and(|p| p.seg == seg) {
            node.primary = None;
            // Its own roll, recorded at that size: the log goes on in the
            // next segment (the Open that follows). Any other seal closes it.
            let recorded = node
                .next
                .as_ref()
                .is_some_and(|x| x.seg == seg + 1 && x.rolled_at == size && source == n);
            if !recorded {
                node.drop_own_roll();
            }
        }
        if written != len {
            self.violation(format!(
                "node {n} segment {seg}: after seal({size}) written {written} but {len} records"
            ));
        }
        if truncated {
            self.stats.truncations += 1;
            trace!(self, "node {n} truncates segment {seg} to {size}");
            // The producer snapshot where the next segment starts, if this
            // node's own roll wrote it, counts the records cut: it goes
            // unless this node's open log starts there (the broker's
            // `apply_seals`).
            let node = &mut self.nodes[n];
            let open_holds_next = node.primary.as_ref().is_some_and(|p| p.seg == seg + 1)
                || node.next.as_ref().is_some_and(|x| x.seg == seg + 1);
            if !open_holds_next && node.snapshots.remove(&(seg + 1)).is_some() {
                self.stats.snapshots_dropped += 1;
            }
        }
        if done {
            self.outbox.push(out(n, CTRL, Msg::SealDone { seg }));
        }
        if let Some((from, to)) = read {
            let (replicas, rolled) = match &self.ctrl.segs[seg].state {
                SegState::Sealed { rolled, .. } => (self.ctrl.segs[seg].replicas.clone(), *rolled),
                _ => (vec![source], false),
            };
            if n == source && !rolled {
                self.violation(format!(
                    "node {n}, the source of segment {seg}'s seal at {to}, holds only {from}"
                ));
            } else if rolled {
                // A quorum holds it: ask every other replica.
                for r in replicas.into_iter().filter(|&r| r != n) {
                    self.outbox.push(out(n, r, Msg::Read { seg, from, to }));
                }
            } else {
                self.outbox
                    .push(out(n, source, Msg::Read { seg, from, to }));
            }
        }
    }

    fn on_read(&mut self, n: usize, src: usize, seg: usize, from: u64, to: u64) {
        let rolled = matches!(
            self.ctrl.segs[seg].state,
            SegState::Sealed { rolled: true, .. }
        );
        let holds = self.nodes[n]
            .copies
            .get(&seg)
            .is_some_and(|r| r.seg.durable >= to && r.data.len() as u64 >= to);
        if rolled && !holds {
            return; // another replica answers
        }
        // A copy of an older epoch than the segment's is a zombie primary's
        // unrecorded roll under the same number: refused (`service::read`).
        let epoch = self.ctrl.segs[seg].epoch;
        if self.bug != Bug::ReadAnyEpoch
            && self.nodes[n]
                .copies
                .get(&seg)
                .is_some_and(|r| r.epoch < epoch)
        {
            return;
        }
        let Some(r) = self.nodes[n].copies.get(&seg) else {
            self.violation(format!("repair source {n} has no copy of segment {seg}"));
            return;
        };
        if r.seg.durable < to || (r.data.len() as u64) < to {
            let (d, l) = (r.seg.durable, r.data.len());
            self.violation(format!(
                "repair source {n} of segment {seg} holds {l} records ({d} durable), sealed size {to}"
            ));
            return;
        }
        let recs = r.data[from as usize..to as usize].to_vec();
        self.outbox.push(out(
            n,
            src,
            Msg::Data {
                seg,
                pos: from,
                recs,
            },
        ));
    }

    fn on_data(&mut self, n: usize, seg: usize, pos: u64, recs: Vec<u64>) {
        let epoch = self.ctrl.segs[seg].epoch;
        let Some(r) = self.nodes[n].copies.get_mut(&seg) else {
            return;
        };
        if r.data.is_empty() {
            r.epoch = epoch;
        }
        let Some(size) = r.seg.sealed_size else {
            return;
        };
        let end = pos + recs.len() as u64;
        if pos != r.seg.written || end > size {
            return;
        }
        r.data.extend_from_slice(&recs);
        r.seg.repaired(end);
        let complete = r.seg.written == size;
        self.stats.repairs += 1;
        trace!(self, "node {n} repaired segment {seg} [{pos}, {end})");
        if complete {
            self.outbox.push(out(n, CTRL, Msg::SealDone { seg }));
        }
    }

    /// A client appends a few records at every node that believes it is a primary.
    fn client_appends(&mut self) {
        if !self.appending {
            return;
        }
        // Retries answered as duplicates: (node, record).
        let mut duplicates = Vec::new();
        for n in 0..NODES {
            if !self.nodes[n].alive || self.nodes[n].primary.is_none() || !self.rng.chance(0.5) {
                continue;
            }
            // New records, or (sometimes) a retry of one not acknowledged
            // yet: an idempotent producer resending after a timeout.
            // Or the oldest record not acknowledged: a producer retries
            // its oldest batch until it is acknowledged, however long.
            while self
                .appended
                .get(self.oldest_unacked)
                .is_some_and(|id| self.acked_ids.contains(id))
            {
                self.oldest_unacked += 1;
            }
            let oldest = self.appended.get(self.oldest_unacked).copied();
            let retry = if self.rng.chance(0.05) {
                oldest
            } else {
                self.appended
                    .len()
                    .checked_sub(1 + self.rng.below(64) as usize)
                    .map(|i| self.appended[i])
                    .filter(|id| self.rng.chance(0.2) && !self.acked_ids.contains(id))
            };
            let roll_at = self.roll_at;
            let node = &mut self.nodes[n];
            let p = node.primary.as_mut().expect("checked");
            // Appends go to the unrecorded roll once there is one.
            let (seg, known) = match node.next.as_mut() {
                Some(x) => (x.seg, &mut x.known),
                None => (p.seg, &mut p.known),
            };
            let ids: Vec<u64> = match retry {
                Some(id) => {
                    self.stats.retries += 1;
                    if known.contains(&id) {
                        self.stats.duplicates_refused += 1;
                        duplicates.push((n, id));
                        continue;
                    }
                    vec![id]
                }
                None => {
                    let k = self.rng.range(1, 3);
                    (0..k).map(|i| self.next_id + i).collect()
                }
            };
            let k = ids.len() as u64;
            let followers = p.replicas.len();
            let r = node.copies.get_mut(&seg).expect("a primary has its copy");
            match r.seg.offer(r.seg.written, k) {
                Offer::Accept => {
                    for &id in &ids {
                        r.data.push(id);
                        known.insert(id);
                        if retry.is_none() {
                            self.appended.push(id);
                            self.next_id += 1;
                        }
                    }
                    r.seg.wrote(k);
                    node.dirty.insert(seg);
                    self.stats.appended += k;
                }
                Offer::Refused => {
                    node.primary = None;
                    node.drop_own_roll();
                    continue;
                }
                Offer::Mismatch { end } => {
                    self.violation(format!(
                        "primary {n} offered its own end of segment {seg} got a mismatch at {end}"
                    ));
                    continue;
                }
            }
            // A local roll: the segment is full (`segment.bytes`). It is
            // recorded once committed; meanwhile appends go to the next one.
            let written = node.copies[&seg].seg.written;
            if node.next.is_none() && written >= roll_at && node.copies.contains_key(&(seg + 1)) {
                // A copy of the next number is here (this node follows the
                // segment a failover opened): this log is stale and takes
                // nothing more (the broker's `maybe_roll`).
                node.primary = None;
                continue;
            }
            if node.next.is_none() && written >= roll_at {
                let p = node.primary.as_ref().expect("checked");
                let next = Unrecorded {
                    seg: p.seg + 1,
                    epoch: p.epoch,
                    base: p.base + written,
                    rolled_at: written,
                    known: p.known.clone(),
                    acked: 0,
                    record_sent: None,
                };
                let epoch = p.epoch;
                trace!(
                    self,
                    "node {n} rolls segment {seg} at {written} to {}",
                    seg + 1
                );
                // The broker's `seal_active`: the rolled segment is fsynced,
                // then the producer snapshot where the next one starts is
                // written at the local end (longer than a seal a failover
                // commits if this node crashes before its roll is
                // recorded). Half the rolls fsync here; the others leave it
                // to `syncs`, standing for a crash that lands before the
                // roll's fsync returns (it takes the snapshot too, see
                // `crash`), which is where recording a roll before its
                // commit loses records.
                if self.rng.chance(0.5) {
                    let node = &mut self.nodes[n];
                    node.copies
                        .get_mut(&seg)
                        .expect("rolled")
                        .seg
                        .synced(written);
                }
                let node = &mut self.nodes[n];
                let mut ids: Vec<u64> = next.known.iter().copied().collect();
                ids.sort_unstable();
                node.snapshots.insert(seg + 1, ids);
                node.copy(seg + 1, epoch);
                node.next = Some(next);
                self.stats.rolls += 1;
            }
            for i in 1..followers {
                self.pump(n, i);
            }
            self.advance_commit(n);
        }
        // A retry answered as a duplicate is answered with the offset the
        // record was stored at (Kafka's DuplicateSequence): the producer
        // takes it as stored. A producer state that counts a record no
        // copy holds (a snapshot taken past what a seal kept) acknowledges
        // a record that is not in the log.
        for (n, id) in duplicates {
            let held = self
                .nodes
                .iter()
                .any(|node| node.copies.values().any(|r| r.data.contains(&id)));
            if !held {
                self.violation(format!(
                    "node {n} answered a retry of record {id} as a duplicate, but no copy holds it"
                ));
            }
        }
    }

    /// A client reads one offset below the high watermark of a node that
    /// believes it is a primary (a zombie too). The node serves it as the
    /// broker's range log does: from its own copies, in segment order, the
    /// first record at or after the offset (a short copy's missing tail is
    /// not there, so the next segment's record comes back), and from
    /// another replica's complete copy for segments it keeps none of.
    fn client_reads(&mut self) {
        for n in 0..NODES {
            if !self.nodes[n].alive || !self.rng.chance(0.3) {
                continue;
            }
            let Some(p) = self.nodes[n].primary.as_ref() else {
                continue;
            };
            let hw = p.base + p.acked;
            if hw == 0 {
                continue;
            }
            let offset = self.rng.below(hw);
            self.stats.reads += 1;
            if offset < p.base {
                self.stats.history_reads += 1;
            }
            let Some((at, id)) = self.serve_read(n, offset) else {
                continue;
            };
            if at != offset {
                self.violation(format!(
                    "a read of offset {offset} on primary {n} returned record {id} at offset {at}: committed records skipped"
                ));
            }
            if let Some(&acked) = self.acked.get(&at) {
                if acked != id {
                    self.violation(format!(
                        "a read of offset {at} on node {n} returned record {id}, acknowledged there: {acked}"
                    ));
                }
            }
            if let Some(prev) = self.read.insert(at, id) {
                if prev != id {
                    self.violation(format!(
                        "offset {at} read as record {prev} and, on node {n}, as record {id}"
                    ));
                }
            }
        }
    }

    /// What node `n`, primary of a segment, returns for a read at `offset`
    /// below its high watermark: `(offset of the record, record)`.
    fn serve_read(&self, n: usize, offset: u64) -> Option<(u64, u64)> {
        let node = &self.nodes[n];
        let p = node.primary.as_ref()?;
        let hw = p.base + p.acked;
        for (seg, meta) in self.ctrl.segs.iter().enumerate().take(p.seg + 1) {
            let end = if seg == p.seg {
                hw
            } else {
                match &meta.state {
                    SegState::Sealed { size, .. } => meta.base + size,
                    _ => continue,
                }
            };
            if end <= offset {
                continue;
            }
            let from = offset.max(meta.base) - meta.base;
            let local = node.copies.get(&seg);
            let copy = local.or_else(|| {
                self.nodes
                    .iter()
                    .filter(|o| o.alive)
                    .filter_map(|o| o.copies.get(&seg))
                    .find(|r| r.seg.is_complete())
            })?;
            let held = (copy.data.len() as u64).min(end - meta.base);
            if from < held {
                return Some((meta.base + from, copy.data[from as usize]));
            }
            // Remote: the complete copy had nothing at or after it.
            local?;
        }
        None
    }

    /// Nodes fsync at random; followers then ack their primaries.
    fn syncs(&mut self) {
        for n in 0..NODES {
            if !self.nodes[n].alive || !self.rng.chance(0.3) {
                continue;
            }
            let node = &mut self.nodes[n];
            for seg in std::mem::take(&mut node.dirty) {
                let r = node.copies.get_mut(&seg).expect("dirty copy");
                r.seg.synced(r.seg.written);
            }
            for &seg in &node.open_copies {
                let r = &node.copies[&seg];
                if let Some(p) = r.primary.filter(|&p| p != n) {
                    let durable = r.seg.durable;
                    self.outbox.push(out(n, p, Msg::Ack { seg, durable }));
                    // A follower without the segment before this one keeps
                    // the producer snapshot where it starts (the broker's rule).
                    // The nearest segment before it that is not sealed empty.
                    let previous = (0..seg).rev().find(|&s| !sealed_empty(&self.ctrl.segs, s));
                    let local = LocalHistory {
                        holds_previous: seg > 0
                            && previous.is_none_or(|s| node.copies.contains_key(&s)),
                        holds_snapshot: node.snapshots.contains_key(&seg),
                        ancestors_elsewhere: false,
                    };
                    if needs_snapshot(seg as u32, local) {
                        self.outbox.push(out(n, p, Msg::ReadSnapshot { seg }));
                    }
                }
            }
            if node.primary.is_some() {
                self.advance_commit(n);
            }
            if self.bug == Bug::AckUnrecordedRoll && self.rf == 1 {
                self.ack_unrecorded(n);
            }
        }
    }

    /// A primary whose follower made no progress for a while resends from its ack.
    fn retransmits(&mut self) {
        let patience = 4 * self.faults.max_delay + 10;
        for n in 0..NODES {
            if !self.nodes[n].alive {
                continue;
            }
            let now = self.now;
            let node = &mut self.nodes[n];
            let Some(p) = node.primary.as_mut() else {
                continue;
            };
            let written = node.copies[&p.seg].data.len() as u64;
            let mut stalled = Vec::new();
            for i in 1..p.replicas.len() {
                if p.durable[i] < written && now - p.last_progress[i] > patience {
                    p.sent_to[i] = p.durable[i];
                    p.last_progress[i] = now;
                    stalled.push(i);
                }
            }
            for i in stalled {
                self.pump(n, i);
            }
            self.maybe_record_roll(n);
        }
    }

    // ------------------------------------------------------------ controller

    fn ctrl_live(&self, n: usize) -> bool {
        self.now.saturating_sub(self.ctrl.last_heard[n]) <= TIMEOUT
    }

    /// The active controller is replaced (Kafka's KRaft leader moves): the
    /// new one knows what the metadata log holds (segments, their replica
    /// sets, epochs, states and seal sizes, brokers' incarnations) and none
    /// of what the old one held in memory: fence reports, which replicas
    /// finished a seal, whom a resignation avoided, when it last heard each
    /// broker (it grants every broker a fresh session). It retries from
    /// that state: fences again, seals again.
    fn maybe_fail_over_controller(&mut self) {
        let Some(rng) = self.ctrl_failover_rng.as_mut() else {
            return;
        };
        if !rng.chance(0.002) {
            return;
        }
        self.stats.controller_failovers += 1;
        trace!(self, "controller failover: in-memory state lost");
        self.ctrl.last_heard = [self.now; NODES];
        self.ctrl.avoid_next = None;
        for (seg, meta) in self.ctrl.segs.iter_mut().enumerate() {
            match &mut meta.state {
                SegState::Fencing { reports, avoid } => {
                    reports.clear();
                    *avoid = None;
                    for &r in &meta.replicas {
                        self.outbox.push(out(CTRL, r, Msg::Fence { seg }));
                    }
                }
                SegState::Sealed { done, .. } => {
                    done.iter_mut().for_each(|d| *d = false);
                    self.ctrl.pending_seals.insert(seg);
                }
                SegState::Active => {}
            }
        }
    }

    fn ctrl_tick(&mut self) {
        self.maybe_fail_over_controller();
        for n in 0..NODES {
            if self.nodes[n].alive
                && !self.cut_between(n, CTRL)
                && self.rng.chance(self.faults.heartbeat)
            {
                self.ctrl.last_heard[n] = self.now;
                self.ctrl.seen_inc[n] = self.nodes[n].inc;
            }
        }
        let resend = self.now.is_multiple_of(RESEND);
        let last = self.ctrl.segs.len() - 1;
        let meta = &self.ctrl.segs[last];
        match &meta.state {
            SegState::Active => {
                let p = meta.replicas[0];
                let reason = if self.ctrl.seen_inc[p] != meta.primary_inc {
                    Some(Reason::Restarted)
                } else if !self.ctrl_live(p) {
                    Some(Reason::Unreachable)
                } else if self.rng.chance(self.faults.failover) {
                    Some(Reason::Voluntary)
                } else {
                    None
                };
                if let Some(reason) = reason {
                    self.start_fence(last, reason, None);
                } else if !meta.opened && resend {
                    self.outbox.push(Out {
                        src: CTRL,
                        dst: p,
                        dst_inc: Some(meta.primary_inc),
                        msg: Msg::Open {
                            seg: last,
                            base: meta.base,
                            replicas: meta.replicas.clone(),
                        },
                    });
                }
            }
            SegState::Fencing { reports, .. } => {
                if resend {
                    for &r in &meta.replicas {
                        if !reports.iter().any(|x| x.replica == r as i32) {
                            self.outbox.push(out(CTRL, r, Msg::Fence { seg: last }));
                        }
                    }
                }
            }
            SegState::Sealed { .. } => self.open_next(),
        }
        if resend {
            for &seg in &self.ctrl.pending_seals {
                let meta = &self.ctrl.segs[seg];
                if let SegState::Sealed {
                    size, source, done, ..
                } = &meta.state
                {
                    for (i, &r) in meta.replicas.iter().enumerate() {
                        if !done[i] {
                            self.outbox.push(out(
                                CTRL,
                                r,
                                Msg::Seal {
                                    seg,
                                    size: *size,
                                    source: *source,
                                },
                            ));
                        }
                    }
                }
            }
        }
    }

    fn start_fence(&mut self, seg: usize, reason: Reason, avoid: Option<usize>) {
        match reason {
            Reason::Resigned => self.stats.resignations += 1,
            Reason::Unreachable => self.stats.failovers_unreachable += 1,
            Reason::Restarted => self.stats.failovers_restarted += 1,
            Reason::Voluntary => self.stats.failovers_voluntary += 1,
        }
        trace!(self, "controller fences segment {seg} ({reason:?})");
        let meta = &mut self.ctrl.segs[seg];
        meta.state = SegState::Fencing {
            reports: Vec::new(),
            avoid,
        };
        for &r in &meta.replicas {
            self.outbox.push(out(CTRL, r, Msg::Fence { seg }));
        }
    }

    fn ctrl_receive(&mut self, src: usize, msg: Msg) {
        match msg {
            Msg::OpenAck { seg } => self.ctrl.segs[seg].opened = true,
            Msg::Fenced { seg, end } => self.on_fenced(src, seg, end),
            Msg::RecordRoll { seg, epoch, size } => self.on_record_roll(src, seg, epoch, size),
            Msg::Resign { seg } => {
                let meta = &self.ctrl.segs[seg];
                let last = seg + 1 == self.ctrl.segs.len();
                if last && matches!(meta.state, SegState::Active) && meta.replicas[0] == src {
                    self.start_fence(seg, Reason::Resigned, Some(src));
                }
            }
            Msg::SealDone { seg } => {
                let meta = &mut self.ctrl.segs[seg];
                if let SegState::Sealed { done, .. } = &mut meta.state {
                    if let Some(i) = meta.replicas.iter().position(|&r| r == src) {
                        done[i] = true;
                    }
                    if done.iter().all(|&d| d) {
                        self.ctrl.pending_seals.remove(&seg);
                    }
                }
            }
            other => self.violation(format!("controller got a node message {other:?}")),
        }
    }

    fn on_fenced(&mut self, src: usize, seg: usize, end: u64) {
        let rf = self.rf;
        let meta = &mut self.ctrl.segs[seg];
        let SegState::Fencing { reports, avoid } = &mut meta.state else {
            return;
        };
        let avoid = *avoid;
        if reports.iter().any(|r| r.replica == src as i32) {
            return;
        }
        reports.push(FenceReport {
            replica: src as i32,
            end,
        });
        // The old primary first, so a tie goes to it; one that resigned last.
        let primary = meta.replicas[0] as i32;
        let rank = |r: &FenceReport| {
            if Some(r.replica as usize) == avoid {
                2
            } else if r.replica == primary {
                0
            } else {
                1
            }
        };
        let mut ordered: Vec<FenceReport> = reports.clone();
        ordered.sort_by_key(rank);
        let chosen = match self.bug {
            Bug::SealAtMin => (ordered.len() >= quorum_size(rf))
                .then(|| *ordered.iter().min_by_key(|r| r.end).expect("nonempty")),
            _ => seal_point(&ordered, rf),
        };
        let Some(chosen) = chosen else {
            return;
        };
        let (size, source) = (chosen.end, chosen.replica as usize);
        self.ctrl.avoid_next = avoid;
        let base = meta.base;
        meta.state = SegState::Sealed {
            size,
            source,
            done: vec![false; meta.replicas.len()],
            rolled: false,
        };
        for &r in &meta.replicas {
            self.outbox
                .push(out(CTRL, r, Msg::Seal { seg, size, source }));
        }
        self.stats.seals += 1;
        trace!(
            self,
            "segment {seg} sealed at {size} (offsets [{base}, {})) from node {source}; reports {ordered:?}",
            base + size
        );
        if let Some((&off, &id)) = self.acked.range(base + size..).next() {
            self.violation(format!(
                "segment {seg} sealed at {size} (offset {}) cuts acknowledged record {id} at offset {off}",
                base + size
            ));
        }
        self.ctrl.pending_seals.insert(seg);
        self.open_next();
    }

    /// A primary's local roll: recorded if the segment is still the active
    /// one at that epoch with that primary (not being fenced). The next
    /// segment opens on the same replicas at the same epoch.
    fn on_record_roll(&mut self, src: usize, seg: usize, epoch: u64, size: u64) {
        let last = self.ctrl.segs.len() - 1;
        let meta = &mut self.ctrl.segs[seg];
        if seg != last
            || meta.epoch != epoch
            || meta.replicas[0] != src
            || !matches!(meta.state, SegState::Active)
        {
            return;
        }
        meta.state = SegState::Sealed {
            size,
            source: src,
            done: vec![false; meta.replicas.len()],
            rolled: true,
        };
        let (rolled_on, base, primary_inc) =
            (meta.replicas.clone(), meta.base + size, meta.primary_inc);
        for &r in &rolled_on {
            self.outbox.push(out(
                CTRL,
                r,
                Msg::Seal {
                    seg,
                    size,
                    source: src,
                },
            ));
        }
        self.ctrl.pending_seals.insert(seg);
        self.ctrl.avoid_next = None;
        if let Some((&off, &id)) = self.acked.range(base..).next() {
            self.violation(format!(
                "segment {seg} recorded at {size} (offset {base}) cuts acknowledged record {id} at offset {off}"
            ));
        }
        let replicas = self.place_at_roll(rolled_on);
        trace!(
            self,
            "segment {seg} rolled at {size}; segment {} opens at offset {base} on {replicas:?}",
            seg + 1
        );
        self.outbox.push(Out {
            src: CTRL,
            dst: src,
            dst_inc: Some(primary_inc),
            msg: Msg::Open {
                seg: seg + 1,
                base,
                replicas: replicas.clone(),
            },
        });
        self.ctrl.segs.push(SegMeta {
            replicas,
            base,
            epoch,
            primary_inc,
            opened: false,
            state: SegState::Active,
        });
        self.stats.segments += 1;
    }

    /// Every boundary is a placement decision (the broker's
    /// `tessera_planner::place_at_roll`): now and then a recorded roll
    /// opens the next segment with one follower swapped for a live node
    /// outside the set, at the same epoch with the same primary; the
    /// primary's shipping of it goes to the new set.
    fn place_at_roll(&mut self, mut replicas: Vec<usize>) -> Vec<usize> {
        if replicas.len() < 2 || !self.roll_placement_rng.chance(0.3) {
            return replicas;
        }
        let spares: Vec<usize> = (0..NODES)
            .filter(|&n| !replicas.contains(&n) && self.ctrl_live(n))
            .collect();
        if spares.is_empty() {
            return replicas;
        }
        let leaving = 1 + self.roll_placement_rng.below(replicas.len() as u64 - 1) as usize;
        replicas[leaving] = spares[self.roll_placement_rng.below(spares.len() as u64) as usize];
        self.stats.rolls_placed += 1;
        replicas
    }

    /// Opens the next segment once the last is sealed and enough nodes are live.
    fn open_next(&mut self) {
        let last = self.ctrl.segs.last().expect("a segment");
        let SegState::Sealed { size, source, .. } = last.state else {
            return;
        };
        let base = last.base + size;
        self.open_segment(Some(source), base);
    }

    fn open_segment(&mut self, prefer: Option<usize>, base: u64) {
        let mut live: Vec<usize> = (0..NODES).filter(|&n| self.ctrl_live(n)).collect();
        if let Some(avoid) = self.ctrl.avoid_next {
            if live.len() > self.rf && self.rf == 1 {
                live.retain(|&n| n != avoid);
            }
        }
        let prefer = prefer.filter(|&p| Some(p) != self.ctrl.avoid_next || self.rf > 1);
        if live.len() < self.rf {
            return;
        }
        let seg = self.ctrl.segs.len();
        let key = format!("range-0/segment-{seg}");
        let candidates = |rng: &mut Rng, skip: Option<usize>| -> Vec<BrokerCandidate> {
            live.iter()
                .filter(|&&n| Some(n) != skip)
                .map(|&n| BrokerCandidate {
                    broker_id: n as i32,
                    rack: None,
                    fenced: false,
                    load: rng.below(3),
                })
                .collect()
        };
        let mut replicas = Vec::with_capacity(self.rf);
        let others = match prefer.filter(|p| live.contains(p)) {
            Some(p) => {
                replicas.push(p);
                candidates(&mut self.rng, Some(p))
            }
            None => candidates(&mut self.rng, None),
        };
        let wanted = self.rf - replicas.len();
        if wanted > 0 {
            let placed = place_replicas(&key, &others, wanted).expect("enough live brokers");
            replicas.extend(placed.into_iter().map(|b| b as usize));
        }
        let primary = replicas[0];
        let primary_inc = self.ctrl.seen_inc[primary];
        trace!(self, "segment {seg} opens at offset {base} on {replicas:?}");
        self.outbox.push(Out {
            src: CTRL,
            dst: primary,
            dst_inc: Some(primary_inc),
            msg: Msg::Open {
                seg,
                base,
                replicas: replicas.clone(),
            },
        });
        let epoch = self.ctrl.segs.last().map_or(0, |m| m.epoch + 1);
        self.ctrl.segs.push(SegMeta {
            replicas,
            base,
            epoch,
            primary_inc,
            opened: false,
            state: SegState::Active,
        });
        self.stats.segments += 1;
    }

    // ------------------------------------------------------------ driving

    fn step(&mut self) {
        self.now += 1;
        self.stats.steps += 1;
        self.inject_faults();
        self.ctrl_tick();
        self.flush();
        self.client_appends();
        self.flush();
        self.client_reads();
        self.syncs();
        self.flush();
        self.retransmits();
        self.flush();
        self.deliver_due();
    }

    /// Stops the faults, heals everything and lets the system settle.
    fn calm_down(&mut self) {
        self.faults = Faults::calm(self.faults.max_delay, 0.0);
        self.ctrl_failover_rng = None;
        self.cut = 0;
        for n in 0..NODES {
            if !self.nodes[n].alive {
                self.restart(n);
            }
        }
    }

    /// The state at the end (for `replay`).
    fn dump(&self) {
        let last = self.ctrl.segs.len() - 1;
        for seg in last.saturating_sub(1)..=last {
            eprintln!("segment {seg}: {:?}", self.ctrl.segs[seg]);
            for (n, node) in self.nodes.iter().enumerate() {
                if let Some(r) = node.copies.get(&seg) {
                    eprintln!(
                        "  node {n} (inc {}): {:?} primary {:?}",
                        node.inc, r.seg, r.primary
                    );
                }
            }
        }
        for (n, node) in self.nodes.iter().enumerate() {
            if let Some(p) = &node.primary {
                eprintln!(
                    "node {n} is primary of segment {}: sent_to {:?} durable {:?} acked {}",
                    p.seg, p.sent_to, p.durable, p.acked
                );
            }
        }
    }

    // ------------------------------------------------------------ checker

    /// Safety: what must hold whatever the faults.
    fn check_safety(&self) -> Vec<String> {
        let mut v = Vec::new();
        // 2. No offset names two records: the copies of a segment are
        //    prefixes of one sequence (one writer per segment).
        for (seg, meta) in self.ctrl.segs.iter().enumerate() {
            let copies: Vec<(usize, &Replica)> = (0..NODES)
                .filter_map(|n| self.nodes[n].copies.get(&seg).map(|r| (n, r)))
                .collect();
            for (n, r) in &copies {
                if r.data.len() as u64 != r.seg.written || r.seg.durable > r.seg.written {
                    v.push(format!(
                        "node {n} segment {seg}: {} records, written {}, durable {}",
                        r.data.len(),
                        r.seg.written,
                        r.seg.durable
                    ));
                }
            }
            if let Some((ln, longest)) = copies.iter().max_by_key(|(_, r)| r.data.len()) {
                for (n, r) in &copies {
                    if let Some(i) = (0..r.data.len()).find(|&i| r.data[i] != longest.data[i]) {
                        v.push(format!(
                            "offset {} (segment {seg} position {i}) is record {} on node {n} but record {} on node {ln}",
                            meta.base + i as u64,
                            r.data[i],
                            longest.data[i]
                        ));
                    }
                }
            }
            // 3. Sealed lengths agree.
            if let SegState::Sealed { size, done, .. } = &meta.state {
                for (n, r) in &copies {
                    if r.seg.sealed_size.is_some_and(|s| s != *size) {
                        v.push(format!(
                            "node {n} sealed segment {seg} at {:?}, the controller at {size}",
                            r.seg.sealed_size
                        ));
                    }
                }
                for (i, &n) in meta.replicas.iter().enumerate() {
                    if !done[i] {
                        continue;
                    }
                    match self.nodes[n].copies.get(&seg) {
                        Some(r)
                            if r.seg.sealed_size == Some(*size)
                                && r.seg.written == *size
                                && r.seg.durable == *size
                                && r.data.len() as u64 == *size => {}
                        Some(r) => v.push(format!(
                            "node {n} finished sealing segment {seg} at {size} but holds {} records (written {}, durable {}, sealed {:?})",
                            r.data.len(),
                            r.seg.written,
                            r.seg.durable,
                            r.seg.sealed_size
                        )),
                        None => v.push(format!(
                            "node {n} finished sealing segment {seg} but has no copy"
                        )),
                    }
                }
            }
        }
        // 1. No acknowledged record lost: the final chain is the sealed
        //    segments' sealed prefixes, then the active segment's committed prefix.
        let mut chain: Vec<u64> = Vec::new();
        for (seg, meta) in self.ctrl.segs.iter().enumerate() {
            if meta.base != chain.len() as u64 {
                v.push(format!(
                    "segment {seg} starts at offset {} but the chain before it ends at {}",
                    meta.base,
                    chain.len()
                ));
                break;
            }
            let holders = meta
                .replicas
                .iter()
                .filter_map(|&n| self.nodes[n].copies.get(&seg));
            match &meta.state {
                SegState::Sealed { size, .. } => {
                    let size = *size as usize;
                    match holders
                        .filter(|r| r.data.len() >= size)
                        .max_by_key(|r| r.seg.sealed_size == Some(size as u64))
                    {
                        Some(r) => chain.extend_from_slice(&r.data[..size]),
                        None => {
                            v.push(format!(
                                "no replica of segment {seg} holds its sealed {size} records"
                            ));
                            chain.extend(std::iter::repeat_n(0, size));
                        }
                    }
                }
                SegState::Active | SegState::Fencing { .. } => {
                    let durables: Vec<u64> = meta
                        .replicas
                        .iter()
                        .map(|&n| self.nodes[n].copies.get(&seg).map_or(0, |r| r.seg.durable))
                        .collect();
                    let committed = committed_end(&durables, quorum_size(self.rf)) as usize;
                    if let Some(r) = holders.max_by_key(|r| r.seg.durable) {
                        chain.extend_from_slice(&r.data[..committed.min(r.data.len())]);
                    }
                }
            }
        }
        let mut lost = 0;
        for (&off, &id) in &self.acked {
            let found = chain.get(off as usize).copied();
            if found != Some(id) {
                lost += 1;
                if lost <= 5 {
                    v.push(format!(
                        "acknowledged record {id} at offset {off} lost: the final log has {found:?} there (log end {})",
                        chain.len()
                    ));
                }
            }
        }
        if lost > 5 {
            v.push(format!("... {lost} acknowledged records lost in all"));
        }
        // 5. No record is stored twice (a retry of a stored record is
        //    refused by the producer state, across failovers too).
        let mut at: BTreeMap<u64, usize> = BTreeMap::new();
        let mut twice = 0;
        for (off, &id) in chain.iter().enumerate() {
            if id == 0 {
                continue;
            }
            if let Some(first) = at.insert(id, off) {
                twice += 1;
                if twice <= 5 {
                    v.push(format!(
                        "record {id} stored twice: at offsets {first} and {off}"
                    ));
                }
            }
        }
        // 4. A read never returns a record that is later gone or at
        //    another offset.
        let mut unread = 0;
        for (&off, &id) in &self.read {
            let found = chain.get(off as usize).copied();
            if found != Some(id) {
                unread += 1;
                if unread <= 5 {
                    v.push(format!(
                        "record {id} read at offset {off}: the final log has {found:?} there"
                    ));
                }
            }
        }
        v
    }

    /// Liveness after the faults stop: every seal completed, the log has an
    /// open segment, and the given records were acknowledged.
    fn check_settled(&self, must_ack: &[u64]) -> Vec<String> {
        let mut v = Vec::new();
        if !self.ctrl.pending_seals.is_empty() {
            v.push(format!(
                "seals of segments {:?} never completed",
                self.ctrl.pending_seals
            ));
        }
        let last = self.ctrl.segs.last().expect("a segment");
        if !matches!(last.state, SegState::Active) || !last.opened {
            v.push(format!(
                "the log has no open segment at the end ({:?}, opened {})",
                last.state, last.opened
            ));
        }
        let acked: HashSet<u64> = self.acked.values().copied().collect();
        let missing: Vec<u64> = must_ack
            .iter()
            .copied()
            .filter(|id| !acked.contains(id))
            .collect();
        if !missing.is_empty() {
            v.push(format!(
                "{} of {} records appended after the faults stopped were never acknowledged (first {})",
                missing.len(),
                must_ack.len(),
                missing[0]
            ));
        }
        v
    }
}

// ---------------------------------------------------------------- runs

struct Outcome {
    seed: u64,
    rf: usize,
    stats: Stats,
    /// Safety violations.
    safety: Vec<String>,
    /// Liveness failures after the faults stopped.
    liveness: Vec<String>,
}

impl Outcome {
    fn report(&self, bug: Bug, faulty: bool) -> String {
        let name = match bug {
            Bug::None => "none",
            Bug::SealAtMin => "seal-at-min",
            Bug::AckOwnDurable => "ack-own-durable",
            Bug::ResumeAfterRestart => "resume-after-restart",
            Bug::SealWithoutSync => "seal-without-sync",
            Bug::LeadWithShortCopy => "lead-with-short-copy",
            Bug::LeadWithoutSnapshot => "lead-without-snapshot",
            Bug::RecordRollBeforeCommit => "record-roll-before-commit",
            Bug::KeepOtherEpochAtRestart => "keep-other-epoch-at-restart",
            Bug::AckUnrecordedRoll => "ack-unrecorded-roll",
            Bug::ReadAnyEpoch => "read-any-epoch",
            Bug::AcceptAnySnapshot => "accept-any-snapshot",
        };
        format!(
            "seed {} (rf {}, bug {bug:?}):\n  safety: {:#?}\n  liveness: {:#?}\n  replay: TESSERA_SIM_SEED={} TESSERA_SIM_BUG={name} TESSERA_SIM_FAULTY={} cargo test -p tessera-replication --test simulation replay -- --ignored --nocapture",
            self.seed, self.rf, self.safety, self.liveness, self.seed, faulty as u8
        )
    }
}

/// One seed: `steps` steps of faults (if `faulty`), then the faults stop, the
/// system settles, takes a burst of appends that must all be acknowledged,
/// and settles again; the checker runs at the end.
fn run(seed: u64, bug: Bug, faulty: bool, steps: u64, trace: bool) -> Outcome {
    let mut sim = Sim::new(seed, bug, faulty);
    sim.trace = trace;
    trace!(sim, "seed {seed} rf {} faults {:?}", sim.rf, sim.faults);
    for _ in 0..steps {
        sim.step();
    }
    let must_ack: Vec<u64> = if faulty {
        sim.calm_down();
        sim.appending = false;
        for _ in 0..SETTLE {
            sim.step();
        }
        let mark = sim.appended.len();
        sim.appending = true;
        for _ in 0..LATE {
            sim.step();
        }
        sim.appending = false;
        for _ in 0..SETTLE {
            sim.step();
        }
        sim.appended[mark..].to_vec()
    } else {
        sim.appending = false;
        for _ in 0..SETTLE {
            sim.step();
        }
        sim.appended.clone()
    };
    if trace {
        sim.dump();
    }
    let mut safety = std::mem::take(&mut sim.violations);
    safety.extend(sim.check_safety());
    let liveness = sim.check_settled(&must_ack);
    Outcome {
        seed,
        rf: sim.rf,
        stats: sim.stats,
        safety,
        liveness,
    }
}

/// `run`, with a panic of the simulation turned into a failure of its seed.
fn run_catching(seed: u64, bug: Bug, faulty: bool, steps: u64) -> Outcome {
    std::panic::catch_unwind(|| run(seed, bug, faulty, steps, false)).unwrap_or_else(|e| {
        let what = e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        Outcome {
            seed,
            rf: rf_of(seed),
            stats: Stats::default(),
            safety: vec![format!("the simulation panicked: {what}")],
            liveness: Vec::new(),
        }
    })
}

/// Runs `seeds` in parallel (each seed is deterministic on its own).
fn sweep(seeds: std::ops::Range<u64>, bug: Bug, faulty: bool, steps: u64) -> Vec<Outcome> {
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .min(8) as u64;
    let mut all: Vec<Outcome> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let seeds = seeds.clone();
                s.spawn(move || {
                    seeds
                        .filter(|seed| seed % threads == t)
                        .map(|seed| run_catching(seed, bug, faulty, steps))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("simulation thread"))
            .collect()
    });
    all.sort_by_key(|o| o.seed);
    all
}

fn total(outcomes: &[Outcome]) -> Stats {
    let mut t = Stats::default();
    for o in outcomes {
        t.add(&o.stats);
    }
    t
}

fn assert_clean(outcomes: &[Outcome], faulty: bool) {
    let bad: Vec<String> = outcomes
        .iter()
        .filter(|o| !o.safety.is_empty() || !o.liveness.is_empty())
        .take(3)
        .map(|o| o.report(Bug::None, faulty))
        .collect();
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

// ---------------------------------------------------------------- tests

#[test]
fn without_faults_every_record_is_acknowledged() {
    let outcomes = sweep(0..60, Bug::None, false, 2000);
    assert_clean(&outcomes, false);
    for o in &outcomes {
        assert!(
            o.stats.appended > 500 && o.stats.acked == o.stats.appended,
            "seed {}: {} appended, {} acknowledged",
            o.seed,
            o.stats.appended,
            o.stats.acked
        );
        assert_eq!(
            o.stats.seals, 0,
            "seed {}: no failover without faults",
            o.seed
        );
        assert!(o.stats.rolls_recorded > 0, "seed {}: no roll", o.seed);
    }
}

#[test]
fn chaos_sweep_loses_no_acknowledged_record() {
    let started = std::time::Instant::now();
    let outcomes = sweep(0..600, Bug::None, true, 2500);
    let t = total(&outcomes);
    eprintln!(
        "simulation: {} seeds x 2500 steps (+{} calm) in {:.1?}: {t:#?}",
        outcomes.len(),
        2 * SETTLE + LATE,
        started.elapsed()
    );
    assert_clean(&outcomes, true);
    // Not vacuous: the faults did what they are for.
    assert!(t.acked > 100_000, "{t:?}");
    assert!(t.seals > 0 && t.failovers_voluntary > 0, "{t:?}");
    assert!(
        t.failovers_unreachable > 0 && t.failovers_restarted > 0,
        "{t:?}"
    );
    assert!(t.truncations > 0 && t.repairs > 0, "{t:?}");
    assert!(t.lead_waits > 0 && t.history_reads > 0, "{t:?}");
    assert!(
        t.rolls_recorded > 0 && t.rolls_placed > 0 && t.stale_files > 0,
        "{t:?}"
    );
    assert!(t.controller_failovers > 0, "{t:?}");
    assert!(
        t.duplicates_refused > 0 && t.snapshot_waits > 0 && t.snapshot_transfers > 0,
        "{t:?}"
    );
    assert!(
        t.crashes > 0 && t.partitions > 0 && t.drops > 0 && t.dups > 0,
        "{t:?}"
    );
    for rf in [1, 3, 5] {
        let seals: u64 = outcomes
            .iter()
            .filter(|o| o.rf == rf)
            .map(|o| o.stats.seals)
            .sum();
        assert!(seals > 0, "no failover with rf {rf}");
    }
}

/// Finds the first seed (of `seeds`) where the broken variant is caught.
fn caught(bug: Bug, seeds: std::ops::Range<u64>, what: &str) -> Outcome {
    for chunk in seeds.clone().step_by(16) {
        let end = (chunk + 16).min(seeds.end);
        let outcomes = sweep(chunk..end, bug, true, 2500);
        if let Some(o) = outcomes
            .into_iter()
            .find(|o| o.safety.iter().any(|v| v.contains(what)))
        {
            eprintln!("{bug:?} caught: {}", o.report(bug, true));
            return o;
        }
    }
    panic!("{bug:?} was not caught ({what:?}) in seeds {seeds:?}");
}

#[test]
fn checker_catches_a_seal_at_the_minimum() {
    caught(Bug::SealAtMin, 0..200, "acknowledged record");
}

#[test]
fn checker_catches_acking_on_the_primary_alone() {
    caught(Bug::AckOwnDurable, 0..200, "acknowledged record");
}

#[test]
fn checker_catches_a_primary_resuming_after_restart() {
    caught(Bug::ResumeAfterRestart, 0..400, "is record");
}

#[test]
fn checker_catches_a_seal_reported_done_before_it_is_durable() {
    caught(Bug::SealWithoutSync, 0..2000, "finished sealing");
}

#[test]
fn checker_catches_a_primary_leading_without_its_producer_snapshot() {
    caught(Bug::LeadWithoutSnapshot, 0..600, "stored twice");
}

#[test]
fn checker_catches_a_roll_recorded_before_its_commit() {
    caught(Bug::RecordRollBeforeCommit, 0..600, "");
}

#[test]
fn checker_catches_a_restart_keeping_another_epochs_file() {
    caught(Bug::KeepOtherEpochAtRestart, 0..600, "is record");
}

#[test]
fn checker_catches_acks_of_an_unrecorded_roll() {
    caught(Bug::AckUnrecordedRoll, 0..600, "acknowledged record");
}

#[test]
fn checker_catches_a_fetched_snapshot_taken_past_the_seal() {
    caught(
        Bug::AcceptAnySnapshot,
        0..2000,
        "as a duplicate, but no copy holds it",
    );
}

#[test]
fn checker_catches_a_primary_leading_with_a_short_copy() {
    caught(Bug::LeadWithShortCopy, 0..600, "committed records skipped");
}

/// A larger sweep: `TESSERA_SIM_SEEDS` seeds (default 20000) x `TESSERA_SIM_STEPS` steps.
#[test]
#[ignore]
fn chaos_sweep_large() {
    let seeds: u64 = std::env::var("TESSERA_SIM_SEEDS").map_or(20_000, |s| s.parse().unwrap());
    let steps: u64 = std::env::var("TESSERA_SIM_STEPS").map_or(5_000, |s| s.parse().unwrap());
    let started = std::time::Instant::now();
    let outcomes = sweep(0..seeds, Bug::None, true, steps);
    let t = total(&outcomes);
    eprintln!(
        "simulation: {seeds} seeds x {steps} steps in {:.1?}: {t:#?}",
        started.elapsed()
    );
    assert_clean(&outcomes, true);
}

/// Replays one seed with a trace: `TESSERA_SIM_SEED`, `TESSERA_SIM_BUG`
/// (none, seal-at-min, ack-own-durable, resume-after-restart,
/// seal-without-sync, lead-with-short-copy),
/// `TESSERA_SIM_FAULTY` (1 by default), `TESSERA_SIM_STEPS` (2500).
#[test]
#[ignore]
fn replay() {
    let seed: u64 = std::env::var("TESSERA_SIM_SEED")
        .expect("TESSERA_SIM_SEED")
        .parse()
        .unwrap();
    let bug = Bug::parse(&std::env::var("TESSERA_SIM_BUG").unwrap_or_default());
    let faulty = std::env::var("TESSERA_SIM_FAULTY").map_or(true, |s| s != "0");
    let steps: u64 = std::env::var("TESSERA_SIM_STEPS").map_or(2500, |s| s.parse().unwrap());
    let o = run(seed, bug, faulty, steps, true);
    eprintln!("{}\n{:#?}", o.report(bug, faulty), o.stats);
    assert!(o.safety.is_empty() && o.liveness.is_empty());
}
