//! Elastic ranges: split and merge as metadata operations, and reads that
//! follow a partition's lineage back through sealed ancestor ranges.
//!
//! A split seals the parent's log (appends from then on get
//! NOT_LEADER_OR_FOLLOWER, clients refresh metadata), then commits one
//! metadata entry: the parent's last segment sealed, the parent range sealed,
//! the children created with the parent as lineage and their first segments
//! opened with a higher leader epoch. The children seed each partition's next
//! offset and producer state from the parent, so offsets continue with no gap
//! and no reuse. No data is copied.
//!
//! Both children open where the parent was led (its log seeds them); then
//! every child but the first is handed to a follower of its first segment,
//! the one leading the fewest ranges, by a leader move, so that a range
//! split for its load spreads over brokers. A merge runs where both parents
//! are led: a parent led elsewhere is first handed to the merging broker
//! the same way (it must be among the parent's replicas).
//!
//! A move is all or nothing: if the metadata entry does not commit, every
//! parent sealed for it is reopened (in a new segment, recorded as a roll)
//! and serves again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tessera_log::RangeLog;
use tessera_metadata::{MetadataImage, RangeId, TopicImage};
use tessera_planner::MovePlan;

use crate::broker::{local_segment_records, Broker};
use crate::config::RangePolicyConfig;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::range_policy::{Decision, PolicyConfig, PolicyState, RangeLoad};

/// How many times a split plans its children's spread (a move that ended
/// as an ordinary seal is planned again on the next segment).
const SPREAD_ATTEMPTS: usize = 3;

/// How long a merge waits for this broker to lead both parents.
const MERGE_GATHER_TIMEOUT: Duration = Duration::from_secs(30);

/// One range as `tessera ranges list` and `GET /ranges` show it.
#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq)]
pub struct RangeInfo {
    pub id: RangeId,
    pub topic: String,
    pub lo: u32,
    pub hi: u32,
    pub active: bool,
    pub parents: Vec<RangeId>,
    pub segments: usize,
    pub leader_epoch: i32,
    /// The primary of its newest segment (the leader of its partitions
    /// while it is active): where a split or merge of it is to be asked.
    #[serde(default)]
    pub primary: Option<i32>,
    pub bytes_appended: u64,
    /// Bytes appended per second, as the broker answering measures it
    /// (set on the range's primary only).
    #[serde(default)]
    pub bytes_in_per_sec: Option<u64>,
}

/// One segment as `GET /segments` shows it, with this broker's copy.
#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq)]
pub struct SegmentInfo {
    pub range: RangeId,
    pub seq: u32,
    pub topic: String,
    pub replicas: Vec<i32>,
    pub leader_epoch: i32,
    /// The sealed size; `None` while active.
    pub sealed_bytes: Option<u64>,
    /// Bytes of the segment's file on this broker (`None`: no file here).
    pub local_bytes: Option<u64>,
    /// The cleaning pass that last rewrote it (0: none); `sealed_bytes`
    /// is its size after that pass.
    pub clean_pass: u64,
    /// Once sealed: each partition's offsets in it, `[partition, start,
    /// end)` as the seal recorded them (what reads of its history look up).
    #[serde(default)]
    pub spans: Vec<(u32, i64, i64)>,
}

impl Broker {
    /// Every segment of every range, by (range, seq).
    pub fn list_segments(&self) -> Vec<SegmentInfo> {
        let image = self.image();
        image
            .segments
            .values()
            .filter_map(|s| {
                let range = image.ranges.get(&s.id.range)?;
                let topic = image.topics.get(&range.topic_id)?;
                let dir = self.range_dir_of(&image, s.id.range)?;
                let local_bytes = std::fs::metadata(tessera_log::segment::log_path(&dir, s.id.seq))
                    .ok()
                    .map(|m| m.len());
                Some(SegmentInfo {
                    range: s.id.range,
                    seq: s.id.seq,
                    topic: topic.name.clone(),
                    replicas: s.replicas.clone(),
                    leader_epoch: s.leader_epoch,
                    sealed_bytes: s.sealed.as_ref().map(|i| i.size_bytes),
                    local_bytes,
                    clean_pass: s.clean_pass(),
                    spans: s
                        .sealed
                        .iter()
                        .flat_map(|i| &i.spans)
                        .map(|sp| (sp.partition, sp.start_offset, sp.end_offset))
                        .collect(),
                })
            })
            .collect()
    }

    /// Every range of every topic, by id.
    pub fn list_ranges(&self) -> Vec<RangeInfo> {
        let image = self.image();
        image
            .ranges
            .values()
            .filter_map(|r| {
                let topic = image.topics.get(&r.topic_id)?;
                let segments = image.segments_of(r.id);
                Some(RangeInfo {
                    id: r.id,
                    topic: topic.name.clone(),
                    lo: r.lo,
                    hi: r.hi,
                    active: r.active,
                    parents: r.parents.clone(),
                    segments: segments.len(),
                    leader_epoch: segments.last().map_or(-1, |s| s.leader_epoch),
                    primary: segments.last().and_then(|s| s.primary()),
                    bytes_appended: self.log_of(r.id).map_or(0, |l| l.bytes_appended()),
                    bytes_in_per_sec: self.range_rate(r.id),
                })
            })
            .collect()
    }

    /// Splits an active range at partition `at` (default: the middle) into
    /// `[lo, at)` and `[at, hi)`. Returns the children's ids.
    pub async fn split_range(
        &self,
        range_id: RangeId,
        at: Option<u32>,
    ) -> Result<(RangeId, RangeId), ApiError> {
        let _guard = self.admin.lock().await;
        let image = self.image();
        let plan = tessera_planner::split_range(&image, range_id, at)?;
        self.commit_move(&image, plan).await?;
        let children = self.children_of(&[range_id]).await?;
        let [left, right] = children[..] else {
            return Err(ApiError::InvalidRequest(format!(
                "the split of range {range_id} lost its child ids to a concurrent move; \
                 its partitions continue in range {children:?}: split that one"
            )));
        };
        tracing::info!(range_id, left, right, "split range");
        self.spread_children(&[left, right]);
        Ok((left, right))
    }

    /// The active ranges a committed move made of `parents`, in partition
    /// order. A move whose child ids a concurrent move took first sealed
    /// its parents without them; the active controller then creates the
    /// children they are owed (`tessera_planner::complete_moves`), which
    /// this waits for.
    async fn children_of(&self, parents: &[RangeId]) -> Result<Vec<RangeId>, ApiError> {
        let deadline = Instant::now() + MERGE_GATHER_TIMEOUT;
        loop {
            let image = self.image();
            let mut children: Vec<_> = image
                .ranges
                .values()
                .filter(|r| r.active && r.parents.iter().any(|p| parents.contains(p)))
                .map(|r| (r.lo, r.id))
                .collect();
            children.sort_unstable();
            let covered: u32 = children
                .iter()
                .filter_map(|(_, id)| image.ranges.get(id))
                .map(|r| r.hi - r.lo)
                .sum();
            let width: u32 = parents
                .iter()
                .filter_map(|p| image.ranges.get(p))
                .map(|r| r.hi - r.lo)
                .sum();
            if covered == width {
                return Ok(children.into_iter().map(|(_, id)| id).collect());
            }
            if Instant::now() >= deadline {
                return Err(ApiError::RequestTimedOut);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Hands split children but the first to followers of their first
    /// segment (`tessera_planner::spread_split_children`): the split opened
    /// them all here, where the parent's log seeds them, and a range split
    /// for its load should not stay on one broker. Returns at once: a task
    /// carries the moves out, and plans again when one ended as an
    /// ordinary seal (the follower did not answer the fence in time, as
    /// on a busy machine: the primary kept the child), a few times.
    fn spread_children(&self, children: &[RangeId]) {
        let children = children.to_vec();
        let broker = self.weak();
        tokio::spawn(async move {
            for _ in 0..SPREAD_ATTEMPTS {
                let Some(b) = broker.upgrade() else { return };
                let moves = tessera_planner::spread_split_children(&b.image(), &children);
                if moves.is_empty() {
                    return;
                }
                let segments: Vec<_> = moves.iter().map(|m| m.segment).collect();
                for m in moves {
                    tracing::info!(segment = %m.segment, from = m.from, to = m.to, "split: handing a child to a follower, so that the children lead on different brokers");
                    if b.move_leader(m) {
                        Metrics::add(&b.metrics.leader_moves_planned, 1);
                    }
                }
                drop(b);
                // Until those seals are done (each is retried until the
                // image shows its segment sealed), a minute at most.
                let deadline = Instant::now() + Duration::from_secs(60);
                while Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    let Some(b) = broker.upgrade() else { return };
                    let image = b.image();
                    let sealed = |s: &tessera_metadata::SegmentId| {
                        image.segments.get(s).is_none_or(|seg| seg.is_sealed())
                    };
                    if segments.iter().all(sealed) {
                        break;
                    }
                }
            }
        });
    }

    /// Makes this broker lead every parent of a merge
    /// (`tessera_planner::gather_for_merge`: leader moves of those led
    /// elsewhere, onto it as their follower), and waits until it does with
    /// their logs open: the merge child seeds from them here. A split
    /// spreads its children over brokers, so merging them back needs this.
    async fn gather_parents(&self, parents: &[RangeId]) -> Result<(), ApiError> {
        let me = self.config.node_id;
        let deadline = Instant::now() + MERGE_GATHER_TIMEOUT;
        loop {
            let image = self.image();
            let moves = tessera_planner::gather_for_merge(&image, parents, me)?;
            let open = || {
                parents
                    .iter()
                    .all(|p| self.log_of(*p).is_some_and(|l| !l.is_sealed()))
            };
            if moves.is_empty() && open() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                tracing::warn!(?parents, "merge: the parents were not led here in time");
                return Err(ApiError::RequestTimedOut);
            }
            for m in moves {
                let (segment, from) = (m.segment, m.from);
                if self.move_leader(m) {
                    tracing::info!(%segment, from, to = me, "merge: taking over a parent led elsewhere");
                    Metrics::add(&self.metrics.leader_moves_planned, 1);
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Merges two adjacent active ranges of one topic into one. Returns its id.
    pub async fn merge_ranges(
        &self,
        left_id: RangeId,
        right_id: RangeId,
    ) -> Result<RangeId, ApiError> {
        let _guard = self.admin.lock().await;
        self.gather_parents(&[left_id, right_id]).await?;
        let image = self.image();
        let plan = tessera_planner::merge_ranges(&image, left_id, right_id)?;
        self.commit_move(&image, plan).await?;
        let children = self.children_of(&[left_id, right_id]).await?;
        let [child] = children[..] else {
            return Err(ApiError::InvalidRequest(format!(
                "the merge of ranges {left_id} and {right_id} lost its child id to a concurrent \
                 move; their partitions continue in ranges {children:?}"
            )));
        };
        tracing::info!(left_id, right_id, child, "merged ranges");
        Ok(child)
    }

    /// Carries out a planned move as one transaction: seals the parents'
    /// logs, then commits the records that bring their segments up to date
    /// in the metadata log followed by the plan's, in one entry. If anything
    /// fails before that entry commits, the parents sealed so far are
    /// reopened and serve again; once it commits, the children are opened
    /// (this broker's logs follow the image) before it returns.
    async fn commit_move(&self, image: &MetadataImage, plan: MovePlan) -> Result<(), ApiError> {
        let mut sealed: Vec<(RangeId, Arc<RangeLog>)> = Vec::new();
        let committed = async {
            let mut records = Vec::new();
            for range in &plan.parents {
                let log = self.log_of(*range).ok_or(ApiError::NotLeaderOrFollower)?;
                log.seal()?;
                sealed.push((*range, log.clone()));
                records.extend(local_segment_records(image, *range, &log));
            }
            let unsealed = tessera_planner::parents_left_unsealed(image, &plan.parents, &records);
            if !unsealed.is_empty() {
                // Not their primary at the image's epoch (a failover moved
                // them on): replay would refuse the move anyway.
                tracing::warn!(
                    ?unsealed,
                    "range move refused: this broker cannot seal the parents' active segments"
                );
                return Err(ApiError::NotLeaderOrFollower);
            }
            records.extend(plan.records);
            self.controller
                .write_detailed(records)
                .await
                .map_err(ApiError::from)
        }
        .await;
        let outcome = match committed {
            Ok(outcome) => outcome,
            Err(e) => {
                self.reopen_after_failed_move(&sealed);
                return Err(e);
            }
        };
        if !outcome.skipped.is_empty() {
            // The image changed under the admin lock (a failover sealed a
            // parent's segment first): replay applied none of the move.
            tracing::warn!(skipped = ?outcome.skipped, "range move records were skipped");
        }
        self.await_reconciled(outcome.offset).await?;
        let image = self.image();
        if plan
            .parents
            .iter()
            .any(|p| image.ranges.get(p).is_some_and(|r| r.active))
        {
            self.reopen_after_failed_move(&sealed);
            return Err(ApiError::NotLeaderOrFollower);
        }
        Ok(())
    }

    /// The move did not commit: every parent it sealed serves again, unless
    /// the image shows the move after all (then the children take over).
    fn reopen_after_failed_move(&self, sealed: &[(RangeId, Arc<RangeLog>)]) {
        let image = self.image();
        for (range_id, log) in sealed {
            if image.ranges.get(range_id).is_none_or(|r| !r.active) {
                continue;
            }
            match log.reopen() {
                Ok(segment) => {
                    tracing::warn!(
                        range_id,
                        "range move did not commit; the range serves again"
                    );
                    self.notify_roll(*range_id, segment);
                }
                Err(e) => {
                    tracing::error!(range_id, error = %e, "range move did not commit and the range could not be reopened")
                }
            }
        }
    }

    /// The log holding `offset` of `partition`: the active range's, or the
    /// newest ancestor whose data starts at or below the offset, among the
    /// logs open here (see [`route_in_lineage`]).
    pub fn read_route(
        &self,
        image: &MetadataImage,
        topic: &TopicImage,
        partition: u32,
        offset: i64,
    ) -> Result<Arc<RangeLog>, ApiError> {
        let mut logs = Vec::new();
        let mut next = image.active_range_for(topic.id, partition);
        while let Some(range) = next {
            logs.push(self.log_of(range.id));
            next = parent_covering(image, &range, partition);
        }
        let bases = logs
            .iter()
            .map(|log| log.as_ref().map(|l| l.base_offset(partition)).transpose())
            .collect::<Result<Vec<_>, _>>()?;
        route_in_lineage(&bases, offset)
            .and_then(|i| logs[i].clone())
            .ok_or(ApiError::NotLeaderOrFollower)
    }

    /// Every log that holds history of `partition`, oldest first.
    pub fn lineage(
        &self,
        image: &MetadataImage,
        topic: &TopicImage,
        partition: u32,
    ) -> Vec<Arc<RangeLog>> {
        let mut out = Vec::new();
        let mut next = image.active_range_for(topic.id, partition);
        while let Some(range) = next {
            if let Some(log) = self.log_of(range.id) {
                out.push(log);
            }
            next = parent_covering(image, &range, partition);
        }
        out.reverse();
        out
    }
}

/// Of a partition's ranges from the active one back through its ancestors
/// (`bases`, newest first: the base offset of each one's log where it is
/// open here), the one to read `offset` from: the newest open log starting
/// at or below it; below them all, the oldest open one (its log start
/// answers). A broker that leads a child without its parents' logs (it
/// followed the child) may still hold an older ancestor's log open: the
/// logs missing in between are passed over, not an error (that left
/// offsets in the older ancestor unreadable to the final read of fault
/// run seed 9).
pub(crate) fn route_in_lineage(bases: &[Option<i64>], offset: i64) -> Option<usize> {
    bases
        .iter()
        .position(|base| base.is_some_and(|b| offset >= b))
        .or_else(|| bases.iter().rposition(Option::is_some))
}

fn parent_covering(
    image: &MetadataImage,
    range: &tessera_metadata::RangeImage,
    partition: u32,
) -> Option<Arc<tessera_metadata::RangeImage>> {
    range
        .parents
        .iter()
        .filter_map(|id| image.ranges.get(id))
        .find(|r| r.lo <= partition && partition < r.hi)
        .cloned()
}

/// The policy's thresholds for one topic: its own `range.*` configs where
/// set, else the broker's.
pub fn policy_config_for(topic: &TopicImage, broker: &RangePolicyConfig) -> PolicyConfig {
    let num = |key: &str, default: u64| {
        topic
            .configs
            .get(key)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(default)
    };
    PolicyConfig {
        split_bytes_per_sec: num("range.split.bytes.per.sec", broker.split_bytes_per_sec) as f64,
        merge_bytes_per_sec: num("range.merge.bytes.per.sec", broker.merge_bytes_per_sec) as f64,
        min_ranges: num("range.min.count", broker.min_count as u64) as usize,
        max_ranges: num("range.max.count", broker.max_count as u64) as usize,
        sustain_intervals: broker.sustain_intervals,
    }
}

/// Measures every active range's produce rate each interval and carries out
/// the policy's splits and merges. Every decision is logged and counted.
pub async fn run_range_policy(broker: Arc<Broker>) {
    let config = broker.config.range_policy.clone();
    if !config.enabled {
        return;
    }
    let interval = Duration::from_millis(config.interval_ms);
    let mut state = PolicyState::default();
    let mut last: HashMap<RangeId, (u64, Instant)> = HashMap::new();
    loop {
        tokio::time::sleep(interval).await;
        if !broker.is_ready() {
            continue;
        }
        let image = broker.image();
        for topic in image.topics.values() {
            let loads: Vec<RangeLoad> = image
                .active_ranges(topic.id)
                .iter()
                .filter_map(|r| {
                    let bytes = broker.log_of(r.id)?.bytes_appended();
                    let now = Instant::now();
                    // A range seen for the first time has no rate yet.
                    let rate = last.insert(r.id, (bytes, now)).map(|(before, at)| {
                        bytes.saturating_sub(before) as f64 / (now - at).as_secs_f64().max(1e-3)
                    });
                    Some(RangeLoad {
                        id: r.id,
                        lo: r.lo,
                        hi: r.hi,
                        bytes_per_sec: rate,
                    })
                })
                .collect();
            if loads.is_empty() {
                continue;
            }
            let policy = policy_config_for(topic, &config);
            let Some(decision) = state.decide(&loads, &policy) else {
                continue;
            };
            let rate = |id: RangeId| {
                loads
                    .iter()
                    .find(|l| l.id == id)
                    .and_then(|l| l.bytes_per_sec)
                    .unwrap_or(0.0)
            };
            match decision {
                Decision::Split { range } => {
                    tracing::info!(
                        topic = %topic.name, range, bytes_per_sec = rate(range) as u64,
                        target = policy.split_bytes_per_sec as u64, "range policy: splitting a hot range"
                    );
                    match broker.split_range(range, None).await {
                        Ok(_) => Metrics::add(&broker.metrics.range_splits, 1),
                        Err(e) => tracing::warn!(range, error = %e, "range policy: split failed"),
                    }
                }
                Decision::Merge { left, right } => {
                    tracing::info!(
                        topic = %topic.name, left, right,
                        bytes_per_sec = (rate(left) + rate(right)) as u64,
                        below = policy.merge_bytes_per_sec as u64, "range policy: merging cold ranges"
                    );
                    match broker.merge_ranges(left, right).await {
                        Ok(_) => Metrics::add(&broker.metrics.range_merges, 1),
                        Err(e) => {
                            tracing::warn!(left, right, error = %e, "range policy: merge failed")
                        }
                    }
                }
            }
        }
        let image = broker.image();
        state.retain(|id| image.ranges.get(&id).is_some_and(|r| r.active));
        last.retain(|id, _| image.ranges.get(id).is_some_and(|r| r.active));
    }
}

#[cfg(test)]
mod tests {
    use super::route_in_lineage;

    #[test]
    fn a_read_routes_to_the_newest_open_log_starting_at_or_below_the_offset() {
        // Active range at 100, its parent not open here, the grandparent
        // (from 0) open: offsets below 100 are the grandparent's.
        let lineage = [Some(100), None, Some(0)];
        assert_eq!(route_in_lineage(&lineage, 150), Some(0));
        assert_eq!(route_in_lineage(&lineage, 100), Some(0));
        assert_eq!(route_in_lineage(&lineage, 50), Some(2));
        assert_eq!(route_in_lineage(&lineage, 0), Some(2));
        // Below every open log: the oldest open one answers.
        assert_eq!(route_in_lineage(&[Some(100), Some(40), None], 10), Some(1));
        // The active range's log not open here: an open ancestor still
        // serves what it holds.
        assert_eq!(route_in_lineage(&[None, Some(10)], 20), Some(1));
        assert_eq!(route_in_lineage(&[None, None], 5), None);
        assert_eq!(route_in_lineage(&[], 5), None);
    }
}
