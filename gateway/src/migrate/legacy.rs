//! Legacy message sets (message format v0 and v1, Kafka before 0.11) as a
//! source's Fetch returns them, and their up-conversion to v2 record
//! batches, with Kafka's semantics (`AbstractLegacyRecordBatch`,
//! `LegacyRecord`, `LogValidator`'s up-conversion).
//!
//! A legacy message on the wire:
//!
//! ```text
//! offset i64 | size i32 | crc u32 (CRC-32 of magic..end) | magic i8 |
//! attributes i8 (codec: bits 0-2; v1: timestamp type, bit 3) |
//! timestamp i64 (v1 only) | key bytes (i32 length, -1 null) | value bytes
//! ```
//!
//! A compressed message (a *wrapper*) holds in its value a whole message
//! set, compressed with gzip (1), snappy (2, xerial framing or raw) or lz4
//! (3, an LZ4 frame; in v0 with Kafka's broken header checksum, KAFKA-3160,
//! which is accepted). zstd (4) never existed before v2 and is refused, as
//! Kafka does. Inner messages of a v0 wrapper carry absolute offsets; those
//! of a v1 wrapper relative ones, the wrapper's own offset being the last
//! inner offset (or 0: some librdkafka versions wrote 0, then the relative
//! offsets are taken as they are, as Kafka does). An inner v1 message of a
//! LogAppendTime wrapper takes the wrapper's timestamp and type; one of a
//! CreateTime wrapper keeps its own timestamp.
//!
//! Up-conversion keeps every record at its offset: one v2 batch per
//! wrapper (with the wrapper's codec re-applied), one per run of
//! uncompressed messages. Records have no producer id/epoch/sequence (-1),
//! no headers; a v0 record has no timestamp (-1, Kafka's NO_TIMESTAMP,
//! under CreateTime); a v1 record keeps its timestamp and type.
//!
//! Nothing here panics on any input, and decompression is bounded.

use std::io::Read;

use bytes::Bytes;
use kafka_protocol::records::{Compression, Record, TimestampType};
use tessera_log::batch;

/// Offset, size, CRC and magic: the bytes before a message's attributes.
const PREFIX: usize = 17;
const CODEC_MASK: u8 = 0x07;
const TIMESTAMP_TYPE_BIT: u8 = 0x08;
/// The most bytes one wrapper may decompress to.
pub const MAX_DECOMPRESSED: usize = 256 << 20;
/// Kafka's NO_TIMESTAMP.
pub const NO_TIMESTAMP: i64 = -1;

/// One legacy message as it is on the wire (CRC checked).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub offset: i64,
    pub magic: i8,
    pub attributes: u8,
    /// v1's timestamp; [`NO_TIMESTAMP`] for v0.
    pub timestamp: i64,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
}

impl Message {
    /// The compression codec: 0 none, 1 gzip, 2 snappy, 3 lz4.
    pub fn codec(&self) -> u8 {
        self.attributes & CODEC_MASK
    }

    /// A v1 message whose timestamp is the broker's append time.
    pub fn log_append_time(&self) -> bool {
        self.magic == 1 && self.attributes & TIMESTAMP_TYPE_BIT != 0
    }

    /// Encodes the message (offset and size included), CRC computed.
    pub fn encode(&self) -> Vec<u8> {
        let mut body = vec![self.magic as u8, self.attributes];
        if self.magic >= 1 {
            body.extend_from_slice(&self.timestamp.to_be_bytes());
        }
        for b in [&self.key, &self.value] {
            match b {
                None => body.extend_from_slice(&(-1i32).to_be_bytes()),
                Some(b) => {
                    body.extend_from_slice(&(b.len() as i32).to_be_bytes());
                    body.extend_from_slice(b);
                }
            }
        }
        let crc = crc32fast::hash(&body);
        let mut out = Vec::with_capacity(body.len() + PREFIX - 1);
        out.extend_from_slice(&self.offset.to_be_bytes());
        out.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
        out.extend_from_slice(&crc.to_be_bytes());
        out.extend_from_slice(&body);
        out
    }
}

fn be_i32(b: &[u8]) -> i32 {
    i32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn be_i64(b: &[u8]) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    i64::from_be_bytes(a)
}

/// How many bytes the entry (any magic) at the start of `buf` spans, from
/// its offset and size fields; `None` while fewer than 12 bytes are there.
pub fn entry_len(buf: &[u8]) -> Option<Result<usize, String>> {
    if buf.len() < batch::LOG_OVERHEAD {
        return None;
    }
    let size = be_i32(&buf[8..12]);
    if size < 0 {
        return Some(Err(format!("an entry of negative size {size}")));
    }
    Some(Ok(batch::LOG_OVERHEAD + size as usize))
}

/// Parses the legacy message at the start of `buf`: `Ok(None)` when `buf`
/// holds only part of it, the message and its length otherwise. The CRC
/// is checked and the key and value must fill the message exactly.
pub fn parse_message(buf: &[u8]) -> Result<Option<(Message, usize)>, String> {
    let total = match entry_len(buf) {
        None => return Ok(None),
        Some(r) => r?,
    };
    if buf.len() < total.min(PREFIX) || buf.len() < total {
        return Ok(None);
    }
    let offset = be_i64(buf);
    let m = &buf[..total];
    if total < PREFIX + 1 {
        return Err(format!("the message at offset {offset} is too short"));
    }
    let crc = u32::from_be_bytes([m[12], m[13], m[14], m[15]]);
    let magic = m[16] as i8;
    if magic != 0 && magic != 1 {
        return Err(format!(
            "the message at offset {offset} has magic {magic}, not 0 or 1"
        ));
    }
    if crc32fast::hash(&m[16..]) != crc {
        return Err(format!(
            "the message at offset {offset} fails its CRC (corrupt)"
        ));
    }
    let attributes = m[17];
    let mut at = PREFIX + 1;
    let timestamp = if magic == 1 {
        let t = m
            .get(at..at + 8)
            .ok_or_else(|| format!("the message at offset {offset} is too short"))?;
        at += 8;
        be_i64(t)
    } else {
        NO_TIMESTAMP
    };
    let mut field = |what: &str| -> Result<Option<Bytes>, String> {
        let len = m
            .get(at..at + 4)
            .map(be_i32)
            .ok_or_else(|| format!("the message at offset {offset} has no {what} length"))?;
        at += 4;
        if len < 0 {
            return if len == -1 {
                Ok(None)
            } else {
                Err(format!(
                    "the message at offset {offset} has {what} length {len}"
                ))
            };
        }
        let b = m
            .get(at..at + len as usize)
            .ok_or_else(|| format!("the message at offset {offset} has a truncated {what}"))?;
        at += len as usize;
        Ok(Some(Bytes::copy_from_slice(b)))
    };
    let key = field("key")?;
    let value = field("value")?;
    if at != total {
        return Err(format!(
            "the message at offset {offset} holds {} bytes past its value",
            total - at
        ));
    }
    Ok(Some((
        Message {
            offset,
            magic,
            attributes,
            timestamp,
            key,
            value,
        },
        total,
    )))
}

/// The records of one shallow message: itself when uncompressed, its inner
/// messages with their absolute offsets when it is a wrapper. Returns the
/// records and the codec of the v2 batch they become.
pub fn deep_records(wrapper: &Message) -> Result<(Vec<Record>, Compression), String> {
    let codec = match wrapper.codec() {
        0 => return Ok((vec![to_record(wrapper, None)], Compression::None)),
        1 => Compression::Gzip,
        2 => Compression::Snappy,
        3 => Compression::Lz4,
        c => {
            return Err(format!(
                "the message at offset {} has compression codec {c}, unknown in message format v{}",
                wrapper.offset, wrapper.magic
            ))
        }
    };
    let at = wrapper.offset;
    let value = wrapper
        .value
        .as_ref()
        .ok_or_else(|| format!("the compressed message at offset {at} has a null value"))?;
    let inner = decompress(codec, wrapper.magic, value)
        .map_err(|e| format!("the compressed message at offset {at}: {e}"))?;
    let mut messages = Vec::new();
    let mut rest = &inner[..];
    while !rest.is_empty() {
        let (m, len) = parse_message(rest)
            .map_err(|e| format!("in the compressed message at offset {at}: {e}"))?
            .ok_or_else(|| {
                format!("the compressed message at offset {at} ends within an inner message")
            })?;
        if m.codec() != 0 {
            return Err(format!(
                "the compressed message at offset {at} holds a compressed inner message"
            ));
        }
        messages.push(m);
        rest = &rest[len..];
    }
    let last_inner = messages
        .last()
        .map(|m| m.offset)
        .ok_or_else(|| format!("the compressed message at offset {at} holds no message"))?;
    // v1: relative inner offsets; the wrapper's offset is the last one's.
    let base = if wrapper.magic == 1 {
        if at == 0 {
            0
        } else if at < last_inner {
            return Err(format!(
                "the compressed message at offset {at} is below its last inner offset {last_inner}"
            ));
        } else {
            at - last_inner
        }
    } else {
        0
    };
    let wrapper_time = (wrapper.magic == 1).then_some(wrapper);
    let mut records = Vec::with_capacity(messages.len());
    for m in &messages {
        let mut r = to_record(m, wrapper_time);
        r.offset = base
            .checked_add(m.offset)
            .ok_or_else(|| format!("an inner offset of the message at {at} overflows"))?;
        if let Some(prev) = records.last().map(|p: &Record| p.offset) {
            if r.offset <= prev {
                return Err(format!(
                    "the compressed message at offset {at} holds offsets out of order"
                ));
            }
        }
        records.push(r);
    }
    Ok((records, codec))
}

/// A legacy message as a v2 record (no producer, no headers). An inner
/// message of a v1 wrapper takes the wrapper's timestamp type, and its
/// timestamp too under LogAppendTime (Kafka's `LegacyRecord`).
fn to_record(m: &Message, wrapper: Option<&Message>) -> Record {
    let log_append_time = match wrapper {
        Some(w) => w.log_append_time(),
        None => m.log_append_time(),
    };
    let timestamp = match wrapper {
        Some(w) if log_append_time => w.timestamp,
        _ => m.timestamp,
    };
    // v0 has no timestamp (NO_TIMESTAMP_TYPE): CreateTime with -1 in v2.
    let (timestamp, timestamp_type) = if m.magic == 0 {
        (NO_TIMESTAMP, TimestampType::Creation)
    } else if log_append_time {
        (timestamp, TimestampType::LogAppend)
    } else {
        (timestamp, TimestampType::Creation)
    };
    Record {
        transactional: false,
        control: false,
        partition_leader_epoch: -1,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type,
        offset: m.offset,
        sequence: -1,
        timestamp,
        key: m.key.clone(),
        value: m.value.clone(),
        headers: Default::default(),
        delete_horizon: false,
    }
}

/// Decompresses a wrapper's value, at most [`MAX_DECOMPRESSED`] bytes.
fn decompress(codec: Compression, magic: i8, value: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let limit = MAX_DECOMPRESSED as u64 + 1;
    match codec {
        Compression::Gzip => {
            flate2::read::GzDecoder::new(value)
                .take(limit)
                .read_to_end(&mut out)
                .map_err(|e| format!("gzip: {e}"))?;
        }
        Compression::Snappy => out = snappy(value)?,
        Compression::Lz4 => {
            let mut frame = value.to_vec();
            if magic == 0 {
                fix_lz4_header_checksum(&mut frame);
            }
            let decoder = lz4::Decoder::new(&frame[..]).map_err(|e| format!("lz4: {e}"))?;
            decoder
                .take(limit)
                .read_to_end(&mut out)
                .map_err(|e| format!("lz4: {e}"))?;
        }
        _ => return Err(format!("codec {codec:?} in a legacy message")),
    }
    if out.len() > MAX_DECOMPRESSED {
        return Err(format!(
            "it decompresses to more than {MAX_DECOMPRESSED} bytes"
        ));
    }
    Ok(out)
}

/// snappy-java's framing (`\x82SNAPPY\0`, two versions, then
/// `[len u32][block]`...) as Kafka writes it, else raw snappy.
fn snappy(value: &[u8]) -> Result<Vec<u8>, String> {
    const MAGIC: &[u8] = b"\x82SNAPPY\x00";
    const HEADER: usize = 16;
    let raw = |block: &[u8], out: &mut Vec<u8>| -> Result<(), String> {
        let len = snap::raw::decompress_len(block).map_err(|e| format!("snappy: {e}"))?;
        if out.len().saturating_add(len) > MAX_DECOMPRESSED {
            return Err(format!(
                "it decompresses to more than {MAX_DECOMPRESSED} bytes"
            ));
        }
        let start = out.len();
        out.resize(start + len, 0);
        snap::raw::Decoder::new()
            .decompress(block, &mut out[start..])
            .map_err(|e| format!("snappy: {e}"))?;
        Ok(())
    };
    let mut out = Vec::new();
    if value.len() < HEADER || !value.starts_with(MAGIC) {
        raw(value, &mut out)?;
        return Ok(out);
    }
    let mut rest = &value[HEADER..];
    while !rest.is_empty() {
        if rest.len() < 4 {
            return Err("snappy: a truncated block length".into());
        }
        let len = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let block = rest
            .get(4..4usize.saturating_add(len))
            .ok_or("snappy: a truncated block")?;
        raw(block, &mut out)?;
        rest = &rest[4 + len..];
    }
    Ok(out)
}

/// KAFKA-3160: Kafka's v0 lz4 framing computed the frame descriptor's
/// header checksum over the magic number too. Rewrites it as the LZ4 frame
/// format defines it (xxh32 of the descriptor, second byte) so a standard
/// decoder takes the frame; a frame too short is left for the decoder to
/// refuse.
fn fix_lz4_header_checksum(frame: &mut [u8]) {
    if frame.len() < 7 {
        return;
    }
    let flg = frame[4];
    let mut end = 6; // FLG, BD
    if flg & 0x08 != 0 {
        end += 8; // content size
    }
    if flg & 0x01 != 0 {
        end += 4; // dictionary id
    }
    if frame.len() <= end {
        return;
    }
    frame[end] = (xxh32(&frame[4..end]) >> 8) as u8;
}

/// xxHash32 with seed 0 of a short input (under 16 bytes: the frame
/// descriptor).
fn xxh32(input: &[u8]) -> u32 {
    const P1: u32 = 0x9E37_79B1;
    const P2: u32 = 0x85EB_CA77;
    const P3: u32 = 0xC2B2_AE3D;
    const P4: u32 = 0x27D4_EB2F;
    const P5: u32 = 0x1656_67B1;
    debug_assert!(input.len() < 16);
    let mut h = P5.wrapping_add(input.len() as u32);
    let mut chunks = input.chunks_exact(4);
    for c in &mut chunks {
        let v = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        h = h
            .wrapping_add(v.wrapping_mul(P3))
            .rotate_left(17)
            .wrapping_mul(P4);
    }
    for &b in chunks.remainder() {
        h = h
            .wrapping_add(u32::from(b).wrapping_mul(P5))
            .rotate_left(11)
            .wrapping_mul(P1);
    }
    h ^= h >> 15;
    h = h.wrapping_mul(P2);
    h ^= h >> 13;
    h = h.wrapping_mul(P3);
    h ^= h >> 16;
    h
}

/// Encodes records (increasing offsets, one timestamp type) as one v2
/// batch with `compression`: base offset the first record's, offset deltas
/// keeping any gaps, no producer (id, epoch and base sequence -1), partition
/// leader epoch -1 (the target sets its own), LogAppendTime carried in the
/// attributes.
pub fn to_v2(records: &[Record], compression: Compression) -> Result<Bytes, String> {
    let (first, last) = match (records.first(), records.last()) {
        (Some(f), Some(l)) => (f.offset, l.offset),
        _ => return Err("no record to convert".into()),
    };
    if last - first > i32::MAX as i64 {
        return Err(format!(
            "offsets {first}..={last} do not fit one record batch"
        ));
    }
    let min_ts = records.iter().map(|r| r.timestamp).min().unwrap_or(0);
    let max_ts = records.iter().map(|r| r.timestamp).max().unwrap_or(0);
    if max_ts.checked_sub(min_ts).is_none() {
        return Err(format!(
            "timestamps {min_ts} and {max_ts} do not fit one record batch"
        ));
    }
    let log_append_time = records[0].timestamp_type == TimestampType::LogAppend;
    // The encoder keeps records in one batch while offset - sequence stays
    // the same; its base sequence is then first.sequence, here -1.
    let records: Vec<Record> = records
        .iter()
        .map(|r| Record {
            sequence: ((r.offset - first) as i32).wrapping_sub(1),
            producer_id: -1,
            producer_epoch: -1,
            partition_leader_epoch: -1,
            transactional: false,
            control: false,
            delete_horizon: false,
            ..r.clone()
        })
        .collect();
    let mut buf =
        tessera_log::records::encode_v2(&records, compression).map_err(|e| e.to_string())?;
    let header = batch::parse_header(&buf).map_err(|e| e.to_string())?;
    if header.total_len() != buf.len() || header.record_count as usize != records.len() {
        return Err("the records do not make one v2 batch".into());
    }
    if log_append_time {
        let max = header.max_timestamp;
        batch::set_log_append_time(&mut buf, max);
    }
    Ok(buf.freeze())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use kafka_protocol::records::RecordBatchDecoder;
    use proptest::prelude::*;

    pub fn msg(
        offset: i64,
        magic: i8,
        attributes: u8,
        ts: i64,
        key: &[u8],
        value: &[u8],
    ) -> Message {
        Message {
            offset,
            magic,
            attributes,
            timestamp: if magic == 0 { NO_TIMESTAMP } else { ts },
            key: (!key.is_empty()).then(|| Bytes::copy_from_slice(key)),
            value: Some(Bytes::copy_from_slice(value)),
        }
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn lz4(data: &[u8]) -> Vec<u8> {
        use std::io::Write;
        let mut e = lz4::EncoderBuilder::new().build(Vec::new()).unwrap();
        e.write_all(data).unwrap();
        let (out, r) = e.finish();
        r.unwrap();
        out
    }

    fn snappy_xerial(data: &[u8]) -> Vec<u8> {
        let mut out = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01".to_vec();
        for chunk in data.chunks(100) {
            let block = snap::raw::Encoder::new().compress_vec(chunk).unwrap();
            out.extend_from_slice(&(block.len() as u32).to_be_bytes());
            out.extend_from_slice(&block);
        }
        out
    }

    /// A wrapper of `inner` (offsets as they are written inside).
    pub fn wrapper(offset: i64, magic: i8, attributes: u8, ts: i64, inner: &[Message]) -> Message {
        let set: Vec<u8> = inner.iter().flat_map(Message::encode).collect();
        let value = match attributes & CODEC_MASK {
            1 => gzip(&set),
            2 => snappy_xerial(&set),
            3 => lz4(&set),
            _ => unreachable!(),
        };
        Message {
            offset,
            magic,
            attributes,
            timestamp: ts,
            key: None,
            value: Some(Bytes::from(value)),
        }
    }

    fn decode_v2(bytes: &Bytes) -> Vec<Record> {
        let mut b = bytes.clone();
        RecordBatchDecoder::decode(&mut b).unwrap().records
    }

    #[test]
    fn v0_and_v1_messages_parse_and_convert() {
        let v0 = msg(5, 0, 0, 0, b"k0", b"v0");
        let v1 = msg(7, 1, 0, 1_600_000_000_123, b"", b"v1");
        let mut wire = v0.encode();
        wire.extend(v1.encode());
        let (a, n) = parse_message(&wire).unwrap().unwrap();
        assert_eq!(a, v0);
        let (b, m) = parse_message(&wire[n..]).unwrap().unwrap();
        assert_eq!(b, v1);
        assert_eq!(n + m, wire.len());
        // A partial message waits; a flipped byte fails the CRC.
        assert_eq!(parse_message(&wire[..n - 1]).unwrap(), None);
        let mut bad = wire.clone();
        bad[n - 1] ^= 1;
        assert!(parse_message(&bad).unwrap_err().contains("CRC"));

        let (r0, c) = deep_records(&a).unwrap();
        assert_eq!(c, Compression::None);
        assert_eq!((r0[0].offset, r0[0].timestamp), (5, NO_TIMESTAMP));
        let (r1, _) = deep_records(&b).unwrap();
        let recs = [r0, r1].concat();
        let v2 = to_v2(&recs, Compression::None).unwrap();
        let h = batch::validate(&v2).unwrap();
        assert_eq!((h.base_offset, h.last_offset(), h.record_count), (5, 7, 2));
        assert_eq!(
            (h.producer_id, h.producer_epoch, h.base_sequence),
            (-1, -1, -1)
        );
        let back = decode_v2(&v2);
        assert_eq!(back[0].offset, 5);
        assert_eq!(back[0].timestamp, -1);
        assert_eq!(back[0].key.as_deref(), Some(&b"k0"[..]));
        assert_eq!(back[1].offset, 7);
        assert_eq!(back[1].timestamp, 1_600_000_000_123);
        assert_eq!(back[1].key, None);
        assert_eq!(back[1].value.as_deref(), Some(&b"v1"[..]));
    }

    #[test]
    fn v1_wrappers_use_relative_offsets_and_the_wrapper_time() {
        for codec in 1..=3u8 {
            let inner = [
                msg(0, 1, 0, 100, b"a", b"1"),
                msg(1, 1, 0, 101, b"b", b"2"),
                msg(3, 1, 0, 103, b"c", b"3"), // a compacted-away offset
            ];
            // CreateTime: inner timestamps kept, offsets relative to 20 - 3.
            let w = wrapper(20, 1, codec, 999, &inner);
            let (recs, c) = deep_records(&w).unwrap();
            assert_eq!(c as u8, codec);
            let got: Vec<(i64, i64)> = recs.iter().map(|r| (r.offset, r.timestamp)).collect();
            assert_eq!(got, vec![(17, 100), (18, 101), (20, 103)]);
            let v2 = to_v2(&recs, c).unwrap();
            let h = batch::validate(&v2).unwrap();
            assert_eq!(h.compression_codec(), codec as i16);
            assert_eq!(
                (h.base_offset, h.last_offset(), h.record_count),
                (17, 20, 3)
            );
            assert!(!h.is_log_append_time());
            let back = decode_v2(&v2);
            assert_eq!(
                back.iter().map(|r| r.offset).collect::<Vec<_>>(),
                vec![17, 18, 20]
            );
            // LogAppendTime: every inner record takes the wrapper's time.
            let w = wrapper(20, 1, codec | TIMESTAMP_TYPE_BIT, 999, &inner);
            let (recs, c) = deep_records(&w).unwrap();
            assert!(recs
                .iter()
                .all(|r| r.timestamp == 999 && r.timestamp_type == TimestampType::LogAppend));
            let v2 = to_v2(&recs, c).unwrap();
            let h = batch::validate(&v2).unwrap();
            assert!(h.is_log_append_time());
            assert_eq!(h.max_timestamp, 999);
            assert!(decode_v2(&v2).iter().all(|r| r.timestamp == 999));
        }
    }

    #[test]
    fn v0_wrappers_use_absolute_offsets_and_kafkas_lz4_framing() {
        let inner = [msg(40, 0, 0, 0, b"x", b"1"), msg(41, 0, 0, 0, b"y", b"2")];
        for codec in 1..=3u8 {
            let mut w = wrapper(41, 0, codec, 0, &inner);
            if codec == 3 {
                // KAFKA-3160: the header checksum over magic + descriptor.
                let mut v = w.value.as_deref().unwrap().to_vec();
                assert_eq!(v[6], (xxh32(&v[4..6]) >> 8) as u8, "xxh32 as lz4 has it");
                v[6] = (xxh32(&v[0..6]) >> 8) as u8;
                w.value = Some(Bytes::from(v.clone()));
                // The same broken frame in a v1 wrapper is refused.
                let mut v1 = w.clone();
                v1.magic = 1;
                if v[6] != (xxh32(&v[4..6]) >> 8) as u8 {
                    assert!(deep_records(&v1).is_err());
                }
            }
            let (recs, _) = deep_records(&w).unwrap();
            let got: Vec<(i64, i64)> = recs.iter().map(|r| (r.offset, r.timestamp)).collect();
            assert_eq!(got, vec![(40, -1), (41, -1)]);
        }
    }

    #[test]
    fn bad_wrappers_are_refused() {
        let inner = [msg(0, 1, 0, 1, b"a", b"1"), msg(1, 1, 0, 1, b"b", b"2")];
        // Wrapper offset below the last inner offset.
        assert!(deep_records(&wrapper(0, 1, 1, 0, &inner)).is_ok()); // librdkafka's 0
        let mut w = wrapper(5, 1, 1, 0, &inner);
        w.offset = 0;
        assert!(deep_records(&w).is_ok());
        let nested = wrapper(1, 1, 1, 0, &inner);
        assert!(deep_records(&wrapper(1, 1, 1, 0, &[nested]))
            .unwrap_err()
            .contains("compressed inner"));
        assert!(deep_records(&wrapper(1, 1, 1, 0, &[]))
            .unwrap_err()
            .contains("no message"));
        let mut null = wrapper(1, 1, 1, 0, &inner);
        null.value = None;
        assert!(deep_records(&null).is_err());
        let zstd = msg(1, 1, 4, 0, b"", b"junk");
        assert!(deep_records(&zstd).unwrap_err().contains("codec 4"));
        let out_of_order = [msg(1, 0, 0, 0, b"", b""), msg(1, 0, 0, 0, b"", b"")];
        assert!(deep_records(&wrapper(1, 0, 1, 0, &out_of_order)).is_err());
        let below = msg(3, 1, 0, 0, b"", b"");
        let w = wrapper(2, 1, 1, 0, &[below]);
        assert!(deep_records(&w).unwrap_err().contains("below"));
    }

    fn message_strategy() -> impl Strategy<Value = Message> {
        (
            0i64..1_000,
            0i8..=1,
            any::<bool>(),
            -1i64..4_000_000_000_000,
            prop::option::of(prop::collection::vec(any::<u8>(), 0..10)),
            prop::option::of(prop::collection::vec(any::<u8>(), 0..20)),
        )
            .prop_map(|(offset, magic, lat, ts, key, value)| Message {
                offset,
                magic,
                attributes: if lat && magic == 1 {
                    TIMESTAMP_TYPE_BIT
                } else {
                    0
                },
                timestamp: if magic == 0 { NO_TIMESTAMP } else { ts },
                key: key.map(Bytes::from),
                value: value.map(Bytes::from),
            })
    }

    proptest! {
        /// Arbitrary bytes never panic, whether parsed as a message or as a
        /// wrapper's (correctly checksummed) compressed value.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300), magic in 0i8..=1, codec in 0u8..8) {
            let _ = parse_message(&bytes);
            let mut framed = 0i64.to_be_bytes().to_vec();
            framed.extend_from_slice(&(bytes.len() as i32).to_be_bytes());
            framed.extend_from_slice(&bytes);
            let _ = parse_message(&framed);
            let w = Message { offset: 9, magic, attributes: codec, timestamp: 1, key: None, value: Some(Bytes::from(bytes.clone())) };
            let _ = deep_records(&w);
            let (_, n) = parse_message(&w.encode()).unwrap().unwrap();
            prop_assert_eq!(n, w.encode().len());
            let mut lz = b"\x04\x22\x4d\x18".to_vec();
            lz.extend_from_slice(&bytes);
            let w = Message { value: Some(Bytes::from(lz)), attributes: 3, ..w };
            let _ = deep_records(&w);
        }

        /// Messages round-trip through encode and parse; any flipped byte
        /// after the size field is caught (CRC, or a size that no longer fits).
        #[test]
        fn messages_round_trip(m in message_strategy(), flip in any::<prop::sample::Index>(), bit in 0u8..8) {
            let wire = m.encode();
            let (back, n) = parse_message(&wire).unwrap().unwrap();
            prop_assert_eq!(&back, &m);
            prop_assert_eq!(n, wire.len());
            let mut bad = wire.clone();
            let at = 12 + flip.index(wire.len() - 12);
            bad[at] ^= 1 << bit;
            prop_assert!(!matches!(parse_message(&bad), Ok(Some((ref x, _))) if *x == m));
        }

        /// Wrapped then up-converted, every record keeps its offset, key,
        /// value and timestamp, whatever the codec and the offset gaps.
        #[test]
        fn wrappers_convert_keeping_offsets(
            msgs in prop::collection::vec(message_strategy(), 1..12),
            gaps in prop::collection::vec(1i64..4, 12),
            codec in 1u8..=3, magic in 0i8..=1, lat in any::<bool>(), base in 0i64..1_000_000,
        ) {
            let mut rel = 0;
            let inner: Vec<Message> = msgs.into_iter().enumerate().map(|(i, mut m)| {
                if i > 0 { rel += gaps[i]; }
                m.offset = if magic == 1 { rel } else { base + rel };
                m.magic = magic;
                m.attributes = 0;
                if magic == 0 { m.timestamp = NO_TIMESTAMP; }
                m
            }).collect();
            let wrapper_offset = base + rel;
            let attrs = codec | if lat && magic == 1 { TIMESTAMP_TYPE_BIT } else { 0 };
            let w = wrapper(wrapper_offset, magic, attrs, 777, &inner);
            let wire = w.encode();
            let (parsed, _) = parse_message(&wire).unwrap().unwrap();
            let (recs, c) = deep_records(&parsed).unwrap();
            let v2 = to_v2(&recs, c).unwrap();
            let h = batch::validate(&v2).unwrap();
            prop_assert_eq!(h.base_offset, base);
            prop_assert_eq!(h.last_offset(), wrapper_offset);
            prop_assert_eq!(h.compression_codec(), codec as i16);
            let back = decode_v2(&v2);
            prop_assert_eq!(back.len(), inner.len());
            for (r, m) in back.iter().zip(&inner) {
                prop_assert_eq!(r.offset, if magic == 1 { base + m.offset } else { m.offset });
                prop_assert_eq!(&r.key, &m.key);
                prop_assert_eq!(&r.value, &m.value);
                let ts = if magic == 0 { -1 } else if lat { 777 } else { m.timestamp };
                prop_assert_eq!(r.timestamp, ts);
            }
        }
    }
}
