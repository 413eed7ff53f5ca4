//! Fetch: resolve each partition to its range log, return stored batches as
//! they are, honour max_bytes / partition_max_bytes (the first batch of the
//! response always, even when larger) and long-poll for min_bytes up to
//! max_wait, woken by high-watermark moves.
//!
//! Fetch sessions (KIP-227) are refused exactly as a Kafka broker with no
//! session cache slots refuses them: full requests get session id 0 and are
//! served sessionless, incremental ones get FETCH_SESSION_ID_NOT_FOUND.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::fetch_response::{
    AbortedTransaction, FetchableTopicResponse, PartitionData,
};
use kafka_protocol::messages::{
    BrokerId, FetchRequest, FetchResponse, ProducerId, RequestHeader, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use tessera_metadata::TopicImage;

use crate::authz::{Authz, Op, Resource};
use crate::broker::Broker;
use crate::broker::{past_cleaned_segment_at, SealedSource};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::request_context::RequestContext;
use crate::topic_config::EffectiveTopicConfig;

/// Session epochs with a meaning of their own (Kafka's FetchMetadata).
const INITIAL_EPOCH: i32 = 0;
const FINAL_EPOCH: i32 = -1;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: FetchRequest,
) -> FetchResponse {
    let version = ctx.version();
    if version >= 7
        && request.session_epoch != INITIAL_EPOCH
        && request.session_epoch != FINAL_EPOCH
    {
        return FetchResponse::default()
            .with_error_code(ResponseError::FetchSessionIdNotFound.code())
            .with_session_id(0);
    }
    let max_wait = Duration::from_millis(request.max_wait_ms.max(0) as u64);
    let deadline = tokio::time::Instant::now() + max_wait;
    let min_bytes = request.min_bytes.max(0) as usize;
    let mut hw_events = broker.hw_events().subscribe();
    let denied = denied_topics(broker, ctx, &request);
    loop {
        hw_events.borrow_and_update();
        let (mut response, mut bytes, has_error, remote) =
            gather(broker, version, &request, &denied);
        if !remote.is_empty() {
            // Sealed history read from another replica: answer at once.
            bytes += read_remote(broker, &mut response, remote).await;
            Metrics::add(&broker.metrics().fetched_bytes, bytes as u64);
            return response;
        }
        if bytes >= min_bytes || has_error || tokio::time::Instant::now() >= deadline {
            Metrics::add(&broker.metrics().fetched_bytes, bytes as u64);
            return response;
        }
        tokio::select! {
            changed = hw_events.changed() => if changed.is_err() { return response },
            _ = tokio::time::sleep_until(deadline) => {}
        }
    }
}

/// A read_uncommitted consumer's Fetch of one partition from `offset`,
/// answered at once with what there is (up to `max_bytes`).
pub(crate) fn consumer_fetch(
    topic: &str,
    partition: i32,
    offset: i64,
    max_bytes: i32,
) -> FetchRequest {
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(0)
        .with_min_bytes(0)
        .with_max_bytes(max_bytes)
        .with_isolation_level(0)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(partition)
                .with_fetch_offset(offset)
                .with_current_leader_epoch(-1)
                .with_log_start_offset(-1)
                .with_partition_max_bytes(max_bytes)])])
}

/// Stored batches of `partition` of `topic` from `offset` (about
/// `max_bytes`, up to the high watermark), read as a consumer's Fetch is:
/// through the partition's ancestor ranges and from the replicas of sealed
/// segments this leader lacks; and the high watermark. For the
/// coordinators' replay of their internal partitions (an internal caller:
/// no ACL applies).
pub(crate) async fn read_internal(
    broker: &Arc<Broker>,
    topic: &str,
    partition: i32,
    offset: i64,
    max_bytes: i32,
) -> Result<(Bytes, i64), ApiError> {
    const VERSION: i16 = 12; // topic names, isolation level
    let header = RequestHeader::default().with_request_api_version(VERSION);
    let request =
        consumer_fetch(topic, partition, offset, max_bytes).with_session_epoch(FINAL_EPOCH);
    let response = handle(broker, &RequestContext::internal(header), request).await;
    let data = response
        .responses
        .into_iter()
        .flat_map(|t| t.partitions)
        .find(|d| d.partition_index == partition)
        .ok_or_else(|| ApiError::Storage("no answer for the partition".into()))?;
    match ResponseError::try_from_code(data.error_code) {
        None => Ok((data.records.unwrap_or_default(), data.high_watermark)),
        Some(ResponseError::NotLeaderOrFollower) => Err(ApiError::NotLeaderOrFollower),
        Some(code) => Err(ApiError::Coded {
            code,
            message: format!("reading {topic}-{partition} at {offset}"),
        }),
    }
}

/// Per requested topic, whether the request may not read it: a consumer
/// needs READ on the topic, a broker (replica id set) CLUSTER_ACTION on the
/// cluster, as in Kafka. Decided once, before any long poll.
fn denied_topics(broker: &Broker, ctx: &RequestContext, request: &FetchRequest) -> Vec<bool> {
    let authz = Authz::of(broker, ctx);
    if request.replica_id.0 >= 0 || request.replica_state.replica_id.0 >= 0 {
        let denied = !authz.allows_cluster(Op::ClusterAction);
        return vec![denied; request.topics.len()];
    }
    let image = broker.image();
    request
        .topics
        .iter()
        .map(|topic| {
            let name = if ctx.version() >= 13 {
                match image.topics.get(&topic.topic_id) {
                    Some(t) => t.name.clone(),
                    // Unknown ids answer UNKNOWN_TOPIC_ID.
                    None => return false,
                }
            } else {
                topic.topic.0.to_string()
            };
            !authz.allows(Op::Read, Resource::Topic, &name)
        })
        .collect()
}

/// A partition whose records this leader reads from another replica (a
/// sealed segment it holds no copy of), filled in by [`read_remote`].
struct RemoteRead {
    /// Position of the partition in the response.
    topic_index: usize,
    partition_index: usize,
    topic: TopicName,
    partition: i32,
    offset: i64,
    max_bytes: usize,
    /// Nothing at or past this offset is returned (the last stable offset
    /// for read_committed).
    upper: i64,
    holders: Vec<i32>,
}

/// One pass over the requested partitions: `(response, record bytes, any
/// error, partitions to read from other replicas)`.
fn gather(
    broker: &Broker,
    version: i16,
    request: &FetchRequest,
    denied: &[bool],
) -> (FetchResponse, usize, bool, Vec<RemoteRead>) {
    let image = broker.image();
    let mut remaining = request.max_bytes.max(0) as usize;
    let read_committed = request.isolation_level == 1;
    // A broker reading a sealed segment it lacks (see `RemoteRead`).
    let from_broker = request.replica_id.0 >= 0 || request.replica_state.replica_id.0 >= 0;
    let mut remote = Vec::new();
    let mut total = 0usize;
    let mut has_error = false;
    let mut topics = Vec::with_capacity(request.topics.len());
    for (topic_index, topic) in request.topics.iter().enumerate() {
        // v13+ names topics by id only.
        let resolved: Result<Arc<TopicImage>, ApiError> = if denied[topic_index] {
            Err(ApiError::TopicAuthorizationFailed)
        } else if version >= 13 {
            image
                .topics
                .get(&topic.topic_id)
                .cloned()
                .ok_or(ApiError::UnknownTopicId)
        } else {
            image
                .topic_by_name(topic.topic.0.as_str())
                .cloned()
                .ok_or(ApiError::UnknownTopicOrPartition)
        };
        // The topic's configs once, not per partition.
        let resolved = resolved.map(|t| broker.with_config(&image, t));
        let mut partitions = Vec::with_capacity(topic.partitions.len());
        for (partition_index, p) in topic.partitions.iter().enumerate() {
            let data = match &resolved {
                Err(e) => Err(e.clone()),
                Ok((t, config)) => read_partition(
                    broker,
                    &image,
                    t,
                    p,
                    Reader {
                        config: *config,
                        read_committed,
                        rack: request.rack_id.as_str(),
                        first_in_response: total == 0,
                        from_broker,
                    },
                    &mut remaining,
                )
                .map(|(data, elsewhere)| {
                    if let Some(mut r) = elsewhere {
                        r.topic_index = topic_index;
                        r.partition_index = partition_index;
                        r.topic = TopicName(StrBytes::from_string(t.name.clone()));
                        remote.push(r);
                    }
                    data
                }),
            };
            let data = match data {
                Ok(d) => {
                    total += d.records.as_ref().map_or(0, Bytes::len);
                    d
                }
                Err(e) => {
                    has_error = true;
                    // Kafka answers an errored partition with -1 for the high
                    // watermark, last stable offset and log start offset.
                    PartitionData::default()
                        .with_partition_index(p.partition)
                        .with_error_code(e.code())
                        .with_high_watermark(-1)
                        .with_last_stable_offset(-1)
                        .with_log_start_offset(-1)
                        .with_preferred_read_replica(BrokerId(-1))
                        .with_records(Some(Bytes::new()))
                }
            };
            partitions.push(data);
        }
        topics.push(
            FetchableTopicResponse::default()
                .with_topic(if version >= 13 {
                    TopicName(StrBytes::default())
                } else {
                    topic.topic.clone()
                })
                .with_topic_id(topic.topic_id)
                .with_partitions(partitions),
        );
    }
    (
        FetchResponse::default()
            .with_session_id(0)
            .with_responses(topics),
        total,
        has_error,
        remote,
    )
}

/// Who asks, as far as one partition's read is concerned.
struct Reader<'a> {
    /// The topic's configs ([`Broker::topic_config`]).
    config: EffectiveTopicConfig,
    read_committed: bool,
    /// The consumer's `client.rack` (v11+), for fetches from followers.
    rack: &'a str,
    first_in_response: bool,
    /// Another broker asks (Fetch's replica id): served from sealed copies
    /// when this broker does not lead the partition.
    from_broker: bool,
}

fn read_partition(
    broker: &Broker,
    image: &tessera_metadata::MetadataImage,
    topic: &TopicImage,
    p: &FetchPartition,
    reader: Reader<'_>,
    remaining: &mut usize,
) -> Result<(PartitionData, Option<RemoteRead>), ApiError> {
    let Reader {
        config,
        read_committed,
        rack,
        first_in_response,
        from_broker,
    } = reader;
    let route = match broker.route_with(image, topic, p.partition, config) {
        Ok(route) => route,
        // A consumer sent here as the preferred read replica (KIP-392), or
        // a leader reading a sealed segment it lacks.
        Err(ApiError::NotLeaderOrFollower)
            if from_broker
                || (broker.follower_fetch_enabled() && !rack.is_empty() && !read_committed) =>
        {
            return follower_partition(broker, image, topic, p, remaining, first_in_response)
                .map(|d| (d, None));
        }
        Err(e) => return Err(e),
    };
    if p.current_leader_epoch >= 0 && p.current_leader_epoch != route.leader_epoch {
        let e = if p.current_leader_epoch > route.leader_epoch {
            ApiError::UnknownLeaderEpoch
        } else {
            ApiError::FencedLeaderEpoch
        };
        return Err(e);
    }
    let partition = p.partition as u32;
    let limit = (p.partition_max_bytes.max(0) as usize).min(*remaining);
    let mut offsets = route.log.offsets(partition)?;
    // The metadata log is the authority on the log start (DeleteRecords);
    // the log learns it in the reconcile pass that follows the image.
    offsets.log_start = offsets
        .log_start
        .max(image.log_start_offset(topic.id, partition));
    if p.fetch_offset < offsets.log_start || p.fetch_offset > offsets.log_end {
        return Err(broker.offset_out_of_range());
    }
    // read_committed consumers see nothing at or past the last stable offset.
    let upper = if read_committed {
        offsets.last_stable
    } else {
        offsets.high_watermark
    };
    let mut records = Bytes::new();
    let preferred = if read_committed {
        None
    } else {
        broker.preferred_read_replica(image, topic, partition, p.fetch_offset, rack)
    };
    if let Some(replica) = preferred {
        // No records: the consumer fetches them from that replica.
        return Ok((
            PartitionData::default()
                .with_partition_index(p.partition)
                .with_high_watermark(offsets.high_watermark)
                .with_last_stable_offset(offsets.last_stable)
                .with_log_start_offset(offsets.log_start)
                .with_preferred_read_replica(BrokerId(replica))
                .with_records(Some(Bytes::new())),
            None,
        ));
    }
    let mut elsewhere = None;
    let wanted = p.fetch_offset < upper && (limit > 0 || first_in_response);
    if wanted {
        match read_here(
            broker,
            image,
            topic,
            &route.log,
            partition,
            p.fetch_offset,
            limit,
            upper,
        )? {
            Located::Here(read) => {
                // Only the response's first batch may exceed the limit (KIP-74).
                if read.len() <= limit || first_in_response {
                    records = read;
                }
            }
            Located::Elsewhere { offset, holders } => {
                elsewhere = Some(RemoteRead {
                    topic_index: 0,
                    partition_index: 0,
                    topic: TopicName::default(),
                    partition: p.partition,
                    offset,
                    max_bytes: if first_in_response {
                        limit.max(1)
                    } else {
                        limit
                    },
                    upper,
                    holders,
                });
                // Filled in by `read_remote`; the budget is that read's.
                *remaining = remaining.saturating_sub(limit);
            }
        }
    }
    *remaining = remaining.saturating_sub(records.len());
    let mut data = PartitionData::default()
        .with_partition_index(p.partition)
        .with_high_watermark(offsets.high_watermark)
        .with_last_stable_offset(offsets.last_stable)
        .with_log_start_offset(offsets.log_start)
        .with_preferred_read_replica(BrokerId(-1))
        .with_records(Some(records));
    if read_committed {
        // Aborted transactions overlapping what may be returned, from every
        // range of the partition's lineage (a marker can land in a child),
        // once each: a child also lists its ancestors' (it inherits them),
        // and a client given one twice would drop the producer's next
        // transaction as well.
        let mut aborted = std::collections::BTreeSet::new();
        for log in broker.lineage(image, topic, partition) {
            for a in log.aborted_transactions(partition, p.fetch_offset, upper)? {
                aborted.insert((a.first_offset, a.producer_id));
            }
        }
        let aborted = aborted
            .into_iter()
            .map(|(first_offset, producer_id)| {
                AbortedTransaction::default()
                    .with_producer_id(ProducerId(producer_id))
                    .with_first_offset(first_offset)
            })
            .collect();
        data = data.with_aborted_transactions(Some(aborted));
    }
    Ok((data, elsewhere))
}

/// Where a partition's records from an offset are.
enum Located {
    /// Read here (possibly nothing: no batch below the upper bound).
    Here(Bytes),
    /// In a sealed segment this broker holds no copy of, from `offset` on
    /// (past the segments the cleaner emptied for the partition).
    Elsewhere { offset: i64, holders: Vec<i32> },
}

/// Reads `partition` from `from` (about `limit` bytes, batches starting
/// below `upper`) where this broker holds it: its open range logs (the
/// active one, `active`, and its ancestors) or its copies of sealed
/// segments. A sealed segment the cleaner left without a batch of the
/// partition at or after the offset is passed over to the next one, as
/// Kafka's log read passes over compacted-away offsets; an empty answer
/// below the high watermark would stall a consumer there for good and end
/// a coordinator's load early.
#[allow(clippy::too_many_arguments)]
fn read_here(
    broker: &Broker,
    image: &tessera_metadata::MetadataImage,
    topic: &TopicImage,
    active: &Arc<tessera_log::range_log::RangeLog>,
    partition: u32,
    from: i64,
    limit: usize,
    upper: i64,
) -> Result<Located, ApiError> {
    let mut from = from;
    loop {
        let read = match broker.sealed_source(image, topic, partition, from) {
            SealedSource::Remote(holders) => {
                return Ok(Located::Elsewhere {
                    offset: from,
                    holders,
                })
            }
            SealedSource::Copy => {
                let read = broker.follower_read(image, topic, partition, from, limit)?;
                match read.continue_at {
                    Some(next) if next < upper => {
                        from = next;
                        continue;
                    }
                    _ => below(read.records, upper),
                }
            }
            SealedSource::Log => {
                read_log(broker, image, topic, active, partition, from, limit, upper)?
            }
        };
        if read.is_empty() {
            if let Some(next) = past_cleaned_segment_at(image, topic, partition, from) {
                if next < upper {
                    from = next;
                    continue;
                }
            }
        }
        return Ok(Located::Here(read));
    }
}

/// Reads `partition` from `from` in this broker's open range log that
/// holds the offset: the active range's, or an ancestor's below its base.
#[allow(clippy::too_many_arguments)]
fn read_log(
    broker: &Broker,
    image: &tessera_metadata::MetadataImage,
    topic: &TopicImage,
    active: &Arc<tessera_log::range_log::RangeLog>,
    partition: u32,
    from: i64,
    limit: usize,
    upper: i64,
) -> Result<Bytes, ApiError> {
    // Offsets below the active range's base live in an ancestor range.
    let log = if from >= active.base_offset(partition)? {
        active.clone()
    } else {
        broker
            .read_route(image, topic, partition, from)
            .inspect_err(|e| {
                tracing::warn!(
                    topic = %topic.name,
                    partition,
                    offset = from,
                    error = %e,
                    "an offset below the active range's base that no log open here holds (no open log of the partition's lineage starts at or below it)"
                )
            })?
    };
    let mut read = log.read_below(partition, from, limit, upper)?;
    // Never past a sealed segment the log does not serve: the records of
    // the offset's segment, or none (a skipped segment would look like
    // compacted-away offsets to the consumer).
    if let Some(end) = broker.sealed_span_end(image, topic, partition, from) {
        // Nor does a read jump a gap in the offsets: the log may lack the
        // sealed segments after this one (other replicas hold them) and go
        // on with a later one's batches. The next fetch starts at the gap,
        // which `sealed_source` serves from where it is held.
        if first_base_offset(&read.records).is_some_and(|base| base < end) {
            read.records = contiguous_prefix(read.records);
        }
        if first_base_offset(&read.records).is_some_and(|base| base >= end) {
            tracing::error!(
                topic = %topic.name,
                partition,
                offset = from,
                end,
                "a read skipped the sealed segment of the offset; not served"
            );
            return Err(ApiError::Storage(
                "the sealed segment of the offset is not available here".into(),
            ));
        }
    }
    Ok(read.records)
}

/// A partition read served by this broker as a follower (sealed data only).
fn follower_partition(
    broker: &Broker,
    image: &tessera_metadata::MetadataImage,
    topic: &TopicImage,
    p: &FetchPartition,
    remaining: &mut usize,
    first_in_response: bool,
) -> Result<PartitionData, ApiError> {
    if p.partition < 0 || p.partition as u32 >= topic.partitions {
        return Err(ApiError::UnknownTopicOrPartition);
    }
    let partition = p.partition as u32;
    let log_start = image.log_start_offset(topic.id, partition);
    if p.fetch_offset < log_start {
        return Err(broker.offset_out_of_range());
    }
    let limit = (p.partition_max_bytes.max(0) as usize).min(*remaining);
    let read = broker
        .follower_read(image, topic, partition, p.fetch_offset, limit)
        .map_err(|e| match e {
            ApiError::OffsetOutOfRange => broker.offset_out_of_range(),
            e => e,
        })?;
    let records = if read.records.len() <= limit || first_in_response {
        read.records
    } else {
        Bytes::new()
    };
    *remaining = remaining.saturating_sub(records.len());
    Ok(PartitionData::default()
        .with_partition_index(p.partition)
        .with_high_watermark(read.high_watermark)
        .with_last_stable_offset(read.high_watermark)
        .with_log_start_offset(log_start)
        .with_preferred_read_replica(BrokerId(-1))
        .with_records(Some(records)))
}

/// How long a leader waits for another replica's sealed copy.
const REMOTE_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Fills in the records of partitions whose sealed segment this leader
/// lacks, fetched from a replica that holds it (asking as a broker, so the
/// replica serves its sealed copy); returns the bytes added. With no
/// replica answering, the partition gets KAFKA_STORAGE_ERROR (retriable):
/// never the data past the gap, which would skip records.
async fn read_remote(
    broker: &Broker,
    response: &mut FetchResponse,
    reads: Vec<RemoteRead>,
) -> usize {
    let image = broker.image();
    let mut added = 0;
    for read in reads {
        let records = read_from_holders(broker, &image, &read).await;
        let slot = &mut response.responses[read.topic_index].partitions[read.partition_index];
        match records {
            Ok(r) => {
                added += r.len();
                Metrics::add(&broker.metrics().remote_read_bytes, r.len() as u64);
                slot.records = Some(r);
            }
            Err(answers) => {
                tracing::warn!(
                    topic = %read.topic.0,
                    partition = read.partition,
                    offset = read.offset,
                    answers = %answers.join("; "),
                    "no live replica served a sealed segment this leader lacks"
                );
                *slot = PartitionData::default()
                    .with_partition_index(read.partition)
                    .with_error_code(
                        ApiError::Storage("sealed segment not available".into()).code(),
                    )
                    .with_high_watermark(-1)
                    .with_last_stable_offset(-1)
                    .with_log_start_offset(-1)
                    .with_preferred_read_replica(BrokerId(-1))
                    .with_records(Some(Bytes::new()));
            }
        }
    }
    added
}

/// The records of `read` from the replicas holding its sealed segment, or
/// what each replica asked answered when none served it. When every replica that answered
/// had nothing left of the partition in that segment (the cleaner emptied
/// it from the offset on), the read goes on at the next segment, wherever
/// that one is held (see [`read_here`]).
async fn read_from_holders(
    broker: &Broker,
    image: &tessera_metadata::MetadataImage,
    read: &RemoteRead,
) -> Result<Bytes, Vec<String>> {
    let partition = read.partition as u32;
    let mut offset = read.offset;
    let mut holders = read.holders.clone();
    // What each replica asked answered, for the log when none served.
    let mut answers = Vec::new();
    // Each round moves past one segment: bounded by the partition's history.
    loop {
        let mut answered_empty = false;
        for holder in &holders {
            let Some(b) = image.brokers.get(holder) else {
                continue;
            };
            let ask = FetchRequest::default()
                .with_replica_id(BrokerId(broker.config().node_id))
                .with_max_wait_ms(0)
                .with_min_bytes(0)
                .with_max_bytes(read.max_bytes as i32)
                .with_isolation_level(0)
                .with_topics(vec![FetchTopic::default()
                    .with_topic(read.topic.clone())
                    .with_partitions(vec![FetchPartition::default()
                        .with_partition(read.partition)
                        .with_fetch_offset(offset)
                        .with_current_leader_epoch(-1)
                        .with_log_start_offset(-1)
                        .with_partition_max_bytes(read.max_bytes as i32)])]);
            let answer = crate::peer::call(
                broker.inter_broker(),
                &b.registration.host,
                b.registration.port,
                REMOTE_FETCH_VERSION,
                &ask,
                REMOTE_READ_TIMEOUT,
            )
            .await;
            let data = answer.map(|r| {
                r.responses
                    .into_iter()
                    .flat_map(|t| t.partitions)
                    .find(|d| d.partition_index == read.partition)
            });
            match data {
                Ok(Some(d)) if d.error_code == 0 => {
                    let r = d.records.unwrap_or_default();
                    if !r.is_empty() {
                        return Ok(below(r, read.upper));
                    }
                    answered_empty = true;
                    answers.push(format!("{holder}: nothing at {offset}"));
                }
                Ok(Some(d)) => {
                    answers.push(format!("{holder}: error {} at {offset}", d.error_code))
                }
                Ok(None) => answers.push(format!("{holder}: no partition in the answer")),
                Err(e) => answers.push(format!("{holder}: {e}")),
            }
        }
        if holders.is_empty() {
            answers.push(format!("no live replica holds offset {offset}"));
        }
        let Some(topic) = image.topic_by_name(read.topic.0.as_str()) else {
            return Err(answers);
        };
        let Some(next) = answered_empty
            .then(|| past_cleaned_segment_at(image, topic, partition, offset))
            .flatten()
        else {
            return Err(answers);
        };
        if next >= read.upper {
            return Ok(Bytes::new());
        }
        let active = match broker.route(image, topic, read.partition) {
            Ok(route) => route.log,
            Err(e) => {
                answers.push(format!("this broker: {e} at {next}"));
                return Err(answers);
            }
        };
        match read_here(
            broker,
            image,
            topic,
            &active,
            partition,
            next,
            read.max_bytes,
            read.upper,
        ) {
            Ok(Located::Here(records)) => return Ok(records),
            Ok(Located::Elsewhere {
                offset: at,
                holders: h,
            }) => {
                offset = at;
                holders = h;
            }
            Err(e) => {
                answers.push(format!("this broker: {e} at {next}"));
                return Err(answers);
            }
        }
    }
}

/// The Fetch version a leader uses to read another replica's sealed copy
/// (the last with the replica id in the request body and topic names).
const REMOTE_FETCH_VERSION: i16 = 12;

/// The whole batches of `records` that start below `upper`.
/// The base offset of the first batch of `records`, if any.
fn first_base_offset(records: &Bytes) -> Option<i64> {
    (records.len() >= 8).then(|| i64::from_be_bytes(records[..8].try_into().unwrap()))
}

/// The leading batches of `records` whose offsets follow each other with
/// no gap (each batch starts where the one before it ended).
fn contiguous_prefix(records: Bytes) -> Bytes {
    let Ok(batches) = tessera_log::batch::split_batches(&records) else {
        return records;
    };
    let mut next = None;
    let mut end = 0;
    for b in &batches {
        let frame = &records[b.start..b.end];
        if frame.len() < 27 {
            break;
        }
        let base = i64::from_be_bytes(frame[..8].try_into().unwrap());
        let last_delta = i32::from_be_bytes(frame[23..27].try_into().unwrap());
        if next.is_some_and(|n| n != base) {
            break;
        }
        next = Some(base + i64::from(last_delta) + 1);
        end = b.end;
    }
    records.slice(..end)
}

fn below(records: Bytes, upper: i64) -> Bytes {
    let Ok(batches) = tessera_log::batch::split_batches(&records) else {
        return records;
    };
    let end = batches
        .iter()
        .take_while(|b| {
            let base = i64::from_be_bytes(records[b.start..b.start + 8].try_into().unwrap());
            base < upper
        })
        .last()
        .map_or(0, |b| b.end);
    records.slice(..end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_log::batch::set_base_offset;
    use tessera_log::batch::testing::make_batch;

    /// Batches of `counts` records at `bases`, one after the other.
    fn batches(at: &[(i64, i32)]) -> Bytes {
        let mut out = Vec::new();
        for &(base, count) in at {
            let mut b = make_batch(count, 0);
            set_base_offset(&mut b, base);
            out.extend_from_slice(&b);
        }
        Bytes::from(out)
    }

    #[test]
    fn contiguous_prefix_stops_at_the_first_gap_between_batches() {
        let all = batches(&[(10, 3), (13, 2), (20, 4)]);
        let want = batches(&[(10, 3), (13, 2)]);
        assert_eq!(contiguous_prefix(all), want);
    }

    #[test]
    fn contiguous_prefix_keeps_a_read_without_a_gap_whole() {
        let all = batches(&[(0, 1), (1, 5), (6, 1)]);
        assert_eq!(contiguous_prefix(all.clone()), all);
        // A single batch is its own prefix, whatever its base.
        let one = batches(&[(42, 7)]);
        assert_eq!(contiguous_prefix(one.clone()), one);
    }

    #[test]
    fn contiguous_prefix_cuts_a_segment_skip_after_one_batch() {
        // Segment N's last batch ends at 100; the next batch read is segment
        // N+2's at 150 (N+1 not held here): only N's batch is served.
        let all = batches(&[(97, 3), (150, 2)]);
        assert_eq!(contiguous_prefix(all), batches(&[(97, 3)]));
    }

    #[test]
    fn below_keeps_the_batches_starting_under_the_limit() {
        let all = batches(&[(0, 3), (3, 3), (6, 3)]);
        assert_eq!(below(all.clone(), 4), batches(&[(0, 3), (3, 3)]));
        assert_eq!(below(all.clone(), 0), Bytes::new());
        assert_eq!(below(all.clone(), 100), all);
    }
}
