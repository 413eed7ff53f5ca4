//! A broker's own Kafka client for the inter-broker requests it sends
//! (today WriteTxnMarkers from a transaction coordinator to the leaders of
//! a transaction's partitions): one request per connection, bounded in time.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest response accepted from a peer.
const MAX_RESPONSE_BYTES: usize = 64 << 20;

/// Sends `body` at `version` to the broker at `host:port` and returns its
/// response, or why there is none.
pub async fn call<R: Request>(
    host: &str,
    port: u16,
    version: i16,
    body: &R,
    timeout: Duration,
) -> Result<R::Response, String> {
    tokio::time::timeout(timeout, exchange(host, port, version, body))
        .await
        .map_err(|_| format!("no answer from {host}:{port} within {timeout:?}"))?
}

async fn exchange<R: Request>(
    host: &str,
    port: u16,
    version: i16,
    body: &R,
) -> Result<R::Response, String> {
    let mut stream = TcpStream::connect((host, port))
        .await
        .map_err(|e| format!("connect {host}:{port}: {e}"))?;
    let _ = stream.set_nodelay(true);
    let header = RequestHeader::default()
        .with_request_api_key(R::KEY)
        .with_request_api_version(version)
        .with_correlation_id(1)
        .with_client_id(Some(StrBytes::from_static_str("tessera-broker")));
    let mut buf = BytesMut::new();
    buf.put_i32(0);
    header
        .encode(&mut buf, R::header_version(version))
        .map_err(|e| e.to_string())?;
    body.encode(&mut buf, version).map_err(|e| e.to_string())?;
    let len = (buf.len() - 4) as i32;
    buf[0..4].copy_from_slice(&len.to_be_bytes());
    stream.write_all(&buf).await.map_err(|e| e.to_string())?;
    let mut size = [0u8; 4];
    stream
        .read_exact(&mut size)
        .await
        .map_err(|e| format!("reading the response of {host}:{port}: {e}"))?;
    let size = i32::from_be_bytes(size);
    if size < 0 || size as usize > MAX_RESPONSE_BYTES {
        return Err(format!("response of {size} bytes from {host}:{port}"));
    }
    let mut frame = vec![0u8; size as usize];
    stream
        .read_exact(&mut frame)
        .await
        .map_err(|e| e.to_string())?;
    let mut frame = Bytes::from(frame);
    let header = ResponseHeader::decode(
        &mut frame,
        <R::Response as HeaderVersion>::header_version(version),
    )
    .map_err(|e| e.to_string())?;
    if header.correlation_id != 1 {
        return Err(format!(
            "unexpected correlation id {}",
            header.correlation_id
        ));
    }
    R::Response::decode(&mut frame, version).map_err(|e| e.to_string())
}
