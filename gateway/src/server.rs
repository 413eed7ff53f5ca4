//! The Kafka listener: framing with a size cap, pipelined requests on one
//! connection answered in request order, and graceful shutdown. What a
//! connection may hold is bounded: `max.connections` /
//! `max.connections.per.ip` at accept, `connections.max.idle.ms` for a
//! connection that completes no request (idle, or trickling one byte by
//! byte), `sasl.server.max.receive.size` before authentication, and a
//! frame's buffer grows with the bytes that arrive, not with the size the
//! client announced.

use std::sync::Arc;

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use crate::api::{self, Reply};
use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::connection_limits::ConnectionLimits;
use crate::inter_broker::admission::{admit_replication, Peer};
use crate::listeners::Listener;
use crate::metrics::Metrics;
use crate::request_context::Connection;
use crate::sasl::{Action, Authenticator, Event};
use crate::tls::ListenerTls;

/// Requests one connection may have in flight before we stop reading from it.
const MAX_IN_FLIGHT: usize = 256;

/// A TLS handshake not done within this is dropped (a slow or plaintext
/// client on a TLS port holds nothing for longer).
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Kafka's principal of a connection nobody authenticated.
const ANONYMOUS: &str = "User:ANONYMOUS";

/// A frame's buffer starts at most this large and doubles as bytes arrive:
/// the usual request (a produce of up to `message.max.bytes`) is allocated
/// once, while a client announcing a huge frame holds no more than this
/// until it actually sends the bytes.
const FIRST_FRAME_BUFFER: usize = 1024 * 1024;

/// Accepts connections until `shutdown` turns true; returns the handles of
/// the live connections so the caller can let them finish.
/// `inter_broker`: this is the inter-broker listener, which does not wait
/// for `max.connections`.
pub async fn serve(
    listener: TcpListener,
    spec: Arc<Listener>,
    tls: Option<Arc<ListenerTls>>,
    broker: Arc<Broker>,
    limits: Arc<ConnectionLimits>,
    inter_broker: bool,
    mut shutdown: watch::Receiver<bool>,
) -> Vec<JoinHandle<()>> {
    let mut connections = Vec::new();
    loop {
        // At max.connections, accept nothing until a connection closes.
        let permit = if inter_broker {
            None
        } else {
            tokio::select! {
                permit = limits.wait_for_capacity() => Some(permit),
                _ = shutdown.changed() => return connections,
            }
        };
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let Some(slot) = limits.admit(peer.ip(), permit) else {
                        Metrics::add(&broker.metrics().connections_rejected, 1);
                        tracing::info!(%peer, listener = %spec.name, limit = limits.limit_for(peer.ip()), "closing connection: its address is at max.connections.per.ip");
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    Metrics::add(&broker.metrics().connections_opened, 1);
                    tracing::debug!(%peer, "connection accepted");
                    connections.retain(|c: &JoinHandle<()>| !c.is_finished());
                    let (spec, broker, shutdown) = (spec.clone(), broker.clone(), shutdown.clone());
                    // The listener's certificates as of now (they may rotate).
                    let tls = match &tls {
                        None => None,
                        Some(t) => match t.acceptor(&spec.name) {
                            Some(acceptor) => Some(acceptor),
                            None => {
                                tracing::error!(listener = %spec.name, "no TLS configuration for a TLS listener; closing connection");
                                continue;
                            }
                        },
                    };
                    connections.push(tokio::spawn(async move {
                        let _slot = slot; // held for the connection's life
                        match tls {
                            None => plain_connection(stream, spec, broker, shutdown).await,
                            Some(acceptor) => tls_connection(acceptor, stream, spec, broker, shutdown).await,
                        }
                    }));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            _ = shutdown.changed() => return connections,
        }
    }
}

/// The in-flight responses of a connection and the task writing them,
/// which gives the writer back when the channel closes cleanly.
type Responses<W> = (mpsc::Sender<JoinHandle<Reply>>, JoinHandle<Option<W>>);

async fn plain_connection(
    stream: TcpStream,
    spec: Arc<Listener>,
    broker: Arc<Broker>,
    shutdown: watch::Receiver<bool>,
) {
    let peer = stream.peer_addr().ok();
    let (reader, writer) = stream.into_split();
    connection(reader, writer, peer, None, spec, broker, shutdown).await
}

async fn tls_connection(
    acceptor: TlsAcceptor,
    stream: TcpStream,
    spec: Arc<Listener>,
    broker: Arc<Broker>,
    shutdown: watch::Receiver<bool>,
) {
    let peer = stream.peer_addr().ok();
    let tls = match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            // A plaintext client on a TLS port ends here (its first bytes
            // are not a TLS record), as does a client certificate refused.
            Metrics::add(&broker.metrics().tls_handshake_failures, 1);
            Metrics::add(&broker.metrics().connections_closed, 1);
            tracing::info!(?peer, listener = %spec.name, error = %e, "TLS handshake failed; closing connection");
            return;
        }
        Err(_) => {
            Metrics::add(&broker.metrics().tls_handshake_failures, 1);
            Metrics::add(&broker.metrics().connections_closed, 1);
            tracing::info!(?peer, listener = %spec.name, "TLS handshake timed out; closing connection");
            return;
        }
    };
    let principal = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|certs| certs.first())
        .and_then(|cert| crate::tls::principal_of(cert));
    if let Some(p) = &principal {
        tracing::debug!(?peer, principal = %p, "client certificate");
    }
    let (reader, writer) = tokio::io::split(tls);
    connection(reader, writer, peer, principal, spec, broker, shutdown).await
}

#[allow(clippy::too_many_arguments)]
async fn connection<R, W>(
    mut reader: R,
    writer: W,
    peer: Option<std::net::SocketAddr>,
    tls_principal: Option<String>,
    spec: Arc<Listener>,
    broker: Arc<Broker>,
    mut shutdown: watch::Receiver<bool>,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let max = broker.config().socket_request_max_bytes;
    let idle = Duration::from_millis(broker.config().connections_max_idle_ms);
    let mut responses: Option<Responses<W>> = None;
    let mut writer = Some(writer);
    // SASL listeners authenticate before anything else is served.
    let mut auth = spec.protocol.is_sasl().then(Authenticator::default);
    // The principal until SASL names one: the client certificate's, else
    // Kafka's ANONYMOUS.
    let mut context = Connection {
        listener: spec.clone(),
        principal: Some(Arc::from(tls_principal.as_deref().unwrap_or(ANONYMOUS))),
        peer,
        throttle: Arc::default(),
    };
    loop {
        // Before authentication a frame may be no larger than Kafka's
        // sasl.server.max.receive.size.
        let (limit, limit_key) = match &auth {
            Some(a) if !a.is_done() => (
                broker.config().sasl_server_max_receive_size.min(max),
                "sasl.server.max.receive.size",
            ),
            _ => (max, "socket.request.max.bytes"),
        };
        let mut started = false;
        let frame = tokio::select! {
            frame = tokio::time::timeout(idle, read_frame(&mut reader, limit, limit_key, &mut started)) => frame,
            _ = shutdown.changed() => break,
        };
        let frame = match frame {
            Ok(Ok(Some(frame))) => frame,
            Ok(Ok(None)) => break,
            Ok(Err(reason)) => {
                Metrics::add(&broker.metrics().rejected_frames, 1);
                tracing::info!(?peer, %reason, "closing connection");
                break;
            }
            Err(_) => {
                Metrics::add(&broker.metrics().connections_idle_closed, 1);
                if started {
                    tracing::info!(?peer, listener = %spec.name, idle_ms = idle.as_millis() as u64, "closing connection: a request was not completed within connections.max.idle.ms");
                } else {
                    tracing::debug!(?peer, listener = %spec.name, idle_ms = idle.as_millis() as u64, "closing idle connection (connections.max.idle.ms)");
                }
                break;
            }
        };
        // A throttled client's connection is muted (KIP-219): its next
        // request waits, unread as far as handling goes, until the mute ends.
        if let Some(until) = context.throttle.muted_until() {
            tokio::select! {
                _ = tokio::time::sleep_until(until.into()) => {}
                _ = shutdown.changed() => break,
            }
        }
        // Another broker opening a replication stream (a request with the
        // private api key): admitted only as a broker (the inter-broker
        // listener, authenticated, CLUSTER_ACTION), the connection is the
        // stream's once every earlier response is written; anyone else is
        // disconnected.
        if is_replication_upgrade(&frame) {
            let now = tessera_log::range_log::now_ms();
            let admitted = admit_replication(Peer {
                on_inter_broker_listener: spec.name
                    == broker.config().listeners[broker.config().inter_broker_listener].name,
                authenticated: auth.as_ref().is_none_or(|a| {
                    a.is_done() && a.session_expires_ms.is_none_or(|end| now < end)
                }),
                cluster_action: Authz::for_connection(&broker, &context)
                    .allows_cluster(Op::ClusterAction),
            });
            if let Err(refusal) = admitted {
                Metrics::add(&broker.metrics().replication_upgrades_refused, 1);
                tracing::info!(?peer, listener = %spec.name, principal = context.principal.as_deref().unwrap_or(ANONYMOUS), %refusal, "replication upgrade refused; closing connection");
                break;
            }
            let writer = match (writer.take(), responses.take()) {
                (Some(w), _) => Some(w),
                (None, Some((tx, task))) => {
                    drop(tx);
                    task.await.ok().flatten()
                }
                (None, None) => None,
            };
            if let Some(writer) = writer {
                // A stream never ends by itself: shutdown ends it, and so
                // does the end of its SASL session (the primary reconnects
                // and authenticates again).
                let session_end = auth.as_ref().and_then(|a| a.session_expires_ms);
                tokio::select! {
                    _ = broker.serve_replication(reader, writer) => {}
                    _ = shutdown.changed() => {}
                    _ = until_ms(session_end) => {
                        tracing::info!(?peer, listener = %spec.name, "closing replication stream: its SASL session expired");
                    }
                }
            }
            Metrics::add(&broker.metrics().connections_closed, 1);
            return;
        }
        // Each request is handled in its own task; the writer awaits them in
        // arrival order, so pipelined responses go back in request order.
        let (tx, _) = responses.get_or_insert_with(|| {
            let (tx, rx) = mpsc::channel::<JoinHandle<Reply>>(MAX_IN_FLIGHT);
            let writer = writer.take().expect("the writer is taken once");
            (tx, tokio::spawn(write_responses(writer, rx)))
        });
        if let Some(authenticator) = auth.as_mut() {
            let (action, event) = authenticator.on_frame(
                &frame,
                &spec,
                &broker.image(),
                tessera_log::range_log::now_ms(),
            );
            if let Some(event) = event {
                record_authentication(&broker, &spec, peer, event);
            }
            if authenticator.is_done() {
                context.principal = authenticator.principal.clone().map(Arc::from);
            }
            match action {
                Action::Dispatch => {}
                Action::Reply(bytes) => {
                    if tx
                        .send(tokio::spawn(async move { Reply::Frame(bytes) }))
                        .await
                        .is_err()
                    {
                        break;
                    }
                    continue;
                }
                Action::Close { reply, reason } => {
                    if let Some(bytes) = reply {
                        let _ = tx
                            .send(tokio::spawn(async move { Reply::Frame(bytes) }))
                            .await;
                    }
                    let _ = tx
                        .send(tokio::spawn(async move { Reply::Close(reason) }))
                        .await;
                    break;
                }
            }
        }
        // In request order: decode, and a produce's appends; the rest runs concurrently.
        let in_flight = api::start_frame(&broker, frame, Some(context.clone())).await;
        let handle = tokio::spawn(in_flight);
        if tx.send(handle).await.is_err() {
            break;
        }
    }
    if let Some((tx, writer_task)) = responses {
        drop(tx);
        let _ = writer_task.await;
    }
    Metrics::add(&broker.metrics().connections_closed, 1);
}

/// Counts an authentication and logs a failure (Kafka logs failed
/// authentications at INFO with the client's address).
fn record_authentication(
    broker: &Broker,
    listener: &Listener,
    peer: Option<std::net::SocketAddr>,
    event: Event,
) {
    let metrics = &broker.metrics();
    match event {
        Event::Succeeded {
            user,
            mechanism,
            reauthentication,
        } => {
            if reauthentication {
                Metrics::add(&metrics.reauthentications_succeeded, 1);
            } else {
                Metrics::add(&metrics.authentications_succeeded, 1);
            }
            tracing::debug!(?peer, listener = %listener.name, %user, mechanism, reauthentication, "authenticated");
        }
        Event::Failed {
            user,
            mechanism,
            reason,
            reauthentication,
        } => {
            if reauthentication {
                Metrics::add(&metrics.reauthentications_failed, 1);
            } else {
                Metrics::add(&metrics.authentications_failed, 1);
            }
            tracing::warn!(
                ?peer,
                listener = %listener.name,
                user = user.as_deref().unwrap_or(""),
                %mechanism,
                %reason,
                reauthentication,
                "failed authentication"
            );
        }
        Event::SessionExpired { principal } => {
            Metrics::add(&metrics.expired_sessions_killed, 1);
            tracing::info!(?peer, listener = %listener.name, %principal, "closing connection: SASL session expired without re-authentication (connections.max.reauth.ms)");
        }
    }
}

/// Waits until `end_ms` (ms since the epoch); forever without one.
async fn until_ms(end_ms: Option<i64>) {
    match end_ms {
        Some(end) => {
            let left = end.saturating_sub(tessera_log::range_log::now_ms()).max(0);
            tokio::time::sleep(Duration::from_millis(left as u64)).await
        }
        None => std::future::pending().await,
    }
}

fn is_replication_upgrade(frame: &[u8]) -> bool {
    frame.len() >= 2
        && i16::from_be_bytes([frame[0], frame[1]])
            == tessera_replication::protocol::UPGRADE_API_KEY
}

/// Writes the responses in request order; gives the writer back when the
/// channel closes with every response written (`None` after a failed
/// write or a close).
async fn write_responses<W: AsyncWrite + Unpin>(
    writer: W,
    mut rx: mpsc::Receiver<JoinHandle<Reply>>,
) -> Option<W> {
    use tokio::sync::mpsc::error::TryRecvError;
    let mut writer = BufWriter::with_capacity(64 * 1024, writer);
    loop {
        // Responses that are already done share one write; before waiting on
        // anything (the next request, or a handler still running) flush what
        // is buffered, so no response waits behind a slower later one.
        let handle = match rx.try_recv() {
            Ok(handle) => handle,
            Err(TryRecvError::Disconnected) => break,
            Err(TryRecvError::Empty) => {
                if writer.flush().await.is_err() {
                    return None;
                }
                match rx.recv().await {
                    Some(handle) => handle,
                    None => break,
                }
            }
        };
        if !handle.is_finished() && writer.flush().await.is_err() {
            return None;
        }
        let reply = match handle.await {
            Ok(reply) => reply,
            Err(e) => Reply::Close(format!("request handler failed: {e}")),
        };
        match reply {
            Reply::Frame(bytes) => {
                if writer.write_all(&bytes).await.is_err() {
                    return None;
                }
            }
            Reply::Chunks(chunks) => {
                // Small chunks gather in the buffer; a chunk larger than it
                // goes to the socket straight from the buffer it was read into.
                for chunk in chunks {
                    if writer.write_all(&chunk).await.is_err() {
                        return None;
                    }
                }
            }
            Reply::Nothing => {}
            Reply::Close(reason) => {
                tracing::info!(%reason, "closing connection");
                let _ = writer.flush().await;
                let _ = writer.shutdown().await;
                return None;
            }
        }
    }
    writer.flush().await.ok()?;
    Some(writer.into_inner())
}

/// Reads one size-prefixed frame. `Ok(None)` on a clean end of stream; an
/// error when the size is negative or over `max` (refused before anything
/// is allocated, as Kafka does; `key` names the limit), or the stream ends
/// mid-frame. `started` turns true with the first byte, so a caller that
/// gives up waiting can tell an idle client from a slow one. The buffer
/// grows as bytes arrive: announcing a large frame costs nothing until it
/// is sent.
pub(crate) async fn read_frame<R: AsyncRead + Unpin + ?Sized>(
    reader: &mut R,
    max: usize,
    key: &str,
    started: &mut bool,
) -> Result<Option<Bytes>, String> {
    let mut size = [0u8; 4];
    let mut have = 0;
    while have < 4 {
        match reader.read(&mut size[have..]).await {
            Ok(0) if have == 0 => return Ok(None),
            Ok(0) => return Err("truncated frame: the stream ended in its size".into()),
            Ok(n) => {
                have += n;
                *started = true;
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    let size = i32::from_be_bytes(size);
    if size < 0 || size as usize > max {
        return Err(format!("invalid request size {size} ({key} is {max})"));
    }
    let size = size as usize;
    let mut buf = BytesMut::with_capacity(size.min(FIRST_FRAME_BUFFER));
    while buf.len() < size {
        if buf.len() == buf.capacity() {
            let target = (buf.capacity() * 2).clamp(FIRST_FRAME_BUFFER, size);
            buf.reserve(target - buf.len());
        }
        let room = (buf.capacity() - buf.len()).min(size - buf.len());
        let n = (&mut *reader)
            .take(room as u64)
            .read_buf(&mut buf)
            .await
            .map_err(|e| format!("truncated frame: {e}"))?;
        if n == 0 {
            return Err(format!(
                "truncated frame: the stream ended after {} of {size} bytes",
                buf.len()
            ));
        }
    }
    Ok(Some(buf.freeze()))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn read(bytes: &[u8], max: usize) -> (Result<Option<Bytes>, String>, bool) {
        let mut reader = bytes;
        let mut started = false;
        let r = read_frame(&mut reader, max, "socket.request.max.bytes", &mut started).await;
        (r, started)
    }

    #[tokio::test]
    async fn frames_of_every_size_are_read_whole() {
        for size in [
            0usize,
            1,
            100,
            FIRST_FRAME_BUFFER,
            FIRST_FRAME_BUFFER + 1,
            1_000_000,
        ] {
            let body: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
            let mut wire = (size as i32).to_be_bytes().to_vec();
            wire.extend_from_slice(&body);
            wire.extend_from_slice(b"next");
            let (r, started) = read(&wire, 2_000_000).await;
            assert_eq!(r.unwrap().unwrap(), Bytes::from(body), "size {size}");
            assert!(started);
        }
    }

    #[tokio::test]
    async fn bad_sizes_and_truncation_are_errors() {
        assert_eq!(read(b"", 10).await, (Ok(None), false));
        let (r, started) = read(&[0, 0], 10).await;
        assert!(r.unwrap_err().contains("truncated"));
        assert!(started);
        let r = read(&11i32.to_be_bytes(), 10).await.0.unwrap_err();
        assert!(r.contains("socket.request.max.bytes is 10"), "{r}");
        assert!(read(&(-1i32).to_be_bytes(), 10).await.0.is_err());
        let mut wire = 5i32.to_be_bytes().to_vec();
        wire.extend_from_slice(b"abc");
        assert!(read(&wire, 10)
            .await
            .0
            .unwrap_err()
            .contains("after 3 of 5"));
    }
}
