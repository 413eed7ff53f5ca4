//! The records inside a stored v2 batch: decoding them (decompressed),
//! and encoding a batch again from records (the cleaner's retained
//! batches; the broker's recompression for a topic's `compression.type`).

use bytes::{Bytes, BytesMut};

use crate::batch::{self, BatchHeader, BATCH_HEADER_LEN, LOG_OVERHEAD};
use crate::error::BatchError;

/// Attribute bit of a batch whose baseTimestamp holds its delete horizon (KIP-534).
pub const DELETE_HORIZON_BIT: i16 = 0x40;
const COMPRESSION_MASK: i16 = 0x07;

/// One record of a batch, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub attributes: i8,
    pub timestamp: i64,
    pub offset: i64,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    /// The headers as stored (count and entries), copied through.
    pub headers: Bytes,
}

fn corrupt(what: &'static str) -> BatchError {
    BatchError::Corrupt(what)
}

fn read_varlong(buf: &[u8], at: &mut usize) -> Result<i64, BatchError> {
    let mut value: u64 = 0;
    for shift in (0..70).step_by(7) {
        let byte = *buf.get(*at).ok_or(corrupt("truncated varint"))?;
        *at += 1;
        value |= ((byte & 0x7f) as u64) << shift;
        if byte & 0x80 == 0 {
            return Ok(((value >> 1) as i64) ^ -((value & 1) as i64));
        }
    }
    Err(corrupt("varint too long"))
}

fn write_varlong(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

fn read_bytes(buf: &Bytes, at: &mut usize) -> Result<Option<Bytes>, BatchError> {
    let len = read_varlong(buf, at)?;
    if len < 0 {
        return Ok(None);
    }
    let end = at
        .checked_add(len as usize)
        .filter(|e| *e <= buf.len())
        .ok_or(corrupt("record field past its end"))?;
    let b = buf.slice(*at..end);
    *at = end;
    Ok(Some(b))
}

/// The records section of a batch, decompressed.
fn records_section(header: &BatchHeader, batch: &[u8]) -> Result<Bytes, BatchError> {
    let raw = Bytes::copy_from_slice(&batch[BATCH_HEADER_LEN..]);
    use kafka_protocol::compression::Decompressor;
    let out: anyhow::Result<Bytes> = match header.compression_codec() {
        0 => Ok(raw),
        1 => kafka_protocol::compression::Gzip::decompress(&mut raw.clone(), |b: &mut Bytes| {
            Ok(b.clone())
        }),
        2 => kafka_protocol::compression::Snappy::decompress(&mut raw.clone(), |b: &mut Bytes| {
            Ok(b.clone())
        }),
        3 => kafka_protocol::compression::Lz4::decompress(&mut raw.clone(), |b: &mut Bytes| {
            Ok(b.clone())
        }),
        4 => kafka_protocol::compression::Zstd::decompress(&mut raw.clone(), |b: &mut Bytes| {
            Ok(b.clone())
        }),
        _ => return Err(corrupt("unknown compression codec")),
    };
    out.map_err(|_| corrupt("records do not decompress"))
}

fn compress(codec: i16, plain: Vec<u8>) -> Result<Vec<u8>, BatchError> {
    use kafka_protocol::compression::Compressor;
    let mut out = BytesMut::new();
    let fill = |b: &mut BytesMut| -> anyhow::Result<()> {
        b.extend_from_slice(&plain);
        Ok(())
    };
    let done = match codec {
        0 => return Ok(plain),
        1 => kafka_protocol::compression::Gzip::compress(&mut out, fill),
        2 => kafka_protocol::compression::Snappy::compress(&mut out, fill),
        3 => kafka_protocol::compression::Lz4::compress(&mut out, fill),
        4 => kafka_protocol::compression::Zstd::compress(&mut out, fill),
        _ => return Err(corrupt("unknown compression codec")),
    };
    done.map_err(|_| corrupt("records do not compress"))?;
    Ok(out.to_vec())
}

/// Decodes every record of a stored (valid) batch, decompressing it.
pub fn decode_records(batch: &[u8]) -> Result<Vec<Record>, BatchError> {
    let header = batch::parse_header(batch)?;
    if header.total_len() != batch.len() {
        return Err(corrupt("batchLength does not match the batch size"));
    }
    let section = records_section(&header, batch)?;
    let mut at = 0usize;
    let count = header.record_count.max(0) as usize;
    let mut out = Vec::with_capacity(count.min(section.len()));
    for _ in 0..count {
        let len = read_varlong(&section, &mut at)?;
        let end = at
            .checked_add(usize::try_from(len).map_err(|_| corrupt("negative record length"))?)
            .filter(|e| *e <= section.len())
            .ok_or(corrupt("record past the batch end"))?;
        let body = section.slice(at..end);
        let mut i = 0usize;
        let attributes = *body.first().ok_or(corrupt("empty record"))? as i8;
        i += 1;
        let ts_delta = read_varlong(&body, &mut i)?;
        let offset_delta = read_varlong(&body, &mut i)?;
        let key = read_bytes(&body, &mut i)?;
        let value = read_bytes(&body, &mut i)?;
        let headers = body.slice(i..);
        out.push(Record {
            attributes,
            timestamp: header.base_timestamp.wrapping_add(ts_delta),
            offset: header.base_offset.wrapping_add(offset_delta),
            key,
            value,
            headers,
        });
        at = end;
    }
    Ok(out)
}

fn encode_record(out: &mut Vec<u8>, r: &Record, base_offset: i64, base_timestamp: i64) {
    let mut body = Vec::with_capacity(
        16 + r.key.as_ref().map_or(0, |k| k.len())
            + r.value.as_ref().map_or(0, |v| v.len())
            + r.headers.len(),
    );
    body.push(r.attributes as u8);
    write_varlong(&mut body, r.timestamp.wrapping_sub(base_timestamp));
    write_varlong(&mut body, r.offset.wrapping_sub(base_offset));
    for field in [&r.key, &r.value] {
        match field {
            Some(b) => {
                write_varlong(&mut body, b.len() as i64);
                body.extend_from_slice(b);
            }
            None => write_varlong(&mut body, -1),
        }
    }
    body.extend_from_slice(&r.headers);
    write_varlong(out, body.len() as i64);
    out.extend_from_slice(&body);
}

/// Re-encodes a batch holding `records` (a subset of `original`'s, in
/// order): base offset, last offset delta, leader epoch, producer fields,
/// compression and flags kept as in `original` (Kafka's
/// `buildRetainedRecordsInto` with `overrideLastOffset`), the delete horizon
/// stamped when given, maxTimestamp recomputed (kept for LogAppendTime),
/// CRC-32C recomputed. With no records this is Kafka's retained empty batch
/// (`writeEmptyHeader`): uncompressed, base and max timestamp = the
/// original's max timestamp.
pub fn encode_batch(
    original: &BatchHeader,
    records: &[Record],
    delete_horizon: Option<i64>,
) -> Result<Vec<u8>, BatchError> {
    let log_append = original.is_log_append_time();
    let mut attributes = original.attributes;
    let (base_timestamp, max_timestamp, section) = if records.is_empty() {
        attributes &= !COMPRESSION_MASK;
        let ts = original.max_timestamp;
        (ts, ts, Vec::new())
    } else {
        let base_timestamp = match delete_horizon.or_else(|| {
            (original.attributes & DELETE_HORIZON_BIT != 0).then_some(original.base_timestamp)
        }) {
            Some(h) => h,
            None => records[0].timestamp,
        };
        let max_timestamp = if log_append {
            original.max_timestamp
        } else {
            records.iter().map(|r| r.timestamp).max().unwrap_or(-1)
        };
        let mut plain = Vec::new();
        for r in records {
            encode_record(&mut plain, r, original.base_offset, base_timestamp);
        }
        let section = compress(original.compression_codec(), plain)?;
        (base_timestamp, max_timestamp, section)
    };
    if delete_horizon.is_some() && !records.is_empty() {
        attributes |= DELETE_HORIZON_BIT;
    }
    let mut b = Vec::with_capacity(BATCH_HEADER_LEN + section.len());
    b.extend_from_slice(&original.base_offset.to_be_bytes());
    b.extend_from_slice(&0i32.to_be_bytes()); // batchLength, below
    b.extend_from_slice(&original.partition_leader_epoch.to_be_bytes());
    b.push(2);
    b.extend_from_slice(&0u32.to_be_bytes()); // crc, below
    b.extend_from_slice(&attributes.to_be_bytes());
    b.extend_from_slice(&original.last_offset_delta.to_be_bytes());
    b.extend_from_slice(&base_timestamp.to_be_bytes());
    b.extend_from_slice(&max_timestamp.to_be_bytes());
    b.extend_from_slice(&original.producer_id.to_be_bytes());
    b.extend_from_slice(&original.producer_epoch.to_be_bytes());
    b.extend_from_slice(&original.base_sequence.to_be_bytes());
    b.extend_from_slice(&(records.len() as i32).to_be_bytes());
    b.extend_from_slice(&section);
    let len = (b.len() - LOG_OVERHEAD) as i32;
    b[8..12].copy_from_slice(&len.to_be_bytes());
    let crc = batch::compute_crc(&b);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    Ok(b)
}

/// One record's key and value.
pub type KeyValue<'a> = (Option<&'a [u8]>, Option<&'a [u8]>);

/// An uncompressed v2 batch of `records` (key, value) at offsets 0.., all
/// at `timestamp`, with the given producer fields and attributes: the
/// batches coordinators write themselves (Kafka's `MemoryRecords.withRecords`
/// and `withTransactionalRecords`).
pub fn build_batch(
    producer_id: i64,
    epoch: i16,
    base_sequence: i32,
    attributes: i16,
    timestamp: i64,
    records: &[KeyValue<'_>],
) -> Vec<u8> {
    let header = BatchHeader {
        base_offset: 0,
        batch_length: 0,
        partition_leader_epoch: -1,
        magic: 2,
        crc: 0,
        attributes: attributes & !COMPRESSION_MASK,
        last_offset_delta: records.len() as i32 - 1,
        base_timestamp: timestamp,
        max_timestamp: timestamp,
        producer_id,
        producer_epoch: epoch,
        base_sequence,
        record_count: records.len() as i32,
    };
    let records: Vec<Record> = records
        .iter()
        .enumerate()
        .map(|(i, (key, value))| Record {
            attributes: 0,
            timestamp,
            offset: i as i64,
            key: key.map(Bytes::copy_from_slice),
            value: value.map(Bytes::copy_from_slice),
            headers: Bytes::from_static(&[0]), // no headers
        })
        .collect();
    encode_batch(&header, &records, None).expect("an uncompressed batch encodes")
}

/// A COMMIT or ABORT marker (Kafka's `EndTransactionMarker`): a control
/// batch of one record, key `[version 0][type: 0 abort, 1 commit]`, value
/// `[version 0][coordinator epoch]`.
pub fn end_txn_marker(
    producer_id: i64,
    epoch: i16,
    commit: bool,
    coordinator_epoch: i32,
    timestamp: i64,
) -> Vec<u8> {
    let key = [0u8, 0, 0, commit as u8];
    let mut value = vec![0u8, 0];
    value.extend_from_slice(&coordinator_epoch.to_be_bytes());
    build_batch(
        producer_id,
        epoch,
        -1,
        batch::TRANSACTIONAL_BIT | batch::CONTROL_BIT,
        timestamp,
        &[(Some(&key), Some(&value))],
    )
}

/// The marker type of a control record's key: `Some(true)` COMMIT,
/// `Some(false)` ABORT, None for a key that is neither.
pub fn marker_is_commit(key: &[u8]) -> Option<bool> {
    if key.len() < 4 {
        return None;
    }
    match i16::from_be_bytes([key[2], key[3]]) {
        0 => Some(false),
        1 => Some(true),
        _ => None,
    }
}

/// Kafka's codec ids in a batch's attributes.
pub mod codec {
    pub const NONE: i16 = 0;
    pub const GZIP: i16 = 1;
    pub const SNAPPY: i16 = 2;
    pub const LZ4: i16 = 3;
    pub const ZSTD: i16 = 4;
}

/// The batch with its records compressed with `codec` instead (Kafka's
/// `LogValidator` when a topic's `compression.type` differs from the
/// producer's): records, offsets, timestamps, producer fields and flags
/// kept, a new CRC-32C. A batch already in `codec` is returned as it is.
pub fn recompress(batch: &[u8], codec: i16) -> Result<Vec<u8>, BatchError> {
    let header = batch::parse_header(batch)?;
    if header.compression_codec() == codec {
        return Ok(batch.to_vec());
    }
    let records = decode_records(batch)?;
    let mut target = header;
    target.attributes = (header.attributes & !COMPRESSION_MASK) | (codec & COMPRESSION_MASK);
    let delete_horizon =
        (header.attributes & DELETE_HORIZON_BIT != 0).then_some(header.base_timestamp);
    encode_batch(&target, &records, delete_horizon)
}

/// Records (kafka-protocol's, with their offsets, timestamps and producer
/// fields as given) encoded as v2 with `compression`: the batches the
/// broker writes itself (coordinator records, migration's up-conversion)
/// and the ones tests build. kafka-protocol's encoder starts a new batch
/// whenever `offset - sequence` changes, so callers keep that constant to
/// get one batch.
pub fn encode_v2(
    records: &[kafka_protocol::records::Record],
    compression: kafka_protocol::records::Compression,
) -> Result<BytesMut, BatchError> {
    let mut buf = BytesMut::new();
    kafka_protocol::records::RecordBatchEncoder::encode(
        &mut buf,
        records,
        &kafka_protocol::records::RecordEncodeOptions {
            version: 2,
            compression,
        },
    )
    .map_err(|e| BatchError::Encode(e.to_string()))?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn plain_batch(values: &[Option<Vec<u8>>], codec: i16) -> Vec<u8> {
        use kafka_protocol::records::{Compression, Record as KRecord, TimestampType};
        let records: Vec<KRecord> = values
            .iter()
            .enumerate()
            .map(|(i, v)| KRecord {
                transactional: false,
                control: false,
                partition_leader_epoch: 0,
                producer_id: 7,
                producer_epoch: 1,
                timestamp_type: TimestampType::Creation,
                offset: i as i64,
                sequence: i as i32,
                timestamp: 1_000 + i as i64,
                key: Some(Bytes::from(format!("k{i}"))),
                value: v.clone().map(Bytes::from),
                headers: Default::default(),
                delete_horizon: false,
            })
            .collect();
        let compression = match codec {
            codec::GZIP => Compression::Gzip,
            codec::SNAPPY => Compression::Snappy,
            codec::LZ4 => Compression::Lz4,
            codec::ZSTD => Compression::Zstd,
            _ => Compression::None,
        };
        encode_v2(&records, compression).unwrap().to_vec()
    }

    const CODECS: [i16; 5] = [
        codec::NONE,
        codec::GZIP,
        codec::SNAPPY,
        codec::LZ4,
        codec::ZSTD,
    ];

    proptest! {
        /// Every codec to every codec: the same records, a valid batch in
        /// the new codec, the producer fields and offsets kept.
        #[test]
        fn recompression_keeps_records(
            values in proptest::collection::vec(
                proptest::option::of(proptest::collection::vec(any::<u8>(), 0..200)), 1..20),
            from in 0usize..5,
            to in 0usize..5,
        ) {
            let original = plain_batch(&values, CODECS[from]);
            let out = recompress(&original, CODECS[to]).unwrap();
            let header = batch::validate(&out).unwrap();
            let before = batch::parse_header(&original).unwrap();
            prop_assert_eq!(header.compression_codec(), CODECS[to]);
            prop_assert_eq!(decode_records(&out).unwrap(), decode_records(&original).unwrap());
            prop_assert_eq!(
                (header.producer_id, header.producer_epoch, header.base_sequence,
                 header.last_offset_delta, header.record_count, header.max_timestamp),
                (before.producer_id, before.producer_epoch, before.base_sequence,
                 before.last_offset_delta, before.record_count, before.max_timestamp)
            );
            if from == to {
                prop_assert_eq!(out, original);
            }
        }
    }

    #[test]
    fn end_txn_marker_is_a_valid_marker() {
        use kafka_protocol::records::RecordBatchDecoder;
        for commit in [true, false] {
            let b = end_txn_marker(77, 5, commit, 3, 1234);
            let header = batch::validate(&b).unwrap();
            assert!(header.is_control() && header.is_transactional());
            assert_eq!((header.producer_id, header.producer_epoch), (77, 5));
            assert_eq!(batch::control_marker_is_commit(&b), Some(commit));
            let mut bytes = Bytes::from(b);
            let sets = RecordBatchDecoder::decode_all(&mut bytes).unwrap();
            let r = &sets[0].records[0];
            assert!(r.control);
            assert_eq!(marker_is_commit(r.key.as_ref().unwrap()), Some(commit));
            assert_eq!(&r.value.as_ref().unwrap()[..], &[0, 0, 0, 0, 0, 3]);
        }
        assert_eq!(marker_is_commit(&[0, 0, 0, 7]), None);
        assert_eq!(marker_is_commit(&[0, 0]), None);
    }

    #[test]
    fn a_built_transactional_batch_decodes() {
        use kafka_protocol::records::RecordBatchDecoder;
        let b = build_batch(
            9,
            1,
            4,
            batch::TRANSACTIONAL_BIT,
            99,
            &[(Some(b"k1"), Some(b"v1")), (Some(b"k2"), None)],
        );
        let header = batch::validate(&b).unwrap();
        assert!(header.is_transactional() && !header.is_control());
        assert_eq!(header.base_sequence, 4);
        assert_eq!((header.base_timestamp, header.max_timestamp), (99, 99));
        assert_eq!(header.partition_leader_epoch, -1);
        let mut bytes = Bytes::from(b);
        let sets = RecordBatchDecoder::decode_all(&mut bytes).unwrap();
        let rs = &sets[0].records;
        assert_eq!(rs.len(), 2);
        assert!(rs[0].transactional);
        assert_eq!(rs[0].producer_id, 9);
        assert_eq!(rs[1].offset, 1);
        assert!(rs[1].value.is_none());
        assert!(rs[1].headers.is_empty());
    }
}
