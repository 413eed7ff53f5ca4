//! Client quotas over the wire against an in-process broker:
//! AlterClientQuotas / DescribeClientQuotas (v0-v1: validate_only, Kafka's
//! errors, the three match types and strict), then Produce and Fetch over
//! a byte-rate quota: throttle_time_ms as Kafka computes it, the throttled
//! fetch answered empty, the connection muted, and the broker's metrics.
//! Assertions are on what the broker reports, not on wall-clock rates.

use crate::common;

use std::path::Path;

use bytes::Bytes;
use kafka_protocol::messages::alter_client_quotas_request::{EntityData, EntryData, OpData};
use kafka_protocol::messages::describe_client_quotas_request::ComponentData;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    AlterClientQuotasRequest, AlterClientQuotasResponse, DescribeClientQuotasRequest,
    DescribeClientQuotasResponse, FetchRequest, ProduceRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use tessera_gateway::broker::NewTopic;
use tessera_gateway::Running;
use tessera_log::batch::testing::make_batch;

use common::WireClient;

const INVALID_REQUEST: i16 = 42;
const UNSUPPORTED_VERSION: i16 = 35;
/// The client id `WireClient` sends.
const CLIENT: &str = "wire-test";

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

async fn start(dir: &Path) -> Running {
    tessera_gateway::start(common::test_config(dir, &[]))
        .await
        .unwrap()
}

async fn create(running: &Running, name: &str) {
    running
        .broker
        .create_topic(
            NewTopic {
                name: name.into(),
                partitions: 1,
                replication_factor: 1,
                configs: Default::default(),
            },
            false,
        )
        .await
        .unwrap();
}

type Entity<'a> = &'a [(&'a str, Option<&'a str>)];

fn entry(entity: Entity, ops: &[(&str, Option<f64>)]) -> EntryData {
    EntryData::default()
        .with_entity(
            entity
                .iter()
                .map(|(t, n)| {
                    EntityData::default()
                        .with_entity_type(s(t))
                        .with_entity_name(n.map(s))
                })
                .collect(),
        )
        .with_ops(
            ops.iter()
                .map(|(k, v)| {
                    OpData::default()
                        .with_key(s(k))
                        .with_value(v.unwrap_or(0.0))
                        .with_remove(v.is_none())
                })
                .collect(),
        )
}

async fn alter(
    client: &mut WireClient,
    version: i16,
    entries: Vec<EntryData>,
    validate_only: bool,
) -> AlterClientQuotasResponse {
    client
        .call(
            version,
            &AlterClientQuotasRequest::default()
                .with_entries(entries)
                .with_validate_only(validate_only),
        )
        .await
}

async fn set(client: &mut WireClient, entity: Entity<'_>, key: &str, value: Option<f64>) {
    let r = alter(client, 1, vec![entry(entity, &[(key, value)])], false).await;
    assert_eq!(
        r.entries[0].error_code, 0,
        "{:?}",
        r.entries[0].error_message
    );
}

fn component(t: &str, match_type: i8, m: Option<&str>) -> ComponentData {
    ComponentData::default()
        .with_entity_type(s(t))
        .with_match_type(match_type)
        .with_match(m.map(s))
}

/// Describe: sorted (entity as "type=name|...", key, value).
async fn describe(
    client: &mut WireClient,
    version: i16,
    components: Vec<ComponentData>,
    strict: bool,
) -> Result<Vec<(String, String, f64)>, i16> {
    let r: DescribeClientQuotasResponse = client
        .call(
            version,
            &DescribeClientQuotasRequest::default()
                .with_components(components)
                .with_strict(strict),
        )
        .await;
    if r.error_code != 0 {
        assert!(r.entries.is_none());
        return Err(r.error_code);
    }
    let mut out = Vec::new();
    for e in r.entries.unwrap() {
        let name = e
            .entity
            .iter()
            .map(|d| {
                format!(
                    "{}={}",
                    d.entity_type.as_str(),
                    d.entity_name.as_deref().unwrap_or("<default>")
                )
            })
            .collect::<Vec<_>>()
            .join("|");
        for v in e.values {
            out.push((name.clone(), v.key.to_string(), v.value));
        }
    }
    out.sort_by(|a, b| a.partial_cmp(b).unwrap());
    Ok(out)
}

fn q(e: &str, k: &str, v: f64) -> (String, String, f64) {
    (e.to_string(), k.to_string(), v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alter_and_describe_client_quotas() {
    let dir = tempfile::tempdir().unwrap();
    let running = start(dir.path()).await;
    let mut client = WireClient::connect(running.kafka_addr).await;

    // validate_only: answered, nothing written.
    let offset = running.broker.image().offset;
    let r = alter(
        &mut client,
        0,
        vec![entry(
            &[("user", Some("alice"))],
            &[("producer_byte_rate", Some(1024.0))],
        )],
        true,
    )
    .await;
    assert_eq!(r.entries[0].error_code, 0);
    assert_eq!(running.broker.image().offset, offset);
    assert!(running.broker.image().client_quotas.is_empty());

    for v in 0..=1 {
        assert_eq!(describe(&mut client, v, vec![], false).await, Ok(vec![]));
    }
    set(
        &mut client,
        &[("user", Some("alice"))],
        "producer_byte_rate",
        Some(1024.0),
    )
    .await;
    set(
        &mut client,
        &[("user", Some("alice")), ("client-id", Some("app"))],
        "consumer_byte_rate",
        Some(2048.0),
    )
    .await;
    set(
        &mut client,
        &[("user", None)],
        "request_percentage",
        Some(12.5),
    )
    .await;
    set(
        &mut client,
        &[("client-id", None)],
        "producer_byte_rate",
        Some(100.0),
    )
    .await;
    set(
        &mut client,
        &[("client-id", Some("app"))],
        "controller_mutation_rate",
        Some(3.0),
    )
    .await;

    let all = vec![
        q("client-id=<default>", "producer_byte_rate", 100.0),
        q("client-id=app", "controller_mutation_rate", 3.0),
        q("user=<default>", "request_percentage", 12.5),
        q("user=alice", "producer_byte_rate", 1024.0),
        q("user=alice|client-id=app", "consumer_byte_rate", 2048.0),
    ];
    for v in 0..=1 {
        assert_eq!(
            describe(&mut client, v, vec![], false).await,
            Ok(all.clone())
        );
        // Nothing matches an empty filter strictly.
        assert_eq!(describe(&mut client, v, vec![], true).await, Ok(vec![]));
        // EXACT user alice: both of alice's entities; strict: /users/alice.
        assert_eq!(
            describe(
                &mut client,
                v,
                vec![component("user", 0, Some("alice"))],
                false
            )
            .await,
            Ok(vec![all[3].clone(), all[4].clone()])
        );
        assert_eq!(
            describe(
                &mut client,
                v,
                vec![component("user", 0, Some("alice"))],
                true
            )
            .await,
            Ok(vec![all[3].clone()])
        );
        // DEFAULT client id.
        assert_eq!(
            describe(&mut client, v, vec![component("client-id", 1, None)], false).await,
            Ok(vec![all[0].clone()])
        );
        // SPECIFIED client id, strict: client-id-only entities.
        assert_eq!(
            describe(&mut client, v, vec![component("client-id", 2, None)], true).await,
            Ok(vec![all[0].clone(), all[1].clone()])
        );
        // Errors are the whole request's.
        assert_eq!(
            describe(&mut client, v, vec![component("user", 0, None)], false).await,
            Err(INVALID_REQUEST)
        );
        assert_eq!(
            describe(
                &mut client,
                v,
                vec![component("user", 2, None), component("user", 1, None)],
                false
            )
            .await,
            Err(INVALID_REQUEST)
        );
        assert_eq!(
            describe(&mut client, v, vec![component("topic", 2, None)], false).await,
            Err(UNSUPPORTED_VERSION)
        );
    }

    // Kafka's per-entry errors; the good entry of the request applies.
    let r = alter(
        &mut client,
        1,
        vec![
            entry(&[], &[("producer_byte_rate", Some(1.0))]),
            entry(&[("user", Some("bob"))], &[("no_such_quota", Some(1.0))]),
            entry(
                &[("user", Some("bob"))],
                &[("producer_byte_rate", Some(1.5))],
            ),
            entry(&[("user", Some(""))], &[("producer_byte_rate", Some(1.0))]),
            entry(
                &[("group", Some("g"))],
                &[("producer_byte_rate", Some(1.0))],
            ),
            entry(
                &[("client-id", Some("c"))],
                &[("producer_byte_rate", Some(5.0))],
            ),
        ],
        false,
    )
    .await;
    let codes: Vec<i16> = r.entries.iter().map(|e| e.error_code).collect();
    assert_eq!(
        codes,
        vec![
            INVALID_REQUEST,
            INVALID_REQUEST,
            INVALID_REQUEST,
            INVALID_REQUEST,
            INVALID_REQUEST,
            0
        ]
    );
    assert_eq!(r.entries[5].entity[0].entity_name.as_deref(), Some("c"));

    // Removal; removing what is not set is fine and writes nothing.
    set(&mut client, &[("user", None)], "request_percentage", None).await;
    let offset = running.broker.image().offset;
    set(&mut client, &[("user", None)], "request_percentage", None).await;
    assert_eq!(running.broker.image().offset, offset);
    let now = describe(&mut client, 1, vec![component("user", 1, None)], false).await;
    assert_eq!(now, Ok(vec![]));

    // Quotas survive a restart (replayed from the metadata log).
    running.shutdown().await;
    let running = start(dir.path()).await;
    let mut client = WireClient::connect(running.kafka_addr).await;
    let after = describe(&mut client, 1, vec![], false).await.unwrap();
    assert_eq!(after.len(), 5);
    assert!(after.contains(&q("client-id=c", "producer_byte_rate", 5.0)));
    running.shutdown().await;
}

fn produce_request(topic: &str, records: i32) -> (ProduceRequest, usize) {
    let batch = make_batch(records, 1_000);
    let size = batch.len();
    let request = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(s(topic)))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(Bytes::from(batch)))])]);
    (request, size)
}

async fn produce(client: &mut WireClient, topic: &str, records: i32) -> (i16, i32, usize) {
    let (request, size) = produce_request(topic, records);
    let response = client.call(9, &request).await;
    (
        response.responses[0].partition_responses[0].error_code,
        response.throttle_time_ms,
        size,
    )
}

/// Sends `request` on the (muted) `client`, then runs one unthrottled
/// produce on a connection of another client id, and says whether the muted
/// connection had been answered by then. A mute of hundreds of ms or more
/// dwarfs one produce: an ordering check, not a clock.
async fn answered_before_a_later_request<R: kafka_protocol::protocol::Request>(
    running: &Running,
    client: &mut WireClient,
    request: &R,
    version: i16,
) -> (bool, R::Response) {
    let id = client.send(version, request).await;
    let mut other = WireClient::connect(running.kafka_addr)
        .await
        .with_client_id("another-client");
    let (code, throttle, _) = produce(&mut other, "t", 1).await;
    assert_eq!((code, throttle), (0, 0), "another client id throttled");
    let early = client.has_unread_now().await;
    (early, client.receive::<R>(version, id).await)
}

fn metric(running: &Running, name: &str, kind: &str) -> u64 {
    let text = running.broker.quotas().render();
    let prefix = format!("{name}{{kind=\"{kind}\",user=\"\",client_id=\"{CLIENT}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.parse().unwrap())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_over_quota_is_throttled() {
    let dir = tempfile::tempdir().unwrap();
    let running = start(dir.path()).await;
    create(&running, "t").await;
    let mut client = WireClient::connect(running.kafka_addr).await;
    // Unlimited: no throttle.
    let (code, throttle, _) = produce(&mut client, "t", 50).await;
    assert_eq!((code, throttle), (0, 0));

    const BOUND: f64 = 2000.0;
    set(
        &mut client,
        &[("client-id", Some(CLIENT))],
        "producer_byte_rate",
        Some(BOUND),
    )
    .await;
    // A fresh sensor measures over at least 10 windows of 1 s, so about
    // 20 KB pass before the first throttle.
    let mut sent = 0u64;
    let mut throttles = Vec::new();
    let mut first_throttled_at = None;
    for i in 0..80 {
        let (code, throttle, _) = produce(&mut client, "t", 50).await;
        assert_eq!(code, 0);
        let bytes = metric(&running, "tessera_quota_bytes_total", "produce");
        assert!(bytes > sent, "each request counts");
        let request_bytes = bytes - sent;
        sent = bytes;
        if throttle > 0 {
            first_throttled_at.get_or_insert((i, sent, throttle, request_bytes));
            throttles.push(throttle as u64);
        }
        if throttles.len() >= 3 {
            break;
        }
    }
    let (_, bytes_at_first, first, request_bytes) =
        first_throttled_at.expect("throttled within 80 requests");
    // Nothing throttled before the window's allowance was used up, and the
    // first throttle is Kafka's (rate - bound) / bound * window, the rate
    // over the (at least) 10 s window.
    assert!(bytes_at_first as f64 > BOUND * 10.0, "{bytes_at_first}");
    assert!(((bytes_at_first - request_bytes) as f64) <= BOUND * 11.0);
    let rate = bytes_at_first as f64 / 10.0;
    let expected = (rate - BOUND) / BOUND * 10_000.0;
    assert!(
        (first as f64) <= expected + 1.0 && first > 0,
        "throttle {first} ms, expected at most {expected:.0} (10 s window)"
    );
    // Rate implied by the broker's accounting stays near the bound: the
    // bytes fit in the windows plus the throttle time handed out.
    let throttled_s: f64 = throttles.iter().sum::<u64>() as f64 / 1000.0;
    assert!(
        sent as f64 / (11.0 + throttled_s) <= BOUND * 1.5,
        "{sent} B over {throttled_s} s"
    );
    // The connection is muted after a throttled response: the next request
    // on it is answered after one sent later on another connection.
    let last = *throttles.last().unwrap();
    let (request, _) = produce_request("t", 50);
    let (early, response) =
        answered_before_a_later_request(&running, &mut client, &request, 9).await;
    assert!(!early, "answered while muted for {last} ms");
    assert_eq!(response.responses[0].partition_responses[0].error_code, 0);
    let throttled = metric(&running, "tessera_quota_throttled_total", "produce");
    assert!(throttled >= 3);
    assert!(metric(&running, "tessera_quota_throttle_time_ms_total", "produce") >= last);
    // Another client id is not limited: the quota is the client id's, not
    // the broker's (and its requests count for nothing of the first's).
    let mut other = WireClient::connect(running.kafka_addr)
        .await
        .with_client_id("another-client");
    for _ in 0..30 {
        let (code, throttle, _) = produce(&mut other, "t", 50).await;
        assert_eq!((code, throttle), (0, 0), "another client id throttled");
    }
    assert_eq!(
        metric(&running, "tessera_quota_throttled_total", "produce"),
        throttled
    );
    running.shutdown().await;
}

fn fetch(offset: i64, max_bytes: i32) -> FetchRequest {
    let mut r = common::fetch_request("t", 0, offset).with_max_bytes(max_bytes);
    r.topics[0].partitions[0].partition_max_bytes = max_bytes;
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_over_quota_is_throttled_and_empty() {
    let dir = tempfile::tempdir().unwrap();
    let running = start(dir.path()).await;
    create(&running, "t").await;
    let mut client = WireClient::connect(running.kafka_addr).await;
    // ~60 KB of small batches.
    for _ in 0..120 {
        assert_eq!(produce(&mut client, "t", 50).await.0, 0);
    }
    const BOUND: f64 = 2000.0;
    set(
        &mut client,
        &[("client-id", Some(CLIENT))],
        "consumer_byte_rate",
        Some(BOUND),
    )
    .await;

    let mut offset = 0i64;
    let mut fetched = 0u64;
    let mut throttled = None;
    for _ in 0..20 {
        let r = client.call(12, &fetch(offset, 6000)).await;
        if r.throttle_time_ms > 0 {
            // Kafka answers a throttled fetch empty (the data comes later).
            assert!(r.responses.is_empty(), "throttled fetch carries no data");
            throttled = Some(r.throttle_time_ms);
            break;
        }
        let records = r.responses[0].partitions[0].records.clone().unwrap();
        assert!(!records.is_empty());
        let bases = common::batch_bases(&records);
        offset = *bases.last().unwrap() + 50;
        fetched += records.len() as u64;
    }
    let throttle = throttled.expect("throttled within 20 fetches");
    // Throttled only once the 10 s window's allowance (20 KB) was used up.
    assert!(fetched as f64 > BOUND * 10.0 - 7000.0, "{fetched}");
    assert!(metric(&running, "tessera_quota_throttled_total", "fetch") >= 1);
    // The throttled bytes were taken back: what is counted is what was sent.
    let counted = metric(&running, "tessera_quota_bytes_total", "fetch");
    assert!(
        counted >= fetched && counted < fetched + 20 * 200,
        "{counted} vs {fetched}"
    );
    // Muted: the next fetch is answered after a request sent later on
    // another connection.
    let (early, _) =
        answered_before_a_later_request(&running, &mut client, &fetch(offset, 6000), 12).await;
    assert!(!early, "answered while muted for {throttle} ms");
    // Then served again: the data resumes where it stopped.
    let mut resumed = false;
    for _ in 0..20 {
        let r = client.call(12, &fetch(offset, 6000)).await;
        if r.throttle_time_ms == 0 {
            let records = r.responses[0].partitions[0].records.clone().unwrap();
            assert_eq!(common::batch_bases(&records)[0], offset);
            resumed = true;
            break;
        }
    }
    assert!(resumed);

    // max_bytes is capped to one quota window's worth (bound * 10 s).
    set(
        &mut client,
        &[("client-id", Some(CLIENT))],
        "consumer_byte_rate",
        Some(100.0),
    )
    .await;
    let mut other = WireClient::connect(running.kafka_addr).await;
    let r = other.call(12, &fetch(offset, 1 << 20)).await;
    if r.throttle_time_ms == 0 {
        let records = r.responses[0].partitions[0].records.clone().unwrap();
        // The first batch is always returned; beyond it, at most 1000 B.
        assert!(records.len() <= 1000 + 600, "{}", records.len());
    }
    running.shutdown().await;
}

/// A user quota follows the connection's authenticated principal
/// (`User:alice` -> user `alice`) and outranks a client-id quota; a
/// plaintext connection (ANONYMOUS) with the same client id gets the
/// client-id quota. The sensor is the user's (tags user=alice, client "").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_quota_follows_the_principal() {
    let dir = tempfile::tempdir().unwrap();
    let jaas =
        "org.apache.kafka.common.security.plain.PlainLoginModule required user_alice=\"alice-pw\";";
    let config = common::sasl_plain_config(dir.path(), jaas, &[]);
    let running = tessera_gateway::start(config).await.unwrap();
    create(&running, "t").await;
    let mut plain = WireClient::connect(common::listener_addr(&running, "PLAINTEXT")).await;
    let mut alice = common::plain_login(
        common::listener_addr(&running, "SASL_PLAINTEXT"),
        "alice",
        "alice-pw",
    )
    .await;

    set(
        &mut plain,
        &[("user", Some("alice"))],
        "producer_byte_rate",
        Some(1000.0),
    )
    .await;
    set(
        &mut plain,
        &[("client-id", Some(CLIENT))],
        "producer_byte_rate",
        Some(1e9),
    )
    .await;

    let mut alice_throttled = false;
    for _ in 0..60 {
        let (code, throttle, _) = produce(&mut alice, "t", 50).await;
        assert_eq!(code, 0);
        if throttle > 0 {
            alice_throttled = true;
            break;
        }
    }
    assert!(alice_throttled, "alice's 1000 B/s quota throttles her");
    for _ in 0..30 {
        let (code, throttle, _) = produce(&mut plain, "t", 50).await;
        assert_eq!(
            (code, throttle),
            (0, 0),
            "ANONYMOUS gets the client-id quota"
        );
    }
    let text = running.broker.quotas().render();
    assert!(
        text.contains(
            "tessera_quota_throttled_total{kind=\"produce\",user=\"alice\",client_id=\"\"}"
        ),
        "{text}"
    );
    assert!(text.contains(&format!(
        "tessera_quota_throttled_total{{kind=\"produce\",user=\"\",client_id=\"{CLIENT}\"}} 0"
    )));
    running.shutdown().await;
}
