//! A follower's copies of segments (I/O): the files the primary's stream
//! writes, fsynced, fenced and sealed under the rules of
//! [`FollowerSegment`].
//!
//! A copy lives where the primary keeps the same segment — the range's
//! directory, `<seq>.log` — so a follower that becomes primary opens the
//! range log on the copies it already holds. A fence is persisted as a
//! `<seq>.fenced` marker, so a fenced copy refuses appends after a restart too.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use tessera_log::segment::{self, Segment};
use tessera_log::LogError;

use crate::follower::{FollowerSegment, Offer, SealAction};
use crate::protocol::SegmentKey;

/// `(partition, first offset, end offset exclusive)` of a copy's data.
pub type Span = (u32, i64, i64);

/// Where a copy file set aside by [`ReplicaStore::set_aside`] is kept.
fn replaced(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".replaced");
    PathBuf::from(name)
}

fn fenced_path(dir: &Path, seq: u32) -> PathBuf {
    dir.join(format!("{seq:010}.fenced"))
}

/// One follower copy of one segment.
pub struct ReplicaCopy {
    pub key: SegmentKey,
    dir: PathBuf,
    segment: Segment,
    state: FollowerSegment,
    /// An fsync of this copy failed: the kernel may have dropped pages
    /// written before it, so nothing more is accepted or acknowledged
    /// until a restart recovers the copy from disk (Kafka takes the log dir
    /// offline).
    failed: bool,
}

impl ReplicaCopy {
    /// Opens the copy in `dir` (recovering a torn tail) or creates it.
    pub fn open(dir: &Path, key: SegmentKey) -> Result<ReplicaCopy, LogError> {
        std::fs::create_dir_all(dir)?;
        let now = tessera_log::now_ms();
        let segment = if segment::log_path(dir, key.seq).exists() {
            Segment::open(dir, key.seq, false, now)?
        } else {
            let s = Segment::create(dir, key.seq, now)?;
            tessera_fs::sync_dir(dir)?;
            s
        };
        let fenced = fenced_path(dir, key.seq).exists();
        Ok(ReplicaCopy {
            key,
            dir: dir.to_path_buf(),
            state: FollowerSegment::recovered(segment.size, fenced, None),
            segment,
            failed: false,
        })
    }

    pub fn state(&self) -> FollowerSegment {
        self.state
    }

    /// Offers frames at `position`; writes them (page cache) if accepted.
    pub fn append(&mut self, position: u64, frames: &[u8]) -> Result<Offer, LogError> {
        if self.failed {
            return Err(LogError::StorageFailed);
        }
        let offer = self.state.offer(position, frames.len() as u64);
        if offer == Offer::Accept {
            self.segment.append_frames(frames)?;
            self.state.wrote(frames.len() as u64);
        }
        Ok(offer)
    }

    /// The file to fsync and the position that covers.
    pub fn sync_target(&self) -> (Arc<std::fs::File>, u64) {
        (self.segment.file.clone(), self.state.written)
    }

    pub fn synced(&mut self, position: u64) {
        if !self.failed {
            self.state.synced(position);
        }
    }

    /// An fsync of the copy failed (see `failed`).
    pub fn fail(&mut self) {
        self.failed = true;
    }

    pub fn is_failed(&self) -> bool {
        self.failed
    }

    /// Fences the copy durably and reports its end and spans.
    pub fn fence(&mut self) -> Result<(u64, Vec<Span>), LogError> {
        self.segment.file.sync_data()?;
        tessera_fs::write_atomic(&fenced_path(&self.dir, self.key.seq), b"")?;
        let end = self.state.fence();
        Ok((end, self.segment.index.spans()))
    }

    /// Applies the committed seal: truncate a long copy, report a short one
    /// (the caller repairs it), and make a complete one durable and indexed.
    pub fn seal(&mut self, size: u64) -> Result<SealAction, LogError> {
        if !fenced_path(&self.dir, self.key.seq).exists() {
            tessera_fs::write_atomic(&fenced_path(&self.dir, self.key.seq), b"")?;
        }
        let action = self.state.seal(size);
        match action {
            SealAction::Truncate { size } => {
                self.segment.truncate(size)?;
                self.finish_seal()?;
            }
            SealAction::Complete => self.finish_seal()?,
            SealAction::Repair { .. } => {}
        }
        Ok(action)
    }

    /// Writes repaired frames at `position` (a sealed copy takes only these).
    pub fn repair(&mut self, position: u64, frames: &[u8]) -> Result<bool, LogError> {
        if position != self.state.written {
            return Ok(false);
        }
        let cap = self.state.sealed_size.unwrap_or(u64::MAX);
        if position + frames.len() as u64 > cap {
            return Ok(false);
        }
        self.segment.append_frames(frames)?;
        self.state.repaired(position + frames.len() as u64);
        if Some(self.state.written) == self.state.sealed_size {
            self.finish_seal()?;
        }
        Ok(true)
    }

    /// A complete sealed copy: fsynced, indexed, read-only.
    fn finish_seal(&mut self) -> Result<(), LogError> {
        self.segment.file.sync_data()?;
        self.segment.write_index(&self.dir)?;
        self.segment.sealed = true;
        self.state.synced(self.state.written);
        Ok(())
    }

    /// Whole frames of the copy from `from`, about `max` bytes.
    pub fn read(&self, from: u64, max: usize) -> Result<Bytes, LogError> {
        let size = self.state.written;
        if from >= size {
            return Ok(Bytes::new());
        }
        segment::read_frames(&self.segment.file, from, size, max)
    }
}

/// Every follower copy this broker holds open.
#[derive(Default)]
pub struct ReplicaStore {
    copies: Mutex<HashMap<SegmentKey, Arc<Mutex<ReplicaCopy>>>>,
    /// Held while a copy is opened (its file created) and while the files
    /// of a segment without an open copy are removed
    /// ([`ReplicaStore::unless_open`]), so that neither removes a copy the
    /// other has just made.
    opening: Mutex<()>,
}

impl ReplicaStore {
    /// The open copy of `key`, opening it in `dir` first if needed.
    pub fn copy(&self, key: SegmentKey, dir: &Path) -> Result<Arc<Mutex<ReplicaCopy>>, LogError> {
        if let Some(c) = self.copies.lock().get(&key) {
            return Ok(c.clone());
        }
        let _opening = self.opening.lock();
        if let Some(c) = self.copies.lock().get(&key) {
            return Ok(c.clone());
        }
        let copy = Arc::new(Mutex::new(ReplicaCopy::open(dir, key)?));
        Ok(self.copies.lock().entry(key).or_insert(copy).clone())
    }

    /// Runs `remove` (a removal of `key`'s files) unless a copy of `key` is
    /// open: a stream that accepted the segment (its broker's image names
    /// it) writes and acknowledges into that copy, and a file removed
    /// under it would take acknowledged bytes along. `None` when open.
    pub fn unless_open<T>(&self, key: SegmentKey, remove: impl FnOnce() -> T) -> Option<T> {
        let _opening = self.opening.lock();
        if self.copies.lock().contains_key(&key) {
            return None;
        }
        Some(remove())
    }

    pub fn get(&self, key: SegmentKey) -> Option<Arc<Mutex<ReplicaCopy>>> {
        self.copies.lock().get(&key).cloned()
    }

    /// Deletes this broker's copy of `key` in `dir` (the segment's replica
    /// set no longer lists this broker: healing replaced it). Returns true
    /// when there was a file.
    pub fn discard(&self, key: SegmentKey, dir: &Path) -> Result<bool, LogError> {
        self.copies.lock().remove(&key);
        let log = segment::log_path(dir, key.seq);
        let existed = log.exists();
        for path in [
            log,
            segment::index_path(dir, key.seq),
            fenced_path(dir, key.seq),
        ] {
            tessera_fs::remove_if_exists(&path)?;
        }
        if existed {
            tessera_fs::sync_dir(dir)?;
        }
        Ok(existed)
    }

    /// Moves this broker's copy of `key` in `dir` aside (`.log.replaced`,
    /// `.idx.replaced`): the segment's replica set no longer lists this
    /// broker, so nothing may open it as the segment (a range log opened
    /// here later lists `.log` files only), yet it is kept until the listed
    /// replicas hold the segment. Returns true when there was a copy.
    pub fn set_aside(&self, key: SegmentKey, dir: &Path) -> Result<bool, LogError> {
        self.copies.lock().remove(&key);
        let log = segment::log_path(dir, key.seq);
        if !log.exists() {
            return Ok(false);
        }
        let index = segment::index_path(dir, key.seq);
        if index.exists() {
            std::fs::rename(&index, replaced(&index))?;
        }
        std::fs::rename(&log, replaced(&log))?;
        tessera_fs::remove_if_exists(&fenced_path(dir, key.seq))?;
        tessera_fs::sync_dir(dir)?;
        Ok(true)
    }

    /// Whether a copy of `key` set aside in `dir` is there.
    pub fn has_set_aside(key: SegmentKey, dir: &Path) -> bool {
        Self::set_aside_path(key, dir).exists()
    }

    /// Where the copy of `key` set aside in `dir` is.
    pub fn set_aside_path(key: SegmentKey, dir: &Path) -> PathBuf {
        replaced(&segment::log_path(dir, key.seq))
    }

    /// Puts a copy set aside back (the replica set lists this broker
    /// again): the seal is then applied to it like to any copy.
    pub fn restore(&self, key: SegmentKey, dir: &Path) -> Result<bool, LogError> {
        let log = segment::log_path(dir, key.seq);
        if log.exists() || !replaced(&log).exists() {
            return Ok(false);
        }
        let index = segment::index_path(dir, key.seq);
        if replaced(&index).exists() {
            std::fs::rename(replaced(&index), &index)?;
        }
        std::fs::rename(replaced(&log), &log)?;
        tessera_fs::sync_dir(dir)?;
        Ok(true)
    }

    /// Deletes a copy of `key` set aside in `dir`. Returns true when there
    /// was one.
    pub fn discard_set_aside(key: SegmentKey, dir: &Path) -> Result<bool, LogError> {
        let log = replaced(&segment::log_path(dir, key.seq));
        let existed = log.exists();
        tessera_fs::remove_if_exists(&replaced(&segment::index_path(dir, key.seq)))?;
        tessera_fs::remove_if_exists(&log)?;
        if existed {
            tessera_fs::sync_dir(dir)?;
        }
        Ok(existed)
    }

    /// Drops the open handle of `key` (its file was replaced by a cleaning
    /// pass: the next access reopens it).
    pub fn forget(&self, key: SegmentKey) {
        self.copies.lock().remove(&key);
    }

    /// Closes the copies of `range` (its logs are deleted or opened as a
    /// primary's range log now).
    pub fn close_range(&self, range: u64) {
        self.copies.lock().retain(|k, _| k.range != range);
    }

    /// Closes the copies of every range `keep` refuses: ranges gone from
    /// the image, a deleted topic's, whose files went with its directory.
    /// Left open, such a copy held its deleted file and, while range ids
    /// could be handed out again, was the copy a new range of the same id
    /// was given (its followers refused every frame).
    pub fn close_ranges_except(&self, keep: impl Fn(u64) -> bool) {
        self.copies.lock().retain(|k, _| keep(k.range));
    }

    /// How many copies are open.
    pub fn open_copies(&self) -> usize {
        self.copies.lock().len()
    }
}
