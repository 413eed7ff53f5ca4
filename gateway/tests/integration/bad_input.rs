//! Bad input on the Kafka listener, over raw sockets.
//!
//! Every test starts an in-process broker on free ports, stores some records
//! on a good connection, throws one kind of bad input at it and then checks
//! three things: the broker answered the way Apache Kafka does, a fresh
//! client is still served, and the stored data is byte for byte what it was
//! (same batches, same offsets, same high watermark).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Mutex, Once};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use indexmap::IndexMap;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, BrokerId, CreateTopicsRequest, FetchRequest,
    FetchResponse, MetadataRequest, MetadataResponse, ProduceRequest, ProduceResponse,
    RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use kafka_protocol::records::{Compression, Record, RecordBatchDecoder, TimestampType};
use tempfile::TempDir;
use tessera_gateway::{BrokerConfig, Running};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TOPIC: &str = "data";
const PARTITIONS: i32 = 2;
const BATCHES_PER_PARTITION: i64 = 3;
const RECORDS_PER_BATCH: i64 = 5;
const IO_TIMEOUT: Duration = Duration::from_secs(10);

const PRODUCE_V: i16 = 9;
const FETCH_V: i16 = 12;
const METADATA_V: i16 = 12;
const API_VERSIONS_V: i16 = 3;
const CREATE_TOPICS_V: i16 = 7;

// Kafka error codes.
const NONE: i16 = 0;
const OFFSET_OUT_OF_RANGE: i16 = 1;
const CORRUPT_MESSAGE: i16 = 2;
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const MESSAGE_TOO_LARGE: i16 = 10;
const UNSUPPORTED_VERSION: i16 = 35;

// ---------------------------------------------------------------------------
// Broker-task panics: a handler that panics is answered by a closed
// connection, which looks like Kafka's answer to bad input; count them.
// ---------------------------------------------------------------------------

static BROKER_PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn watch_for_broker_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current();
            // Test bodies run on the test's own thread; broker tasks on the
            // runtime's workers.
            if thread
                .name()
                .is_some_and(|n| n.starts_with("tokio-runtime"))
            {
                BROKER_PANICS.lock().unwrap().push(info.to_string());
            }
            default(info);
        }));
    });
}

fn assert_no_broker_panics() {
    let panics = BROKER_PANICS.lock().unwrap();
    assert!(panics.is_empty(), "broker tasks panicked: {panics:#?}");
}

// ---------------------------------------------------------------------------
// Wire helpers.
// ---------------------------------------------------------------------------

/// A whole request frame, size prefix included.
fn request_frame<R: Request>(version: i16, correlation_id: i32, body: &R) -> Vec<u8> {
    let header = RequestHeader::default()
        .with_request_api_key(R::KEY)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_static_str("bad-input-test")));
    let mut buf = BytesMut::new();
    buf.put_i32(0);
    header
        .encode(&mut buf, R::header_version(version))
        .expect("header encodes");
    body.encode(&mut buf, version).expect("body encodes");
    let len = (buf.len() - 4) as i32;
    buf[0..4].copy_from_slice(&len.to_be_bytes());
    buf.to_vec()
}

/// A frame with a v1 request header (api key, version, correlation id,
/// client id) and the given body bytes, for keys and versions no codec knows.
fn raw_frame(api_key: i16, version: i16, correlation_id: i32, body: &[u8]) -> Vec<u8> {
    let client_id = b"bad-input-test";
    let mut buf = Vec::new();
    let len = 2 + 2 + 4 + 2 + client_id.len() + body.len();
    buf.extend_from_slice(&(len as i32).to_be_bytes());
    buf.extend_from_slice(&api_key.to_be_bytes());
    buf.extend_from_slice(&version.to_be_bytes());
    buf.extend_from_slice(&correlation_id.to_be_bytes());
    buf.extend_from_slice(&(client_id.len() as i16).to_be_bytes());
    buf.extend_from_slice(client_id);
    buf.extend_from_slice(body);
    buf
}

/// Reads one response frame; `None` when the broker closed the connection
/// (end of stream or reset) at a frame boundary.
async fn read_frame(stream: &mut TcpStream) -> Option<Bytes> {
    let mut size = [0u8; 4];
    match tokio::time::timeout(IO_TIMEOUT, stream.read_exact(&mut size))
        .await
        .expect("timed out waiting for a response")
    {
        Ok(_) => {}
        Err(e) if is_closed(&e) => return None,
        Err(e) => panic!("reading a response size: {e}"),
    }
    let size = i32::from_be_bytes(size);
    assert!(
        (0..64 << 20).contains(&size),
        "response size {size} is not sane"
    );
    let mut buf = vec![0u8; size as usize];
    tokio::time::timeout(IO_TIMEOUT, stream.read_exact(&mut buf))
        .await
        .expect("timed out reading a response body")
        .expect("the broker closed the connection in the middle of a response");
    Some(Bytes::from(buf))
}

fn is_closed(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe
    )
}

/// Asserts that the broker closes the connection (without sending anything
/// more) within a few seconds.
async fn expect_closed(stream: &mut TcpStream, what: &str) {
    let mut buf = [0u8; 256];
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await;
    match read {
        Err(_) => panic!("{what}: the broker kept the connection open"),
        Ok(Ok(0)) => {}
        Ok(Ok(n)) => panic!(
            "{what}: expected the connection to be closed, got {n} bytes: {:?}",
            &buf[..n]
        ),
        Ok(Err(e)) if is_closed(&e) => {}
        Ok(Err(e)) => panic!("{what}: unexpected read error {e}"),
    }
}

fn decode_response<R: Request>(version: i16, mut frame: Bytes) -> (i32, R::Response) {
    let header = ResponseHeader::decode(
        &mut frame,
        <R::Response as HeaderVersion>::header_version(version),
    )
    .expect("response header decodes");
    let body = R::Response::decode(&mut frame, version).expect("response body decodes");
    assert!(
        frame.is_empty(),
        "{} bytes left after the response body",
        frame.len()
    );
    (header.correlation_id, body)
}

/// One client connection with request/response helpers.
struct Client {
    stream: TcpStream,
    next_id: i32,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Client {
        let stream = tokio::time::timeout(IO_TIMEOUT, TcpStream::connect(addr))
            .await
            .expect("connect timed out")
            .expect("connect");
        stream.set_nodelay(true).unwrap();
        Client { stream, next_id: 1 }
    }

    async fn call<R: Request>(&mut self, version: i16, body: &R) -> R::Response {
        let id = self.next_id;
        self.next_id += 1;
        self.stream
            .write_all(&request_frame(version, id, body))
            .await
            .expect("write request");
        let frame = read_frame(&mut self.stream).await.unwrap_or_else(|| {
            panic!(
                "the broker closed the connection instead of answering api {}",
                R::KEY
            )
        });
        let (correlation_id, response) = decode_response::<R>(version, frame);
        assert_eq!(correlation_id, id, "correlation id of the response");
        response
    }

    async fn api_versions(&mut self) -> ApiVersionsResponse {
        let response = self
            .call(
                API_VERSIONS_V,
                &ApiVersionsRequest::default()
                    .with_client_software_name(StrBytes::from_static_str("bad-input"))
                    .with_client_software_version(StrBytes::from_static_str("1")),
            )
            .await;
        assert_eq!(response.error_code, NONE);
        assert!(
            response
                .api_keys
                .iter()
                .any(|k| k.api_key == ApiKey::Produce as i16),
            "ApiVersions lists Produce"
        );
        response
    }

    async fn metadata(&mut self, topics: Option<&[&str]>) -> MetadataResponse {
        let topics = topics.map(|names| {
            names
                .iter()
                .map(|n| MetadataRequestTopic::default().with_name(Some(topic_name(n))))
                .collect()
        });
        self.call(
            METADATA_V,
            &MetadataRequest::default()
                .with_topics(topics)
                .with_allow_auto_topic_creation(false),
        )
        .await
    }

    async fn create_topic(&mut self, name: &str, partitions: i32, configs: &[(&str, &str)]) {
        let topic = CreatableTopic::default()
            .with_name(topic_name(name))
            .with_num_partitions(partitions)
            .with_replication_factor(1)
            .with_configs(
                configs
                    .iter()
                    .map(|(k, v)| {
                        CreatableTopicConfig::default()
                            .with_name(StrBytes::from_string(k.to_string()))
                            .with_value(Some(StrBytes::from_string(v.to_string())))
                    })
                    .collect(),
            );
        let response = self
            .call(
                CREATE_TOPICS_V,
                &CreateTopicsRequest::default()
                    .with_topics(vec![topic])
                    .with_timeout_ms(30_000),
            )
            .await;
        let result = &response.topics[0];
        assert_eq!(
            result.error_code, NONE,
            "create topic {name}: {:?}",
            result.error_message
        );
    }

    /// Produces raw record-batch bytes to one partition; returns
    /// `(error code, base offset)`.
    async fn produce_raw(&mut self, topic: &str, partition: i32, records: Bytes) -> (i16, i64) {
        let request = ProduceRequest::default()
            .with_acks(-1)
            .with_timeout_ms(30_000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(topic_name(topic))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(partition)
                    .with_records(Some(records))])]);
        let response: ProduceResponse = self.call(PRODUCE_V, &request).await;
        assert_eq!(response.responses.len(), 1);
        let t = &response.responses[0];
        assert_eq!(t.name.0.as_str(), topic);
        assert_eq!(t.partition_responses.len(), 1);
        let p = &t.partition_responses[0];
        assert_eq!(p.index, partition);
        (p.error_code, p.base_offset)
    }

    /// One fetch of one partition: `(error, high watermark, log start, records)`.
    async fn fetch_once(
        &mut self,
        topic: &str,
        partition: i32,
        offset: i64,
    ) -> (i16, i64, i64, Bytes) {
        let request = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(0)
            .with_min_bytes(0)
            .with_max_bytes(16 << 20)
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
                    .with_partition_max_bytes(8 << 20)])]);
        let response: FetchResponse = self.call(FETCH_V, &request).await;
        assert_eq!(response.error_code, NONE, "fetch top-level error");
        assert_eq!(response.responses.len(), 1);
        let t = &response.responses[0];
        assert_eq!(t.partitions.len(), 1);
        let p = &t.partitions[0];
        assert_eq!(p.partition_index, partition);
        (
            p.error_code,
            p.high_watermark,
            p.log_start_offset,
            p.records.clone().unwrap_or_default(),
        )
    }
}

fn topic_name(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_string()))
}

// ---------------------------------------------------------------------------
// Records.
// ---------------------------------------------------------------------------

fn record(offset: i64, timestamp: i64, key: String, value: Vec<u8>) -> Record {
    let mut headers = IndexMap::new();
    headers.insert(
        StrBytes::from_string(format!("h{offset}")),
        Some(Bytes::from(format!("v{offset}"))),
    );
    Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: -1,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset,
        sequence: -1,
        timestamp,
        key: Some(Bytes::from(key)),
        value: Some(Bytes::from(value)),
        headers,
    }
}

fn encode_batch(records: &[Record]) -> Bytes {
    tessera_log::records::encode_v2(records, Compression::None)
        .expect("record batch encodes")
        .freeze()
}

/// The batch the fixture produces as the `batch`-th one to `partition`.
fn fixture_batch(partition: i32, batch: i64) -> Vec<Record> {
    (0..RECORDS_PER_BATCH)
        .map(|i| {
            let n = batch * RECORDS_PER_BATCH + i;
            record(
                i,
                1_700_000_000_000 + n * 1000 + partition as i64,
                format!("key-{partition}-{n}"),
                format!("value of record {n} on partition {partition}").into_bytes(),
            )
        })
        .collect()
}

/// Offsets 61.. of a v2 batch are its records: outside the header, inside the CRC.
const BATCH_HEADER_LEN: usize = 61;

// ---------------------------------------------------------------------------
// The fixture: a broker holding known data.
// ---------------------------------------------------------------------------

/// Everything a fetch from offset 0 returns for one partition.
#[derive(Debug, PartialEq, Eq)]
struct PartitionState {
    high_watermark: i64,
    log_start: i64,
    /// The stored batches exactly as fetched.
    raw: Vec<u8>,
    /// `(offset, key, value, timestamp)` of every record.
    records: Vec<(i64, Bytes, Bytes, i64)>,
}

/// Where the broker under test runs.
enum Backend {
    /// `tessera_gateway::start` in this test process.
    InProcess(Running),
    /// The `tessera` binary as a child process: for inputs that might take
    /// the whole process down (an abort would kill the test binary too).
    Child(Child),
}

struct Fixture {
    backend: Option<Backend>,
    addr: SocketAddr,
    baseline: Vec<PartitionState>,
    _dir: Option<TempDir>,
}

fn broker_map(data_dir: &std::path::Path, extra: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    map.insert("listeners".to_string(), "127.0.0.1:0".to_string());
    map.insert("admin.listener".to_string(), "127.0.0.1:0".to_string());
    map.insert("log.dirs".to_string(), data_dir.display().to_string());
    map.insert("auto.create.topics.enable".to_string(), "false".to_string());
    for (k, v) in extra {
        map.insert(k.to_string(), v.to_string());
    }
    map
}

impl Fixture {
    /// Starts an in-process broker with `extra` config, creates the data
    /// topic and produces the fixture batches on a good connection.
    async fn new(extra: &[(&str, &str)]) -> Fixture {
        watch_for_broker_panics();
        let dir = tempfile::tempdir().expect("tempdir");
        let config = BrokerConfig::from_map(&broker_map(dir.path(), extra)).expect("config");
        let running = tessera_gateway::start(config).await.expect("broker starts");
        let addr = running.kafka_addr;
        Fixture {
            backend: Some(Backend::InProcess(running)),
            addr,
            baseline: populate(addr).await,
            _dir: Some(dir),
        }
    }

    /// The same with the broker as a child process.
    async fn new_child(extra: &[(&str, &str)]) -> Fixture {
        let child = Child::start(extra).await;
        let addr = child.addr;
        let baseline = populate(addr).await;
        Fixture {
            backend: Some(Backend::Child(child)),
            addr,
            baseline,
            _dir: None,
        }
    }

    /// For a child broker: `Err` with its exit status and last log lines
    /// once it has exited.
    fn child_alive(&mut self) -> Result<(), String> {
        match &mut self.backend {
            Some(Backend::Child(child)) => child.alive(),
            _ => Ok(()),
        }
    }

    /// The broker is up, a fresh client is served, and the data topic reads
    /// back identical.
    async fn verify_unchanged(&mut self) {
        if let Err(died) = self.child_alive() {
            panic!("{died}");
        }
        let mut client = Client::connect(self.addr).await;
        client.api_versions().await;
        let metadata = client.metadata(None).await;
        let data = metadata
            .topics
            .iter()
            .find(|t| t.name.as_ref().map(|n| n.0.as_str()) == Some(TOPIC))
            .expect("the data topic is still listed");
        assert_eq!(data.error_code, NONE);
        assert_eq!(data.partitions.len(), PARTITIONS as usize);
        for partition in 0..PARTITIONS {
            let state = snapshot(&mut client, TOPIC, partition).await;
            assert_eq!(
                state, self.baseline[partition as usize],
                "partition {partition} changed"
            );
        }
        match &self.backend {
            Some(Backend::Child(child)) => {
                let panics = child.panics();
                assert!(panics.is_empty(), "the broker panicked: {panics:#?}");
            }
            _ => assert_no_broker_panics(),
        }
    }

    async fn shutdown(mut self) {
        match self.backend.take() {
            Some(Backend::InProcess(running)) => {
                tokio::time::timeout(Duration::from_secs(30), running.shutdown())
                    .await
                    .expect("broker shuts down");
            }
            Some(Backend::Child(child)) => child.stop().await,
            None => {}
        }
    }
}

/// Creates the data topic, produces the fixture batches on a good
/// connection and returns what each partition reads back.
async fn populate(addr: SocketAddr) -> Vec<PartitionState> {
    let mut client = Client::connect(addr).await;
    client.api_versions().await;
    client.create_topic(TOPIC, PARTITIONS, &[]).await;
    for partition in 0..PARTITIONS {
        for batch in 0..BATCHES_PER_PARTITION {
            let (error, base) = client
                .produce_raw(
                    TOPIC,
                    partition,
                    encode_batch(&fixture_batch(partition, batch)),
                )
                .await;
            assert_eq!(error, NONE, "fixture produce to partition {partition}");
            assert_eq!(base, batch * RECORDS_PER_BATCH, "fixture base offset");
        }
    }
    let mut baseline = Vec::new();
    for partition in 0..PARTITIONS {
        let state = snapshot(&mut client, TOPIC, partition).await;
        let expected: Vec<(i64, Bytes, Bytes, i64)> = (0..BATCHES_PER_PARTITION)
            .flat_map(|b| fixture_batch(partition, b))
            .enumerate()
            .map(|(i, r)| (i as i64, r.key.unwrap(), r.value.unwrap(), r.timestamp))
            .collect();
        assert_eq!(state.records, expected, "fixture data reads back");
        assert_eq!(
            state.high_watermark,
            BATCHES_PER_PARTITION * RECORDS_PER_BATCH
        );
        assert_eq!(state.log_start, 0);
        baseline.push(state);
    }
    baseline
}

/// Reads a whole partition from offset 0 up to its high watermark.
async fn snapshot(client: &mut Client, topic: &str, partition: i32) -> PartitionState {
    let mut raw = Vec::new();
    let mut records = Vec::new();
    let mut offset = 0;
    loop {
        let (error, hw, log_start, bytes) = client.fetch_once(topic, partition, offset).await;
        assert_eq!(error, NONE, "fetch {topic}/{partition} at {offset}");
        if offset >= hw {
            return PartitionState {
                high_watermark: hw,
                log_start,
                raw,
                records,
            };
        }
        assert!(
            !bytes.is_empty(),
            "fetch below the high watermark returned nothing"
        );
        raw.extend_from_slice(&bytes);
        let mut buf = bytes.clone();
        for set in RecordBatchDecoder::decode_all(&mut buf).expect("stored batches decode") {
            for r in set.records {
                if r.offset >= offset {
                    records.push((
                        r.offset,
                        r.key.unwrap_or_default(),
                        r.value.unwrap_or_default(),
                        r.timestamp,
                    ));
                    offset = r.offset + 1;
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Framing.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_frame_then_close() {
    let mut fixture = Fixture::new(&[]).await;
    let mut stream = TcpStream::connect(fixture.addr).await.unwrap();
    let mut bytes = 100i32.to_be_bytes().to_vec();
    bytes.extend_from_slice(&raw_frame(ApiKey::Metadata as i16, 12, 7, &[])[4..10]);
    stream.write_all(&bytes).await.unwrap();
    stream.shutdown().await.unwrap();
    // Nothing is answered for a request that never arrived whole.
    expect_closed(&mut stream, "truncated frame").await;
    drop(stream);

    // And once more, dropping the socket abruptly while the broker waits.
    let mut stream = TcpStream::connect(fixture.addr).await.unwrap();
    stream.write_all(&bytes).await.unwrap();
    drop(stream);

    fixture.verify_unchanged().await;
    fixture.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn length_prefix_over_socket_request_max_bytes() {
    const MAX: usize = 1024;
    let mut fixture = Fixture::new(&[("socket.request.max.bytes", "1024")]).await;

    for claimed in [MAX as i32 + 1, 2048, i32::MAX] {
        let mut stream = TcpStream::connect(fixture.addr).await.unwrap();
        stream.write_all(&claimed.to_be_bytes()).await.unwrap();
        // The broker must not wait for the body: it refuses on the prefix.
        expect_closed(&mut stream, &format!("length prefix {claimed}")).await;
    }

    // Exactly at the limit is still a request (Kafka refuses only size > max).
    // The client id is an INT16-length string even in flexible headers, so
    // padding it grows the frame byte for byte.
    let unpadded = request_frame(
        METADATA_V,
        42,
        &MetadataRequest::default().with_topics(Some(vec![])),
    )
    .len()
        - 4;
    let header = RequestHeader::default()
        .with_request_api_key(ApiKey::Metadata as i16)
        .with_request_api_version(METADATA_V)
        .with_correlation_id(42)
        .with_client_id(Some(StrBytes::from_string(format!(
            "bad-input-test{}",
            "x".repeat(MAX - unpadded)
        ))));
    let mut frame = BytesMut::new();
    frame.put_i32(0);
    header
        .encode(&mut frame, MetadataRequest::header_version(METADATA_V))
        .unwrap();
    MetadataRequest::default()
        .with_topics(Some(vec![]))
        .encode(&mut frame, METADATA_V)
        .unwrap();
    let len = (frame.len() - 4) as i32;
    frame[0..4].copy_from_slice(&len.to_be_bytes());
    assert_eq!(frame.len() - 4, MAX, "request exactly at the limit");
    let mut stream = TcpStream::connect(fixture.addr).await.unwrap();
    stream.write_all(&frame).await.unwrap();
    let response = read_frame(&mut stream)
        .await
        .expect("a request of exactly socket.request.max.bytes is served");
    let (id, _) = decode_response::<MetadataRequest>(METADATA_V, response);
    assert_eq!(id, 42);

    // One byte more is refused.
    let mut frame = frame.to_vec();
    frame.push(0);
    let len = (frame.len() - 4) as i32;
    frame[0..4].copy_from_slice(&len.to_be_bytes());
    let mut stream = TcpStream::connect(fixture.addr).await.unwrap();
    let _ = stream.write_all(&frame).await;
    expect_closed(&mut stream, "request one byte over the limit").await;

    fixture.verify_unchanged().await;
    fixture.shutdown().await;
}

/// The `tessera` binary in a child process: its memory can be read from
/// /proc without other tests' allocations in the picture, and an abort
/// takes down only the child.
struct Child {
    child: tokio::process::Child,
    addr: SocketAddr,
    /// The last lines of its log (stderr).
    log: std::sync::Arc<Mutex<std::collections::VecDeque<String>>>,
    /// Every "panicked" line it logged.
    panics: std::sync::Arc<Mutex<Vec<String>>>,
    _dir: TempDir,
}

impl Child {
    async fn start(overrides: &[(&str, &str)]) -> Child {
        use tokio::io::AsyncBufReadExt;
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_tessera"));
        // Only command-line settings: no config file, no TESSERA_* variables.
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("RUST_LOG", "info")
            .env("RUST_BACKTRACE", "0")
            .env("NO_COLOR", "1");
        for (k, v) in broker_map(dir.path(), overrides) {
            cmd.arg("-o").arg(format!("{k}={v}"));
        }
        cmd.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("spawn tessera");
        let stderr = child.stderr.take().unwrap();
        let mut lines = tokio::io::BufReader::new(stderr).lines();
        let addr = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                let line = strip_ansi(&line);
                if let Some(at) = line.find("kafka_addr=") {
                    let rest = &line[at + "kafka_addr=".len()..];
                    let addr = rest.split_whitespace().next().unwrap();
                    return addr.parse::<SocketAddr>().expect("kafka_addr parses");
                }
            }
            panic!("tessera exited before serving");
        })
        .await
        .expect("tessera starts serving");
        // Keep draining stderr so the child never blocks on a full pipe.
        let log = std::sync::Arc::new(Mutex::new(std::collections::VecDeque::new()));
        let panics = std::sync::Arc::new(Mutex::new(Vec::new()));
        let (log_w, panics_w) = (log.clone(), panics.clone());
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let line = strip_ansi(&line);
                if line.contains("panicked") {
                    panics_w.lock().unwrap().push(line.clone());
                }
                let mut log = log_w.lock().unwrap();
                log.push_back(line);
                if log.len() > 20 {
                    log.pop_front();
                }
            }
        });
        Child {
            child,
            addr,
            log,
            panics,
            _dir: dir,
        }
    }

    /// `Err` describing how the child ended, once it has.
    fn alive(&mut self) -> Result<(), String> {
        match self.child.try_wait().expect("try_wait") {
            None => Ok(()),
            Some(status) => {
                // Let the stderr reader catch the last lines.
                std::thread::sleep(Duration::from_millis(200));
                let log = self.log.lock().unwrap();
                Err(format!(
                    "the tessera process died ({status}); its last log lines:\n{}",
                    log.iter().cloned().collect::<Vec<_>>().join("\n")
                ))
            }
        }
    }

    fn panics(&self) -> Vec<String> {
        self.panics.lock().unwrap().clone()
    }

    /// `(VmSize, VmPeak)` in bytes.
    fn vm(&self) -> (u64, u64) {
        let pid = self.child.id().expect("child is running");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let field = |name: &str| -> u64 {
            let line = status
                .lines()
                .find(|l| l.starts_with(name))
                .unwrap_or_else(|| panic!("{name} in /proc/{pid}/status"));
            let kib: u64 = line[name.len()..]
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .unwrap();
            kib * 1024
        };
        (field("VmSize:"), field("VmPeak:"))
    }

    async fn stop(mut self) {
        if let Err(died) = self.alive() {
            panic!("{died}");
        }
        // Our own child, by its handle.
        let _ = self.child.kill().await;
    }
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Kafka refuses an oversized size prefix before allocating the buffer, and
/// a frame's buffer grows with the bytes that arrive (a slow client that
/// announces a large request holds nothing for it). The broker runs as a
/// child process here so its virtual memory can be read: 48 MiB sent of a
/// 64 MiB frame shows up in VmSize (the control), 64 MiB announced with
/// nothing sent does not, and a 2 GiB claim over the limit never shows up
/// in VmPeak.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_length_prefix_is_refused_before_allocating() {
    const MIB: u64 = 1 << 20;
    let child = Child::start(&[("socket.request.max.bytes", "104857600")]).await;
    let mut client = Client::connect(child.addr).await;
    client.api_versions().await;

    // Announced, not sent: nothing allocated while the broker waits.
    let (size_before, _) = child.vm();
    let mut announced = TcpStream::connect(child.addr).await.unwrap();
    announced
        .write_all(&(64 * MIB as i32).to_be_bytes())
        .await
        .unwrap();
    announced.write_all(&[0; 16]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let grew = child.vm().0.saturating_sub(size_before);
    assert!(
        grew < 16 * MIB,
        "an announced 64 MiB frame with 16 bytes sent grew VmSize by {} MiB",
        grew / MIB
    );

    // Control: 48 MiB of a 64 MiB frame sent; the buffer holds what came.
    let (size_before, _) = child.vm();
    let mut pending = TcpStream::connect(child.addr).await.unwrap();
    pending
        .write_all(&(64 * MIB as i32).to_be_bytes())
        .await
        .unwrap();
    pending
        .write_all(&vec![0u8; 48 * MIB as usize])
        .await
        .unwrap();
    let mut grew = 0;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        grew = child.vm().0.saturating_sub(size_before);
        if grew >= 40 * MIB {
            break;
        }
    }
    assert!(
        grew >= 40 * MIB,
        "control: 48 MiB of a frame under the limit should be visible in VmSize, grew {} MiB",
        grew / MIB
    );
    drop(pending);
    drop(announced);
    tokio::time::sleep(Duration::from_millis(200)).await;

    // 2 GiB over the limit: refused on the prefix, nothing allocated.
    let (size_before, _) = child.vm();
    let mut stream = TcpStream::connect(child.addr).await.unwrap();
    stream.write_all(&i32::MAX.to_be_bytes()).await.unwrap();
    expect_closed(&mut stream, "2 GiB length prefix").await;
    let (_, peak_after) = child.vm();
    assert!(
        peak_after < size_before + 1024 * MIB,
        "VmPeak {} MiB after a refused 2 GiB prefix, VmSize was {} MiB before",
        peak_after / MIB,
        size_before / MIB
    );

    // Other clients are still served, including the one already connected.
    client.api_versions().await;
    Client::connect(child.addr).await.api_versions().await;
    child.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negative_length_prefix_closes_the_connection() {
    let mut fixture = Fixture::new(&[]).await;
    for claimed in [-1i32, -100, i32::MIN] {
        let mut stream = TcpStream::connect(fixture.addr).await.unwrap();
        stream.write_all(&claimed.to_be_bytes()).await.unwrap();
        expect_closed(&mut stream, &format!("length prefix {claimed}")).await;
    }
    fixture.verify_unchanged().await;
    fixture.shutdown().await;
}

// ---------------------------------------------------------------------------
// Produce validation.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_with_bad_crc_is_corrupt_message() {
    let mut fixture = Fixture::new(&[]).await;
    let mut client = Client::connect(fixture.addr).await;
    let good = encode_batch(&fixture_batch(0, 99));
    // Flip one byte in the records region, one in the CRC-covered header
    // (producer id), and one in the stored CRC itself.
    for (what, at) in [
        ("records byte", good.len() - 3),
        ("first record byte", BATCH_HEADER_LEN),
        ("producer id byte", 45),
        ("crc byte", 17),
    ] {
        let mut bad = good.to_vec();
        bad[at] ^= 0x5a;
        for partition in 0..PARTITIONS {
            let (error, base) = client
                .produce_raw(TOPIC, partition, Bytes::from(bad.clone()))
                .await;
            assert_eq!(
                error, CORRUPT_MESSAGE,
                "{what} flipped: partition {partition} error"
            );
            assert_eq!(base, -1, "{what} flipped: base offset of a refused batch");
        }
    }
    // A good batch followed by a corrupt one in the same partition: Kafka
    // validates the whole partition's records first, so neither is appended.
    let mut bad = good.to_vec();
    bad[good.len() - 1] ^= 0xff;
    let mut both = good.to_vec();
    both.extend_from_slice(&bad);
    let (error, _) = client.produce_raw(TOPIC, 1, Bytes::from(both)).await;
    assert_eq!(error, CORRUPT_MESSAGE, "good batch then corrupt batch");

    // The connection stays usable after the per-partition error.
    client.api_versions().await;
    fixture.verify_unchanged().await;
    fixture.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_to_missing_topic_without_auto_create() {
    let mut fixture = Fixture::new(&[]).await;
    let mut client = Client::connect(fixture.addr).await;
    let (error, base) = client
        .produce_raw("no-such-topic", 0, encode_batch(&fixture_batch(0, 0)))
        .await;
    assert_eq!(error, UNKNOWN_TOPIC_OR_PARTITION);
    assert_eq!(base, -1);
    // A partition the data topic does not have.
    let (error, _) = client
        .produce_raw(TOPIC, PARTITIONS, encode_batch(&fixture_batch(0, 0)))
        .await;
    assert_eq!(error, UNKNOWN_TOPIC_OR_PARTITION, "partition out of range");
    // The produce did not create the topic.
    let metadata = client.metadata(Some(&["no-such-topic"])).await;
    assert_eq!(metadata.topics.len(), 1);
    assert_eq!(metadata.topics[0].error_code, UNKNOWN_TOPIC_OR_PARTITION);
    fixture.verify_unchanged().await;
    fixture.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_over_max_message_bytes_is_message_too_large() {
    let mut fixture = Fixture::new(&[]).await;
    let mut client = Client::connect(fixture.addr).await;
    client
        .create_topic("small", 1, &[("max.message.bytes", "1024")])
        .await;
    let fits = encode_batch(&[record(0, 1, "k".into(), vec![7u8; 200])]);
    assert!(fits.len() <= 1024);
    let (error, base) = client.produce_raw("small", 0, fits).await;
    assert_eq!(error, NONE);
    assert_eq!(base, 0);
    let before = snapshot(&mut client, "small", 0).await;
    assert_eq!(before.high_watermark, 1);

    let big = encode_batch(&[record(0, 1, "k".into(), vec![7u8; 4000])]);
    assert!(big.len() > 1024);
    let (error, base) = client.produce_raw("small", 0, big).await;
    assert_eq!(error, MESSAGE_TOO_LARGE);
    assert_eq!(base, -1);
    // Just over: 1025 bytes.
    let value_len = 200 + 1025 - encode_batch(&[record(0, 1, "k".into(), vec![7u8; 200])]).len();
    let just_over = encode_batch(&[record(0, 1, "k".into(), vec![7u8; value_len])]);
    assert_eq!(just_over.len(), 1025);
    let (error, _) = client.produce_raw("small", 0, just_over).await;
    assert_eq!(error, MESSAGE_TOO_LARGE, "a 1025-byte batch");

    let after = snapshot(&mut client, "small", 0).await;
    assert_eq!(after, before, "nothing appended to the small topic");
    fixture.verify_unchanged().await;
    fixture.shutdown().await;
}

// ---------------------------------------------------------------------------
// Fetch.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_outside_the_offset_range() {
    let mut fixture = Fixture::new(&[]).await;
    let mut client = Client::connect(fixture.addr).await;
    let hw = BATCHES_PER_PARTITION * RECORDS_PER_BATCH;
    for offset in [hw + 1, hw + 1000, i64::MAX, -5] {
        let (error, high_watermark, _, records) = client.fetch_once(TOPIC, 0, offset).await;
        assert_eq!(error, OFFSET_OUT_OF_RANGE, "fetch at {offset}");
        // Kafka answers an errored partition with high watermark -1.
        assert_eq!(
            high_watermark, -1,
            "high watermark with OFFSET_OUT_OF_RANGE at {offset}"
        );
        assert!(records.is_empty());
    }
    // At the high watermark itself: in range, nothing to return.
    let (error, high_watermark, _, records) = client.fetch_once(TOPIC, 0, hw).await;
    assert_eq!(error, NONE);
    assert_eq!(high_watermark, hw);
    assert!(records.is_empty());
    fixture.verify_unchanged().await;
    fixture.shutdown().await;
}

// ---------------------------------------------------------------------------
// API keys and versions.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_api_key_closes_after_earlier_pipelined_requests() {
    let mut fixture = Fixture::new(&[]).await;
    let mut stream = TcpStream::connect(fixture.addr).await.unwrap();
    let mut bytes = Vec::new();
    bytes.extend(request_frame(
        API_VERSIONS_V,
        1,
        &ApiVersionsRequest::default(),
    ));
    bytes.extend(request_frame(
        METADATA_V,
        2,
        &MetadataRequest::default().with_topics(None),
    ));
    bytes.extend(raw_frame(9999, 0, 3, &[1, 2, 3, 4]));
    bytes.extend(request_frame(
        API_VERSIONS_V,
        4,
        &ApiVersionsRequest::default(),
    ));
    stream.write_all(&bytes).await.unwrap();

    let first = read_frame(&mut stream).await.expect("ApiVersions answered");
    let (id, response) = decode_response::<ApiVersionsRequest>(API_VERSIONS_V, first);
    assert_eq!(id, 1);
    assert_eq!(response.error_code, NONE);
    let second = read_frame(&mut stream).await.expect("Metadata answered");
    let (id, response) = decode_response::<MetadataRequest>(METADATA_V, second);
    assert_eq!(id, 2);
    assert!(response
        .topics
        .iter()
        .any(|t| t.name.as_ref().map(|n| n.0.as_str()) == Some(TOPIC)));
    // Nothing for the unknown key, nor for what came after it.
    expect_closed(&mut stream, "unknown API key 9999").await;

    // An unknown key as the very first request.
    let mut stream = TcpStream::connect(fixture.addr).await.unwrap();
    stream.write_all(&raw_frame(-1, 0, 5, &[])).await.unwrap();
    expect_closed(&mut stream, "API key -1").await;

    fixture.verify_unchanged().await;
    fixture.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsupported_api_versions_version_gets_a_v0_answer() {
    let mut fixture = Fixture::new(&[]).await;
    let mut stream = TcpStream::connect(fixture.addr).await.unwrap();
    // A newer client's ApiVersions: header v2 (tagged fields), unknown body.
    let mut body = vec![0u8]; // empty tagged fields of the header
    body.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
    stream
        .write_all(&raw_frame(ApiKey::ApiVersions as i16, 99, 77, &body))
        .await
        .unwrap();
    let frame = read_frame(&mut stream)
        .await
        .expect("ApiVersions v99 is answered, not closed");
    let (id, response) = decode_response::<ApiVersionsRequest>(0, frame);
    assert_eq!(id, 77);
    assert_eq!(response.error_code, UNSUPPORTED_VERSION);
    let api_versions = response
        .api_keys
        .iter()
        .find(|k| k.api_key == ApiKey::ApiVersions as i16)
        .expect("the v0 answer lists ApiVersions");
    assert_eq!(api_versions.min_version, 0);
    assert!(api_versions.max_version >= 3);
    for key in [ApiKey::Produce, ApiKey::Fetch, ApiKey::Metadata] {
        assert!(
            response.api_keys.iter().any(|k| k.api_key == key as i16),
            "the v0 answer lists {key:?}"
        );
    }
    // Kafka keeps the connection: the client retries with a version it knows.
    let mut client = Client {
        stream,
        next_id: 100,
    };
    client.api_versions().await;
    client.metadata(None).await;

    // An unsupported version of any other API closes the connection.
    let mut stream = client.stream;
    stream
        .write_all(&raw_frame(ApiKey::Metadata as i16, 99, 200, &[0]))
        .await
        .unwrap();
    expect_closed(&mut stream, "Metadata v99").await;
    // Below the minimum too (Produce v0 is long gone).
    let mut stream = TcpStream::connect(fixture.addr).await.unwrap();
    stream
        .write_all(&raw_frame(ApiKey::Produce as i16, 0, 201, &[0; 16]))
        .await
        .unwrap();
    expect_closed(&mut stream, "Produce v0").await;

    fixture.verify_unchanged().await;
    fixture.shutdown().await;
}

// ---------------------------------------------------------------------------
// Pipelining.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_pipelined_requests_answered_in_order() {
    let mut fixture = Fixture::new(&[]).await;
    let mut stream = TcpStream::connect(fixture.addr).await.unwrap();
    // Correlation ids that are not sorted, so order can only come from the
    // order of the requests.
    let ids: Vec<i32> = (0..50).map(|i| (i * 7919 + 13) % 10007).collect();
    let mut bytes = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        if i % 2 == 0 {
            bytes.extend(request_frame(
                API_VERSIONS_V,
                *id,
                &ApiVersionsRequest::default(),
            ));
        } else {
            bytes.extend(request_frame(
                METADATA_V,
                *id,
                &MetadataRequest::default().with_topics(Some(vec![MetadataRequestTopic::default(
                )
                .with_name(Some(topic_name(TOPIC)))])),
            ));
        }
    }
    stream.write_all(&bytes).await.unwrap();
    for (i, id) in ids.iter().enumerate() {
        let frame = read_frame(&mut stream)
            .await
            .unwrap_or_else(|| panic!("connection closed after {i} responses"));
        if i % 2 == 0 {
            let (got, response) = decode_response::<ApiVersionsRequest>(API_VERSIONS_V, frame);
            assert_eq!(got, *id, "response {i}");
            assert_eq!(response.error_code, NONE);
        } else {
            let (got, response) = decode_response::<MetadataRequest>(METADATA_V, frame);
            assert_eq!(got, *id, "response {i}");
            assert_eq!(response.topics.len(), 1);
            assert_eq!(response.topics[0].error_code, NONE);
            assert_eq!(response.topics[0].partitions.len(), PARTITIONS as usize);
        }
    }
    // The connection is still good afterwards.
    let mut client = Client {
        stream,
        next_id: 20_000,
    };
    client.api_versions().await;
    fixture.verify_unchanged().await;
    fixture.shutdown().await;
}

// ---------------------------------------------------------------------------
// Random bytes.
// ---------------------------------------------------------------------------

/// splitmix64: a fixed seed makes every run send the same bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// One random input: pure noise, a valid prefix with noise, a known API
/// header with a noise body, or a valid read-only request with a few bytes
/// changed.
fn random_input(rng: &mut Rng) -> Vec<u8> {
    const KEYS: [(ApiKey, i16, i16); 8] = [
        (ApiKey::Produce, 3, 11),
        (ApiKey::Fetch, 4, 18),
        (ApiKey::ListOffsets, 1, 10),
        (ApiKey::Metadata, 0, 13),
        (ApiKey::ApiVersions, 0, 4),
        (ApiKey::CreateTopics, 2, 7),
        (ApiKey::DeleteTopics, 1, 6),
        (ApiKey::DescribeCluster, 0, 2),
    ];
    match rng.below(4) {
        0 => {
            let n = rng.below(300) as usize;
            rng.bytes(n)
        }
        1 => {
            let n = rng.below(300) as usize;
            let body = rng.bytes(n);
            let mut out = (n as i32).to_be_bytes().to_vec();
            out.extend(body);
            out
        }
        2 => {
            let (key, lo, hi) = KEYS[rng.below(KEYS.len() as u64) as usize];
            let version = lo + rng.below((hi - lo + 1) as u64) as i16;
            let n = rng.below(200) as usize;
            let noise = rng.bytes(n);
            raw_frame(key as i16, version, rng.next() as i32, &noise)
        }
        _ => {
            let mut frame = match rng.below(3) {
                0 => request_frame(API_VERSIONS_V, 1, &ApiVersionsRequest::default()),
                1 => request_frame(
                    METADATA_V,
                    2,
                    &MetadataRequest::default().with_topics(Some(vec![
                        MetadataRequestTopic::default().with_name(Some(topic_name(TOPIC))),
                    ])),
                ),
                _ => request_frame(
                    FETCH_V,
                    3,
                    &FetchRequest::default()
                        .with_replica_id(BrokerId(-1))
                        .with_max_bytes(1 << 20)
                        .with_session_epoch(-1)
                        .with_topics(vec![FetchTopic::default()
                            .with_topic(topic_name(TOPIC))
                            .with_partitions(vec![FetchPartition::default()
                                .with_partition(0)
                                .with_current_leader_epoch(-1)
                                .with_partition_max_bytes(1 << 20)])]),
                ),
            };
            for _ in 0..1 + rng.below(4) {
                // Leave the size prefix alone: the point is the body.
                let at = 4 + rng.below((frame.len() - 4) as u64) as usize;
                frame[at] = rng.next() as u8;
            }
            frame
        }
    }
}

/// Random input, 50 cases, each on its own connection, against the broker
/// as a child process: a crash (an abort cannot be caught in-process) shows
/// up as the child's exit, with the input that caused it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_bytes_never_take_the_broker_down() {
    let mut fixture = Fixture::new_child(&[]).await;
    let mut rng = Rng(0x7e55_e7a0_bad1_0001);
    let mut answered = 0usize;
    let mut closed = 0usize;
    for case in 0..50 {
        let input = random_input(&mut rng);
        let mut stream = TcpStream::connect(fixture.addr).await.unwrap();
        // The broker may close before taking everything: ignore write errors.
        let _ = stream.write_all(&input).await;
        let _ = stream.shutdown().await;
        // Drain whatever comes back until the broker closes; a mutated fetch
        // may long-poll, so give up on this connection after a while.
        let mut sink = vec![0u8; 64 * 1024];
        let drained = tokio::time::timeout(Duration::from_secs(3), async {
            let mut total = 0;
            loop {
                match stream.read(&mut sink).await {
                    Ok(0) => return total,
                    Ok(n) => total += n,
                    Err(e) if is_closed(&e) => return total,
                    Err(e) => panic!("case {case}: read error {e}"),
                }
            }
        })
        .await;
        match drained {
            Ok(0) => closed += 1,
            Ok(_) => answered += 1,
            Err(_) => {}
        }
        drop(stream);
        tokio::time::sleep(Duration::from_millis(20)).await;
        if let Err(died) = fixture.child_alive() {
            panic!(
                "random case {case} ({} bytes: {}) killed the broker: {died}",
                input.len(),
                hex(&input)
            );
        }
        if case % 10 == 9 {
            let mut client = Client::connect(fixture.addr).await;
            client.api_versions().await;
        }
    }
    eprintln!("random inputs: {answered} answered, {closed} closed without an answer");
    fixture.verify_unchanged().await;
    fixture.shutdown().await;
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A request whose body starts with an array count far beyond the bytes
/// that follow. Kafka checks a count against the remaining bytes before it
/// allocates ("Tried to allocate a collection of size N, but there are only
/// M bytes remaining") and closes the connection; the broker must neither
/// allocate for the claimed count nor die.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_array_count_in_a_request_body_is_refused() {
    let cases: [(&str, Vec<u8>); 3] = [
        (
            "Metadata v1, topics INT32 count 2147483647",
            raw_frame(ApiKey::Metadata as i16, 1, 11, &i32::MAX.to_be_bytes()),
        ),
        (
            "Metadata v12, topics compact count varint 4294967295",
            // Header v2: the header's empty tagged fields, then the body.
            raw_frame(
                ApiKey::Metadata as i16,
                12,
                12,
                &[0x00, 0xff, 0xff, 0xff, 0xff, 0x0f],
            ),
        ),
        (
            "Produce v3, topic_data INT32 count 2147483647",
            raw_frame(ApiKey::Produce as i16, 3, 13, &{
                let mut body = Vec::new();
                body.extend_from_slice(&(-1i16).to_be_bytes()); // transactional id: null
                body.extend_from_slice(&(-1i16).to_be_bytes()); // acks
                body.extend_from_slice(&30_000i32.to_be_bytes()); // timeout
                body.extend_from_slice(&i32::MAX.to_be_bytes()); // topic_data count
                body
            }),
        ),
    ];
    let mut failures = Vec::new();
    for (what, frame) in cases {
        // A broker of its own per case: a case that kills it must not hide the next.
        let mut fixture = Fixture::new_child(&[]).await;
        let mut stream = TcpStream::connect(fixture.addr).await.unwrap();
        stream.write_all(&frame).await.unwrap();
        expect_closed(&mut stream, what).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        match fixture.child_alive() {
            Ok(()) => {
                fixture.verify_unchanged().await;
                fixture.shutdown().await;
            }
            Err(died) => failures.push(format!("{what} ({}): {died}", hex(&frame))),
        }
    }
    assert!(
        failures.is_empty(),
        "requests with a huge array count took the broker down:\n{}",
        failures.join("\n\n")
    );
}
