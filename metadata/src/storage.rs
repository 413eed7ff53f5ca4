//! Durable storage of the metadata quorum: the raft log store and the state
//! machine (the image plus its snapshots), both under the controller's
//! data directory.
//!
//! Layout of `dir`:
//! - `vote.json`: the raft vote (fsynced: a forgotten vote breaks safety).
//! - `committed.json`: last committed log id. Only a hint for replaying the
//!   tail on restart, so it is replaced atomically but not fsynced; an older
//!   value is always safe, and the new term's leader commits the rest.
//! - `purged.json`: last purged log id (fsynced before files are deleted).
//! - `log/<first index>.log`: append-only log files; each entry is framed
//!   as `u32 BE length, u32 BE crc32c, payload`, fsynced before openraft
//!   hears the append is durable. A torn or corrupt frame at the end of the
//!   newest file is a write that was never acknowledged and is cut off on
//!   open; damage anywhere else is reported, not repaired.
//! - `snapshot`: the newest snapshot (see [`encode_snapshot`]), replaced
//!   via temp file + fsync + rename.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Cursor, Write};
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::{LogFlushed, RaftLogStorage, RaftStateMachine};
use openraft::{
    AnyError, BasicNode, CommittedLeaderId, Entry, EntryPayload, LogId, LogState, Membership,
    OptionalSend, RaftLogReader, RaftSnapshotBuilder, Snapshot, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership, Vote,
};
use parking_lot::{Mutex, RwLock};
use tokio::sync::watch;

use crate::controller::{ApplyResponse, MetadataBatch, TypeConfig};
use crate::error::{MetadataError, MetadataReplayError};
use crate::image::MetadataImage;
use crate::records::MetadataRecord;
use crate::replay::decode_committed_value;

type NodeId = u64;
type Ent = Entry<TypeConfig>;
type StoErr = StorageError<NodeId>;

/// A new log file is started once the current one reaches this size, so
/// purged entries can be reclaimed by deleting whole files.
const LOG_FILE_ROLL_BYTES: u64 = 4 << 20;
const FRAME_HEADER: usize = 8;
const SNAPSHOT_MAGIC: &[u8; 4] = b"TSMS";
const SNAPSHOT_FORMAT_VERSION: u16 = 0;

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> MetadataError {
    let context = context.into();
    move |e| MetadataError::io(context, e)
}

fn sto_write(e: impl std::fmt::Display) -> StoErr {
    StorageIOError::write_logs(AnyError::error(e.to_string())).into()
}

pub(crate) fn fsync_dir(dir: &Path) -> Result<(), MetadataError> {
    tessera_fs::sync_dir(dir).map_err(io_err(format!("fsync directory {}", dir.display())))
}

/// Replaces `dir/name` with `bytes` atomically (temp file + rename). With
/// `durable`, the data and the rename are fsynced before returning (the
/// shared `tessera_fs::write_atomic`); without, only the replacement is
/// atomic (for hints such as the committed index, which may lag after a crash).
pub(crate) fn write_atomic(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    durable: bool,
) -> Result<(), MetadataError> {
    let dst = dir.join(name);
    let ctx = format!("write {}", dst.display());
    if durable {
        return tessera_fs::write_atomic(&dst, bytes).map_err(io_err(ctx));
    }
    let tmp = tessera_fs::temp_path(&dst);
    let mut f = File::create(&tmp).map_err(io_err(ctx.clone()))?;
    f.write_all(bytes).map_err(io_err(ctx.clone()))?;
    drop(f);
    fs::rename(&tmp, &dst).map_err(io_err(ctx))
}

fn read_optional(path: &Path) -> Result<Option<Vec<u8>>, MetadataError> {
    match fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(MetadataError::io(format!("read {}", path.display()), e)),
    }
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>, MetadataError> {
    match read_optional(path)? {
        None => Ok(None),
        Some(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| MetadataError::Corrupt(format!("{}: {e}", path.display()))),
    }
}

// ---------------------------------------------------------------------------
// Log entry envelope

/// Encodes a raft entry for the log file: `u64 term, u64 leader node,
/// u64 index, u8 kind`, then for a normal entry `u32 count` of
/// `u32 length + record bytes` (the records keep their own codec), for a
/// membership entry its JSON.
pub(crate) fn encode_entry(e: &Ent) -> Vec<u8> {
    let mut b = Vec::with_capacity(64);
    b.extend_from_slice(&e.log_id.leader_id.term.to_be_bytes());
    b.extend_from_slice(&e.log_id.leader_id.node_id.to_be_bytes());
    b.extend_from_slice(&e.log_id.index.to_be_bytes());
    match &e.payload {
        EntryPayload::Blank => b.push(0),
        EntryPayload::Normal(batch) => {
            b.push(1);
            b.extend_from_slice(&(batch.records.len() as u32).to_be_bytes());
            for r in &batch.records {
                b.extend_from_slice(&(r.len() as u32).to_be_bytes());
                b.extend_from_slice(r);
            }
        }
        EntryPayload::Membership(m) => {
            b.push(2);
            b.extend_from_slice(&serde_json::to_vec(m).expect("membership serializes"));
        }
    }
    b
}

pub(crate) fn decode_entry(b: &[u8]) -> Result<Ent, String> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
        if b.len() < n {
            return Err("truncated entry".into());
        }
        let (h, t) = b.split_at(n);
        *b = t;
        Ok(h)
    }
    fn u64_(b: &mut &[u8]) -> Result<u64, String> {
        Ok(u64::from_be_bytes(take(b, 8)?.try_into().unwrap()))
    }
    fn u32_(b: &mut &[u8]) -> Result<u32, String> {
        Ok(u32::from_be_bytes(take(b, 4)?.try_into().unwrap()))
    }
    let mut b = b;
    let term = u64_(&mut b)?;
    let node = u64_(&mut b)?;
    let index = u64_(&mut b)?;
    let log_id = LogId::new(CommittedLeaderId::new(term, node), index);
    let kind = take(&mut b, 1)?[0];
    let payload = match kind {
        0 => EntryPayload::Blank,
        1 => {
            let n = u32_(&mut b)? as usize;
            if n.saturating_mul(4) > b.len() {
                return Err("record count beyond entry".into());
            }
            let mut records = Vec::with_capacity(n);
            for _ in 0..n {
                let len = u32_(&mut b)? as usize;
                records.push(take(&mut b, len)?.to_vec());
            }
            EntryPayload::Normal(MetadataBatch { records })
        }
        2 => {
            let m: Membership<NodeId, BasicNode> =
                serde_json::from_slice(b).map_err(|e| e.to_string())?;
            b = &[];
            EntryPayload::Membership(m)
        }
        k => return Err(format!("unknown entry kind {k}")),
    };
    if !b.is_empty() {
        return Err("trailing bytes in entry".into());
    }
    Ok(Entry { log_id, payload })
}

fn frame(payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(FRAME_HEADER + payload.len());
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    f.extend_from_slice(&crc32c::crc32c(payload).to_be_bytes());
    f.extend_from_slice(payload);
    f
}

// ---------------------------------------------------------------------------
// Log store

/// Entries not yet purged, kept in memory: the metadata log is small and is
/// purged after every snapshot, and readers (replication, re-apply) then
/// never touch the disk.
type SharedEntries = Arc<RwLock<BTreeMap<u64, Ent>>>;

struct LogFile {
    path: PathBuf,
    size: u64,
}

pub(crate) struct LogStore {
    /// A handle on the controller's `LOCK` file: the directory stays locked
    /// while the raft core (which owns this store) runs, even if the
    /// `Controller` was dropped without `shutdown`.
    _dir_lock: File,
    root: PathBuf,
    log_dir: PathBuf,
    entries: SharedEntries,
    /// Where each un-purged entry starts: (file first index, byte position).
    positions: BTreeMap<u64, (u64, u64)>,
    /// Log files by the index of their first entry.
    files: BTreeMap<u64, LogFile>,
    /// Append handle of the newest file, opened lazily.
    active: Option<File>,
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId<NodeId>>,
    purged: Option<LogId<NodeId>>,
}

#[derive(Clone)]
pub(crate) struct LogReader {
    entries: SharedEntries,
}

fn read_range(entries: &SharedEntries, range: impl RangeBounds<u64>) -> Vec<Ent> {
    // BTreeMap::range panics on an inverted range; openraft may ask for an
    // empty one.
    let start = match range.start_bound() {
        Bound::Included(s) => *s,
        Bound::Excluded(s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(e) => e.saturating_add(1),
        Bound::Excluded(e) => *e,
        Bound::Unbounded => u64::MAX,
    };
    if start >= end {
        return Vec::new();
    }
    entries
        .read()
        .range(start..end)
        .map(|(_, e)| e.clone())
        .collect()
}

impl RaftLogReader<TypeConfig> for LogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + std::fmt::Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Ent>, StoErr> {
        Ok(read_range(&self.entries, range))
    }
}

impl LogStore {
    pub(crate) fn open(root: &Path, dir_lock: File) -> Result<LogStore, MetadataError> {
        let log_dir = root.join("log");
        fs::create_dir_all(&log_dir).map_err(io_err(format!("create {}", log_dir.display())))?;
        let vote = read_json(&root.join("vote.json"))?;
        let purged: Option<LogId<NodeId>> = read_json(&root.join("purged.json"))?;
        // A damaged committed hint is dropped, not fatal: see module docs.
        let committed = read_json(&root.join("committed.json")).unwrap_or_else(|e| {
            tracing::warn!("ignoring unreadable committed index: {e}");
            None
        });

        let mut files = BTreeMap::new();
        for de in fs::read_dir(&log_dir).map_err(io_err(format!("list {}", log_dir.display())))? {
            let de = de.map_err(io_err(format!("list {}", log_dir.display())))?;
            let name = de.file_name().to_string_lossy().into_owned();
            if let Some(base) = name
                .strip_suffix(".log")
                .and_then(|s| s.parse::<u64>().ok())
            {
                files.insert(
                    base,
                    LogFile {
                        path: de.path(),
                        size: 0,
                    },
                );
            }
        }

        let mut store = LogStore {
            _dir_lock: dir_lock,
            root: root.to_path_buf(),
            log_dir,
            entries: Arc::new(RwLock::new(BTreeMap::new())),
            positions: BTreeMap::new(),
            files: BTreeMap::new(),
            active: None,
            vote,
            committed,
            purged,
        };
        let purged_upto = store.purged.as_ref().map(|p| p.index);
        let last_base = files.keys().next_back().copied();
        let mut entries = BTreeMap::new();
        for (base, mut file) in files {
            let data =
                fs::read(&file.path).map_err(io_err(format!("read {}", file.path.display())))?;
            let mut pos = 0usize;
            let torn = loop {
                if pos == data.len() {
                    break None;
                }
                if data.len() - pos < FRAME_HEADER {
                    break Some("truncated frame header");
                }
                let len = u32::from_be_bytes(data[pos..pos + 4].try_into().unwrap()) as usize;
                let crc = u32::from_be_bytes(data[pos + 4..pos + 8].try_into().unwrap());
                if data.len() - pos - FRAME_HEADER < len {
                    break Some("truncated frame");
                }
                let payload = &data[pos + FRAME_HEADER..pos + FRAME_HEADER + len];
                if crc32c::crc32c(payload) != crc {
                    break Some("frame checksum mismatch");
                }
                let entry = decode_entry(payload).map_err(|e| {
                    MetadataError::Corrupt(format!("{} at {pos}: {e}", file.path.display()))
                })?;
                let index = entry.log_id.index;
                if purged_upto.is_none_or(|p| index > p) {
                    let expected = match entries.keys().next_back() {
                        Some(last) => Some(last + 1),
                        None => purged_upto.map(|p| p + 1),
                    };
                    if expected.is_some_and(|x| x != index) {
                        return Err(MetadataError::Corrupt(format!(
                            "{}: log index {index} where {} was expected",
                            file.path.display(),
                            expected.unwrap()
                        )));
                    }
                    store.positions.insert(index, (base, pos as u64));
                    entries.insert(index, entry);
                }
                pos += FRAME_HEADER + len;
            };
            if let Some(why) = torn {
                if Some(base) != last_base {
                    return Err(MetadataError::Corrupt(format!(
                        "{}: {why} at byte {pos} of a file that is not the newest",
                        file.path.display()
                    )));
                }
                tracing::warn!(
                    file = %file.path.display(),
                    at = pos,
                    "truncating torn tail of the metadata log ({why})"
                );
                let f = OpenOptions::new()
                    .write(true)
                    .open(&file.path)
                    .map_err(io_err(format!("open {}", file.path.display())))?;
                f.set_len(pos as u64)
                    .and_then(|_| f.sync_all())
                    .map_err(io_err(format!("truncate {}", file.path.display())))?;
            }
            file.size = pos as u64;
            store.files.insert(base, file);
        }
        *store.entries.write() = entries;
        Ok(store)
    }

    fn last_index(&self) -> Option<u64> {
        self.entries.read().keys().next_back().copied()
    }

    /// Opens the file new entries go to, starting a new one at `index` when
    /// there is none or the newest is full.
    fn active_file(&mut self, index: u64) -> Result<u64, MetadataError> {
        if let Some((&base, f)) = self.files.iter().next_back() {
            if f.size < LOG_FILE_ROLL_BYTES {
                if self.active.is_none() {
                    let file = OpenOptions::new()
                        .append(true)
                        .open(&f.path)
                        .map_err(io_err(format!("open {}", f.path.display())))?;
                    self.active = Some(file);
                }
                return Ok(base);
            }
        }
        let path = self.log_dir.join(format!("{index:020}.log"));
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&path)
            .map_err(io_err(format!("create {}", path.display())))?;
        fsync_dir(&self.log_dir)?;
        self.files.insert(index, LogFile { path, size: 0 });
        self.active = Some(file);
        Ok(index)
    }

    fn append_durable(&mut self, entries: Vec<Ent>) -> Result<(), MetadataError> {
        let mut pending: Vec<u8> = Vec::new();
        let mut base = None;
        for e in entries {
            let index = e.log_id.index;
            let expected = match self.last_index() {
                Some(last) => Some(last + 1),
                None => self.purged.as_ref().map(|p| p.index + 1),
            };
            if expected.is_some_and(|x| x != index) {
                return Err(MetadataError::Corrupt(format!(
                    "append of index {index} would leave a hole (expected {})",
                    expected.unwrap()
                )));
            }
            let f = frame(&encode_entry(&e));
            let cur = match base {
                Some(b) if self.files[&b].size + (pending.len() as u64) < LOG_FILE_ROLL_BYTES => b,
                _ => {
                    self.flush_pending(base, &mut pending)?;
                    let b = self.active_file(index)?;
                    base = Some(b);
                    b
                }
            };
            let pos = self.files[&cur].size + pending.len() as u64;
            pending.extend_from_slice(&f);
            self.positions.insert(index, (cur, pos));
            // Readable at once; durable below, before the callback.
            self.entries.write().insert(index, e);
        }
        self.flush_pending(base, &mut pending)?;
        if let Some(f) = &self.active {
            f.sync_data().map_err(io_err("fsync metadata log"))?;
        }
        Ok(())
    }

    fn flush_pending(
        &mut self,
        base: Option<u64>,
        pending: &mut Vec<u8>,
    ) -> Result<(), MetadataError> {
        let Some(base) = base else { return Ok(()) };
        if pending.is_empty() {
            return Ok(());
        }
        let file = self.active.as_mut().expect("active file open");
        file.write_all(pending)
            .map_err(io_err("write metadata log"))?;
        self.files.get_mut(&base).unwrap().size += pending.len() as u64;
        // A rolled-over file is complete: make it durable before moving on.
        file.sync_data().map_err(io_err("fsync metadata log"))?;
        pending.clear();
        Ok(())
    }

    fn truncate_from(&mut self, index: u64) -> Result<(), MetadataError> {
        self.active = None;
        self.entries.write().retain(|i, _| *i < index);
        let cut = self.positions.range(index..).next().map(|(_, p)| *p);
        self.positions.retain(|i, _| *i < index);
        let doomed: Vec<u64> = self.files.range(index..).map(|(b, _)| *b).collect();
        for b in doomed {
            let f = self.files.remove(&b).unwrap();
            fs::remove_file(&f.path).map_err(io_err(format!("remove {}", f.path.display())))?;
        }
        if let Some((base, pos)) = cut {
            if let Some(f) = self.files.get_mut(&base) {
                let file = OpenOptions::new()
                    .write(true)
                    .open(&f.path)
                    .map_err(io_err(format!("open {}", f.path.display())))?;
                file.set_len(pos)
                    .and_then(|_| file.sync_all())
                    .map_err(io_err(format!("truncate {}", f.path.display())))?;
                f.size = pos;
            }
        }
        fsync_dir(&self.log_dir)
    }

    fn purge_upto(&mut self, log_id: LogId<NodeId>) -> Result<(), MetadataError> {
        let index = log_id.index;
        // Record the purge point first: after a crash the remaining files
        // may still hold purged entries, which open() then ignores.
        write_atomic(
            &self.root,
            "purged.json",
            &serde_json::to_vec(&log_id).expect("log id serializes"),
            true,
        )?;
        self.purged = Some(log_id);
        self.entries.write().retain(|i, _| *i > index);
        self.positions.retain(|i, _| *i > index);
        // A file can go when every entry it holds is purged: the next file
        // starts at or below index + 1, or (the newest) nothing is left.
        let bases: Vec<u64> = self.files.keys().copied().collect();
        let mut removed = false;
        for (i, b) in bases.iter().enumerate() {
            let fully_purged = match bases.get(i + 1) {
                Some(next) => *next <= index + 1,
                None => !self.positions.values().any(|(fb, _)| fb == b),
            };
            if fully_purged {
                if i + 1 == bases.len() {
                    self.active = None;
                }
                let f = self.files.remove(b).unwrap();
                fs::remove_file(&f.path).map_err(io_err(format!("remove {}", f.path.display())))?;
                removed = true;
            }
        }
        if removed {
            fsync_dir(&self.log_dir)?;
        }
        Ok(())
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + std::fmt::Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Ent>, StoErr> {
        Ok(read_range(&self.entries, range))
    }
}

// File I/O here is synchronous: the metadata log is small and written
// rarely, and openraft serializes log I/O anyway. The fsync happens before
// the flush callback, so openraft never counts a write that is not durable.
impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StoErr> {
        let last = self.entries.read().values().next_back().map(|e| e.log_id);
        Ok(LogState {
            last_purged_log_id: self.purged,
            last_log_id: last.or(self.purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        LogReader {
            entries: self.entries.clone(),
        }
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StoErr> {
        let bytes =
            serde_json::to_vec(vote).map_err(|e| StorageIOError::write_vote(AnyError::new(&e)))?;
        write_atomic(&self.root, "vote.json", &bytes, true)
            .map_err(|e| StorageIOError::write_vote(AnyError::new(&e)))?;
        self.vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StoErr> {
        Ok(self.vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> Result<(), StoErr> {
        let bytes = serde_json::to_vec(&committed).map_err(sto_write)?;
        write_atomic(&self.root, "committed.json", &bytes, false).map_err(sto_write)?;
        self.committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StoErr> {
        Ok(self.committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StoErr>
    where
        I: IntoIterator<Item = Ent> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        match self.append_durable(entries.into_iter().collect()) {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                let msg = e.to_string();
                callback.log_io_completed(Err(std::io::Error::other(msg.clone())));
                Err(sto_write(msg))
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StoErr> {
        self.truncate_from(log_id.index).map_err(sto_write)
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StoErr> {
        self.purge_upto(log_id).map_err(sto_write)
    }
}

// ---------------------------------------------------------------------------
// Snapshots

#[derive(serde::Serialize, serde::Deserialize)]
struct SnapshotHeader {
    meta: SnapshotMeta<NodeId, BasicNode>,
    image_offset: i64,
}

/// Encodes a snapshot: `"TSMS"`, `u16 format version`, `u32 length` + JSON
/// header (raft meta and the image offset), `u32 count` of `u32 length` +
/// record bytes (the image's [`MetadataImage::to_records`] in our codec),
/// then a `u32 crc32c` of everything before it.
pub(crate) fn encode_snapshot(
    meta: &SnapshotMeta<NodeId, BasicNode>,
    image: &MetadataImage,
) -> Vec<u8> {
    let header = serde_json::to_vec(&SnapshotHeader {
        meta: meta.clone(),
        image_offset: image.offset,
    })
    .expect("snapshot header serializes");
    let records = image.to_records();
    let mut b = Vec::new();
    b.extend_from_slice(SNAPSHOT_MAGIC);
    b.extend_from_slice(&SNAPSHOT_FORMAT_VERSION.to_be_bytes());
    b.extend_from_slice(&(header.len() as u32).to_be_bytes());
    b.extend_from_slice(&header);
    b.extend_from_slice(&(records.len() as u32).to_be_bytes());
    for r in &records {
        let v = r.encode();
        b.extend_from_slice(&(v.len() as u32).to_be_bytes());
        b.extend_from_slice(&v);
    }
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_be_bytes());
    b
}

/// Decodes a snapshot, replaying its records through
/// [`decode_committed_value`] like every other replay path. A record the
/// image would skip means the snapshot does not match the image it was
/// taken from, which is reported as corruption rather than ignored.
pub(crate) fn decode_snapshot(
    data: &[u8],
) -> Result<(SnapshotMeta<NodeId, BasicNode>, MetadataImage), MetadataError> {
    let corrupt = |why: &str| MetadataError::Corrupt(format!("snapshot: {why}"));
    if data.len() < 4 + 2 + 4 + 4 + 4 || &data[..4] != SNAPSHOT_MAGIC {
        return Err(corrupt("bad magic or too short"));
    }
    let (body, crc) = data.split_at(data.len() - 4);
    if crc32c::crc32c(body) != u32::from_be_bytes(crc.try_into().unwrap()) {
        return Err(corrupt("checksum mismatch"));
    }
    let version = u16::from_be_bytes(body[4..6].try_into().unwrap());
    if version != SNAPSHOT_FORMAT_VERSION {
        return Err(corrupt(&format!("unknown format version {version}")));
    }
    let mut rest = &body[6..];
    let mut take = |n: usize| -> Result<&[u8], MetadataError> {
        if rest.len() < n {
            return Err(corrupt("truncated"));
        }
        let (h, t) = rest.split_at(n);
        rest = t;
        Ok(h)
    };
    let hlen = u32::from_be_bytes(take(4)?.try_into().unwrap()) as usize;
    let header: SnapshotHeader =
        serde_json::from_slice(take(hlen)?).map_err(|e| corrupt(&format!("header: {e}")))?;
    let count = u32::from_be_bytes(take(4)?.try_into().unwrap());
    let mut image = MetadataImage::default();
    let offset = header.image_offset;
    for i in 0..count {
        let len = u32::from_be_bytes(take(4)?.try_into().unwrap()) as usize;
        let value = take(len)?;
        match decode_committed_value(value, &image, offset)? {
            Some(rec) => image.apply(&rec, offset),
            None => {
                return Err(corrupt(&format!(
                    "record {i} does not apply to the image rebuilt before it"
                )))
            }
        }
    }
    if !rest.is_empty() {
        return Err(corrupt("trailing bytes"));
    }
    image.offset = offset;
    Ok((header.meta, image))
}

#[derive(Clone)]
pub(crate) struct StoredSnapshot {
    meta: SnapshotMeta<NodeId, BasicNode>,
    data: Arc<Vec<u8>>,
}

impl StoredSnapshot {
    fn to_snapshot(&self) -> Snapshot<TypeConfig> {
        Snapshot {
            meta: self.meta.clone(),
            snapshot: Box::new(Cursor::new(self.data.as_ref().clone())),
        }
    }
}

/// State shared between the state machine, its snapshot builders and the
/// controller.
pub(crate) struct Shared {
    pub(crate) dir: PathBuf,
    pub(crate) images: watch::Sender<Arc<MetadataImage>>,
    /// Set once replay met an undecodable record: the controller is stopped.
    pub(crate) failure: Mutex<Option<MetadataReplayError>>,
    /// The newest snapshot on disk. Its lock also serializes snapshot file
    /// writes, so an older build cannot replace a newer snapshot.
    current_snapshot: Mutex<Option<StoredSnapshot>>,
    /// Set (under `current_snapshot`) at shutdown: a snapshot build still
    /// running in its task must not write into a directory that the next
    /// controller may already own.
    closed: std::sync::atomic::AtomicBool,
}

impl Shared {
    pub(crate) fn new(dir: PathBuf) -> Arc<Shared> {
        let (images, _) = watch::channel(Arc::new(MetadataImage::default()));
        Arc::new(Shared {
            dir,
            images,
            failure: Mutex::new(None),
            current_snapshot: Mutex::new(None),
            closed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Waits for a snapshot write in flight and refuses later ones (used by
    /// shutdown).
    pub(crate) fn close(&self) {
        let _guard = self.current_snapshot.lock();
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Persists `data` as the current snapshot unless a newer one exists.
    fn store_snapshot(&self, snap: StoredSnapshot) -> Result<(), MetadataError> {
        let mut cur = self.current_snapshot.lock();
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(MetadataError::Shutdown);
        }
        if cur
            .as_ref()
            .is_some_and(|c| c.meta.last_log_id > snap.meta.last_log_id)
        {
            return Ok(());
        }
        write_atomic(&self.dir, "snapshot", &snap.data, true)?;
        *cur = Some(snap);
        Ok(())
    }
}

pub(crate) struct StateMachineStore {
    shared: Arc<Shared>,
    last_applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, BasicNode>,
    image: Arc<MetadataImage>,
}

impl StateMachineStore {
    /// Loads the newest snapshot, if any, and publishes its image.
    pub(crate) fn open(shared: Arc<Shared>) -> Result<StateMachineStore, MetadataError> {
        let mut sm = StateMachineStore {
            shared: shared.clone(),
            last_applied: None,
            membership: StoredMembership::default(),
            image: Arc::new(MetadataImage::default()),
        };
        let _ = fs::remove_file(shared.dir.join("snapshot.tmp"));
        if let Some(data) = read_optional(&shared.dir.join("snapshot"))? {
            let (meta, image) = decode_snapshot(&data).inspect_err(|e| {
                if let MetadataError::Replay(r) = e {
                    *shared.failure.lock() = Some(r.clone());
                }
            })?;
            tracing::info!(snapshot = %meta, "loaded metadata snapshot");
            sm.last_applied = meta.last_log_id;
            sm.membership = meta.last_membership.clone();
            sm.image = Arc::new(image);
            *shared.current_snapshot.lock() = Some(StoredSnapshot {
                meta,
                data: Arc::new(data),
            });
        }
        shared.images.send_replace(sm.image.clone());
        Ok(sm)
    }

    fn fail(&self, err: MetadataReplayError, log_id: LogId<NodeId>) -> StoErr {
        tracing::error!("{err}; stopping the metadata controller");
        *self.shared.failure.lock() = Some(err.clone());
        StorageIOError::apply(log_id, AnyError::new(&err)).into()
    }
}

pub(crate) struct SnapshotBuilder {
    shared: Arc<Shared>,
    last_applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, BasicNode>,
    image: Arc<MetadataImage>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StoErr> {
        let snapshot_id = match &self.last_applied {
            Some(l) => format!(
                "{}-{}-{}",
                l.leader_id.term,
                l.index,
                uuid::Uuid::new_v4().simple()
            ),
            None => format!("empty-{}", uuid::Uuid::new_v4().simple()),
        };
        let meta = SnapshotMeta {
            last_log_id: self.last_applied,
            last_membership: self.membership.clone(),
            snapshot_id,
        };
        let data = encode_snapshot(&meta, &self.image);
        let snap = StoredSnapshot {
            meta,
            data: Arc::new(data),
        };
        self.shared.store_snapshot(snap.clone()).map_err(|e| {
            StorageIOError::write_snapshot(Some(snap.meta.signature()), AnyError::new(&e))
        })?;
        tracing::info!(snapshot = %snap.meta, "built metadata snapshot");
        Ok(snap.to_snapshot())
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>), StoErr> {
        Ok((self.last_applied, self.membership.clone()))
    }

    /// Applies committed entries: every record goes through
    /// [`decode_committed_value`], and one new image is published per call
    /// (one clone per batch, not per record).
    async fn apply<I>(&mut self, entries: I) -> Result<Vec<ApplyResponse>, StoErr>
    where
        I: IntoIterator<Item = Ent> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut next: Option<MetadataImage> = None;
        let mut responses = Vec::new();
        let mut failure = None;
        for entry in entries {
            let log_id = entry.log_id;
            match entry.payload {
                EntryPayload::Blank => responses.push(ApplyResponse::default()),
                EntryPayload::Membership(m) => {
                    self.membership = StoredMembership::new(Some(log_id), m);
                    responses.push(ApplyResponse::default());
                }
                EntryPayload::Normal(batch) => {
                    let offset = log_id.index as i64;
                    // An entry applies whole or not at all: check every value
                    // decodes before touching the image, so the published
                    // image never holds half of a failed entry.
                    if let Some(reason) = batch
                        .records
                        .iter()
                        .find_map(|v| MetadataRecord::decode(v).err())
                    {
                        failure = Some((
                            MetadataReplayError::UndecodableRecord { offset, reason },
                            log_id,
                        ));
                        break;
                    }
                    let image = next.get_or_insert_with(|| (*self.image).clone());
                    let mut skipped = Vec::new();
                    for (i, value) in batch.records.iter().enumerate() {
                        match decode_committed_value(value, image, offset) {
                            Ok(Some(rec)) => image.apply(&rec, offset),
                            Ok(None) => skipped.push(i as u32),
                            Err(e) => {
                                // Unreachable after the check above; still fatal.
                                failure = Some((e, log_id));
                                break;
                            }
                        }
                    }
                    if failure.is_some() {
                        break;
                    }
                    image.offset = offset;
                    responses.push(ApplyResponse { skipped });
                }
            }
            self.last_applied = Some(log_id);
        }
        if let Some(image) = next {
            self.image = Arc::new(image);
            self.shared.images.send_replace(self.image.clone());
        }
        if let Some((err, log_id)) = failure {
            return Err(self.fail(err, log_id));
        }
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            shared: self.shared.clone(),
            last_applied: self.last_applied,
            membership: self.membership.clone(),
            image: self.image.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StoErr> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StoErr> {
        let data = snapshot.into_inner();
        let sig = Some(meta.signature());
        let (_, image) = match decode_snapshot(&data) {
            Ok(x) => x,
            Err(MetadataError::Replay(e)) => {
                *self.shared.failure.lock() = Some(e.clone());
                return Err(StorageIOError::read_snapshot(sig, AnyError::new(&e)).into());
            }
            Err(e) => return Err(StorageIOError::read_snapshot(sig, AnyError::new(&e)).into()),
        };
        self.shared
            .store_snapshot(StoredSnapshot {
                meta: meta.clone(),
                data: Arc::new(data),
            })
            .map_err(|e| StorageIOError::write_snapshot(sig, AnyError::new(&e)))?;
        self.last_applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        self.image = Arc::new(image);
        self.shared.images.send_replace(self.image.clone());
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StoErr> {
        Ok(self
            .shared
            .current_snapshot
            .lock()
            .as_ref()
            .map(StoredSnapshot::to_snapshot))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::TopicRecord;

    fn entry(term: u64, index: u64, size: usize) -> Ent {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
            payload: EntryPayload::Normal(MetadataBatch {
                records: vec![vec![index as u8; size]],
            }),
        }
    }

    fn open(dir: &Path) -> LogStore {
        let lock = File::create(dir.join("LOCK")).unwrap();
        LogStore::open(dir, lock).unwrap()
    }

    fn indexes(store: &LogStore) -> Vec<(u64, u64)> {
        store
            .entries
            .read()
            .values()
            .map(|e| (e.log_id.leader_id.term, e.log_id.index))
            .collect()
    }

    #[test]
    fn entry_envelope_round_trips() {
        let e = entry(3, 9, 5);
        let back = decode_entry(&encode_entry(&e)).unwrap();
        assert_eq!(back, e);
        let blank: Ent = Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 2), 0),
            payload: EntryPayload::Blank,
        };
        assert_eq!(decode_entry(&encode_entry(&blank)).unwrap(), blank);
        let m: Ent = Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 2), 1),
            payload: EntryPayload::Membership(Membership::new(
                vec![std::collections::BTreeSet::from([1u64])],
                None,
            )),
        };
        assert_eq!(decode_entry(&encode_entry(&m)).unwrap(), m);
    }

    #[test]
    fn truncate_and_reappend_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = open(dir.path());
        s.append_durable((1..=10).map(|i| entry(1, i, 10)).collect())
            .unwrap();
        s.truncate_from(6).unwrap();
        s.append_durable((6..=8).map(|i| entry(2, i, 10)).collect())
            .unwrap();
        let want: Vec<_> = (1..=5)
            .map(|i| (1, i))
            .chain((6..=8).map(|i| (2, i)))
            .collect();
        assert_eq!(indexes(&s), want);
        drop(s);
        assert_eq!(indexes(&open(dir.path())), want);
    }

    #[test]
    fn appends_must_not_leave_holes() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = open(dir.path());
        s.append_durable(vec![entry(1, 1, 1)]).unwrap();
        assert!(s.append_durable(vec![entry(1, 3, 1)]).is_err());
    }

    #[test]
    fn files_roll_and_purge_deletes_whole_files() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = open(dir.path());
        let big = 1 << 20;
        s.append_durable((1..=10).map(|i| entry(1, i, big)).collect())
            .unwrap();
        assert!(s.files.len() >= 3, "{} files", s.files.len());
        let files_before = s.files.len();
        s.purge_upto(LogId::new(CommittedLeaderId::new(1, 1), 5))
            .unwrap();
        assert!(s.files.len() < files_before);
        assert_eq!(indexes(&s), (6..=10).map(|i| (1, i)).collect::<Vec<_>>());
        s.truncate_from(8).unwrap();
        drop(s);
        let mut s = open(dir.path());
        assert_eq!(s.purged.unwrap().index, 5);
        assert_eq!(indexes(&s), vec![(1, 6), (1, 7)]);
        s.append_durable(vec![entry(2, 8, 10)]).unwrap();
        // Purge past the end (a snapshot install does that): nothing left,
        // and the next append continues after the purge point.
        s.purge_upto(LogId::new(CommittedLeaderId::new(2, 1), 20))
            .unwrap();
        assert!(indexes(&s).is_empty());
        assert!(s.files.is_empty());
        s.append_durable(vec![entry(3, 21, 10)]).unwrap();
        drop(s);
        assert_eq!(indexes(&open(dir.path())), vec![(3, 21)]);
    }

    #[test]
    fn corruption_before_the_newest_file_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = open(dir.path());
        s.append_durable((1..=6).map(|i| entry(1, i, 1 << 20)).collect())
            .unwrap();
        let first = s.files.values().next().unwrap().path.clone();
        assert!(s.files.len() >= 2);
        drop(s);
        let mut data = fs::read(&first).unwrap();
        data[20] ^= 0xff;
        fs::write(&first, data).unwrap();
        let lock = File::create(dir.path().join("LOCK")).unwrap();
        assert!(matches!(
            LogStore::open(dir.path(), lock),
            Err(MetadataError::Corrupt(_))
        ));
    }

    #[test]
    fn torn_tail_of_newest_file_is_truncated() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = open(dir.path());
        s.append_durable((1..=3).map(|i| entry(1, i, 10)).collect())
            .unwrap();
        let path = s.files.values().next().unwrap().path.clone();
        drop(s);
        let good = fs::metadata(&path).unwrap().len();
        // Cut the last frame in half.
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(good - 5).unwrap();
        drop(f);
        let s = open(dir.path());
        assert_eq!(indexes(&s), vec![(1, 1), (1, 2)]);
        assert!(fs::metadata(&path).unwrap().len() < good - 5);
    }

    fn sample_image() -> MetadataImage {
        let mut img = MetadataImage::default();
        let rec = MetadataRecord::CreateTopic(TopicRecord {
            topic_id: uuid::Uuid::from_u128(5),
            name: "t".into(),
            partitions: 2,
            replication_factor: 1,
            configs: Default::default(),
        });
        img.apply(&rec, 12);
        img
    }

    fn meta() -> SnapshotMeta<NodeId, BasicNode> {
        SnapshotMeta {
            last_log_id: Some(LogId::new(CommittedLeaderId::new(1, 1), 12)),
            last_membership: StoredMembership::default(),
            snapshot_id: "s".into(),
        }
    }

    #[test]
    fn snapshot_round_trips_and_is_checked() {
        let img = sample_image();
        let data = encode_snapshot(&meta(), &img);
        let (m, back) = decode_snapshot(&data).unwrap();
        assert_eq!(m, meta());
        assert_eq!(back, img);
        let empty = encode_snapshot(&meta(), &MetadataImage::default());
        assert_eq!(decode_snapshot(&empty).unwrap().1, MetadataImage::default());

        let mut bad = data.clone();
        let n = bad.len();
        bad[n - 10] ^= 1;
        assert!(matches!(
            decode_snapshot(&bad),
            Err(MetadataError::Corrupt(_))
        ));
    }

    /// A snapshot is read through decode_committed_value: an undecodable
    /// record in it is a replay error, not a skipped record.
    #[test]
    fn snapshot_with_an_undecodable_record_is_a_replay_error() {
        let data = encode_snapshot(&meta(), &sample_image());
        // Rebuild the body with the record's type number changed to 77.
        let body = &data[..data.len() - 4];
        let hlen = u32::from_be_bytes(body[6..10].try_into().unwrap()) as usize;
        let rec_at = 10 + hlen + 4 + 4;
        let mut body = body.to_vec();
        body[rec_at..rec_at + 2].copy_from_slice(&77u16.to_be_bytes());
        let crc = crc32c::crc32c(&body);
        body.extend_from_slice(&crc.to_be_bytes());
        assert!(matches!(
            decode_snapshot(&body),
            Err(MetadataError::Replay(
                MetadataReplayError::UndecodableRecord { offset: 12, .. }
            ))
        ));
    }
}
