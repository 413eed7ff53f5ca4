//! Per-record checks of a produced batch, as Kafka's `LogValidator` makes
//! them: a compacted topic takes keyed records only, and with CreateTime a
//! record's timestamp must lie within `message.timestamp.before.max.ms`
//! behind and `message.timestamp.after.max.ms` ahead of the broker's clock.
//! Each failing record is a [`RecordError`] at its index in the batch; the
//! batch is refused whole, and the Produce response (v8+) lists them, so a
//! client fails those records with the error and the rest of the batch
//! with its "invalid different record" error. Pure: tested below.

use crate::batch;
use crate::records::decode_records;
use crate::BatchError;

/// What a topic asks of each record of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordRules {
    /// `cleanup.policy` includes `compact`: every record needs a key.
    pub require_key: bool,
    /// `(before.max.ms, after.max.ms)` for CreateTime topics; `None` with
    /// LogAppendTime (the broker sets the timestamps).
    pub timestamp_bounds: Option<(i64, i64)>,
}

impl RecordRules {
    /// Whether any record could fail: if not, the batch is not decoded.
    fn checks_records(&self) -> bool {
        self.require_key
            || self
                .timestamp_bounds
                .is_some_and(|(before, after)| before < i64::MAX || after < i64::MAX)
    }
}

/// One record a batch was refused for (Kafka's `RecordError`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordError {
    /// The record's index in its batch.
    pub batch_index: i32,
    pub message: String,
    /// INVALID_TIMESTAMP rather than INVALID_RECORD.
    pub invalid_timestamp: bool,
}

impl std::fmt::Display for RecordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RecordError(batchIndex={}, message='{}')",
            self.batch_index, self.message
        )
    }
}

/// The records of `batch` (one stored batch) that break `rules`, for
/// `partition` of `topic`, at broker time `now`. Nothing is decoded or
/// formatted when the rules cannot fail a record (the produce hot path).
pub fn record_errors(
    batch_bytes: &[u8],
    rules: &RecordRules,
    topic: &str,
    partition: u32,
    now: i64,
) -> Result<Vec<RecordError>, BatchError> {
    if !rules.checks_records() || batch::parse_header(batch_bytes)?.is_control() {
        return Ok(Vec::new());
    }
    let mut errors = Vec::new();
    for (index, record) in decode_records(batch_bytes)?.iter().enumerate() {
        let batch_index = index as i32;
        if rules.require_key && record.key.is_none() {
            errors.push(RecordError {
                batch_index,
                message: format!(
                    "Compacted topic cannot accept message without key in topic partition {topic}-{partition}."
                ),
                invalid_timestamp: false,
            });
            continue;
        }
        if let Some((before, after)) = rules.timestamp_bounds {
            let (lo, hi) = (now.saturating_sub(before), now.saturating_add(after));
            if record.timestamp < lo || record.timestamp > hi {
                errors.push(RecordError {
                    batch_index,
                    message: format!(
                        "Timestamp {} of message with offset {} is out of range. The timestamp should be within [{lo}, {hi}]",
                        record.timestamp, record.offset
                    ),
                    invalid_timestamp: true,
                });
            }
        }
    }
    Ok(errors)
}

/// Kafka's `LogValidator.processRecordErrors` message for the whole batch.
pub fn batch_message(errors: &[RecordError]) -> String {
    if errors.iter().any(|e| e.invalid_timestamp) {
        return "One or more records have been rejected due to invalid timestamp".to_string();
    }
    let shown: Vec<String> = errors.iter().take(3).map(ToString::to_string).collect();
    format!(
        "One or more records have been rejected due to {} record errors in total, and only showing the first three errors at most: [{}]",
        errors.len(),
        shown.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{build_batch, encode_batch, Record};
    use bytes::Bytes;

    /// A batch of `(key, timestamp)` records.
    fn batch(records: &[(Option<&str>, i64)]) -> Vec<u8> {
        let template = build_batch(-1, -1, -1, 0, records[0].1, &[(None, None)]);
        let header = batch::parse_header(&template).unwrap();
        let records: Vec<Record> = records
            .iter()
            .enumerate()
            .map(|(i, (key, ts))| Record {
                attributes: 0,
                timestamp: *ts,
                offset: i as i64,
                key: key.map(|k| Bytes::from(k.to_string())),
                value: Some(Bytes::from_static(b"v")),
                headers: Bytes::from_static(&[0]),
            })
            .collect();
        encode_batch(&header, &records, None).unwrap()
    }

    const OPEN: RecordRules = RecordRules {
        require_key: false,
        timestamp_bounds: Some((i64::MAX, i64::MAX)),
    };

    #[test]
    fn keyless_records_of_a_compacted_topic_are_listed_by_index() {
        let b = batch(&[(Some("a"), 5), (None, 5), (Some("c"), 5), (None, 5)]);
        let rules = RecordRules {
            require_key: true,
            ..OPEN
        };
        let errors = record_errors(&b, &rules, "t", 0, 10).unwrap();
        assert_eq!(
            errors.iter().map(|e| e.batch_index).collect::<Vec<_>>(),
            vec![1, 3]
        );
        assert_eq!(
            errors[0].message,
            "Compacted topic cannot accept message without key in topic partition t-0."
        );
        assert_eq!(
            batch_message(&errors),
            "One or more records have been rejected due to 2 record errors in total, and only showing the first three errors at most: [RecordError(batchIndex=1, message='Compacted topic cannot accept message without key in topic partition t-0.'), RecordError(batchIndex=3, message='Compacted topic cannot accept message without key in topic partition t-0.')]"
        );
        assert!(record_errors(&b, &OPEN, "t", 0, 10).unwrap().is_empty());
    }

    #[test]
    fn timestamps_outside_the_bounds_are_invalid_timestamps() {
        let now = 1_000_000;
        let b = batch(&[
            (Some("a"), now - 101),
            (Some("b"), now),
            (Some("c"), now + 51),
        ]);
        let rules = RecordRules {
            require_key: false,
            timestamp_bounds: Some((100, 50)),
        };
        let errors = record_errors(&b, &rules, "t", 0, now).unwrap();
        assert_eq!(
            errors.iter().map(|e| e.batch_index).collect::<Vec<_>>(),
            vec![0, 2]
        );
        assert!(errors.iter().all(|e| e.invalid_timestamp));
        assert!(errors[0]
            .message
            .contains("should be within [999900, 1000050]"));
        assert_eq!(
            batch_message(&errors),
            "One or more records have been rejected due to invalid timestamp"
        );
        // LogAppendTime: the broker's own timestamps, never checked.
        let append_time = RecordRules {
            require_key: false,
            timestamp_bounds: None,
        };
        assert!(record_errors(&b, &append_time, "t", 0, now)
            .unwrap()
            .is_empty());
    }
}
