//! What the gateway's integration tests share: a broker config on free
//! loopback ports, a raw Kafka wire client, and a bounded wait.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{BrokerId, FetchRequest, RequestHeader, ResponseHeader, TopicName};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use tessera_gateway::BrokerConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const IO_TIMEOUT: Duration = Duration::from_secs(15);

/// A broker config on free loopback ports with its data in `dir`; the
/// automatic range policy is off unless `extra` turns it on.
/// For tests whose batches carry timestamps of 1970 (`make_batch(n, 1_000)`)
/// and that read sealed segments back after a while: time retention would
/// delete those segments (as Kafka's does) whenever its check ran before
/// the read-back. Seen under load in offset_for_leader_epoch: the log start
/// moved to 12 after a restart, the fetch at 0 was OFFSET_OUT_OF_RANGE.
pub const NO_TIME_RETENTION: (&str, &str) = ("log.retention.ms", "-1");

pub fn test_config(dir: &Path, extra: &[(&str, &str)]) -> BrokerConfig {
    let mut map = BTreeMap::new();
    map.insert("listeners".to_string(), "127.0.0.1:0".to_string());
    map.insert("admin.listener".to_string(), "127.0.0.1:0".to_string());
    map.insert("log.dirs".to_string(), dir.display().to_string());
    map.insert("range.policy.enable".to_string(), "false".to_string());
    for (k, v) in extra {
        map.insert(k.to_string(), v.to_string());
    }
    BrokerConfig::from_map(&map).expect("test config")
}

/// A config with a PLAINTEXT (inter-broker) and a SASL_PLAINTEXT listener,
/// PLAIN users from `jaas` (a PlainLoginModule line), plus `extra`.
pub fn sasl_plain_config(dir: &Path, jaas: &str, extra: &[(&str, &str)]) -> BrokerConfig {
    let mut all = vec![
        (
            "listeners",
            "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        ),
        ("sasl.enabled.mechanisms", "PLAIN"),
        ("listener.name.sasl_plaintext.plain.sasl.jaas.config", jaas),
    ];
    all.extend_from_slice(extra);
    test_config(dir, &all)
}

/// Where the running broker's listener `name` is bound.
pub fn listener_addr(running: &tessera_gateway::Running, name: &str) -> SocketAddr {
    running
        .listener_addrs
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, a)| *a)
        .unwrap_or_else(|| panic!("no listener {name}"))
}

/// A connection on `addr` authenticated with SASL PLAIN (handshake v1,
/// SaslAuthenticate v2) as `user`/`password`.
pub async fn plain_login(addr: SocketAddr, user: &str, password: &str) -> WireClient {
    use kafka_protocol::messages::{SaslAuthenticateRequest, SaslHandshakeRequest};
    let mut c = WireClient::connect(addr).await;
    let r = c
        .call(
            1,
            &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("PLAIN")),
        )
        .await;
    assert_eq!(r.error_code, 0);
    let token = format!("\0{user}\0{password}");
    let r = c
        .call(
            2,
            &SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(token.into_bytes())),
        )
        .await;
    assert_eq!(r.error_code, 0, "login {user}");
    c
}

/// A topic's name as requests carry it.
pub fn topic_name(topic: &str) -> TopicName {
    TopicName(StrBytes::from_string(topic.to_string()))
}

/// A consumer's read_uncommitted Fetch (v4-v12 fields) of one partition
/// from `offset`: no waiting, up to 1 MiB.
pub fn fetch_request(topic: &str, partition: i32, offset: i64) -> FetchRequest {
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(0)
        .with_min_bytes(0)
        .with_max_bytes(1 << 20)
        .with_session_epoch(-1)
        .with_topics(vec![FetchTopic::default()
            .with_topic(topic_name(topic))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(partition)
                .with_current_leader_epoch(-1)
                .with_fetch_offset(offset)
                .with_log_start_offset(-1)
                .with_partition_max_bytes(1 << 20)])])
}

/// The base offsets of the record batches in `records` (each checked).
pub fn batch_bases(records: &[u8]) -> Vec<i64> {
    tessera_log::batch::split_batches(records)
        .unwrap()
        .into_iter()
        .map(|r| {
            tessera_log::batch::validate(&records[r])
                .unwrap()
                .base_offset
        })
        .collect()
}

/// Polls `check` until it holds, for conditions a background task brings
/// about (bounded: 30 s).
pub async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..300 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for: {what}");
}

/// One connection speaking the Kafka wire protocol, one request at a time.
pub struct WireClient {
    stream: TcpStream,
    next_id: i32,
    client_id: &'static str,
}

impl WireClient {
    pub async fn connect(addr: SocketAddr) -> WireClient {
        let stream = TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).unwrap();
        WireClient::from_stream(stream)
    }

    /// The client id its requests carry from now on ("wire-test" by default).
    pub fn with_client_id(mut self, client_id: &'static str) -> WireClient {
        self.client_id = client_id;
        self
    }

    /// Sends one request and decodes its response, checking the correlation
    /// id and that the response has no trailing bytes.
    pub async fn call<R: Request>(&mut self, version: i16, body: &R) -> R::Response {
        let id = self.send(version, body).await;
        self.receive::<R>(version, id).await
    }

    /// Sends one request without waiting for its response (pipelining);
    /// returns its correlation id for [`WireClient::receive`].
    pub async fn send<R: Request>(&mut self, version: i16, body: &R) -> i32 {
        let id = self.next_id;
        self.next_id += 1;
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(id)
            .with_client_id(Some(StrBytes::from_static_str(self.client_id)));
        let mut buf = BytesMut::new();
        buf.put_i32(0);
        header.encode(&mut buf, R::header_version(version)).unwrap();
        body.encode(&mut buf, version).unwrap();
        let len = (buf.len() - 4) as i32;
        buf[0..4].copy_from_slice(&len.to_be_bytes());
        self.stream.write_all(&buf).await.unwrap();
        id
    }

    /// A client on a connection opened elsewhere.
    pub fn from_stream(stream: TcpStream) -> WireClient {
        WireClient {
            stream,
            next_id: 1,
            client_id: "wire-test",
        }
    }

    /// Whether the broker closed the connection (without sending anything
    /// more) within the I/O timeout.
    pub async fn is_closed(&mut self) -> bool {
        self.is_closed_within(IO_TIMEOUT).await
    }

    /// Whether the broker closed the connection within `wait` without
    /// sending anything first (a response that arrives is left unread).
    pub async fn is_closed_within(&mut self, wait: Duration) -> bool {
        let mut peek = [0u8; 1];
        matches!(
            tokio::time::timeout(wait, self.stream.peek(&mut peek)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    }

    /// Whether a response (or a close) is waiting to be read right now,
    /// without waiting and without consuming it: for ordering checks ("not
    /// answered before that other request was").
    pub async fn has_unread_now(&mut self) -> bool {
        let mut peek = [0u8; 1];
        // `timeout` polls the peek once before it looks at the (zero) deadline.
        tokio::time::timeout(Duration::ZERO, self.stream.peek(&mut peek))
            .await
            .is_ok()
    }

    /// Writes a raw size-prefixed frame (SASL tokens after a v0 handshake).
    pub async fn send_raw(&mut self, payload: &[u8]) {
        let mut buf = Vec::with_capacity(4 + payload.len());
        buf.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        buf.extend_from_slice(payload);
        self.stream.write_all(&buf).await.unwrap();
    }

    /// Reads a raw size-prefixed frame.
    pub async fn receive_raw(&mut self) -> Vec<u8> {
        let mut size = [0u8; 4];
        tokio::time::timeout(IO_TIMEOUT, self.stream.read_exact(&mut size))
            .await
            .expect("timed out")
            .expect("connection closed");
        let mut frame = vec![0u8; u32::from_be_bytes(size) as usize];
        self.stream.read_exact(&mut frame).await.unwrap();
        frame
    }

    /// Reads the next response, which must answer request `id`.
    pub async fn receive<R: Request>(&mut self, version: i16, id: i32) -> R::Response {
        let mut size = [0u8; 4];
        tokio::time::timeout(IO_TIMEOUT, self.stream.read_exact(&mut size))
            .await
            .expect("timed out")
            .unwrap_or_else(|e| panic!("api {} v{version}: connection closed: {e}", R::KEY));
        let mut frame = vec![0u8; i32::from_be_bytes(size) as usize];
        self.stream.read_exact(&mut frame).await.unwrap();
        let mut frame = Bytes::from(frame);
        let header = ResponseHeader::decode(
            &mut frame,
            <R::Response as HeaderVersion>::header_version(version),
        )
        .unwrap();
        assert_eq!(header.correlation_id, id);
        let body = R::Response::decode(&mut frame, version)
            .unwrap_or_else(|e| panic!("api {} v{version} response: {e}", R::KEY));
        assert!(
            frame.is_empty(),
            "api {} v{version}: trailing bytes",
            R::KEY
        );
        body
    }
}
