//! Response framing (Kafka's `RequestChannel`/`Send` side): a response's
//! size prefix, header in the API's response-header version, and body. Below
//! the API handlers so that the SASL exchange, which answers before any
//! handler runs, frames its responses the same way without reaching up into
//! `api`.

use std::ops::Range;

use bytes::buf::UninitSlice;
use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, ResponseHeader};
use kafka_protocol::protocol::buf::ByteBufMut;
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

/// Like [`try_encode_response`], but the byte fields that are slices of
/// `shared` (a Fetch's record batches, as read from the segment files) are
/// referenced by the frame instead of copied into it: the frame is a list
/// of chunks written one after another. Copying them cost a consuming
/// broker about a sixth of its CPU (docs/BENCHMARKS.md).
pub fn try_encode_response_sharing<R: Encodable>(
    api: ApiKey,
    version: i16,
    correlation_id: i32,
    body: &R,
    shared: &[Bytes],
) -> anyhow::Result<Vec<Bytes>> {
    let header_version = api.response_header_version(version);
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    // The size prefix comes first, before any chunk is cut: computed, not
    // patched in afterwards.
    let size = header.compute_size(header_version)? + body.compute_size(version)?;
    let mut buf = SharingBuf {
        shared,
        chunks: Vec::new(),
        chunked_len: 0,
        tail: BytesMut::with_capacity(4096),
    };
    buf.put_i32(i32::try_from(size)?);
    header.encode(&mut buf, header_version)?;
    body.encode(&mut buf, version)?;
    anyhow::ensure!(
        buf.offset() == 4 + size,
        "{api:?} v{version} encoded {} bytes, computed {size}",
        buf.offset() - 4
    );
    Ok(buf.finish())
}

/// Byte fields at least this long are referenced rather than copied (a
/// chunk costs a write of its own).
const SHARE_AT_LEAST: usize = 16 * 1024;

/// An encoding buffer: bytes go into `tail`, except a slice of one of
/// `shared`, which becomes a chunk of its own without a copy.
struct SharingBuf<'a> {
    shared: &'a [Bytes],
    /// Finished chunks, in order.
    chunks: Vec<Bytes>,
    chunked_len: usize,
    tail: BytesMut,
}

impl SharingBuf<'_> {
    fn owner_of(&self, src: &[u8]) -> Option<&Bytes> {
        let (start, end) = (src.as_ptr() as usize, src.as_ptr() as usize + src.len());
        self.shared.iter().find(|b| {
            let at = b.as_ptr() as usize;
            start >= at && end <= at + b.len()
        })
    }

    fn finish(mut self) -> Vec<Bytes> {
        if !self.tail.is_empty() {
            self.chunks.push(self.tail.freeze());
        }
        self.chunks
    }
}

// SAFETY: every method hands on to `tail`'s own `BufMut`.
unsafe impl BufMut for SharingBuf<'_> {
    fn remaining_mut(&self) -> usize {
        self.tail.remaining_mut()
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        // SAFETY: the caller initialized `cnt` bytes of `tail`'s chunk.
        unsafe { self.tail.advance_mut(cnt) }
    }

    fn chunk_mut(&mut self) -> &mut UninitSlice {
        self.tail.chunk_mut()
    }

    fn put_slice(&mut self, src: &[u8]) {
        if src.len() >= SHARE_AT_LEAST {
            if let Some(shared) = self.owner_of(src).map(|owner| owner.slice_ref(src)) {
                if !self.tail.is_empty() {
                    let done = self.tail.split().freeze();
                    self.chunked_len += done.len();
                    self.chunks.push(done);
                }
                self.chunked_len += shared.len();
                self.chunks.push(shared);
                return;
            }
        }
        self.tail.put_slice(src);
    }
}

/// Gaps (filled in after what follows them is written) are only used by
/// record batch encoding, never by a response body: they may only reach
/// back into the bytes not cut into chunks yet.
impl ByteBufMut for SharingBuf<'_> {
    fn offset(&self) -> usize {
        self.chunked_len + self.tail.len()
    }

    fn seek(&mut self, offset: usize) {
        self.tail.seek(offset - self.chunked_len);
    }

    fn range(&mut self, r: Range<usize>) -> &mut [u8] {
        let at = self.chunked_len;
        self.tail.range(r.start - at..r.end - at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
    use kafka_protocol::messages::FetchResponse;

    fn response(records: &[Option<Bytes>]) -> FetchResponse {
        FetchResponse::default().with_responses(vec![FetchableTopicResponse::default()
            .with_topic_id(uuid::Uuid::from_u128(7))
            .with_partitions(
                records
                    .iter()
                    .enumerate()
                    .map(|(i, r)| {
                        PartitionData::default()
                            .with_partition_index(i as i32)
                            .with_high_watermark(1_000 + i as i64)
                            .with_records(r.clone())
                    })
                    .collect(),
            )])
    }

    /// The chunks are byte for byte the frame a copying encode makes, in
    /// every Fetch version this broker serves, and the large record fields
    /// are the very memory they were read into.
    #[test]
    fn a_shared_frame_is_the_copied_frame_without_the_copies() {
        let big = |n: usize, seed: u8| {
            Bytes::from(
                (0..n)
                    .map(|i| (i as u8).wrapping_mul(seed))
                    .collect::<Vec<_>>(),
            )
        };
        let records = vec![
            Some(big(100_000, 3)),
            None,
            Some(big(100, 5)),
            Some(big(SHARE_AT_LEAST, 7)),
            Some(Bytes::new()),
            Some(big(1 << 20, 11)),
        ];
        let shared: Vec<Bytes> = records.iter().flatten().cloned().collect();
        let body = response(&records);
        for version in 4..=18 {
            let copied = try_encode_response(ApiKey::Fetch, version, 42, &body).unwrap();
            let chunks =
                try_encode_response_sharing(ApiKey::Fetch, version, 42, &body, &shared).unwrap();
            assert_eq!(chunks.concat(), copied.to_vec(), "v{version}");
            let referenced: Vec<_> = chunks
                .iter()
                .filter(|c| shared.iter().any(|s| s.as_ptr() == c.as_ptr()))
                .map(|c| c.len())
                .collect();
            assert_eq!(
                referenced,
                vec![100_000, SHARE_AT_LEAST, 1 << 20],
                "v{version}"
            );
        }
    }

    /// Nothing to share: one chunk, the copied frame.
    #[test]
    fn without_shared_bytes_a_frame_is_one_chunk() {
        let body = response(&[Some(Bytes::from(vec![1u8; 50_000]))]);
        let copied = try_encode_response(ApiKey::Fetch, 12, 1, &body).unwrap();
        let chunks = try_encode_response_sharing(ApiKey::Fetch, 12, 1, &body, &[]).unwrap();
        assert_eq!(chunks, vec![copied]);
    }
}
