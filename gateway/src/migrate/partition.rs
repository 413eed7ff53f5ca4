//! One partition's I/O: its offsets on either side, raw fetches, the copy
//! loop (fetching from the source and writing through MigrateAppend,
//! pipelined) and the digest of an offset span for verification.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    BrokerId, FetchRequest, ListOffsetsRequest, ProduceRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use tokio::sync::mpsc;

use super::client::Conn;
use super::plan::{self, Digest, Span};
use super::progress::PartitionProgress;
use crate::error::MigrateError;

/// Kafka's ListOffsets timestamps.
const LATEST: i64 = -1;
const EARLIEST: i64 = -2;
/// A fetch below a known end waits at most this long for data (a broker
/// holding it answers at once).
pub const DATA_WAIT_MS: i32 = 500;
/// Empty answers in a row after which a fetch below a known end concludes
/// that the rest up to the end is a gap.
const EMPTY_FETCHES: u32 = 3;
/// Bytes asked per partition and per fetch.
const FETCH_BYTES: i32 = 8 << 20;

fn topic_name(topic: &str) -> TopicName {
    TopicName(StrBytes::from_string(topic.to_string()))
}

fn partition_error(topic: &str, partition: i32, reason: String) -> MigrateError {
    MigrateError::Partition {
        topic: topic.to_string(),
        partition,
        reason,
    }
}

/// One ListOffsets answer (read_uncommitted: the high watermark for LATEST).
pub async fn list_offset(
    conn: &mut Conn,
    topic: &str,
    partition: i32,
    timestamp: i64,
) -> Result<i64, MigrateError> {
    let request = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_isolation_level(0)
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(topic_name(topic))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(partition)
                .with_current_leader_epoch(-1)
                .with_timestamp(timestamp)])]);
    let response = conn.call(&request).await?;
    let p = response
        .topics
        .iter()
        .flat_map(|t| &t.partitions)
        .find(|p| p.partition_index == partition)
        .ok_or_else(|| MigrateError::Codec("ListOffsets answered no partition".into()))?;
    if p.error_code != 0 {
        return Err(conn.broker_error(
            &format!("ListOffsets {topic}-{partition}"),
            p.error_code,
            None,
        ));
    }
    Ok(p.offset)
}

/// `[log start, high watermark)` of a partition.
pub async fn span(conn: &mut Conn, topic: &str, partition: i32) -> Result<Span, MigrateError> {
    let start = list_offset(conn, topic, partition, EARLIEST).await?;
    let end = list_offset(conn, topic, partition, LATEST).await?;
    Ok(Span { start, end })
}

/// A raw fetch: the stored batches from `offset` (read_uncommitted: aborted
/// data and control batches come along) and the partition's high watermark.
pub async fn fetch(
    conn: &mut Conn,
    topic: &str,
    partition: i32,
    offset: i64,
    max_wait_ms: i32,
) -> Result<(Bytes, i64), MigrateError> {
    let request = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(4 * FETCH_BYTES)
        .with_isolation_level(0)
        .with_session_id(0)
        .with_session_epoch(-1)
        .with_topics(vec![FetchTopic::default()
            .with_topic(topic_name(topic))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(partition)
                .with_current_leader_epoch(-1)
                .with_fetch_offset(offset)
                .with_log_start_offset(-1)
                .with_partition_max_bytes(FETCH_BYTES)])]);
    let response = conn.call(&request).await?;
    if response.error_code != 0 {
        return Err(conn.broker_error("Fetch", response.error_code, None));
    }
    // Some brokers (tansu) answer a fetch that found nothing within
    // max_wait with no partition at all: nothing fetched.
    let Some(p) = response
        .responses
        .iter()
        .flat_map(|t| &t.partitions)
        .find(|p| p.partition_index == partition)
    else {
        return Ok((Bytes::new(), -1));
    };
    if p.error_code != 0 {
        return Err(conn.broker_error(
            &format!("Fetch {topic}-{partition} at {offset}"),
            p.error_code,
            None,
        ));
    }
    Ok((p.records.clone().unwrap_or_default(), p.high_watermark))
}

/// Writes whole batches at their own offsets on the target.
pub async fn migrate_append(
    conn: &mut Conn,
    topic: &str,
    partition: i32,
    records: Bytes,
) -> Result<(), MigrateError> {
    let request = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(topic_name(topic))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(partition)
                .with_records(Some(records))])]);
    let response = conn.migrate_append(&request).await?;
    for t in &response.responses {
        for p in &t.partition_responses {
            if p.error_code != 0 {
                return Err(conn.broker_error(
                    &format!("MigrateAppend {topic}-{partition}"),
                    p.error_code,
                    p.error_message.as_ref(),
                ));
            }
        }
    }
    Ok(())
}

/// Where a copy stops.
#[derive(Clone, Copy, Debug)]
pub enum Until {
    /// At this offset (a one-shot run: the source's end when it started).
    Offset(i64),
    /// Tailing the source until cutover; then up to its end at that time.
    Cutover,
}

/// Copies `topic`/`partition` from `next` on, fetching and appending
/// pipelined. Returns the offset it stopped at.
pub async fn copy(
    mut source: Conn,
    mut target: Conn,
    topic: &str,
    partition: i32,
    next: i64,
    until: Until,
    progress: Arc<PartitionProgress>,
) -> Result<i64, MigrateError> {
    let (tx, mut rx) = mpsc::channel::<(Bytes, i64, u64)>(4);
    progress.next.store(next, Ordering::Relaxed);
    let fetcher = async {
        let mut at = next;
        let mut end = match until {
            Until::Offset(end) => Some(end),
            Until::Cutover => None,
        };
        let mut empty = 0;
        loop {
            if end.is_none() && progress.cutover.load(Ordering::Relaxed) {
                end = Some(list_offset(&mut source, topic, partition, LATEST).await?);
            }
            if let Some(end) = end {
                if at >= end {
                    break;
                }
            }
            let wait = if end.is_some() { DATA_WAIT_MS } else { 200 };
            let (records, hw) = fetch(&mut source, topic, partition, at, wait).await?;
            progress.source_end.fetch_max(hw, Ordering::Relaxed);
            let batches = plan::source_batches(&records)
                .and_then(|b| plan::batches_from(b, at))
                .map_err(|e| partition_error(topic, partition, e))?;
            let bounded: Vec<_> = batches
                .into_iter()
                .filter(|b| end.is_none_or(|e| b.header.base_offset < e))
                .collect();
            let Some(last) = bounded.last() else {
                // Nothing to send: below a fixed end, batches past it (or
                // repeated empty answers) mean every batch up to it is
                // copied and the rest is a gap; tailing, the long poll
                // simply found nothing new.
                empty += 1;
                if end.is_some() && (!records.is_empty() || empty >= EMPTY_FETCHES) {
                    break;
                }
                continue;
            };
            empty = 0;
            let records_count = bounded
                .iter()
                .map(|b| b.header.record_count.max(0) as u64)
                .sum();
            at = last.header.last_offset() + 1;
            let chunk = chunk_of(&records, &bounded);
            if tx.send((chunk, at, records_count)).await.is_err() {
                break;
            }
        }
        drop(tx);
        Ok::<i64, MigrateError>(at)
    };
    let appender = async {
        let mut done = next;
        while let Some((chunk, next, records)) = rx.recv().await {
            let bytes = chunk.len() as u64;
            migrate_append(&mut target, topic, partition, chunk).await?;
            done = next;
            progress.next.store(next, Ordering::Relaxed);
            progress.records.fetch_add(records, Ordering::Relaxed);
            progress.bytes.fetch_add(bytes, Ordering::Relaxed);
        }
        Ok::<i64, MigrateError>(done)
    };
    let (fetched, appended) = tokio::join!(fetcher, appender);
    let appended = appended?;
    fetched?;
    Ok(appended)
}

/// The bytes to append for `batches`: a slice of the fetched bytes when
/// all were fetched as they are and lie back to back, else the v2 batches
/// (some up-converted) one after the other.
fn chunk_of(records: &Bytes, batches: &[plan::SourceBatch]) -> Bytes {
    let contiguous = batches
        .windows(2)
        .all(|w| matches!((&w[0].raw, &w[1].raw), (Some(a), Some(b)) if a.end == b.start));
    match (
        batches.first().and_then(|b| b.raw.clone()),
        batches.last().and_then(|b| b.raw.clone()),
    ) {
        (Some(first), Some(last)) if contiguous => records.slice(first.start..last.end),
        _ => {
            let mut out =
                bytes::BytesMut::with_capacity(batches.iter().map(|b| b.bytes.len()).sum());
            for b in batches {
                out.extend_from_slice(&b.bytes);
            }
            out.freeze()
        }
    }
}

/// Digest of the records of `topic`/`partition` over `span`, read from the
/// broker at `conn`.
pub async fn digest(
    conn: &mut Conn,
    topic: &str,
    partition: i32,
    span: Span,
) -> Result<Digest, MigrateError> {
    let mut digest = Digest::default();
    read_span(conn, topic, partition, span, |bytes| {
        digest.add_batch(bytes, span)
    })
    .await?;
    Ok(digest)
}

/// Every record of `topic`/`partition` over `span`, summarized for the
/// record-by-record comparison of a compacted partition.
pub async fn summaries(
    conn: &mut Conn,
    topic: &str,
    partition: i32,
    span: Span,
) -> Result<Vec<plan::RecordSummary>, MigrateError> {
    let mut out = Vec::new();
    read_span(conn, topic, partition, span, |bytes| {
        plan::summarize_batch(bytes, span, &mut out)
    })
    .await?;
    Ok(out)
}

/// Reads the batches of `span` in order, each handed to `on_batch`.
async fn read_span(
    conn: &mut Conn,
    topic: &str,
    partition: i32,
    span: Span,
    mut on_batch: impl FnMut(&[u8]) -> Result<(), String>,
) -> Result<(), MigrateError> {
    let mut at = span.start;
    let mut empty = 0;
    while at < span.end {
        let (records, _) = fetch(conn, topic, partition, at, DATA_WAIT_MS).await?;
        let batches =
            plan::source_batches(&records).map_err(|e| partition_error(topic, partition, e))?;
        if batches.is_empty() {
            empty += 1;
            if empty >= EMPTY_FETCHES {
                break;
            }
            continue;
        }
        empty = 0;
        for b in batches {
            let h = b.header;
            if h.base_offset >= span.end {
                at = span.end;
                break;
            }
            on_batch(&b.bytes).map_err(|e| {
                partition_error(
                    topic,
                    partition,
                    format!("the batch at offset {} does not decode: {e}", h.base_offset),
                )
            })?;
            at = h.last_offset() + 1;
        }
    }
    Ok(())
}
