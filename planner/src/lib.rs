//! What the active controller decides: pure functions from the committed
//! [`MetadataImage`] and a request to the [`MetadataRecord`]s that carry it
//! out. No I/O and no clock: the caller validates wire input, appends the
//! records to the metadata log in one entry, and every broker acts on the
//! image once they are committed (reconciling its logs with it).
//!
//! Each plan checks what only the committed image can tell (a name taken, a
//! range already sealed, too few live brokers). A plan made against one
//! image can lose a race to another write still in flight; replay then
//! skips the stale records the same way on every replica
//! (`decode_committed_value`), which is why the writers look at the
//! skipped positions.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tessera_metadata::{
    BrokerRegistration, MetadataImage, MetadataRecord, RangeId, RangeImage, RangeRecord, SegmentId,
    SegmentImage, SegmentOpenRecord, SegmentSealRecord, TopicId, TopicRecord,
};
use tessera_replication::{BrokerCandidate, PlacementError};
use thiserror::Error;

/// Largest partition count a topic may have.
pub const MAX_PARTITIONS: u32 = 1_000_000;

/// Why a plan cannot be made. Mapped to Kafka error codes in the gateway's
/// one error table.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum PlanError {
    #[error("topic {0:?} already exists")]
    TopicAlreadyExists(String),
    #[error("topic {0:?} collides with an existing topic ('.' and '_' are interchangeable in metric names)")]
    CollidingTopicName(String),
    #[error("{0}")]
    InvalidPartitions(String),
    #[error("{0}")]
    InvalidReplicationFactor(String),
    #[error("{0}")]
    InvalidReplicaAssignment(String),
    #[error("unknown topic")]
    UnknownTopic,
    #[error("no range {0}")]
    UnknownRange(RangeId),
    #[error("range {0} is sealed")]
    RangeSealed(RangeId),
    #[error("{0}")]
    InvalidMove(String),
}

/// A topic to create, its wire form already validated (name rules, configs).
#[derive(Clone, Debug)]
pub struct TopicSpec {
    pub topic_id: TopicId,
    pub name: String,
    pub partitions: u32,
    pub replication_factor: i16,
    pub configs: BTreeMap<String, String>,
}

/// Live brokers as placement candidates, loaded by the active segments they
/// are primary of.
pub fn candidates(image: &MetadataImage) -> Vec<BrokerCandidate> {
    // One pass over the segments (not one per broker: at 46,000 ranges
    // and 100 brokers that was most of a creation's 23 ms).
    let mut led: BTreeMap<i32, u64> = BTreeMap::new();
    for s in image.segments.values().filter(|s| !s.is_sealed()) {
        if let Some(p) = s.primary() {
            *led.entry(p).or_default() += 1;
        }
    }
    image
        .brokers
        .values()
        .map(|b| BrokerCandidate {
            broker_id: b.registration.broker_id,
            rack: b.registration.rack.clone(),
            fenced: b.fenced,
            load: led.get(&b.registration.broker_id).copied().unwrap_or(0),
        })
        .collect()
}

fn live_brokers(image: &MetadataImage) -> usize {
    image.brokers.values().filter(|b| !b.fenced).count()
}

/// A new topic: its partitions in as many ranges as it takes to put a
/// primary on every live broker ([`initial_blocks`]: one range on a single
/// broker, so a topic's files follow its ranges, not its partition count),
/// each range's first segment led by the broker leading the fewest
/// partitions (as Kafka spreads partition leaders at creation) and
/// replicated on `replication_factor` live brokers around it.
pub fn create_topic(
    image: &MetadataImage,
    spec: TopicSpec,
) -> Result<Vec<MetadataRecord>, PlanError> {
    create_topic_assigned(image, spec, None)
}

/// [`create_topic`] with the image's counts kept by the caller (`load`
/// must be [`PlacementLoad::of`] `image`, or kept equal to it): the same
/// plan without a walk of every range and segment.
pub fn create_topic_with(
    image: &MetadataImage,
    spec: TopicSpec,
    load: &PlacementLoad,
) -> Result<Vec<MetadataRecord>, PlanError> {
    create_topic_inner(image, spec, None, Some(load))
}

/// [`create_topic`], or with the client's replica list for every
/// partition (CreateTopics' manual assignment): then the partitions go in
/// one range per run of partitions with the same list, each range on its
/// list in the client's order (the first live broker of it leads, as
/// Kafka's preferred leader), so Metadata reports what was asked.
pub fn create_topic_assigned(
    image: &MetadataImage,
    spec: TopicSpec,
    assignments: Option<&[Vec<i32>]>,
) -> Result<Vec<MetadataRecord>, PlanError> {
    create_topic_inner(image, spec, assignments, None)
}

fn create_topic_inner(
    image: &MetadataImage,
    spec: TopicSpec,
    assignments: Option<&[Vec<i32>]>,
    load: Option<&PlacementLoad>,
) -> Result<Vec<MetadataRecord>, PlanError> {
    if spec.partitions == 0 {
        return Err(PlanError::InvalidPartitions(
            "number of partitions must be larger than 0".into(),
        ));
    }
    if spec.partitions > MAX_PARTITIONS {
        return Err(PlanError::InvalidPartitions(format!(
            "number of partitions is above {MAX_PARTITIONS}"
        )));
    }
    if spec.replication_factor < 1 {
        return Err(PlanError::InvalidReplicationFactor(
            "replication factor must be larger than 0".into(),
        ));
    }
    if image.topic_by_name(&spec.name).is_some() {
        return Err(PlanError::TopicAlreadyExists(spec.name));
    }
    let live = live_brokers(image);
    if spec.replication_factor as usize > live {
        return Err(PlanError::InvalidReplicationFactor(format!(
            "unable to replicate the partition {} time(s): the number of brokers is {live}",
            spec.replication_factor
        )));
    }
    if colliding_name(image, &spec.name) {
        return Err(PlanError::CollidingTopicName(spec.name));
    }
    let mut records = vec![MetadataRecord::CreateTopic(TopicRecord {
        topic_id: spec.topic_id,
        name: spec.name,
        partitions: spec.partitions,
        replication_factor: spec.replication_factor,
        configs: spec.configs,
    })];
    if let Some(assignments) = assignments {
        if assignments.len() != spec.partitions as usize {
            return Err(PlanError::InvalidReplicaAssignment(format!(
                "{} partition(s) but {} assignment(s)",
                spec.partitions,
                assignments.len()
            )));
        }
        for replicas in assignments {
            validate_manual_assignment(image, replicas, spec.replication_factor)?;
        }
        records.extend(assigned_ranges(image, spec.topic_id, 0, assignments));
        return Ok(records);
    }
    let blocks = initial_blocks(spec.partitions, live);
    let rf = spec.replication_factor as usize;
    records.extend(match load {
        Some(load) => spread_ranges_with(
            image,
            spec.topic_id,
            &blocks,
            rf,
            &load.candidates(image),
            load.partitions_led(image),
            load.replicas_held(image),
        )?,
        None => spread_ranges(image, spec.topic_id, &blocks, rf)?,
    });
    Ok(records)
}

/// Ranges for partitions `first..` whose replica lists the client gave
/// (validated): one range per run of consecutive partitions with the same
/// list, its first segment on that list in the client's order, except that
/// a fenced first broker gives way to the first live one (the leader).
fn assigned_ranges(
    image: &MetadataImage,
    topic_id: TopicId,
    first: u32,
    assignments: &[Vec<i32>],
) -> Vec<MetadataRecord> {
    let mut records = Vec::new();
    let mut lo = 0usize;
    while lo < assignments.len() {
        let mut hi = lo + 1;
        while hi < assignments.len() && assignments[hi] == assignments[lo] {
            hi += 1;
        }
        let range_id = image.next_range_id() + (records.len() / 2) as RangeId;
        let mut replicas = assignments[lo].clone();
        let live = |b: &i32| image.brokers.get(b).is_some_and(|r| !r.fenced);
        if let Some(at) = replicas.iter().position(live) {
            let leader = replicas.remove(at);
            replicas.insert(0, leader);
        }
        records.push(MetadataRecord::CreateRange(RangeRecord {
            range_id,
            topic_id,
            lo: first + lo as u32,
            hi: first + hi as u32,
            parents: vec![],
        }));
        records.push(open_segment(SegmentId::new(range_id, 0), replicas, 0));
        lo = hi;
    }
    records
}

/// How a new topic's partitions `[0, partitions)` start out: one contiguous
/// block per live broker, never more blocks than partitions (one on a
/// single broker), sizes differing by one at most, the larger ones first.
pub fn initial_blocks(partitions: u32, live_brokers: usize) -> Vec<(u32, u32)> {
    let n = (live_brokers.max(1) as u64)
        .min(u64::from(partitions))
        .max(1) as u32;
    let (base, extra) = (partitions / n, partitions % n);
    let mut lo = 0;
    (0..n)
        .map(|i| {
            let hi = lo + base + u32::from(i < extra);
            let block = (lo, hi);
            lo = hi;
            block
        })
        .collect()
}

/// Partitions each live broker leads: those of the active ranges whose
/// active segment it is primary of (0 for a live broker leading none).
pub fn partitions_led(image: &MetadataImage) -> BTreeMap<i32, u64> {
    let mut led: BTreeMap<i32, u64> = image
        .brokers
        .values()
        .filter(|b| !b.fenced)
        .map(|b| (b.registration.broker_id, 0))
        .collect();
    for range in image.ranges.values().filter(|r| r.active) {
        if let Some(primary) = image.active_segment(range.id).and_then(|s| s.primary()) {
            if let Some(n) = led.get_mut(&primary) {
                *n += u64::from(range.hi - range.lo);
            }
        }
    }
    led
}

/// The per-broker counts placement decisions read ([`candidates`]' loads
/// and [`partitions_led`]), kept by a caller that makes many decisions in a
/// row: one walk of the image, then [`PlacementLoad::apply`] for every
/// record it applies, instead of a walk of every segment and range per
/// decision (at 1,000 brokers and 500,000 ranges that walk was most of a
/// creation's or a failover's time). [`create_topic_with`] and
/// [`seal_by_quorum_with`] decide exactly as [`create_topic`] and
/// [`seal_by_quorum`] with it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlacementLoad {
    /// Unsealed segments by primary (any broker id, registered or not).
    primaries: BTreeMap<i32, u64>,
    /// Partitions of the active ranges by the primary of their active
    /// segment (any broker id).
    partitions: BTreeMap<i32, u64>,
    /// Replicas of unsealed segments by broker (any broker id): what
    /// re-placement evens out.
    replicas: BTreeMap<i32, u64>,
}

impl PlacementLoad {
    /// The counts of `image` (one walk of its ranges and segments).
    pub fn of(image: &MetadataImage) -> Self {
        let mut load = PlacementLoad::default();
        for s in image.segments.values().filter(|s| !s.is_sealed()) {
            if let Some(p) = s.primary() {
                *load.primaries.entry(p).or_default() += 1;
            }
            for r in &s.replicas {
                *load.replicas.entry(*r).or_default() += 1;
            }
        }
        for range in image.ranges.values().filter(|r| r.active) {
            if let Some(p) = image.active_segment(range.id).and_then(|s| s.primary()) {
                *load.partitions.entry(p).or_default() += u64::from(range.hi - range.lo);
            }
        }
        load
    }

    /// [`candidates`] of `image`, which these counts must be of.
    pub fn candidates(&self, image: &MetadataImage) -> Vec<BrokerCandidate> {
        image
            .brokers
            .values()
            .map(|b| BrokerCandidate {
                broker_id: b.registration.broker_id,
                rack: b.registration.rack.clone(),
                fenced: b.fenced,
                load: self
                    .primaries
                    .get(&b.registration.broker_id)
                    .copied()
                    .unwrap_or(0),
            })
            .collect()
    }

    /// Replicas of unsealed segments held by each live broker of `image`.
    pub fn replicas_held(&self, image: &MetadataImage) -> BTreeMap<i32, u64> {
        image
            .brokers
            .values()
            .filter(|b| !b.fenced)
            .map(|b| {
                let id = b.registration.broker_id;
                (id, self.replicas.get(&id).copied().unwrap_or(0))
            })
            .collect()
    }

    /// [`partitions_led`] of `image`, which these counts must be of.
    pub fn partitions_led(&self, image: &MetadataImage) -> BTreeMap<i32, u64> {
        image
            .brokers
            .values()
            .filter(|b| !b.fenced)
            .map(|b| {
                let id = b.registration.broker_id;
                (id, self.partitions.get(&id).copied().unwrap_or(0))
            })
            .collect()
    }

    /// Applies `record` to `image` (as `image.apply(record, offset)`) and
    /// keeps the counts those of the image: a record about one range
    /// recounts that range, a topic's deletion recounts everything, and
    /// the others (brokers, configs, ...) change no count.
    pub fn apply(&mut self, image: &mut MetadataImage, record: &MetadataRecord, offset: i64) {
        use MetadataRecord as R;
        let range = match record {
            R::CreateRange(r) => Some(r.range_id),
            R::SealRange { range_id } => Some(*range_id),
            R::OpenSegment(o) => Some(o.segment.range),
            R::SealSegment(s) => Some(s.segment.range),
            R::DeleteSegment { segment }
            | R::SetSegmentReplicas { segment, .. }
            | R::SetSegmentInSync { segment, .. } => Some(segment.range),
            _ => None,
        };
        match range {
            Some(range) => {
                self.count_range(image, range, false);
                image.apply(record, offset);
                self.count_range(image, range, true);
            }
            None => {
                image.apply(record, offset);
                if matches!(record, R::DeleteTopic { .. }) {
                    *self = PlacementLoad::of(image);
                }
            }
        }
    }

    /// Adds (or takes away) what one range counts for.
    fn count_range(&mut self, image: &MetadataImage, range: RangeId, add: bool) {
        fn bump(map: &mut BTreeMap<i32, u64>, id: i32, n: u64, add: bool) {
            let v = map.entry(id).or_default();
            if add {
                *v += n;
            } else {
                *v -= n;
            }
            if *v == 0 {
                map.remove(&id);
            }
        }
        let first = SegmentId::new(range, 0);
        let last = SegmentId::new(range, u32::MAX);
        for s in image.segments.range(first..=last).map(|(_, s)| s) {
            if let (false, Some(p)) = (s.is_sealed(), s.primary()) {
                bump(&mut self.primaries, p, 1, add);
            }
            if !s.is_sealed() {
                for r in &s.replicas {
                    bump(&mut self.replicas, *r, 1, add);
                }
            }
        }
        if let Some(r) = image.ranges.get(&range).filter(|r| r.active) {
            if let Some(p) = image.active_segment(range).and_then(|s| s.primary()) {
                bump(&mut self.partitions, p, u64::from(r.hi - r.lo), add);
            }
        }
    }
}

/// New root ranges for `blocks` of a topic's partitions, ids from the
/// image's next one: each block's first segment led by a distinct live
/// broker while there are enough (the one leading the fewest partitions,
/// counting the blocks placed before it; ties by the segment's rendezvous
/// order), its followers placed around that primary.
fn spread_ranges(
    image: &MetadataImage,
    topic_id: TopicId,
    blocks: &[(u32, u32)],
    replication_factor: usize,
) -> Result<Vec<MetadataRecord>, PlanError> {
    spread_ranges_with(
        image,
        topic_id,
        blocks,
        replication_factor,
        &candidates(image),
        partitions_led(image),
        replicas_held(image),
    )
}

/// Replicas of unsealed segments held by each live broker.
pub(crate) fn replicas_held(image: &MetadataImage) -> BTreeMap<i32, u64> {
    let mut held: BTreeMap<i32, u64> = image
        .brokers
        .values()
        .filter(|b| !b.fenced)
        .map(|b| (b.registration.broker_id, 0))
        .collect();
    for s in image.segments.values().filter(|s| !s.is_sealed()) {
        for r in &s.replicas {
            if let Some(n) = held.get_mut(r) {
                *n += 1;
            }
        }
    }
    held
}

/// [`spread_ranges`] with the image's [`candidates`] and
/// [`partitions_led`] given. Each broker's rendezvous score is computed
/// once per block and the counts sit in vectors: at 1,000 brokers the
/// straightforward form (a `place_replicas` order of every live broker,
/// then a linear `position` in it per broker) was quadratic per block.
fn spread_ranges_with(
    image: &MetadataImage,
    topic_id: TopicId,
    blocks: &[(u32, u32)],
    replication_factor: usize,
    brokers: &[BrokerCandidate],
    led: BTreeMap<i32, u64>,
    mut held: BTreeMap<i32, u64>,
) -> Result<Vec<MetadataRecord>, PlanError> {
    let placer = placement::Placer::new(brokers);
    // `led` by slot (broker id order), and each slot's candidate.
    let ids: Vec<i32> = led.keys().copied().collect();
    let mut count: Vec<u64> = led.values().copied().collect();
    let index: BTreeMap<i32, usize> = brokers
        .iter()
        .enumerate()
        .map(|(i, b)| (b.broker_id, i))
        .rev()
        .collect();
    let candidate_of: Vec<Option<usize>> = ids.iter().map(|id| index.get(id).copied()).collect();
    let mut leading = vec![false; ids.len()];
    let mut leading_len = 0usize;
    // Each live broker is in `led` and the other way round when both are
    // of one image (or of one kept `PlacementLoad`): then the order that
    // breaks ties is `Placer::first_by`'s, with no full order listed.
    let live_of: Vec<Option<usize>> = candidate_of
        .iter()
        .map(|c| c.and_then(|c| placer.live_position(c)))
        .collect();
    let consistent = placer.live_count() == ids.len() && live_of.iter().all(Option::is_some);
    let mut records = Vec::with_capacity(blocks.len() * 2);
    for (i, &(lo, hi)) in blocks.iter().enumerate() {
        let range_id = image.next_range_id() + i as RangeId;
        let segment = SegmentId::new(range_id, 0);
        let key = segment.to_string();
        let ranking = placer.rank(&key);
        let open = |s: &usize| !leading[*s] || leading_len >= ids.len();
        let primary = if consistent {
            placer
                .first_by(
                    &ranking,
                    (0..ids.len())
                        .filter(open)
                        .filter_map(|s| Some((live_of[s]?, count[s]))),
                )
                .map(|c| brokers[c].broker_id)
        } else {
            // The rendezvous order of live brokers for this segment breaks
            // ties (`place_replicas(key, brokers, ids.len().max(1))`, or
            // none).
            let wanted = ids.len().max(1);
            let mut position = vec![usize::MAX; brokers.len()];
            if placer.live_count() >= wanted {
                for (at, c) in placer
                    .full_order(&ranking)
                    .into_iter()
                    .take(wanted)
                    .enumerate()
                {
                    position[c] = at;
                }
            }
            (0..ids.len())
                .filter(open)
                .min_by_key(|&s| {
                    (
                        count[s],
                        candidate_of[s].map_or(usize::MAX, |c| position[c]),
                    )
                })
                .map(|s| ids[s])
        };
        let replicas = placer
            .place_led_by(&ranking, primary, replication_factor)
            .map_err(placement_error)?;
        let replicas = placer.followers_by_load(&ranking, replicas, &mut held);
        if let Some(&p) = replicas.first() {
            // A live broker: `led` holds every one (checked by the tests
            // against the straightforward form).
            if let Ok(s) = ids.binary_search(&p) {
                count[s] += u64::from(hi - lo);
                leading[s] = true;
            }
            leading_len += 1;
        }
        records.push(MetadataRecord::CreateRange(RangeRecord {
            range_id,
            topic_id,
            lo,
            hi,
            parents: vec![],
        }));
        records.push(open_segment(segment, replicas, 0));
    }
    Ok(records)
}

fn placement_error(e: PlacementError) -> PlanError {
    match e {
        PlacementError::NotEnoughBrokers { .. } | PlacementError::InvalidReplicationFactor => {
            PlanError::InvalidReplicationFactor(e.to_string())
        }
    }
}

/// Kafka refuses a name that differs from an existing one only by '.' vs '_'.
fn colliding_name(image: &MetadataImage, name: &str) -> bool {
    let normal = name.replace('.', "_");
    // A colliding name has `name`'s bytes up to its first '.' or '_': only
    // the names from that prefix on are compared (not all of them).
    let prefix = &name[..name.find(['.', '_']).unwrap_or(name.len())];
    image
        .topic_names
        .range::<str, _>((
            std::ops::Bound::Included(prefix),
            std::ops::Bound::Unbounded,
        ))
        .map(|(n, _)| n)
        .take_while(|n| n.starts_with(prefix))
        .any(|n| n != name && n.replace('.', "_") == normal)
}

pub fn delete_topic(
    image: &MetadataImage,
    topic_id: TopicId,
) -> Result<Vec<MetadataRecord>, PlanError> {
    if !image.topics.contains_key(&topic_id) {
        return Err(PlanError::UnknownTopic);
    }
    Ok(vec![MetadataRecord::DeleteTopic { topic_id }])
}

/// The changes that turn `current` into `wanted`: `(key, Some(value))` for
/// every key set or changed, `(key, None)` for every key dropped, by key.
fn config_diff(
    current: Option<&BTreeMap<String, String>>,
    wanted: &BTreeMap<String, String>,
) -> Vec<(String, Option<String>)> {
    let empty = BTreeMap::new();
    let current = current.unwrap_or(&empty);
    let mut out: Vec<(String, Option<String>)> = current
        .keys()
        .filter(|k| !wanted.contains_key(*k))
        .map(|k| (k.clone(), None))
        .collect();
    out.extend(
        wanted
            .iter()
            .filter(|(k, v)| current.get(*k) != Some(*v))
            .map(|(k, v)| (k.clone(), Some(v.clone()))),
    );
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// AlterConfigs / IncrementalAlterConfigs on a topic: the records that
/// make the topic's configs exactly `wanted` (already validated by the
/// caller, with incremental operations already applied), as one entry.
/// Empty when nothing changes.
pub fn alter_topic_configs(
    image: &MetadataImage,
    topic_id: TopicId,
    wanted: &BTreeMap<String, String>,
) -> Result<Vec<MetadataRecord>, PlanError> {
    let topic = image.topics.get(&topic_id).ok_or(PlanError::UnknownTopic)?;
    Ok(config_diff(Some(&topic.configs), wanted)
        .into_iter()
        .map(|(key, value)| MetadataRecord::SetTopicConfig {
            topic_id,
            key,
            value,
        })
        .collect())
}

/// The same for the dynamic configs of one broker (`Some(id)`) or of the
/// cluster-wide default (`None`). The broker need not be registered.
pub fn alter_broker_configs(
    image: &MetadataImage,
    broker_id: Option<i32>,
    wanted: &BTreeMap<String, String>,
) -> Vec<MetadataRecord> {
    config_diff(image.broker_configs.get(&broker_id), wanted)
        .into_iter()
        .map(|(key, value)| MetadataRecord::SetBrokerConfig {
            broker_id,
            key,
            value,
        })
        .collect()
}

/// CreatePartitions: grows `topic_id` to `count` partitions, with Kafka's
/// checks and messages (KRaft's `ReplicationControlManager.createPartitions`).
///
/// The new partitions `[old, count)` get a range of their own with its
/// first segment placed as a new topic's is (`replication_factor` live
/// brokers, rendezvous hashing weighted by load) and leader epoch 0, and
/// the entry is `IncreasePartitions` + `CreateRange` + `OpenSegment`.
///
/// Why a new range rather than widening the topic's last range: widening
/// means sealing that range and opening a wider child (a move), so the
/// partitions it already serves would see a leader change and an epoch
/// bump for a request that does not concern them. A range of their own
/// touches nothing that exists: existing partitions keep their range,
/// segment, leader and epoch; the new ones start at offset 0 in an empty
/// log; and the ranges still tile `[0, count)`. The range policy merges the
/// new range into its neighbour later if both stay cold.
///
/// `assignments`, if given, are the client's replica lists for the new
/// partitions: validated as Kafka validates them (one per new partition,
/// non-empty, registered brokers, no duplicates, the topic's replication
/// factor, not all fenced) and followed: the new partitions go in ranges
/// on those lists (see [`create_topic_assigned`]).
pub fn create_partitions(
    image: &MetadataImage,
    topic_id: TopicId,
    count: u32,
    assignments: Option<&[Vec<i32>]>,
) -> Result<Vec<MetadataRecord>, PlanError> {
    let topic = image.topics.get(&topic_id).ok_or(PlanError::UnknownTopic)?;
    let existing = topic.partitions;
    if count == existing {
        return Err(PlanError::InvalidPartitions(format!(
            "Topic already has {existing} partition(s)."
        )));
    }
    if count < existing {
        return Err(PlanError::InvalidPartitions(format!(
            "The topic {} currently has {existing} partition(s); {count} would not be an increase.",
            topic.name
        )));
    }
    if count > MAX_PARTITIONS {
        return Err(PlanError::InvalidPartitions(format!(
            "number of partitions is above {MAX_PARTITIONS}"
        )));
    }
    let additional = count - existing;
    if let Some(assignments) = assignments {
        if assignments.len() != additional as usize {
            return Err(PlanError::InvalidReplicaAssignment(format!(
                "Attempted to add {additional} additional partition(s), but only {} assignment(s) were specified.",
                assignments.len()
            )));
        }
        for replicas in assignments {
            validate_manual_assignment(image, replicas, topic.replication_factor)?;
        }
    }
    let mut records = vec![MetadataRecord::IncreasePartitions {
        topic_id,
        partitions: count,
    }];
    if let Some(assignments) = assignments {
        records.extend(assigned_ranges(image, topic_id, existing, assignments));
        return Ok(records);
    }
    // The new partitions spread as a new topic's do.
    let blocks: Vec<(u32, u32)> = initial_blocks(additional, live_brokers(image))
        .into_iter()
        .map(|(lo, hi)| (existing + lo, existing + hi))
        .collect();
    records.extend(spread_ranges(
        image,
        topic_id,
        &blocks,
        topic.replication_factor.max(1) as usize,
    )?);
    Ok(records)
}

/// The ranges a topic's partitions outside every active range need: empty
/// while its active ranges tile `[0, partitions)`. A creation whose
/// `CreateTopic` or `IncreasePartitions` applied but some of whose
/// `CreateRange`s lost their ids to a concurrent write (plans made on
/// different nodes against one image) leaves such gaps; its writer covers
/// them with these records.
pub fn cover_partitions(
    image: &MetadataImage,
    topic_id: TopicId,
) -> Result<Vec<MetadataRecord>, PlanError> {
    let topic = image.topics.get(&topic_id).ok_or(PlanError::UnknownTopic)?;
    let gaps = move_placement::uncovered(image, topic_id, topic.partitions);
    if gaps.is_empty() {
        return Ok(Vec::new());
    }
    spread_ranges(
        image,
        topic_id,
        &gaps,
        topic.replication_factor.max(1) as usize,
    )
}

/// Kafka's `validateManualPartitionAssignment` plus the replication factor
/// and liveness checks of `createPartitions`, in Kafka's order and words.
fn validate_manual_assignment(
    image: &MetadataImage,
    replicas: &[i32],
    replication_factor: i16,
) -> Result<(), PlanError> {
    let invalid = |m: String| Err(PlanError::InvalidReplicaAssignment(m));
    if replicas.is_empty() {
        return invalid("The manual partition assignment includes an empty replica list.".into());
    }
    let mut seen = std::collections::BTreeSet::new();
    for &b in replicas {
        if !image.brokers.contains_key(&b) {
            return invalid(format!(
                "The manual partition assignment includes broker {b}, but no such broker is registered."
            ));
        }
        if !seen.insert(b) {
            return invalid(format!(
                "The manual partition assignment includes the broker {b} more than once."
            ));
        }
    }
    if replicas.len() != replication_factor.max(0) as usize {
        return invalid(format!(
            "The manual partition assignment includes a partition with {} replica(s), but this is not consistent with previous partitions, which have {replication_factor} replica(s).",
            replicas.len()
        ));
    }
    if replicas
        .iter()
        .all(|b| image.brokers.get(b).is_none_or(|b| b.fenced))
    {
        return invalid(
            "All brokers specified in the manual partition assignment for the partition are fenced or in controlled shutdown.".into(),
        );
    }
    Ok(())
}

/// DeleteRecords: moves each partition's log start offset up to the given
/// offset (already resolved by the leader: -1 is its high watermark, and
/// offsets above the high watermark were refused there). A partition whose
/// log already starts at or after its offset needs no record (Kafka's
/// `maybeIncrementLogStartOffset` only moves forward); replay skips a
/// record that would move a start back, so racing requests keep the larger.
pub fn advance_log_start_offsets(
    image: &MetadataImage,
    topic_id: TopicId,
    offsets: &[(u32, i64)],
) -> Result<Vec<MetadataRecord>, PlanError> {
    let topic = image.topics.get(&topic_id).ok_or(PlanError::UnknownTopic)?;
    let mut records = Vec::new();
    for &(partition, offset) in offsets {
        if partition >= topic.partitions {
            return Err(PlanError::UnknownTopic);
        }
        if offset > image.log_start_offset(topic_id, partition) {
            records.push(MetadataRecord::SetLogStartOffset {
                topic_id,
                partition,
                offset,
            });
        }
    }
    Ok(records)
}

/// A range's retention limits (its topic's effective `retention.ms` and
/// `retention.bytes`; -1 is unlimited) and what only the broker holding the
/// range's segments knows.
#[derive(Clone, Debug, Default)]
pub struct RetentionInput {
    pub retention_ms: i64,
    /// Kafka's limit is per partition: a range of `n` partitions keeps up
    /// to `n * retention_bytes` bytes of segments (sealed and active).
    pub retention_bytes: i64,
    pub now_ms: i64,
    /// The largest record timestamp per sealed segment sequence (-1 for a
    /// segment without batches). A segment missing here is not judged by
    /// time, and neither is any newer one.
    pub max_timestamps: BTreeMap<u32, i64>,
    /// Bytes of the range's active segment.
    pub active_bytes: u64,
}

/// Retention (Kafka's `deleteOldSegments`) for one range: which of its
/// sealed segments to delete, oldest first, never the active one and never
/// a segment with an older one kept. A segment goes when
/// - every partition's data in it lies below its log start (DeleteRecords
///   moved past it: `deleteLogStartOffsetBreachedSegments`), or
/// - its largest timestamp is more than `retention_ms` before `now_ms`, or
/// - the range's bytes exceed `partitions * retention_bytes` by at least
///   its size (`deleteRetentionSizeBreachedSegments`).
///
/// The records: a `DeleteSegment` per segment, then a `SetLogStartOffset`
/// for every partition whose data in them ends past its log start (the end
/// of its newest deleted span; log starts only move forward). Empty when
/// nothing is due (or the range, its topic or its active segment is gone).
/// An ancestor range (sealed by a split or merge) is planned by time and
/// the log start only, and keeps its last segment.
pub fn plan_retention(
    image: &MetadataImage,
    range: RangeId,
    input: &RetentionInput,
) -> Vec<MetadataRecord> {
    let Some(r) = image.ranges.get(&range) else {
        return Vec::new();
    };
    if !image.topics.contains_key(&r.topic_id) {
        return Vec::new();
    }
    let segments = image.segments_of(range);
    // An active range: the sealed segments before the active one. An
    // ancestor (sealed by a split or merge): its history but the last
    // segment, which stays so that the log opens and seeds its children's
    // offsets and producer state on a restart.
    let Some((last, sealed)) = segments.split_last() else {
        return Vec::new();
    };
    if r.active && last.is_sealed() {
        return Vec::new();
    }
    let below_log_start = |seg: &SegmentImage| {
        seg.sealed.as_ref().is_some_and(|info| {
            info.spans
                .iter()
                .all(|sp| sp.end_offset <= image.log_start_offset(r.topic_id, sp.partition))
        })
    };
    let expired = |seg: &SegmentImage| {
        input.retention_ms >= 0
            && input
                .max_timestamps
                .get(&seg.id.seq)
                .is_some_and(|&ts| input.now_ms.saturating_sub(ts) > input.retention_ms)
    };
    // Time (and the log start) first, then size on what is left.
    let mut n = sealed
        .iter()
        .take_while(|seg| seg.is_sealed() && (below_log_start(seg) || expired(seg)))
        .count();
    // retention.bytes is a partition's budget in its active range; an
    // ancestor's bytes are not counted (time and the log start trim it).
    if r.active && input.retention_bytes >= 0 {
        let size_of = |seg: &SegmentImage| seg.sealed.as_ref().map_or(0, |i| i.size_bytes);
        let total: u64 = sealed[n..].iter().map(|s| size_of(s)).sum::<u64>() + input.active_bytes;
        let budget = (input.retention_bytes as u64).saturating_mul(u64::from(r.hi - r.lo));
        let mut excess = total.saturating_sub(budget);
        for seg in &sealed[n..] {
            if !seg.is_sealed() || excess == 0 || size_of(seg) > excess {
                break;
            }
            excess -= size_of(seg);
            n += 1;
        }
    }
    let mut records = Vec::new();
    let mut ends: BTreeMap<u32, i64> = BTreeMap::new();
    for seg in &sealed[..n] {
        records.push(MetadataRecord::DeleteSegment { segment: seg.id });
        for sp in seg.sealed.iter().flat_map(|i| &i.spans) {
            let end = ends.entry(sp.partition).or_insert(sp.end_offset);
            *end = (*end).max(sp.end_offset);
        }
    }
    for (partition, offset) in ends {
        if offset > image.log_start_offset(r.topic_id, partition) {
            records.push(MetadataRecord::SetLogStartOffset {
                topic_id: r.topic_id,
                partition,
                offset,
            });
        }
    }
    records
}

/// A broker (re)starting. It registers fenced, as in Kafka; with no
/// heartbeats yet the controller unfences it at once.
pub fn register_broker(registration: BrokerRegistration) -> Vec<MetadataRecord> {
    let broker_id = registration.broker_id;
    vec![
        MetadataRecord::RegisterBroker(registration),
        MetadataRecord::UnfenceBroker { broker_id },
    ]
}

/// A block of producer ids for `broker_id`, the next one after the image's.
pub fn allocate_producer_ids(image: &MetadataImage, broker_id: i32, count: i32) -> MetadataRecord {
    MetadataRecord::AllocateProducerIds {
        broker_id,
        first_producer_id: image.next_producer_id,
        count,
    }
}

/// True when `node` has led range `range` without interruption since
/// leader epoch `since`: every segment of it at a later epoch has `node` as
/// primary. A coordinator loaded at `since` keeps its state then (a seal by
/// quorum that kept the primary, say); otherwise another broker may have
/// led and changed it while this broker's image jumped over that, and the
/// coordinator loads its partition again.
pub fn led_throughout(image: &MetadataImage, range: RangeId, since: i32, node: i32) -> bool {
    image
        .segments_of(range)
        .iter()
        .filter(|s| s.leader_epoch > since)
        .all(|s| s.primary() == Some(node))
}

/// A segment of `range` opened at `seq` on `replicas` (the first is the primary).
pub fn open_segment(segment: SegmentId, replicas: Vec<i32>, leader_epoch: i32) -> MetadataRecord {
    MetadataRecord::OpenSegment(SegmentOpenRecord {
        segment,
        replicas,
        leader_epoch,
    })
}

/// The records that bring the image up to date with the segments a
/// primary sealed locally (by rolling, or for a move) and the one it has
/// active now: each segment the image never saw opened is opened, each seal
/// it lacks is recorded, in seq order. New segments open on the replicas and
/// with the leader epoch of the range's newest segment in the image (a plain
/// roll keeps leadership where it is, as a Kafka leader keeps its epoch
/// across segment rolls). Nothing is repeated that the image holds already,
/// so a roll recorded twice (a crash, or a move racing the roll's own
/// record) writes it once. Seals of a log at another leader epoch than the
/// range's newest segment are a closed log's (leadership moved since, and
/// a failover may have reused the numbers): nothing is recorded for them.
pub fn record_local_segments(
    image: &MetadataImage,
    range: RangeId,
    sealed: &[SegmentSealRecord],
    active_seq: Option<u32>,
) -> Vec<MetadataRecord> {
    let Some(newest) = image.segments_of(range).last().cloned() else {
        return Vec::new(); // the range is gone (its topic was deleted)
    };
    let open = |seq: u32| {
        open_segment(
            SegmentId::new(range, seq),
            newest.replicas.clone(),
            newest.leader_epoch,
        )
    };
    if sealed
        .iter()
        .any(|s| s.leader_epoch.is_some_and(|e| e != newest.leader_epoch))
    {
        return Vec::new();
    }
    let mut records = Vec::new();
    let mut opened = std::collections::BTreeSet::new();
    for seal in sealed {
        match image.segments.get(&seal.segment) {
            Some(s) if s.is_sealed() => continue,
            Some(_) => {}
            None => {
                records.push(open(seal.segment.seq));
                opened.insert(seal.segment.seq);
            }
        }
        records.push(MetadataRecord::SealSegment(seal.clone()));
    }
    if let Some(seq) = active_seq {
        if !image.segments.contains_key(&SegmentId::new(range, seq)) && !opened.contains(&seq) {
            records.push(open(seq));
        }
    }
    records
}

/// The entry recording a primary's own roll of `seal`'s segment to
/// `next_seq` ([`record_local_segments`] of that one seal), the next
/// segment opened on `next_replicas` when given ([`place_at_roll`]'s
/// answer) and the roll is from the image's newest segment, else on the
/// rolled segment's replicas (a log that rolled further ahead records its
/// later segments on the replicas this one gets).
pub fn record_roll(
    image: &MetadataImage,
    range: RangeId,
    seal: &SegmentSealRecord,
    next_seq: u32,
    next_replicas: Option<Vec<i32>>,
) -> Vec<MetadataRecord> {
    let mut records =
        record_local_segments(image, range, std::slice::from_ref(seal), Some(next_seq));
    let newest = image.segments_of(range).last().map(|s| s.id);
    let Some(replicas) = next_replicas else {
        return records;
    };
    if newest != Some(seal.segment) || next_seq != seal.segment.seq + 1 {
        return records;
    }
    for r in &mut records {
        if let MetadataRecord::OpenSegment(open) = r {
            if open.segment.seq == next_seq {
                open.replicas = replicas.clone();
            }
        }
    }
    records
}

/// The parents of a move whose active segment `seals` leaves unsealed: a
/// move commits only with every parent's last segment sealed in the same
/// entry (replay refuses the SealRange otherwise), which a broker can do
/// only as the primary of those segments at their epoch.
pub fn parents_left_unsealed(
    image: &MetadataImage,
    parents: &[RangeId],
    seals: &[MetadataRecord],
) -> Vec<RangeId> {
    parents
        .iter()
        .copied()
        .filter(|&parent| {
            image.active_segment(parent).is_some_and(|active| {
                !seals.iter().any(|r| {
                    matches!(r, MetadataRecord::SealSegment(s)
                        if s.segment == active.id
                            && s.leader_epoch.is_none_or(|e| e == active.leader_epoch))
                })
            })
        })
        .collect()
}

fn active_range(image: &MetadataImage, id: RangeId) -> Result<Arc<RangeImage>, PlanError> {
    match image.ranges.get(&id) {
        Some(r) if r.active => Ok(r.clone()),
        Some(_) => Err(PlanError::RangeSealed(id)),
        None => Err(PlanError::UnknownRange(id)),
    }
}

/// A partition's leader epoch grows with every move: one above the
/// parents' newest segments.
pub fn next_epoch(image: &MetadataImage, parents: &[RangeId]) -> i32 {
    parents
        .iter()
        .filter_map(|id| image.segments_of(*id).last().map(|s| s.leader_epoch))
        .max()
        .unwrap_or(0)
        + 1
}

/// The replicas of a range's active segment (where its data and producer
/// state are: the children of a move open there, seeded from it).
fn replicas_of(image: &MetadataImage, range: RangeId) -> Result<Vec<i32>, PlanError> {
    image
        .active_segment(range)
        .map(|s| s.replicas.clone())
        .filter(|r| !r.is_empty())
        .ok_or_else(|| PlanError::InvalidMove(format!("range {range} has no active segment")))
}

/// A planned split or merge: the records after the parents' own seals, and
/// the ranges it creates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MovePlan {
    pub parents: Vec<RangeId>,
    pub children: Vec<RangeId>,
    pub records: Vec<MetadataRecord>,
}

/// Splits an active range at partition `at` (default: the middle) into
/// `[lo, at)` and `[at, hi)`, opened where the parent is with the leader
/// epoch one above it.
pub fn split_range(
    image: &MetadataImage,
    range_id: RangeId,
    at: Option<u32>,
) -> Result<MovePlan, PlanError> {
    let range = active_range(image, range_id)?;
    let mid = at.unwrap_or(range.lo + (range.hi - range.lo) / 2);
    if mid <= range.lo || mid >= range.hi {
        return Err(PlanError::InvalidMove(format!(
            "cannot split range {range_id} [{}, {}) at {mid}: both children need at least one partition",
            range.lo, range.hi
        )));
    }
    let replicas = replicas_of(image, range_id)?;
    let epoch = next_epoch(image, &[range_id]);
    let (left, right) = (image.next_range_id(), image.next_range_id() + 1);
    let mut records = vec![MetadataRecord::SealRange { range_id }];
    for (id, lo, hi) in [(left, range.lo, mid), (right, mid, range.hi)] {
        records.push(MetadataRecord::CreateRange(RangeRecord {
            range_id: id,
            topic_id: range.topic_id,
            lo,
            hi,
            parents: vec![range_id],
        }));
        records.push(open_segment(SegmentId::new(id, 0), replicas.clone(), epoch));
    }
    Ok(MovePlan {
        parents: vec![range_id],
        children: vec![left, right],
        records,
    })
}

/// Merges two adjacent active ranges of one topic into one, opened where
/// they are (both must be led by the same broker: their state seeds the
/// child), with the leader epoch one above both.
pub fn merge_ranges(
    image: &MetadataImage,
    left_id: RangeId,
    right_id: RangeId,
) -> Result<MovePlan, PlanError> {
    let left = active_range(image, left_id)?;
    let right = active_range(image, right_id)?;
    if left.topic_id != right.topic_id || left.hi != right.lo {
        return Err(PlanError::InvalidMove(format!(
            "ranges {left_id} [{}, {}) and {right_id} [{}, {}) are not adjacent ranges of one topic",
            left.lo, left.hi, right.lo, right.hi
        )));
    }
    let replicas = replicas_of(image, left_id)?;
    if replicas.first() != replicas_of(image, right_id)?.first() {
        return Err(PlanError::InvalidMove(format!(
            "ranges {left_id} and {right_id} are led by different brokers"
        )));
    }
    let child = image.next_range_id();
    let epoch = next_epoch(image, &[left_id, right_id]);
    Ok(MovePlan {
        parents: vec![left_id, right_id],
        children: vec![child],
        records: vec![
            MetadataRecord::SealRange { range_id: left_id },
            MetadataRecord::SealRange { range_id: right_id },
            MetadataRecord::CreateRange(RangeRecord {
                range_id: child,
                topic_id: left.topic_id,
                lo: left.lo,
                hi: right.hi,
                parents: vec![left_id, right_id],
            }),
            open_segment(SegmentId::new(child, 0), replicas, epoch),
        ],
    })
}

mod dense;
#[cfg(test)]
mod equivalence;
mod leader_balance;
mod placement;
#[cfg(test)]
mod reference;
pub use leader_balance::{leader_load, plan_leader_moves, plan_leader_moves_except, LeaderMove};
mod load_balance;
pub use load_balance::{broker_loads, plan_balance, range_rates, BalanceMove, LoadBalanceSettings};
mod move_placement;
pub use move_placement::{complete_moves, gather_for_merge, spread_split_children};
mod replacement;
pub use replacement::{
    place_at_roll, place_at_roll_with, plan_follower_replacements, plan_replacements, replica_load,
    seal_and_replace, Replacement,
};
mod unreplicated;
pub use unreplicated::{plan_boundary_moves, plan_unreplicated_moves};

#[cfg(test)]
mod tests;

/// The in-sync reports (Kafka's AlterPartition ISR changes) of a primary:
/// for each active segment `me` leads (`led`, those it ships to the
/// followers the image names), its replicas minus the followers out of
/// sync longer than `replica.lag.time.max.ms` (`lagging`), written when
/// that differs from what the image shows. A set never loses its primary.
pub fn in_sync_reports(
    image: &MetadataImage,
    me: i32,
    led: &BTreeSet<SegmentId>,
    lagging: &BTreeSet<(SegmentId, i32)>,
) -> Vec<MetadataRecord> {
    let mut out = Vec::new();
    for id in led {
        let Some(seg) = image.segments.get(id) else {
            continue;
        };
        if seg.is_sealed() || seg.primary() != Some(me) {
            continue;
        }
        let in_sync: Vec<i32> = seg
            .replicas
            .iter()
            .copied()
            .filter(|&r| r == me || !lagging.contains(&(*id, r)))
            .collect();
        let shown = seg.in_sync.as_ref().unwrap_or(&seg.replicas);
        if in_sync != *shown {
            out.push(MetadataRecord::SetSegmentInSync {
                segment: *id,
                leader_epoch: seg.leader_epoch,
                in_sync,
            });
        }
    }
    out
}

/// The fencing decisions of the active controller (Kafka's broker
/// sessions): a broker not heard from within its session is fenced (it
/// takes no new segments and leads nothing in Metadata); a fenced broker
/// heard from again is unfenced. `alive` is the set of brokers heard from
/// within the session; `grace_over` is false during the first session after
/// this controller became leader (it has not heard from anyone yet).
/// Brokers in `stopping` asked to be fenced (a controlled shutdown's
/// `wantShutDown`): they are fenced at once, grace or not, and stay fenced.
pub fn broker_liveness(
    image: &MetadataImage,
    alive: &std::collections::BTreeSet<i32>,
    stopping: &std::collections::BTreeSet<i32>,
    grace_over: bool,
) -> Vec<MetadataRecord> {
    image
        .brokers
        .values()
        .filter_map(|b| {
            let broker_id = b.registration.broker_id;
            let stopping = stopping.contains(&broker_id);
            let heard = alive.contains(&broker_id) && !stopping;
            match (b.fenced, heard) {
                (false, false) if grace_over || stopping => {
                    Some(MetadataRecord::FenceBroker { broker_id })
                }
                (true, true) => Some(MetadataRecord::UnfenceBroker { broker_id }),
                _ => None,
            }
        })
        .collect()
}

/// The outcome of fencing an active segment's replicas: where a quorum says
/// it ends, and which replica holds that end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuorumSeal {
    pub segment: SegmentId,
    pub size_bytes: u64,
    pub spans: Vec<tessera_metadata::PartitionSpan>,
    /// The replica whose copy reaches `size_bytes`; it leads the next segment.
    pub holder: i32,
}

/// Seal-by-quorum: seal the range's active segment where a quorum of its
/// replicas says it ends, and open the next one with the holder of that end
/// as primary, leader epoch + 1. Fenced replicas are replaced by live
/// brokers outside the set where there are any (the next segment then has
/// the replication factor again); otherwise they stay, and the quorum of the
/// survivors carries the segment.
pub fn seal_by_quorum(
    image: &MetadataImage,
    seal: &QuorumSeal,
) -> Result<Vec<MetadataRecord>, PlanError> {
    seal_by_quorum_inner(image, seal, None)
}

/// [`seal_by_quorum`] with the image's counts kept by the caller (`load`
/// must be [`PlacementLoad::of`] `image`, or kept equal to it): the same
/// records without a walk of every segment per failover.
pub fn seal_by_quorum_with(
    image: &MetadataImage,
    seal: &QuorumSeal,
    load: &PlacementLoad,
) -> Result<Vec<MetadataRecord>, PlanError> {
    seal_by_quorum_inner(image, seal, Some(load))
}

fn seal_by_quorum_inner(
    image: &MetadataImage,
    seal: &QuorumSeal,
    load: Option<&PlacementLoad>,
) -> Result<Vec<MetadataRecord>, PlanError> {
    let range = active_range(image, seal.segment.range)?;
    let Some(segment) = image.segments.get(&seal.segment) else {
        return Err(PlanError::InvalidMove(format!(
            "no segment {}",
            seal.segment
        )));
    };
    if segment.is_sealed() {
        return Err(PlanError::InvalidMove(format!(
            "segment {} is already sealed",
            seal.segment
        )));
    }
    if !segment.replicas.contains(&seal.holder) {
        return Err(PlanError::InvalidMove(format!(
            "broker {} holds no replica of segment {}",
            seal.holder, seal.segment
        )));
    }
    if seal.spans.iter().any(|s| !range.contains(s.partition)) {
        return Err(PlanError::InvalidMove(
            "a span of a partition outside the range".into(),
        ));
    }
    let fenced = |id: &i32| image.brokers.get(id).is_none_or(|b| b.fenced);
    // Replacements for the fenced replicas, placed as new segments are
    // (weighted rendezvous over the live brokers outside the set, rack
    // spread): every failover of a pass taking the same spare (the lowest
    // id, as before) piled a lost rack's followers on one broker (4.5x the
    // mean in docs/SCALE.md).
    let replaced = segment
        .replicas
        .iter()
        .filter(|&&r| r != seal.holder && fenced(&r))
        .count();
    // (Nothing to place when no replica is replaced: no candidates then.)
    let spare: Vec<BrokerCandidate> = match (replaced, load) {
        (0, _) => Vec::new(),
        (_, Some(load)) => load.candidates(image),
        (_, None) => candidates(image),
    }
    .into_iter()
    .filter(|c| !c.fenced && !segment.replicas.contains(&c.broker_id))
    .collect();
    let key = SegmentId::new(seal.segment.range, seal.segment.seq + 1).to_string();
    let placer = placement::Placer::new(&spare);
    let mut placed = placer
        .place_led_by(&placer.rank(&key), None, replaced.min(spare.len()))
        .unwrap_or_default()
        .into_iter();
    let mut replicas = vec![seal.holder];
    for &r in &segment.replicas {
        if r == seal.holder {
            continue;
        }
        match fenced(&r).then(|| placed.next()).flatten() {
            Some(live) => replicas.push(live),
            None => replicas.push(r),
        }
    }
    Ok(seal_and_open_next(seal, replicas, segment.leader_epoch))
}

/// A quorum seal of a segment at `sealed_epoch` and the opening of the
/// range's next segment on `replicas` one epoch up (one metadata entry:
/// nobody sees the range without an active segment).
pub(crate) fn seal_and_open_next(
    seal: &QuorumSeal,
    replicas: Vec<i32>,
    sealed_epoch: i32,
) -> Vec<MetadataRecord> {
    vec![
        MetadataRecord::SealSegment(SegmentSealRecord {
            segment: seal.segment,
            size_bytes: seal.size_bytes,
            spans: seal.spans.clone(),
            leader_epoch: Some(sealed_epoch),
        }),
        open_segment(
            SegmentId::new(seal.segment.range, seal.segment.seq + 1),
            replicas,
            sealed_epoch + 1,
        ),
    ]
}

/// A broker that kept a complete copy of a sealed segment whose replica
/// set no longer lists it (healing replaced it), when none of the listed
/// replicas holds the segment (`lacking` is all of them: their copies are
/// still empty, or their brokers died too): it takes the place of the
/// first listed replica in `lacking` again, so the segment is readable
/// and the others repair from it. `None` when it is listed, the segment is
/// not sealed, or some listed replica is not in `lacking`.
pub fn reinstate_copy(
    image: &MetadataImage,
    segment: SegmentId,
    me: i32,
    lacking: &[i32],
) -> Option<MetadataRecord> {
    let seg = image.segments.get(&segment)?;
    if !seg.is_sealed() || seg.replicas.contains(&me) || seg.replicas.is_empty() {
        return None;
    }
    if !seg.replicas.iter().all(|r| lacking.contains(r)) {
        return None;
    }
    let mut replicas = seg.replicas.clone();
    replicas[0] = me;
    Some(MetadataRecord::SetSegmentReplicas { segment, replicas })
}

/// Healing: every sealed segment with a copy on a broker in `gone` (fenced
/// for longer than the heal delay) or on a broker that is not registered
/// any more (UnregisterBroker: the operator said it is gone, so its copies
/// heal at once, with no delay) gets that copy replaced by one on a live
/// broker outside its replica set, placed like a new segment (weighted
/// rendezvous, racks spread). Survivors keep their order; the new copies
/// come last (they are repaired from the survivors). At most `max_segments`
/// segments per call, so a dead broker's data moves at a bounded pace. A
/// segment with no live survivor, or no broker to take a copy, is left as it
/// is.
pub fn heal_segments(
    image: &MetadataImage,
    gone: &std::collections::BTreeSet<i32>,
    max_segments: usize,
) -> Vec<MetadataRecord> {
    heal_segments_inner(image, gone, max_segments, None, None)
}

/// [`heal_segments`] for a caller that heals in a loop (applying each
/// call's records before the next) with the counts kept ([`PlacementLoad`]):
/// the walk starts after `after`, the last segment the previous call
/// healed, instead of at the first segment. While the brokers and `gone`
/// stay as they are, every segment before it is healed or cannot be (no
/// live survivor, no spare), so each call returns what [`heal_segments`]
/// would on the same image; a loop of them walks the segments once, not
/// once per `max_segments` healed.
pub fn heal_segments_with(
    image: &MetadataImage,
    gone: &std::collections::BTreeSet<i32>,
    max_segments: usize,
    load: &PlacementLoad,
    after: Option<SegmentId>,
) -> Vec<MetadataRecord> {
    heal_segments_inner(image, gone, max_segments, Some(load), after)
}

fn heal_segments_inner(
    image: &MetadataImage,
    gone: &std::collections::BTreeSet<i32>,
    max_segments: usize,
    load: Option<&PlacementLoad>,
    after: Option<SegmentId>,
) -> Vec<MetadataRecord> {
    use std::ops::Bound;
    let live = |id: &i32| image.brokers.get(id).is_some_and(|b| !b.fenced);
    let is_gone = |id: &i32| gone.contains(id) || !image.brokers.contains_key(id);
    let all = match load {
        Some(load) => load.candidates(image),
        None => candidates(image),
    };
    let start = after.map_or(Bound::Unbounded, Bound::Excluded);
    let mut records = Vec::new();
    for seg in image
        .segments
        .range((start, Bound::Unbounded))
        .map(|(_, s)| s)
    {
        if records.len() >= max_segments {
            break;
        }
        if !seg.is_sealed() || !seg.replicas.iter().any(is_gone) {
            continue;
        }
        let survivors: Vec<i32> = seg
            .replicas
            .iter()
            .copied()
            .filter(|r| !is_gone(r))
            .collect();
        if !survivors.iter().any(live) {
            continue; // nobody left to copy from
        }
        let spare: Vec<BrokerCandidate> = all
            .iter()
            .filter(|c| !c.fenced && !seg.replicas.contains(&c.broker_id))
            .cloned()
            .collect();
        let wanted = (seg.replicas.len() - survivors.len()).min(spare.len());
        if wanted == 0 {
            continue;
        }
        let placer = placement::Placer::new(&spare);
        let Ok(placed) = placer.place_led_by(&placer.rank(&seg.id.to_string()), None, wanted)
        else {
            continue;
        };
        let mut replicas = survivors;
        replicas.extend(placed);
        // Copies that found no replacement stay listed until one does.
        replicas.extend(
            seg.replicas
                .iter()
                .filter(|r| is_gone(r))
                .skip(wanted)
                .copied(),
        );
        records.push(MetadataRecord::SetSegmentReplicas {
            segment: seg.id,
            replicas,
        });
    }
    records
}
