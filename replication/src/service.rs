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
    /// follower of that active segment with `primary` as its primary.
    fn follower_dir(&self, key: SegmentKey, primary: i32) -> Result<PathBuf, Refusal>;
    /// The directory of `key`'s range, if the image knows the range.
    fn range_dir(&self, key: SegmentKey) -> Option<PathBuf>;
    /// This broker's range log of `range` (it is, or was, its primary).
    fn primary_log(&self, range: u64) -> Option<Arc<RangeLog>>;
    /// The cleaning pass this broker's copy of `segment` is at, when known
    /// (its range's passes applied here); `None` while it may be behind.
    fn copy_clean_pass(&self, segment: SegmentKey) -> Option<u64>;
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
        Message::Hello { from } => stream(reader, tx.clone(), from, store, dir).await,
        Message::Fence { segment } => {
            let _ = tx.send(fence(segment, &store, &*dir));
        }
        Message::Read {
            segment,
            from,
            max,
            pass,
        } => {
            let _ = tx.send(read(
                segment,
                from,
                max.min(MAX_READ_BYTES),
                pass,
                &store,
                &*dir,
            ));
        }
        Message::ReadSnapshot { segment } => {
            let _ = tx.send(crate::snapshot_transfer::serve(segment, &*dir));
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
    let flusher = tokio::spawn(flush(
        store.clone(),
        dirty.clone(),
        wake.clone(),
        tx.clone(),
    ));
    loop {
        let msg = match read_message(&mut reader).await {
            Ok(Some(m)) => m,
            Ok(None) => break,
            Err(e) => {
                tracing::info!(primary, error = %e, "replication stream closed");
                break;
            }
        };
        let Message::Append {
            segment,
            position,
            frames,
        } = msg
        else {
            tracing::info!(primary, "unexpected message in a replication stream");
            break;
        };
        let reply = match dir.follower_dir(segment, primary) {
            Err(r) => Some(Message::Refused {
                segment,
                retry: r.retry,
                reason: r.reason,
            }),
            Ok(path) => match store.copy(segment, &path) {
                Err(e) => Some(refused(segment, &e)),
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
                    // Never ack after a failed fsync: the stream ends, the
                    // primary counts this replica out.
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

/// Fences this broker's replica of `segment`: its own range log if it is
/// the primary, else its follower copy (created empty if it has none, so
/// nothing is accepted for it later).
pub fn fence(segment: SegmentKey, store: &ReplicaStore, dir: &dyn Directory) -> Message {
    if let Some(log) = dir.primary_log(segment.range) {
        let (sealed, active) = log.local_segments();
        if let Some(s) = sealed.iter().find(|s| s.seq == segment.seq) {
            // Sealed here already (a roll): stop appends after it too.
            let _ = log.seal();
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
pub fn read(
    segment: SegmentKey,
    from: u64,
    max: u32,
    pass: u64,
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
/// broker at `addr`.
pub async fn call(
    addr: &str,
    msg: &Message,
    timeout: std::time::Duration,
) -> Result<Message, ProtocolError> {
    let exchange = async {
        let mut conn = crate::protocol::connect(addr, timeout).await?;
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
