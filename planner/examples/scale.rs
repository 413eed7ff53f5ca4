//! The scale simulation of issue 23: the real planner (`tessera-planner`)
//! and the real metadata replay (`tessera-metadata`) driven with a
//! simulated cluster of brokers in racks, no processes and no network.
//!
//! ```text
//! cargo run --release -p tessera-planner --example scale -- \
//!     [--brokers 10,100,1000] [--racks 10] [--topics-per-broker 10] \
//!     [--max-partitions 10000] [--rf 3] [--seed 1] [--csv loads.csv]
//! ```
//!
//! Per cluster size it runs these events, each through the planner calls
//! the brokers make (creation, split, the controller's leader-balance and
//! re-placement passes, failover by seal-by-quorum, healing), applying
//! every record through `decode_committed_value` as a broker would:
//!
//! 1. **creation storm**: `topics-per-broker x brokers` topics, partition
//!    counts Zipf-distributed over `1..=max-partitions`, each with a
//!    Zipf-distributed load (bytes in per second) spread evenly over its
//!    partitions;
//! 2. **hot topic**: the busiest topic's load x10, its ranges split once;
//! 3. **brokers join**: 10 % more brokers, then an hour of traffic: each
//!    range rolls once per `segment.bytes` (1 GiB) of its bytes in (at most
//!    4 times), every roll placing its next segment (`place_at_roll`, as a
//!    primary's roll does), then controller passes (leader balance and
//!    re-placement, bounded per pass as in the broker) until none plans
//!    anything or 50 passes;
//! 4. **rack lost**: every broker of one rack fenced; each active segment
//!    whose primary is fenced fails over (seal-by-quorum), then healing;
//! 5. **brokers removed**: 10 % of the brokers unregistered, then healing.
//!
//! Per event it prints the load per live broker (max/mean of bytes in as
//! primary, of primaries, of replicas of active segments), the segments
//! newly placed or moved, the metadata records written, the image's size
//! (its snapshot, `to_records`, encoded) and the time to replay it, and the
//! planning time per decision. `--csv` writes the max/mean ratios of bytes
//! in, primaries and replicas, with the event in progress (0-5: creation,
//! hot topic, join and rolls, controller passes, rack lost, removed), every
//! 50 steps (every `ranges / 1,000` steps in images of more than
//! 50,000 ranges), for docs/SCALE.md's plot.
//!
//! Creation, failover and healing read the per-broker counts from a
//! [`PlacementLoad`] kept through every applied record (as a controller
//! can keep them), checked against a fresh walk of the image at every row.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use tessera_metadata::records::BrokerRegistration;
use tessera_metadata::{decode_committed_value, MetadataImage, MetadataRecord, RangeId, TopicId};
use tessera_planner::{
    create_topic_with, heal_segments_with, place_at_roll_with, plan_balance, plan_boundary_moves,
    record_roll, seal_and_replace, seal_by_quorum, seal_by_quorum_with, split_range,
    spread_split_children, LeaderMove, LoadBalanceSettings, PlacementLoad, QuorumSeal, Replacement,
    TopicSpec,
};

/// The broker's defaults: 10 % above the mean sheds, from 1 MiB/s.
const BALANCE: LoadBalanceSettings = LoadBalanceSettings {
    imbalance: 0.1,
    min_bytes_per_sec: 1 << 20,
};

/// Moves one controller pass plans at most (the broker's bound).
const MOVES_PER_PASS: usize = 8;
const PASSES: usize = 50;
/// `segment.bytes` (Kafka's default, 1 GiB): a range rolls once per this
/// many bytes in.
const SEGMENT_BYTES: f64 = 1073741824.0;
/// Rolls per range simulated in the hour after a join, at most.
const MAX_ROLLS: u64 = 4;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Zipf(s = 1.1) over `1..=n` by inverse transform on the
    /// continuous approximation.
    fn zipf(&mut self, n: u64) -> u64 {
        let s = 1.1f64;
        let u = self.unit();
        let h = |x: f64| (x.powf(1.0 - s) - 1.0) / (1.0 - s);
        let total = h(n as f64 + 0.5) - h(0.5);
        let x = ((u * total + h(0.5)) * (1.0 - s) + 1.0).powf(1.0 / (1.0 - s));
        (x.round() as u64).clamp(1, n)
    }
}

struct Options {
    brokers: Vec<i32>,
    racks: i32,
    topics_per_broker: u32,
    max_partitions: u64,
    rf: i16,
    seed: u64,
    csv: Option<String>,
}

fn parse() -> Options {
    let mut o = Options {
        brokers: vec![10, 100, 1000],
        racks: 10,
        topics_per_broker: 10,
        max_partitions: 10_000,
        rf: 3,
        seed: 1,
        csv: None,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let v = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--brokers" => o.brokers = v.split(',').map(|x| x.parse().expect("brokers")).collect(),
            "--racks" => o.racks = v.parse().expect("racks"),
            "--topics-per-broker" => o.topics_per_broker = v.parse().expect("topics"),
            "--max-partitions" => o.max_partitions = v.parse().expect("partitions"),
            "--rf" => o.rf = v.parse().expect("rf"),
            "--seed" => o.seed = v.parse().expect("seed"),
            "--csv" => o.csv = Some(v),
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    o
}

/// The simulated cluster: the image every broker would have, the load of
/// every topic, and counters of what the planner wrote.
struct Cluster {
    image: MetadataImage,
    /// The per-broker counts creation and failover read, kept through
    /// every applied record (as a controller would keep them) instead of
    /// walked per decision; checked against a fresh walk at every row.
    counts: PlacementLoad,
    load: BTreeMap<TopicId, f64>,
    records: u64,
    placed: u64,
    decisions: u64,
    planning: Duration,
    step: u64,
    next_sample: u64,
    csv: Vec<String>,
    size: i32,
    /// The event in progress (the number of rows printed so far), for the
    /// `--csv` samples.
    event: u32,
}

impl Cluster {
    fn commit(&mut self, records: &[MetadataRecord]) {
        let offset = self.image.offset + 1;
        for r in records {
            if let Some(r) = decode_committed_value(&r.encode(), &self.image, offset)
                .expect("planner records decode")
            {
                if matches!(r, MetadataRecord::OpenSegment(_)) {
                    self.placed += 1;
                }
                self.counts.apply(&mut self.image, &r, offset);
                self.records += 1;
            }
        }
        self.image.offset = offset;
        self.step += 1;
        // Every 50 steps, or every (ranges / 1,000) in a bigger image: a
        // sample walks every range (at 1,000 brokers, 2.4 million of them,
        // and a lost rack is 240,000 failovers).
        if self.step >= self.next_sample {
            self.next_sample = self.step + 50.max(self.image.ranges.len() as u64 / 1000);
            let l = self.loads();
            self.csv.push(format!(
                "{},{},{},{:.3},{:.3},{:.3}",
                self.size,
                self.step,
                self.event,
                l.bytes.ratio(),
                l.primaries.ratio(),
                l.replicas.ratio()
            ));
        }
    }

    fn plan<T>(&mut self, f: impl FnOnce(&MetadataImage, &PlacementLoad) -> T) -> T {
        let t = Instant::now();
        let out = f(&self.image, &self.counts);
        self.planning += t.elapsed();
        self.decisions += 1;
        out
    }

    fn register(&mut self, id: i32, racks: i32) {
        let reg = BrokerRegistration {
            broker_id: id,
            incarnation_id: uuid::Uuid::from_u128(id as u128 + 1),
            host: format!("b{id}"),
            port: 9092,
            rack: Some(format!("r{}", id % racks)),
        };
        self.commit(&[
            MetadataRecord::RegisterBroker(reg),
            MetadataRecord::UnfenceBroker { broker_id: id },
        ]);
    }

    fn live(&self) -> Vec<i32> {
        self.image
            .brokers
            .values()
            .filter(|b| !b.fenced)
            .map(|b| b.registration.broker_id)
            .collect()
    }

    fn loads(&self) -> Loads {
        // Live brokers by slot (id order), looked up in a table by id (the
        // simulated ids are small): no map search per range.
        let live = self.live();
        let mut slot = vec![usize::MAX; live.iter().max().map_or(0, |&m| m as usize + 1)];
        for (i, &b) in live.iter().enumerate() {
            slot[b as usize] = i;
        }
        let slot_of = |b: i32| {
            usize::try_from(b)
                .ok()
                .and_then(|b| slot.get(b).copied())
                .filter(|&s| s != usize::MAX)
        };
        let mut bytes = vec![0.0f64; live.len()];
        let mut primaries = vec![0.0f64; live.len()];
        let mut replicas = vec![0.0f64; live.len()];
        // The load per partition of the topic of the previous range (a
        // topic's ranges mostly follow each other).
        let mut topic_load: Option<(TopicId, Option<f64>)> = None;
        // Each active range's active segment (its last unsealed one), in
        // one merged walk of the ranges and segments.
        let mut segments = self.image.segments.iter().peekable();
        for r in self.image.ranges.values() {
            let mut active = None;
            while let Some((id, s)) = segments.peek() {
                if id.range > r.id {
                    break;
                }
                if id.range == r.id && !s.is_sealed() {
                    active = Some(*s);
                }
                segments.next();
            }
            let Some(seg) = active.filter(|_| r.active) else {
                continue;
            };
            let per_partition = match topic_load {
                Some((t, l)) if t == r.topic_id => l,
                _ => {
                    let l = self.image.topics.get(&r.topic_id).map(|topic| {
                        self.load.get(&r.topic_id).copied().unwrap_or(0.0)
                            / f64::from(topic.partitions.max(1))
                    });
                    topic_load = Some((r.topic_id, l));
                    l
                }
            };
            let Some(per_partition) = per_partition else {
                continue;
            };
            if let Some(p) = seg.primary().and_then(slot_of) {
                bytes[p] += per_partition * f64::from(r.hi - r.lo);
                primaries[p] += 1.0;
            }
            for rep in &seg.replicas {
                if let Some(n) = slot_of(*rep) {
                    replicas[n] += 1.0;
                }
            }
        }
        Loads {
            bytes: Spread::of(bytes.iter()),
            primaries: Spread::of(primaries.iter()),
            replicas: Spread::of(replicas.iter()),
        }
    }

    /// One controller pass: leader balance, then re-placement; the number
    /// of moves made.
    /// Bytes in per second of each active range, as its primary would
    /// report it: its topic's load spread evenly over the partitions.
    fn range_rates(&self) -> BTreeMap<RangeId, u64> {
        self.image
            .ranges
            .values()
            .filter(|r| r.active)
            .filter_map(|r| {
                let topic = self.image.topics.get(&r.topic_id)?;
                let per = self.load.get(&r.topic_id)? / f64::from(topic.partitions.max(1));
                Some((r.id, (per * f64::from(r.hi - r.lo)) as u64))
            })
            .collect()
    }

    /// A leader move carried out as the broker does when the follower
    /// holds the end: a seal by quorum with it as the holder. An
    /// unreplicated range moves whole (`Replacement::primary_move`), as the
    /// gateway's `move_leader` does.
    fn move_leader(&mut self, m: &LeaderMove) -> bool {
        if let Some(whole) = m.as_primary_move(&self.image) {
            return self.replace(&whole);
        }
        let seal = QuorumSeal {
            segment: m.segment,
            size_bytes: 0,
            spans: Vec::new(),
            holder: m.to,
        };
        match self.plan(|img, _| seal_by_quorum(img, &seal)) {
            Ok(records) => {
                self.commit(&records);
                true
            }
            Err(_) => false,
        }
    }

    fn controller_pass(&mut self) -> usize {
        // The leader check: by bytes in, then by leader counts.
        let rates = self.range_rates();
        let moves = self.plan(|img, _| plan_balance(img, &rates, BALANCE, MOVES_PER_PASS));
        let mut n = 0;
        for m in moves {
            if self.move_leader(&m.leader_move) {
                n += 1;
            }
        }
        let plans = self.plan(|img, _| plan_boundary_moves(img, MOVES_PER_PASS));
        for p in plans {
            if self.replace(&p) {
                n += 1;
            }
        }
        n
    }

    /// A re-placement carried out with the primary holding the end.
    fn replace(&mut self, p: &Replacement) -> bool {
        let holder = self
            .image
            .segments
            .get(&p.segment)
            .and_then(|s| s.primary())
            .unwrap_or(p.from);
        let seal = QuorumSeal {
            segment: p.segment,
            size_bytes: 0,
            spans: Vec::new(),
            holder,
        };
        match self.plan(|img, _| seal_and_replace(img, &seal, p)) {
            Ok(records) => {
                self.commit(&records);
                true
            }
            Err(_) => false,
        }
    }

    /// A primary's own roll of `range`'s active segment, recorded as the
    /// broker records it: the next segment placed by `place_at_roll` (from
    /// the kept counts). True when it opened on another replica set.
    fn roll(&mut self, range: RangeId) -> bool {
        let Some(active) = self.image.active_segment(range) else {
            return false;
        };
        let seal = tessera_metadata::SegmentSealRecord {
            segment: active.id,
            size_bytes: 0,
            spans: vec![],
            leader_epoch: Some(active.leader_epoch),
        };
        let (placed, records) = self.plan(|img, counts| {
            let load = counts
                .replicas_held(img)
                .into_iter()
                .map(|(b, n)| (b, n as i64))
                .collect();
            let placed = place_at_roll_with(img, active.id, &BTreeSet::new(), &load);
            let moved = placed.is_some();
            (
                moved,
                record_roll(img, range, &seal, active.id.seq + 1, placed),
            )
        });
        self.commit(&records);
        placed
    }

    /// An hour of traffic: every active range rolls once per
    /// `SEGMENT_BYTES` of its bytes in (at most `MAX_ROLLS` times), the
    /// ranges taking turns. Returns (rolls, rolls that placed elsewhere).
    fn an_hour_of_rolls(&mut self) -> (u64, u64) {
        let rolling: Vec<(RangeId, u64)> = self
            .range_rates()
            .into_iter()
            .map(|(r, rate)| {
                (
                    r,
                    ((rate as f64 * 3600.0 / SEGMENT_BYTES) as u64).min(MAX_ROLLS),
                )
            })
            .filter(|&(_, n)| n > 0)
            .collect();
        let (mut rolls, mut placed) = (0, 0);
        for round in 0..MAX_ROLLS {
            for &(range, n) in &rolling {
                if n > round {
                    rolls += 1;
                    if self.roll(range) {
                        placed += 1;
                    }
                }
            }
        }
        (rolls, placed)
    }

    /// Fails over every active segment whose primary is fenced or gone
    /// (the controller's seal-by-quorum, the first live replica holding
    /// the end), then heals the sealed copies of `gone`.
    fn failover_and_heal(&mut self, gone: &BTreeSet<i32>) {
        let live: BTreeSet<i32> = self.live().into_iter().collect();
        let orphaned: Vec<_> = self
            .image
            .segments
            .values()
            .filter(|s| !s.is_sealed() && s.primary().is_some_and(|p| !live.contains(&p)))
            .filter_map(|s| {
                let holder = s.replicas.iter().copied().find(|r| live.contains(r))?;
                Some((s.id, holder))
            })
            .collect();
        for (segment, holder) in orphaned {
            let seal = QuorumSeal {
                segment,
                size_bytes: 0,
                spans: Vec::new(),
                holder,
            };
            if let Ok(records) = self.plan(|img, counts| seal_by_quorum_with(img, &seal, counts)) {
                self.commit(&records);
            }
        }
        // Each pass resumes after the last segment healed (the same
        // batches as a walk from the first segment, which at 2.4 million
        // segments and 240,000 copies to heal was a walk per 256 healed).
        let mut after = None;
        loop {
            let records =
                self.plan(|img, counts| heal_segments_with(img, gone, 256, counts, after));
            let Some(MetadataRecord::SetSegmentReplicas { segment, .. }) = records.last() else {
                break;
            };
            after = Some(*segment);
            self.commit(&records);
        }
    }
}

#[derive(Clone, Copy)]
struct Spread {
    max: f64,
    mean: f64,
}

impl Spread {
    fn of<'a>(values: impl Iterator<Item = &'a f64>) -> Spread {
        let v: Vec<f64> = values.copied().collect();
        let max = v.iter().copied().fold(0.0, f64::max);
        let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
        Spread { max, mean }
    }
    fn ratio(&self) -> f64 {
        if self.mean == 0.0 {
            1.0
        } else {
            self.max / self.mean
        }
    }
}

struct Loads {
    bytes: Spread,
    primaries: Spread,
    replicas: Spread,
}

/// The image's snapshot: its size encoded and the time to replay it.
fn snapshot_figures(image: &MetadataImage) -> (u64, Duration) {
    let records = image.to_records();
    let bytes: u64 = records.iter().map(|r| r.encode().len() as u64).sum();
    let t = Instant::now();
    let mut back = MetadataImage::default();
    for r in &records {
        if let Some(r) = decode_committed_value(&r.encode(), &back, image.offset).unwrap() {
            back.apply(&r, image.offset);
        }
    }
    (bytes, t.elapsed())
}

fn row(c: &mut Cluster, event: &str, before: (u64, u64, u64, Duration), started: Instant) {
    c.event += 1;
    assert_eq!(c.counts, PlacementLoad::of(&c.image), "kept counts");
    let l = c.loads();
    let (bytes, replay) = snapshot_figures(&c.image);
    let decisions = c.decisions - before.2;
    let per = (c.planning - before.3)
        .checked_div(decisions.max(1) as u32)
        .unwrap_or_default();
    println!(
        "| {} | {} | {:.2} | {:.1} / {:.1} | {:.1} / {:.1} | {} | {} | {} | {:.1} MB | {:.0} ms | {:.2} ms | {:.1} s |",
        c.size,
        event,
        l.bytes.ratio(),
        l.primaries.max,
        l.primaries.mean,
        l.replicas.max,
        l.replicas.mean,
        c.placed - before.1,
        c.records - before.0,
        c.image.ranges.values().filter(|r| r.active).count(),
        bytes as f64 / 1e6,
        replay.as_secs_f64() * 1e3,
        per.as_secs_f64() * 1e3,
        started.elapsed().as_secs_f64(),
    );
}

fn run(o: &Options, brokers: i32, csv: &mut Vec<String>) {
    let mut rng = Rng(o.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut c = Cluster {
        image: MetadataImage::default(),
        counts: PlacementLoad::default(),
        load: BTreeMap::new(),
        records: 0,
        placed: 0,
        decisions: 0,
        planning: Duration::ZERO,
        step: 0,
        next_sample: 50,
        csv: Vec::new(),
        size: brokers,
        event: 0,
    };
    for id in 1..=brokers {
        c.register(id, o.racks);
    }
    let mark = |c: &Cluster| (c.records, c.placed, c.decisions, c.planning);
    let t = Instant::now();

    // 1. creation storm
    let before = mark(&c);
    let topics = o.topics_per_broker * brokers as u32;
    for i in 0..topics {
        let partitions = rng.zipf(o.max_partitions) as u32;
        let topic_id = uuid::Uuid::from_u128(u128::from(i) + 1);
        let spec = TopicSpec {
            topic_id,
            name: format!("t{i}"),
            partitions,
            replication_factor: o.rf.min(brokers as i16),
            configs: BTreeMap::new(),
        };
        let records = c
            .plan(|img, counts| create_topic_with(img, spec, counts))
            .expect("creation");
        c.commit(&records);
        // bytes in per second: Zipf over 1..=10,000 units of 10 KB/s
        c.load.insert(topic_id, rng.zipf(10_000) as f64 * 10e3);
    }
    row(
        &mut c,
        &format!("creation storm ({topics} topics)"),
        before,
        t,
    );

    // 2. a hot topic: the busiest x10, its ranges split once
    let before = mark(&c);
    // (the busiest topic with a range that can split)
    let (&hot, _) = c
        .load
        .iter()
        .filter(|(t, _)| c.image.active_ranges(**t).iter().any(|r| r.hi - r.lo > 1))
        .max_by(|a, b| a.1.total_cmp(b.1))
        .expect("a topic");
    *c.load.get_mut(&hot).unwrap() *= 10.0;
    let hot_ranges: Vec<RangeId> = c
        .image
        .active_ranges(hot)
        .iter()
        .filter(|r| r.hi - r.lo > 1)
        .map(|r| r.id)
        .collect();
    for r in hot_ranges {
        if let Ok(plan) = c.plan(|img, _| split_range(img, r, None)) {
            // The primary seals the parent's active segment in the entry.
            let mut entry: Vec<MetadataRecord> = c
                .image
                .active_segment(r)
                .map(|s| {
                    MetadataRecord::SealSegment(tessera_metadata::SegmentSealRecord {
                        segment: s.id,
                        size_bytes: 0,
                        spans: vec![],
                        leader_epoch: Some(s.leader_epoch),
                    })
                })
                .into_iter()
                .collect();
            entry.extend(plan.records);
            c.commit(&entry);
            // The broker then hands the second child to a follower.
            let moves = c.plan(|img, _| spread_split_children(img, &plan.children));
            for m in moves {
                c.move_leader(&m);
            }
        }
    }
    row(&mut c, "hot topic x10, split", before, t);

    // 3. brokers join: an hour of segment rolls (each a placement
    // decision), then controller passes
    let before = mark(&c);
    let joining = (brokers / 10).max(1);
    for id in brokers + 1..=brokers + joining {
        c.register(id, o.racks);
    }
    let (rolls, placed) = c.an_hour_of_rolls();
    row(
        &mut c,
        &format!(
            "{joining} brokers join, an hour of rolls ({rolls} rolls, {placed} placed elsewhere)"
        ),
        before,
        t,
    );
    let before = mark(&c);
    let mut passes = 0;
    while passes < PASSES && c.controller_pass() > 0 {
        passes += 1;
    }
    row(
        &mut c,
        &format!("then controller passes ({passes})"),
        before,
        t,
    );

    // 4. a rack lost
    let before = mark(&c);
    let rack: BTreeSet<i32> = c.live().into_iter().filter(|b| b % o.racks == 0).collect();
    for b in &rack {
        c.commit(&[MetadataRecord::FenceBroker { broker_id: *b }]);
    }
    c.failover_and_heal(&rack);
    row(
        &mut c,
        &format!("rack lost ({} brokers)", rack.len()),
        before,
        t,
    );

    // 5. brokers removed
    let before = mark(&c);
    let removed: BTreeSet<i32> = c.live().into_iter().filter(|b| b % 10 == 1).collect();
    for b in &removed {
        c.commit(&[MetadataRecord::UnregisterBroker { broker_id: *b }]);
    }
    c.failover_and_heal(&removed);
    row(
        &mut c,
        &format!("{} brokers removed", removed.len()),
        before,
        t,
    );
    csv.append(&mut c.csv);
}

fn main() {
    let o = parse();
    println!(
        "| brokers | event | bytes in max/mean | primaries max / mean | replicas max / mean | segments placed | records | active ranges | image | replay | planning per decision | elapsed |"
    );
    println!(
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    let mut csv = vec![
        "brokers,step,event,bytes_max_over_mean,primaries_max_over_mean,replicas_max_over_mean"
            .to_string(),
    ];
    for &b in &o.brokers {
        run(&o, b, &mut csv);
    }
    if let Some(path) = &o.csv {
        std::fs::write(path, csv.join("\n") + "\n").expect("csv");
    }
}
