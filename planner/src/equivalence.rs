//! The fast planners against the straightforward ones they replaced
//! ([`crate::reference`]): on random small clusters, evolved by random
//! events and by carrying out the plans, every plan must be identical.

use std::collections::BTreeMap;

use proptest::prelude::*;
use tessera_metadata::{
    decode_committed_value, BrokerRegistration, MetadataImage, MetadataRecord, SegmentId,
};
use tessera_replication::{place_replicas, place_replicas_led_by, BrokerCandidate};

use crate::{
    candidates, create_topic, create_topic_with, heal_segments, heal_segments_with, initial_blocks,
    partitions_led, plan_leader_moves, plan_replacements, reference, seal_and_replace,
    seal_by_quorum, seal_by_quorum_with, split_range, PlacementLoad, QuorumSeal, TopicSpec,
};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn pick<T: Copy>(&mut self, v: &[T]) -> Option<T> {
        (!v.is_empty()).then(|| v[self.below(v.len())])
    }
}

/// An image and its [`PlacementLoad`], kept through every record.
struct Sim {
    image: MetadataImage,
    load: PlacementLoad,
    racks: usize,
    next_broker: i32,
    topics: u32,
    /// Some set lists a broker twice (replay refuses that: such records
    /// are applied as they are).
    twice: bool,
}

impl Sim {
    fn commit(&mut self, records: &[MetadataRecord]) {
        let offset = self.image.offset + 1;
        for r in records {
            match decode_committed_value(&r.encode(), &self.image, offset) {
                Ok(Some(r)) => self.load.apply(&mut self.image, &r, offset),
                Ok(None) => {}
                // A set with a broker listed twice (see `reshuffle`) stays
                // so in the segments planned from it.
                Err(_) if self.twice => self.load.apply(&mut self.image, r, offset),
                Err(e) => panic!("{e}"),
            }
        }
    }

    fn rack(&self, rng: &mut Rng) -> Option<String> {
        // Rack 0 is none; `racks` 0 gives no racks at all.
        match rng.below(self.racks + 1) {
            0 => None,
            r => Some(format!("r{r}")),
        }
    }

    fn register(&mut self, rng: &mut Rng) {
        let id = self.next_broker;
        self.next_broker += 1 + rng.below(2) as i32;
        let reg = BrokerRegistration {
            broker_id: id,
            incarnation_id: uuid::Uuid::from_u128(rng.next() as u128),
            host: "h".into(),
            port: 9092,
            rack: self.rack(rng),
        };
        self.commit(&crate::register_broker(reg));
    }

    fn live(&self) -> Vec<i32> {
        self.image
            .brokers
            .values()
            .filter(|b| !b.fenced)
            .map(|b| b.registration.broker_id)
            .collect()
    }

    fn active(&self) -> Vec<SegmentId> {
        self.image
            .ranges
            .values()
            .filter(|r| r.active)
            .filter_map(|r| self.image.active_segment(r.id))
            .map(|s| s.id)
            .collect()
    }

    fn create(&mut self, rng: &mut Rng) -> Result<(), TestCaseError> {
        let live = self.live().len();
        if live == 0 {
            return Ok(());
        }
        let spec = TopicSpec {
            topic_id: uuid::Uuid::from_u128(rng.next() as u128),
            name: format!("t{}", self.topics),
            partitions: 1 + rng.below(30) as u32,
            replication_factor: (1 + rng.below(4)).min(live) as i16,
            configs: BTreeMap::new(),
        };
        self.topics += 1;
        // The fast creation (with kept counts, and without) is the
        // straightforward one.
        let blocks = initial_blocks(spec.partitions, live);
        let rf = spec.replication_factor as usize;
        prop_assert_eq!(
            crate::spread_ranges(&self.image, spec.topic_id, &blocks, rf),
            reference::spread_ranges(&self.image, spec.topic_id, &blocks, rf)
        );
        let records = create_topic(&self.image, spec.clone()).unwrap();
        prop_assert_eq!(
            &create_topic_with(&self.image, spec, &self.load).unwrap(),
            &records
        );
        self.commit(&records);
        Ok(())
    }

    /// Some active segment sealed by quorum and its next one opened on a
    /// random list of brokers (any order, racks shared or not).
    fn reshuffle(&mut self, rng: &mut Rng) {
        let Some(seg) = rng.pick(&self.active()) else {
            return;
        };
        let s = self.image.segments[&seg].clone();
        let Some(holder) = rng.pick(&s.replicas) else {
            return;
        };
        let seal = QuorumSeal {
            segment: seg,
            size_bytes: 0,
            spans: vec![],
            holder,
        };
        let Ok(mut records) = seal_by_quorum(&self.image, &seal) else {
            return;
        };
        let mut ids: Vec<i32> = self.image.brokers.keys().copied().collect();
        if ids.is_empty() {
            return;
        }
        let size = 1 + rng.below(ids.len().min(4));
        let mut set = Vec::new();
        while set.len() < size {
            set.push(ids.remove(rng.below(ids.len())));
        }
        // Now and then a broker never registered (not eligible), which
        // replay takes, or one listed twice, which it refuses (applied
        // as it is: the planners' exhaustive way for such a set).
        let twice = match rng.below(8) {
            0 => {
                set.push(set[rng.below(set.len())]);
                true
            }
            1 => {
                set.insert(rng.below(set.len() + 1), 99);
                false
            }
            _ => false,
        };
        if let MetadataRecord::OpenSegment(o) = &mut records[1] {
            o.replicas = set;
        }
        self.twice |= twice;
        self.commit(&records);
    }

    fn event(&mut self, rng: &mut Rng) -> Result<(), TestCaseError> {
        let brokers: Vec<i32> = self.image.brokers.keys().copied().collect();
        match rng.below(12) {
            0..=2 => self.create(rng)?,
            3..=6 => self.reshuffle(rng),
            7 => self.register(rng),
            8 => {
                if let Some(b) = rng.pick(&brokers) {
                    self.commit(&[MetadataRecord::FenceBroker { broker_id: b }]);
                }
            }
            9 => {
                if let Some(b) = rng.pick(&brokers) {
                    self.commit(&[MetadataRecord::UnregisterBroker { broker_id: b }]);
                }
            }
            10 => {
                let topics: Vec<_> = self.image.topics.keys().copied().collect();
                if let Some(topic_id) = rng.pick(&topics) {
                    self.commit(&[MetadataRecord::DeleteTopic { topic_id }]);
                }
            }
            _ => {
                let ranges: Vec<_> = self.active().iter().map(|s| s.range).collect();
                if let Some(r) = rng.pick(&ranges) {
                    if let Ok(plan) = split_range(&self.image, r, None) {
                        let mut entry: Vec<MetadataRecord> = self
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
                        self.commit(&entry);
                    }
                }
            }
        }
        Ok(())
    }

    /// Every planner's fast form against its reference on the image as it
    /// is, then the fast plans carried out.
    fn compare_and_carry_out(&mut self, max: usize) -> Result<usize, TestCaseError> {
        prop_assert_eq!(&self.load, &PlacementLoad::of(&self.image));
        prop_assert_eq!(self.load.candidates(&self.image), candidates(&self.image));
        prop_assert_eq!(
            self.load.partitions_led(&self.image),
            partitions_led(&self.image)
        );
        for m in [0, 1, 2, 5, 1000] {
            prop_assert_eq!(
                plan_leader_moves(&self.image, m),
                reference::plan_leader_moves(&self.image, m),
                "leader moves, max {}",
                m
            );
            prop_assert_eq!(
                plan_replacements(&self.image, m),
                reference::plan_replacements(&self.image, m),
                "replacements, max {}",
                m
            );
        }
        let moves = plan_leader_moves(&self.image, max);
        let mut done = moves.len();
        for m in moves {
            let seal = QuorumSeal {
                segment: m.segment,
                size_bytes: 0,
                spans: vec![],
                holder: m.to,
            };
            let records = seal_by_quorum(&self.image, &seal).unwrap();
            prop_assert_eq!(
                &seal_by_quorum_with(&self.image, &seal, &self.load).unwrap(),
                &records
            );
            self.commit(&records);
        }
        let plans = plan_replacements(&self.image, max);
        done += plans.len();
        for p in plans {
            let seal = QuorumSeal {
                segment: p.segment,
                size_bytes: 0,
                spans: vec![],
                holder: p.current[0],
            };
            let records = seal_and_replace(&self.image, &seal, &p).unwrap();
            self.commit(&records);
        }
        Ok(done)
    }

    /// Failovers of the segments led by fenced or gone brokers (some
    /// replacing fenced followers: the counts and the placement matter).
    fn fail_over(&mut self) -> Result<(), TestCaseError> {
        let live = self.live();
        for seg in self.active() {
            let s = self.image.segments[&seg].clone();
            if s.primary().is_some_and(|p| live.contains(&p)) {
                continue;
            }
            let Some(holder) = s.replicas.iter().copied().find(|r| live.contains(r)) else {
                continue;
            };
            let seal = QuorumSeal {
                segment: seg,
                size_bytes: 0,
                spans: vec![],
                holder,
            };
            let records = seal_by_quorum(&self.image, &seal).unwrap();
            prop_assert_eq!(
                &seal_by_quorum_with(&self.image, &seal, &self.load).unwrap(),
                &records
            );
            self.commit(&records);
        }
        // Healing in small batches: resumed after the last segment healed,
        // each batch is the one a walk from the first segment finds.
        let gone: std::collections::BTreeSet<i32> = self
            .image
            .brokers
            .values()
            .filter(|b| b.fenced)
            .map(|b| b.registration.broker_id)
            .collect();
        let mut after = None;
        loop {
            let records = heal_segments(&self.image, &gone, 2);
            prop_assert_eq!(
                &heal_segments_with(&self.image, &gone, 2, &self.load, after),
                &records
            );
            let Some(MetadataRecord::SetSegmentReplicas { segment, .. }) = records.last() else {
                break;
            };
            after = Some(*segment);
            self.commit(&records);
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// The key test of the fast planners: random clusters (racks or not,
    /// brokers joining, fenced, unregistered, arbitrary replica sets,
    /// splits, deletions), and at every step the leader moves, the
    /// re-placements, the creations, the failovers and the kept counts are
    /// those of the straightforward planners.
    #[test]
    fn fast_planners_are_the_reference_ones(
        seed in any::<u64>(),
        brokers in 1usize..10,
        racks in 0usize..5,
        events in 0usize..40,
        max in 1usize..6,
    ) {
        let mut rng = Rng(seed | 1);
        let mut sim = Sim {
            image: MetadataImage::empty(),
            load: PlacementLoad::default(),
            racks,
            next_broker: 1 + rng.below(3) as i32,
            topics: 0,
            twice: false,
        };
        for _ in 0..brokers {
            sim.register(&mut rng);
        }
        for _ in 0..1 + rng.below(8) {
            sim.create(&mut rng)?;
        }
        for _ in 0..events {
            sim.event(&mut rng)?;
        }
        for _ in 0..8 {
            if sim.compare_and_carry_out(max)? == 0 {
                break;
            }
        }
        // Brokers join, a broker is lost: balance and failover again.
        sim.register(&mut rng);
        sim.register(&mut rng);
        for _ in 0..8 {
            if sim.compare_and_carry_out(max)? == 0 {
                break;
            }
        }
        let live = sim.live();
        if let Some(b) = rng.pick(&live) {
            sim.commit(&[MetadataRecord::FenceBroker { broker_id: b }]);
        }
        sim.fail_over()?;
        sim.compare_and_carry_out(max)?;
    }

    /// The planner's placement (scores computed once) is the replication
    /// crate's, for every primary and replication factor.
    #[test]
    fn fast_placement_is_place_replicas(
        brokers in proptest::collection::btree_map(0i32..40, (0usize..4, 0u8..4, 0u64..6), 0..14),
        key in "[0-9]{1,4}-[0-9]{1,2}",
        primary in proptest::option::of(0i32..40),
        rf in 0usize..6,
    ) {
        let brokers: Vec<BrokerCandidate> = brokers
            .into_iter()
            .map(|(id, (rack, fenced, load))| BrokerCandidate {
                broker_id: id,
                rack: (rack > 0).then(|| format!("r{rack}")),
                fenced: fenced == 0,
                load,
            })
            .collect();
        let placer = crate::placement::Placer::new(&brokers);
        let ranking = placer.rank(&key);
        prop_assert_eq!(
            placer.place_led_by(&ranking, primary, rf),
            place_replicas_led_by(&key, &brokers, primary, rf)
        );
        let live = placer.live_count();
        if live > 0 {
            let full: Vec<i32> = placer
                .full_order(&ranking)
                .into_iter()
                .map(|i| brokers[i].broker_id)
                .collect();
            prop_assert_eq!(full, place_replicas(&key, &brokers, live).unwrap());
        }
    }
}
