//! TCP transport of the metadata quorum: openraft's RPCs (AppendEntries,
//! Vote, InstallSnapshot) plus two controller RPCs (a write forwarded to the
//! leader, and a read index) between the controllers of the voter map.
//!
//! # Wire format
//!
//! Every message is one frame: `u32` big-endian payload length, then the
//! payload. A frame longer than [`MAX_FRAME_BYTES`] is refused before
//! anything is allocated for it, and a malformed frame closes that
//! connection only.
//!
//! A request payload is `u8 protocol version` ([`PROTOCOL_VERSION`]),
//! `u8 kind`, `u64 from node`, `u64 to node` (a request for another node id,
//! e.g. a misconfigured voter map, is refused), then the body:
//! - AppendEntries (1): `u32 length` + JSON header (vote, prev log id,
//!   leader commit), `u32 count`, and per entry `u32 length` + the entry in
//!   the log's own binary envelope (the records keep their codec);
//! - Vote (2): JSON `VoteRequest`;
//! - InstallSnapshot (3): `u32 length` + JSON header (vote, meta, offset,
//!   done), then the chunk's raw bytes;
//! - ClientWrite (4): `u32 count`, per record `u32 length` + record bytes;
//! - ReadIndex (5): empty;
//! - BrokerHeartbeat (6): `i32` broker id, then (optional, 0 when absent)
//!   `u8` want-shutdown flag (answered by the leader only);
//! - JoinAsLearner (7): `u64` node id, `u32 length` + the address (UTF-8)
//!   the learner listens on (answered by the leader only);
//! - RemoveLearner (8): `u64` node id (answered by the leader only; a
//!   broker-only node that was unregistered leaves the membership).
//! - BrokerLoad (9): `i32` broker id, `u32 count`, then per range it
//!   leads `u64` range id and `u64` bytes appended per second (sent beside
//!   each heartbeat to every voter; a voter that does not know the kind
//!   fails only that call, never the heartbeat).
//!
//! A response payload is `u8 protocol version`, `u8 status` (0 ok, 1 error
//! reported by the peer), then JSON: the openraft response or `RaftError`
//! for the raft RPCs, `WriteReply` / `ReadIndexReply` or
//! `ServiceError` for the controller RPCs.
//!
//! # Connections
//!
//! Each peer has a small pool of idle connections (one in steady state),
//! reused across RPCs; an RPC takes a connection out of the pool and puts it
//! back only after a complete exchange, so a connection whose RPC failed or
//! was cancelled mid-way (openraft drops the future at `hard_ttl`) is never
//! reused. Connecting again after a failure waits a bounded exponential
//! backoff. A failed connect is [`Unreachable`] (openraft backs off, and the
//! leader carries on with the rest of the quorum); a failure after the
//! request may have been sent is a [`NetworkError`], a deadline a
//! [`Timeout`]; an error reply meaning the peer's raft is not running is
//! also [`Unreachable`].
//!
//! With an SSL or SASL controller listener each connection is secured at
//! its start (TLS, then Kafka's SaslHandshake/SaslAuthenticate) and the
//! server admits only a peer allowed CLUSTER_ACTION: see
//! [`crate::network_auth`].
//!
//! The server answers the requests of one connection in order. It closes a
//! connection idle for 60 s or whose frame stalls for 30 s (clients do not
//! reuse a connection idle for 30 s), and serves at most 256 connections at
//! once.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{
    Fatal, InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError,
    Timeout, Unreachable,
};
use openraft::network::{Backoff, RPCOption, RPCTypes};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, LogId, RaftNetwork, RaftNetworkFactory, SnapshotMeta, Vote};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use crate::controller::{MetadataBatch, MetadataRaft, TypeConfig};
use crate::heartbeats::Heartbeats;
use crate::image::MetadataImage;
use crate::network_auth::{Conn, TransportSecurity};
use crate::records::MetadataRecord;
use crate::storage::{decode_entry, encode_entry};

/// Version byte of every request and response payload.
pub const PROTOCOL_VERSION: u8 = 1;
/// Largest frame payload accepted (and sent).
pub const MAX_FRAME_BYTES: usize = 64 << 20;

const KIND_APPEND_ENTRIES: u8 = 1;
const KIND_VOTE: u8 = 2;
const KIND_INSTALL_SNAPSHOT: u8 = 3;
const KIND_CLIENT_WRITE: u8 = 4;
const KIND_READ_INDEX: u8 = 5;
const KIND_BROKER_HEARTBEAT: u8 = 6;
const KIND_JOIN_AS_LEARNER: u8 = 7;
const KIND_REMOVE_LEARNER: u8 = 8;
const KIND_BROKER_LOAD: u8 = 9;

/// Prefix of a [`ServiceError::Failed`] message that retrying cannot fix
/// (a learner's join refused because its id is a voter's).
pub(crate) const REFUSED: &str = "refused: ";

const STATUS_OK: u8 = 0;
const STATUS_ERR: u8 = 1;

/// Idle connections kept per peer.
const MAX_IDLE_PER_PEER: usize = 2;
/// Connect attempts are bounded by this as well as by the RPC's deadline.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// After `n` consecutive failed connects, the next waits
/// `min(DIAL_BACKOFF_BASE * 2^(n-1), DIAL_BACKOFF_MAX)`.
const DIAL_BACKOFF_BASE: Duration = Duration::from_millis(20);
const DIAL_BACKOFF_MAX: Duration = Duration::from_millis(500);
/// openraft's own wait between replication attempts to an unreachable peer.
const RAFT_BACKOFF_BASE: Duration = Duration::from_millis(50);
const RAFT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Server side: once a frame has started, the rest must arrive within this.
const SERVER_FRAME_TIMEOUT: Duration = Duration::from_secs(30);
/// Server side: a connection with no request for this long is closed.
const SERVER_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Client side: a pooled connection idle this long is not reused (the
/// server may be about to close it).
const CLIENT_MAX_IDLE: Duration = Duration::from_secs(30);
/// Server side: connections served at once; more are closed at accept.
const SERVER_MAX_CONNECTIONS: usize = 256;

// ---------------------------------------------------------------------------
// Messages

/// One request of the transport.
#[derive(Debug)]
pub(crate) enum Request {
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<u64>),
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
    /// Encoded metadata records to append on the leader (one entry).
    ClientWrite(Vec<Vec<u8>>),
    /// The leader's linearizable read index.
    ReadIndex,
    /// A broker is alive (the leader records it for fencing), or is
    /// stopping and wants to be fenced now (Kafka's `wantShutDown`).
    BrokerHeartbeat {
        broker_id: i32,
        want_shutdown: bool,
    },
    /// A broker-only node asks to follow the metadata log as a learner,
    /// at `address`.
    JoinAsLearner {
        node_id: u64,
        address: String,
    },
    /// Removes a learner (an unregistered broker-only node) from the
    /// membership.
    RemoveLearner {
        node_id: u64,
    },
    /// The produce rate of each range a broker leads (bytes appended per
    /// second): what the active controller balances leadership by.
    BrokerLoad {
        broker_id: i32,
        ranges: Vec<(u64, u64)>,
    },
}

#[derive(serde::Serialize, serde::Deserialize)]
struct AppendHeader {
    vote: Vote<u64>,
    prev_log_id: Option<LogId<u64>>,
    leader_commit: Option<LogId<u64>>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct SnapshotChunkHeader {
    vote: Vote<u64>,
    meta: SnapshotMeta<u64, BasicNode>,
    offset: u64,
    done: bool,
}

/// Reply to a forwarded write: where it was appended and what the leader's
/// image skipped.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct WriteReply {
    pub offset: u64,
    pub skipped: Vec<u32>,
}

/// Reply to a read-index request: the log index a linearizable read must
/// have applied.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct ReadIndexReply {
    pub index: Option<u64>,
}

/// Error of a controller RPC as the serving node reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) enum ServiceError {
    /// The node is not the leader; nothing was appended.
    NotLeader { leader: Option<u64> },
    /// Anything else; for a write, whether it was appended is unknown.
    Failed(String),
}

fn put_u32(b: &mut Vec<u8>, v: usize) -> Result<(), String> {
    let v = u32::try_from(v).map_err(|_| format!("length {v} does not fit a u32"))?;
    b.extend_from_slice(&v.to_be_bytes());
    Ok(())
}

fn put_json<T: serde::Serialize>(b: &mut Vec<u8>, v: &T) -> Result<(), String> {
    let j = serde_json::to_vec(v).map_err(|e| e.to_string())?;
    put_u32(b, j.len())?;
    b.extend_from_slice(&j);
    Ok(())
}

/// Encodes a request as a complete frame (length prefix included).
pub(crate) fn encode_request(from: u64, to: u64, req: &Request) -> Result<Vec<u8>, String> {
    let mut b = vec![0u8; 4];
    b.push(PROTOCOL_VERSION);
    b.push(match req {
        Request::AppendEntries(_) => KIND_APPEND_ENTRIES,
        Request::Vote(_) => KIND_VOTE,
        Request::InstallSnapshot(_) => KIND_INSTALL_SNAPSHOT,
        Request::ClientWrite(_) => KIND_CLIENT_WRITE,
        Request::ReadIndex => KIND_READ_INDEX,
        Request::BrokerHeartbeat { .. } => KIND_BROKER_HEARTBEAT,
        Request::JoinAsLearner { .. } => KIND_JOIN_AS_LEARNER,
        Request::RemoveLearner { .. } => KIND_REMOVE_LEARNER,
        Request::BrokerLoad { .. } => KIND_BROKER_LOAD,
    });
    b.extend_from_slice(&from.to_be_bytes());
    b.extend_from_slice(&to.to_be_bytes());
    match req {
        Request::AppendEntries(r) => {
            put_json(
                &mut b,
                &AppendHeader {
                    vote: r.vote,
                    prev_log_id: r.prev_log_id,
                    leader_commit: r.leader_commit,
                },
            )?;
            put_u32(&mut b, r.entries.len())?;
            for e in &r.entries {
                let v = encode_entry(e);
                put_u32(&mut b, v.len())?;
                b.extend_from_slice(&v);
            }
        }
        Request::Vote(r) => {
            b.extend_from_slice(&serde_json::to_vec(r).map_err(|e| e.to_string())?);
        }
        Request::InstallSnapshot(r) => {
            put_json(
                &mut b,
                &SnapshotChunkHeader {
                    vote: r.vote,
                    meta: r.meta.clone(),
                    offset: r.offset,
                    done: r.done,
                },
            )?;
            b.extend_from_slice(&r.data);
        }
        Request::ClientWrite(values) => {
            put_u32(&mut b, values.len())?;
            for v in values {
                put_u32(&mut b, v.len())?;
                b.extend_from_slice(v);
            }
        }
        Request::ReadIndex => {}
        Request::BrokerHeartbeat {
            broker_id,
            want_shutdown,
        } => {
            b.extend_from_slice(&broker_id.to_be_bytes());
            b.push(*want_shutdown as u8);
        }
        Request::JoinAsLearner { node_id, address } => {
            b.extend_from_slice(&node_id.to_be_bytes());
            put_u32(&mut b, address.len())?;
            b.extend_from_slice(address.as_bytes());
        }
        Request::RemoveLearner { node_id } => b.extend_from_slice(&node_id.to_be_bytes()),
        Request::BrokerLoad { broker_id, ranges } => {
            b.extend_from_slice(&broker_id.to_be_bytes());
            put_u32(&mut b, ranges.len())?;
            for (range, rate) in ranges {
                b.extend_from_slice(&range.to_be_bytes());
                b.extend_from_slice(&rate.to_be_bytes());
            }
        }
    }
    let len = b.len() - 4;
    if len > MAX_FRAME_BYTES {
        return Err(format!(
            "request of {len} bytes exceeds the {MAX_FRAME_BYTES} byte frame limit"
        ));
    }
    b[..4].copy_from_slice(&(len as u32).to_be_bytes());
    Ok(b)
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!(
                "truncated: needed {n} bytes, {} left",
                self.0.len()
            ));
        }
        let (h, t) = self.0.split_at(n);
        self.0 = t;
        Ok(h)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<usize, String> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().unwrap()) as usize)
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn sized(&mut self) -> Result<&'a [u8], String> {
        let n = self.u32()?;
        self.take(n)
    }
    fn json<T: serde::de::DeserializeOwned>(&mut self) -> Result<T, String> {
        serde_json::from_slice(self.sized()?).map_err(|e| e.to_string())
    }
    /// A `u32` count of items of at least `min_item` bytes each, checked
    /// against what is left so a bad count cannot reserve memory.
    fn count(&mut self, min_item: usize) -> Result<usize, String> {
        let n = self.u32()?;
        if n.saturating_mul(min_item) > self.0.len() {
            return Err(format!("count {n} beyond the payload"));
        }
        Ok(n)
    }
    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.0)
    }
    fn end(&self) -> Result<(), String> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(format!("{} trailing bytes", self.0.len()))
        }
    }
}

/// Decodes a request payload (the frame without its length prefix) into
/// `(from, to, request)`.
pub(crate) fn decode_request(payload: &[u8]) -> Result<(u64, u64, Request), String> {
    let mut r = Reader(payload);
    let version = r.u8()?;
    if version != PROTOCOL_VERSION {
        return Err(format!("unknown protocol version {version}"));
    }
    let kind = r.u8()?;
    let from = r.u64()?;
    let to = r.u64()?;
    let req = match kind {
        KIND_APPEND_ENTRIES => {
            let h: AppendHeader = r.json()?;
            let n = r.count(4)?;
            let mut entries = Vec::with_capacity(n);
            for _ in 0..n {
                entries.push(decode_entry(r.sized()?)?);
            }
            r.end()?;
            Request::AppendEntries(AppendEntriesRequest {
                vote: h.vote,
                prev_log_id: h.prev_log_id,
                entries,
                leader_commit: h.leader_commit,
            })
        }
        KIND_VOTE => Request::Vote(serde_json::from_slice(r.rest()).map_err(|e| e.to_string())?),
        KIND_INSTALL_SNAPSHOT => {
            let h: SnapshotChunkHeader = r.json()?;
            Request::InstallSnapshot(InstallSnapshotRequest {
                vote: h.vote,
                meta: h.meta,
                offset: h.offset,
                data: r.rest().to_vec(),
                done: h.done,
            })
        }
        KIND_CLIENT_WRITE => {
            let n = r.count(4)?;
            let mut values = Vec::with_capacity(n);
            for _ in 0..n {
                values.push(r.sized()?.to_vec());
            }
            r.end()?;
            Request::ClientWrite(values)
        }
        KIND_READ_INDEX => {
            r.end()?;
            Request::ReadIndex
        }
        KIND_BROKER_HEARTBEAT => {
            let broker_id = i32::from_be_bytes(r.take(4)?.try_into().unwrap());
            let want_shutdown = match r.take(1) {
                Ok(flag) => flag[0] != 0,
                Err(_) => false,
            };
            r.end()?;
            Request::BrokerHeartbeat {
                broker_id,
                want_shutdown,
            }
        }
        KIND_JOIN_AS_LEARNER => {
            let node_id = r.u64()?;
            let address = std::str::from_utf8(r.sized()?)
                .map_err(|e| format!("learner address: {e}"))?
                .to_string();
            r.end()?;
            Request::JoinAsLearner { node_id, address }
        }
        KIND_REMOVE_LEARNER => {
            let node_id = r.u64()?;
            r.end()?;
            Request::RemoveLearner { node_id }
        }
        KIND_BROKER_LOAD => {
            let broker_id = i32::from_be_bytes(r.take(4)?.try_into().unwrap());
            let count = r.u32()?;
            // Each entry is 16 bytes: a count the frame cannot hold is
            // refused before anything is allocated for it.
            if count > r.0.len() / 16 {
                return Err(format!("{count} range loads in {} bytes", r.0.len()));
            }
            let mut ranges = Vec::with_capacity(count);
            for _ in 0..count {
                ranges.push((r.u64()?, r.u64()?));
            }
            r.end()?;
            Request::BrokerLoad { broker_id, ranges }
        }
        k => return Err(format!("unknown request kind {k}")),
    };
    Ok((from, to, req))
}

fn encode_response(status: u8, body: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(6 + body.len());
    b.extend_from_slice(&((body.len() + 2) as u32).to_be_bytes());
    b.push(PROTOCOL_VERSION);
    b.push(status);
    b.extend_from_slice(body);
    b
}

fn decode_response(payload: Vec<u8>) -> Result<(u8, Vec<u8>), String> {
    if payload.len() < 2 {
        return Err("truncated response".into());
    }
    if payload[0] != PROTOCOL_VERSION {
        return Err(format!("unknown protocol version {}", payload[0]));
    }
    let status = payload[1];
    if status != STATUS_OK && status != STATUS_ERR {
        return Err(format!("unknown response status {status}"));
    }
    Ok((status, payload[2..].to_vec()))
}

/// Reads one frame. `Ok(None)` on a clean end of stream before a frame
/// starts; a length over [`MAX_FRAME_BYTES`] is an error and nothing is
/// allocated for it (the buffer grows with the bytes that arrive).
/// `idle_timeout` bounds the wait for the frame's first byte,
/// `rest_timeout` the time from there to its end.
async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    idle_timeout: Option<Duration>,
    rest_timeout: Option<Duration>,
) -> std::io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    let first = match idle_timeout {
        Some(t) => tokio::time::timeout(t, r.read(&mut len))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??,
        None => r.read(&mut len).await?,
    };
    if first == 0 {
        return Ok(None);
    }
    let rest = async {
        r.read_exact(&mut len[first..]).await?;
        let n = u32::from_be_bytes(len) as usize;
        if n > MAX_FRAME_BYTES {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("frame of {n} bytes exceeds the {MAX_FRAME_BYTES} byte limit"),
            ));
        }
        let mut buf = Vec::with_capacity(n.min(64 << 10));
        (&mut *r).take(n as u64).read_to_end(&mut buf).await?;
        if buf.len() != n {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(buf)
    };
    let buf = match rest_timeout {
        Some(t) => tokio::time::timeout(t, rest)
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??,
        None => rest.await?,
    };
    Ok(Some(buf))
}

// ---------------------------------------------------------------------------
// Client side

/// Why an exchange with a peer failed.
#[derive(Debug)]
pub(crate) enum CallError {
    /// No connection could be made; the request was not sent.
    Unreachable(std::io::Error),
    /// The connection failed after the request may have been sent.
    Network(std::io::Error),
    /// The deadline passed (the request may have been sent).
    Timeout(Duration),
    /// The peer answered something this build does not read.
    Protocol(String),
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::Unreachable(e) => write!(f, "unreachable: {e}"),
            CallError::Network(e) => write!(f, "network error: {e}"),
            CallError::Timeout(d) => write!(f, "timed out after {d:?}"),
            CallError::Protocol(m) => write!(f, "protocol error: {m}"),
        }
    }
}

#[derive(Default)]
struct DialState {
    failures: u32,
    not_before: Option<Instant>,
}

/// One peer: its address, idle connections (with the time each went idle)
/// and connect backoff.
struct Peer {
    addr: String,
    idle: Mutex<Vec<(Conn, Instant)>>,
    dial: Mutex<DialState>,
    /// Secures each new connection (SSL / SASL controller listener).
    security: Option<Arc<dyn TransportSecurity>>,
}

impl Peer {
    fn new(addr: String, security: Option<Arc<dyn TransportSecurity>>) -> Peer {
        Peer {
            addr,
            idle: Mutex::new(Vec::new()),
            dial: Mutex::new(DialState::default()),
            security,
        }
    }

    /// An idle connection that still looks open (the peer did not close it
    /// while it sat in the pool) and is not about to be closed by it.
    fn take_idle(&self) -> Option<Conn> {
        loop {
            let (conn, since) = self.idle.lock().pop()?;
            if since.elapsed() > CLIENT_MAX_IDLE || !conn.looks_open() {
                continue;
            }
            return Some(conn);
        }
    }

    fn put_idle(&self, conn: Conn) {
        let mut idle = self.idle.lock();
        if idle.len() < MAX_IDLE_PER_PEER {
            idle.push((conn, Instant::now()));
        }
    }

    async fn dial(&self, deadline: Instant) -> Result<Conn, CallError> {
        if self.addr.is_empty() {
            return Err(CallError::Unreachable(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "no controller address for this node",
            )));
        }
        let now = Instant::now();
        if let Some(t) = self.dial.lock().not_before {
            if now < t {
                return Err(CallError::Unreachable(std::io::Error::new(
                    std::io::ErrorKind::NotConnected,
                    format!("{}: backing off after failed connects", self.addr),
                )));
            }
        }
        let limit = deadline.saturating_duration_since(now).min(CONNECT_TIMEOUT);
        // The connection counts once it is secured: a peer that refuses our
        // credentials is as unreachable as one that is down.
        let connect = async {
            let tcp = TcpStream::connect(self.addr.as_str()).await?;
            let _ = tcp.set_nodelay(true);
            match &self.security {
                None => Ok(Conn::Tcp(tcp)),
                Some(security) => security.connect(tcp, &self.addr).await.map(Conn::Secured),
            }
        };
        let res = match tokio::time::timeout(limit, connect).await {
            Ok(r) => r,
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("connect to {} timed out", self.addr),
            )),
        };
        let mut st = self.dial.lock();
        match res {
            Ok(s) => {
                *st = DialState::default();
                Ok(s)
            }
            Err(e) => {
                st.failures = st.failures.saturating_add(1);
                let shift = (st.failures - 1).min(16);
                let wait = DIAL_BACKOFF_BASE
                    .saturating_mul(1u32 << shift)
                    .min(DIAL_BACKOFF_MAX);
                st.not_before = Some(Instant::now() + wait);
                Err(CallError::Unreachable(std::io::Error::new(
                    e.kind(),
                    format!("connect to {}: {e}", self.addr),
                )))
            }
        }
    }

    /// Sends `frame` and reads the reply, on a pooled connection or a new
    /// one. With `idempotent`, a pooled connection that fails is replaced
    /// once by a fresh one (raft RPCs may be repeated safely).
    async fn call(
        &self,
        frame: &[u8],
        timeout: Duration,
        idempotent: bool,
    ) -> Result<(u8, Vec<u8>), CallError> {
        let deadline = Instant::now() + timeout;
        let mut retried = false;
        loop {
            let (mut conn, reused) = match self.take_idle() {
                Some(c) => (c, true),
                None => (self.dial(deadline).await?, false),
            };
            let exchange = async {
                conn.write_all(frame).await?;
                read_frame(&mut conn, None, None)
                    .await?
                    .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))
            };
            match tokio::time::timeout_at(deadline, exchange).await {
                Err(_) => return Err(CallError::Timeout(timeout)),
                Ok(Ok(payload)) => {
                    let reply = decode_response(payload).map_err(CallError::Protocol)?;
                    self.put_idle(conn);
                    return Ok(reply);
                }
                Ok(Err(e)) if reused && idempotent && !retried => {
                    tracing::debug!(peer = %self.addr, "pooled controller connection failed: {e}");
                    retried = true;
                }
                Ok(Err(e)) => return Err(CallError::Network(e)),
            }
        }
    }
}

/// The client side of the transport, shared by the raft network factory and
/// the controller (forwarded writes, read index).
pub(crate) struct Transport {
    node_id: u64,
    voters: BTreeMap<u64, String>,
    peers: Mutex<HashMap<u64, Arc<Peer>>>,
    security: Option<Arc<dyn TransportSecurity>>,
}

impl Transport {
    pub(crate) fn new(
        node_id: u64,
        voters: BTreeMap<u64, String>,
        security: Option<Arc<dyn TransportSecurity>>,
    ) -> Transport {
        Transport {
            node_id,
            voters,
            peers: Mutex::new(HashMap::new()),
            security,
        }
    }

    /// The peer `target`, at its voter-map address or else `fallback` (the
    /// address in the raft membership).
    fn peer(&self, target: u64, fallback: &str) -> Arc<Peer> {
        let addr = self
            .voters
            .get(&target)
            .map(String::as_str)
            .unwrap_or(fallback);
        let mut peers = self.peers.lock();
        match peers.get(&target) {
            Some(p) if p.addr == addr => p.clone(),
            _ => {
                let p = Arc::new(Peer::new(addr.to_string(), self.security.clone()));
                peers.insert(target, p.clone());
                p
            }
        }
    }

    /// What secures this transport's connections (the server uses it too).
    pub(crate) fn security(&self) -> Option<Arc<dyn TransportSecurity>> {
        self.security.clone()
    }

    /// Drops every idle connection (shutdown).
    pub(crate) fn close(&self) {
        for p in self.peers.lock().values() {
            p.idle.lock().clear();
        }
    }

    /// Asks `target` (the leader) to append `values` as one entry.
    pub(crate) async fn forward_write(
        &self,
        target: u64,
        values: &[Vec<u8>],
        timeout: Duration,
    ) -> Result<WriteReply, ServiceCallError> {
        let frame = encode_request(self.node_id, target, &Request::ClientWrite(values.to_vec()))
            .map_err(ServiceCallError::NotSent)?;
        self.service_call(target, &frame, timeout, false).await
    }

    /// Tells `target` (the leader) that broker `broker_id` is alive.
    pub(crate) async fn send_heartbeat(
        &self,
        target: u64,
        broker_id: i32,
        want_shutdown: bool,
        timeout: Duration,
    ) -> Result<(), ServiceCallError> {
        let heartbeat = Request::BrokerHeartbeat {
            broker_id,
            want_shutdown,
        };
        let frame =
            encode_request(self.node_id, target, &heartbeat).map_err(ServiceCallError::NotSent)?;
        self.service_call(target, &frame, timeout, true).await
    }

    /// Tells voter `target` the produce rate of each range broker
    /// `broker_id` leads.
    pub(crate) async fn send_load(
        &self,
        target: u64,
        broker_id: i32,
        ranges: Vec<(u64, u64)>,
        timeout: Duration,
    ) -> Result<(), ServiceCallError> {
        let load = Request::BrokerLoad { broker_id, ranges };
        let frame =
            encode_request(self.node_id, target, &load).map_err(ServiceCallError::NotSent)?;
        self.service_call(target, &frame, timeout, true).await
    }

    /// Asks `target` (the leader) to add `node_id` as a learner listening
    /// at `address` (or to update its address).
    pub(crate) async fn join_as_learner(
        &self,
        target: u64,
        node_id: u64,
        address: &str,
        timeout: Duration,
    ) -> Result<(), ServiceCallError> {
        let join = Request::JoinAsLearner {
            node_id,
            address: address.to_string(),
        };
        let frame =
            encode_request(self.node_id, target, &join).map_err(ServiceCallError::NotSent)?;
        self.service_call(target, &frame, timeout, true).await
    }

    /// Asks `target` (the leader) to remove learner `node_id` from the
    /// membership; `Ok(false)`: it was not a member.
    pub(crate) async fn remove_learner(
        &self,
        target: u64,
        node_id: u64,
        timeout: Duration,
    ) -> Result<bool, ServiceCallError> {
        let remove = Request::RemoveLearner { node_id };
        let frame =
            encode_request(self.node_id, target, &remove).map_err(ServiceCallError::NotSent)?;
        self.service_call(target, &frame, timeout, true).await
    }

    /// Asks `target` (the leader) for its linearizable read index.
    pub(crate) async fn read_index(
        &self,
        target: u64,
        timeout: Duration,
    ) -> Result<Option<u64>, ServiceCallError> {
        let frame = encode_request(self.node_id, target, &Request::ReadIndex)
            .map_err(ServiceCallError::NotSent)?;
        let r: ReadIndexReply = self.service_call(target, &frame, timeout, true).await?;
        Ok(r.index)
    }

    async fn service_call<T: serde::de::DeserializeOwned>(
        &self,
        target: u64,
        frame: &[u8],
        timeout: Duration,
        idempotent: bool,
    ) -> Result<T, ServiceCallError> {
        let peer = self.peer(target, "");
        let (status, body) = match peer.call(frame, timeout, idempotent).await {
            Ok(r) => r,
            Err(CallError::Unreachable(e)) => return Err(ServiceCallError::NotSent(e.to_string())),
            Err(e) => return Err(ServiceCallError::Unknown(e.to_string())),
        };
        if status == STATUS_OK {
            serde_json::from_slice(&body).map_err(|e| ServiceCallError::Unknown(e.to_string()))
        } else {
            match serde_json::from_slice::<ServiceError>(&body) {
                Ok(ServiceError::NotLeader { leader }) => Err(ServiceCallError::NotLeader(leader)),
                Ok(ServiceError::Failed(m)) => Err(ServiceCallError::Failed(m)),
                Err(e) => Err(ServiceCallError::Unknown(e.to_string())),
            }
        }
    }
}

/// Outcome of a failed controller RPC, as the caller must treat it.
#[derive(Debug)]
pub(crate) enum ServiceCallError {
    /// The peer is not the leader (`Some`: who is); nothing was done.
    NotLeader(Option<u64>),
    /// The request never left this node.
    NotSent(String),
    /// The peer reported an error.
    Failed(String),
    /// The request may or may not have been carried out.
    Unknown(String),
}

impl fmt::Display for ServiceCallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServiceCallError::NotLeader(l) => write!(f, "not the leader (leader: {l:?})"),
            ServiceCallError::NotSent(m) => write!(f, "not sent: {m}"),
            ServiceCallError::Failed(m) => write!(f, "failed on the leader: {m}"),
            ServiceCallError::Unknown(m) => write!(f, "outcome unknown: {m}"),
        }
    }
}

/// Creates one [`PeerClient`] per peer openraft talks to; the clients share
/// each peer's connections.
pub struct NetworkFactory {
    transport: Arc<Transport>,
}

impl NetworkFactory {
    pub(crate) fn new(transport: Arc<Transport>) -> NetworkFactory {
        NetworkFactory { transport }
    }
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerClient;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> Self::Network {
        PeerClient {
            from: self.transport.node_id,
            target,
            peer: self.transport.peer(target, &node.addr),
        }
    }
}

/// openraft's client to one peer over the TCP transport.
pub struct PeerClient {
    from: u64,
    target: u64,
    peer: Arc<Peer>,
}

type RpcErr<E = openraft::error::Infallible> = RPCError<u64, BasicNode, RaftError<u64, E>>;

impl PeerClient {
    async fn rpc<T, E>(
        &self,
        action: RPCTypes,
        frame: Result<Vec<u8>, String>,
        option: &RPCOption,
    ) -> Result<T, RpcErr<E>>
    where
        T: serde::de::DeserializeOwned,
        E: std::error::Error + serde::de::DeserializeOwned,
    {
        let frame =
            frame.map_err(|m| RPCError::Network(NetworkError::new(&std::io::Error::other(m))))?;
        // Answer before openraft's hard deadline drops the future, so the
        // error says what happened.
        let ttl = option.soft_ttl();
        let (status, body) = self
            .peer
            .call(&frame, ttl, true)
            .await
            .map_err(|e| match e {
                CallError::Unreachable(e) => RPCError::Unreachable(Unreachable::new(&e)),
                CallError::Network(e) => RPCError::Network(NetworkError::new(&e)),
                CallError::Timeout(timeout) => RPCError::Timeout(Timeout {
                    action,
                    id: self.from,
                    target: self.target,
                    timeout,
                }),
                CallError::Protocol(m) => {
                    RPCError::Network(NetworkError::new(&std::io::Error::other(m)))
                }
            })?;
        let bad = |e: serde_json::Error| RPCError::Network(NetworkError::new(&e));
        if status == STATUS_OK {
            return serde_json::from_slice(&body).map_err(bad);
        }
        match serde_json::from_slice::<RaftError<u64, E>>(&body).map_err(bad)? {
            // The peer's raft is not running (shutting down, or stopped on an
            // error): to this node it is as good as unreachable.
            RaftError::Fatal(f) => Err(RPCError::Unreachable(Unreachable::new(&f))),
            e @ RaftError::APIError(_) => {
                Err(RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
        }
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RpcErr> {
        let n = rpc.entries.len();
        let frame = encode_request(self.from, self.target, &Request::AppendEntries(rpc));
        if frame.is_err() && n > 1 {
            // Too large for one frame: openraft retries with fewer entries.
            return Err(RPCError::PayloadTooLarge(
                PayloadTooLarge::new_entries_hint((n / 2) as u64),
            ));
        }
        self.rpc(RPCTypes::AppendEntries, frame, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<u64>, RpcErr<InstallSnapshotError>> {
        let frame = encode_request(self.from, self.target, &Request::InstallSnapshot(rpc));
        self.rpc(RPCTypes::InstallSnapshot, frame, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RpcErr> {
        let frame = encode_request(self.from, self.target, &Request::Vote(rpc));
        self.rpc(RPCTypes::Vote, frame, &option).await
    }

    fn backoff(&self) -> Backoff {
        Backoff::new((0u32..).map(|i| {
            RAFT_BACKOFF_BASE
                .saturating_mul(1u32 << i.min(16))
                .min(RAFT_BACKOFF_MAX)
        }))
    }
}

// ---------------------------------------------------------------------------
// Server side

/// Serves this controller's address: every connection reads request frames
/// and answers each in turn. Aborting the returned task closes the listener
/// and every connection.
pub(crate) fn spawn_server(
    listener: TcpListener,
    node_id: u64,
    raft: MetadataRaft,
    heartbeats: Arc<Heartbeats>,
    security: Option<Arc<dyn TransportSecurity>>,
    images: watch::Receiver<Arc<MetadataImage>>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let slots = Arc::new(Semaphore::new(SERVER_MAX_CONNECTIONS));
        let mut conns = JoinSet::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let Ok(slot) = slots.clone().try_acquire_owned() else {
                            tracing::warn!(%peer, "too many controller connections; closing");
                            continue;
                        };
                        let _ = stream.set_nodelay(true);
                        let raft = raft.clone();
                        let heartbeats = heartbeats.clone();
                        let security = security.clone();
                        let image = images.borrow().clone();
                        conns.spawn(async move {
                            if let Some(conn) = admit(stream, peer, security, image).await {
                                serve_connection(conn, peer, node_id, raft, heartbeats).await;
                            }
                            drop(slot);
                        });
                    }
                    Err(e) => {
                        // E.g. out of file descriptors: wait, do not spin.
                        tracing::warn!("controller accept: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
    })
}

/// A connection secured as the controller listener asks, or `None` when
/// its peer is not admitted (logged, and the connection closed unread).
async fn admit(
    stream: TcpStream,
    peer: std::net::SocketAddr,
    security: Option<Arc<dyn TransportSecurity>>,
    image: Arc<MetadataImage>,
) -> Option<Conn> {
    let Some(security) = security else {
        return Some(Conn::Tcp(stream));
    };
    match tokio::time::timeout(SERVER_FRAME_TIMEOUT, security.accept(stream, image)).await {
        Ok(Ok(conn)) => Some(Conn::Secured(conn)),
        Ok(Err(reason)) => {
            tracing::info!(%peer, %reason, "controller connection refused");
            None
        }
        Err(_) => {
            tracing::info!(%peer, "controller connection refused: authentication timed out");
            None
        }
    }
}

async fn serve_connection(
    mut stream: Conn,
    peer: std::net::SocketAddr,
    node_id: u64,
    raft: MetadataRaft,
    heartbeats: Arc<Heartbeats>,
) {
    loop {
        let read = read_frame(
            &mut stream,
            Some(SERVER_IDLE_TIMEOUT),
            Some(SERVER_FRAME_TIMEOUT),
        );
        let payload = match read.await {
            Ok(Some(p)) => p,
            Ok(None) => return,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                tracing::debug!(%peer, "controller connection idle or stalled; closing");
                return;
            }
            Err(e) => {
                tracing::warn!(%peer, "controller connection: bad frame: {e}; closing");
                return;
            }
        };
        let (from, to, req) = match decode_request(&payload) {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(%peer, "controller connection: malformed request: {e}; closing");
                return;
            }
        };
        if to != node_id {
            tracing::warn!(%peer, from, to, node_id, "request for another controller; closing");
            return;
        }
        let (status, body) = handle(&raft, &heartbeats, req).await;
        let out = encode_response(status, &body);
        match tokio::time::timeout(SERVER_FRAME_TIMEOUT, stream.write_all(&out)).await {
            Ok(Ok(())) => {}
            _ => return,
        }
    }
}

fn reply<T: serde::Serialize, E: serde::Serialize>(r: Result<T, E>) -> (u8, Vec<u8>) {
    let (status, body) = match r {
        Ok(v) => (STATUS_OK, serde_json::to_vec(&v)),
        Err(e) => (STATUS_ERR, serde_json::to_vec(&e)),
    };
    match body {
        Ok(b) => (status, b),
        Err(e) => (
            STATUS_ERR,
            serde_json::to_vec(&ServiceError::Failed(e.to_string())).unwrap_or_default(),
        ),
    }
}

async fn handle(raft: &MetadataRaft, heartbeats: &Heartbeats, req: Request) -> (u8, Vec<u8>) {
    match req {
        Request::BrokerHeartbeat {
            broker_id,
            want_shutdown,
        } => {
            // Every voter records it (a new leader knows who is alive).
            heartbeats.record(broker_id, want_shutdown);
            reply(Ok::<(), ServiceError>(()))
        }
        Request::AppendEntries(r) => reply(raft.append_entries(r).await),
        Request::Vote(r) => reply(raft.vote(r).await),
        Request::InstallSnapshot(r) => reply(raft.install_snapshot(r).await),
        Request::ClientWrite(values) => reply(client_write(raft, values).await),
        Request::ReadIndex => reply(read_index(raft).await),
        Request::JoinAsLearner { node_id, address } => {
            reply(join_as_learner(raft, node_id, address).await)
        }
        Request::RemoveLearner { node_id } => reply(remove_learner(raft, node_id).await),
        Request::BrokerLoad { broker_id, ranges } => {
            heartbeats.record_load(broker_id, ranges);
            reply(Ok::<(), ServiceError>(()))
        }
    }
}

/// The membership in effect on this node.
async fn effective_membership(
    raft: &MetadataRaft,
) -> Result<openraft::Membership<u64, BasicNode>, ServiceError> {
    raft.with_raft_state(|s| s.membership_state.effective().membership().clone())
        .await
        .map_err(|f| ServiceError::Failed(fatal_text(&f)))
}

/// A failed write to the raft log (records, or a membership change) as the
/// service answers it: forwarded to the leader it names, or failed.
fn client_write_error(
    e: RaftError<u64, openraft::error::ClientWriteError<u64, BasicNode>>,
) -> ServiceError {
    match e {
        RaftError::APIError(openraft::error::ClientWriteError::ForwardToLeader(f)) => {
            ServiceError::NotLeader {
                leader: f.leader_id,
            }
        }
        RaftError::APIError(e) => ServiceError::Failed(e.to_string()),
        RaftError::Fatal(f) => ServiceError::Failed(fatal_text(&f)),
    }
}

/// On the leader: adds `node_id` as a learner at `address`, or updates the
/// address of a learner that restarted elsewhere; nothing to write when the
/// membership already says so. A voter's id is refused.
async fn join_as_learner(
    raft: &MetadataRaft,
    node_id: u64,
    address: String,
) -> Result<(), ServiceError> {
    let membership = effective_membership(raft).await?;
    if membership.voter_ids().any(|v| v == node_id) {
        return Err(ServiceError::Failed(format!(
            "{REFUSED}node id {node_id} is a controller voter; a broker-only node needs an id of its own"
        )));
    }
    let node = BasicNode::new(&address);
    let result = match membership.get_node(&node_id) {
        Some(known) if known.addr == address => {
            // Already a learner there; only confirm this node still leads.
            return read_index(raft).await.map(|_| ());
        }
        Some(_) => {
            let change = openraft::ChangeMembers::SetNodes(std::collections::BTreeMap::from([(
                node_id, node,
            )]));
            raft.change_membership(change, true).await
        }
        None => raft.add_learner(node_id, node, false).await,
    };
    match result {
        Ok(_) => {
            tracing::info!("metadata learner {node_id} at {address} added");
            Ok(())
        }
        Err(e) => Err(client_write_error(e)),
    }
}

/// On the leader: removes learner `node_id` from the membership (the
/// reverse of [`join_as_learner`]; openraft's `ChangeMembers::RemoveNodes`).
/// `Ok(false)`: it was not a member (this node still confirms it leads). A
/// voter's id is refused: the voter set is static.
pub(crate) async fn remove_learner(
    raft: &MetadataRaft,
    node_id: u64,
) -> Result<bool, ServiceError> {
    let membership = effective_membership(raft).await?;
    if membership.voter_ids().any(|v| v == node_id) {
        return Err(ServiceError::Failed(format!(
            "{REFUSED}node id {node_id} is a controller voter; the voter set is static"
        )));
    }
    if membership.get_node(&node_id).is_none() {
        return read_index(raft).await.map(|_| false);
    }
    let change = openraft::ChangeMembers::RemoveNodes(std::collections::BTreeSet::from([node_id]));
    match raft.change_membership(change, false).await {
        Ok(_) => {
            tracing::info!("metadata learner {node_id} removed from the membership");
            Ok(true)
        }
        Err(e) => Err(client_write_error(e)),
    }
}

async fn client_write(
    raft: &MetadataRaft,
    values: Vec<Vec<u8>>,
) -> Result<WriteReply, ServiceError> {
    // The sender validated the records; check again that they decode, as a
    // committed record that does not stops every controller.
    for (i, v) in values.iter().enumerate() {
        if let Err(e) = MetadataRecord::decode(v) {
            return Err(ServiceError::Failed(format!(
                "record {i} does not decode: {e}"
            )));
        }
    }
    match raft.client_write(MetadataBatch { records: values }).await {
        Ok(resp) => Ok(WriteReply {
            offset: resp.log_id.index,
            skipped: resp.data.skipped,
        }),
        Err(e) => Err(client_write_error(e)),
    }
}

async fn read_index(raft: &MetadataRaft) -> Result<ReadIndexReply, ServiceError> {
    match raft.ensure_linearizable().await {
        Ok(log_id) => Ok(ReadIndexReply {
            index: log_id.map(|l| l.index),
        }),
        Err(RaftError::APIError(openraft::error::CheckIsLeaderError::ForwardToLeader(f))) => {
            Err(ServiceError::NotLeader {
                leader: f.leader_id,
            })
        }
        Err(RaftError::APIError(e)) => Err(ServiceError::Failed(e.to_string())),
        Err(RaftError::Fatal(f)) => Err(ServiceError::Failed(fatal_text(&f))),
    }
}

fn fatal_text(f: &Fatal<u64>) -> String {
    format!("controller stopped: {f}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, Entry, EntryPayload, StoredMembership};

    fn entry(index: u64) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(3, 2), index),
            payload: EntryPayload::Normal(MetadataBatch {
                records: vec![MetadataRecord::NoOp.encode(), vec![1, 2, 3]],
            }),
        }
    }

    fn payload(frame: &[u8]) -> &[u8] {
        let n = u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize;
        assert_eq!(n, frame.len() - 4);
        &frame[4..]
    }

    #[test]
    fn requests_round_trip() {
        let vote = Vote::new_committed(3, 2);
        let ae = AppendEntriesRequest::<TypeConfig> {
            vote,
            prev_log_id: Some(LogId::new(CommittedLeaderId::new(2, 1), 9)),
            entries: vec![entry(10), entry(11)],
            leader_commit: Some(LogId::new(CommittedLeaderId::new(2, 1), 8)),
        };
        let f = encode_request(2, 7, &Request::AppendEntries(ae.clone())).unwrap();
        match decode_request(payload(&f)).unwrap() {
            (2, 7, Request::AppendEntries(back)) => {
                assert_eq!(back.vote, ae.vote);
                assert_eq!(back.prev_log_id, ae.prev_log_id);
                assert_eq!(back.leader_commit, ae.leader_commit);
                assert_eq!(back.entries, ae.entries);
            }
            other => panic!("{other:?}"),
        }

        let is = InstallSnapshotRequest::<TypeConfig> {
            vote,
            meta: SnapshotMeta {
                last_log_id: Some(LogId::new(CommittedLeaderId::new(3, 2), 40)),
                last_membership: StoredMembership::default(),
                snapshot_id: "s-1".into(),
            },
            offset: 100,
            data: vec![9; 300],
            done: true,
        };
        let f = encode_request(2, 7, &Request::InstallSnapshot(is.clone())).unwrap();
        match decode_request(payload(&f)).unwrap() {
            (_, _, Request::InstallSnapshot(back)) => assert_eq!(back, is),
            other => panic!("{other:?}"),
        }

        let v = VoteRequest::new(vote, None);
        let f = encode_request(2, 7, &Request::Vote(v.clone())).unwrap();
        assert!(matches!(decode_request(payload(&f)).unwrap(), (_, _, Request::Vote(b)) if b == v));

        let values = vec![vec![1u8, 2], vec![], vec![3]];
        let f = encode_request(2, 7, &Request::ClientWrite(values.clone())).unwrap();
        assert!(
            matches!(decode_request(payload(&f)).unwrap(), (_, _, Request::ClientWrite(b)) if b == values)
        );
        let hb = |want_shutdown| Request::BrokerHeartbeat {
            broker_id: -3,
            want_shutdown,
        };
        let f = encode_request(2, 7, &hb(true)).unwrap();
        assert!(matches!(
            decode_request(payload(&f)).unwrap(),
            (
                2,
                7,
                Request::BrokerHeartbeat {
                    broker_id: -3,
                    want_shutdown: true
                }
            )
        ));
        let f = encode_request(2, 7, &hb(true)).unwrap();
        let mut short = payload(&f).to_vec();
        short.pop(); // without the flag: a plain heartbeat (older nodes)
        assert!(matches!(
            decode_request(&short).unwrap(),
            (
                2,
                7,
                Request::BrokerHeartbeat {
                    broker_id: -3,
                    want_shutdown: false
                }
            )
        ));
        short.pop();
        assert!(decode_request(&short).is_err());
        let f = encode_request(2, 7, &Request::ReadIndex).unwrap();
        assert!(matches!(
            decode_request(payload(&f)).unwrap(),
            (2, 7, Request::ReadIndex)
        ));
        let ranges = vec![(4u64, 1_000_000u64), (u64::MAX, 0)];
        let load = Request::BrokerLoad {
            broker_id: 3,
            ranges: ranges.clone(),
        };
        let f = encode_request(2, 7, &load).unwrap();
        assert!(matches!(
            decode_request(payload(&f)).unwrap(),
            (2, 7, Request::BrokerLoad { broker_id: 3, ranges: back }) if back == ranges
        ));
        // A count larger than the frame holds, or a cut entry, is refused.
        let mut lying = payload(&f).to_vec();
        let at = lying.len() - 2 * 16 - 4;
        lying[at..at + 4].copy_from_slice(&1_000_000u32.to_be_bytes());
        assert!(decode_request(&lying).is_err());
        let mut cut = payload(&f).to_vec();
        cut.pop();
        assert!(decode_request(&cut).is_err());
    }

    #[test]
    fn malformed_requests_are_errors() {
        let good =
            encode_request(1, 2, &Request::ClientWrite(vec![vec![5; 10], vec![6; 10]])).unwrap();
        let p = payload(&good);
        // Every truncation and every single-byte version/kind change fails
        // cleanly (no panic).
        for n in 0..p.len() {
            assert!(decode_request(&p[..n]).is_err(), "truncated at {n}");
        }
        let mut bad = p.to_vec();
        bad[0] = 9;
        assert!(decode_request(&bad).is_err());
        let mut bad = p.to_vec();
        bad[1] = 77;
        assert!(decode_request(&bad).is_err());
        // A huge count is refused before anything is reserved.
        let mut bad = p[..18].to_vec();
        bad.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(decode_request(&bad).is_err());
        // Trailing bytes.
        let mut bad = p.to_vec();
        bad.push(0);
        assert!(decode_request(&bad).is_err());
    }

    #[tokio::test]
    async fn oversized_frames_are_refused_unread() {
        let mut input: &[u8] = &[0xff, 0xff, 0xff, 0xff, 1, 2, 3];
        let err = read_frame(&mut input, None, None).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
        let mut input: &[u8] = &[0, 0, 0, 5, 1, 2];
        assert!(read_frame(&mut input, None, None).await.is_err());
        let mut input: &[u8] = &[];
        assert!(read_frame(&mut input, None, None).await.unwrap().is_none());
        let mut input: &[u8] = &[0, 0, 0, 2, 7, 8];
        assert_eq!(
            read_frame(&mut input, None, None).await.unwrap().unwrap(),
            vec![7, 8]
        );
    }

    #[test]
    fn raft_backoff_grows_and_is_bounded() {
        let client = PeerClient {
            from: 1,
            target: 2,
            peer: Arc::new(Peer::new(String::new(), None)),
        };
        let waits: Vec<_> = client.backoff().take(10).collect();
        assert_eq!(waits[0], RAFT_BACKOFF_BASE);
        assert!(waits.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(*waits.last().unwrap(), RAFT_BACKOFF_MAX);
    }
}
