//! Whether a broker may lead a range now (pure).
//!
//! A broker leads a range only with every byte of the history it claims: a
//! short copy of a sealed segment opened as the log's history would serve
//! the next segment's records for the offsets of its missing tail (a
//! consumer skips committed records), and producer state rebuilt from it
//! would miss batches (a retry is stored twice). Copies of segments it does
//! not keep are read from their replicas; the copies it keeps must be
//! complete (the seal applied: cut, or repaired to the sealed size, and
//! durable) before it opens the range.

/// The sealed segments among `local` (the sequences of the segment files a
/// broker keeps for a range) that it is a replica of and whose copy is not
/// complete yet, oldest first. The broker may open the range as its primary
/// only when this is empty; meanwhile the copies are repaired.
#[must_use]
pub fn short_copies(
    local: impl IntoIterator<Item = u32>,
    sealed_replica: impl Fn(u32) -> bool,
    complete: impl Fn(u32) -> bool,
) -> Vec<u32> {
    let mut short: Vec<u32> = local
        .into_iter()
        .filter(|&seq| sealed_replica(seq) && !complete(seq))
        .collect();
    short.sort_unstable();
    short
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_incomplete_copies_of_sealed_segments_held_as_a_replica_block_leading() {
        // 0 complete, 1 short, 2 the active segment, 3 not a replica here.
        let sealed_replica = |s: u32| s == 0 || s == 1;
        let complete = |s: u32| s == 0;
        assert_eq!(
            short_copies([3, 2, 1, 0], sealed_replica, complete),
            vec![1]
        );
        assert!(short_copies([0, 2], sealed_replica, complete).is_empty());
        assert!(short_copies([], sealed_replica, complete).is_empty());
    }
}
