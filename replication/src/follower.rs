//! A follower replica of one segment (pure): what it accepts, when it is
//! durable, and what fencing and sealing do to it.
//!
//! A follower only accepts bytes that start at its own end, so the primary's
//! pipelined stream lands in order or not at all (a gap or an overlap gets
//! `Mismatch` with the follower's end, and the primary resends from there).
//! Once fenced it accepts nothing from anyone; once the seal is known it
//! truncates bytes past the sealed size (never acknowledged) and needs a
//! repair if it is short.

/// What a follower says to an offered append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offer {
    /// Write the bytes at the follower's end.
    Accept,
    /// The bytes do not start at the follower's end: resend from `end`.
    Mismatch { end: u64 },
    /// Fenced or sealed: this segment takes no more appends.
    Refused,
}

/// What a follower must do to its copy once the segment's seal is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SealAction {
    /// The copy is exactly the sealed segment.
    Complete,
    /// Cut the copy to `size` (bytes past it were never acknowledged).
    Truncate { size: u64 },
    /// The copy is short: fetch `[from, size)` from a complete replica.
    Repair { from: u64, size: u64 },
}

/// One follower's copy of one segment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FollowerSegment {
    /// Bytes written (page cache).
    pub written: u64,
    /// Bytes fsynced.
    pub durable: u64,
    pub fenced: bool,
    pub sealed_size: Option<u64>,
}

impl FollowerSegment {
    /// A copy recovered from disk after a restart: what survived is durable.
    pub fn recovered(size: u64, fenced: bool, sealed_size: Option<u64>) -> FollowerSegment {
        FollowerSegment {
            written: size,
            durable: size,
            fenced,
            sealed_size,
        }
    }

    /// Decides on `len` bytes offered at `position`.
    pub fn offer(&self, position: u64, len: u64) -> Offer {
        if self.fenced || self.sealed_size.is_some() {
            return Offer::Refused;
        }
        if position != self.written || len == 0 {
            return Offer::Mismatch { end: self.written };
        }
        Offer::Accept
    }

    /// Records an accepted write of `len` bytes.
    pub fn wrote(&mut self, len: u64) {
        self.written += len;
    }

    /// Everything written up to `position` is fsynced.
    pub fn synced(&mut self, position: u64) {
        self.durable = self.durable.max(position.min(self.written));
    }

    /// Fences the copy (the caller fsyncs first, so all written is durable)
    /// and returns the durable end to report.
    pub fn fence(&mut self) -> u64 {
        self.fenced = true;
        self.synced(self.written);
        self.durable
    }

    /// The seal is committed at `size`: what this copy must do.
    pub fn seal(&mut self, size: u64) -> SealAction {
        self.sealed_size = Some(size);
        self.fenced = true;
        match self.written.cmp(&size) {
            std::cmp::Ordering::Equal => SealAction::Complete,
            std::cmp::Ordering::Greater => {
                self.written = size;
                self.durable = self.durable.min(size);
                SealAction::Truncate { size }
            }
            std::cmp::Ordering::Less => SealAction::Repair {
                from: self.written,
                size,
            },
        }
    }

    /// The seal is applied and the copy is exactly the sealed segment,
    /// durably: it may serve as the history of a range this broker leads.
    pub fn is_complete(&self) -> bool {
        self.sealed_size
            .is_some_and(|size| self.written == size && self.durable == size)
    }

    /// A repair wrote `[written, position)` (a sealed copy accepts only repairs).
    pub fn repaired(&mut self, position: u64) {
        let cap = self.sealed_size.unwrap_or(position);
        self.written = self.written.max(position.min(cap));
        self.durable = self.written;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_only_at_its_end() {
        let mut f = FollowerSegment::default();
        assert_eq!(f.offer(0, 10), Offer::Accept);
        f.wrote(10);
        assert_eq!(f.offer(10, 5), Offer::Accept);
        assert_eq!(f.offer(0, 10), Offer::Mismatch { end: 10 });
        assert_eq!(f.offer(15, 5), Offer::Mismatch { end: 10 });
    }

    #[test]
    fn fenced_refuses_everything_and_reports_all_written() {
        let mut f = FollowerSegment::default();
        f.wrote(10);
        f.synced(4);
        assert_eq!(f.fence(), 10);
        assert_eq!(f.offer(10, 1), Offer::Refused);
    }

    #[test]
    fn seal_truncates_or_asks_for_repair() {
        let mut long = FollowerSegment::recovered(20, true, None);
        assert_eq!(long.seal(12), SealAction::Truncate { size: 12 });
        assert_eq!(long.written, 12);
        let mut short = FollowerSegment::recovered(5, true, None);
        assert_eq!(short.seal(12), SealAction::Repair { from: 5, size: 12 });
        assert!(!short.is_complete());
        short.repaired(12);
        assert_eq!(short.written, 12);
        assert!(short.is_complete());
        let mut exact = FollowerSegment::recovered(12, false, None);
        assert_eq!(exact.seal(12), SealAction::Complete);
        assert_eq!(exact.offer(12, 1), Offer::Refused);
    }
}
