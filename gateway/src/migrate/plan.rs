//! The migrator's decisions, as pure functions: which topics and groups a
//! run selects, where a partition's copy resumes, which fetched batches are
//! sent, the per-partition record digest verification compares, and which
//! group offsets changed since they were last copied.

use std::collections::BTreeMap;
use std::ops::Range;

use bytes::Bytes;
use kafka_protocol::records::RecordBatchDecoder;
use regex::Regex;
use tessera_log::batch::{self, BatchHeader, LOG_OVERHEAD};

/// A regex that must match the whole name (as Kafka's `--include` does).
pub fn whole_match(pattern: &str) -> Result<Regex, regex::Error> {
    Regex::new(&format!("^(?:{pattern})$"))
}

/// The topics a run copies: matched by `pattern`, internal ones left out.
pub fn select_topics<'a>(
    names: impl IntoIterator<Item = &'a String>,
    pattern: &Regex,
) -> Vec<String> {
    let mut out: Vec<String> = names
        .into_iter()
        .filter(|n| !n.starts_with("__") && pattern.is_match(n))
        .cloned()
        .collect();
    out.sort();
    out
}

/// Offsets of one partition: `[start, end)` (log start offset, high watermark).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Span {
    pub start: i64,
    pub end: i64,
}

/// Where a partition's copy starts: the target's own log end (what a
/// previous run wrote), or the source's log start when the target is
/// behind it. A target ahead of the source holds other data.
pub fn resume_point(source: Span, target_end: i64) -> Result<i64, String> {
    if target_end > source.end {
        return Err(format!(
            "the target partition ends at offset {target_end}, past the source's end {}: \
             it holds other data",
            source.end
        ));
    }
    Ok(target_end.max(source.start))
}

/// Whole v2 batches in fetched bytes (a fetch may end with a partial
/// batch, which is left for the next fetch). A batch in another format
/// (magic 0 or 1) is an error: it cannot be stored as it is.
pub fn whole_batches(records: &[u8]) -> Result<Vec<(BatchHeader, Range<usize>)>, String> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while records.len() - at >= batch::BATCH_HEADER_LEN {
        let rest = &records[at..];
        let length = i32::from_be_bytes(rest[8..12].try_into().unwrap());
        let magic = rest[16] as i8;
        if magic != 2 {
            let offset = i64::from_be_bytes(rest[0..8].try_into().unwrap());
            return Err(format!(
                "the batch at offset {offset} has message format v{magic}; only v2 \
                 (Kafka 0.11+) batches can be copied as they are"
            ));
        }
        if length < (batch::BATCH_HEADER_LEN - LOG_OVERHEAD) as i32 {
            return Err("a record batch shorter than its header".into());
        }
        let total = length as usize + LOG_OVERHEAD;
        if total > rest.len() {
            break;
        }
        let header = batch::parse_header(&rest[..total]).map_err(|e| e.to_string())?;
        out.push((header, at..at + total));
        at += total;
    }
    Ok(out)
}

/// Which fetched batches to send when the partition's next offset is
/// `next`: those at or after it, in order. A batch that straddles `next`
/// means the two sides' batch boundaries differ.
pub fn batches_from(
    batches: &[(BatchHeader, Range<usize>)],
    next: i64,
) -> Result<Vec<(BatchHeader, Range<usize>)>, String> {
    let mut out = Vec::new();
    for (h, r) in batches {
        if h.last_offset() < next {
            continue;
        }
        if h.base_offset < next {
            return Err(format!(
                "the source batch {}..={} straddles the target's log end {next}: \
                 the target holds other data",
                h.base_offset,
                h.last_offset()
            ));
        }
        out.push((*h, r.clone()));
    }
    Ok(out)
}

/// Count and checksum of the records of one partition over an offset
/// span, independent of how they are grouped into batches and of the
/// fields a broker rewrites (partition leader epoch): offset, timestamp
/// and its type, key, value, headers, producer id/epoch/sequence, and the
/// transactional and control flags of each record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Digest {
    pub records: u64,
    pub checksum: u32,
}

impl Digest {
    /// Adds the records of one whole batch whose offsets lie in `span`.
    /// A batch that does not decode (bad CRC, truncated) is an error.
    pub fn add_batch(&mut self, batch_bytes: &[u8], span: Span) -> Result<(), String> {
        let mut buf = Bytes::copy_from_slice(batch_bytes);
        let set = RecordBatchDecoder::decode(&mut buf).map_err(|e| e.to_string())?;
        let mut canonical = Vec::with_capacity(128);
        for r in &set.records {
            if r.offset < span.start || r.offset >= span.end {
                continue;
            }
            canonical.clear();
            canonical.extend_from_slice(&r.offset.to_be_bytes());
            canonical.extend_from_slice(&r.timestamp.to_be_bytes());
            canonical.push(r.timestamp_type as u8);
            canonical.extend_from_slice(&r.producer_id.to_be_bytes());
            canonical.extend_from_slice(&r.producer_epoch.to_be_bytes());
            canonical.extend_from_slice(&r.sequence.to_be_bytes());
            canonical.push(u8::from(r.transactional) | (u8::from(r.control) << 1));
            push_opt(&mut canonical, r.key.as_deref());
            push_opt(&mut canonical, r.value.as_deref());
            canonical.extend_from_slice(&(r.headers.len() as u32).to_be_bytes());
            for (k, v) in &r.headers {
                push_opt(&mut canonical, Some(k.as_bytes()));
                push_opt(&mut canonical, v.as_deref());
            }
            self.checksum = crc32c::crc32c_append(self.checksum, &canonical);
            self.records += 1;
        }
        Ok(())
    }
}

fn push_opt(out: &mut Vec<u8>, bytes: Option<&[u8]>) {
    match bytes {
        None => out.extend_from_slice(&(-1i32).to_be_bytes()),
        Some(b) => {
            out.extend_from_slice(&(b.len() as i32).to_be_bytes());
            out.extend_from_slice(b);
        }
    }
}

/// One partition's verification: both sides' spans and digests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub topic: String,
    pub partition: i32,
    pub span: Span,
    pub source: Digest,
    pub target: Digest,
    /// Why they differ, if they do.
    pub mismatch: Option<String>,
}

/// Compares one partition: the target must end where the source ends and
/// hold the same records over the span.
pub fn judge(source_end: i64, target_end: i64, source: Digest, target: Digest) -> Option<String> {
    if target_end != source_end {
        return Some(format!(
            "the target ends at offset {target_end}, the source at {source_end}"
        ));
    }
    if source.records != target.records {
        return Some(format!(
            "{} records on the source, {} on the target",
            source.records, target.records
        ));
    }
    if source.checksum != target.checksum {
        return Some(format!(
            "checksums differ (source {:08x}, target {:08x})",
            source.checksum, target.checksum
        ));
    }
    None
}

/// A group's committed offset of one partition, with its metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Committed {
    pub offset: i64,
    pub metadata: Option<String>,
}

/// `(topic, partition) -> committed` of one group.
pub type GroupOffsets = BTreeMap<(String, i32), Committed>;

/// The offsets of `source` that differ from what was last copied.
pub fn changed_offsets(source: &GroupOffsets, copied: &GroupOffsets) -> GroupOffsets {
    source
        .iter()
        .filter(|(k, v)| copied.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use indexmap::IndexMap;
    use kafka_protocol::protocol::StrBytes;
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };
    use proptest::prelude::*;

    fn record(offset: i64, key: Vec<u8>, value: Option<Vec<u8>>, header: bool) -> Record {
        let mut headers = IndexMap::new();
        if header {
            headers.insert(
                StrBytes::from_static_str("h"),
                Some(Bytes::from_static(b"v")),
            );
        }
        Record {
            transactional: false,
            control: false,
            partition_leader_epoch: 0,
            producer_id: 7,
            producer_epoch: 1,
            timestamp_type: TimestampType::Creation,
            offset,
            sequence: offset as i32,
            timestamp: 1_700_000_000_000 + offset,
            key: Some(Bytes::from(key)),
            value: value.map(Bytes::from),
            headers,
            delete_horizon: false,
        }
    }

    fn encode(records: &[Record], compression: Compression) -> Vec<u8> {
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            records,
            &RecordEncodeOptions {
                version: 2,
                compression,
            },
        )
        .unwrap();
        buf.to_vec()
    }

    fn digest(bytes: &[u8], span: Span) -> Result<Digest, String> {
        let mut d = Digest::default();
        for (_, r) in whole_batches(bytes)? {
            d.add_batch(&bytes[r], span)?;
        }
        Ok(d)
    }

    fn records_strategy() -> impl Strategy<Value = Vec<Record>> {
        prop::collection::vec(
            (
                prop::collection::vec(any::<u8>(), 0..8),
                prop::option::of(prop::collection::vec(any::<u8>(), 0..16)),
                any::<bool>(),
            ),
            1..20,
        )
        .prop_map(|v| {
            v.into_iter()
                .enumerate()
                .map(|(i, (k, val, h))| record(i as i64 * 2, k, val, h))
                .collect()
        })
    }

    proptest! {
        /// The digest does not depend on batch boundaries or compression.
        #[test]
        fn digest_ignores_batching(records in records_strategy(), cut in 0usize..20, gzip in any::<bool>()) {
            let cut = cut.min(records.len());
            let whole = encode(&records, Compression::None);
            let mut split = Vec::new();
            let compression = if gzip { Compression::Gzip } else { Compression::None };
            if cut > 0 {
                split.extend(encode(&records[..cut], compression));
            }
            if cut < records.len() {
                split.extend(encode(&records[cut..], compression));
            }
            let span = Span { start: 0, end: i64::MAX };
            let a = digest(&whole, span).unwrap();
            prop_assert_eq!(a.records, records.len() as u64);
            prop_assert_eq!(a, digest(&split, span).unwrap());
        }

        /// Any changed value is caught: a different checksum, or a batch
        /// that no longer decodes (its CRC).
        #[test]
        fn digest_catches_a_changed_byte(records in records_strategy(), which in any::<prop::sample::Index>(), flip in 1u8..=255) {
            let original = encode(&records, Compression::None);
            let mut changed = records.clone();
            let i = which.index(changed.len());
            let mut value = changed[i].value.as_deref().map(<[u8]>::to_vec).unwrap_or_default();
            if value.is_empty() { value.push(0); }
            value[0] ^= flip;
            changed[i].value = Some(Bytes::from(value));
            let span = Span { start: 0, end: i64::MAX };
            prop_assert_ne!(digest(&original, span).unwrap(), digest(&encode(&changed, Compression::None), span).unwrap());
            // Tampered bytes on disk (CRC no longer matching) do not decode.
            let mut tampered = original.clone();
            let at = tampered.len() - 2;
            tampered[at] ^= flip;
            prop_assert!(digest(&tampered, span).is_err());
        }

        /// Batches before the resume point are skipped, the rest kept in order.
        #[test]
        fn batches_from_never_resends(sizes in prop::collection::vec(1i64..5, 1..10), next_at in 0usize..10) {
            let mut bytes = Vec::new();
            let mut bases = Vec::new();
            let mut offset = 0;
            for s in &sizes {
                let recs: Vec<Record> = (0..*s).map(|o| record(offset + o, vec![1], None, false)).collect();
                bases.push(offset);
                bytes.extend(encode(&recs, Compression::None));
                offset += s + 1; // a gap after every batch
            }
            let next = bases.get(next_at).copied().unwrap_or(offset);
            let all = whole_batches(&bytes).unwrap();
            let sent = batches_from(&all, next).unwrap();
            prop_assert!(sent.iter().all(|(h, _)| h.base_offset >= next));
            prop_assert_eq!(sent.len(), bases.iter().filter(|b| **b >= next).count());
        }
    }

    #[test]
    fn a_partial_trailing_batch_waits_for_the_next_fetch() {
        let one = encode(&[record(0, vec![1], None, false)], Compression::None);
        let mut two = one.clone();
        two.extend(encode(
            &[record(1, vec![2], None, false)],
            Compression::None,
        ));
        two.truncate(two.len() - 3);
        assert_eq!(whole_batches(&two).unwrap().len(), 1);
        let mut old = one.clone();
        old[16] = 1;
        assert!(whole_batches(&old)
            .unwrap_err()
            .contains("message format v1"));
    }

    #[test]
    fn a_straddling_batch_is_refused() {
        let recs: Vec<Record> = (0..3).map(|o| record(o, vec![1], None, false)).collect();
        let bytes = encode(&recs, Compression::None);
        let all = whole_batches(&bytes).unwrap();
        assert!(batches_from(&all, 1).is_err());
        assert_eq!(batches_from(&all, 3).unwrap().len(), 0);
    }

    #[test]
    fn resume_points() {
        let s = Span {
            start: 10,
            end: 100,
        };
        assert_eq!(resume_point(s, 0), Ok(10));
        assert_eq!(resume_point(s, 50), Ok(50));
        assert_eq!(resume_point(s, 100), Ok(100));
        assert!(resume_point(s, 101).is_err());
    }

    #[test]
    fn judging_and_selection() {
        let d = Digest {
            records: 3,
            checksum: 9,
        };
        assert_eq!(judge(5, 5, d, d), None);
        assert!(judge(5, 4, d, d).is_some());
        assert!(judge(
            5,
            5,
            d,
            Digest {
                records: 3,
                checksum: 8
            }
        )
        .unwrap()
        .contains("checksum"));
        let re = whole_match("orders|pay.*").unwrap();
        let names: Vec<String> = ["orders", "orders2", "payments", "__consumer_offsets"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(select_topics(&names, &re), vec!["orders", "payments"]);
        let mut a = GroupOffsets::new();
        a.insert(
            ("t".into(), 0),
            Committed {
                offset: 5,
                metadata: None,
            },
        );
        let mut b = a.clone();
        assert!(changed_offsets(&a, &b).is_empty());
        b.insert(
            ("t".into(), 0),
            Committed {
                offset: 4,
                metadata: None,
            },
        );
        assert_eq!(changed_offsets(&a, &b).len(), 1);
    }
}
