//! Kafka API dispatch: one handler module per API, and the table of what
//! this broker implements (which is exactly what ApiVersions advertises).

pub mod add_offsets_to_txn;
pub mod add_partitions_to_txn;
pub mod alter_client_quotas;
pub mod alter_configs;
pub mod alter_partition_reassignments;
pub mod alter_user_scram_credentials;
pub mod api_versions;
pub mod consumer_group_describe;
pub mod consumer_group_heartbeat;
pub mod create_acls;
pub mod create_partitions;
pub mod create_topics;
pub mod delete_acls;
pub mod delete_groups;
pub mod delete_records;
pub mod delete_topics;
pub mod describe_acls;
pub mod describe_client_quotas;
pub mod describe_cluster;
pub mod describe_configs;
pub mod describe_groups;
pub mod describe_log_dirs;
pub mod describe_producers;
pub mod describe_transactions;
pub mod describe_user_scram_credentials;
pub mod elect_leaders;
pub mod end_txn;
pub mod fetch;
pub mod find_coordinator;
pub mod heartbeat;
pub mod incremental_alter_configs;
pub mod init_producer_id;
pub mod join_group;
pub mod leave_group;
pub mod list_groups;
pub mod list_offsets;
pub mod list_partition_reassignments;
pub mod list_transactions;
pub mod metadata;
pub mod migrate_append;
pub mod offset_commit;
pub mod offset_delete;
pub mod offset_fetch;
pub mod offset_for_leader_epoch;
pub mod produce;
pub mod sasl_authenticate;
pub mod sasl_handshake;
pub mod sync_group;
pub mod txn_offset_commit;
pub mod unregister_broker;
pub mod write_txn_markers;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, RequestHeader};
use kafka_protocol::protocol::{Decodable, Encodable};

use crate::broker::Broker;
use crate::request_context::{Connection, RequestContext};
use crate::wire::try_encode_response;

/// What the connection does with a request's outcome.
pub enum Reply {
    /// A complete response frame, size prefix included.
    Frame(Bytes),
    /// A complete response frame in pieces written back to back: a Fetch
    /// response whose record batches are the buffers they were read into.
    Chunks(Vec<Bytes>),
    /// No response (Produce with acks=0).
    Nothing,
    /// Close the connection after the responses already queued (Kafka's
    /// answer to an unknown API, an unsupported version or a malformed body).
    Close(String),
}

/// `(api, min version, max version)` this broker serves.
pub const SUPPORTED_APIS: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 11),
    (ApiKey::Fetch, 4, 18),
    (ApiKey::ListOffsets, 1, 10),
    (ApiKey::OffsetForLeaderEpoch, 2, 4),
    (ApiKey::Metadata, 0, 13),
    (ApiKey::ApiVersions, 0, 4),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 6),
    (ApiKey::DescribeCluster, 0, 2),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::AlterConfigs, 0, 2),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::InitProducerId, 0, 5),
    (ApiKey::FindCoordinator, 0, 6),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::OffsetCommit, 2, 9),
    (ApiKey::OffsetFetch, 1, 9),
    (ApiKey::OffsetDelete, 0, 0),
    (ApiKey::DescribeGroups, 0, 6),
    (ApiKey::ListGroups, 0, 5),
    (ApiKey::DeleteGroups, 0, 2),
    (ApiKey::ConsumerGroupHeartbeat, 0, 1),
    (ApiKey::ConsumerGroupDescribe, 0, 1),
    (ApiKey::AddPartitionsToTxn, 0, 3),
    (ApiKey::AddOffsetsToTxn, 0, 3),
    (ApiKey::EndTxn, 0, 3),
    (ApiKey::TxnOffsetCommit, 0, 3),
    (ApiKey::DescribeProducers, 0, 0),
    (ApiKey::DescribeTransactions, 0, 0),
    (ApiKey::ListTransactions, 0, 1),
    (ApiKey::WriteTxnMarkers, 1, 1),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::DeleteRecords, 0, 2),
    (ApiKey::DescribeLogDirs, 1, 4),
    (ApiKey::ElectLeaders, 0, 2),
    (ApiKey::AlterPartitionReassignments, 0, 1),
    (ApiKey::ListPartitionReassignments, 0, 0),
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::SaslAuthenticate, 0, 2),
    (ApiKey::DescribeUserScramCredentials, 0, 0),
    (ApiKey::AlterUserScramCredentials, 0, 0),
    (ApiKey::CreateAcls, 1, 3),
    (ApiKey::DescribeAcls, 1, 3),
    (ApiKey::DeleteAcls, 1, 3),
    (ApiKey::DescribeClientQuotas, 0, 1),
    (ApiKey::AlterClientQuotas, 0, 1),
    (ApiKey::UnregisterBroker, 0, 0),
];

/// A config name on the wire: a fixed key without a copy, a stored one
/// (a listener override) moved.
pub fn config_name(name: std::borrow::Cow<'static, str>) -> kafka_protocol::protocol::StrBytes {
    match name {
        std::borrow::Cow::Borrowed(s) => kafka_protocol::protocol::StrBytes::from_static_str(s),
        std::borrow::Cow::Owned(s) => kafka_protocol::protocol::StrBytes::from_string(s),
    }
}

pub fn supported_range(api: ApiKey) -> Option<(i16, i16)> {
    SUPPORTED_APIS
        .iter()
        .find(|(k, _, _)| *k == api)
        .map(|(_, lo, hi)| (*lo, *hi))
}

/// A Fetch response whose record batches go out from the buffers they were
/// read into, without a copy into the frame (Kafka goes further and sends
/// them from the segment files with sendfile; not done here).
fn fetch_frame(
    version: i16,
    correlation_id: i32,
    response: &kafka_protocol::messages::FetchResponse,
) -> Reply {
    let records: Vec<Bytes> = response
        .responses
        .iter()
        .flat_map(|t| &t.partitions)
        .filter_map(|p| p.records.clone())
        .collect();
    match crate::wire::try_encode_response_sharing(
        ApiKey::Fetch,
        version,
        correlation_id,
        response,
        &records,
    ) {
        Ok(chunks) => Reply::Chunks(chunks),
        Err(e) => {
            tracing::error!(version, error = %e, "fetch response does not encode");
            Reply::Close(format!("response to Fetch v{version} does not encode: {e}"))
        }
    }
}

fn frame<R: Encodable>(api: ApiKey, version: i16, correlation_id: i32, body: &R) -> Reply {
    match try_encode_response(api, version, correlation_id, body) {
        Ok(bytes) => Reply::Frame(bytes),
        Err(e) => {
            tracing::error!(?api, version, error = %e, "response does not encode");
            Reply::Close(format!(
                "response to {api:?} v{version} does not encode: {e}"
            ))
        }
    }
}

fn decode<R: Decodable>(body: &mut Bytes, version: i16) -> Result<R, Reply> {
    R::decode(body, version).map_err(|e| Reply::Close(format!("malformed request body: {e}")))
}

/// The rest of a request's handling, run concurrently with later requests.
pub type InFlight = Pin<Box<dyn Future<Output = Reply> + Send>>;

fn ready(reply: Reply) -> InFlight {
    Box::pin(std::future::ready(reply))
}

/// Handles one request frame (without its size prefix) to completion, as
/// a request of `connection` (none: the broker's own, trusted).
pub async fn handle_frame(
    broker: &Arc<Broker>,
    frame: Bytes,
    connection: Option<Connection>,
) -> Reply {
    start_frame(broker, frame, connection).await.await
}

/// Starts one request frame of `connection`. The part that must follow
/// request order on a connection (decoding, a produce's appends, and the
/// whole of an offset commit, fetch or delete) runs before this returns;
/// the returned future does the rest (waiting for durability, long polls).
pub async fn start_frame(
    broker: &Arc<Broker>,
    mut frame: Bytes,
    connection: Option<Connection>,
) -> InFlight {
    if frame.len() < 8 {
        return ready(Reply::Close("request shorter than a request header".into()));
    }
    let api_key = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let correlation_id = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
    broker.metrics().count_request(api_key);
    if api_key == migrate_append::API_KEY {
        return migrate_append::start(broker, version, frame, connection).await;
    }
    let Ok(api) = ApiKey::try_from(api_key) else {
        broker.metrics().count_error(api_key);
        return ready(Reply::Close(format!("unknown API key {api_key}")));
    };
    let Some((min, max)) = supported_range(api) else {
        broker.metrics().count_error(api_key);
        return ready(Reply::Close(format!(
            "API {api:?} is not supported by this broker"
        )));
    };
    if api == ApiKey::ApiVersions && !(min..=max).contains(&version) {
        // KIP-511: answer in v0 with UNSUPPORTED_VERSION and our versions,
        // so the client can retry with one we support.
        return ready(Reply::Frame(api_versions::unsupported_version_response(
            correlation_id,
        )));
    }
    if !(min..=max).contains(&version) {
        broker.metrics().count_error(api_key);
        return ready(Reply::Close(format!(
            "unsupported version {version} of {api:?}"
        )));
    }
    let request_size = frame.len();
    let started = std::time::Instant::now();
    let header_version = api.request_header_version(version);
    let header = match RequestHeader::decode(&mut frame, header_version) {
        Ok(h) => h,
        Err(e) => return ready(Reply::Close(format!("malformed request header: {e}"))),
    };
    let ctx = RequestContext::new(header, connection);
    // request_percentage quotas: the handling time of every request.
    let identity = (!broker.image().client_quotas.is_empty())
        .then(|| (crate::quotas::identity(&ctx), ctx.throttle()));
    let in_flight = dispatch(broker, api, ctx, frame, request_size).await;
    match identity {
        None => in_flight,
        Some(((user, client), throttle)) => Box::pin(crate::quotas::time_request(
            broker.clone(),
            user,
            client,
            throttle,
            started.elapsed(),
            in_flight,
        )),
    }
}

async fn dispatch(
    broker: &Arc<Broker>,
    api: ApiKey,
    ctx: RequestContext,
    mut body: Bytes,
    request_size: usize,
) -> InFlight {
    let v = ctx.version();
    let id = ctx.header.correlation_id;
    let broker = broker.clone();
    // Runs the whole request before the connection reads the next one, as
    // Kafka runs every request of a connection: for offset commits and
    // fetches, whose order matters (two pipelined commits of one member
    // apply in the order sent, and a fetch after a commit sees it).
    macro_rules! in_order {
        ($module:ident) => {{
            let request = match decode(&mut body, v) {
                Ok(r) => r,
                Err(reply) => return ready(reply),
            };
            let response = $module::handle(&broker, &ctx, request).await;
            ready(frame(api, v, id, &response))
        }};
    }
    macro_rules! call {
        ($module:ident) => {{
            let request = match decode(&mut body, v) {
                Ok(r) => r,
                Err(reply) => return ready(reply),
            };
            Box::pin(async move {
                let response = $module::handle(&broker, &ctx, request).await;
                frame(api, v, id, &response)
            })
        }};
    }
    match api {
        ApiKey::Produce => {
            let request = match decode(&mut body, v) {
                Ok(r) => r,
                Err(reply) => return ready(reply),
            };
            // Kafka counts the whole request against producer_byte_rate,
            // acks=0 included (that connection is muted, unanswered).
            let throttle = crate::quotas::record_produce(&broker, &ctx, request_size);
            let appended = produce::append(&broker, &ctx, request).await;
            Box::pin(async move {
                match produce::acknowledge(&broker, appended).await {
                    Some(response) => frame(api, v, id, &response.with_throttle_time_ms(throttle)),
                    None => Reply::Nothing,
                }
            })
        }
        ApiKey::Fetch => {
            let request = match decode(&mut body, v) {
                Ok(r) => r,
                Err(reply) => return ready(reply),
            };
            Box::pin(async move {
                let response = crate::quotas::fetch_with_quota(&broker, &ctx, request, |r| {
                    fetch::handle(&broker, &ctx, r)
                })
                .await;
                fetch_frame(v, id, &response)
            })
        }
        ApiKey::ListOffsets => call!(list_offsets),
        ApiKey::OffsetForLeaderEpoch => call!(offset_for_leader_epoch),
        ApiKey::Metadata => call!(metadata),
        ApiKey::ApiVersions => call!(api_versions),
        ApiKey::CreateTopics => call!(create_topics),
        ApiKey::DeleteTopics => call!(delete_topics),
        ApiKey::DescribeCluster => call!(describe_cluster),
        ApiKey::DescribeConfigs => call!(describe_configs),
        ApiKey::AlterConfigs => call!(alter_configs),
        ApiKey::IncrementalAlterConfigs => call!(incremental_alter_configs),
        ApiKey::InitProducerId => call!(init_producer_id),
        ApiKey::FindCoordinator => call!(find_coordinator),
        ApiKey::JoinGroup => call!(join_group),
        ApiKey::SyncGroup => call!(sync_group),
        ApiKey::Heartbeat => call!(heartbeat),
        ApiKey::LeaveGroup => call!(leave_group),
        ApiKey::OffsetCommit => in_order!(offset_commit),
        ApiKey::OffsetFetch => in_order!(offset_fetch),
        ApiKey::OffsetDelete => in_order!(offset_delete),
        ApiKey::DescribeGroups => call!(describe_groups),
        ApiKey::ListGroups => call!(list_groups),
        ApiKey::DeleteGroups => call!(delete_groups),
        ApiKey::ConsumerGroupHeartbeat => call!(consumer_group_heartbeat),
        ApiKey::ConsumerGroupDescribe => call!(consumer_group_describe),
        ApiKey::AddPartitionsToTxn => call!(add_partitions_to_txn),
        ApiKey::AddOffsetsToTxn => call!(add_offsets_to_txn),
        ApiKey::EndTxn => call!(end_txn),
        ApiKey::TxnOffsetCommit => in_order!(txn_offset_commit),
        ApiKey::DescribeProducers => call!(describe_producers),
        ApiKey::DescribeTransactions => call!(describe_transactions),
        ApiKey::ListTransactions => call!(list_transactions),
        ApiKey::WriteTxnMarkers => call!(write_txn_markers),
        ApiKey::CreatePartitions => call!(create_partitions),
        ApiKey::DeleteRecords => call!(delete_records),
        ApiKey::DescribeLogDirs => call!(describe_log_dirs),
        ApiKey::ElectLeaders => call!(elect_leaders),
        ApiKey::AlterPartitionReassignments => call!(alter_partition_reassignments),
        ApiKey::ListPartitionReassignments => call!(list_partition_reassignments),
        ApiKey::SaslHandshake => call!(sasl_handshake),
        ApiKey::SaslAuthenticate => call!(sasl_authenticate),
        ApiKey::DescribeUserScramCredentials => call!(describe_user_scram_credentials),
        ApiKey::AlterUserScramCredentials => call!(alter_user_scram_credentials),
        ApiKey::CreateAcls => call!(create_acls),
        ApiKey::DescribeAcls => call!(describe_acls),
        ApiKey::DeleteAcls => call!(delete_acls),
        ApiKey::DescribeClientQuotas => call!(describe_client_quotas),
        ApiKey::AlterClientQuotas => call!(alter_client_quotas),
        ApiKey::UnregisterBroker => call!(unregister_broker),
        other => ready(Reply::Close(format!("API {other:?} has no handler"))),
    }
}
