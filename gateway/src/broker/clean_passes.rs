//! Cleaning passes on every replica: the primary of a range records each
//! pass it decides (`CleanSegments`, see `cleaner.rs`), and every broker
//! holding copies of the range's segments applies the range's last pass to
//! them — the same pass over the same bytes gives the same bytes — then
//! checks each copy against the image's size and CRC-32C. A copy that does
//! not match (it missed a pass while down, a crash mid-pass left it
//! different, retention removed a segment of the pass first) is fetched
//! again from a replica at the image's pass (repair reads name the pass).
//!
//! `cleaner-pass` in the range directory is the last pass applied here.
//! A copy is at the image's pass for it once that file reaches it; until
//! then `apply_seals` leaves it alone and repair reads from it are refused.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use tessera_log::clean_pass;
use tessera_log::cleaner::CleanParams;
use tessera_metadata::{MetadataImage, RangeId, SegmentId, SegmentImage};

use super::replicas::key;
use super::Broker;
use crate::metrics::Metrics;

fn applied_path(dir: &Path) -> PathBuf {
    dir.join("cleaner-pass")
}

/// The last cleaning pass applied to the copies in `dir` (0: none).
pub(super) fn applied_pass(dir: &Path) -> u64 {
    std::fs::read_to_string(applied_path(dir))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

pub(super) fn set_applied_pass(dir: &Path, pass: u64) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    tessera_fs::write_atomic(&applied_path(dir), format!("{pass}\n").as_bytes())
}

impl Broker {
    /// The cleaning pass this broker's copy of `id` is at, when it is the
    /// image's: every pass of the range up to the segment's was applied
    /// here and none runs now.
    pub(crate) fn copy_clean_pass(&self, image: &MetadataImage, id: SegmentId) -> Option<u64> {
        let seg = image.segments.get(&id)?;
        let dir = self.range_dir_of(image, id.range)?;
        if self.replicas.cleaning.lock().contains(&id.range) {
            return None;
        }
        let pass = seg.clean_pass();
        (applied_pass(&dir) >= pass).then_some(pass)
    }

    /// A pass of the image rewrote `seg` that this broker has not applied
    /// to its copy yet: its size is not the image's until it has.
    pub(super) fn clean_pass_pending(&self, dir: &Path, seg: &SegmentImage) -> bool {
        seg.clean_pass() > applied_pass(dir)
    }

    /// Starts applying the image's last cleaning pass to each range whose
    /// copies here are behind it.
    pub(super) fn catch_up_clean_passes(&self, image: &MetadataImage) {
        let me = self.config.node_id;
        for range in image.ranges.values() {
            let Some(last) = &range.last_clean else {
                continue;
            };
            let Some(dir) = self.range_dir_of(image, range.id) else {
                continue;
            };
            let holds_some = image
                .segments_of(range.id)
                .iter()
                .any(|s| s.is_sealed() && s.replicas.contains(&me));
            if !holds_some || applied_pass(&dir) >= last.pass {
                continue;
            }
            if self.replicas.cleaning.lock().insert(range.id) {
                tokio::spawn(apply_task(self.weak(), range.id));
            }
        }
    }

    /// Applies the range's last pass to this broker's copies (blocking I/O).
    fn apply_clean_pass(&self, range: RangeId) -> anyhow::Result<()> {
        let image = self.image();
        let me = self.config.node_id;
        let Some(pass) = image.ranges.get(&range).and_then(|r| r.last_clean.clone()) else {
            return Ok(());
        };
        let Some(dir) = self.range_dir_of(&image, range) else {
            return Ok(());
        };
        let applied = applied_pass(&dir);
        if applied >= pass.pass {
            return Ok(());
        }
        let segments = image.segments_of(range);
        let mine: Vec<&Arc<SegmentImage>> = segments
            .iter()
            .filter(|s| s.is_sealed() && s.replicas.contains(&me))
            .collect();
        let in_pass: Vec<u32> = pass.segments.iter().map(|c| c.seq).collect();
        if mine
            .iter()
            .any(|s| in_pass.contains(&s.id.seq) && self.replicas.repairing.lock().contains(&s.id))
        {
            return Ok(()); // a copy of the pass is being repaired: later
        }
        let log = self.log_of(range);
        if log.is_none() {
            // Copies of a pass that a crash cut short (a log's open does this).
            clean_pass::remove_stray_copies(&dir).ok();
        }
        let local_size = |seq: u32| match &log {
            Some(l) => l.sealed_size(seq),
            None => std::fs::metadata(tessera_log::segment::log_path(&dir, seq))
                .ok()
                .map(|m| m.len()),
        };
        // Every segment of the pass here, as the pass found it on the
        // primary (or as it left it: a restart after swapping some), with
        // no pass missed before it: apply it. Otherwise check and refetch.
        let runnable = applied + 1 == pass.pass
            && !pass.segments.is_empty()
            && pass.segments.iter().all(|c| {
                let size = local_size(c.seq);
                mine.iter().any(|s| s.id.seq == c.seq)
                    && (size == Some(c.size_before) || size == Some(c.size_after))
            });
        let mut matched: Vec<u32> = Vec::new();
        if runnable {
            let params = CleanParams {
                now_ms: pass.now_ms,
                delete_retention_ms: pass.delete_retention_ms,
            };
            let mut pace = |n| Metrics::add(&self.metrics.cleaner_io_bytes, n);
            let done = match &log {
                Some(l) => {
                    let prepared = l.prepare_pass(&in_pass, params, &mut pace)?;
                    l.swap_prepared(&prepared)?;
                    prepared
                }
                None => {
                    let prepared = clean_pass::clean_files(&dir, &in_pass, params, &mut pace)?;
                    for seq in &in_pass {
                        let id = SegmentId::new(range, *seq);
                        self.replicas.store.forget(key(id));
                        self.replicas.read_copies.lock().remove(&id);
                    }
                    prepared
                }
            };
            for (got, want) in done.copies.iter().zip(&pass.segments) {
                if (got.seq, got.size_after, got.crc32c) == (want.seq, want.size_after, want.crc32c)
                {
                    matched.push(got.seq);
                }
            }
            tracing::info!(
                range,
                pass = pass.pass,
                segments = in_pass.len(),
                matched = matched.len(),
                bytes_before = done.copies.iter().map(|c| c.size_before).sum::<u64>(),
                bytes_after = done.copies.iter().map(|c| c.size_after).sum::<u64>(),
                "log cleaner: applied the primary's pass to this broker's copies"
            );
        }
        // Every copy here that a pass this broker did not apply (or applied
        // with another outcome) rewrote must hold the image's bytes.
        for s in mine {
            if s.clean_pass() <= applied || matched.contains(&s.id.seq) {
                continue;
            }
            let (Some(seal), Some(cleaned)) =
                (&s.sealed, s.sealed.as_ref().and_then(|x| x.cleaned))
            else {
                continue;
            };
            let path = tessera_log::segment::log_path(&dir, s.id.seq);
            let digest = clean_pass::file_digest(&path).ok();
            if digest == Some((seal.size_bytes, cleaned.crc32c)) {
                continue;
            }
            self.refetch_copy(&dir, s, log.is_some())?;
        }
        set_applied_pass(&dir, pass.pass)?;
        Ok(())
    }

    /// Drops a copy that is not at the image's cleaning pass, so that
    /// `apply_seals` fetches it again from a replica that is.
    pub(super) fn refetch_copy(
        &self,
        dir: &Path,
        seg: &SegmentImage,
        in_log: bool,
    ) -> anyhow::Result<()> {
        if in_log {
            // The primary's own history: it keeps serving it (every batch in
            // it is valid data) and its next pass records what it holds.
            tracing::warn!(segment = %seg.id, "this log's segment is not the image's cleaned copy; left as it is");
            return Ok(());
        }
        self.replicas.store.discard(key(seg.id), dir)?;
        // An empty copy in its place, not no file: without one,
        // `apply_seals` reads a segment this broker once led as "our own
        // roll, in a log since deleted" and never fetches it, and a log
        // opened here would lead with that hole in its history.
        self.replicas.store.copy(key(seg.id), dir)?;
        self.replicas.sealed_copies.lock().remove(&seg.id);
        self.replicas.read_copies.lock().remove(&seg.id);
        tracing::info!(segment = %seg.id, pass = seg.clean_pass(), "copy is not at the image's cleaning pass: fetching it again");
        Ok(())
    }
}

/// Applies a range's pending pass, then reconciles again (seals and
/// repairs wait for it; a log may open now).
async fn apply_task(broker: Weak<Broker>, range: RangeId) {
    let Some(b) = broker.upgrade() else { return };
    let worker = b.clone();
    let done = tokio::task::spawn_blocking(move || worker.apply_clean_pass(range)).await;
    b.replicas.cleaning.lock().remove(&range);
    match done {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(range, error = %format!("{e:#}"), "log cleaner: applying a pass failed; retrying later")
        }
        Err(e) => tracing::warn!(range, error = %e, "log cleaner: applying a pass panicked"),
    }
    if let Err(e) = b.reconcile().await {
        tracing::debug!(error = %format!("{e:#}"), "reconcile after a cleaning pass failed");
    }
}
