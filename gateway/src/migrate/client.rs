//! The migrator's small Kafka client, on the `kafka-protocol` codecs the
//! broker uses and the same framing (`[size][header][body]`): one TCP
//! connection per [`Conn`], requests sent one at a time, versions agreed
//! through ApiVersions (the highest both sides serve within the range the
//! migrator implements). No librdkafka.
//!
//! What the migrator asks a source or target: Metadata, ListOffsets,
//! Fetch (raw record batches, read_uncommitted), DescribeConfigs,
//! CreateTopics, ListGroups, FindCoordinator, OffsetFetch, OffsetCommit,
//! and tessera's private MigrateAppend.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse,
    ProduceRequest, ProduceResponse, RequestHeader, ResponseHeader,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::security::{ClientSecurity, Mechanism};
use crate::api::migrate_append;
use crate::error::MigrateError;

/// A TCP or TLS stream.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// Largest response accepted.
const MAX_RESPONSE_BYTES: usize = 256 << 20;
/// How long one request may take (a long-polling fetch waits well below it).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
const CLIENT_ID: &str = "tessera-migrate";

/// The versions of each API the migrator implements: `(min, max)`.
fn our_versions(key: ApiKey) -> (i16, i16) {
    match key {
        ApiKey::ApiVersions => (0, 3),
        ApiKey::Metadata => (1, 12),
        ApiKey::ListOffsets => (2, 7),
        // v13+ name topics by id only.
        ApiKey::Fetch => (4, 12),
        ApiKey::DescribeConfigs => (1, 4),
        ApiKey::CreateTopics => (2, 7),
        ApiKey::ListGroups => (0, 4),
        // v4+ batches keys (coordinator_keys).
        ApiKey::FindCoordinator => (0, 3),
        // v8+ batches groups.
        ApiKey::OffsetFetch => (2, 7),
        ApiKey::OffsetCommit => (2, 8),
        ApiKey::SaslHandshake => (1, 1),
        ApiKey::SaslAuthenticate => (0, 2),
        _ => (0, 0),
    }
}

/// One connection to one broker.
pub struct Conn {
    addr: String,
    stream: Box<dyn Stream>,
    versions: HashMap<i16, (i16, i16)>,
    correlation: i32,
    security: Arc<ClientSecurity>,
}

impl Conn {
    /// Connects to `addr` (`host:port`) over PLAINTEXT and asks which
    /// versions it serves.
    pub async fn connect(addr: &str) -> Result<Conn, MigrateError> {
        Conn::connect_with(addr, Arc::default()).await
    }

    /// Another connection, to `addr` in the same cluster, secured as this one.
    pub async fn open(&self, addr: &str) -> Result<Conn, MigrateError> {
        Conn::connect_with(addr, self.security.clone()).await
    }

    /// Connects to `addr` with TLS and SASL as `security` asks, and asks
    /// which versions it serves.
    pub async fn connect_with(
        addr: &str,
        security: Arc<ClientSecurity>,
    ) -> Result<Conn, MigrateError> {
        let fail = |e: String| MigrateError::Connect(addr.to_string(), e);
        let tcp = tokio::time::timeout(REQUEST_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| fail("timed out".into()))?
            .map_err(|e| fail(e.to_string()))?;
        let _ = tcp.set_nodelay(true);
        let stream: Box<dyn Stream> = match &security.tls {
            Some(config) => {
                let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
                let host = host.trim_start_matches('[').trim_end_matches(']');
                let name = tokio_rustls::rustls::pki_types::ServerName::try_from(host.to_string())
                    .map_err(|e| fail(format!("server name {host:?}: {e}")))?;
                let tls = tokio_rustls::TlsConnector::from(config.clone());
                let stream = tokio::time::timeout(REQUEST_TIMEOUT, tls.connect(name, tcp))
                    .await
                    .map_err(|_| fail("TLS handshake timed out".into()))?
                    .map_err(|e| fail(format!("TLS handshake: {e}")))?;
                Box::new(stream)
            }
            None => Box::new(tcp),
        };
        let mut conn = Conn {
            addr: addr.to_string(),
            stream,
            versions: HashMap::new(),
            correlation: 0,
            security,
        };
        // v0 is understood by every broker (KIP-511).
        let response: ApiVersionsResponse = conn
            .exchange(
                ApiKey::ApiVersions as i16,
                0,
                ApiVersionsRequest::header_version(0),
                ApiVersionsResponse::header_version(0),
                &ApiVersionsRequest::default(),
                0,
            )
            .await?;
        if response.error_code != 0 {
            return Err(conn.broker_error("ApiVersions", response.error_code, None));
        }
        conn.versions = response
            .api_keys
            .iter()
            .map(|k| (k.api_key, (k.min_version, k.max_version)))
            .collect();
        if let Some((mechanism, user, password)) = conn.security.sasl.clone() {
            conn.authenticate(mechanism, &user, &password).await?;
        }
        Ok(conn)
    }

    /// SASL as `security` asks, with the broker's own client exchange.
    async fn authenticate(
        &mut self,
        mechanism: Mechanism,
        user: &str,
        password: &str,
    ) -> Result<(), MigrateError> {
        let login = crate::sasl::client::Login {
            mechanism,
            user: user.to_string(),
            password: password.to_string(),
            oauthbearer: self.security.oauthbearer.clone(),
        };
        crate::sasl::client::authenticate(&mut self.stream, &login)
            .await
            .map_err(|e| self.sasl_error(&e))
    }

    fn sasl_error(&self, what: &str) -> MigrateError {
        MigrateError::Connect(self.addr.clone(), format!("SASL: {what}"))
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The version of `key` to use with this broker.
    pub fn version(&self, key: ApiKey) -> Result<i16, MigrateError> {
        let (our_min, our_max) = our_versions(key);
        let (their_min, their_max) =
            self.versions
                .get(&(key as i16))
                .copied()
                .ok_or_else(|| MigrateError::Unsupported {
                    broker: self.addr.clone(),
                    api: format!("{key:?}"),
                })?;
        let v = our_max.min(their_max);
        if v < our_min.max(their_min) {
            return Err(MigrateError::Unsupported {
                broker: self.addr.clone(),
                api: format!("{key:?} v{our_min}-{our_max} (it serves v{their_min}-{their_max})"),
            });
        }
        Ok(v)
    }

    /// Sends a Kafka request at the best common version.
    pub async fn call<R: Request>(&mut self, body: &R) -> Result<R::Response, MigrateError> {
        let key = ApiKey::try_from(R::KEY).expect("a known api key");
        let v = self.version(key)?;
        self.call_at(body, v).await
    }

    /// Sends a Kafka request at version `v`.
    pub async fn call_at<R: Request>(
        &mut self,
        body: &R,
        v: i16,
    ) -> Result<R::Response, MigrateError> {
        self.exchange(
            R::KEY,
            v,
            R::header_version(v),
            <R::Response as HeaderVersion>::header_version(v),
            body,
            v,
        )
        .await
    }

    /// Tessera's MigrateAppend (a ProduceRequest v9 body under the private
    /// api key): batches written at their own offsets.
    pub async fn migrate_append(
        &mut self,
        body: &ProduceRequest,
    ) -> Result<ProduceResponse, MigrateError> {
        self.exchange(
            migrate_append::API_KEY,
            migrate_append::VERSION,
            migrate_append::REQUEST_HEADER_VERSION,
            migrate_append::RESPONSE_HEADER_VERSION,
            body,
            migrate_append::BODY_VERSION,
        )
        .await
    }

    async fn exchange<B: Encodable, Resp: Decodable>(
        &mut self,
        api_key: i16,
        version: i16,
        request_header_version: i16,
        response_header_version: i16,
        body: &B,
        body_version: i16,
    ) -> Result<Resp, MigrateError> {
        self.correlation = self.correlation.wrapping_add(1);
        let id = self.correlation;
        let header = RequestHeader::default()
            .with_request_api_key(api_key)
            .with_request_api_version(version)
            .with_correlation_id(id)
            .with_client_id(Some(StrBytes::from_static_str(CLIENT_ID)));
        let mut buf = BytesMut::new();
        buf.put_i32(0);
        let codec = |e: anyhow::Error| MigrateError::Codec(e.to_string());
        header
            .encode(&mut buf, request_header_version)
            .map_err(codec)?;
        body.encode(&mut buf, body_version).map_err(codec)?;
        let len = (buf.len() - 4) as i32;
        buf[0..4].copy_from_slice(&len.to_be_bytes());
        let addr = self.addr.clone();
        let io = move |e: std::io::Error| MigrateError::Connect(addr.clone(), e.to_string());
        let frame = tokio::time::timeout(REQUEST_TIMEOUT, async {
            self.stream.write_all(&buf).await.map_err(io.clone())?;
            let mut size = [0u8; 4];
            self.stream
                .read_exact(&mut size)
                .await
                .map_err(io.clone())?;
            let size = i32::from_be_bytes(size);
            if size < 0 || size as usize > MAX_RESPONSE_BYTES {
                return Err(MigrateError::Codec(format!(
                    "response of {size} bytes from {}",
                    self.addr
                )));
            }
            let mut frame = vec![0u8; size as usize];
            self.stream.read_exact(&mut frame).await.map_err(io)?;
            Ok(Bytes::from(frame))
        })
        .await
        .map_err(|_| MigrateError::Connect(self.addr.clone(), "request timed out".into()))??;
        let mut frame = frame;
        let header = ResponseHeader::decode(&mut frame, response_header_version).map_err(codec)?;
        if header.correlation_id != id {
            return Err(MigrateError::Codec(format!(
                "correlation id {} from {}, expected {id}",
                header.correlation_id, self.addr
            )));
        }
        Resp::decode(&mut frame, body_version).map_err(|e| {
            MigrateError::Codec(format!(
                "the answer of {} to api {api_key} v{version} does not decode: {e}",
                self.addr
            ))
        })
    }

    /// A Kafka error code this broker answered, as an error.
    pub fn broker_error(&self, what: &str, code: i16, message: Option<&StrBytes>) -> MigrateError {
        MigrateError::Broker {
            broker: self.addr.clone(),
            what: what.to_string(),
            code,
            message: message.map(|m| m.to_string()).unwrap_or_else(|| {
                kafka_protocol::error::ResponseError::try_from_code(code)
                    .map(|e| e.to_string())
                    .unwrap_or_default()
            }),
        }
    }
}

/// What a cluster's metadata says about the topics the migrator copies.
#[derive(Clone, Debug, Default)]
pub struct ClusterView {
    /// `node id -> host:port`.
    pub brokers: HashMap<i32, String>,
    /// `topic -> partition -> leader`, internal topics left out.
    pub topics: HashMap<String, Vec<i32>>,
    /// How connections to this cluster are secured.
    pub security: Arc<ClientSecurity>,
}

impl ClusterView {
    /// The address of the leader of `topic`/`partition`.
    pub fn leader(&self, topic: &str, partition: i32) -> Result<String, MigrateError> {
        let leader = self
            .topics
            .get(topic)
            .and_then(|p| p.get(partition as usize))
            .copied()
            .unwrap_or(-1);
        self.brokers
            .get(&leader)
            .cloned()
            .ok_or_else(|| MigrateError::NoLeader(topic.to_string(), partition))
    }

    /// A connection to `addr` in this cluster.
    pub async fn connect(&self, addr: &str) -> Result<Conn, MigrateError> {
        Conn::connect_with(addr, self.security.clone()).await
    }

    /// A connection to the leader of `topic`/`partition`.
    pub async fn connect_leader(&self, topic: &str, partition: i32) -> Result<Conn, MigrateError> {
        self.connect(&self.leader(topic, partition)?).await
    }
}

/// A connection to any bootstrap server that answers.
pub async fn bootstrap(servers: &str, security: Arc<ClientSecurity>) -> Result<Conn, MigrateError> {
    let mut last = MigrateError::Connect(servers.to_string(), "no bootstrap server".into());
    for server in servers.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match Conn::connect_with(server, security.clone()).await {
            Ok(c) => return Ok(c),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Metadata of every topic (`topics = None`) or of the named ones.
pub async fn cluster_view(
    conn: &mut Conn,
    topics: Option<&[String]>,
) -> Result<ClusterView, MigrateError> {
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::messages::TopicName;
    let version = conn.version(ApiKey::Metadata)?;
    let request = MetadataRequest::default()
        .with_topics(topics.map(|t| {
            t.iter()
                .map(|name| {
                    MetadataRequestTopic::default()
                        .with_name(Some(TopicName(StrBytes::from_string(name.clone()))))
                })
                .collect()
        }))
        // v4+ (a v1-v3 broker never creates topics on Metadata anyway).
        .with_allow_auto_topic_creation(version < 4);
    let response: MetadataResponse = conn.call_at(&request, version).await?;
    let mut view = ClusterView {
        security: conn.security.clone(),
        ..ClusterView::default()
    };
    for b in &response.brokers {
        view.brokers
            .insert(b.node_id.0, format!("{}:{}", b.host, b.port));
    }
    for t in &response.topics {
        let Some(name) = &t.name else { continue };
        if t.is_internal || t.error_code != 0 || name.0.starts_with("__") {
            continue;
        }
        let mut leaders = vec![-1; t.partitions.len()];
        for p in &t.partitions {
            if let Some(slot) = leaders.get_mut(p.partition_index as usize) {
                *slot = if p.error_code == 0 { p.leader_id.0 } else { -1 };
            }
        }
        view.topics.insert(name.0.to_string(), leaders);
    }
    Ok(view)
}
