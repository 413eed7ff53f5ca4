//! The log cleaner (compaction): every `log.cleaner.backoff.ms`, the primary
//! of each active range whose topic's `cleanup.policy` includes `compact`
//! plans a pass with [`tessera_log::cleaner::plan_pass`] (the sealed
//! segments that are stable and older than `min.compaction.lag.ms`, when
//! the part not cleaned yet is at least `min.cleanable.dirty.ratio` of
//! them) and runs it with `RangeLog::clean` on a blocking thread, at most
//! `log.cleaner.threads` ranges at once, all of them together paced to
//! `log.cleaner.io.max.bytes.per.second`.
//!
//! Only segments the metadata log records as sealed are cleaned (a roll not
//! recorded yet may still be re-recorded from the local file's spans).
//! Ranges whose segments have more than one replica are not cleaned yet:
//! see "Log compaction" in docs/ARCHITECTURE.md for how replicas will stay
//! identical. The internal topics (`__consumer_offsets`,
//! `__transaction_state`, created with `cleanup.policy=compact`) are
//! cleaned like any other: their coordinators replay the last record of
//! each key, which compaction keeps.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tessera_log::cleaner::{self, CleanParams, CleanPolicy};
use tessera_log::RangeLog;
use tessera_metadata::{MetadataImage, RangeId};

use super::Broker;
use crate::metrics::Metrics;
use crate::topic_config::CompactionConfig;

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
    up_to: u32,
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
        let mut jobs = Vec::new();
        for (range_id, log) in logs {
            let Some(range) = image.ranges.get(&range_id) else {
                continue;
            };
            let Some(topic) = image.topics.get(&range.topic_id) else {
                continue;
            };
            let segments = image.segments_of(range_id);
            if !range.active
                || log.is_sealed()
                || image.active_segment(range_id).and_then(|s| s.primary()) != Some(me)
                || segments.iter().any(|s| s.replicas.len() > 1)
            {
                continue;
            }
            let config = CompactionConfig::resolve(&topic.configs, &view);
            if !config.compact {
                continue;
            }
            let recorded: std::collections::BTreeSet<u32> = segments
                .iter()
                .filter(|s| s.is_sealed())
                .map(|s| s.id.seq)
                .collect();
            let local = log.cleaning_view();
            let sealed: Vec<cleaner::SegmentStat> = local
                .segments
                .iter()
                .take_while(|s| recorded.contains(&s.seq))
                .copied()
                .collect();
            let policy = CleanPolicy {
                now_ms,
                min_compaction_lag_ms: config.min_compaction_lag_ms,
                min_cleanable_dirty_ratio: config.min_cleanable_dirty_ratio,
                max_compaction_lag_ms: config.max_compaction_lag_ms,
            };
            let Some(up_to) = cleaner::plan_pass(&sealed, local.first_dirty_seq, &policy) else {
                continue;
            };
            jobs.push(Job {
                range: range_id,
                topic: topic.name.clone(),
                log,
                up_to,
                params: CleanParams {
                    now_ms,
                    delete_retention_ms: config.delete_retention_ms.max(0),
                },
            });
        }
        jobs
    }

    /// One cleaning pass over the ranges this broker is primary of.
    pub(crate) async fn clean_logs(self: &Arc<Self>) {
        let image = self.image();
        let jobs = self.plan_cleaning(&image, tessera_log::range_log::now_ms());
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
                let Ok(_permit) = permits.acquire_owned().await else {
                    return;
                };
                let started = Instant::now();
                let log = job.log.clone();
                let metrics = broker.clone();
                let done = tokio::task::spawn_blocking(move || {
                    log.clean(job.up_to, job.params, &mut |n| {
                        Metrics::add(&metrics.metrics.cleaner_io_bytes, n);
                        pace.take(n)
                    })
                })
                .await;
                match done {
                    Ok(Ok(stats)) => {
                        let m = &broker.metrics;
                        if !stats.rewritten.is_empty() {
                            Metrics::add(&m.cleaner_passes, 1);
                            Metrics::add(&m.cleaner_bytes_before, stats.bytes_before);
                            Metrics::add(&m.cleaner_bytes_after, stats.bytes_after);
                        }
                        let secs = started.elapsed().as_secs_f64().max(1e-6);
                        tracing::info!(
                            topic = %job.topic,
                            range = job.range,
                            up_to = job.up_to,
                            rewritten = stats.rewritten.len(),
                            keys = stats.keys,
                            bytes_before = stats.bytes_before,
                            bytes_after = stats.bytes_after,
                            mb_per_sec = stats.bytes_read as f64 / secs / 1e6,
                            "log cleaner: cleaned"
                        );
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(topic = %job.topic, range = job.range, error = %e, "log cleaner: pass failed")
                    }
                    Err(e) => {
                        tracing::warn!(range = job.range, error = %e, "log cleaner: pass panicked")
                    }
                }
            });
        }
        while tasks.join_next().await.is_some() {}
    }
}

/// Runs cleaning passes until the broker is gone.
pub(super) async fn run(broker: Weak<Broker>) {
    loop {
        let Some(b) = broker.upgrade() else { return };
        if !b.config.log_cleaner_enable {
            return;
        }
        let backoff = Duration::from_millis(b.config.log_cleaner_backoff_ms);
        if b.is_ready() && !b.is_shutting_down() {
            b.clean_logs().await;
        }
        drop(b);
        tokio::time::sleep(backoff).await;
    }
}
