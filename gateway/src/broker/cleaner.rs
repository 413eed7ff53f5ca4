//! The log cleaner (compaction): every `log.cleaner.backoff.ms`, the primary
//! of each active range (and the first live replica of a sealed range's
//! last segment: the history a split or merge left) whose topic's
//! `cleanup.policy` includes `compact`
//! plans a pass with [`tessera_log::cleaner::plan_pass`] (the sealed
//! segments that are stable and older than `min.compaction.lag.ms`, when
//! the part not cleaned yet is at least `min.cleanable.dirty.ratio` of
//! them) and runs it with `RangeLog::clean` on a blocking thread, at most
//! `log.cleaner.threads` ranges at once, all of them together paced to
//! `log.cleaner.io.max.bytes.per.second`.
//!
//! Only segments the metadata log records as sealed are cleaned (a roll not
//! recorded yet may still be re-recorded from the local file's spans).
//! A pass is prepared (cleaned copies written beside the segments), then
//! recorded in the metadata log (`CleanSegments`: the segments, the pass's
//! `now` and `delete.retention.ms`, each segment's size before and its
//! size and CRC-32C after), and only once recorded swapped in. Every other
//! replica of the segments applies the recorded pass to its own copies
//! (`clean_passes.rs`), so a replicated range is cleaned on every copy
//! alike. A pass covers the oldest run of sealed segments that share one
//! replica set (every replica of one holds all of them) and ends where no
//! transaction is open (`cleaning_view`). The internal topics
//! (`__consumer_offsets`, `__transaction_state`, created with
//! `cleanup.policy=compact`) are cleaned like any other: their
//! coordinators replay the last record of each key, which compaction keeps.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tessera_log::cleaner::{self, CleanParams, CleanPolicy};
use tessera_log::RangeLog;
use tessera_metadata::{CleanPassRecord, CleanedSegment, MetadataImage, MetadataRecord, RangeId};

use super::clean_passes::{applied_pass, set_applied_pass};
use super::Broker;
use crate::metrics::Metrics;
use crate::topic_config::CompactionConfig;

/// Lets shutdown wait for the pass in flight: once `Broker::shutdown`
/// returns, no cleaned copy is written, swapped in or discarded (a broker
/// started again on the same directory, as tests do in one process, would
/// otherwise find files vanish under it while it opens them).
#[derive(Default)]
pub(super) struct CleanerGate {
    /// Held for a whole pass.
    pass: tokio::sync::Mutex<()>,
    /// Set at shutdown: no pass starts after it.
    stopped: AtomicBool,
}

impl Broker {
    /// Waits for the pass in flight and stops the cleaner.
    pub(super) async fn stop_cleaning(&self) {
        self.cleaner.stopped.store(true, Ordering::Release);
        let _pass = self.cleaner.pass.lock().await;
    }
}

/// The cleaner's I/O budget, shared by the ranges cleaned in one pass.
struct Pace {
    rate: f64,
    started: Instant,
    bytes: parking_lot::Mutex<u64>,
}

impl Pace {
    /// Counts `n` bytes and sleeps (on the blocking thread) while ahead of the rate.
    fn take(&self, n: u64) {
        let delay = {
            let mut bytes = self.bytes.lock();
            *bytes += n;
            cleaner::throttle_delay(*bytes, self.started.elapsed(), self.rate)
        };
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
    }
}

/// One range's pass, as planned.
struct Job {
    range: RangeId,
    topic: String,
    log: Arc<RangeLog>,
    /// The segments of the pass, oldest first.
    seqs: Vec<u32>,
    /// The number the pass is recorded under.
    pass: u64,
    params: CleanParams,
}

impl Broker {
    /// The passes due on the ranges this broker is primary of.
    fn plan_cleaning(&self, image: &MetadataImage, now_ms: i64) -> Vec<Job> {
        let me = self.config.node_id;
        let view = crate::dynamic_config::BrokerView::new(&self.config, image);
        let logs: Vec<(RangeId, Arc<RangeLog>)> = self
            .logs
            .read()
            .iter()
            .map(|(id, log)| (*id, log.clone()))
            .collect();
        // Ranges deleted (their topic) or no longer open here keep no
        // revisit clock: the map stays as large as the logs open here.
        self.replicas
            .oldest_run_cleaned
            .lock()
            .retain(|id, _| image.ranges.contains_key(id) && logs.iter().any(|(l, _)| l == id));
        let mut jobs = Vec::new();
        for (range_id, log) in logs {
            let Some(range) = image.ranges.get(&range_id) else {
                continue;
            };
            let Some(topic) = image.topics.get(&range.topic_id) else {
                continue;
            };
            let segments = image.segments_of(range_id);
            let cleaner_here = if range.active {
                !log.is_sealed()
                    && image.active_segment(range_id).and_then(|s| s.primary()) == Some(me)
            } else {
                sealed_range_cleaner(image, &segments) == Some(me)
            };
            if !cleaner_here || self.replicas.cleaning.lock().contains(&range_id) {
                continue;
            }
            let config = CompactionConfig::resolve(&topic.configs, &view);
            if !config.compact {
                continue;
            }
            let Some(dir) = self.range_dir_of(image, range_id) else {
                continue;
            };
            if applied_pass(&dir) < range.clean_pass() {
                continue; // this log has not applied the range's last pass yet
            }
            // Runs of sealed segments that share one replica set: every
            // replica of a run holds all of it, so each can apply a pass
            // over it. A pass cleans the run holding the first dirty
            // segment (after a re-placement the later runs are dirty too,
            // and would never be cleaned if only the oldest run were).
            // Empty sealed segments (a re-placement right after another)
            // hold nothing and split no run.
            let sealed: Vec<_> = segments
                .iter()
                .filter(|s| s.sealed.as_ref().is_some_and(|x| x.size_bytes > 0))
                .collect();
            let replica_set = |s: &tessera_metadata::SegmentImage| {
                let mut r = s.replicas.clone();
                r.sort_unstable();
                r
            };
            let mut runs: Vec<Vec<&Arc<tessera_metadata::SegmentImage>>> = Vec::new();
            for s in &sealed {
                match runs.last_mut() {
                    Some(run) if replica_set(run[0]) == replica_set(s) => run.push(s),
                    _ => runs.push(vec![s]),
                }
            }
            // Segments past the last one a pass rewrote are dirty.
            let first_dirty_seq = sealed
                .iter()
                .filter(|s| s.clean_pass() > 0)
                .map(|s| s.id.seq + 1)
                .max()
                .unwrap_or(0);
            let dirty_run = runs
                .iter()
                .position(|run| run.last().is_some_and(|s| s.id.seq >= first_dirty_seq));
            // A clean oldest run is cleaned again once per
            // delete.retention.ms: the tombstones and markers its last pass
            // stamped with a horizon go once it passed (Kafka cleans a log
            // whose delete horizon passed, KIP-534), also when the new
            // writes all land in later runs.
            let revisit_due = || {
                let mut cleaned = self.replicas.oldest_run_cleaned.lock();
                let since = *cleaned
                    .entry(range_id)
                    .or_insert_with(std::time::Instant::now);
                since.elapsed().as_millis()
                    >= u128::try_from(config.delete_retention_ms.max(0)).unwrap_or(0)
            };
            let (run_index, first_dirty_seq) = match dirty_run {
                Some(0) => (0, first_dirty_seq),
                _ if !runs.is_empty() && revisit_due() => (0, 0),
                Some(i) => (i, first_dirty_seq),
                None => continue,
            };
            let recorded: std::collections::BTreeSet<u32> = runs[run_index]
                .iter()
                .take_while(|s| s.replicas.contains(&me) && log.holds_sealed(s.id.seq))
                .map(|s| s.id.seq)
                .collect();
            // Only a pass over the oldest run may drop tombstones and the
            // markers of emptied transactions: an older run may still hold
            // a value the tombstone deletes (it would come back) or the
            // batches of the marker's transaction. A later run's pass keeps
            // them all (its clock is before every horizon); they go once its
            // run is the oldest.
            let oldest_run = run_index == 0;
            let local = log.cleaning_view();
            let stats: Vec<cleaner::SegmentStat> = local
                .segments
                .iter()
                .filter(|s| recorded.contains(&s.seq))
                .copied()
                .collect();
            let policy = CleanPolicy {
                now_ms,
                min_compaction_lag_ms: config.min_compaction_lag_ms,
                min_cleanable_dirty_ratio: config.min_cleanable_dirty_ratio,
                max_compaction_lag_ms: config.max_compaction_lag_ms,
            };
            let Some(up_to) = cleaner::plan_pass(&stats, first_dirty_seq, &policy) else {
                continue;
            };
            let seqs: Vec<u32> = stats
                .iter()
                .map(|s| s.seq)
                .take_while(|s| *s <= up_to)
                .collect();
            if oldest_run {
                self.replicas
                    .oldest_run_cleaned
                    .lock()
                    .insert(range_id, std::time::Instant::now());
            }
            jobs.push(Job {
                range: range_id,
                topic: topic.name.clone(),
                log,
                seqs,
                pass: range.clean_pass() + 1,
                params: if oldest_run {
                    CleanParams {
                        now_ms,
                        delete_retention_ms: config.delete_retention_ms.max(0),
                    }
                } else {
                    // Horizons it stamps are after its clock, so none passes.
                    CleanParams {
                        now_ms: i64::MIN,
                        delete_retention_ms: config.delete_retention_ms.max(1),
                    }
                },
            });
        }
        jobs
    }

    /// One cleaning pass over the ranges this broker is primary of, after
    /// applying the passes of other primaries that its copies lack.
    pub(crate) async fn clean_logs(self: &Arc<Self>) {
        let image = self.image();
        self.catch_up_clean_passes(&image);
        let mut jobs = self.plan_cleaning(&image, tessera_log::range_log::now_ms());
        jobs.retain(|j| self.replicas.cleaning.lock().insert(j.range));
        if jobs.is_empty() {
            return;
        }
        let pace = Arc::new(Pace {
            rate: self.config.log_cleaner_io_max_bytes_per_second,
            started: Instant::now(),
            bytes: parking_lot::Mutex::new(0),
        });
        let permits = Arc::new(tokio::sync::Semaphore::new(self.config.log_cleaner_threads));
        let mut tasks = tokio::task::JoinSet::new();
        for job in jobs {
            let (pace, permits, broker) = (pace.clone(), permits.clone(), self.clone());
            tasks.spawn(async move {
                let range = job.range;
                if let Ok(_permit) = permits.acquire_owned().await {
                    broker.run_pass(job, pace).await;
                }
                broker.replicas.cleaning.lock().remove(&range);
            });
        }
        while tasks.join_next().await.is_some() {}
    }

    /// Prepares a planned pass, records it, and swaps it in once recorded.
    async fn run_pass(self: &Arc<Self>, job: Job, pace: Arc<Pace>) {
        let started = Instant::now();
        let (log, seqs, params) = (job.log.clone(), job.seqs.clone(), job.params);
        let metrics = self.clone();
        let prepared = tokio::task::spawn_blocking(move || {
            log.prepare_pass(&seqs, params, &mut |n| {
                Metrics::add(&metrics.metrics.cleaner_io_bytes, n);
                pace.take(n)
            })
        })
        .await;
        let prepared = match prepared {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => {
                tracing::warn!(topic = %job.topic, range = job.range, error = %e, "log cleaner: pass failed");
                return;
            }
            Err(e) => {
                tracing::warn!(range = job.range, error = %e, "log cleaner: pass panicked");
                return;
            }
        };
        let record = MetadataRecord::CleanSegments(CleanPassRecord {
            range_id: job.range,
            pass: job.pass,
            now_ms: job.params.now_ms,
            delete_retention_ms: job.params.delete_retention_ms,
            segments: prepared
                .copies
                .iter()
                .map(|c| CleanedSegment {
                    seq: c.seq,
                    size_before: c.size_before,
                    size_after: c.size_after,
                    crc32c: c.crc32c,
                })
                .collect(),
        });
        let dir = job.log.dir().to_path_buf();
        match self.controller.write_detailed(vec![record]).await {
            Ok(outcome) if outcome.skipped.is_empty() => {}
            Ok(_) => {
                tracing::info!(
                    range = job.range,
                    pass = job.pass,
                    "log cleaner: pass lost a race with another; dropped"
                );
                tessera_log::clean_pass::discard(&dir, &prepared);
                return;
            }
            Err(e) => {
                // If it was recorded after all, the catch-up applies it.
                tracing::warn!(range = job.range, error = %e, "log cleaner: could not record the pass");
                tessera_log::clean_pass::discard(&dir, &prepared);
                return;
            }
        }
        let log = job.log.clone();
        let swapped = tokio::task::spawn_blocking(move || {
            let stats = log.swap_prepared(&prepared)?;
            set_applied_pass(&dir, job.pass)?;
            anyhow::Ok(stats)
        })
        .await;
        match swapped {
            Ok(Ok(stats)) => {
                let m = &self.metrics;
                if !stats.rewritten.is_empty() {
                    Metrics::add(&m.cleaner_passes, 1);
                    Metrics::add(&m.cleaner_bytes_before, stats.bytes_before);
                    Metrics::add(&m.cleaner_bytes_after, stats.bytes_after);
                }
                let secs = started.elapsed().as_secs_f64().max(1e-6);
                tracing::info!(
                    topic = %job.topic,
                    range = job.range,
                    pass = job.pass,
                    segments = job.seqs.len(),
                    rewritten = stats.rewritten.len(),
                    keys = stats.keys,
                    bytes_before = stats.bytes_before,
                    bytes_after = stats.bytes_after,
                    mb_per_sec = stats.bytes_read as f64 / secs / 1e6,
                    "log cleaner: cleaned"
                );
            }
            // The pass is recorded: the catch-up applies it again.
            Ok(Err(e)) => {
                tracing::warn!(topic = %job.topic, range = job.range, error = %format!("{e:#}"), "log cleaner: swap failed")
            }
            Err(e) => tracing::warn!(range = job.range, error = %e, "log cleaner: swap panicked"),
        }
    }
}

/// Who cleans a sealed range (the history a split or merge left behind,
/// read by its children): the first live replica of its last segment, its
/// primary while that one lives. Its copies are cleaned on their own: a
/// key a child updated again keeps its last record here too (at most one
/// per key and partition in each ancestor, where Kafka keeps none).
fn sealed_range_cleaner(
    image: &MetadataImage,
    segments: &[Arc<tessera_metadata::SegmentImage>],
) -> Option<i32> {
    let last = segments.last()?;
    last.replicas
        .iter()
        .copied()
        .find(|r| image.brokers.get(r).is_some_and(|b| !b.fenced))
}

/// Runs cleaning passes until the broker is gone (with the cleaner
/// disabled, only applies the passes other primaries recorded).
pub(super) async fn run(broker: Weak<Broker>) {
    loop {
        let Some(b) = broker.upgrade() else { return };
        let backoff = Duration::from_millis(b.config.log_cleaner_backoff_ms);
        let pass = b.cleaner.pass.lock().await;
        if b.cleaner.stopped.load(Ordering::Acquire) {
            return;
        }
        if b.is_ready() && !b.is_shutting_down() {
            if b.config.log_cleaner_enable {
                b.clean_logs().await;
            } else {
                // Passes other primaries recorded still apply to the copies
                // here (their seals and repairs wait for them).
                b.catch_up_clean_passes(&b.image());
            }
        }
        drop(pass);
        drop(b);
        tokio::time::sleep(backoff).await;
    }
}
