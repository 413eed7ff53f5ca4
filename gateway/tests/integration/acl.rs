//! Authorization against an in-process broker with
//! `authorizer.class.name` set: SASL PLAIN users admin (a super user),
//! alice and bob on a SASL_PLAINTEXT listener, the PLAINTEXT listener the
//! inter-broker one (ANONYMOUS there, no super user). CreateAcls/DescribeAcls/DeleteAcls, and
//! allow/deny of each API checked as Kafka's KafkaApis checks it.

use crate::common;

use bytes::Bytes;
use common::{fetch_request, listener_addr as addr, topic_name, WireClient};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    CreateAclsRequest, CreateTopicsRequest, DeleteAclsRequest, DescribeAclsRequest,
    DescribeClusterRequest, DescribeGroupsRequest, FindCoordinatorRequest, GroupId,
    InitProducerIdRequest, JoinGroupRequest, ListOffsetsRequest, MetadataRequest,
    OffsetFetchRequest, ProduceRequest, TransactionalId,
};
use kafka_protocol::protocol::StrBytes;
use tessera_gateway::{BrokerConfig, Running};
use tessera_log::batch::testing::make_batch;

const JAAS: &str = "org.apache.kafka.common.security.plain.PlainLoginModule required \
     user_admin=\"admin-pw\" user_alice=\"alice-pw\" user_bob=\"bob-pw\";";

// Kafka's enum codes.
const TOPIC: i8 = 2;
const GROUP: i8 = 3;
const CLUSTER: i8 = 4;
const ANY: i8 = 1;
const LITERAL: i8 = 3;
const PREFIXED: i8 = 4;
const ALL: i8 = 2;
const READ: i8 = 3;
const WRITE: i8 = 4;
const DENY: i8 = 2;
const ALLOW: i8 = 3;

const TOPIC_DENIED: i16 = 29;
const GROUP_DENIED: i16 = 30;
const CLUSTER_DENIED: i16 = 31;
const TXN_ID_DENIED: i16 = 53;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn config(dir: &std::path::Path, authorizer: bool) -> BrokerConfig {
    let mut extra = vec![("auto.create.topics.enable", "true")];
    if authorizer {
        extra.push((
            "authorizer.class.name",
            "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        ));
        extra.push(("super.users", "User:admin;User:nobody"));
    }
    common::sasl_plain_config(dir, JAAS, &extra)
}

/// A connection authenticated as `user` (PLAIN, password `<user>-pw`).
async fn login(running: &Running, user: &str) -> WireClient {
    common::plain_login(addr(running, "SASL_PLAINTEXT"), user, &format!("{user}-pw")).await
}

/// A DeleteAcls filter matching every ACL of `resource_type` and `pattern`.
fn delete_filter(resource_type: i8, pattern: i8) -> DeleteAclsFilter {
    DeleteAclsFilter::default()
        .with_resource_name_filter(None)
        .with_principal_filter(None)
        .with_host_filter(None)
        .with_resource_type_filter(resource_type)
        .with_pattern_type_filter(pattern)
        .with_operation(ANY)
        .with_permission_type(ANY)
}

fn creation(
    resource_type: i8,
    name: &str,
    pattern: i8,
    principal: &str,
    operation: i8,
    permission: i8,
) -> AclCreation {
    AclCreation::default()
        .with_resource_type(resource_type)
        .with_resource_name(s(name))
        .with_resource_pattern_type(pattern)
        .with_principal(s(principal))
        .with_host(s("*"))
        .with_operation(operation)
        .with_permission_type(permission)
}

fn describe_all() -> DescribeAclsRequest {
    DescribeAclsRequest::default()
        .with_resource_name_filter(None)
        .with_principal_filter(None)
        .with_host_filter(None)
        .with_resource_type_filter(ANY)
        .with_pattern_type_filter(ANY)
        .with_operation(ANY)
        .with_permission_type(ANY)
}

async fn create_topic(c: &mut WireClient, name: &str) -> i16 {
    let r = c
        .call(
            7,
            &CreateTopicsRequest::default()
                .with_timeout_ms(30_000)
                .with_topics(vec![CreatableTopic::default()
                    .with_name(topic_name(name))
                    .with_num_partitions(1)
                    .with_replication_factor(1)]),
        )
        .await;
    r.topics[0].error_code
}

async fn produce(c: &mut WireClient, topic: &str) -> i16 {
    let request = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(topic_name(topic))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(Bytes::from(make_batch(2, 1_000))))])]);
    let r = c.call(9, &request).await;
    r.responses[0].partition_responses[0].error_code
}

async fn fetch(c: &mut WireClient, topic: &str) -> i16 {
    let r = c.call(12, &fetch_request(topic, 0, 0)).await;
    r.responses[0].partitions[0].error_code
}

async fn list_offsets(c: &mut WireClient, topic: &str) -> i16 {
    let r = c
        .call(
            7,
            &ListOffsetsRequest::default()
                .with_replica_id(kafka_protocol::messages::BrokerId(-1))
                .with_topics(vec![ListOffsetsTopic::default()
                    .with_name(topic_name(topic))
                    .with_partitions(vec![ListOffsetsPartition::default()
                        .with_partition_index(0)
                        .with_timestamp(-1)])]),
        )
        .await;
    r.topics[0].partitions[0].error_code
}

/// The visible topics of a Metadata of all topics.
async fn all_topics(c: &mut WireClient) -> Vec<String> {
    let r = c
        .call(12, &MetadataRequest::default().with_topics(None))
        .await;
    let mut names: Vec<String> = r
        .topics
        .iter()
        .filter_map(|t| t.name.as_ref().map(|n| n.to_string()))
        .filter(|n| !n.starts_with("__"))
        .collect();
    names.sort();
    names
}

/// A Metadata (v9) of named topics: each topic's error and authorized operations.
async fn metadata(c: &mut WireClient, topics: &[&str], auto_create: bool) -> Vec<(i16, i32)> {
    let r = c
        .call(
            9,
            &MetadataRequest::default()
                .with_allow_auto_topic_creation(auto_create)
                .with_include_topic_authorized_operations(true)
                .with_topics(Some(
                    topics
                        .iter()
                        .map(|t| MetadataRequestTopic::default().with_name(Some(topic_name(t))))
                        .collect(),
                )),
        )
        .await;
    r.topics
        .iter()
        .map(|t| (t.error_code, t.topic_authorized_operations))
        .collect()
}

async fn find_group_coordinator(c: &mut WireClient, group: &str) -> i16 {
    let r = c
        .call(3, &FindCoordinatorRequest::default().with_key(s(group)))
        .await;
    r.error_code
}

async fn init_producer_id(c: &mut WireClient, transactional_id: Option<&str>) -> i16 {
    let r = c
        .call(
            4,
            &InitProducerIdRequest::default()
                .with_transactional_id(transactional_id.map(|t| TransactionalId(s(t))))
                .with_transaction_timeout_ms(60_000)
                .with_producer_id(kafka_protocol::messages::ProducerId(-1))
                .with_producer_epoch(-1),
        )
        .await;
    r.error_code
}

async fn metric(running: &Running, name: &str) -> u64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(running.admin_addr)
        .await
        .unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).await.unwrap();
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acls_allow_and_deny_per_api() {
    let dir = tempfile::tempdir().unwrap();
    let running = tessera_gateway::start(config(dir.path(), true))
        .await
        .unwrap();
    let mut admin = login(&running, "admin").await;
    let mut alice = login(&running, "alice").await;
    let mut bob = login(&running, "bob").await;

    // No ACLs: nobody but the super user may do anything.
    assert_eq!(create_topic(&mut alice, "a-1").await, TOPIC_DENIED);
    assert_eq!(create_topic(&mut admin, "a-1").await, 0);
    assert_eq!(create_topic(&mut admin, "b-1").await, 0);
    assert_eq!(create_topic(&mut admin, "a-secret").await, 0);
    assert!(all_topics(&mut alice).await.is_empty());
    assert_eq!(all_topics(&mut admin).await, ["a-1", "a-secret", "b-1"]);
    // The inter-broker listener is no super user: its PLAINTEXT
    // connection is ANONYMOUS, which may see nothing.
    let mut internal = WireClient::connect(running.kafka_addr).await;
    assert!(all_topics(&mut internal).await.is_empty());

    // Only a super user (ALTER on the cluster) manages ACLs.
    let acls = CreateAclsRequest::default().with_creations(vec![
        creation(TOPIC, "a-", PREFIXED, "User:alice", ALL, ALLOW),
        creation(TOPIC, "a-secret", LITERAL, "User:alice", WRITE, DENY),
        creation(GROUP, "g", LITERAL, "User:alice", READ, ALLOW),
    ]);
    let r = alice.call(3, &acls).await;
    assert!(r.results.iter().all(|r| r.error_code == CLUSTER_DENIED));
    let r = alice.call(3, &describe_all()).await;
    assert_eq!(r.error_code, CLUSTER_DENIED);
    let r = admin.call(3, &acls).await;
    assert!(r.results.iter().all(|r| r.error_code == 0), "{r:?}");
    // Creating the same ACLs again changes nothing.
    let r = admin.call(1, &acls).await;
    assert!(r.results.iter().all(|r| r.error_code == 0));
    assert_eq!(running.broker.image().acls.len(), 3);
    // Bad creations: INVALID_REQUEST each, the good one in the same request applies.
    let r = admin
        .call(
            2,
            &CreateAclsRequest::default().with_creations(vec![
                creation(ANY, "x", LITERAL, "User:alice", READ, ALLOW),
                creation(TOPIC, "x", 2, "User:alice", READ, ALLOW),
                creation(TOPIC, "x", LITERAL, "alice", READ, ALLOW),
                creation(CLUSTER, "c", LITERAL, "User:alice", READ, ALLOW),
                creation(TOPIC, "x", LITERAL, "User:alice", 42, ALLOW),
                creation(CLUSTER, "kafka-cluster", LITERAL, "User:carol", 8, ALLOW),
            ]),
        )
        .await;
    let codes: Vec<i16> = r.results.iter().map(|r| r.error_code).collect();
    let invalid = ResponseError::InvalidRequest.code();
    assert_eq!(codes, [invalid, invalid, invalid, invalid, invalid, 0]);

    let r = admin.call(3, &describe_all()).await;
    assert_eq!(r.error_code, 0);
    let acl_count: usize = r.resources.iter().map(|r| r.acls.len()).sum();
    assert_eq!(acl_count, 4);
    // A MATCH filter: the ACLs that apply to topic a-secret.
    let r = admin
        .call(
            3,
            &describe_all()
                .with_resource_type_filter(TOPIC)
                .with_resource_name_filter(Some(s("a-secret")))
                .with_pattern_type_filter(2),
        )
        .await;
    let acl_count: usize = r.resources.iter().map(|r| r.acls.len()).sum();
    assert_eq!(acl_count, 2);
    // An UNKNOWN filter value: INVALID_REQUEST.
    let r = admin.call(3, &describe_all().with_operation(0)).await;
    assert_eq!(r.error_code, ResponseError::InvalidRequest.code());

    // Metadata: alice sees her prefix; a named topic she may not describe
    // is TOPIC_AUTHORIZATION_FAILED; auto-creation needs CREATE.
    assert_eq!(all_topics(&mut alice).await, ["a-1", "a-secret"]);
    assert!(all_topics(&mut bob).await.is_empty());
    let m = metadata(&mut alice, &["a-1", "b-1", "a-new", "b-new"], true).await;
    assert_eq!(m[0].0, 0);
    // ALL on the topic: every topic operation.
    assert_eq!(
        m[0].1,
        tessera_metadata::acl::all_operations(tessera_metadata::acl::ResourceType::Topic)
    );
    assert_eq!(m[1].0, TOPIC_DENIED);
    assert_eq!(m[2].0, 0, "alice may create a-new (ALL on a-*)");
    assert_eq!(m[3].0, TOPIC_DENIED);
    assert!(running.broker.image().topic_by_name("b-new").is_none());

    // Produce / Fetch / ListOffsets.
    assert_eq!(produce(&mut alice, "a-1").await, 0);
    assert_eq!(produce(&mut alice, "a-secret").await, TOPIC_DENIED);
    assert_eq!(produce(&mut alice, "b-1").await, TOPIC_DENIED);
    assert_eq!(produce(&mut bob, "a-1").await, TOPIC_DENIED);
    assert_eq!(produce(&mut admin, "b-1").await, 0);
    assert_eq!(fetch(&mut alice, "a-1").await, 0);
    assert_eq!(
        fetch(&mut alice, "a-secret").await,
        0,
        "only WRITE is denied"
    );
    assert_eq!(fetch(&mut alice, "b-1").await, TOPIC_DENIED);
    assert_eq!(fetch(&mut bob, "a-1").await, TOPIC_DENIED);
    assert_eq!(list_offsets(&mut alice, "a-1").await, 0);
    assert_eq!(list_offsets(&mut bob, "a-1").await, TOPIC_DENIED);

    // Groups: READ on g for alice.
    assert_eq!(find_group_coordinator(&mut alice, "g").await, 0);
    assert_eq!(find_group_coordinator(&mut bob, "g").await, GROUP_DENIED);
    assert_eq!(
        find_group_coordinator(&mut alice, "other").await,
        GROUP_DENIED
    );
    let join = JoinGroupRequest::default()
        .with_group_id(GroupId(s("g")))
        .with_session_timeout_ms(10_000)
        .with_rebalance_timeout_ms(10_000)
        .with_protocol_type(s("consumer"));
    let r = bob.call(5, &join).await;
    assert_eq!(r.error_code, GROUP_DENIED);
    let r = alice
        .call(
            5,
            &OffsetFetchRequest::default()
                .with_group_id(GroupId(s("g")))
                .with_topics(None),
        )
        .await;
    assert_eq!(r.error_code, 0);
    let r = bob
        .call(
            5,
            &OffsetFetchRequest::default()
                .with_group_id(GroupId(s("g")))
                .with_topics(None),
        )
        .await;
    assert_eq!(r.error_code, GROUP_DENIED);
    let r = alice
        .call(
            5,
            &DescribeGroupsRequest::default()
                .with_groups(vec![GroupId(s("g"))])
                .with_include_authorized_operations(true),
        )
        .await;
    assert_eq!(r.groups[0].error_code, 0);
    // READ implies DESCRIBE: bits READ and DESCRIBE.
    assert_eq!(r.groups[0].authorized_operations, (1 << 3) | (1 << 8));

    // Producer ids: idempotent needs IDEMPOTENT_WRITE or WRITE on some
    // topic; transactional ids need WRITE on the id.
    assert_eq!(init_producer_id(&mut alice, None).await, 0);
    assert_eq!(init_producer_id(&mut bob, None).await, CLUSTER_DENIED);
    assert_eq!(
        init_producer_id(&mut alice, Some("tx")).await,
        TXN_ID_DENIED
    );

    // DescribeCluster answers everyone; its authorized operations need
    // DESCRIBE on the cluster (carol's ACL is of no use to bob).
    let r = bob
        .call(
            0,
            &DescribeClusterRequest::default().with_include_cluster_authorized_operations(true),
        )
        .await;
    assert_eq!(r.error_code, 0);
    assert_eq!(r.cluster_authorized_operations, 0);
    let r = admin
        .call(
            0,
            &DescribeClusterRequest::default().with_include_cluster_authorized_operations(true),
        )
        .await;
    assert_eq!(r.error_code, 0);
    assert_eq!(
        r.cluster_authorized_operations,
        tessera_metadata::acl::all_operations(tessera_metadata::acl::ResourceType::Cluster)
    );

    assert!(metric(&running, "tessera_authorization_denied_total").await > 10);

    // DeleteAcls: alice's prefixed ACL goes; she can no longer produce.
    let r = admin
        .call(
            3,
            &DeleteAclsRequest::default()
                .with_filters(vec![delete_filter(TOPIC, PREFIXED), delete_filter(0, ANY)]),
        )
        .await;
    assert_eq!(r.filter_results[0].error_code, 0);
    assert_eq!(r.filter_results[0].matching_acls.len(), 1);
    assert_eq!(
        r.filter_results[0].matching_acls[0].resource_name.as_str(),
        "a-"
    );
    assert_eq!(
        r.filter_results[1].error_code,
        ResponseError::InvalidRequest.code()
    );
    let r = bob
        .call(
            3,
            &DeleteAclsRequest::default().with_filters(vec![delete_filter(ANY, ANY)]),
        )
        .await;
    assert_eq!(r.filter_results[0].error_code, CLUSTER_DENIED);
    assert_eq!(running.broker.image().acls.len(), 3);
    assert_eq!(produce(&mut alice, "a-1").await, TOPIC_DENIED);
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_authorizer_everything_is_allowed_and_acl_apis_are_disabled() {
    let dir = tempfile::tempdir().unwrap();
    let running = tessera_gateway::start(config(dir.path(), false))
        .await
        .unwrap();
    let mut bob = login(&running, "bob").await;
    assert_eq!(create_topic(&mut bob, "t").await, 0);
    assert_eq!(produce(&mut bob, "t").await, 0);
    assert_eq!(fetch(&mut bob, "t").await, 0);
    let r = bob
        .call(
            3,
            &CreateAclsRequest::default()
                .with_creations(vec![creation(TOPIC, "t", LITERAL, "User:bob", READ, ALLOW)]),
        )
        .await;
    assert_eq!(
        r.results[0].error_code,
        ResponseError::SecurityDisabled.code()
    );
    let r = bob.call(3, &describe_all()).await;
    assert_eq!(r.error_code, ResponseError::SecurityDisabled.code());
    let m = metadata(&mut bob, &["t"], false).await;
    assert_eq!(
        m[0].1,
        tessera_metadata::acl::all_operations(tessera_metadata::acl::ResourceType::Topic)
    );
    running.shutdown().await;
}

#[test]
fn authorizer_config() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path(), true);
    let a = c.authorizer.expect("on");
    assert_eq!(a.super_users, ["User:admin", "User:nobody"]);
    assert!(!a.allow_everyone_if_no_acl_found);
    assert!(config(dir.path(), false).authorizer.is_none());
    let with = |class: &str| {
        let mut map = std::collections::BTreeMap::new();
        map.insert("authorizer.class.name".to_string(), class.to_string());
        map.insert(
            "allow.everyone.if.no.acl.found".to_string(),
            "true".to_string(),
        );
        BrokerConfig::from_map(&map)
    };
    let a = with("kafka.security.authorizer.AclAuthorizer")
        .unwrap()
        .authorizer
        .unwrap();
    assert!(a.allow_everyone_if_no_acl_found);
    assert!(with("com.example.MyAuthorizer").is_err());
}

/// The admin, group and transaction APIs: alice holds ALL on topics `a-*`,
/// READ on group `g`, WRITE on transactional id `tx`; nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_group_and_transaction_apis() {
    use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
    use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
    use kafka_protocol::messages::delete_records_request::{
        DeleteRecordsPartition, DeleteRecordsTopic,
    };
    use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
    use kafka_protocol::messages::incremental_alter_configs_request::{
        AlterConfigsResource, AlterableConfig,
    };
    use kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    use kafka_protocol::messages::{
        AddPartitionsToTxnRequest, CreatePartitionsRequest, DeleteGroupsRequest,
        DeleteRecordsRequest, DeleteTopicsRequest, DescribeConfigsRequest, DescribeLogDirsRequest,
        EndTxnRequest, IncrementalAlterConfigsRequest, ListGroupsRequest, OffsetCommitRequest,
        ProducerId,
    };

    let dir = tempfile::tempdir().unwrap();
    let running = tessera_gateway::start(config(dir.path(), true))
        .await
        .unwrap();
    let mut admin = login(&running, "admin").await;
    let mut alice = login(&running, "alice").await;
    for t in ["a-1", "a-2", "b-1"] {
        assert_eq!(create_topic(&mut admin, t).await, 0);
    }
    let r = admin
        .call(
            3,
            &CreateAclsRequest::default().with_creations(vec![
                creation(TOPIC, "a-", PREFIXED, "User:alice", ALL, ALLOW),
                creation(GROUP, "g", LITERAL, "User:alice", READ, ALLOW),
                creation(5, "tx", LITERAL, "User:alice", WRITE, ALLOW),
            ]),
        )
        .await;
    assert!(r.results.iter().all(|r| r.error_code == 0));

    // CreatePartitions: ALTER on the topic.
    let grow = |t: &str| {
        CreatePartitionsTopic::default()
            .with_name(topic_name(t))
            .with_count(2)
            .with_assignments(None)
    };
    let r = alice
        .call(
            3,
            &CreatePartitionsRequest::default()
                .with_timeout_ms(30_000)
                .with_validate_only(true)
                .with_topics(vec![grow("a-1"), grow("b-1")]),
        )
        .await;
    let codes: Vec<i16> = r.results.iter().map(|r| r.error_code).collect();
    assert_eq!(codes, [0, TOPIC_DENIED]);

    // DescribeConfigs: DESCRIBE_CONFIGS on the topic, on the cluster for a broker.
    let resource = |t: i8, n: &str| {
        DescribeConfigsResource::default()
            .with_resource_type(t)
            .with_resource_name(s(n))
            .with_configuration_keys(None)
    };
    let r = alice
        .call(
            4,
            &DescribeConfigsRequest::default().with_resources(vec![
                resource(2, "a-1"),
                resource(2, "b-1"),
                resource(4, "1"),
            ]),
        )
        .await;
    let codes: Vec<i16> = r.results.iter().map(|r| r.error_code).collect();
    assert_eq!(codes, [0, TOPIC_DENIED, CLUSTER_DENIED]);
    assert!(!r.results[0].configs.is_empty());

    // IncrementalAlterConfigs: ALTER_CONFIGS likewise; the allowed one applies.
    let set = |t: i8, n: &str| {
        AlterConfigsResource::default()
            .with_resource_type(t)
            .with_resource_name(s(n))
            .with_configs(vec![AlterableConfig::default()
                .with_name(s("retention.ms"))
                .with_config_operation(0)
                .with_value(Some(s("3600000")))])
    };
    let r = alice
        .call(
            1,
            &IncrementalAlterConfigsRequest::default()
                .with_resources(vec![set(2, "b-1"), set(2, "a-1")]),
        )
        .await;
    let codes: Vec<i16> = r.responses.iter().map(|r| r.error_code).collect();
    assert_eq!(codes, [TOPIC_DENIED, 0]);
    let image = running.broker.image();
    assert_eq!(
        image
            .topic_by_name("a-1")
            .unwrap()
            .configs
            .get("retention.ms"),
        Some(&"3600000".to_string())
    );
    assert!(!image
        .topic_by_name("b-1")
        .unwrap()
        .configs
        .contains_key("retention.ms"));

    // DeleteRecords: DELETE on the topic.
    let r = alice
        .call(
            2,
            &DeleteRecordsRequest::default()
                .with_timeout_ms(30_000)
                .with_topics(vec![DeleteRecordsTopic::default()
                    .with_name(topic_name("b-1"))
                    .with_partitions(vec![DeleteRecordsPartition::default()
                        .with_partition_index(0)
                        .with_offset(0)])]),
        )
        .await;
    assert_eq!(r.topics[0].partitions[0].error_code, TOPIC_DENIED);

    // OffsetCommit: READ on the group, then per topic.
    let commit_topic = |t: &str| {
        OffsetCommitRequestTopic::default()
            .with_name(topic_name(t))
            .with_partitions(vec![OffsetCommitRequestPartition::default()
                .with_partition_index(0)
                .with_committed_offset(0)
                .with_committed_metadata(None)])
    };
    let commit = |group: &str| {
        OffsetCommitRequest::default()
            .with_group_id(GroupId(s(group)))
            .with_generation_id_or_member_epoch(-1)
            .with_member_id(s(""))
            .with_topics(vec![commit_topic("b-1"), commit_topic("a-1")])
    };
    assert_eq!(find_group_coordinator(&mut alice, "g").await, 0);
    // The coordinator may still be loading `__consumer_offsets`.
    let mut r = alice.call(8, &commit("g")).await;
    for _ in 0..100 {
        let code = r.topics[1].partitions[0].error_code;
        if code != ResponseError::CoordinatorNotAvailable.code()
            && code != ResponseError::CoordinatorLoadInProgress.code()
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        r = alice.call(8, &commit("g")).await;
    }
    let codes: Vec<(String, i16)> = r
        .topics
        .iter()
        .map(|t| (t.name.to_string(), t.partitions[0].error_code))
        .collect();
    assert_eq!(
        codes,
        [("b-1".to_string(), TOPIC_DENIED), ("a-1".to_string(), 0)]
    );
    let r = alice.call(8, &commit("h")).await;
    assert!(r
        .topics
        .iter()
        .all(|t| t.partitions[0].error_code == GROUP_DENIED));

    // ListGroups: only the groups alice may describe; DeleteGroups: DELETE.
    let r = alice.call(4, &ListGroupsRequest::default()).await;
    assert_eq!(r.error_code, 0);
    assert!(r.groups.iter().all(|g| g.group_id.as_str() == "g"));
    let r = admin.call(4, &ListGroupsRequest::default()).await;
    assert!(r.groups.iter().any(|g| g.group_id.as_str() == "g"));
    let r = alice
        .call(
            2,
            &DeleteGroupsRequest::default().with_groups_names(vec![GroupId(s("g"))]),
        )
        .await;
    assert_eq!(r.results[0].error_code, GROUP_DENIED);

    // Transactions: WRITE on the transactional id, then on the topics.
    assert_eq!(find_txn_coordinator(&mut alice, "tx").await, 0);
    // The coordinator may still be loading `__transaction_state`.
    let mut code = init_producer_id(&mut alice, Some("tx")).await;
    for _ in 0..100 {
        if code != ResponseError::CoordinatorNotAvailable.code()
            && code != ResponseError::CoordinatorLoadInProgress.code()
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        code = init_producer_id(&mut alice, Some("tx")).await;
    }
    assert_eq!(code, 0);
    let add = |id: &str| {
        AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(TransactionalId(s(id)))
            .with_v3_and_below_producer_id(ProducerId(0))
            .with_v3_and_below_producer_epoch(0)
            .with_v3_and_below_topics(vec![
                AddPartitionsToTxnTopic::default()
                    .with_name(topic_name("b-1"))
                    .with_partitions(vec![0]),
                AddPartitionsToTxnTopic::default()
                    .with_name(topic_name("a-1"))
                    .with_partitions(vec![0]),
            ])
    };
    let r = alice.call(3, &add("tx")).await;
    let codes: Vec<i16> = r
        .results_by_topic_v3_and_below
        .iter()
        .map(|t| t.results_by_partition[0].partition_error_code)
        .collect();
    assert_eq!(
        codes,
        [TOPIC_DENIED, ResponseError::OperationNotAttempted.code()]
    );
    let r = alice.call(3, &add("other")).await;
    assert!(r
        .results_by_topic_v3_and_below
        .iter()
        .all(|t| t.results_by_partition[0].partition_error_code == TXN_ID_DENIED));
    let r = alice
        .call(
            3,
            &EndTxnRequest::default()
                .with_transactional_id(TransactionalId(s("other")))
                .with_producer_id(ProducerId(0))
                .with_producer_epoch(0),
        )
        .await;
    assert_eq!(r.error_code, TXN_ID_DENIED);
    assert_eq!(find_txn_coordinator(&mut alice, "tx").await, 0);
    assert_eq!(
        find_txn_coordinator(&mut alice, "other").await,
        TXN_ID_DENIED
    );

    // Cluster-wide admin APIs.
    let r = alice
        .call(4, &DescribeLogDirsRequest::default().with_topics(None))
        .await;
    assert_eq!(r.error_code, CLUSTER_DENIED);
    let r = admin
        .call(4, &DescribeLogDirsRequest::default().with_topics(None))
        .await;
    assert_eq!(r.error_code, 0);

    // DeleteTopics: DELETE on the topic.
    let r = alice
        .call(
            5,
            &DeleteTopicsRequest::default()
                .with_timeout_ms(30_000)
                .with_topic_names(vec![topic_name("b-1"), topic_name("a-2")]),
        )
        .await;
    let codes: Vec<i16> = r.responses.iter().map(|r| r.error_code).collect();
    assert_eq!(codes, [TOPIC_DENIED, 0]);
    assert!(running.broker.image().topic_by_name("a-2").is_none());
    assert!(running.broker.image().topic_by_name("b-1").is_some());

    // UnregisterBroker: ALTER on the cluster; then an unknown id is
    // BROKER_ID_NOT_REGISTERED and this node (the controller, a voter)
    // INVALID_REQUEST.
    use kafka_protocol::messages::{BrokerId, UnregisterBrokerRequest};
    let unregister = |id: i32| UnregisterBrokerRequest::default().with_broker_id(BrokerId(id));
    let me = running.broker.config().node_id;
    assert_eq!(alice.call(0, &unregister(99)).await.error_code, 31);
    assert_eq!(admin.call(0, &unregister(99)).await.error_code, 102);
    let r = admin.call(0, &unregister(me)).await;
    assert_eq!(r.error_code, 42, "{r:?}");
    assert!(running.broker.image().brokers.contains_key(&me));
    running.shutdown().await;
}

async fn find_txn_coordinator(c: &mut WireClient, id: &str) -> i16 {
    let r = c
        .call(
            3,
            &FindCoordinatorRequest::default()
                .with_key(s(id))
                .with_key_type(1),
        )
        .await;
    r.error_code
}

/// `allow.everyone.if.no.acl.found=true`: a resource without any ACL is
/// open to everyone, one with ACLs only to whom they allow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_everyone_if_no_acl_found() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path(), true);
    config
        .authorizer
        .as_mut()
        .unwrap()
        .allow_everyone_if_no_acl_found = true;
    let running = tessera_gateway::start(config).await.unwrap();
    let mut admin = login(&running, "admin").await;
    let mut bob = login(&running, "bob").await;
    assert_eq!(create_topic(&mut bob, "open").await, 0);
    assert_eq!(produce(&mut bob, "open").await, 0);
    let r = admin
        .call(
            3,
            &CreateAclsRequest::default().with_creations(vec![creation(
                TOPIC,
                "open",
                LITERAL,
                "User:alice",
                READ,
                ALLOW,
            )]),
        )
        .await;
    assert_eq!(r.results[0].error_code, 0);
    // Now the topic has an ACL, and none for bob.
    assert_eq!(produce(&mut bob, "open").await, TOPIC_DENIED);
    assert_eq!(fetch(&mut bob, "open").await, TOPIC_DENIED);
    running.shutdown().await;
}

/// Many clients at once through authentication, the authorizer and the
/// connection limits: 60 SASL connections (alice allowed, bob denied)
/// produce concurrently while 40 slow connections trickle frames that never
/// finish. Every allowed produce lands (the high watermark counts them
/// all), every denied one is TOPIC_AUTHORIZATION_FAILED, the slow ones are
/// closed by `connections.max.idle.ms`, and nothing else is disturbed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_clients_authenticate_and_are_authorized_concurrently() {
    use tokio::io::AsyncWriteExt;
    const CLIENTS: usize = 60;
    const BATCHES: usize = 10;
    const TOPICS: usize = 3;
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path(), true);
    config.connections_max_idle_ms = 2_000;
    let running = std::sync::Arc::new(tessera_gateway::start(config).await.unwrap());
    let mut admin = login(&running, "admin").await;
    for t in 0..TOPICS {
        assert_eq!(create_topic(&mut admin, &format!("s-{t}")).await, 0);
    }
    let acls = CreateAclsRequest::default().with_creations(vec![creation(
        TOPIC,
        "s-",
        PREFIXED,
        "User:alice",
        WRITE,
        ALLOW,
    )]);
    let r = admin.call(3, &acls).await;
    assert!(r.results.iter().all(|r| r.error_code == 0));

    let sasl = addr(&running, "SASL_PLAINTEXT");
    let slow: Vec<_> = (0..40)
        .map(|_| {
            tokio::spawn(async move {
                let mut s = tokio::net::TcpStream::connect(sasl).await.unwrap();
                s.write_all(&(4_000i32).to_be_bytes()).await.unwrap();
                for _ in 0..100 {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    if s.write_all(&[0]).await.is_err() {
                        return true;
                    }
                }
                false
            })
        })
        .collect();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let running = running.clone();
            tokio::spawn(async move {
                let user = if i % 3 == 0 { "bob" } else { "alice" };
                let mut c = login(&running, user).await;
                let mut codes = Vec::new();
                for b in 0..BATCHES {
                    codes.push(produce(&mut c, &format!("s-{}", (i + b) % TOPICS)).await);
                }
                (user, codes)
            })
        })
        .collect();
    let mut allowed = 0;
    for c in clients {
        let (user, codes) = c.await.unwrap();
        let expected = if user == "alice" { 0 } else { TOPIC_DENIED };
        assert!(codes.iter().all(|c| *c == expected), "{user}: {codes:?}");
        if user == "alice" {
            allowed += codes.len();
        }
    }
    for s in slow {
        assert!(s.await.unwrap(), "a slow connection was closed");
    }
    // Each allowed produce appended one 2-record batch.
    let mut records = 0;
    let mut admin = login(&running, "admin").await;
    for t in 0..TOPICS {
        let r = admin
            .call(
                7,
                &ListOffsetsRequest::default()
                    .with_replica_id(kafka_protocol::messages::BrokerId(-1))
                    .with_topics(vec![ListOffsetsTopic::default()
                        .with_name(topic_name(&format!("s-{t}")))
                        .with_partitions(vec![ListOffsetsPartition::default()
                            .with_partition_index(0)
                            .with_timestamp(-1)])]),
            )
            .await;
        records += r.topics[0].partitions[0].offset;
    }
    assert_eq!(records as usize, 2 * allowed);
    assert!(metric(&running, "tessera_connections_idle_closed_total").await >= 40);
    assert_eq!(
        metric(&running, "tessera_authorization_denied_total").await as usize,
        CLIENTS / 3 * BATCHES
    );
}
