//! A broker's own Kafka client for the inter-broker requests it sends
//! (WriteTxnMarkers from a transaction coordinator to the leaders of a
//! transaction's partitions, a leader's Fetch of a sealed copy another
//! replica holds): one request per connection, bounded in time, on a
//! connection authenticated as the inter-broker listener asks
//! ([`crate::inter_broker::InterBrokerClient`]).

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use tessera_replication::auth::Connector;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::inter_broker::InterBrokerClient;

/// Largest response accepted from a peer.
const MAX_RESPONSE_BYTES: usize = 64 << 20;

/// The client id of the broker's own requests.
const CLIENT_ID: &str = "tessera-broker";

/// Sends `body` at `version` to the broker at `host:port` and returns its
/// response, or why there is none.
pub async fn call<R: Request>(
    client: &InterBrokerClient,
    host: &str,
    port: u16,
    version: i16,
    body: &R,
    timeout: Duration,
) -> Result<R::Response, String> {
    let addr = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let exchange = async {
        let mut stream = client
            .connect(&addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        request(&mut stream, 1, version, body)
            .await
            .map_err(|e| format!("{addr}: {e}"))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| format!("no answer from {addr} within {timeout:?}"))?
}

/// One request and its response on `stream` (Kafka's framing:
/// `[size][header][body]`).
pub async fn request<S, R>(
    stream: &mut S,
    correlation_id: i32,
    version: i16,
    body: &R,
) -> Result<R::Response, String>
where
    S: AsyncRead + AsyncWrite + Unpin + ?Sized,
    R: Request,
{
    let header = RequestHeader::default()
        .with_request_api_key(R::KEY)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_static_str(CLIENT_ID)));
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
        .map_err(|e| format!("reading the response: {e}"))?;
    let size = i32::from_be_bytes(size);
    if size < 0 || size as usize > MAX_RESPONSE_BYTES {
        return Err(format!("response of {size} bytes"));
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
    if header.correlation_id != correlation_id {
        return Err(format!(
            "unexpected correlation id {}",
            header.correlation_id
        ));
    }
    R::Response::decode(&mut frame, version).map_err(|e| e.to_string())
}
