//! The follower side of replication (I/O): a broker serves the streams
//! primaries open to it, and the one-shot fence, repair and producer
//! snapshot exchanges.
//!
//! Appends are written in stream order to the follower's copy and made
//! durable by a per-stream flusher (one fsync covers every append that
//! arrived meanwhile); each fsync is answered with an `Ack` of the durable
//! end, which is what the primary counts towards its quorum.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;
use tessera_log::RangeLog;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, Notify};

use crate::auth::Connector;
use crate::follower::Offer;
use crate::protocol::{read_message, write_message, Message, ProtocolError, SegmentKey};
use crate::replica_store::ReplicaStore;

/// Why a follower will not take a segment (yet).
#[derive(Clone, Debug)]
pub struct Refusal {
    /// The follower's metadata may be behind: try again shortly.
    pub retry: bool,
    pub reason: String,
}

/// What the follower side needs to know from the broker's metadata image.
pub trait Directory: Send + Sync + 'static {
    /// Where this broker keeps its copy of `key` if the image names it a
    /// follower of that active segment with `primary` as its primary and
    /// `epoch` as its leader epoch.
    fn follower_dir(&self, key: SegmentKey, primary: i32, epoch: i32) -> Result<PathBuf, Refusal>;
    /// The directory of `key`'s range, if the image knows the range.
    fn range_dir(&self, key: SegmentKey) -> Option<PathBuf>;
    /// This broker's range log of `range` (it is, or was, its primary).
    fn primary_log(&self, range: u64) -> Option<Arc<RangeLog>>;
    /// Where this broker's copy of `segment` is and its sealed size, when
    /// the image records the segment sealed with this broker among its
    /// replicas, `primary` as its primary and `epoch` as its leader epoch
    /// (its stream may complete a short copy). `None` otherwise.
    fn sealed_copy(
        &self,
        _segment: SegmentKey,
        _primary: i32,
        _epoch: i32,
    ) -> Option<(PathBuf, u64)> {
        None
    }
    /// Whether the image records `segment` sealed (`None`: not known).
    fn segment_sealed(&self, segment: SegmentKey) -> Option<bool>;
    /// The leader epoch the image records for `segment` (`None`: not known).
    fn segment_epoch(&self, segment: SegmentKey) -> Option<i32>;
    /// The cleaning pass this broker's copy of `segment` is at, when known
    /// (its range's passes applied here); `None` while it may be behind.
    fn copy_clean_pass(&self, segment: SegmentKey) -> Option<u64>;
    /// Whether `broker` is registered in the image (a stream's `Hello`
    /// must name one).
    fn is_registered_broker(&self, broker: i32) -> bool;
}

/// Largest repair chunk served per `Read`.
pub const MAX_READ_BYTES: u32 = 4 << 20;

/// Serves one upgraded connection until it ends.
pub async fn serve<R, W>(
    mut reader: R,
    writer: W,
    store: Arc<ReplicaStore>,
    dir: Arc<dyn Directory>,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (tx, rx) = mpsc::unbounded_channel::<Message>();
    let writer_task = tokio::spawn(write_all(writer, rx));
    let first = match read_message(&mut reader).await {
        Ok(Some(m)) => m,
        Ok(None) => return,
        Err(e) => {
            tracing::info!(error = %e, "replication connection closed");
            return;
        }
    };
    match first {
        Message::Hello { from } if dir.is_registered_broker(from) => {
            stream(reader, tx.clone(), from, store, dir).await
        }
        Message::Hello { from } => {
            tracing::info!(
                from,
                "replication stream refused: Hello names no registered broker"
            );
        }
        Message::Fence { segment, epoch } => {
            let _ = tx.send(fence(segment, epoch, &store, &*dir));
        }
        Message::Read {
            segment,
            from,
            max,
            pass,
            epoch,
        } => {
            let _ = tx.send(read(
                segment,
                from,
                max.min(MAX_READ_BYTES),
                pass,
                epoch,
                &store,
                &*dir,
            ));
        }
        Message::ReadSnapshot { segment } => {
            let _ = tx.send(crate::snapshot_transfer::serve(segment, &*dir));
        }
        Message::ReadCopyState {
            segment,
            pass,
            epoch,
            size,
        } => {
            let complete = holds_complete_copy(segment, pass, epoch, size, &store, &*dir);
            let _ = tx.send(Message::CopyState { segment, complete });
        }
        other => tracing::info!(?other, "unexpected first replication message"),
    }
    drop(tx);
    let _ = writer_task.await;
}

async fn write_all<W: AsyncWrite + Unpin>(mut writer: W, mut rx: mpsc::UnboundedReceiver<Message>) {
    while let Some(m) = rx.recv().await {
        if write_message(&mut writer, &m).await.is_err() {
            return;
        }
    }
}

/// A primary's stream: appends in, acks out.
async fn stream<R: AsyncRead + Unpin>(
    mut reader: R,
    tx: mpsc::UnboundedSender<Message>,
    primary: i32,
    store: Arc<ReplicaStore>,
    dir: Arc<dyn Directory>,
) {
    let dirty = Arc::new(Mutex::new(BTreeSet::<SegmentKey>::new()));
    let wake = Arc::new(Notify::new());
    let mut flusher = tokio::spawn(flush(
        store.clone(),
        dirty.clone(),
        wake.clone(),
        tx.clone(),
    ));
    loop {
        let read = tokio::select! {
            read = read_message(&mut reader) => read,
            // The flusher ends only when an fsync failed (nothing written
            // since may be acknowledged) or the reply channel closed: the
            // stream ends with it, and the primary reconnects.
            _ = &mut flusher => {
                tracing::warn!(primary, "replication stream closed: its copies could not be made durable");
                return;
            }
        };
        let msg = match read {
            Ok(Some(m)) => m,
            Ok(None) => break,
            Err(e) => {
                tracing::info!(primary, error = %e, "replication stream closed");
                break;
            }
        };
        let Message::Append {
            segment,
            epoch,
            position,
            frames,
        } = msg
        else {
            tracing::info!(primary, "unexpected message in a replication stream");
            break;
        };
        let reply = match dir.follower_dir(segment, primary, epoch) {
            // Sealed while this copy was still receiving it (a quorum
            // without this broker committed it first): the rest of the
            // stream completes the copy, as a repair would.
            Err(_) if dir.sealed_copy(segment, primary, epoch).is_some() => {
                let (path, size) = dir.sealed_copy(segment, primary, epoch).expect("just seen");
                complete_sealed_copy(
                    &store, segment, &path, size, position, &frames, &dirty, &wake,
                )
            }
            Err(r) => Some(Message::Refused {
                segment,
                retry: r.retry,
                reason: r.reason,
            }),
            Ok(path) => match store.copy(segment, &path) {
                Err(e) => Some(refused(segment, &e)),
                // An empty append is the primary's probe: answer with what
                // is durable here (a copy that refuses says so).
                Ok(copy) if frames.is_empty() => {
                    let (state, failed) = {
                        let c = copy.lock();
                        (c.state(), c.is_failed())
                    };
                    Some(if failed {
                        refused(segment, &tessera_log::LogError::StorageFailed)
                    } else if state.fenced || state.sealed_size.is_some() {
                        Message::Refused {
                            segment,
                            retry: false,
                            reason: "the segment is fenced or sealed here".into(),
                        }
                    } else {
                        Message::Ack {
                            segment,
                            durable: state.durable,
                        }
                    })
                }
                Ok(copy) => match copy.lock().append(position, &frames) {
                    Ok(Offer::Accept) => {
                        dirty.lock().insert(segment);
                        wake.notify_one();
                        None
                    }
                    Ok(Offer::Mismatch { end }) => Some(Message::Mismatch { segment, end }),
                    Ok(Offer::Refused) => Some(Message::Refused {
                        segment,
                        retry: false,
                        reason: "the segment is fenced or sealed here".into(),
                    }),
                    Err(e) => Some(refused(segment, &e)),
                },
            },
        };
        if let Some(reply) = reply {
            let stop = matches!(reply, Message::Refused { retry: false, .. });
            if tx.send(reply).is_err() || stop {
                break;
            }
        }
    }
    flusher.abort();
}

/// Writes a primary's stream of a segment sealed meanwhile into this
/// broker's short copy, up to the sealed size. The answer: none when
/// written (the flusher acks), the durable end to a probe, where to resend
/// from, or a refusal once the copy is complete.
#[allow(clippy::too_many_arguments)]
fn complete_sealed_copy(
    store: &ReplicaStore,
    segment: SegmentKey,
    path: &std::path::Path,
    size: u64,
    position: u64,
    frames: &[u8],
    dirty: &Mutex<BTreeSet<SegmentKey>>,
    wake: &Notify,
) -> Option<Message> {
    let copy = match store.copy(segment, path) {
        Ok(c) => c,
        Err(e) => return Some(refused(segment, &e)),
    };
    let mut c = copy.lock();
    if c.is_failed() {
        return Some(refused(segment, &tessera_log::LogError::StorageFailed));
    }
    if c.state().sealed_size.is_none() {
        if let Err(e) = c.seal(size) {
            return Some(refused(segment, &e));
        }
    }
    let state = c.state();
    if state.written >= size {
        return Some(Message::Refused {
            segment,
            retry: false,
            reason: format!(
                "segment {}/{} is sealed and complete here",
                segment.range, segment.seq
            ),
        });
    }
    if frames.is_empty() {
        return Some(Message::Ack {
            segment,
            durable: state.durable,
        });
    }
    if position != state.written {
        return Some(Message::Mismatch {
            segment,
            end: state.written,
        });
    }
    match c.repair(position, frames) {
        Ok(true) => {
            drop(c);
            dirty.lock().insert(segment);
            wake.notify_one();
            None
        }
        Ok(false) => Some(Message::Mismatch {
            segment,
            end: state.written,
        }),
        Err(e) => Some(refused(segment, &e)),
    }
}

fn refused(segment: SegmentKey, e: &dyn std::fmt::Display) -> Message {
    Message::Refused {
        segment,
        retry: false,
        reason: e.to_string(),
    }
}

/// Group commit of a stream's copies: fsync every copy written since the
/// last round, then ack each one's durable end.
async fn flush(
    store: Arc<ReplicaStore>,
    dirty: Arc<Mutex<BTreeSet<SegmentKey>>>,
    wake: Arc<Notify>,
    tx: mpsc::UnboundedSender<Message>,
) {
    loop {
        wake.notified().await;
        let keys = std::mem::take(&mut *dirty.lock());
        for key in keys {
            let Some(copy) = store.get(key) else { continue };
            let (file, position) = copy.lock().sync_target();
            match tokio::task::spawn_blocking(move || file.sync_data()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    // Never ack after a failed fsync: the copy refuses from
                    // now on, the stream ends, the primary counts this
                    // replica out (and replaces it once it lags).
                    copy.lock().fail();
                    tracing::error!(segment = ?key, error = %e, "fsync of a follower copy failed");
                    let _ = tx.send(refused(key, &e));
                    return;
                }
                Err(_) => return,
            }
            let durable = {
                let mut c = copy.lock();
                c.synced(position);
                c.state().durable
            };
            if tx
                .send(Message::Ack {
                    segment: key,
                    durable,
                })
                .is_err()
            {
                return;
            }
        }
    }
}

/// Fences this broker's replica of `segment` at leader epoch `epoch`: its
/// own range log if it is the primary, else its follower copy (created
/// empty if it has none, so nothing is accepted for it later).
///
/// A fence meant for another epoch changes nothing: one older than the
/// image's (a fencer whose image was behind) is refused for good; one for
/// a segment number this broker's own log wrote at another epoch (a
/// zombie primary's roll nobody recorded, while a failover opened the
/// same number elsewhere) is refused until the log is closed and its
/// unrecorded segments discarded: its bytes are not the fenced segment's.
pub fn fence(
    segment: SegmentKey,
    epoch: i32,
    store: &ReplicaStore,
    dir: &dyn Directory,
) -> Message {
    if let Some(known) = dir.segment_epoch(segment) {
        if known > epoch {
            return Message::Refused {
                segment,
                retry: false,
                reason: format!("stale fence: the segment's leader epoch is {known}, not {epoch}"),
            };
        }
    }
    if let Some(log) = dir.primary_log(segment.range) {
        if log.leader_epoch() != epoch && log.holds_segment(segment.seq) {
            return Message::Refused {
                segment,
                retry: true,
                reason: format!(
                    "this broker's log of epoch {} holds another segment {}/{}",
                    log.leader_epoch(),
                    segment.range,
                    segment.seq
                ),
            };
        }
        let (sealed, active) = log.local_segments();
        if let Some(s) = sealed.iter().find(|s| s.seq == segment.seq) {
            // Sealed here already by a roll. If the image has not recorded
            // that roll, the fencer seals this segment and the range goes
            // on elsewhere: stop appends after it too. If it has, the fence
            // is stale (its sender's image was behind) and must change
            // nothing: the log's active segment is a later one, maybe
            // opened on this broker as the new primary.
            if dir.segment_sealed(segment) != Some(true) {
                if !log.commits_recorded_only() && !log.is_replicated() {
                    // An unreplicated log has acknowledged what it wrote
                    // past this roll already: sealing the range at this
                    // segment's end would drop that. The roll's record
                    // comes; the fencer then finds the segment sealed.
                    return Message::Refused {
                        segment,
                        retry: true,
                        reason:
                            "an unreplicated log rolled past the segment; its record is pending"
                                .into(),
                    };
                }
                let _ = log.seal();
            }
            return Message::Fenced {
                segment,
                end: s.size_bytes,
                spans: s.spans.clone(),
            };
        }
        if active == segment.seq {
            return match log.seal() {
                Ok(s) => Message::Fenced {
                    segment,
                    end: s.size_bytes,
                    spans: s.spans,
                },
                Err(e) => refused(segment, &e),
            };
        }
    }
    let Some(path) = dir.range_dir(segment) else {
        return Message::Refused {
            segment,
            retry: true,
            reason: "range not known here yet".into(),
        };
    };
    match store.copy(segment, &path).and_then(|c| c.lock().fence()) {
        Ok((end, spans)) => Message::Fenced {
            segment,
            end,
            spans,
        },
        Err(e) => refused(segment, &e),
    }
}

/// Serves a repair read from this broker's copy (or its own range log).
/// Whether this broker holds all of the sealed `segment` (leader epoch
/// `epoch`, cleaning pass `pass`, `size` bytes): sealed in its range log of
/// that epoch or later, or a copy of exactly that length (a longer one was
/// never cut to its seal).
pub fn holds_complete_copy(
    segment: SegmentKey,
    pass: u64,
    epoch: i32,
    size: u64,
    store: &ReplicaStore,
    dir: &dyn Directory,
) -> bool {
    if dir.copy_clean_pass(segment) != Some(pass) {
        return false;
    }
    if let Some(log) = dir.primary_log(segment.range) {
        if log.holds_segment(segment.seq) {
            return log.leader_epoch() >= epoch && log.holds_sealed(segment.seq);
        }
    }
    let copy = store.get(segment).map(Ok).or_else(|| {
        let path = dir.range_dir(segment)?;
        tessera_log::segment::log_path(&path, segment.seq)
            .exists()
            .then(|| store.copy(segment, &path))
    });
    matches!(copy, Some(Ok(c)) if c.lock().state().written == size)
}

pub fn read(
    segment: SegmentKey,
    from: u64,
    max: u32,
    pass: u64,
    epoch: i32,
    store: &ReplicaStore,
    dir: &dyn Directory,
) -> Message {
    // A copy at another cleaning pass holds other bytes at the same positions.
    let held = dir.copy_clean_pass(segment);
    if held != Some(pass) {
        return Message::Refused {
            segment,
            retry: true,
            reason: format!("copy at cleaning pass {held:?}, not {pass}"),
        };
    }
    if let Some(log) = dir.primary_log(segment.range) {
        // A log of an older epoch than the segment's wrote its number before
        // the segment existed: a zombie primary's own roll, which nobody
        // recorded while a failover opened the same number elsewhere.
        // Serving it would repair the copy with another segment's records.
        if log.leader_epoch() < epoch && log.holds_segment(segment.seq) {
            return Message::Refused {
                segment,
                retry: true,
                reason: format!(
                    "this broker's log of epoch {} holds another segment {}/{} (asked for epoch {epoch})",
                    log.leader_epoch(),
                    segment.range,
                    segment.seq
                ),
            };
        }
        match log.frames(segment.seq, from, max as usize) {
            Ok(Some(chunk)) => {
                return Message::Data {
                    segment,
                    position: from,
                    frames: chunk.bytes,
                }
            }
            Ok(None) => {}
            Err(e) => return refused(segment, &e),
        }
    }
    let copy = store.get(segment).map(Ok).or_else(|| {
        let path = dir.range_dir(segment)?;
        tessera_log::segment::log_path(&path, segment.seq)
            .exists()
            .then(|| store.copy(segment, &path))
    });
    match copy {
        Some(Ok(c)) => match c.lock().read(from, max as usize) {
            Ok(frames) => Message::Data {
                segment,
                position: from,
                frames,
            },
            Err(e) => refused(segment, &e),
        },
        Some(Err(e)) => refused(segment, &e),
        None => Message::Refused {
            segment,
            retry: false,
            reason: "no copy of the segment here".into(),
        },
    }
}

/// One request/reply exchange (fence, repair or snapshot read) with the
/// broker at `addr`, on a connection `connector` authenticates.
pub async fn call(
    connector: &dyn Connector,
    addr: &str,
    msg: &Message,
    timeout: std::time::Duration,
) -> Result<Message, ProtocolError> {
    let exchange = async {
        let mut conn = crate::protocol::connect(connector, addr, timeout).await?;
        write_message(&mut conn, msg).await?;
        read_message(&mut conn)
            .await?
            .ok_or(ProtocolError::Malformed(
                "connection closed before the reply",
            ))
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(r) => r,
        Err(_) => Err(ProtocolError::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no reply from {addr} within {timeout:?}"),
        ))),
    }
}
