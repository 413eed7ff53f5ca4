//! Response framing (Kafka's `RequestChannel`/`Send` side): a response's
//! size prefix, header in the API's response-header version, and body. Below
//! the API handlers so that the SASL exchange, which answers before any
//! handler runs, frames its responses the same way without reaching up into
//! `api`.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, ResponseHeader};
use kafka_protocol::protocol::Encodable;

pub use tessera_server_common::ids::kafka_style_uuid;

/// Encodes a response frame: size, header (in the API's header version), body.
pub fn encode_response<R: Encodable>(
    api: ApiKey,
    version: i16,
    correlation_id: i32,
    body: &R,
) -> Bytes {
    try_encode_response(api, version, correlation_id, body)
        .expect("response encodes in its own version")
}

/// Like [`encode_response`], but a body that does not fit the version (a
/// handler bug) becomes an error instead of a panic.
pub fn try_encode_response<R: Encodable>(
    api: ApiKey,
    version: i16,
    correlation_id: i32,
    body: &R,
) -> anyhow::Result<Bytes> {
    let header_version = api.response_header_version(version);
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    let size =
        header.compute_size(header_version).unwrap_or(0) + body.compute_size(version).unwrap_or(0);
    let mut buf = BytesMut::with_capacity(4 + size);
    buf.put_i32(0);
    header.encode(&mut buf, header_version)?;
    body.encode(&mut buf, version)?;
    let len = (buf.len() - 4) as i32;
    buf[0..4].copy_from_slice(&len.to_be_bytes());
    Ok(buf.freeze())
}
