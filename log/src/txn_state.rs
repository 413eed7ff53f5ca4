//! Transaction state of one partition, as Kafka's log keeps it: the open
//! transaction of each transactional producer (its first offset), which gives
//! the last stable offset, and the aborted transactions, which a
//! read_committed fetch returns so clients drop those records. Pure logic,
//! fed with every stored batch in offset order (on append and on recovery).

use std::collections::{BTreeMap, HashMap};

/// `IndexEntry::flags` bits.
pub const FLAG_TRANSACTIONAL: u8 = 1;
pub const FLAG_CONTROL: u8 = 2;
/// Set on a control batch whose marker is COMMIT (clear: ABORT).
pub const FLAG_COMMIT: u8 = 4;

/// An aborted transaction: its producer, its first offset and the offset of
/// its ABORT marker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AbortedTxn {
    pub producer_id: i64,
    pub first_offset: i64,
    pub last_offset: i64,
}

/// Transaction state of one partition. Allocated on first use: most
/// partitions of a wide range never see a transaction, and an empty state is
/// one pointer wide.
#[derive(Clone, Debug, Default)]
pub struct TxnState {
    inner: Option<Box<TxnInner>>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct TxnInner {
    /// first offset -> producer id, for every open transaction.
    ongoing: BTreeMap<i64, i64>,
    /// producer id -> first offset of its open transaction.
    by_producer: HashMap<i64, i64>,
    /// In marker order (so by `last_offset`).
    aborted: Vec<AbortedTxn>,
}

static EMPTY: std::sync::LazyLock<TxnInner> = std::sync::LazyLock::new(TxnInner::default);

impl PartialEq for TxnState {
    fn eq(&self, other: &Self) -> bool {
        // An allocated but empty state equals no state.
        self.view() == other.view()
    }
}

impl Eq for TxnState {}

impl TxnState {
    fn view(&self) -> &TxnInner {
        self.inner.as_deref().unwrap_or(&EMPTY)
    }

    fn view_mut(&mut self) -> &mut TxnInner {
        self.inner.get_or_insert_with(Default::default)
    }

    /// Feeds one stored batch.
    pub fn on_batch(&mut self, producer_id: i64, base_offset: i64, last_offset: i64, flags: u8) {
        if producer_id < 0 {
            return;
        }
        if flags & FLAG_CONTROL != 0 {
            if !self.view().by_producer.contains_key(&producer_id) {
                return;
            }
            let state = self.view_mut();
            if let Some(first) = state.by_producer.remove(&producer_id) {
                state.ongoing.remove(&first);
                if flags & FLAG_COMMIT == 0 {
                    state.aborted.push(AbortedTxn {
                        producer_id,
                        first_offset: first,
                        last_offset,
                    });
                }
            }
        } else if flags & FLAG_TRANSACTIONAL != 0
            && !self.view().by_producer.contains_key(&producer_id)
        {
            let state = self.view_mut();
            state.by_producer.insert(producer_id, base_offset);
            state.ongoing.insert(base_offset, producer_id);
        }
        let _ = last_offset;
    }

    /// The first offset of the oldest open transaction.
    pub fn first_unstable_offset(&self) -> Option<i64> {
        self.view().ongoing.keys().next().copied()
    }

    /// Open transactions as `(producer id, first offset)`.
    pub fn ongoing(&self) -> impl Iterator<Item = (i64, i64)> + '_ {
        self.view()
            .ongoing
            .iter()
            .map(|(first, pid)| (*pid, *first))
    }

    /// Aborted transactions that overlap `[from, to)`: their marker is at or
    /// after `from` and they began before `to`.
    pub fn aborted_overlapping(&self, from: i64, to: i64) -> Vec<AbortedTxn> {
        let aborted = &self.view().aborted;
        let start = aborted.partition_point(|a| a.last_offset < from);
        aborted[start..]
            .iter()
            .filter(|a| a.first_offset < to)
            .copied()
            .collect()
    }

    /// The aborted transactions, in marker order.
    pub(crate) fn aborted(&self) -> &[AbortedTxn] {
        &self.view().aborted
    }

    /// Replaces the aborted transactions (rebuilt from the indexes).
    pub(crate) fn set_aborted(&mut self, aborted: Vec<AbortedTxn>) {
        if !aborted.is_empty() || self.inner.is_some() {
            self.view_mut().aborted = aborted;
        }
    }

    /// The open transactions alone (what a producer snapshot holds; the
    /// aborted ones come from the transaction indexes and `.aborted` files).
    pub fn inherited(&self) -> TxnState {
        let view = self.view();
        if view.ongoing.is_empty() {
            return TxnState::default();
        }
        TxnState {
            inner: Some(Box::new(TxnInner {
                ongoing: view.ongoing.clone(),
                by_producer: view.by_producer.clone(),
                aborted: Vec::new(),
            })),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_transactions_hold_back_the_lso() {
        let mut t = TxnState::default();
        t.on_batch(1, 10, 12, FLAG_TRANSACTIONAL);
        t.on_batch(2, 13, 13, FLAG_TRANSACTIONAL);
        t.on_batch(1, 14, 15, FLAG_TRANSACTIONAL); // same transaction, still starts at 10
        assert_eq!(t.first_unstable_offset(), Some(10));
        t.on_batch(1, 16, 16, FLAG_CONTROL | FLAG_COMMIT);
        assert_eq!(t.first_unstable_offset(), Some(13));
        t.on_batch(2, 17, 17, FLAG_CONTROL);
        assert_eq!(t.first_unstable_offset(), None);
        assert_eq!(
            t.aborted_overlapping(0, 100),
            vec![AbortedTxn {
                producer_id: 2,
                first_offset: 13,
                last_offset: 17
            }]
        );
    }

    #[test]
    fn aborted_overlap_bounds() {
        let mut t = TxnState::default();
        t.on_batch(5, 0, 0, FLAG_TRANSACTIONAL);
        t.on_batch(5, 1, 1, FLAG_CONTROL);
        t.on_batch(5, 10, 10, FLAG_TRANSACTIONAL);
        t.on_batch(5, 11, 11, FLAG_CONTROL);
        assert_eq!(t.aborted_overlapping(2, 10).len(), 0);
        assert_eq!(t.aborted_overlapping(2, 11).len(), 1);
        assert_eq!(t.aborted_overlapping(0, 100).len(), 2);
        assert_eq!(t.aborted_overlapping(12, 100).len(), 0);
    }

    #[test]
    fn plain_and_idempotent_batches_change_nothing() {
        let mut t = TxnState::default();
        t.on_batch(-1, 0, 5, 0);
        t.on_batch(3, 6, 7, 0);
        assert_eq!(t, TxnState::default());
        // A marker without an open transaction is ignored.
        t.on_batch(3, 8, 8, FLAG_CONTROL);
        assert_eq!(t, TxnState::default());
    }

    #[test]
    fn children_inherit_open_transactions_only() {
        let mut t = TxnState::default();
        t.on_batch(1, 0, 0, FLAG_TRANSACTIONAL);
        t.on_batch(1, 1, 1, FLAG_CONTROL);
        t.on_batch(2, 2, 2, FLAG_TRANSACTIONAL);
        let child = t.inherited();
        assert_eq!(child.first_unstable_offset(), Some(2));
        assert!(child.aborted_overlapping(0, 100).is_empty());
    }
}
