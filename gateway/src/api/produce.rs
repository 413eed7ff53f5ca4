//! Produce: validate every batch of a partition (magic 2, CRC-32C, size
//! against max.message.bytes) before any is appended, append to the range
//! that covers the partition, then acknowledge by `acks` once the appends are
//! durable (group commit: the range's flusher covers many requests per fsync).

use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse};
use kafka_protocol::protocol::StrBytes;
use tessera_log::{batch, now_ms};
use tessera_metadata::RangeId;

use crate::authz::{Authz, Op, Resource};
use crate::broker::append::DurabilityWaits;
use crate::broker::{Broker, PartitionRoute};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::request_context::RequestContext;

struct AppendedBatch {
    /// The range the batches went to: its durability decides the answer.
    range_id: RangeId,
    base_offset: i64,
    log_append_time: i64,
    log_start_offset: i64,
}

/// A produce request whose batches are appended, waiting to be acknowledged.
pub struct Appended {
    request: ProduceRequest,
    waits: DurabilityWaits,
    outcomes: Vec<(usize, i32, Result<AppendedBatch, ApiError>)>,
    /// Set when the request is answered without appending (bad acks).
    early: Option<ProduceResponse>,
}

/// Validates and appends. The connection runs this part in request order
/// (so pipelined produce requests land in the order they were sent), and
/// only the durability wait in [`acknowledge`] overlaps with later requests.
pub async fn append(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: ProduceRequest,
) -> Appended {
    let acks = request.acks;
    if !(-1..=1).contains(&acks) {
        let responses = request
            .topic_data
            .iter()
            .map(|t| {
                TopicProduceResponse::default()
                    .with_name(t.name.clone())
                    .with_partition_responses(
                        t.partition_data
                            .iter()
                            .map(|p| error_response(p.index, &ApiError::InvalidRequiredAcks(acks)))
                            .collect(),
                    )
            })
            .collect();
        let early = Some(ProduceResponse::default().with_responses(responses));
        return Appended {
            request,
            waits: DurabilityWaits::default(),
            outcomes: Vec::new(),
            early,
        };
    }

    // Append everything first, remembering the furthest position per range;
    // then wait once per range for durability.
    let mut waits = DurabilityWaits::for_acks(acks);
    let mut outcomes: Vec<(usize, i32, Result<AppendedBatch, ApiError>)> = Vec::new();
    // Kafka: WRITE on the transactional id of a transactional produce (the
    // whole request fails), then WRITE on each topic.
    let authz = Authz::of(broker, ctx);
    let txn_denied = request
        .transactional_id
        .as_ref()
        .is_some_and(|id| !authz.allows(Op::Write, Resource::TransactionalId, id));
    for (ti, topic) in request.topic_data.iter().enumerate() {
        let name = topic.name.0.as_str();
        let image = broker.image();
        let resolved = match image.topic_by_name(name) {
            _ if txn_denied => Err(ApiError::TransactionalIdAuthorizationFailed),
            _ if !authz.allows(Op::Write, Resource::Topic, name) => {
                Err(ApiError::TopicAuthorizationFailed)
            }
            Some(t) => Ok(t.clone()),
            None if broker.config().auto_create_topics && authz.may_create_topic(name) => {
                broker.auto_create_topic(name).await
            }
            None => Err(ApiError::UnknownTopicOrPartition),
        };
        let image = broker.image();
        // The topic's configs once, not per partition.
        let resolved = resolved.map(|t| broker.with_config(&image, t));
        for p in &topic.partition_data {
            let result = match &resolved {
                Err(e) => Err(e.clone()),
                Ok((t, config)) => match broker.route_with(&image, t, p.index, *config) {
                    Err(e) => Err(e),
                    Ok(route) => append_partition(
                        broker,
                        acks,
                        &route,
                        &mut waits,
                        name,
                        p.index as u32,
                        p.records.as_deref(),
                    ),
                },
            };
            outcomes.push((ti, p.index, result));
        }
    }

    Appended {
        request,
        waits,
        outcomes,
        early: None,
    }
}

/// Waits until the appends are durable (acks 1 and -1) and builds the
/// response. Returns `None` for acks=0: Kafka sends no response at all.
pub async fn acknowledge(broker: &Arc<Broker>, appended: Appended) -> Option<ProduceResponse> {
    let Appended {
        request,
        waits,
        mut outcomes,
        early,
    } = appended;
    if early.is_some() {
        return early;
    }
    if request.acks == 0 {
        return None;
    }
    let timeout = Duration::from_millis(request.timeout_ms.max(0) as u64);
    let failed = waits.wait(Some(timeout)).await;
    // A failure is reported on every partition whose batches went to the
    // range that failed (the range appended to, whatever the image says now).
    for (_, _, result) in outcomes.iter_mut() {
        if let Some(e) = result.as_ref().ok().and_then(|a| failed.get(&a.range_id)) {
            *result = Err(e.clone());
        }
    }

    let mut responses: Vec<TopicProduceResponse> = request
        .topic_data
        .iter()
        .map(|t| TopicProduceResponse::default().with_name(t.name.clone()))
        .collect();
    for (ti, index, result) in outcomes {
        let response = match result {
            Ok(a) => PartitionProduceResponse::default()
                .with_index(index)
                .with_base_offset(a.base_offset)
                .with_log_append_time_ms(a.log_append_time)
                .with_log_start_offset(a.log_start_offset),
            Err(e) => {
                broker.metrics().count_error(0);
                error_response(index, &e)
            }
        };
        responses[ti].partition_responses.push(response);
    }
    Some(ProduceResponse::default().with_responses(responses))
}

fn error_response(index: i32, e: &ApiError) -> PartitionProduceResponse {
    let record_errors = match e {
        ApiError::RecordErrors(errors) => errors
            .iter()
            .map(|r| {
                BatchIndexAndErrorMessage::default()
                    .with_batch_index(r.batch_index)
                    .with_batch_index_error_message(Some(StrBytes::from_string(r.message.clone())))
            })
            .collect(),
        _ => Vec::new(),
    };
    PartitionProduceResponse::default()
        .with_index(index)
        .with_error_code(e.code())
        .with_base_offset(-1)
        .with_log_append_time_ms(-1)
        .with_log_start_offset(-1)
        .with_record_errors(record_errors)
        .with_error_message(e.message().map(StrBytes::from_string))
}

/// Validates all batches of one partition, then appends them. Returns the
/// first batch's offsets; what to wait for goes into `waits`.
fn append_partition(
    broker: &Broker,
    acks: i16,
    route: &PartitionRoute,
    waits: &mut DurabilityWaits,
    topic: &str,
    partition: u32,
    records: Option<&[u8]>,
) -> Result<AppendedBatch, ApiError> {
    let records = records.filter(|r| !r.is_empty()).ok_or_else(|| {
        ApiError::CorruptMessage("produce request carries no record batch for the partition".into())
    })?;
    let ranges = batch::split_batches(records)?;
    for r in &ranges {
        let header = batch::validate(&records[r.clone()])?;
        if r.len() > route.config.max_message_bytes {
            return Err(ApiError::MessageTooLarge(format!(
                "the record batch is {} bytes, larger than max.message.bytes {}",
                r.len(),
                route.config.max_message_bytes
            )));
        }
        if header.is_control() {
            // Only the transaction coordinator writes markers.
            return Err(ApiError::InvalidRecord(
                "a client may not produce control batches".into(),
            ));
        }
        // Kafka's LogValidator: keys on compacted topics, timestamps
        // within the topic's bounds; the failing records are listed.
        let errors = tessera_log::validator::record_errors(
            &records[r.clone()],
            &route.config.record_rules(),
            topic,
            partition,
            now_ms(),
        )?;
        if !errors.is_empty() {
            return Err(ApiError::RecordErrors(errors));
        }
        if header.is_transactional() {
            // Kafka 3.x: only partitions added to the ongoing transaction.
            broker.txns().check_produce(
                header.producer_id,
                header.producer_epoch,
                topic,
                partition as i32,
            )?;
        }
    }
    if acks == -1 {
        broker.check_in_sync(route)?;
    }
    let log_append_time = route.config.log_append_time.then(now_ms);
    let mut first: Option<AppendedBatch> = None;
    for r in ranges {
        // A topic whose compression.type names a codec stores its batches in
        // it (Kafka's LogValidator recompresses; producer fields, offsets and
        // timestamps are kept, the CRC is new).
        let mut bytes = match route.config.compression_codec {
            Some(codec) => tessera_log::records::recompress(&records[r], codec)?,
            None => records[r].to_vec(),
        };
        let outcome = broker.append_batch(route, partition, &mut bytes, log_append_time)?;
        waits.add(route, &outcome);
        if !outcome.duplicate {
            Metrics::add(&broker.metrics().produced_batches, 1);
            Metrics::add(&broker.metrics().produced_bytes, bytes.len() as u64);
        }
        if first.is_none() {
            first = Some(AppendedBatch {
                range_id: route.range_id,
                base_offset: outcome.base_offset,
                log_append_time: log_append_time.unwrap_or(-1),
                log_start_offset: route
                    .log
                    .offsets(partition)
                    .map(|o| o.log_start)
                    .unwrap_or(0),
            });
        }
    }
    Ok(first.expect("at least one batch"))
}
