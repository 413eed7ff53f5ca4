//! Quorum arithmetic of one segment's replica set (pure).
//!
//! A segment with `n` replicas commits what a commit quorum has made
//! durable: a majority, or `min.insync.replicas` of them when that is more
//! (acks=all then means at least that many copies, as in Kafka). A seal
//! needs fence reports from enough replicas that every commit quorum
//! shares a member with them (`n - majority + 1`: 2 of 3, 3 of 5, 1 of 2),
//! so every acknowledged byte is on at least one replica that reported.
//!
//! Positions are per segment: a follower's durable end in segment N says
//! nothing about N-1 (it may have skipped the tail of N-1 and repair it
//! later), so the commit moves past a segment only once a quorum holds all
//! of it ([`committed_across`]).

/// Replicas that make a majority of `replicas`.
pub fn quorum_size(replicas: usize) -> usize {
    replicas / 2 + 1
}

/// Replicas whose durable copies commit a byte: a majority, or
/// `min.insync.replicas` when that is more (capped at the set's size).
pub fn commit_quorum(replicas: usize, min_insync: usize) -> usize {
    let replicas = replicas.max(1);
    quorum_size(replicas).max(min_insync.min(replicas))
}

/// Fence reports a seal needs: every commit quorum (a majority at least)
/// shares a member with any set of this many replicas.
pub fn fence_quorum(replicas: usize) -> usize {
    let replicas = replicas.max(1);
    replicas - quorum_size(replicas) + 1
}

/// The end `quorum` replicas have durable: the quorum-th largest of the
/// known durable ends (the primary's own included). Replicas that have not
/// reported count as 0.
pub fn committed_end(durable_ends: &[u64], quorum: usize) -> u64 {
    let quorum = quorum.max(1);
    if durable_ends.len() < quorum {
        return 0;
    }
    let mut ends = durable_ends.to_vec();
    ends.sort_unstable_by(|a, b| b.cmp(a));
    ends[quorum - 1]
}

/// The commit across consecutive segments of one log, oldest first (the
/// last one is the active segment): each given as its size and every
/// replica's durable end in it. Returns the index of the segment the
/// commit stands in and the bytes of it committed: the first segment a
/// quorum does not hold entirely, or the last one. `None` for no segments.
pub fn committed_across(segments: &[(u64, Vec<u64>)], quorum: usize) -> Option<(usize, u64)> {
    let last = segments.len().checked_sub(1)?;
    for (i, (size, ends)) in segments.iter().enumerate() {
        let committed = committed_end(ends, quorum).min(*size);
        if committed < *size || i == last {
            return Some((i, committed));
        }
    }
    None
}

/// What a fenced replica reports for seal-by-quorum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FenceReport {
    pub replica: i32,
    /// Its durable end in the segment (bytes).
    pub end: u64,
}

/// Where a segment is sealed once fenced: the largest durable end among the
/// reports, once [`fence_quorum`] replicas have reported (`None` before).
/// Returns the report holding that end (it becomes the source for repairs
/// and, when live, the next primary). Ties go to the earliest report, so a
/// caller lists the replica it prefers (the old primary) first.
pub fn seal_point(reports: &[FenceReport], replicas: usize) -> Option<FenceReport> {
    let mut distinct: Vec<i32> = reports.iter().map(|r| r.replica).collect();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() < fence_quorum(replicas) {
        return None;
    }
    let mut best: Option<FenceReport> = None;
    for r in reports {
        if best.is_none_or(|b| r.end > b.end) {
            best = Some(*r);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn majorities() {
        assert_eq!(quorum_size(1), 1);
        assert_eq!(quorum_size(2), 2);
        assert_eq!(quorum_size(3), 2);
        assert_eq!(quorum_size(5), 3);
    }

    #[test]
    fn commit_quorum_is_a_majority_or_min_insync() {
        assert_eq!(commit_quorum(3, 1), 2);
        assert_eq!(commit_quorum(3, 2), 2);
        assert_eq!(commit_quorum(3, 3), 3);
        assert_eq!(commit_quorum(3, 7), 3, "capped at the set");
        assert_eq!(commit_quorum(5, 4), 4);
        assert_eq!(commit_quorum(1, 2), 1);
        assert_eq!(commit_quorum(0, 0), 1);
    }

    #[test]
    fn fence_quorum_meets_every_majority() {
        assert_eq!(fence_quorum(1), 1);
        assert_eq!(fence_quorum(2), 1);
        assert_eq!(fence_quorum(3), 2);
        assert_eq!(fence_quorum(4), 2);
        assert_eq!(fence_quorum(5), 3);
    }

    #[test]
    fn committed_is_the_quorum_th_largest() {
        assert_eq!(committed_end(&[10], 1), 10);
        assert_eq!(committed_end(&[10, 4, 7], 2), 7);
        assert_eq!(committed_end(&[10, 4, 7], 3), 4);
        assert_eq!(committed_end(&[10, 4], 3), 0);
        assert_eq!(committed_end(&[10], 2), 0);
        assert_eq!(committed_end(&[9, 1, 5, 3, 8], 3), 5);
    }

    #[test]
    fn commit_moves_past_a_segment_only_once_a_quorum_holds_all_of_it() {
        // Segment 0 (100 bytes): the primary and follower A hold it, B
        // skipped its tail at 40. Segment 1: all three at 30.
        let segs = vec![(100, vec![100, 100, 40]), (50, vec![30, 30, 30])];
        assert_eq!(committed_across(&segs, 2), Some((1, 30)));
        // A is gone: B's acks of segment 1 do not commit segment 0's tail.
        let segs = vec![(100, vec![100, 0, 40]), (50, vec![30, 0, 30])];
        assert_eq!(committed_across(&segs, 2), Some((0, 40)));
        // The active segment is where the commit stands even when full.
        assert_eq!(committed_across(&[(10, vec![10, 10])], 2), Some((0, 10)));
        assert_eq!(committed_across(&[], 2), None);
    }

    #[test]
    fn seal_waits_for_a_fence_quorum_and_takes_the_largest() {
        let r = |replica, end| FenceReport { replica, end };
        assert_eq!(seal_point(&[r(2, 5)], 3), None);
        assert_eq!(
            seal_point(&[r(2, 5)], 2),
            Some(r(2, 5)),
            "1 of 2 meets every majority of 2"
        );
        assert_eq!(seal_point(&[r(2, 5), r(3, 6)], 5), None);
        assert_eq!(
            seal_point(&[r(2, 5), r(2, 9)], 3),
            None,
            "one replica twice"
        );
        assert_eq!(seal_point(&[r(2, 5), r(3, 9)], 3), Some(r(3, 9)));
        assert_eq!(seal_point(&[r(1, 9), r(3, 9)], 3), Some(r(1, 9)));
    }

    proptest! {
        /// Whatever was committed (a commit quorum durable at or past it,
        /// whatever `min.insync.replicas`) is below the seal point of any
        /// fence quorum of reports.
        #[test]
        fn seal_never_cuts_a_committed_byte(
            ends in proptest::collection::vec(0u64..1000, 1..6),
            pick in proptest::collection::vec(any::<bool>(), 6),
            min_insync in 1usize..6,
        ) {
            let n = ends.len();
            let committed = committed_end(&ends, commit_quorum(n, min_insync));
            let reports: Vec<FenceReport> = ends.iter().enumerate()
                .filter(|(i, _)| pick[*i])
                .map(|(i, &end)| FenceReport { replica: i as i32, end })
                .collect();
            if let Some(seal) = seal_point(&reports, n) {
                prop_assert!(seal.end >= committed);
            }
        }
    }
}
