//! Internal topics (`__consumer_offsets`, `__transaction_state`): their
//! names, and how a key (group id, transactional id) picks a partition, as
//! Kafka hashes it. Creating, writing and reading them is the broker's
//! (the gateway's `broker/internal_topics.rs`), through the same range logs
//! as any topic.

/// Kafka's group offsets topic and its defaults.
pub const CONSUMER_OFFSETS: &str = "__consumer_offsets";
/// `offsets.topic.num.partitions`
pub const OFFSETS_TOPIC_PARTITIONS: u32 = 50;
/// Kafka's transaction log topic and its defaults.
pub const TRANSACTION_STATE: &str = "__transaction_state";
/// `transaction.state.log.num.partitions`
pub const TXN_TOPIC_PARTITIONS: u32 = 50;

/// Kafka's internal topics (Metadata's `is_internal`).
pub fn is_internal(name: &str) -> bool {
    name == CONSUMER_OFFSETS || name == TRANSACTION_STATE
}

/// Java's `String.hashCode` over UTF-16 code units, as Kafka hashes group ids.
pub fn java_string_hash(s: &str) -> i32 {
    s.encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(c as i32))
}

/// Kafka's `Utils.abs(key.hashCode()) % partitions` (abs as `& 0x7fffffff`).
pub fn partition_for(key: &str, partitions: u32) -> i32 {
    ((java_string_hash(key) & 0x7fff_ffff) as u32 % partitions) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn java_hash_matches_java() {
        // Values from java.lang.String#hashCode.
        assert_eq!(java_string_hash(""), 0);
        assert_eq!(java_string_hash("test"), 3556498);
        assert_eq!(java_string_hash("hello"), 99162322);
        assert_eq!(java_string_hash("polygenelubricants"), i32::MIN);
    }

    #[test]
    fn coordinator_partition_is_non_negative() {
        assert_eq!(partition_for("polygenelubricants", 50), 0);
        for g in ["a", "group-1", "consumer-group-ü", "x".repeat(100).as_str()] {
            let p = partition_for(g, 50);
            assert!((0..50).contains(&p));
        }
    }
}
