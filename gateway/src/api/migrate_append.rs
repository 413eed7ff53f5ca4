//! MigrateAppend: tessera's private request (api key `0x7e02`, version 0)
//! with which `tessera migrate` writes batches copied from another Kafka
//! cluster **at their source offsets**. Produce assigns offsets; this path
//! appends each batch at its own base offset (the partition's next offset
//! jumps over gaps left by compaction or transaction markers), byte for
//! byte, control batches included.
//!
//! The body is a ProduceRequest at v9 (flexible; request header v2) and the
//! answer a ProduceResponse v9 (response header v1), so the migrator and
//! the broker reuse kafka-protocol's codecs and the broker's framing,
//! routing and durability path. `acks` is ignored: every answer waits for
//! the appends to be durable on a quorum (acks=-1).
//!
//! It is refused (INVALID_REQUEST on every partition) unless the broker
//! runs with `migration.append.enable=true`: nothing but a migration should
//! ever choose offsets. A batch below the partition's log end is
//! INVALID_RECORD (offsets are never reused) and stops that partition's
//! batches; the batches of a partition are all validated (magic 2, CRC-32C)
//! before any is appended.

use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tessera_log::batch;

use super::{InFlight, Reply};
use crate::broker::append::DurabilityWaits;
use crate::broker::{Broker, PartitionRoute};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::request_context::{Connection, RequestContext};

/// The private api key (next to replication's `0x7e01`).
pub const API_KEY: i16 = 0x7e02;
/// The only version.
pub const VERSION: i16 = 0;
/// The ProduceRequest / ProduceResponse version of the body.
pub const BODY_VERSION: i16 = 9;
/// Request header version (flexible, as Produce v9's).
pub const REQUEST_HEADER_VERSION: i16 = 2;
/// Response header version (flexible, as Produce v9's).
pub const RESPONSE_HEADER_VERSION: i16 = 1;

/// How long the durability wait may take before REQUEST_TIMED_OUT.
const DURABLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Decodes the request and appends its batches in request order; the
/// returned future waits for durability and answers.
pub async fn start(
    broker: &Arc<Broker>,
    version: i16,
    mut frame: Bytes,
    connection: Option<Connection>,
) -> InFlight {
    let ready = |r: Reply| -> InFlight { Box::pin(std::future::ready(r)) };
    if version != VERSION {
        return ready(Reply::Close(format!(
            "unsupported version {version} of MigrateAppend"
        )));
    }
    let header = match RequestHeader::decode(&mut frame, REQUEST_HEADER_VERSION) {
        Ok(h) => h,
        Err(e) => return ready(Reply::Close(format!("malformed request header: {e}"))),
    };
    let request = match ProduceRequest::decode(&mut frame, BODY_VERSION) {
        Ok(r) => r,
        Err(e) => return ready(Reply::Close(format!("malformed request body: {e}"))),
    };
    let id = header.correlation_id;
    let ctx = RequestContext::new(header, connection);
    // Source producer ids must never be handed to a producer of this
    // cluster (its sequence would clash with the migrated state).
    let max_producer_id = request
        .topic_data
        .iter()
        .flat_map(|t| &t.partition_data)
        .filter_map(|p| p.records.as_deref())
        .flat_map(|r| {
            batch::split_batches(r)
                .unwrap_or_default()
                .into_iter()
                .map(move |b| &r[b])
        })
        .filter_map(|b| batch::parse_header(b).ok())
        .map(|h| h.producer_id)
        .max()
        .unwrap_or(-1);
    if broker.config().migration_append_enable && max_producer_id >= broker.image().next_producer_id
    {
        if let Err(e) = broker
            .producer_ids()
            .reserve_through(
                broker.controller(),
                broker.config().node_id,
                max_producer_id,
            )
            .await
        {
            tracing::warn!(error = %e, "reserving migrated producer ids failed");
        }
    }
    let mut waits = DurabilityWaits::for_acks(-1);
    let mut outcomes = Vec::new();
    let enabled = broker.config().migration_append_enable;
    let image = broker.image();
    // Writing at source offsets is a broker's privilege: CLUSTER_ACTION on
    // the cluster (a super user, or the inter-broker listener).
    let denied = crate::authz::Authz::of(broker, &ctx)
        .cluster(crate::authz::Op::ClusterAction)
        .err();
    for topic in &request.topic_data {
        let resolved = image.topic_by_name(topic.name.0.as_str()).cloned();
        let mut partitions = Vec::new();
        for p in &topic.partition_data {
            let result = if let Some(e) = &denied {
                Err(e.clone())
            } else if !enabled {
                Err(ApiError::InvalidRequest(
                    "migration appends are disabled on this broker \
                     (start it with migration.append.enable=true)"
                        .into(),
                ))
            } else {
                match &resolved {
                    None => Err(ApiError::UnknownTopicOrPartition),
                    Some(t) => broker.route(&image, t, p.index).and_then(|route| {
                        append_partition(
                            broker,
                            &route,
                            &mut waits,
                            p.index as u32,
                            p.records.as_deref(),
                        )
                        .map(|base| (route.range_id, base))
                    }),
                }
            };
            partitions.push((p.index, result));
        }
        outcomes.push((topic.name.clone(), partitions));
    }
    let broker = broker.clone();
    Box::pin(async move {
        let failed = waits.wait(Some(DURABLE_TIMEOUT)).await;
        let responses = outcomes
            .into_iter()
            .map(|(name, partitions)| {
                let partition_responses = partitions
                    .into_iter()
                    .map(|(index, result)| {
                        let result = result.and_then(|(range, base)| match failed.get(&range) {
                            Some(e) => Err(e.clone()),
                            None => Ok(base),
                        });
                        match result {
                            Ok(base) => PartitionProduceResponse::default()
                                .with_index(index)
                                .with_base_offset(base),
                            Err(e) => {
                                broker.metrics().count_error(0);
                                PartitionProduceResponse::default()
                                    .with_index(index)
                                    .with_error_code(e.code())
                                    .with_base_offset(-1)
                                    .with_error_message(e.message().map(StrBytes::from_string))
                            }
                        }
                    })
                    .collect();
                TopicProduceResponse::default()
                    .with_name(name)
                    .with_partition_responses(partition_responses)
            })
            .collect();
        encode(id, &ProduceResponse::default().with_responses(responses))
    })
}

fn encode(correlation_id: i32, body: &ProduceResponse) -> Reply {
    let mut buf = BytesMut::new();
    buf.put_i32(0);
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    let encoded = header
        .encode(&mut buf, RESPONSE_HEADER_VERSION)
        .and_then(|()| body.encode(&mut buf, BODY_VERSION));
    match encoded {
        Ok(()) => {
            let len = (buf.len() - 4) as i32;
            buf[0..4].copy_from_slice(&len.to_be_bytes());
            Reply::Frame(buf.freeze())
        }
        Err(e) => Reply::Close(format!("MigrateAppend response does not encode: {e}")),
    }
}

/// A copied batch: magic 2, a length that matches, a correct CRC-32C.
/// Unlike a produced batch it may hold no records (Kafka's cleaner keeps
/// an emptied batch to preserve its producer's sequence).
fn validate_copied(bytes: &[u8]) -> Result<(), ApiError> {
    let header = batch::parse_header(bytes)?;
    if header.total_len() != bytes.len() || header.last_offset_delta < 0 || header.record_count < 0
    {
        return Err(ApiError::CorruptMessage(
            "malformed copied record batch".into(),
        ));
    }
    if batch::compute_crc(bytes) != header.crc {
        return Err(tessera_log::BatchError::CrcMismatch.into());
    }
    Ok(())
}

/// Validates every batch of one partition, then appends them at their own
/// offsets. Returns the first batch's base offset.
fn append_partition(
    broker: &Broker,
    route: &PartitionRoute,
    waits: &mut DurabilityWaits,
    partition: u32,
    records: Option<&[u8]>,
) -> Result<i64, ApiError> {
    let records = records.filter(|r| !r.is_empty()).ok_or_else(|| {
        ApiError::CorruptMessage("MigrateAppend carries no record batch for the partition".into())
    })?;
    let ranges = batch::split_batches(records)?;
    for r in &ranges {
        validate_copied(&records[r.clone()])?;
    }
    broker.check_in_sync(route)?;
    let mut first = None;
    for r in ranges {
        let mut bytes = records[r].to_vec();
        let outcome = broker.append_batch_at_source_offset(route, partition, &mut bytes)?;
        waits.add(route, &outcome);
        Metrics::add(&broker.metrics().migrated_batches, 1);
        Metrics::add(&broker.metrics().migrated_bytes, bytes.len() as u64);
        first.get_or_insert(outcome.base_offset);
    }
    Ok(first.expect("at least one batch"))
}
