//! The migrator's decisions, as pure functions: which topics and groups a
//! run selects, where a partition's copy resumes, which fetched batches are
//! sent, the per-partition record digest verification compares, and which
//! group offsets changed since they were last copied.

use std::collections::BTreeMap;
use std::ops::Range;

use bytes::Bytes;
use kafka_protocol::records::{Compression, Record, RecordBatchDecoder, TimestampType};
use regex::Regex;
use tessera_log::batch::{self, BatchHeader, LOG_OVERHEAD};

use super::legacy;

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

/// Records bytes per v2 batch made of a run of uncompressed legacy
/// messages (well below any max.message.bytes).
const LEGACY_RUN_BYTES: usize = 256 << 10;

/// One source batch as the target stores it: a v2 batch, either fetched
/// (`raw`: where it lies in the fetched bytes, copied byte for byte) or
/// up-converted from legacy messages (message format v0/v1).
#[derive(Clone, Debug)]
pub struct SourceBatch {
    pub header: BatchHeader,
    pub bytes: Bytes,
    pub raw: Option<Range<usize>>,
}

/// Uncompressed legacy messages waiting to become one v2 batch.
#[derive(Default)]
struct Run {
    records: Vec<Record>,
    bytes: usize,
}

impl Run {
    /// Whether `r` may join the run: a v2 batch has one timestamp type,
    /// and under LogAppendTime one timestamp for all its records.
    fn fits(&self, r: &Record, size: usize) -> bool {
        self.records.last().is_none_or(|last| {
            last.timestamp_type == r.timestamp_type
                && (r.timestamp_type != TimestampType::LogAppend || last.timestamp == r.timestamp)
                && r.offset - self.records[0].offset <= i32::MAX as i64
                && self.bytes + size <= LEGACY_RUN_BYTES
        })
    }

    fn flush(&mut self, out: &mut Vec<SourceBatch>) -> Result<(), String> {
        if self.records.is_empty() {
            return Ok(());
        }
        out.push(converted(&self.records, Compression::None)?);
        self.records.clear();
        self.bytes = 0;
        Ok(())
    }
}

fn converted(records: &[Record], compression: Compression) -> Result<SourceBatch, String> {
    let bytes = legacy::to_v2(records, compression)?;
    let header = batch::parse_header(&bytes).map_err(|e| e.to_string())?;
    Ok(SourceBatch {
        header,
        bytes,
        raw: None,
    })
}

/// The whole batches in fetched bytes, as v2 batches (a fetch may end with
/// a partial batch or message, which is left for the next fetch). v2
/// batches are taken as they are; legacy messages (magic 0 or 1) are
/// up-converted keeping every record's offset: a compressed wrapper
/// becomes one v2 batch with the same codec, a run of uncompressed
/// messages one uncompressed batch. A legacy message that does not decode
/// (CRC, codec, framing) is an error.
pub fn source_batches(records: &Bytes) -> Result<Vec<SourceBatch>, String> {
    let mut out = Vec::new();
    let mut run = Run::default();
    let mut at = 0usize;
    let mut last_offset = None::<i64>;
    while records.len() - at > 16 {
        let rest = &records[at..];
        let magic = rest[16] as i8;
        if magic == 2 {
            if rest.len() < batch::BATCH_HEADER_LEN {
                break;
            }
            let length = i32::from_be_bytes(rest[8..12].try_into().unwrap());
            if length < (batch::BATCH_HEADER_LEN - LOG_OVERHEAD) as i32 {
                return Err("a record batch shorter than its header".into());
            }
            let total = length as usize + LOG_OVERHEAD;
            if total > rest.len() {
                break;
            }
            run.flush(&mut out)?;
            let header = batch::parse_header(&rest[..total]).map_err(|e| e.to_string())?;
            last_offset = Some(header.last_offset());
            out.push(SourceBatch {
                header,
                bytes: records.slice(at..at + total),
                raw: Some(at..at + total),
            });
            at += total;
            continue;
        }
        let Some((message, len)) = legacy::parse_message(rest)? else {
            break;
        };
        let (deep, compression) = legacy::deep_records(&message)?;
        if let (Some(last), Some(first)) = (last_offset, deep.first()) {
            if first.offset <= last {
                return Err(format!(
                    "the message at offset {} follows offset {last}: out of order",
                    first.offset
                ));
            }
        }
        last_offset = deep.last().map(|r| r.offset);
        if compression == Compression::None {
            for r in deep {
                if !run.fits(&r, len) {
                    run.flush(&mut out)?;
                }
                run.records.push(r);
                run.bytes += len;
            }
        } else {
            run.flush(&mut out)?;
            out.push(converted(&deep, compression)?);
        }
        at += len;
    }
    run.flush(&mut out)?;
    Ok(out)
}

/// Which fetched batches to send when the partition's next offset is
/// `next`: those at or after it, in order. A batch that straddles `next`
/// means the two sides' batch boundaries differ.
pub fn batches_from(batches: Vec<SourceBatch>, next: i64) -> Result<Vec<SourceBatch>, String> {
    let mut out = Vec::new();
    for b in batches {
        let h = &b.header;
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
        out.push(b);
    }
    Ok(out)
}

/// Count and checksum of the records of one partition over an offset
/// span, independent of how they are grouped into batches and of the
/// fields a broker rewrites (partition leader epoch): offset, timestamp
/// and its type, key, value, headers, producer id/epoch/sequence, and the
/// transactional and control flags of each record. Legacy (v0/v1) source
/// records count as their up-converted v2 records (what the target
/// holds): no producer (-1), no headers, no timestamp (-1) for v0; so the
/// checksum covers their offset, timestamp and type, key and value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Digest {
    pub records: u64,
    pub checksum: u32,
}

impl Digest {
    /// Adds the records of one whole batch whose offsets lie in `span`.
    /// A batch that does not decode (bad CRC, truncated) is an error.
    pub fn add_batch(&mut self, batch_bytes: &[u8], span: Span) -> Result<(), String> {
        each_record(batch_bytes, span, |_, canonical| {
            self.checksum = crc32c::crc32c_append(self.checksum, canonical);
            self.records += 1;
        })
    }
}

/// Every record of one whole batch whose offset lies in `span`, with its
/// canonical form (what the digest sums: offset, timestamp and type,
/// producer fields, flags, key, value, headers).
fn each_record(
    batch_bytes: &[u8],
    span: Span,
    mut f: impl FnMut(&Record, &[u8]),
) -> Result<(), String> {
    let header = batch::parse_header(batch_bytes).map_err(|e| e.to_string())?;
    let mut buf = Bytes::copy_from_slice(batch_bytes);
    let set = RecordBatchDecoder::decode(&mut buf).map_err(|e| e.to_string())?;
    // No base sequence (-1, Kafka's NO_SEQUENCE): no record has one
    // (the decoder would count on from -1).
    let no_sequence = header.base_sequence == -1;
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
        let sequence = if no_sequence { -1 } else { r.sequence };
        canonical.extend_from_slice(&sequence.to_be_bytes());
        canonical.push(u8::from(r.transactional) | (u8::from(r.control) << 1));
        push_opt(&mut canonical, r.key.as_deref());
        push_opt(&mut canonical, r.value.as_deref());
        canonical.extend_from_slice(&(r.headers.len() as u32).to_be_bytes());
        for (k, v) in &r.headers {
            push_opt(&mut canonical, Some(k.as_bytes()));
            push_opt(&mut canonical, v.as_deref());
        }
        f(r, &canonical);
    }
    Ok(())
}

/// One record as the record-by-record comparison of a compacted
/// partition sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordSummary {
    pub offset: i64,
    /// CRC-32C of the record's canonical form.
    pub crc: u32,
    pub key: Option<Bytes>,
    pub tombstone: bool,
    pub control: bool,
    pub transactional: bool,
    pub producer_id: i64,
    /// A control record that is an ABORT marker (key: version, type 0).
    pub abort_marker: bool,
}

/// Appends the summaries of one whole batch's records in `span`.
pub fn summarize_batch(
    batch_bytes: &[u8],
    span: Span,
    out: &mut Vec<RecordSummary>,
) -> Result<(), String> {
    each_record(batch_bytes, span, |r, canonical| {
        let abort_marker = r.control
            && r.key
                .as_ref()
                .is_some_and(|k| k.len() >= 4 && k[2..4] == [0, 0]);
        out.push(RecordSummary {
            offset: r.offset,
            crc: crc32c::crc32c(canonical),
            key: r.key.clone(),
            tombstone: r.value.is_none(),
            control: r.control,
            transactional: r.transactional,
            producer_id: r.producer_id,
            abort_marker,
        });
    })
}

/// Compares a compacted partition record by record, for when its digests
/// differ because the source's cleaner ran after the copy: every source
/// record must be on the target at its offset, and every target record the
/// source lacks must be one Kafka's cleaner may remove: superseded by a
/// later record with its key, a tombstone, a transaction marker, or data
/// of a transaction that aborted. Ok(how many such records the target
/// keeps), or the first record that breaks the rule.
pub fn judge_superseded(
    source: &[RecordSummary],
    target: &[RecordSummary],
) -> Result<usize, String> {
    let on_target: BTreeMap<i64, &RecordSummary> = target.iter().map(|r| (r.offset, r)).collect();
    for s in source {
        match on_target.get(&s.offset) {
            Some(t) if t.crc == s.crc => {}
            Some(_) => return Err(format!("the record at offset {} differs", s.offset)),
            None => {
                return Err(format!(
                    "the source's record at offset {} is not on the target",
                    s.offset
                ))
            }
        }
    }
    let on_source: std::collections::HashSet<i64> = source.iter().map(|r| r.offset).collect();
    let mut last_of_key: std::collections::HashMap<&[u8], i64> = Default::default();
    // Each producer's markers in offset order: (offset, is ABORT).
    let mut markers: BTreeMap<i64, Vec<(i64, bool)>> = BTreeMap::new();
    for t in target {
        if t.control {
            markers
                .entry(t.producer_id)
                .or_default()
                .push((t.offset, t.abort_marker));
        } else if let Some(k) = &t.key {
            last_of_key.insert(k, t.offset);
        }
    }
    let mut kept = 0;
    for t in target.iter().filter(|t| !on_source.contains(&t.offset)) {
        let superseded = t
            .key
            .as_deref()
            .is_some_and(|k| last_of_key.get(k).is_some_and(|last| *last > t.offset));
        let aborted = t.transactional
            && !t.control
            && markers.get(&t.producer_id).is_some_and(|m| {
                // The first marker after the record ends its transaction.
                let next = m.partition_point(|(o, _)| *o <= t.offset);
                m.get(next).is_some_and(|(_, abort)| *abort)
            });
        if !(superseded || aborted || t.tombstone || t.control) {
            return Err(format!(
                "the target's record at offset {} is not on the source, and nothing supersedes it",
                t.offset
            ));
        }
        kept += 1;
    }
    Ok(kept)
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
    /// Records the target keeps that the source's cleaner removed after
    /// the copy (a compacted partition whose digests differ only by them).
    pub superseded: usize,
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
    use indexmap::IndexMap;
    use kafka_protocol::protocol::StrBytes;
    use kafka_protocol::records::{Compression, Record, TimestampType};
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
        tessera_log::records::encode_v2(records, compression)
            .unwrap()
            .to_vec()
    }

    fn digest(bytes: &[u8], span: Span) -> Result<Digest, String> {
        let mut d = Digest::default();
        for b in source_batches(&Bytes::copy_from_slice(bytes))? {
            d.add_batch(&b.bytes, span)?;
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

        /// Fetched bytes of any shape never panic the batch walker.
        #[test]
        fn source_batches_never_panic(mut bytes in prop::collection::vec(any::<u8>(), 0..400), magic in 0u8..4) {
            if bytes.len() > 16 { bytes[16] = magic; }
            let _ = source_batches(&Bytes::from(bytes));
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
            let all = source_batches(&Bytes::from(bytes)).unwrap();
            let sent = batches_from(all, next).unwrap();
            prop_assert!(sent.iter().all(|b| b.header.base_offset >= next));
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
        assert_eq!(source_batches(&Bytes::from(two)).unwrap().len(), 1);
        // A v2 batch read as a legacy message fails its CRC.
        let mut old = one.clone();
        old[16] = 1;
        assert!(source_batches(&Bytes::from(old))
            .unwrap_err()
            .contains("CRC"));
    }

    /// v0, v1, a gzip v1 wrapper, a v2 batch and LogAppendTime v1 messages
    /// in one fetch: one v2 batch per wrapper or run, offsets kept.
    fn mixed_partition() -> Vec<u8> {
        use super::legacy::tests::{msg, wrapper};
        let mut bytes = Vec::new();
        bytes.extend(msg(0, 0, 0, 0, b"k0", b"v0").encode());
        bytes.extend(msg(1, 0, 0, 0, b"", b"v1").encode());
        bytes.extend(msg(2, 1, 0, 1_000, b"k2", b"v2").encode());
        bytes.extend(msg(3, 1, 0, 1_001, b"k3", b"v3").encode());
        let inner = [
            msg(0, 1, 0, 2_000, b"k5", b"v5"),
            msg(1, 1, 0, 2_001, b"k6", b"v6"),
            msg(2, 1, 0, 2_002, b"k7", b"v7"),
        ];
        bytes.extend(wrapper(7, 1, 1, 3_000, &inner).encode()); // 5..=7, 4 a gap
        let mut v2 = encode(
            &[
                record(8, vec![8], None, true),
                record(9, vec![9], None, false),
            ],
            Compression::None,
        );
        batch::set_partition_leader_epoch(&mut v2, 3);
        bytes.extend(v2);
        bytes.extend(msg(10, 1, 8, 4_000, b"k10", b"v10").encode());
        bytes.extend(msg(11, 1, 8, 4_000, b"k11", b"v11").encode());
        bytes.extend(msg(12, 1, 8, 4_001, b"k12", b"v12").encode());
        bytes
    }

    #[test]
    fn legacy_batches_are_up_converted_in_place() {
        let bytes = Bytes::from(mixed_partition());
        let batches = source_batches(&bytes).unwrap();
        let spans: Vec<(i64, i64, i32, bool)> = batches
            .iter()
            .map(|b| {
                (
                    b.header.base_offset,
                    b.header.last_offset(),
                    b.header.record_count,
                    b.raw.is_some(),
                )
            })
            .collect();
        assert_eq!(
            spans,
            vec![
                (0, 3, 4, false),
                (5, 7, 3, false),
                (8, 9, 2, true),
                (10, 11, 2, false),
                (12, 12, 1, false)
            ]
        );
        for b in &batches {
            batch::validate(&b.bytes).unwrap();
        }
        assert_eq!(batches[1].header.compression_codec(), 1);
        assert!(batches[3].header.is_log_append_time());
        let mut all = Bytes::new();
        for b in &batches {
            let mut buf = b.bytes.clone();
            let set = RecordBatchDecoder::decode(&mut buf).unwrap();
            all = Bytes::from(
                [
                    all.to_vec(),
                    set.records.iter().map(|r| r.offset as u8).collect(),
                ]
                .concat(),
            );
        }
        assert_eq!(&all[..], &[0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 12]);
        // Resuming within the run or after the wrapper.
        assert_eq!(batches_from(batches.clone(), 8).unwrap().len(), 3);
        assert!(batches_from(batches, 6).is_err());
    }

    #[test]
    fn legacy_digests_match_what_the_target_holds_and_catch_tampering() {
        let bytes = mixed_partition();
        let span = Span {
            start: 0,
            end: i64::MAX,
        };
        let source = digest(&bytes, span).unwrap();
        assert_eq!(source.records, 12);
        // The target holds the up-converted batches (its own leader epoch).
        let mut target = Vec::new();
        for b in source_batches(&Bytes::from(bytes.clone())).unwrap() {
            let mut v = b.bytes.to_vec();
            batch::set_partition_leader_epoch(&mut v, 9);
            target.extend(v);
        }
        assert_eq!(digest(&target, span).unwrap(), source);
        // Read in two fetches cut between messages: same digest.
        let first_len = legacy::parse_message(&bytes).unwrap().unwrap().1;
        let (a, b) = bytes.split_at(
            first_len
                + legacy::parse_message(&bytes[first_len..])
                    .unwrap()
                    .unwrap()
                    .1,
        );
        let mut split = digest(a, span).unwrap();
        let rest = digest(b, span).unwrap();
        split.records += rest.records;
        // The checksum chains records in order: recompute over both parts.
        let mut d = Digest::default();
        for part in [a, b] {
            for sb in source_batches(&Bytes::copy_from_slice(part)).unwrap() {
                d.add_batch(&sb.bytes, span).unwrap();
            }
        }
        assert_eq!(d, source);
        assert_eq!(split.records, source.records);
        // A changed value on the source fails its CRC; a re-checksummed one
        // (a different record) changes the digest.
        let mut tampered = bytes.clone();
        let at = first_len - 1;
        tampered[at] ^= 1;
        assert!(digest(&tampered, span).unwrap_err().contains("CRC"));
        let mut other = super::legacy::tests::msg(0, 0, 0, 0, b"k0", b"vX").encode();
        other.extend_from_slice(&bytes[first_len..]);
        assert_ne!(digest(&other, span).unwrap(), source);
        // Only some offsets.
        assert_eq!(
            digest(&bytes, Span { start: 5, end: 9 }).unwrap().records,
            4
        );
    }

    #[test]
    fn a_straddling_batch_is_refused() {
        let recs: Vec<Record> = (0..3).map(|o| record(o, vec![1], None, false)).collect();
        let bytes = encode(&recs, Compression::None);
        let all = source_batches(&Bytes::from(bytes)).unwrap();
        assert!(batches_from(all.clone(), 1).is_err());
        assert_eq!(batches_from(all, 3).unwrap().len(), 0);
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

    fn summary(offset: i64, key: &str, value: Option<&str>) -> RecordSummary {
        RecordSummary {
            offset,
            crc: crc32c::crc32c(format!("{offset}{key}{value:?}").as_bytes()),
            key: Some(Bytes::from(key.to_string())),
            tombstone: value.is_none(),
            control: false,
            transactional: false,
            producer_id: -1,
            abort_marker: false,
        }
    }

    fn marker(offset: i64, producer_id: i64, abort: bool) -> RecordSummary {
        RecordSummary {
            control: true,
            transactional: true,
            producer_id,
            abort_marker: abort,
            key: None,
            ..summary(offset, "", Some("m"))
        }
    }

    fn txn(offset: i64, key: &str, producer_id: i64) -> RecordSummary {
        RecordSummary {
            transactional: true,
            producer_id,
            ..summary(offset, key, Some("t"))
        }
    }

    #[test]
    fn records_the_source_cleaned_after_the_copy_are_accepted() {
        // The target as copied: k1 twice, a tombstone of k2, an aborted
        // transaction of producer 7 and its marker, a committed one of 8.
        let target = vec![
            summary(0, "k1", Some("a")),
            summary(1, "k2", Some("b")),
            txn(2, "k3", 7),
            summary(3, "k1", Some("c")),
            summary(4, "k2", None),
            marker(5, 7, true),
            txn(6, "k4", 8),
            marker(7, 8, false),
        ];
        // The source since cleaned: superseded k1@0 and k2@1, the aborted
        // data, its marker and the tombstone gone.
        let keep = |o: &[i64]| -> Vec<RecordSummary> {
            target
                .iter()
                .filter(|r| o.contains(&r.offset))
                .cloned()
                .collect()
        };
        let source = keep(&[3, 6, 7]);
        assert_eq!(judge_superseded(&source, &target), Ok(5));
        assert_eq!(judge_superseded(&target, &target), Ok(0));
        // The last value of a key may not go missing.
        let lost = keep(&[6, 7]);
        let mut without = target.clone();
        without.retain(|r| r.offset != 3);
        assert!(judge_superseded(&lost, &without)
            .unwrap_err()
            .contains("offset 0 is not on the source"));
        // Nor may a committed transaction's data.
        let committed_dropped = keep(&[3, 7]);
        assert!(judge_superseded(&committed_dropped, &target)
            .unwrap_err()
            .contains("offset 6"));
        // A changed record is caught even where cleaning happened.
        let mut tampered = source.clone();
        tampered[0].crc ^= 1;
        assert!(judge_superseded(&tampered, &target)
            .unwrap_err()
            .contains("offset 3 differs"));
        // A source record the target lacks.
        let mut extra = source.clone();
        extra.push(summary(9, "k9", Some("z")));
        assert!(judge_superseded(&extra, &target)
            .unwrap_err()
            .contains("not on the target"));
    }

    #[test]
    fn data_of_a_transaction_that_committed_is_not_taken_for_aborted() {
        // Producer 7 aborts at 2, then a later transaction of it commits at 4.
        let target = vec![
            txn(0, "a", 7),
            marker(1, 7, true),
            txn(2, "b", 7),
            marker(3, 7, false),
        ];
        let source = vec![target[3].clone()];
        // 0 (aborted) and 1 (marker) may go; 2 (committed, last of b) may not.
        assert!(judge_superseded(&source, &target)
            .unwrap_err()
            .contains("offset 2"));
        let source = vec![target[2].clone(), target[3].clone()];
        assert_eq!(judge_superseded(&source, &target), Ok(2));
    }

    #[test]
    fn summaries_read_abort_markers_and_tombstones() {
        use kafka_protocol::records::{Compression, TimestampType};
        let record =
            |offset: i64, key: Option<Vec<u8>>, value: Option<&str>, control: bool| Record {
                transactional: true,
                control,
                partition_leader_epoch: 0,
                producer_id: 5,
                producer_epoch: 0,
                timestamp_type: TimestampType::Creation,
                offset,
                sequence: offset as i32,
                timestamp: 1,
                key: key.map(Bytes::from),
                value: value.map(|v| Bytes::from(v.to_string())),
                headers: Default::default(),
                delete_horizon: false,
            };
        let data = tessera_log::records::encode_v2(
            &[record(0, Some(b"k".to_vec()), None, false)],
            Compression::None,
        )
        .unwrap();
        let abort = tessera_log::records::encode_v2(
            &[record(1, Some(vec![0, 0, 0, 0]), Some("x"), true)],
            Compression::None,
        )
        .unwrap();
        let mut out = Vec::new();
        let all = Span { start: 0, end: 10 };
        summarize_batch(&data, all, &mut out).unwrap();
        summarize_batch(&abort, all, &mut out).unwrap();
        assert!(out[0].tombstone && !out[0].control && !out[0].abort_marker);
        assert!(out[1].control && out[1].abort_marker);
        // The summaries' CRCs are the digest's per-record inputs.
        let mut d = Digest::default();
        d.add_batch(&data, all).unwrap();
        assert_eq!(d.checksum, out[0].crc);
    }
}
