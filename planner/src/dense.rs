//! What the balance planners share: one walk of the image's active
//! segments, and live brokers numbered densely (so counts are vectors, not
//! maps looked up in inner loops).

use std::sync::Arc;

use tessera_metadata::{MetadataImage, RangeImage, SegmentImage};

/// Calls `f` with every active range and its active segment (the last
/// unsealed one), by range id: what
/// `image.ranges.values().filter(|r| r.active).filter_map(|r| image.active_segment(r.id))`
/// yields, in one merged walk of the ranges and the segments instead of a
/// map search per range.
pub(crate) fn for_each_active(
    image: &MetadataImage,
    mut f: impl FnMut(&RangeImage, &Arc<SegmentImage>),
) {
    let mut segments = image.segments.iter().peekable();
    for range in image.ranges.values() {
        let mut active: Option<&Arc<SegmentImage>> = None;
        while let Some((id, s)) = segments.peek() {
            if id.range > range.id {
                break;
            }
            if id.range == range.id && !s.is_sealed() {
                active = Some(s);
            }
            segments.next();
        }
        if let (true, Some(s)) = (range.active, active) {
            f(range, s);
        }
    }
}

/// The live (registered, unfenced) brokers, numbered in id order.
pub(crate) struct Live {
    /// Broker id by number.
    pub(crate) ids: Vec<i32>,
    /// Number by id when the ids are small enough for a table.
    table: Vec<u32>,
    offset: i64,
}

const NONE: u32 = u32::MAX;

impl Live {
    pub(crate) fn of(image: &MetadataImage) -> Self {
        let ids: Vec<i32> = image
            .brokers
            .values()
            .filter(|b| !b.fenced)
            .map(|b| b.registration.broker_id)
            .collect();
        let (lo, hi) = match (ids.first(), ids.last()) {
            (Some(&lo), Some(&hi)) => (i64::from(lo), i64::from(hi)),
            _ => (0, -1),
        };
        let span = (hi - lo + 1).max(0);
        let mut table = Vec::new();
        if span <= 4 * ids.len() as i64 + 1024 {
            table = vec![NONE; span as usize];
            for (n, &id) in ids.iter().enumerate() {
                table[(i64::from(id) - lo) as usize] = n as u32;
            }
        }
        Live {
            ids,
            table,
            offset: lo,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    /// The number of live broker `id`, if it is live.
    pub(crate) fn get(&self, id: i32) -> Option<usize> {
        if self.table.is_empty() && !self.ids.is_empty() {
            return self.ids.binary_search(&id).ok();
        }
        let at = i64::from(id) - self.offset;
        if at < 0 || at >= self.table.len() as i64 {
            return None;
        }
        match self.table[at as usize] {
            NONE => None,
            n => Some(n as usize),
        }
    }
}
