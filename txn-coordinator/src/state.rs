//! The transaction state machine, after Kafka's `TransactionState`,
//! `TransactionMetadata` and the checks of `TransactionCoordinator`. Pure:
//! each operation takes the current metadata and returns the metadata to
//! persist (the coordinator appends it to `__transaction_state` and only then
//! keeps it), or the error Kafka answers.

use std::collections::BTreeSet;

/// Kafka's `RecordBatch.NO_PRODUCER_EPOCH` / `NO_PRODUCER_ID`.
pub const NO_PRODUCER_EPOCH: i16 = -1;
pub const NO_PRODUCER_ID: i64 = -1;

/// A transaction's state (Kafka's ids, used in `__transaction_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TxnState {
    Empty,
    Ongoing,
    PrepareCommit,
    PrepareAbort,
    CompleteCommit,
    CompleteAbort,
    Dead,
    PrepareEpochFence,
}

pub const ALL_STATES: [TxnState; 8] = [
    TxnState::Empty,
    TxnState::Ongoing,
    TxnState::PrepareCommit,
    TxnState::PrepareAbort,
    TxnState::CompleteCommit,
    TxnState::CompleteAbort,
    TxnState::Dead,
    TxnState::PrepareEpochFence,
];

impl TxnState {
    pub fn id(self) -> i8 {
        match self {
            TxnState::Empty => 0,
            TxnState::Ongoing => 1,
            TxnState::PrepareCommit => 2,
            TxnState::PrepareAbort => 3,
            TxnState::CompleteCommit => 4,
            TxnState::CompleteAbort => 5,
            TxnState::Dead => 6,
            TxnState::PrepareEpochFence => 7,
        }
    }

    pub fn from_id(id: i8) -> Option<TxnState> {
        ALL_STATES.iter().copied().find(|s| s.id() == id)
    }

    /// The name DescribeTransactions / ListTransactions use.
    pub fn name(self) -> &'static str {
        match self {
            TxnState::Empty => "Empty",
            TxnState::Ongoing => "Ongoing",
            TxnState::PrepareCommit => "PrepareCommit",
            TxnState::PrepareAbort => "PrepareAbort",
            TxnState::CompleteCommit => "CompleteCommit",
            TxnState::CompleteAbort => "CompleteAbort",
            TxnState::Dead => "Dead",
            TxnState::PrepareEpochFence => "PrepareEpochFence",
        }
    }

    pub fn from_name(name: &str) -> Option<TxnState> {
        ALL_STATES.iter().copied().find(|s| s.name() == name)
    }

    /// Kafka's `TransactionState.validPreviousStates`.
    pub fn valid_previous(self) -> &'static [TxnState] {
        use TxnState::*;
        match self {
            Empty => &[Empty, CompleteCommit, CompleteAbort],
            Ongoing => &[Ongoing, Empty, CompleteCommit, CompleteAbort],
            PrepareCommit => &[Ongoing],
            PrepareAbort => &[Ongoing, PrepareEpochFence],
            CompleteCommit => &[PrepareCommit],
            CompleteAbort => &[PrepareAbort],
            Dead => &[Empty, CompleteAbort, CompleteCommit],
            PrepareEpochFence => &[Ongoing],
        }
    }

    pub fn can_transition_to(self, next: TxnState) -> bool {
        next.valid_previous().contains(&self)
    }

    /// Prepare states: markers are being written.
    pub fn is_prepare(self) -> bool {
        matches!(self, TxnState::PrepareCommit | TxnState::PrepareAbort)
    }

    /// No transaction open: the id may expire.
    pub fn is_idle(self) -> bool {
        matches!(
            self,
            TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort
        )
    }
}

/// One transactional id's metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnMetadata {
    pub transactional_id: String,
    pub producer_id: i64,
    /// The producer id before the last rotation (epoch exhaustion), or -1.
    pub last_producer_id: i64,
    pub producer_epoch: i16,
    /// The epoch before the last bump (KIP-360 retries), or -1.
    pub last_producer_epoch: i16,
    pub timeout_ms: i32,
    pub state: TxnState,
    /// Partitions of the open transaction, by (topic, partition).
    pub partitions: BTreeSet<(String, i32)>,
    /// When the open transaction started (first partition added), or -1.
    pub start_ms: i64,
    pub last_update_ms: i64,
}

/// Why an operation is refused (mapped to Kafka's codes by the caller).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxnError {
    InvalidProducerIdMapping,
    ProducerFenced,
    ConcurrentTransactions,
    InvalidTxnState,
}

/// What InitProducerId does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InitDecision {
    /// Persist this (Empty) metadata, then answer with its id and epoch.
    Ready(TxnMetadata),
    /// An open transaction of the previous epoch must be aborted first:
    /// persist this PrepareAbort (epoch bumped, fencing the old producer),
    /// write the markers, complete, and answer CONCURRENT_TRANSACTIONS so
    /// the client retries (Kafka's behaviour).
    AbortFirst(TxnMetadata),
}

/// What EndTxn does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndDecision {
    /// Persist this Prepare state, write markers, then complete.
    Prepare(TxnMetadata),
    /// A retry of an EndTxn that already completed: answer success.
    AlreadyDone,
}

/// Kafka's `TransactionMetadata.isEpochExhausted`.
pub fn is_epoch_exhausted(epoch: i16) -> bool {
    epoch >= i16::MAX - 1
}

impl TxnMetadata {
    /// A new id: Empty, with no epoch yet (the first init bumps it to 0).
    pub fn new(transactional_id: &str, producer_id: i64, timeout_ms: i32, now: i64) -> Self {
        TxnMetadata {
            transactional_id: transactional_id.to_string(),
            producer_id,
            last_producer_id: NO_PRODUCER_ID,
            producer_epoch: NO_PRODUCER_EPOCH,
            last_producer_epoch: NO_PRODUCER_EPOCH,
            timeout_ms,
            state: TxnState::Empty,
            partitions: BTreeSet::new(),
            start_ms: -1,
            last_update_ms: now,
        }
    }

    fn to(&self, state: TxnState, now: i64) -> Result<TxnMetadata, TxnError> {
        if !self.state.can_transition_to(state) {
            return Err(TxnError::InvalidTxnState);
        }
        let mut next = self.clone();
        next.state = state;
        next.last_update_ms = now;
        Ok(next)
    }

    /// Has the transaction run past its timeout?
    pub fn is_timed_out(&self, now: i64) -> bool {
        self.state == TxnState::Ongoing
            && self.start_ms >= 0
            && self.start_ms + self.timeout_ms as i64 <= now
    }

    /// Kafka's `isValidProducerId` for an InitProducerId that names the
    /// producer's current id and epoch (KIP-360).
    fn is_valid_expected(&self, expected: (i64, i16)) -> bool {
        self.producer_epoch == NO_PRODUCER_EPOCH
            || expected.0 == self.producer_id
            || (expected.0 == self.last_producer_id && is_epoch_exhausted(expected.1))
    }

    /// InitProducerId on existing metadata. `fresh_producer_id` is used only
    /// when the epoch is exhausted (see [`TxnMetadata::needs_new_producer_id`]).
    pub fn init_producer_id(
        &self,
        timeout_ms: i32,
        expected: Option<(i64, i16)>,
        fresh_producer_id: Option<i64>,
        now: i64,
    ) -> Result<InitDecision, TxnError> {
        if let Some(e) = expected {
            if !self.is_valid_expected(e) {
                return Err(TxnError::ProducerFenced);
            }
        }
        match self.state {
            TxnState::PrepareCommit | TxnState::PrepareAbort => {
                Err(TxnError::ConcurrentTransactions)
            }
            TxnState::Ongoing => {
                // Fence the current producer and abort its transaction.
                let mut next = self.to(TxnState::PrepareEpochFence, now)?;
                if !is_epoch_exhausted(next.producer_epoch) {
                    next.producer_epoch += 1;
                }
                next.last_producer_epoch = NO_PRODUCER_EPOCH;
                let next = next.to(TxnState::PrepareAbort, now)?;
                Ok(InitDecision::AbortFirst(next))
            }
            TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort => {
                let mut next = self.to(TxnState::Empty, now)?;
                next.timeout_ms = timeout_ms;
                next.partitions.clear();
                next.start_ms = -1;
                if is_epoch_exhausted(self.producer_epoch)
                    && expected.is_none_or(|e| e.1 == self.producer_epoch)
                {
                    let id = fresh_producer_id.ok_or(TxnError::ConcurrentTransactions)?;
                    next.last_producer_id = self.producer_id;
                    next.producer_id = id;
                    next.producer_epoch = 0;
                    // Kafka's prepareProducerIdRotation(recordLastEpoch): a
                    // retry naming the old id and epoch gets the same answer.
                    next.last_producer_epoch = if expected.is_some() {
                        self.producer_epoch
                    } else {
                        NO_PRODUCER_EPOCH
                    };
                    return Ok(InitDecision::Ready(next));
                }
                // Kafka's prepareIncrementProducerEpoch.
                let bumped = self.producer_epoch.wrapping_add(1);
                match expected {
                    None => {
                        next.producer_epoch = bumped;
                        next.last_producer_epoch = NO_PRODUCER_EPOCH;
                    }
                    Some((_, epoch))
                        if self.producer_epoch == NO_PRODUCER_EPOCH
                            || epoch == self.producer_epoch =>
                    {
                        next.producer_epoch = bumped;
                        next.last_producer_epoch = self.producer_epoch;
                    }
                    Some((_, epoch)) if epoch == self.last_producer_epoch => {
                        // A retry of a bump whose answer was lost.
                    }
                    Some(_) => return Err(TxnError::ProducerFenced),
                }
                Ok(InitDecision::Ready(next))
            }
            TxnState::Dead | TxnState::PrepareEpochFence => Err(TxnError::ConcurrentTransactions),
        }
    }

    /// Does an InitProducerId need a new producer id (epoch exhausted)?
    pub fn needs_new_producer_id(&self) -> bool {
        is_epoch_exhausted(self.producer_epoch)
    }

    fn check_producer(&self, producer_id: i64, epoch: i16) -> Result<(), TxnError> {
        if self.producer_id != producer_id {
            Err(TxnError::InvalidProducerIdMapping)
        } else if self.producer_epoch != epoch {
            Err(TxnError::ProducerFenced)
        } else {
            Ok(())
        }
    }

    /// AddPartitionsToTxn (and AddOffsetsToTxn's offsets partition).
    /// `Ok(None)`: every partition is already in the transaction.
    pub fn add_partitions(
        &self,
        producer_id: i64,
        epoch: i16,
        partitions: &[(String, i32)],
        now: i64,
    ) -> Result<Option<TxnMetadata>, TxnError> {
        self.check_producer(producer_id, epoch)?;
        match self.state {
            TxnState::PrepareCommit | TxnState::PrepareAbort | TxnState::PrepareEpochFence => {
                return Err(TxnError::ConcurrentTransactions)
            }
            TxnState::Ongoing if partitions.iter().all(|p| self.partitions.contains(p)) => {
                return Ok(None)
            }
            _ => {}
        }
        let mut next = self.to(TxnState::Ongoing, now)?;
        if self.state != TxnState::Ongoing {
            next.start_ms = now;
            next.partitions.clear();
        }
        next.partitions.extend(partitions.iter().cloned());
        Ok(Some(next))
    }

    /// EndTxn from a client (`from_client`) or from the coordinator itself.
    pub fn end_txn(
        &self,
        producer_id: i64,
        epoch: i16,
        commit: bool,
        from_client: bool,
        now: i64,
    ) -> Result<EndDecision, TxnError> {
        if self.producer_id != producer_id {
            return Err(TxnError::InvalidProducerIdMapping);
        }
        if (from_client && epoch != self.producer_epoch) || epoch < self.producer_epoch {
            return Err(TxnError::ProducerFenced);
        }
        match (self.state, commit) {
            (TxnState::Ongoing, true) => {
                Ok(EndDecision::Prepare(self.to(TxnState::PrepareCommit, now)?))
            }
            (TxnState::Ongoing, false) => {
                Ok(EndDecision::Prepare(self.to(TxnState::PrepareAbort, now)?))
            }
            (TxnState::CompleteCommit, true) | (TxnState::CompleteAbort, false) => {
                Ok(EndDecision::AlreadyDone)
            }
            (TxnState::PrepareCommit, true) | (TxnState::PrepareAbort, false) => {
                Err(TxnError::ConcurrentTransactions)
            }
            _ => Err(TxnError::InvalidTxnState),
        }
    }

    /// The coordinator aborts a timed-out transaction: the epoch is bumped
    /// (fencing the producer, as Kafka's `prepareFenceProducerEpoch`) and
    /// the transaction goes to PrepareAbort.
    pub fn abort_timed_out(&self, now: i64) -> Result<TxnMetadata, TxnError> {
        let mut fence = self.to(TxnState::PrepareEpochFence, now)?;
        if !is_epoch_exhausted(fence.producer_epoch) {
            fence.producer_epoch += 1;
        }
        fence.last_producer_epoch = NO_PRODUCER_EPOCH;
        fence.to(TxnState::PrepareAbort, now)
    }

    /// Markers are written: PrepareCommit -> CompleteCommit, PrepareAbort ->
    /// CompleteAbort, with no partitions left.
    pub fn complete(&self, now: i64) -> Result<TxnMetadata, TxnError> {
        let state = match self.state {
            TxnState::PrepareCommit => TxnState::CompleteCommit,
            TxnState::PrepareAbort => TxnState::CompleteAbort,
            _ => return Err(TxnError::InvalidTxnState),
        };
        let mut next = self.to(state, now)?;
        next.partitions.clear();
        Ok(next)
    }

    /// An idle id expires (a tombstone is written).
    pub fn expire(&self, now: i64) -> Result<TxnMetadata, TxnError> {
        self.to(TxnState::Dead, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TxnState::*;

    fn meta(state: TxnState, epoch: i16) -> TxnMetadata {
        let mut m = TxnMetadata::new("t", 7, 60_000, 0);
        m.state = state;
        m.producer_epoch = epoch;
        if state == Ongoing || state.is_prepare() {
            m.partitions.insert(("a".into(), 0));
            m.start_ms = 100;
        }
        m
    }

    fn parts(ps: &[(&str, i32)]) -> Vec<(String, i32)> {
        ps.iter().map(|(t, p)| (t.to_string(), *p)).collect()
    }

    #[test]
    fn transition_table_is_kafkas() {
        let allowed: Vec<(TxnState, TxnState)> = vec![
            (Empty, Empty),
            (CompleteCommit, Empty),
            (CompleteAbort, Empty),
            (Ongoing, Ongoing),
            (Empty, Ongoing),
            (CompleteCommit, Ongoing),
            (CompleteAbort, Ongoing),
            (Ongoing, PrepareCommit),
            (Ongoing, PrepareAbort),
            (PrepareEpochFence, PrepareAbort),
            (PrepareCommit, CompleteCommit),
            (PrepareAbort, CompleteAbort),
            (Empty, Dead),
            (CompleteAbort, Dead),
            (CompleteCommit, Dead),
            (Ongoing, PrepareEpochFence),
        ];
        for from in ALL_STATES {
            for to in ALL_STATES {
                assert_eq!(
                    from.can_transition_to(to),
                    allowed.contains(&(from, to)),
                    "{from:?} -> {to:?}"
                );
            }
        }
    }

    #[test]
    fn ids_and_names_round_trip() {
        for s in ALL_STATES {
            assert_eq!(TxnState::from_id(s.id()), Some(s));
            assert_eq!(TxnState::from_name(s.name()), Some(s));
        }
        assert_eq!(TxnState::from_id(8), None);
        assert_eq!(TxnState::from_name("ongoing"), None);
        assert_eq!(PrepareEpochFence.id(), 7);
    }

    #[test]
    fn first_init_gets_epoch_zero_then_bumps() {
        let m = TxnMetadata::new("t", 7, 1000, 0);
        let InitDecision::Ready(m1) = m.init_producer_id(5000, None, None, 1).unwrap() else {
            panic!()
        };
        assert_eq!((m1.producer_id, m1.producer_epoch, m1.state), (7, 0, Empty));
        assert_eq!(m1.timeout_ms, 5000);
        let InitDecision::Ready(m2) = m1.init_producer_id(5000, None, None, 2).unwrap() else {
            panic!()
        };
        assert_eq!(m2.producer_epoch, 1);
    }

    #[test]
    fn init_from_complete_states_bumps_and_clears() {
        for s in [CompleteCommit, CompleteAbort, Empty] {
            let m = meta(s, 3);
            let InitDecision::Ready(n) = m.init_producer_id(1, None, None, 5).unwrap() else {
                panic!()
            };
            assert_eq!((n.state, n.producer_epoch, n.start_ms), (Empty, 4, -1));
            assert!(n.partitions.is_empty());
        }
    }

    #[test]
    fn init_during_prepare_is_concurrent() {
        for s in [PrepareCommit, PrepareAbort, Dead, PrepareEpochFence] {
            assert_eq!(
                meta(s, 1).init_producer_id(1, None, None, 5),
                Err(TxnError::ConcurrentTransactions),
                "{s:?}"
            );
        }
    }

    #[test]
    fn init_during_ongoing_fences_and_aborts() {
        let m = meta(Ongoing, 2);
        let InitDecision::AbortFirst(n) = m.init_producer_id(1, None, None, 5).unwrap() else {
            panic!()
        };
        assert_eq!((n.state, n.producer_epoch), (PrepareAbort, 3));
        assert_eq!(n.partitions, m.partitions);
        let done = n.complete(6).unwrap();
        assert_eq!((done.state, done.producer_epoch), (CompleteAbort, 3));
        assert!(done.partitions.is_empty());
        let InitDecision::Ready(r) = done.init_producer_id(1, None, None, 7).unwrap() else {
            panic!()
        };
        assert_eq!(r.producer_epoch, 4);
    }

    #[test]
    fn kip360_expected_epoch() {
        let m = meta(Empty, 5);
        // The current epoch: bump, remembering the previous one.
        let InitDecision::Ready(n) = m.init_producer_id(1, Some((7, 5)), None, 1).unwrap() else {
            panic!()
        };
        assert_eq!((n.producer_epoch, n.last_producer_epoch), (6, 5));
        // A retry with the old epoch (its answer was lost): same epoch again.
        let InitDecision::Ready(r) = n.init_producer_id(1, Some((7, 5)), None, 2).unwrap() else {
            panic!()
        };
        assert_eq!(r.producer_epoch, 6);
        // An older epoch: fenced.
        assert_eq!(
            n.init_producer_id(1, Some((7, 3)), None, 2),
            Err(TxnError::ProducerFenced)
        );
        // Another producer id: fenced.
        assert_eq!(
            n.init_producer_id(1, Some((8, 6)), None, 2),
            Err(TxnError::ProducerFenced)
        );
    }

    #[test]
    fn exhausted_epoch_rotates_producer_id() {
        let m = meta(CompleteCommit, i16::MAX - 1);
        assert!(m.needs_new_producer_id());
        let InitDecision::Ready(n) = m.init_producer_id(1, None, Some(99), 1).unwrap() else {
            panic!()
        };
        assert_eq!(
            (n.producer_id, n.producer_epoch, n.last_producer_id),
            (99, 0, 7)
        );
        // KIP-360: naming the exhausted epoch rotates too, and a retry of it
        // (the answer was lost) gets the same id and epoch.
        let InitDecision::Ready(k) = m
            .init_producer_id(1, Some((7, i16::MAX - 1)), Some(99), 1)
            .unwrap()
        else {
            panic!()
        };
        assert_eq!((k.producer_id, k.producer_epoch), (99, 0));
        let InitDecision::Ready(r) = k
            .init_producer_id(1, Some((7, i16::MAX - 1)), None, 2)
            .unwrap()
        else {
            panic!()
        };
        assert_eq!((r.producer_id, r.producer_epoch), (99, 0));
    }

    #[test]
    fn add_partitions_rules() {
        let m = meta(Empty, 0);
        let a = m
            .add_partitions(7, 0, &parts(&[("a", 0)]), 50)
            .unwrap()
            .unwrap();
        assert_eq!((a.state, a.start_ms), (Ongoing, 50));
        // Already there: nothing to write.
        assert_eq!(a.add_partitions(7, 0, &parts(&[("a", 0)]), 60), Ok(None));
        let b = a
            .add_partitions(7, 0, &parts(&[("b", 1)]), 60)
            .unwrap()
            .unwrap();
        assert_eq!(b.partitions.len(), 2);
        assert_eq!(b.start_ms, 50);
        assert_eq!(
            b.add_partitions(8, 0, &parts(&[("c", 0)]), 1),
            Err(TxnError::InvalidProducerIdMapping)
        );
        assert_eq!(
            b.add_partitions(7, 1, &parts(&[("c", 0)]), 1),
            Err(TxnError::ProducerFenced)
        );
        for s in [PrepareCommit, PrepareAbort, PrepareEpochFence] {
            assert_eq!(
                meta(s, 0).add_partitions(7, 0, &parts(&[("c", 0)]), 1),
                Err(TxnError::ConcurrentTransactions)
            );
        }
        assert_eq!(
            meta(Dead, 0).add_partitions(7, 0, &parts(&[("c", 0)]), 1),
            Err(TxnError::InvalidTxnState)
        );
        // A new transaction after a completed one starts afresh.
        let c = meta(CompleteCommit, 0)
            .add_partitions(7, 0, &parts(&[("z", 2)]), 70)
            .unwrap()
            .unwrap();
        assert_eq!(c.partitions.len(), 1);
        assert_eq!(c.start_ms, 70);
    }

    #[test]
    fn end_txn_rules() {
        let m = meta(Ongoing, 2);
        assert!(matches!(
            m.end_txn(7, 2, true, true, 1),
            Ok(EndDecision::Prepare(TxnMetadata {
                state: PrepareCommit,
                ..
            }))
        ));
        assert!(matches!(
            m.end_txn(7, 2, false, true, 1),
            Ok(EndDecision::Prepare(TxnMetadata {
                state: PrepareAbort,
                ..
            }))
        ));
        assert_eq!(
            m.end_txn(8, 2, true, true, 1),
            Err(TxnError::InvalidProducerIdMapping)
        );
        assert_eq!(
            m.end_txn(7, 1, true, true, 1),
            Err(TxnError::ProducerFenced)
        );
        assert_eq!(
            m.end_txn(7, 3, true, true, 1),
            Err(TxnError::ProducerFenced)
        );
        // The coordinator may end with a newer epoch, never an older one.
        assert!(m.end_txn(7, 3, false, false, 1).is_ok());
        assert_eq!(
            m.end_txn(7, 1, false, false, 1),
            Err(TxnError::ProducerFenced)
        );
        let cases = [
            (CompleteCommit, true, Ok(EndDecision::AlreadyDone)),
            (CompleteCommit, false, Err(TxnError::InvalidTxnState)),
            (CompleteAbort, false, Ok(EndDecision::AlreadyDone)),
            (CompleteAbort, true, Err(TxnError::InvalidTxnState)),
            (PrepareCommit, true, Err(TxnError::ConcurrentTransactions)),
            (PrepareCommit, false, Err(TxnError::InvalidTxnState)),
            (PrepareAbort, false, Err(TxnError::ConcurrentTransactions)),
            (PrepareAbort, true, Err(TxnError::InvalidTxnState)),
            (Empty, true, Err(TxnError::InvalidTxnState)),
            (Empty, false, Err(TxnError::InvalidTxnState)),
            (Dead, true, Err(TxnError::InvalidTxnState)),
            (PrepareEpochFence, false, Err(TxnError::InvalidTxnState)),
        ];
        for (state, commit, want) in cases {
            assert_eq!(
                meta(state, 2).end_txn(7, 2, commit, true, 1),
                want,
                "{state:?} {commit}"
            );
        }
    }

    #[test]
    fn complete_and_timeout() {
        let m = meta(Ongoing, 2);
        assert!(!m.is_timed_out(100 + 59_999));
        assert!(m.is_timed_out(100 + 60_000));
        assert!(!meta(Empty, 0).is_timed_out(i64::MAX / 2));
        let a = m.abort_timed_out(1).unwrap();
        assert_eq!((a.state, a.producer_epoch), (PrepareAbort, 3));
        assert_eq!(
            meta(Empty, 0).abort_timed_out(1),
            Err(TxnError::InvalidTxnState)
        );
        let c = m.end_txn(7, 2, true, true, 1).unwrap();
        let EndDecision::Prepare(p) = c else { panic!() };
        let done = p.complete(2).unwrap();
        assert_eq!(done.state, CompleteCommit);
        assert_eq!(done.start_ms, 100);
        for s in [
            Empty,
            Ongoing,
            CompleteCommit,
            CompleteAbort,
            Dead,
            PrepareEpochFence,
        ] {
            assert_eq!(meta(s, 0).complete(1), Err(TxnError::InvalidTxnState));
        }
    }

    #[test]
    fn only_idle_ids_expire() {
        for s in ALL_STATES {
            assert_eq!(meta(s, 0).expire(1).is_ok(), s.is_idle(), "{s:?}");
        }
    }
}
