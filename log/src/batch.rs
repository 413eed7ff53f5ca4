//! Kafka v2 record batch headers: parse, validate, and the few in-place rewrites
//! the broker is allowed to make (baseOffset, partitionLeaderEpoch, and the
//! LogAppendTime timestamp fields). Everything else stays byte for byte.

use crate::error::BatchError;

/// Size of the fixed v2 batch header, up to and including `recordCount`.
pub const BATCH_HEADER_LEN: usize = 61;
/// Bytes before `batchLength` counts: baseOffset (8) + batchLength (4).
pub const LOG_OVERHEAD: usize = 12;

const OFF_BATCH_LENGTH: usize = 8;
const OFF_LEADER_EPOCH: usize = 12;
const OFF_MAGIC: usize = 16;
const OFF_CRC: usize = 17;
const OFF_ATTRIBUTES: usize = 21;
const OFF_LAST_OFFSET_DELTA: usize = 23;
const OFF_BASE_TIMESTAMP: usize = 27;
const OFF_MAX_TIMESTAMP: usize = 35;
const OFF_PRODUCER_ID: usize = 43;
const OFF_PRODUCER_EPOCH: usize = 51;
const OFF_BASE_SEQUENCE: usize = 53;
const OFF_RECORD_COUNT: usize = 57;

/// Attribute bit that marks LogAppendTime.
const TIMESTAMP_TYPE_BIT: i16 = 0x08;
/// Attribute bit of a transactional batch.
pub const TRANSACTIONAL_BIT: i16 = 0x10;
/// Attribute bit of a control batch (transaction markers).
pub const CONTROL_BIT: i16 = 0x20;

/// The decoded fixed header of one v2 record batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: i64,
    pub batch_length: i32,
    pub partition_leader_epoch: i32,
    pub magic: i8,
    pub crc: u32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub record_count: i32,
}

impl BatchHeader {
    /// Total size of the batch on the wire, header included.
    pub fn total_len(&self) -> usize {
        self.batch_length as usize + LOG_OVERHEAD
    }
    pub fn compression_codec(&self) -> i16 {
        self.attributes & 0x07
    }
    pub fn is_log_append_time(&self) -> bool {
        self.attributes & TIMESTAMP_TYPE_BIT != 0
    }
    pub fn is_transactional(&self) -> bool {
        self.attributes & TRANSACTIONAL_BIT != 0
    }
    pub fn is_control(&self) -> bool {
        self.attributes & CONTROL_BIT != 0
    }
    pub fn last_offset(&self) -> i64 {
        self.base_offset + self.last_offset_delta as i64
    }
}

fn be_i16(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}
fn be_i32(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}
fn be_i64(b: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(b[at..at + 8].try_into().unwrap())
}

/// Reads the fixed header without checking the CRC. `buf` must start at a batch.
pub fn parse_header(buf: &[u8]) -> Result<BatchHeader, BatchError> {
    if buf.len() < BATCH_HEADER_LEN {
        return Err(BatchError::Corrupt("record batch shorter than its header"));
    }
    let header = BatchHeader {
        base_offset: be_i64(buf, 0),
        batch_length: be_i32(buf, OFF_BATCH_LENGTH),
        partition_leader_epoch: be_i32(buf, OFF_LEADER_EPOCH),
        magic: buf[OFF_MAGIC] as i8,
        crc: u32::from_be_bytes(buf[OFF_CRC..OFF_CRC + 4].try_into().unwrap()),
        attributes: be_i16(buf, OFF_ATTRIBUTES),
        last_offset_delta: be_i32(buf, OFF_LAST_OFFSET_DELTA),
        base_timestamp: be_i64(buf, OFF_BASE_TIMESTAMP),
        max_timestamp: be_i64(buf, OFF_MAX_TIMESTAMP),
        producer_id: be_i64(buf, OFF_PRODUCER_ID),
        producer_epoch: be_i16(buf, OFF_PRODUCER_EPOCH),
        base_sequence: be_i32(buf, OFF_BASE_SEQUENCE),
        record_count: be_i32(buf, OFF_RECORD_COUNT),
    };
    if header.magic != 2 {
        return Err(BatchError::UnsupportedMagic(header.magic));
    }
    if (header.batch_length as i64) < (BATCH_HEADER_LEN - LOG_OVERHEAD) as i64 {
        return Err(BatchError::Corrupt(
            "batchLength smaller than the batch header",
        ));
    }
    Ok(header)
}

/// CRC-32C of a batch as Kafka computes it: from `attributes` to the end.
pub fn compute_crc(batch: &[u8]) -> u32 {
    crc32c::crc32c(&batch[OFF_ATTRIBUTES..])
}

/// Parses and fully validates one batch that spans exactly `batch`:
/// magic 2, a length that matches, a sane record count and a correct CRC-32C.
pub fn validate(batch: &[u8]) -> Result<BatchHeader, BatchError> {
    let header = parse_header(batch)?;
    if header.total_len() != batch.len() {
        return Err(BatchError::Corrupt(
            "batchLength does not match the batch size",
        ));
    }
    if header.last_offset_delta < 0 || header.record_count < 0 {
        return Err(BatchError::Corrupt("negative record count or offset delta"));
    }
    if header.record_count == 0 && !header.is_control() {
        return Err(BatchError::Corrupt("record batch holds no records"));
    }
    if compute_crc(batch) != header.crc {
        return Err(BatchError::CrcMismatch);
    }
    Ok(header)
}

/// Splits a produce request's `records` bytes into batches. Every batch must
/// be complete: a trailing partial batch is corrupt input, not something to skip.
pub fn split_batches(records: &[u8]) -> Result<Vec<std::ops::Range<usize>>, BatchError> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < records.len() {
        let rest = &records[at..];
        if rest.len() < LOG_OVERHEAD + 5 {
            return Err(BatchError::Corrupt("truncated record batch"));
        }
        let batch_length = be_i32(rest, OFF_BATCH_LENGTH);
        if batch_length < (BATCH_HEADER_LEN - LOG_OVERHEAD) as i32 {
            return Err(BatchError::Corrupt(
                "batchLength smaller than the batch header",
            ));
        }
        let total = batch_length as usize + LOG_OVERHEAD;
        if total > rest.len() {
            return Err(BatchError::Corrupt("truncated record batch"));
        }
        out.push(at..at + total);
        at += total;
    }
    Ok(out)
}

/// Reads an unsigned-zigzag varint (Kafka's record varints) at `at`.
fn read_varint(buf: &[u8], at: &mut usize) -> Option<i64> {
    let mut value: u64 = 0;
    for shift in (0..64).step_by(7) {
        let byte = *buf.get(*at)?;
        *at += 1;
        value |= ((byte & 0x7f) as u64) << shift;
        if byte & 0x80 == 0 {
            return Some(((value >> 1) as i64) ^ -((value & 1) as i64));
        }
    }
    None
}

/// The `IndexEntry` flags of a validated batch: transactional, control, and
/// for a control batch whether its marker commits (key type 1) or aborts (0).
pub fn index_flags(header: &BatchHeader, batch: &[u8]) -> u8 {
    use crate::txn_state::{FLAG_COMMIT, FLAG_CONTROL, FLAG_TRANSACTIONAL};
    let mut flags = 0;
    if header.is_transactional() {
        flags |= FLAG_TRANSACTIONAL;
    }
    if header.is_control() {
        flags |= FLAG_CONTROL;
        if control_marker_is_commit(batch) == Some(true) {
            flags |= FLAG_COMMIT;
        }
    }
    flags
}

/// A control batch's first record key is `[version: i16][type: i16]`, type 0
/// ABORT and 1 COMMIT. Control batches are never compressed.
pub fn control_marker_is_commit(batch: &[u8]) -> Option<bool> {
    let mut at = BATCH_HEADER_LEN;
    let _length = read_varint(batch, &mut at)?;
    at += 1; // attributes
    read_varint(batch, &mut at)?; // timestamp delta
    read_varint(batch, &mut at)?; // offset delta
    let key_len = read_varint(batch, &mut at)?;
    if key_len < 4 {
        return None;
    }
    let key = batch.get(at..at + 4)?;
    Some(i16::from_be_bytes([key[2], key[3]]) == 1)
}

/// Rewrites baseOffset; it lies outside the CRC.
pub fn set_base_offset(batch: &mut [u8], base_offset: i64) {
    batch[0..8].copy_from_slice(&base_offset.to_be_bytes());
}

/// Rewrites partitionLeaderEpoch; it lies outside the CRC.
pub fn set_partition_leader_epoch(batch: &mut [u8], epoch: i32) {
    batch[OFF_LEADER_EPOCH..OFF_LEADER_EPOCH + 4].copy_from_slice(&epoch.to_be_bytes());
}

/// Applies LogAppendTime as Kafka does: timestamp type bit set, maxTimestamp
/// set to the broker's clock, CRC recomputed.
pub fn set_log_append_time(batch: &mut [u8], now_ms: i64) {
    let attributes = be_i16(batch, OFF_ATTRIBUTES) | TIMESTAMP_TYPE_BIT;
    batch[OFF_ATTRIBUTES..OFF_ATTRIBUTES + 2].copy_from_slice(&attributes.to_be_bytes());
    batch[OFF_MAX_TIMESTAMP..OFF_MAX_TIMESTAMP + 8].copy_from_slice(&now_ms.to_be_bytes());
    let crc = compute_crc(batch);
    batch[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
}

/// Builders for tests in this and other crates.
#[doc(hidden)]
pub mod testing {
    use super::*;

    /// A minimal valid uncompressed batch of `count` one-byte records.
    pub fn make_batch(count: i32, timestamp: i64) -> Vec<u8> {
        let mut records = Vec::new();
        for i in 0..count {
            // length, attributes, timestampDelta, offsetDelta, keyLen(-1), valueLen(1), value, headers(0)
            let body = [0u8, 0, (i as u8) << 1, 1, 2, b'x', 0];
            records.push((body.len() as u8) << 1);
            records.extend_from_slice(&body);
        }
        let mut b = Vec::new();
        b.extend_from_slice(&0i64.to_be_bytes());
        b.extend_from_slice(&0i32.to_be_bytes()); // length, patched below
        b.extend_from_slice(&(-1i32).to_be_bytes());
        b.push(2);
        b.extend_from_slice(&0u32.to_be_bytes());
        b.extend_from_slice(&0i16.to_be_bytes());
        b.extend_from_slice(&(count - 1).to_be_bytes());
        b.extend_from_slice(&timestamp.to_be_bytes());
        b.extend_from_slice(&timestamp.to_be_bytes());
        b.extend_from_slice(&(-1i64).to_be_bytes());
        b.extend_from_slice(&(-1i16).to_be_bytes());
        b.extend_from_slice(&(-1i32).to_be_bytes());
        b.extend_from_slice(&count.to_be_bytes());
        b.extend_from_slice(&records);
        let len = (b.len() - LOG_OVERHEAD) as i32;
        b[8..12].copy_from_slice(&len.to_be_bytes());
        let crc = compute_crc(&b);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        b
    }

    /// A COMMIT (`commit`) or ABORT control batch of a transactional producer.
    pub fn make_control_batch(producer_id: i64, epoch: i16, commit: bool) -> Vec<u8> {
        // One record: key = [version 0][type], value = [version 0][coordinator epoch 0].
        let key = [0u8, 0, 0, commit as u8];
        let value = [0u8, 0, 0, 0, 0, 0];
        let mut body = vec![0u8, 0, 0]; // attributes, timestampDelta 0, offsetDelta 0
        body.push((key.len() as u8) << 1);
        body.extend_from_slice(&key);
        body.push((value.len() as u8) << 1);
        body.extend_from_slice(&value);
        body.push(0); // headers
        let mut b = make_batch(1, 0);
        b.truncate(BATCH_HEADER_LEN);
        b.push((body.len() as u8) << 1);
        b.extend_from_slice(&body);
        let attributes: i16 = 0x10 | 0x20;
        b[OFF_ATTRIBUTES..OFF_ATTRIBUTES + 2].copy_from_slice(&attributes.to_be_bytes());
        b[OFF_PRODUCER_ID..OFF_PRODUCER_ID + 8].copy_from_slice(&producer_id.to_be_bytes());
        b[OFF_PRODUCER_EPOCH..OFF_PRODUCER_EPOCH + 2].copy_from_slice(&epoch.to_be_bytes());
        let len = (b.len() - LOG_OVERHEAD) as i32;
        b[8..12].copy_from_slice(&len.to_be_bytes());
        let crc = compute_crc(&b);
        b[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
        b
    }

    /// Like [`make_batch`], from a transactional producer.
    pub fn make_transactional_batch(
        count: i32,
        timestamp: i64,
        producer_id: i64,
        epoch: i16,
        base_sequence: i32,
    ) -> Vec<u8> {
        let mut b = make_idempotent_batch(count, timestamp, producer_id, epoch, base_sequence);
        let attributes = be_i16(&b, OFF_ATTRIBUTES) | TRANSACTIONAL_BIT;
        b[OFF_ATTRIBUTES..OFF_ATTRIBUTES + 2].copy_from_slice(&attributes.to_be_bytes());
        let crc = compute_crc(&b);
        b[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
        b
    }

    /// Like [`make_batch`], from an idempotent producer.
    pub fn make_idempotent_batch(
        count: i32,
        timestamp: i64,
        producer_id: i64,
        epoch: i16,
        base_sequence: i32,
    ) -> Vec<u8> {
        let mut b = make_batch(count, timestamp);
        b[OFF_PRODUCER_ID..OFF_PRODUCER_ID + 8].copy_from_slice(&producer_id.to_be_bytes());
        b[OFF_PRODUCER_EPOCH..OFF_PRODUCER_EPOCH + 2].copy_from_slice(&epoch.to_be_bytes());
        b[OFF_BASE_SEQUENCE..OFF_BASE_SEQUENCE + 4].copy_from_slice(&base_sequence.to_be_bytes());
        let crc = compute_crc(&b);
        b[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::testing::make_batch;
    use super::*;

    #[test]
    fn valid_batch_round_trips() {
        let b = make_batch(3, 1000);
        let h = validate(&b).unwrap();
        assert_eq!(h.record_count, 3);
        assert_eq!(h.last_offset_delta, 2);
        assert_eq!(h.max_timestamp, 1000);
    }

    #[test]
    fn crc_mismatch_detected() {
        let mut b = make_batch(2, 5);
        let last = b.len() - 1;
        b[last] ^= 0xff;
        assert_eq!(validate(&b), Err(BatchError::CrcMismatch));
    }

    #[test]
    fn offset_and_epoch_rewrite_keep_crc_valid() {
        let mut b = make_batch(2, 5);
        set_base_offset(&mut b, 77);
        set_partition_leader_epoch(&mut b, 3);
        let h = validate(&b).unwrap();
        assert_eq!((h.base_offset, h.partition_leader_epoch), (77, 3));
    }

    #[test]
    fn log_append_time_recomputes_crc() {
        let mut b = make_batch(2, 5);
        set_log_append_time(&mut b, 999);
        let h = validate(&b).unwrap();
        assert!(h.is_log_append_time());
        assert_eq!(h.max_timestamp, 999);
    }

    #[test]
    fn split_rejects_truncated_tail() {
        let mut two = make_batch(1, 1);
        two.extend(make_batch(2, 2));
        assert_eq!(split_batches(&two).unwrap().len(), 2);
        assert!(split_batches(&two[..two.len() - 1]).is_err());
    }

    #[test]
    fn control_markers_are_recognised() {
        use super::testing::{make_control_batch, make_transactional_batch};
        use crate::txn_state::{FLAG_COMMIT, FLAG_CONTROL, FLAG_TRANSACTIONAL};
        let commit = make_control_batch(7, 0, true);
        let h = validate(&commit).unwrap();
        assert_eq!(
            index_flags(&h, &commit),
            FLAG_TRANSACTIONAL | FLAG_CONTROL | FLAG_COMMIT
        );
        let abort = make_control_batch(7, 0, false);
        let h = validate(&abort).unwrap();
        assert_eq!(index_flags(&h, &abort), FLAG_TRANSACTIONAL | FLAG_CONTROL);
        let data = make_transactional_batch(2, 1, 7, 0, 0);
        let h = validate(&data).unwrap();
        assert_eq!(index_flags(&h, &data), FLAG_TRANSACTIONAL);
    }

    #[test]
    fn wrong_magic_is_unsupported() {
        let mut b = make_batch(1, 1);
        b[16] = 1;
        assert_eq!(validate(&b), Err(BatchError::UnsupportedMagic(1)));
    }

    proptest::proptest! {
        #[test]
        fn random_bytes_never_panic(data in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
            if let Ok(ranges) = split_batches(&data) {
                for r in ranges { let _ = validate(&data[r]); }
            }
        }
    }
}
