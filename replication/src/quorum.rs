//! Quorum arithmetic of one segment's replica set (pure).
//!
//! A segment with `n` replicas commits what a majority has made durable, and
//! is sealed by a majority too: any two majorities share a member, so every
//! acknowledged byte is on at least one replica of any seal quorum.

/// Replicas that make a majority of `replicas`.
pub fn quorum_size(replicas: usize) -> usize {
    replicas / 2 + 1
}

/// The end a majority of the replica set has durable: the quorum-th largest
/// of the known durable ends (the primary's own included). Replicas that
/// have not reported count as 0.
pub fn committed_end(durable_ends: &[u64], replicas: usize) -> u64 {
    let quorum = quorum_size(replicas.max(1));
    if durable_ends.len() < quorum {
        return 0;
    }
    let mut ends = durable_ends.to_vec();
    ends.sort_unstable_by(|a, b| b.cmp(a));
    ends[quorum - 1]
}

/// What a fenced replica reports for seal-by-quorum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FenceReport {
    pub replica: i32,
    /// Its durable end in the segment (bytes).
    pub end: u64,
}

/// Where a segment is sealed once fenced: the largest durable end among the
/// reports, once a majority of the replica set has reported (`None` before).
/// Returns the report holding that end (it becomes the source for repairs
/// and, when live, the next primary). Ties go to the earliest report, so a
/// caller lists the replica it prefers (the old primary) first.
pub fn seal_point(reports: &[FenceReport], replicas: usize) -> Option<FenceReport> {
    let mut distinct: Vec<i32> = reports.iter().map(|r| r.replica).collect();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() < quorum_size(replicas.max(1)) {
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
    fn committed_is_the_quorum_th_largest() {
        assert_eq!(committed_end(&[10], 1), 10);
        assert_eq!(committed_end(&[10, 4, 7], 3), 7);
        assert_eq!(committed_end(&[10, 4], 3), 4);
        assert_eq!(committed_end(&[10], 3), 0);
        assert_eq!(committed_end(&[9, 1, 5, 3, 8], 5), 5);
    }

    #[test]
    fn seal_waits_for_a_majority_and_takes_the_largest() {
        let r = |replica, end| FenceReport { replica, end };
        assert_eq!(seal_point(&[r(2, 5)], 3), None);
        assert_eq!(
            seal_point(&[r(2, 5), r(2, 9)], 3),
            None,
            "one replica twice"
        );
        assert_eq!(seal_point(&[r(2, 5), r(3, 9)], 3), Some(r(3, 9)));
        assert_eq!(seal_point(&[r(1, 9), r(3, 9)], 3), Some(r(1, 9)));
    }

    proptest! {
        /// Whatever was committed (a majority durable at or past it) is
        /// below the seal point of any majority of fence reports.
        #[test]
        fn seal_never_cuts_a_committed_byte(
            ends in proptest::collection::vec(0u64..1000, 1..6),
            pick in proptest::collection::vec(any::<bool>(), 6),
        ) {
            let n = ends.len();
            let committed = committed_end(&ends, n);
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
