//! `__transaction_state` records in Kafka's format (TransactionLogKey v0,
//! TransactionLogValue v0): the key is the transactional id, the value the
//! whole metadata; a null value (tombstone) removes the id. Also the record
//! batches the coordinator writes to data partitions: COMMIT/ABORT control
//! batches and transactional offset-commit batches.

use std::collections::BTreeMap;

use bytes::{BufMut, Bytes, BytesMut};

use super::state::{TxnMetadata, TxnState, NO_PRODUCER_EPOCH, NO_PRODUCER_ID};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodecError {
    #[error("truncated {0}")]
    Truncated(&'static str),
    #[error("unknown {what} version {version}")]
    UnknownVersion { what: &'static str, version: i16 },
    #[error("invalid {0}")]
    Invalid(&'static str),
}

/// TransactionLogKey v0: `[version i16 = 0][transactional id: string]`.
pub fn encode_key(transactional_id: &str) -> Bytes {
    let mut b = BytesMut::with_capacity(4 + transactional_id.len());
    b.put_i16(0);
    put_string(&mut b, transactional_id);
    b.freeze()
}

pub fn decode_key(key: &[u8]) -> Result<String, CodecError> {
    let mut r = Reader(key);
    let version = r.i16("key version")?;
    if version != 0 {
        return Err(CodecError::UnknownVersion {
            what: "key",
            version,
        });
    }
    r.string("transactional id")
}

/// TransactionLogValue v0. Empty writes a null partition list, as Kafka.
pub fn encode_value(m: &TxnMetadata) -> Bytes {
    let mut b = BytesMut::with_capacity(64);
    b.put_i16(0);
    b.put_i64(m.producer_id);
    b.put_i16(m.producer_epoch);
    b.put_i32(m.timeout_ms);
    b.put_i8(m.state.id());
    if m.state == TxnState::Empty {
        b.put_i32(-1);
    } else {
        let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
        for (t, p) in &m.partitions {
            by_topic.entry(t.as_str()).or_default().push(*p);
        }
        b.put_i32(by_topic.len() as i32);
        for (t, ps) in by_topic {
            put_string(&mut b, t);
            b.put_i32(ps.len() as i32);
            for p in ps {
                b.put_i32(p);
            }
        }
    }
    b.put_i64(m.last_update_ms);
    b.put_i64(m.start_ms);
    b.freeze()
}

pub fn decode_value(transactional_id: &str, value: &[u8]) -> Result<TxnMetadata, CodecError> {
    let mut r = Reader(value);
    let version = r.i16("value version")?;
    if !(0..=1).contains(&version) {
        return Err(CodecError::UnknownVersion {
            what: "value",
            version,
        });
    }
    if version == 1 {
        // v1 is flexible (compact strings, tagged fields); this build writes v0.
        return Err(CodecError::UnknownVersion {
            what: "value",
            version,
        });
    }
    let producer_id = r.i64("producer id")?;
    let producer_epoch = r.i16("producer epoch")?;
    let timeout_ms = r.i32("timeout")?;
    let state = TxnState::from_id(r.i8("state")?).ok_or(CodecError::Invalid("state"))?;
    let mut partitions = std::collections::BTreeSet::new();
    let topics = r.i32("partition count")?;
    if topics < -1 {
        return Err(CodecError::Invalid("partition count"));
    }
    for _ in 0..topics.max(0) {
        let topic = r.string("topic")?;
        let n = r.i32("partition ids")?;
        if n < 0 {
            return Err(CodecError::Invalid("partition ids"));
        }
        for _ in 0..n {
            partitions.insert((topic.clone(), r.i32("partition")?));
        }
    }
    let last_update_ms = r.i64("last update")?;
    let start_ms = r.i64("start")?;
    Ok(TxnMetadata {
        transactional_id: transactional_id.to_string(),
        producer_id,
        last_producer_id: NO_PRODUCER_ID,
        producer_epoch,
        last_producer_epoch: NO_PRODUCER_EPOCH,
        timeout_ms,
        state,
        partitions,
        start_ms,
        last_update_ms,
    })
}

fn put_string(b: &mut BytesMut, s: &str) {
    b.put_i16(s.len() as i16);
    b.put_slice(s.as_bytes());
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&[u8], CodecError> {
        if self.0.len() < n {
            return Err(CodecError::Truncated(what));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    fn i8(&mut self, what: &'static str) -> Result<i8, CodecError> {
        Ok(self.take(1, what)?[0] as i8)
    }
    fn i16(&mut self, what: &'static str) -> Result<i16, CodecError> {
        Ok(i16::from_be_bytes(self.take(2, what)?.try_into().unwrap()))
    }
    fn i32(&mut self, what: &'static str) -> Result<i32, CodecError> {
        Ok(i32::from_be_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    fn i64(&mut self, what: &'static str) -> Result<i64, CodecError> {
        Ok(i64::from_be_bytes(self.take(8, what)?.try_into().unwrap()))
    }
    fn string(&mut self, what: &'static str) -> Result<String, CodecError> {
        let n = self.i16(what)?;
        if n < 0 {
            return Err(CodecError::Invalid(what));
        }
        let bytes = self.take(n as usize, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| CodecError::Invalid(what))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(state: TxnState) -> TxnMetadata {
        let mut m = TxnMetadata::new("my-txn", 4242, 60_000, 1_700_000_000_000);
        m.producer_epoch = 3;
        m.state = state;
        if state != TxnState::Empty {
            m.partitions.insert(("orders".into(), 2));
            m.partitions.insert(("orders".into(), 0));
            m.partitions.insert(("__consumer_offsets".into(), 17));
            m.start_ms = 1_699_999_999_000;
        }
        m
    }

    #[test]
    fn key_round_trips_with_kafkas_layout() {
        let k = encode_key("abc");
        assert_eq!(&k[..], &[0, 0, 0, 3, b'a', b'b', b'c']);
        assert_eq!(decode_key(&k).unwrap(), "abc");
        assert_eq!(
            decode_key(&[0, 1, 0, 0]),
            Err(CodecError::UnknownVersion {
                what: "key",
                version: 1
            })
        );
        assert_eq!(
            decode_key(&[0, 0, 0, 9, b'a']),
            Err(CodecError::Truncated("transactional id"))
        );
    }

    #[test]
    fn value_round_trips_in_every_state() {
        for s in super::super::state::ALL_STATES {
            let m = sample(s);
            let v = encode_value(&m);
            assert_eq!(decode_value("my-txn", &v).unwrap(), m, "{s:?}");
        }
    }

    #[test]
    fn value_layout_is_kafkas_v0() {
        let m = sample(TxnState::Empty);
        let v = encode_value(&m);
        // version, pid, epoch, timeout, state, null partitions, two timestamps
        assert_eq!(v.len(), 2 + 8 + 2 + 4 + 1 + 4 + 8 + 8);
        assert_eq!(&v[0..2], &[0, 0]);
        assert_eq!(i64::from_be_bytes(v[2..10].try_into().unwrap()), 4242);
        assert_eq!(v[16], 0);
        assert_eq!(i32::from_be_bytes(v[17..21].try_into().unwrap()), -1);
        let ongoing = encode_value(&sample(TxnState::Ongoing));
        assert_eq!(ongoing[16], 1);
        // Two topics, sorted: __consumer_offsets [17], orders [0, 2].
        assert_eq!(i32::from_be_bytes(ongoing[17..21].try_into().unwrap()), 2);
    }

    #[test]
    fn bad_values_are_errors() {
        let v = encode_value(&sample(TxnState::Ongoing));
        for cut in [1, 5, 16, 20, v.len() - 1] {
            assert!(decode_value("x", &v[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad_state = v.to_vec();
        bad_state[16] = 9;
        assert_eq!(
            decode_value("x", &bad_state),
            Err(CodecError::Invalid("state"))
        );
        let mut bad_version = v.to_vec();
        bad_version[1] = 7;
        assert!(matches!(
            decode_value("x", &bad_version),
            Err(CodecError::UnknownVersion { .. })
        ));
    }
}
