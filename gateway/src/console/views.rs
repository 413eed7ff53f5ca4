//! What the console's pages show, built from the metadata image and the
//! reported load alone (pure: tested below without a broker). The I/O
//! parts (log offsets and messages, asked of the partitions' leaders) are
//! in `api.rs`.

use std::collections::BTreeMap;

use serde::Serialize;
use tessera_metadata::{MetadataImage, RangeId, TopicImage};

/// The cluster page.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ClusterView {
    pub cluster_id: String,
    pub controller_id: i32,
    /// The node answering (the console works from any node).
    pub node_id: i32,
    pub version: &'static str,
    pub metadata_offset: i64,
    pub brokers: Vec<BrokerRow>,
    pub topics: usize,
    pub partitions: u64,
    pub ranges: usize,
    pub under_replicated_partitions: u64,
    pub offline_partitions: u64,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct BrokerRow {
    pub id: i32,
    pub host: String,
    pub port: u16,
    pub rack: Option<String>,
    pub fenced: bool,
    /// The active controller.
    pub controller: bool,
    /// A voter of the metadata quorum (Kafka's `process.roles` with
    /// `controller`); the others are broker-only nodes.
    pub voter: bool,
    /// Partitions it leads (primary of their range's active segment).
    pub leader_partitions: u64,
    /// Active segments it holds a replica of.
    pub replicas: usize,
    /// Bytes appended per second to the ranges it leads, as reported.
    pub bytes_in_per_sec: u64,
}

/// One row of the topics page.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct TopicRow {
    pub name: String,
    pub id: String,
    pub internal: bool,
    pub partitions: u32,
    pub replication_factor: i16,
    /// Active ranges.
    pub ranges: usize,
    /// Bytes in sealed segments (the active ones are counted when sealed).
    pub sealed_bytes: u64,
    pub bytes_in_per_sec: u64,
}

/// A topic's page: partitions, ranges and segments (configs and offsets
/// are added by the API).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct TopicView {
    #[serde(flatten)]
    pub row: TopicRow,
    pub partitions: Vec<PartitionRow>,
    pub ranges: Vec<RangeRow>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PartitionRow {
    pub partition: i32,
    /// -1 while no live broker leads it.
    pub leader: i32,
    pub leader_epoch: i32,
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
    pub offline_replicas: Vec<i32>,
    /// The active range holding it.
    pub range: Option<RangeId>,
    /// Filled in by the API from the leader (ListOffsets); `None` when it
    /// did not answer.
    pub log_start: Option<i64>,
    pub log_end: Option<i64>,
}

/// A range with its chain of segments, its lineage included: the strip on
/// the ranges page.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RangeRow {
    pub id: RangeId,
    pub lo: u32,
    pub hi: u32,
    pub active: bool,
    pub parents: Vec<RangeId>,
    pub bytes_in_per_sec: u64,
    pub segments: Vec<SegmentRow>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct SegmentRow {
    pub seq: u32,
    pub replicas: Vec<i32>,
    pub primary: Option<i32>,
    pub leader_epoch: i32,
    pub sealed: bool,
    pub sealed_bytes: Option<u64>,
}

fn live(image: &MetadataImage, broker: i32) -> bool {
    image.brokers.get(&broker).is_some_and(|b| !b.fenced)
}

/// Partitions of active ranges whose active segment lacks a live in-sync
/// replica, and those with no live leader (Kafka's cluster-wide counts).
fn partition_health(image: &MetadataImage) -> (u64, u64) {
    let (mut under, mut offline) = (0, 0);
    for topic in image.topics.values() {
        for range in image.active_ranges(topic.id) {
            let width = u64::from(range.hi - range.lo);
            let Some(seg) = image.active_segment(range.id) else {
                offline += width;
                continue;
            };
            if !seg.primary().is_some_and(|p| live(image, p)) {
                offline += width;
                continue;
            }
            let in_sync = seg
                .in_sync
                .as_ref()
                .unwrap_or(&seg.replicas)
                .iter()
                .filter(|r| live(image, **r))
                .count();
            if in_sync < seg.replicas.len() {
                under += width;
            }
        }
    }
    (under, offline)
}

/// The cluster page from the image and the ranges' reported rates.
pub fn cluster(
    image: &MetadataImage,
    cluster_id: &str,
    controller_id: i32,
    node_id: i32,
    voters: &std::collections::BTreeSet<i32>,
    rates: &BTreeMap<RangeId, u64>,
) -> ClusterView {
    let mut leaders: BTreeMap<i32, u64> = BTreeMap::new();
    let mut replicas: BTreeMap<i32, usize> = BTreeMap::new();
    let mut bytes_in: BTreeMap<i32, u64> = BTreeMap::new();
    let mut partitions = 0;
    let mut ranges = 0;
    for topic in image.topics.values() {
        partitions += u64::from(topic.partitions);
        for range in image.active_ranges(topic.id) {
            ranges += 1;
            let Some(seg) = image.active_segment(range.id) else {
                continue;
            };
            if let Some(p) = seg.primary() {
                *leaders.entry(p).or_default() += u64::from(range.hi - range.lo);
                *bytes_in.entry(p).or_default() += rates.get(&range.id).copied().unwrap_or(0);
            }
            for r in &seg.replicas {
                *replicas.entry(*r).or_default() += 1;
            }
        }
    }
    let (under, offline) = partition_health(image);
    ClusterView {
        cluster_id: cluster_id.to_string(),
        controller_id,
        node_id,
        version: env!("CARGO_PKG_VERSION"),
        metadata_offset: image.offset,
        brokers: image
            .brokers
            .values()
            .map(|b| {
                let id = b.registration.broker_id;
                BrokerRow {
                    id,
                    host: b.registration.host.clone(),
                    port: b.registration.port,
                    rack: b.registration.rack.clone(),
                    fenced: b.fenced,
                    controller: id == controller_id,
                    voter: voters.contains(&id),
                    leader_partitions: leaders.get(&id).copied().unwrap_or(0),
                    replicas: replicas.get(&id).copied().unwrap_or(0),
                    bytes_in_per_sec: bytes_in.get(&id).copied().unwrap_or(0),
                }
            })
            .collect(),
        topics: image.topics.len(),
        partitions,
        ranges,
        under_replicated_partitions: under,
        offline_partitions: offline,
    }
}

/// One topic's row.
pub fn topic_row(
    image: &MetadataImage,
    topic: &TopicImage,
    rates: &BTreeMap<RangeId, u64>,
) -> TopicRow {
    let active = image.active_ranges(topic.id);
    let sealed_bytes = image
        .ranges
        .values()
        .filter(|r| r.topic_id == topic.id)
        .flat_map(|r| image.segments_of(r.id))
        .filter_map(|s| s.sealed.as_ref().map(|i| i.size_bytes))
        .sum();
    TopicRow {
        name: topic.name.clone(),
        id: topic.id.to_string(),
        internal: crate::internal_topics::is_internal(&topic.name),
        partitions: topic.partitions,
        replication_factor: topic.replication_factor,
        ranges: active.len(),
        sealed_bytes,
        bytes_in_per_sec: active
            .iter()
            .map(|r| rates.get(&r.id).copied().unwrap_or(0))
            .sum(),
    }
}

/// The topics `visible` lets the caller see, by name, filtered by `search`
/// (a case-insensitive substring; empty: all).
pub fn topics(
    image: &MetadataImage,
    rates: &BTreeMap<RangeId, u64>,
    search: &str,
    visible: impl Fn(&str) -> bool,
) -> Vec<TopicRow> {
    let search = search.to_lowercase();
    let mut rows: Vec<TopicRow> = image
        .topics
        .values()
        .filter(|t| t.name.to_lowercase().contains(&search) && visible(&t.name))
        .map(|t| topic_row(image, t, rates))
        .collect();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    rows
}

/// A topic's partitions (as Metadata reports them), and its ranges with
/// their segments, the sealed ancestors included.
pub fn topic(
    image: &MetadataImage,
    topic: &TopicImage,
    rates: &BTreeMap<RangeId, u64>,
) -> TopicView {
    let described = crate::api::metadata::describe_topic(image, topic, i32::MIN);
    let ids = |nodes: &[kafka_protocol::messages::BrokerId]| -> Vec<i32> {
        nodes.iter().map(|b| b.0).collect()
    };
    let partitions = described
        .partitions
        .iter()
        .map(|p| PartitionRow {
            partition: p.partition_index,
            leader: p.leader_id.0,
            leader_epoch: p.leader_epoch,
            replicas: ids(&p.replica_nodes),
            isr: ids(&p.isr_nodes),
            offline_replicas: ids(&p.offline_replicas),
            range: image
                .active_range_for(topic.id, p.partition_index as u32)
                .map(|r| r.id),
            log_start: None,
            log_end: None,
        })
        .collect();
    let ranges = image
        .ranges
        .values()
        .filter(|r| r.topic_id == topic.id)
        .map(|r| RangeRow {
            id: r.id,
            lo: r.lo,
            hi: r.hi,
            active: r.active,
            parents: r.parents.clone(),
            bytes_in_per_sec: rates.get(&r.id).copied().unwrap_or(0),
            segments: image
                .segments_of(r.id)
                .iter()
                .map(|s| SegmentRow {
                    seq: s.id.seq,
                    replicas: s.replicas.clone(),
                    primary: s.primary(),
                    leader_epoch: s.leader_epoch,
                    sealed: s.is_sealed(),
                    sealed_bytes: s.sealed.as_ref().map(|i| i.size_bytes),
                })
                .collect(),
        })
        .collect();
    TopicView {
        row: topic_row(image, topic, rates),
        partitions,
        ranges,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_metadata::{
        BrokerRegistration, MetadataRecord, RangeRecord, SegmentId, SegmentOpenRecord, TopicRecord,
    };

    fn broker(id: i32) -> MetadataRecord {
        MetadataRecord::RegisterBroker(BrokerRegistration {
            broker_id: id,
            incarnation_id: uuid::Uuid::from_u128(id as u128),
            host: format!("h{id}"),
            port: 9092,
            rack: Some(format!("r{id}")),
        })
    }

    fn create_topic(id: u128, name: &str, partitions: u32) -> MetadataRecord {
        MetadataRecord::CreateTopic(TopicRecord {
            topic_id: uuid::Uuid::from_u128(id),
            name: name.into(),
            partitions,
            replication_factor: 2,
            configs: Default::default(),
        })
    }

    fn range(id: u64, topic: u128, lo: u32, hi: u32, replicas: Vec<i32>) -> [MetadataRecord; 2] {
        [
            MetadataRecord::CreateRange(RangeRecord {
                range_id: id,
                topic_id: uuid::Uuid::from_u128(topic),
                lo,
                hi,
                parents: vec![],
            }),
            MetadataRecord::OpenSegment(SegmentOpenRecord {
                segment: SegmentId::new(id, 0),
                replicas,
                leader_epoch: 0,
            }),
        ]
    }

    /// Brokers 1 and 2 live, 3 fenced; "orders" has ranges on [1, 2] (two
    /// partitions) and [3, 1] (one, its leader fenced); "clicks" one range
    /// on [2, 3] (one follower fenced).
    fn image() -> MetadataImage {
        let mut records = vec![
            broker(1),
            broker(2),
            broker(3),
            MetadataRecord::UnfenceBroker { broker_id: 1 },
            MetadataRecord::UnfenceBroker { broker_id: 2 },
            create_topic(7, "orders", 3),
            create_topic(8, "clicks", 1),
        ];
        records.extend(range(1, 7, 0, 2, vec![1, 2]));
        records.extend(range(2, 7, 2, 3, vec![3, 1]));
        records.extend(range(3, 8, 0, 1, vec![2, 3]));
        let mut image = MetadataImage::default();
        for (i, r) in records.iter().enumerate() {
            image.apply(r, i as i64 + 1);
        }
        image
    }

    #[test]
    fn the_cluster_counts_leaders_replicas_load_and_partition_health() {
        let image = image();
        let rates = BTreeMap::from([(1, 1000), (3, 5)]);
        let voters = std::collections::BTreeSet::from([1, 2]);
        let view = cluster(&image, "cid", 2, 1, &voters, &rates);
        let rows: Vec<(i32, bool, bool, u64, usize, u64)> = view
            .brokers
            .iter()
            .map(|b| {
                (
                    b.id,
                    b.fenced,
                    b.controller,
                    b.leader_partitions,
                    b.replicas,
                    b.bytes_in_per_sec,
                )
            })
            .collect();
        assert_eq!(
            rows,
            vec![
                (1, false, false, 2, 2, 1000),
                (2, false, true, 1, 2, 5),
                (3, true, false, 1, 2, 0),
            ]
        );
        assert_eq!((view.topics, view.partitions, view.ranges), (2, 4, 3));
        // [3, 1]: led by a fenced broker (offline); [2, 3]: a fenced follower.
        assert_eq!(view.offline_partitions, 1);
        assert_eq!(view.under_replicated_partitions, 1);
        assert_eq!(view.brokers[0].rack.as_deref(), Some("r1"));
        let roles: Vec<bool> = view.brokers.iter().map(|b| b.voter).collect();
        assert_eq!(roles, vec![true, true, false]);
    }

    #[test]
    fn topics_are_searched_sorted_and_filtered_by_what_the_caller_may_see() {
        let image = image();
        let rates = BTreeMap::from([(1, 10), (2, 20)]);
        let all = topics(&image, &rates, "", |_| true);
        assert_eq!(
            all.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
            ["clicks", "orders"]
        );
        assert_eq!((all[1].ranges, all[1].bytes_in_per_sec), (2, 30));
        let found = topics(&image, &rates, "ORD", |_| true);
        assert_eq!(found.len(), 1);
        assert!(topics(&image, &rates, "", |name| name != "orders")
            .iter()
            .all(|t| t.name == "clicks"));
    }

    #[test]
    fn a_topic_shows_each_partition_as_metadata_does_and_its_segment_chains() {
        let image = image();
        let orders = image.topic_by_name("orders").unwrap().clone();
        let view = topic(&image, &orders, &BTreeMap::new());
        let partitions: Vec<(i32, i32, Vec<i32>, Option<RangeId>)> = view
            .partitions
            .iter()
            .map(|p| (p.partition, p.leader, p.isr.clone(), p.range))
            .collect();
        assert_eq!(
            partitions,
            vec![
                (0, 1, vec![1, 2], Some(1)),
                (1, 1, vec![1, 2], Some(1)),
                // Its leader is fenced: no leader, only the live replica in sync.
                (2, -1, vec![1], Some(2)),
            ]
        );
        assert_eq!(view.partitions[2].offline_replicas, vec![3]);
        assert_eq!(view.ranges.len(), 2);
        assert_eq!(view.ranges[0].segments.len(), 1);
        let segment = &view.ranges[0].segments[0];
        assert_eq!(
            (segment.primary, segment.sealed, segment.sealed_bytes),
            (Some(1), false, None)
        );
    }
}
