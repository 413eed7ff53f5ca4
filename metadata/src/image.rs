//! The metadata image: the state every replica replays the log into.
//!
//! An image is an immutable value published as `Arc<MetadataImage>`; the
//! controller builds the next one by cloning the current one once per apply
//! batch. Bulky members sit behind `Arc`, so a clone copies map nodes and
//! bumps reference counts instead of deep-copying topics and segments.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::records::{
    BrokerRegistration, CleanPassRecord, CleanedSegment, ClientQuotaEntity, MetadataRecord,
    PartitionSpan, RangeRecord, ScramCredentialRecord, SegmentOpenRecord, SegmentSealRecord,
    TopicRecord,
};
use crate::{RangeId, SegmentId, TopicId};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerImage {
    pub registration: BrokerRegistration,
    /// A fenced broker is registered but must not lead or take new segments.
    pub fenced: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicImage {
    pub id: TopicId,
    pub name: String,
    pub partitions: u32,
    pub replication_factor: i16,
    pub configs: BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeImage {
    pub id: RangeId,
    pub topic_id: TopicId,
    /// Covers partitions `[lo, hi)`.
    pub lo: u32,
    pub hi: u32,
    pub parents: Vec<RangeId>,
    /// False once the range was sealed (it became a split/merge parent).
    pub active: bool,
    /// The range's last log-cleaning pass (`CleanSegments`), which every
    /// replica of its segments applies.
    pub last_clean: Option<Arc<CleanPassRecord>>,
}

impl RangeImage {
    /// The number of the range's last cleaning pass; 0 before any.
    pub fn clean_pass(&self) -> u64 {
        self.last_clean.as_ref().map_or(0, |c| c.pass)
    }
}

impl RangeImage {
    pub fn contains(&self, partition: u32) -> bool {
        self.lo <= partition && partition < self.hi
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SealInfo {
    /// The sealed size, or the size after the segment's last cleaning pass.
    pub size_bytes: u64,
    pub spans: Vec<PartitionSpan>,
    /// Set once a cleaning pass rewrote the segment: what its copies hold.
    pub cleaned: Option<SegmentCleaning>,
}

/// The cleaning pass a sealed segment's copies are at, and the CRC-32C of
/// the whole file after it (`size_bytes` is its size).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentCleaning {
    pub pass: u64,
    pub crc32c: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentImage {
    pub id: SegmentId,
    /// `replicas[0]` is the primary.
    pub replicas: Vec<i32>,
    pub leader_epoch: i32,
    /// `None` while the segment is active.
    pub sealed: Option<SealInfo>,
    /// The replicas its primary last reported in sync (Kafka's ISR, from
    /// `SetSegmentInSync`); `None`: all of them (none reported out of sync
    /// since the segment opened). Active segments only.
    pub in_sync: Option<Vec<i32>>,
}

impl SegmentImage {
    /// The primary replica: the leader of the range's partitions while this
    /// segment is the active one.
    pub fn primary(&self) -> Option<i32> {
        self.replicas.first().copied()
    }

    pub fn is_sealed(&self) -> bool {
        self.sealed.is_some()
    }

    /// Sealed with nothing in it (and never cleaned): it holds no history,
    /// so every broker holds it as far as producer state goes.
    pub fn is_sealed_empty(&self) -> bool {
        self.sealed
            .as_ref()
            .is_some_and(|s| s.size_bytes == 0 && s.cleaned.is_none())
    }

    /// The cleaning pass this sealed segment's copies are at (0: none).
    pub fn clean_pass(&self) -> u64 {
        self.sealed
            .as_ref()
            .and_then(|s| s.cleaned)
            .map_or(0, |c| c.pass)
    }

    /// The offsets this sealed segment holds for `partition`, if any.
    pub fn span_of(&self, partition: u32) -> Option<PartitionSpan> {
        self.sealed
            .as_ref()?
            .spans
            .iter()
            .find(|s| s.partition == partition)
            .copied()
    }
}

/// Everything the metadata log says, as of `offset`.
#[derive(Clone, Debug, PartialEq)]
pub struct MetadataImage {
    /// Offset (raft log index) of the last applied record batch; -1 when
    /// nothing was applied yet.
    pub offset: i64,
    pub brokers: BTreeMap<i32, BrokerImage>,
    pub topics: BTreeMap<TopicId, Arc<TopicImage>>,
    pub topic_names: BTreeMap<String, TopicId>,
    pub ranges: BTreeMap<RangeId, Arc<RangeImage>>,
    /// Ordered by (range, seq): a range's segments are adjacent.
    pub segments: BTreeMap<SegmentId, Arc<SegmentImage>>,
    pub log_start_offsets: BTreeMap<(TopicId, u32), i64>,
    /// Index of `ranges` by topic, maintained by [`MetadataImage::apply`],
    /// so per-request routing does not scan every range of every topic.
    pub topic_ranges: BTreeSet<(TopicId, RangeId)>,
    /// Index of the active ranges by (topic, first partition), maintained
    /// by [`MetadataImage::apply`]: whether a new range overlaps an active
    /// one is its predecessor's question (active ranges never overlap).
    pub active_ranges_by_lo: BTreeMap<(TopicId, u32), RangeId>,
    /// The first producer id not yet handed out: every id below it belongs
    /// to an applied `AllocateProducerIds` block. 0 in an empty image.
    pub next_producer_id: i64,
    /// The broker that received the last applied producer id block; -1
    /// while none was allocated (`next_producer_id == 0`).
    pub last_producer_id_broker: i32,
    /// Dynamic broker configs (`SetBrokerConfig`): `None` holds the
    /// cluster-wide defaults, `Some(id)` one broker's own values. A map
    /// whose last key was deleted is removed, so an image and the image
    /// replayed from its snapshot are equal.
    pub broker_configs: BTreeMap<Option<i32>, BTreeMap<String, String>>,
    /// SCRAM credentials by (user, mechanism type byte).
    pub scram_credentials: BTreeMap<(String, u8), ScramCredentialRecord>,
    /// ACLs by id (`CreateAcl`/`RemoveAcl`).
    pub acls: BTreeMap<uuid::Uuid, crate::acl::AclBinding>,
    /// Client quotas (`ClientQuota`) by entity, then key; an entity whose
    /// last key was removed is removed.
    pub client_quotas: BTreeMap<ClientQuotaEntity, BTreeMap<String, f64>>,
    /// Every range id below this was taken by a range of a topic since
    /// deleted (`DeleteTopic` raises it, `RetireRangeIds` carries it
    /// through a snapshot): a new range never takes such an id. Ids name a
    /// range's log, its segments' copies and replication streams on every
    /// broker; an id handed out again once its topic was deleted met the
    /// old range's leftovers (librdkafka's 0107_topic_recreate on 3 nodes:
    /// followers refused the new range's frames for good).
    pub retired_range_ids_below: RangeId,
}

/// The empty image: `offset` is -1 (nothing applied), not 0, because 0 is
/// a valid offset.
impl Default for MetadataImage {
    fn default() -> Self {
        MetadataImage {
            offset: -1,
            brokers: BTreeMap::new(),
            topics: BTreeMap::new(),
            topic_names: BTreeMap::new(),
            ranges: BTreeMap::new(),
            segments: BTreeMap::new(),
            log_start_offsets: BTreeMap::new(),
            topic_ranges: BTreeSet::new(),
            active_ranges_by_lo: BTreeMap::new(),
            next_producer_id: 0,
            last_producer_id_broker: -1,
            broker_configs: BTreeMap::new(),
            scram_credentials: BTreeMap::new(),
            acls: BTreeMap::new(),
            client_quotas: BTreeMap::new(),
            retired_range_ids_below: 0,
        }
    }
}

fn segment_bounds(range: RangeId) -> std::ops::RangeInclusive<SegmentId> {
    SegmentId { range, seq: 0 }..=SegmentId {
        range,
        seq: u32::MAX,
    }
}

impl MetadataImage {
    pub fn empty() -> Self {
        Self::default()
    }

    pub fn topic_by_name(&self, name: &str) -> Option<&Arc<TopicImage>> {
        self.topics.get(self.topic_names.get(name)?)
    }

    pub(crate) fn topic_range_ids(&self, topic: TopicId) -> impl Iterator<Item = RangeId> + '_ {
        self.topic_ranges
            .range((topic, RangeId::MIN)..=(topic, RangeId::MAX))
            .map(|(_, r)| *r)
    }

    /// Active ranges of `topic`, sorted by `lo`. They tile the topic's
    /// partitions when the writers keep the design's invariant.
    pub fn active_ranges(&self, topic: TopicId) -> Vec<Arc<RangeImage>> {
        let mut v: Vec<_> = self
            .topic_range_ids(topic)
            .filter_map(|id| self.ranges.get(&id))
            .filter(|r| r.active)
            .cloned()
            .collect();
        v.sort_by_key(|r| (r.lo, r.id));
        v
    }

    /// All ranges of `topic` (active and sealed), by id.
    pub fn all_ranges(&self, topic: TopicId) -> Vec<Arc<RangeImage>> {
        self.topic_range_ids(topic)
            .filter_map(|id| self.ranges.get(&id))
            .cloned()
            .collect()
    }

    /// The active range that routes `partition` of `topic`.
    pub fn active_range_for(&self, topic: TopicId, partition: u32) -> Option<Arc<RangeImage>> {
        self.topic_range_ids(topic)
            .filter_map(|id| self.ranges.get(&id))
            .find(|r| r.active && r.contains(partition))
            .cloned()
    }

    /// Segments of `range`, by seq.
    pub fn segments_of(&self, range: RangeId) -> Vec<Arc<SegmentImage>> {
        self.segments
            .range(segment_bounds(range))
            .map(|(_, s)| s.clone())
            .collect()
    }

    /// The unsealed segment of `range` (there is at most one).
    pub fn active_segment(&self, range: RangeId) -> Option<Arc<SegmentImage>> {
        self.segments
            .range(segment_bounds(range))
            .rev()
            .map(|(_, s)| s)
            .find(|s| s.sealed.is_none())
            .cloned()
    }

    /// Partitions without a live leader (Kafka's `OfflinePartitionsCount`):
    /// those of active ranges whose active segment's primary is fenced or
    /// unregistered, or that have no active segment, and those no active
    /// range covers.
    pub fn offline_partitions(&self) -> u64 {
        let mut offline = 0u64;
        for topic in self.topics.values() {
            let mut covered = 0u64;
            for range in self.active_ranges(topic.id) {
                let width = u64::from(range.hi.min(topic.partitions).saturating_sub(range.lo));
                covered += width;
                let led = self.active_segment(range.id).is_some_and(|s| {
                    s.primary()
                        .and_then(|p| self.brokers.get(&p))
                        .is_some_and(|b| !b.fenced)
                });
                if !led {
                    offline += width;
                }
            }
            offline += u64::from(topic.partitions).saturating_sub(covered);
        }
        offline
    }

    /// The id a new range should get: one above the largest existing and
    /// above every id a deleted topic's ranges had (ids are never handed
    /// out twice).
    pub fn next_range_id(&self) -> RangeId {
        self.ranges
            .keys()
            .next_back()
            .map_or(1, |id| id + 1)
            .max(self.retired_range_ids_below)
    }

    /// The next seq for a new segment of `range`.
    pub fn next_segment_seq(&self, range: RangeId) -> u32 {
        self.segments
            .range(segment_bounds(range))
            .next_back()
            .map_or(0, |(id, _)| id.seq.saturating_add(1))
    }

    /// The dynamic value of broker config `key` for `broker_id`: its own,
    /// else the cluster-wide default, with `true` when it is its own.
    pub fn dynamic_broker_config(&self, broker_id: i32, key: &str) -> Option<(&str, bool)> {
        if let Some(v) = self
            .broker_configs
            .get(&Some(broker_id))
            .and_then(|m| m.get(key))
        {
            return Some((v, true));
        }
        self.broker_configs
            .get(&None)
            .and_then(|m| m.get(key))
            .map(|v| (v.as_str(), false))
    }

    /// Log start offset of a partition; 0 until DeleteRecords/retention moved it.
    pub fn log_start_offset(&self, topic: TopicId, partition: u32) -> i64 {
        self.log_start_offsets
            .get(&(topic, partition))
            .copied()
            .unwrap_or(0)
    }

    /// Records that rebuild this image from empty (used for snapshots).
    ///
    /// The order satisfies the replay checks of
    /// [`crate::decode_committed_value`]: brokers, topics, then per topic
    /// its ranges with parents before children, each range's segments in
    /// seq order (each sealed right after it opens, so the range never has
    /// two active segments), the range's own seal after its segments, log
    /// start offsets, the producer id allocation, and last the dynamic
    /// broker configs (which depend on nothing). Replaying them
    /// with the image's offset gives an equal image.
    ///
    /// The producer id state is one `AllocateProducerIds` block `[0,
    /// next_producer_id)` for the last allocating broker. A block holds at
    /// most `i32::MAX` ids, so beyond that the range is emitted as
    /// consecutive full blocks (never more blocks than the allocations the
    /// log applied to get there).
    pub fn to_records(&self) -> Vec<MetadataRecord> {
        let mut out = Vec::new();
        for b in self.brokers.values() {
            out.push(MetadataRecord::RegisterBroker(b.registration.clone()));
            if !b.fenced {
                out.push(MetadataRecord::UnfenceBroker {
                    broker_id: b.registration.broker_id,
                });
            }
        }
        for t in self.topics.values() {
            out.push(MetadataRecord::CreateTopic(TopicRecord {
                topic_id: t.id,
                name: t.name.clone(),
                partitions: t.partitions,
                replication_factor: t.replication_factor,
                configs: t.configs.clone(),
            }));
        }
        for t in self.topics.values() {
            let mut emitted = BTreeSet::new();
            for id in self.topic_range_ids(t.id).collect::<Vec<_>>() {
                self.emit_range(id, &mut emitted, &mut out);
            }
        }
        for (&(topic_id, partition), &offset) in &self.log_start_offsets {
            out.push(MetadataRecord::SetLogStartOffset {
                topic_id,
                partition,
                offset,
            });
        }
        self.emit_producer_ids(&mut out);
        for (broker_id, configs) in &self.broker_configs {
            for (key, value) in configs {
                out.push(MetadataRecord::SetBrokerConfig {
                    broker_id: *broker_id,
                    key: key.clone(),
                    value: Some(value.clone()),
                });
            }
        }
        for credential in self.scram_credentials.values() {
            out.push(MetadataRecord::SetScramCredential(credential.clone()));
        }
        for (id, acl) in &self.acls {
            out.push(MetadataRecord::CreateAcl {
                id: *id,
                acl: acl.clone(),
            });
        }
        for (entity, quotas) in &self.client_quotas {
            for (key, value) in quotas {
                out.push(MetadataRecord::ClientQuota {
                    entity: entity.clone(),
                    key: key.clone(),
                    value: Some(crate::records::QuotaValue(*value)),
                });
            }
        }
        // After the ranges: live ranges may have ids below it.
        if self.retired_range_ids_below > 0 {
            out.push(MetadataRecord::RetireRangeIds {
                below: self.retired_range_ids_below,
            });
        }
        out
    }

    /// Consecutive blocks covering `[0, next_producer_id)`, all for the last
    /// allocating broker; nothing while no id was allocated.
    fn emit_producer_ids(&self, out: &mut Vec<MetadataRecord>) {
        let mut first = 0i64;
        while first < self.next_producer_id {
            let count = (self.next_producer_id - first).min(i64::from(i32::MAX));
            out.push(MetadataRecord::AllocateProducerIds {
                broker_id: self.last_producer_id_broker.max(0),
                first_producer_id: first,
                count: count as i32,
            });
            first += count;
        }
    }

    /// The cleaning state of `range`'s segments: one `CleanSegments` per
    /// older pass still current for some segment (only what replay reads
    /// of it: pass, sizes and CRCs), then the range's last pass as written.
    fn emit_clean_passes(&self, range: &RangeImage, out: &mut Vec<MetadataRecord>) {
        let Some(last) = &range.last_clean else {
            return;
        };
        let mut older: BTreeMap<u64, Vec<CleanedSegment>> = BTreeMap::new();
        for s in self.segments_of(range.id) {
            let Some(seal) = &s.sealed else { continue };
            if let Some(c) = seal.cleaned.filter(|c| c.pass < last.pass) {
                older.entry(c.pass).or_default().push(CleanedSegment {
                    seq: s.id.seq,
                    size_before: seal.size_bytes,
                    size_after: seal.size_bytes,
                    crc32c: c.crc32c,
                });
            }
        }
        for (pass, segments) in older {
            out.push(MetadataRecord::CleanSegments(CleanPassRecord {
                range_id: range.id,
                pass,
                now_ms: last.now_ms,
                delete_retention_ms: last.delete_retention_ms,
                segments,
            }));
        }
        out.push(MetadataRecord::CleanSegments((**last).clone()));
    }

    /// Emits `id` after its parents (iteratively: lineage chains can be long).
    fn emit_range(
        &self,
        id: RangeId,
        emitted: &mut BTreeSet<RangeId>,
        out: &mut Vec<MetadataRecord>,
    ) {
        let mut stack = vec![(id, false)];
        while let Some((id, parents_done)) = stack.pop() {
            if emitted.contains(&id) {
                continue;
            }
            let Some(r) = self.ranges.get(&id) else {
                continue;
            };
            if !parents_done {
                stack.push((id, true));
                for p in r.parents.iter().rev() {
                    if !emitted.contains(p) {
                        stack.push((*p, false));
                    }
                }
                continue;
            }
            emitted.insert(id);
            out.push(MetadataRecord::CreateRange(RangeRecord {
                range_id: r.id,
                topic_id: r.topic_id,
                lo: r.lo,
                hi: r.hi,
                parents: r.parents.clone(),
            }));
            for s in self.segments_of(id) {
                out.push(MetadataRecord::OpenSegment(SegmentOpenRecord {
                    segment: s.id,
                    replicas: s.replicas.clone(),
                    leader_epoch: s.leader_epoch,
                }));
                if let Some(in_sync) = &s.in_sync {
                    out.push(MetadataRecord::SetSegmentInSync {
                        segment: s.id,
                        leader_epoch: s.leader_epoch,
                        in_sync: in_sync.clone(),
                    });
                }
                if let Some(seal) = &s.sealed {
                    out.push(MetadataRecord::SealSegment(SegmentSealRecord {
                        segment: s.id,
                        size_bytes: seal.size_bytes,
                        spans: seal.spans.clone(),
                        leader_epoch: Some(s.leader_epoch),
                    }));
                }
            }
            self.emit_clean_passes(r, out);
            if !r.active {
                out.push(MetadataRecord::SealRange { range_id: id });
            }
        }
    }
}
