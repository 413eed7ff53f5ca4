//! The primary side of replication (I/O): one shipping task per follower
//! streams the range log's stored frames, in order and pipelined, and the
//! acks move the range's committed position (the high watermark) to what a
//! quorum of the segment's replicas — the primary's own fsync included —
//! holds durably.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tessera_log::RangeLog;
use tokio::sync::watch;

use crate::protocol::{connect, read_message, write_message, Message, SegmentKey};
use crate::quorum::committed_end;

/// Bytes shipped to one follower and not yet acknowledged, at most.
const WINDOW_BYTES: u64 = 16 << 20;
/// Frames per `Append`, about.
const CHUNK_BYTES: usize = 1 << 20;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const RETRY_MIN: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(1);
/// How long a follower that asked to retry later is left alone.
const REFUSED_PAUSE: Duration = Duration::from_millis(100);

/// Where a follower's Kafka listener is (from the metadata image).
pub trait PeerAddresses: Send + Sync + 'static {
    fn address_of(&self, broker: i32) -> Option<String>;
}

#[derive(Clone, Copy, Debug)]
struct FollowerProgress {
    seq: u32,
    durable: u64,
    /// Last time the follower had everything the primary had fsynced.
    caught_up: Instant,
}

/// Replication of one range log's active segment to its followers.
pub struct Replication {
    log: Arc<RangeLog>,
    range: u64,
    me: i32,
    replicas: usize,
    followers: Vec<i32>,
    progress: Mutex<HashMap<i32, FollowerProgress>>,
    stop: watch::Sender<bool>,
}

impl Replication {
    /// Starts shipping `log` (the range's log, this broker the primary of
    /// its active segment) to `followers`.
    pub fn start(
        log: Arc<RangeLog>,
        range: u64,
        me: i32,
        followers: Vec<i32>,
        peers: Arc<dyn PeerAddresses>,
    ) -> Arc<Replication> {
        let (start_seq, _) = log.local_durable_end();
        let now = Instant::now();
        let r = Arc::new(Replication {
            log,
            range,
            me,
            replicas: followers.len() + 1,
            progress: Mutex::new(
                followers
                    .iter()
                    .map(|f| {
                        (
                            *f,
                            FollowerProgress {
                                seq: start_seq,
                                durable: 0,
                                caught_up: now,
                            },
                        )
                    })
                    .collect(),
            ),
            followers,
            stop: watch::channel(false).0,
        });
        for &f in &r.followers {
            tokio::spawn(ship(r.clone(), f, peers.clone()));
        }
        tokio::spawn(follow_local(r.clone()));
        r
    }

    pub fn stop(&self) {
        self.stop.send_replace(true);
    }

    pub fn log(&self) -> &Arc<RangeLog> {
        &self.log
    }

    /// Replicas in sync: the primary, and followers that had everything the
    /// primary had fsynced within `lag` (Kafka's `replica.lag.time.max.ms`).
    pub fn in_sync(&self, lag: Duration) -> Vec<i32> {
        let now = Instant::now();
        let (seq, local) = self.log.local_durable_end();
        let own = self.log.position_of(seq, local).unwrap_or(0);
        let mut out = vec![self.me];
        for (f, p) in self.progress.lock().iter() {
            // Caught up now (an idle range), or recently enough.
            let at = self.log.position_of(p.seq, p.durable).unwrap_or(0);
            if at >= own || now.duration_since(p.caught_up) <= lag {
                out.push(*f);
            }
        }
        out
    }

    /// Recomputes the committed position from every replica's durable end.
    fn recompute(&self) {
        let (seq, local) = self.log.local_durable_end();
        let Some(own) = self.log.position_of(seq, local) else {
            return;
        };
        let mut ends = vec![own];
        let now = Instant::now();
        for p in self.progress.lock().values_mut() {
            let at = self.log.position_of(p.seq, p.durable).unwrap_or(0);
            if at >= own {
                p.caught_up = now;
            }
            ends.push(at);
        }
        self.log.commit(committed_end(&ends, self.replicas));
    }

    fn acked(&self, follower: i32, seq: u32, durable: u64) {
        if let Some(p) = self.progress.lock().get_mut(&follower) {
            if (seq, durable) > (p.seq, p.durable) {
                p.seq = seq;
                p.durable = durable;
            }
        }
        self.recompute();
    }

    fn stopped(&self) -> bool {
        *self.stop.borrow()
    }
}

/// The primary's own fsyncs count too.
async fn follow_local(r: Arc<Replication>) {
    let mut local = r.log.subscribe_local_durable();
    let mut stop = r.stop.subscribe();
    loop {
        r.recompute();
        tokio::select! {
            changed = local.changed() => if changed.is_err() { return },
            _ = stop.changed() => return,
        }
    }
}

/// Keeps one follower's copy in step: connect, stream, reconnect.
async fn ship(r: Arc<Replication>, follower: i32, peers: Arc<dyn PeerAddresses>) {
    let mut backoff = RETRY_MIN;
    let mut stop = r.stop.subscribe();
    while !r.stopped() {
        let outcome = match peers.address_of(follower) {
            Some(addr) => stream_to(&r, follower, &addr).await,
            None => Err(format!("no address for broker {follower}")),
        };
        match outcome {
            Ok(()) => return,
            Err(reason) => {
                tracing::debug!(range = r.range, follower, %reason, "replication stream ended; retrying");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.changed() => return,
        }
        backoff = (backoff * 2).min(RETRY_MAX);
    }
}

/// One connection's life. `Ok` when replication of this log is over (the
/// follower refused for good or we were stopped), `Err` to reconnect.
async fn stream_to(r: &Arc<Replication>, follower: i32, addr: &str) -> Result<(), String> {
    let conn = connect(addr, CONNECT_TIMEOUT)
        .await
        .map_err(|e| format!("connect to {addr}: {e}"))?;
    let (mut reader, mut writer) = conn.into_split();
    write_message(&mut writer, &Message::Hello { from: r.me })
        .await
        .map_err(|e| e.to_string())?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Message>();
    let read_task = tokio::spawn(async move {
        loop {
            match read_message(&mut reader).await {
                Ok(Some(m)) => {
                    if tx.send(m).is_err() {
                        return;
                    }
                }
                _ => return,
            }
        }
    });
    let result = pump(r, follower, &mut writer, &mut rx).await;
    read_task.abort();
    result
}

async fn pump(
    r: &Arc<Replication>,
    follower: i32,
    writer: &mut tokio::net::tcp::OwnedWriteHalf,
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<Message>,
) -> Result<(), String> {
    let mut written = r.log.subscribe_written();
    let mut stop = r.stop.subscribe();
    // Start where the follower was last durable; the first append probes
    // (a mismatch names its real end) and pipelining starts once it lands.
    let (mut seq, mut pos) = {
        let p = r.progress.lock()[&follower];
        (p.seq, p.durable)
    };
    let mut synced = false;
    let mut probing = false;
    let mut acked = pos;
    // Set when the follower asked to retry later (its image is behind).
    let mut paused_until: Option<tokio::time::Instant> = None;
    loop {
        if r.stopped() {
            return Ok(());
        }
        if paused_until.is_some_and(|t| tokio::time::Instant::now() >= t) {
            paused_until = None;
        }
        // Send what we may.
        while !probing && paused_until.is_none() && pos.saturating_sub(acked) < WINDOW_BYTES {
            let chunk = match r.log.frames(seq, pos, CHUNK_BYTES) {
                Ok(Some(c)) => c,
                Ok(None) => return Ok(()), // the log no longer holds the segment
                Err(e) => return Err(e.to_string()),
            };
            if chunk.bytes.is_empty() {
                if chunk.sealed
                    && pos >= chunk.segment_size
                    && r.log.position_of(seq + 1, 0).is_some()
                {
                    // Rolled: the next segment starts at 0 on the follower too.
                    seq += 1;
                    pos = 0;
                    acked = 0;
                    synced = false;
                    continue;
                }
                break;
            }
            let len = chunk.bytes.len() as u64;
            let msg = Message::Append {
                segment: SegmentKey {
                    range: r.range,
                    seq,
                },
                position: pos,
                frames: chunk.bytes,
            };
            write_message(writer, &msg)
                .await
                .map_err(|e| e.to_string())?;
            pos += len;
            if !synced {
                probing = true;
            }
        }
        tokio::select! {
            m = rx.recv() => match m {
                None => return Err("connection closed".into()),
                Some(Message::Ack { segment, durable }) => {
                    if segment.seq == seq {
                        acked = acked.max(durable);
                        synced = true;
                        probing = false;
                    }
                    r.acked(follower, segment.seq, durable);
                }
                Some(Message::Mismatch { segment, end }) => {
                    if segment.seq == seq {
                        pos = end;
                        acked = end;
                        synced = false;
                        probing = false;
                    }
                }
                Some(Message::Refused { retry: true, reason, segment }) => {
                    // Typically a segment the follower's image does not
                    // hold yet (its roll is recorded once the previous
                    // segment is committed). The connection stays: acks
                    // still in flight for earlier data must arrive.
                    if segment.seq == seq {
                        tracing::debug!(range = r.range, follower, seq, %reason, "follower not ready; retrying shortly");
                        pos = acked;
                        synced = false;
                        probing = false;
                        paused_until = Some(tokio::time::Instant::now() + REFUSED_PAUSE);
                    }
                }
                Some(Message::Refused { retry: false, reason, segment }) => {
                    if segment.seq == seq && r.log.position_of(seq + 1, 0).is_some() {
                        // A rolled segment whose seal the follower saw
                        // before the rest of its stream (it repairs the
                        // tail from a peer): go on with the next one.
                        tracing::debug!(range = r.range, follower, seq, %reason, "follower has the rolled segment sealed; moving on");
                        seq += 1;
                        pos = 0;
                        acked = 0;
                        synced = false;
                        probing = false;
                        continue;
                    }
                    tracing::info!(range = r.range, follower, seq = segment.seq, %reason, "follower refused the segment");
                    return Ok(());
                }
                Some(other) => return Err(format!("unexpected {other:?}")),
            },
            changed = written.changed() => if changed.is_err() { return Ok(()) },
            _ = stop.changed() => return Ok(()),
            // A roll or a missed wakeup: look again now and then.
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}
