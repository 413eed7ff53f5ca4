//! The admin HTTP port: `/metrics` (Prometheus text), `/health`, `/ready`,
//! and the ranges API (`/ranges`, `/segments`, `POST /ranges/split` and
//! `/ranges/merge`), which answers only callers `admin_auth.rs` lets in. A
//! deliberately small HTTP/1.1 responder: a few routes do not need a web
//! framework.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::admin_auth::{self, Caller, Need};
use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::metrics::Metrics;

/// Serves the admin port; with `tls` (a TLS Kafka listener's name) every
/// connection handshakes with that listener's current keys first.
pub async fn serve(listener: TcpListener, broker: Arc<Broker>, tls: Option<String>) {
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            continue;
        };
        let broker = broker.clone();
        let acceptor = tls
            .as_ref()
            .and_then(|name| broker.config().tls.as_ref().and_then(|t| t.acceptor(name)));
        if tls.is_some() && acceptor.is_none() {
            tracing::warn!(%peer, "admin port: no TLS keys to answer with; connection closed");
            continue;
        }
        tokio::spawn(async move {
            match acceptor {
                Some(acceptor) => {
                    let handshake = tokio::time::timeout(
                        std::time::Duration::from_secs(10),
                        acceptor.accept(stream),
                    );
                    match handshake.await {
                        Ok(Ok(stream)) => {
                            let _ = handle(stream, peer, &broker).await;
                        }
                        _ => {
                            Metrics::add(&broker.metrics().tls_handshake_failures, 1);
                            tracing::debug!(%peer, "admin port: TLS handshake failed");
                        }
                    }
                }
                None => {
                    let _ = handle(stream, peer, &broker).await;
                }
            }
        });
    }
}

/// Who the caller is, if this route needs one (`None`: open routes), or
/// why they may not have it (status line and message).
fn admit(
    broker: &Broker,
    head: &str,
    peer: std::net::SocketAddr,
    method: &str,
    path: &str,
) -> Result<Option<String>, (&'static str, String)> {
    let need = admin_auth::need_of(method, path);
    if need == Need::Open {
        return Ok(None);
    }
    let image = broker.image();
    let principal = match admin_auth::caller(head, &broker.config().listeners, &image) {
        Caller::Principal(p) => p,
        Caller::Unauthenticated(reason) => return Err(("401 Unauthorized", reason.to_string())),
    };
    let op = match need {
        Need::Open | Need::Authenticated => return Ok(Some(principal)),
        Need::Describe => Op::Describe,
        Need::Alter => Op::Alter,
    };
    let authz = Authz::for_principal(broker, Arc::from(principal.as_str()), peer.ip().to_string());
    if authz.allows_cluster(op) {
        Ok(Some(principal))
    } else {
        Err((
            "403 Forbidden",
            format!("{principal} may not {op} the cluster"),
        ))
    }
}

fn error_json(message: &str) -> String {
    serde_json::json!({ "error": message }).to_string()
}

fn render_metrics(broker: &Broker) -> String {
    let mut text = render_broker_metrics(broker);
    text.push_str(&broker.quotas().render());
    text
}

fn render_broker_metrics(broker: &Broker) -> String {
    broker.metrics().render(&[
        (
            "tessera_range_logs",
            "Range logs open on this broker (active and sealed).",
            broker.range_log_count() as u64,
        ),
        (
            "tessera_segments",
            "Segments (sealed and active) of the open range logs.",
            broker.segment_count() as u64,
        ),
        (
            "tessera_under_replicated_partitions",
            "Partitions led here whose active segment has a follower out of sync (Kafka's UnderReplicatedPartitions).",
            broker.under_replicated_partitions(),
        ),
        (
            "tessera_offline_partitions",
            "Partitions without a live leader, as this broker's metadata image shows them (Kafka's OfflinePartitionsCount).",
            broker.image().offline_partitions(),
        ),
        (
            "tessera_topics",
            "Topics in the metadata image.",
            broker.image().topics.len() as u64,
        ),
        (
            "tessera_metadata_offset",
            "Offset of the last applied metadata record.",
            broker.image().offset.max(0) as u64,
        ),
    ])
}

async fn handle<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    peer: std::net::SocketAddr,
    broker: &Arc<Broker>,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    // Read until the end of the request head (or the buffer is full).
    while len < buf.len() {
        let n = stream.read(&mut buf[len..]).await?;
        if n == 0 {
            break;
        }
        len += n;
        if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
    }
    let head = String::from_utf8_lossy(&buf[..len]);
    let mut parts = head.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let param = |name: &str| -> Option<u64> {
        query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == name)
            .and_then(|(_, v)| v.parse().ok())
    };
    let json = "application/json";
    let principal = match admit(broker, &head, peer, method, path) {
        Ok(principal) => principal,
        Err(refused) => return refuse(&mut stream, broker, peer, method, path, refused).await,
    };
    if crate::console::owns(path) {
        let principal = principal.unwrap_or_else(|| "User:ANONYMOUS".into());
        let body = match read_body(&mut stream, &head, &buf[..len]).await? {
            Ok(body) => body,
            Err(status) => {
                return respond(
                    &mut stream,
                    status,
                    json,
                    &error_json("request body too large or malformed"),
                )
                .await
            }
        };
        let request = crate::console::Request {
            method,
            path,
            query,
            head: &head,
            body: &body,
        };
        let reply =
            crate::console::handle(broker, &principal, peer.ip().to_string(), request).await;
        return respond(&mut stream, reply.status, reply.content_type, &reply.body).await;
    }
    let (status, content_type, body) = match (method, path) {
        ("GET", "/health") => ("200 OK", "text/plain", "ok\n".to_string()),
        ("GET", "/ready") if broker.is_ready() => ("200 OK", "text/plain", "ready\n".to_string()),
        ("GET", "/ready") => (
            "503 Service Unavailable",
            "text/plain",
            "not ready\n".to_string(),
        ),
        ("GET", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4",
            render_metrics(broker),
        ),
        ("GET", "/ranges") => (
            "200 OK",
            json,
            serde_json::to_string(&broker.list_ranges()).unwrap_or_default(),
        ),
        ("GET", "/balance") => (
            "200 OK",
            json,
            serde_json::to_string(&broker.balance_view()).unwrap_or_default(),
        ),
        ("GET", "/segments") => (
            "200 OK",
            json,
            serde_json::to_string(&broker.list_segments()).unwrap_or_default(),
        ),
        ("POST", "/ranges/split") => match param("range") {
            None => ("400 Bad Request", json, error_json("missing ?range=ID")),
            Some(range) => match broker
                .split_range(range, param("at").map(|a| a as u32))
                .await
            {
                Ok((left, right)) => ("200 OK", json, format!("{{\"children\":[{left},{right}]}}")),
                Err(e) => ("409 Conflict", json, error_json(&e.to_string())),
            },
        },
        ("POST", "/ranges/merge") => match (param("left"), param("right")) {
            (Some(left), Some(right)) => match broker.merge_ranges(left, right).await {
                Ok(child) => ("200 OK", json, format!("{{\"child\":{child}}}")),
                Err(e) => ("409 Conflict", json, error_json(&e.to_string())),
            },
            _ => (
                "400 Bad Request",
                json,
                error_json("missing ?left=ID&right=ID"),
            ),
        },
        ("GET", _) | ("POST", _) => ("404 Not Found", "text/plain", "not found\n".to_string()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "method not allowed\n".to_string(),
        ),
    };
    respond(&mut stream, status, content_type, &body).await
}

/// The most a console write's body may hold.
const MAX_BODY_BYTES: usize = 64 << 10;

/// A request's body (`Content-Length` bytes: what came with the head, then
/// the rest), or the status refusing it.
async fn read_body<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    head: &str,
    received: &[u8],
) -> std::io::Result<Result<Vec<u8>, &'static str>> {
    let length = admin_auth::header(head, "content-length").map(str::parse::<usize>);
    let length = match length {
        None => return Ok(Ok(Vec::new())),
        Some(Ok(n)) if n <= MAX_BODY_BYTES => n,
        Some(Ok(_)) => return Ok(Err("413 Payload Too Large")),
        Some(Err(_)) => return Ok(Err("400 Bad Request")),
    };
    let start = received
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(received.len(), |i| i + 4);
    let mut body = received[start..].to_vec();
    body.truncate(length);
    while body.len() < length {
        let mut chunk = vec![0u8; length - body.len()];
        let n = tokio::time::timeout(std::time::Duration::from_secs(10), stream.read(&mut chunk))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "body"))??;
        if n == 0 {
            return Ok(Err("400 Bad Request"));
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Ok(Ok(body))
}

/// Answers a refused request (401 with a Basic challenge, or 403).
async fn refuse<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    broker: &Broker,
    peer: std::net::SocketAddr,
    method: &str,
    path: &str,
    (status, message): (&'static str, String),
) -> std::io::Result<()> {
    Metrics::add(&broker.metrics().admin_requests_refused, 1);
    tracing::info!(%peer, method, path, status, reason = %message, "admin request refused");
    let challenge = if status.starts_with("401") {
        "WWW-Authenticate: Basic realm=\"tessera\", charset=\"UTF-8\"\r\n"
    } else {
        ""
    };
    write_response(
        stream,
        status,
        "application/json",
        challenge,
        &error_json(&message),
    )
    .await
}

async fn respond<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    status: &str,
    content_type: &str,
    body: &str,
) -> std::io::Result<()> {
    write_response(stream, status, content_type, "", body).await
}

/// One response, then the connection closes. The console's pages come
/// from this origin only and are never framed (a clickjacked console could
/// act with the operator's credentials).
async fn write_response<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    status: &str,
    content_type: &str,
    extra_headers: &str,
    body: &str,
) -> std::io::Result<()> {
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n{extra_headers}\
         Content-Security-Policy: default-src 'self'; frame-ancestors 'none'\r\n\
         X-Frame-Options: DENY\r\nX-Content-Type-Options: nosniff\r\nCache-Control: no-store\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}
