//! Response framing (Kafka's `RequestChannel`/`Send` side): a response's
//! size prefix, header in the API's response-header version, and body. Below
//! the API handlers so that the SASL exchange, which answers before any
//! handler runs, frames its responses the same way without reaching up into
//! `api`.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, ResponseHeader};
use kafka_protocol::protocol::Encodable;

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

/// Kafka prints ids as 22 characters of URL-safe base64 without padding.
pub fn kafka_style_uuid(id: uuid::Uuid) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let bytes = id.as_bytes();
    let mut out = String::with_capacity(22);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for &b in bytes {
        acc = (acc << 8) | b as u32;
        bits += 8;
        while bits >= 6 {
            bits -= 6;
            out.push(ALPHABET[((acc >> bits) & 63) as usize] as char);
        }
    }
    if bits > 0 {
        out.push(ALPHABET[((acc << (6 - bits)) & 63) as usize] as char);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafka_uuid_is_22_chars() {
        let s = kafka_style_uuid(uuid::Uuid::nil());
        assert_eq!(s, "AAAAAAAAAAAAAAAAAAAAAA");
        assert_eq!(kafka_style_uuid(uuid::Uuid::new_v4()).len(), 22);
    }
}
