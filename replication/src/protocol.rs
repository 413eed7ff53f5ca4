//! The wire form of replication between brokers.
//!
//! A stream starts on a broker's inter-broker listener, once the
//! connection has authenticated as that listener asks (see [`crate::auth`]),
//! with one private request (api key [`UPGRADE_API_KEY`]) which the
//! listener accepts only from a principal allowed CLUSTER_ACTION (a
//! broker's). A primary's stream then opens with `Hello` naming the
//! calling broker, which must be registered. It carries frames
//! `[length u32][kind u8][payload]`, big-endian, capped at
//! [`MAX_FRAME_BYTES`]. The primary pushes `Append`s in order, pipelined;
//! the follower answers `Ack` (durable end) or `Mismatch` (resend from its
//! end) or `Refused`. `Fence` → `Fenced`, `Read` → `Data` and
//! `ReadSnapshot` → `SnapshotData` are one-shot exchanges of the seal, the
//! repair and a joining follower's producer state.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::auth::{Connector, PeerStream};

/// The Kafka api key that turns a Kafka connection into a replication
/// stream (outside Kafka's range of api keys, so no client sends it).
pub const UPGRADE_API_KEY: i16 = 0x7e01;
/// The largest frame either side sends or accepts.
pub const MAX_FRAME_BYTES: usize = 64 << 20;

/// One segment of one range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SegmentKey {
    pub range: u64,
    pub seq: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// First frame of a stream: who is calling.
    Hello {
        from: i32,
    },
    /// Primary → follower: stored frames starting at `position` of the
    /// segment, written by the primary's log of leader epoch `epoch` (a
    /// follower takes them only for the segment its image records with
    /// that epoch: a zombie primary's own roll of the same sequence number
    /// is another segment).
    Append {
        segment: SegmentKey,
        epoch: i32,
        position: u64,
        frames: Bytes,
    },
    /// Follower → primary: the follower's copy is durable up to `durable`.
    Ack {
        segment: SegmentKey,
        durable: u64,
    },
    /// Follower → primary: not at my end; resend from `end`.
    Mismatch {
        segment: SegmentKey,
        end: u64,
    },
    /// The segment is fenced, sealed or unknown here; `retry` when it may
    /// become known (the follower's metadata is behind).
    Refused {
        segment: SegmentKey,
        retry: bool,
        reason: String,
    },
    /// Controller → replica: fence the segment, as the fencer's image
    /// records it with leader epoch `epoch`, and report the durable end. A
    /// replica whose copy or log of that sequence number belongs to another
    /// epoch refuses and changes nothing.
    Fence {
        segment: SegmentKey,
        epoch: i32,
    },
    /// The replica's durable end, and per partition the offsets its copy
    /// holds up to there `(partition, start, end exclusive)`.
    Fenced {
        segment: SegmentKey,
        end: u64,
        spans: Vec<(u32, i64, i64)>,
    },
    /// Repair: up to `max` bytes of the replica's copy from `from`, as of
    /// cleaning pass `pass` (the image's for the segment; 0: never
    /// cleaned) and leader epoch `epoch` (the image's for the segment). A
    /// replica whose copy is at another pass refuses, and so does one whose
    /// own log wrote that sequence number at an older epoch (a zombie
    /// primary's unrecorded roll: other bytes under the same number).
    Read {
        segment: SegmentKey,
        from: u64,
        max: u32,
        pass: u64,
        epoch: i32,
    },
    Data {
        segment: SegmentKey,
        position: u64,
        frames: Bytes,
    },
    /// Whether the replica holds all `size` bytes of the sealed `segment`
    /// (leader epoch `epoch`, cleaning pass `pass`, as the asker's image
    /// records it): asked by a broker healing replaced before it deletes
    /// its own, no longer listed copy.
    ReadCopyState {
        segment: SegmentKey,
        pass: u64,
        epoch: i32,
        size: u64,
    },
    CopyState {
        segment: SegmentKey,
        complete: bool,
    },
    /// A follower that does not hold the segments before `segment`: the
    /// producer snapshot where `segment` starts (`<seq>.snapshot`).
    ReadSnapshot {
        segment: SegmentKey,
    },
    /// The snapshot file's bytes, as its primary wrote them (a file with no
    /// section when no producer had state there), and the aborted
    /// transactions of the history before it (`<seq>.aborted`; empty when
    /// the replica has none). A replica without the snapshot answers
    /// `Refused`.
    SnapshotData {
        segment: SegmentKey,
        bytes: Bytes,
        aborted: Bytes,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("malformed replication frame: {0}")]
    Malformed(&'static str),
    #[error("replication frame of {0} bytes exceeds the limit")]
    TooLarge(usize),
    #[error("refused by the peer: {0}")]
    Refused(String),
    /// A producer snapshot taken at another offset than where its segment
    /// starts (`snapshot_transfer::taken_at_start`).
    #[error("the producer snapshot was taken at another offset than where the segment starts")]
    SnapshotNotAtStart,
}

const HELLO: u8 = 1;
const APPEND: u8 = 2;
const ACK: u8 = 3;
const MISMATCH: u8 = 4;
const REFUSED: u8 = 5;
const FENCE: u8 = 6;
const FENCED: u8 = 7;
const READ: u8 = 8;
const DATA: u8 = 9;
const READ_SNAPSHOT: u8 = 10;
const SNAPSHOT_DATA: u8 = 11;
const READ_COPY_STATE: u8 = 12;
const COPY_STATE: u8 = 13;

fn put_segment(b: &mut BytesMut, s: &SegmentKey) {
    b.put_u64(s.range);
    b.put_u32(s.seq);
}

impl Message {
    /// The complete frame, length prefix included.
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(64);
        b.put_u32(0);
        match self {
            Message::Hello { from } => {
                b.put_u8(HELLO);
                b.put_i32(*from);
            }
            Message::Append {
                segment,
                epoch,
                position,
                frames,
            } => {
                b.put_u8(APPEND);
                put_segment(&mut b, segment);
                b.put_i32(*epoch);
                b.put_u64(*position);
                b.extend_from_slice(frames);
            }
            Message::Data {
                segment,
                position,
                frames,
            } => {
                b.put_u8(DATA);
                put_segment(&mut b, segment);
                b.put_u64(*position);
                b.extend_from_slice(frames);
            }
            Message::Ack { segment, durable } => {
                b.put_u8(ACK);
                put_segment(&mut b, segment);
                b.put_u64(*durable);
            }
            Message::Mismatch { segment, end } => {
                b.put_u8(MISMATCH);
                put_segment(&mut b, segment);
                b.put_u64(*end);
            }
            Message::Refused {
                segment,
                retry,
                reason,
            } => {
                b.put_u8(REFUSED);
                put_segment(&mut b, segment);
                b.put_u8(*retry as u8);
                b.extend_from_slice(reason.as_bytes());
            }
            Message::Fence { segment, epoch } => {
                b.put_u8(FENCE);
                put_segment(&mut b, segment);
                b.put_i32(*epoch);
            }
            Message::Fenced {
                segment,
                end,
                spans,
            } => {
                b.put_u8(FENCED);
                put_segment(&mut b, segment);
                b.put_u64(*end);
                b.put_u32(spans.len() as u32);
                for (p, start, end) in spans {
                    b.put_u32(*p);
                    b.put_i64(*start);
                    b.put_i64(*end);
                }
            }
            Message::Read {
                segment,
                from,
                max,
                pass,
                epoch,
            } => {
                b.put_u8(READ);
                put_segment(&mut b, segment);
                b.put_u64(*from);
                b.put_u32(*max);
                b.put_u64(*pass);
                b.put_i32(*epoch);
            }
            Message::ReadSnapshot { segment } => {
                b.put_u8(READ_SNAPSHOT);
                put_segment(&mut b, segment);
            }
            Message::ReadCopyState {
                segment,
                pass,
                epoch,
                size,
            } => {
                b.put_u8(READ_COPY_STATE);
                put_segment(&mut b, segment);
                b.put_u64(*pass);
                b.put_i32(*epoch);
                b.put_u64(*size);
            }
            Message::CopyState { segment, complete } => {
                b.put_u8(COPY_STATE);
                put_segment(&mut b, segment);
                b.put_u8(*complete as u8);
            }
            Message::SnapshotData {
                segment,
                bytes,
                aborted,
            } => {
                b.put_u8(SNAPSHOT_DATA);
                put_segment(&mut b, segment);
                b.put_u32(bytes.len() as u32);
                b.extend_from_slice(bytes);
                b.extend_from_slice(aborted);
            }
        }
        let len = (b.len() - 4) as u32;
        b[0..4].copy_from_slice(&len.to_be_bytes());
        b.freeze()
    }

    /// Decodes a frame body (without its length prefix).
    pub fn decode(mut body: Bytes) -> Result<Message, ProtocolError> {
        fn need(b: &Bytes, n: usize) -> Result<(), ProtocolError> {
            if b.remaining() < n {
                Err(ProtocolError::Malformed("frame too short"))
            } else {
                Ok(())
            }
        }
        fn segment(b: &mut Bytes) -> Result<SegmentKey, ProtocolError> {
            need(b, 12)?;
            Ok(SegmentKey {
                range: b.get_u64(),
                seq: b.get_u32(),
            })
        }
        need(&body, 1)?;
        let kind = body.get_u8();
        let msg = match kind {
            HELLO => {
                need(&body, 4)?;
                Message::Hello {
                    from: body.get_i32(),
                }
            }
            APPEND => {
                let segment = segment(&mut body)?;
                need(&body, 12)?;
                let epoch = body.get_i32();
                let position = body.get_u64();
                Message::Append {
                    segment,
                    epoch,
                    position,
                    frames: body.split_to(body.len()),
                }
            }
            DATA => {
                let segment = segment(&mut body)?;
                need(&body, 8)?;
                let position = body.get_u64();
                Message::Data {
                    segment,
                    position,
                    frames: body.split_to(body.len()),
                }
            }
            FENCED => {
                let segment = segment(&mut body)?;
                need(&body, 12)?;
                let end = body.get_u64();
                let n = body.get_u32() as usize;
                need(
                    &body,
                    n.checked_mul(20)
                        .ok_or(ProtocolError::Malformed("span count"))?,
                )?;
                let spans = (0..n)
                    .map(|_| (body.get_u32(), body.get_i64(), body.get_i64()))
                    .collect();
                Message::Fenced {
                    segment,
                    end,
                    spans,
                }
            }
            ACK | MISMATCH => {
                let segment = segment(&mut body)?;
                need(&body, 8)?;
                let v = body.get_u64();
                if kind == ACK {
                    Message::Ack {
                        segment,
                        durable: v,
                    }
                } else {
                    Message::Mismatch { segment, end: v }
                }
            }
            REFUSED => {
                let segment = segment(&mut body)?;
                need(&body, 1)?;
                let retry = body.get_u8() != 0;
                let reason = String::from_utf8_lossy(&body).into_owned();
                body.advance(body.len());
                Message::Refused {
                    segment,
                    retry,
                    reason,
                }
            }
            FENCE => {
                let segment = segment(&mut body)?;
                need(&body, 4)?;
                Message::Fence {
                    segment,
                    epoch: body.get_i32(),
                }
            }
            READ_SNAPSHOT => Message::ReadSnapshot {
                segment: segment(&mut body)?,
            },
            READ_COPY_STATE => {
                let segment = segment(&mut body)?;
                need(&body, 20)?;
                Message::ReadCopyState {
                    segment,
                    pass: body.get_u64(),
                    epoch: body.get_i32(),
                    size: body.get_u64(),
                }
            }
            COPY_STATE => {
                let segment = segment(&mut body)?;
                need(&body, 1)?;
                Message::CopyState {
                    segment,
                    complete: body.get_u8() != 0,
                }
            }
            SNAPSHOT_DATA => {
                let segment = segment(&mut body)?;
                need(&body, 4)?;
                let len = body.get_u32() as usize;
                need(&body, len)?;
                let bytes = body.split_to(len);
                Message::SnapshotData {
                    segment,
                    bytes,
                    aborted: body.split_to(body.len()),
                }
            }
            READ => {
                let segment = segment(&mut body)?;
                need(&body, 24)?;
                Message::Read {
                    segment,
                    from: body.get_u64(),
                    max: body.get_u32(),
                    pass: body.get_u64(),
                    epoch: body.get_i32(),
                }
            }
            _ => return Err(ProtocolError::Malformed("unknown message kind")),
        };
        if body.has_remaining() {
            return Err(ProtocolError::Malformed("trailing bytes"));
        }
        Ok(msg)
    }
}

/// The Kafka request that turns a connection into a replication stream
/// (header v1: api key, version 0, correlation id, null client id), to be
/// followed by the stream's first message.
pub fn upgrade_request() -> Vec<u8> {
    let mut b = Vec::with_capacity(14);
    b.extend_from_slice(&10u32.to_be_bytes());
    b.extend_from_slice(&UPGRADE_API_KEY.to_be_bytes());
    b.extend_from_slice(&0i16.to_be_bytes());
    b.extend_from_slice(&0i32.to_be_bytes());
    b.extend_from_slice(&(-1i16).to_be_bytes());
    b
}

/// Connects to a broker's Kafka listener at `addr` within `timeout`,
/// authenticated by `connector` as the inter-broker listener asks, and
/// upgrades the connection to a replication stream.
pub async fn connect(
    connector: &dyn Connector,
    addr: &str,
    timeout: std::time::Duration,
) -> Result<PeerStream, ProtocolError> {
    let mut conn = match tokio::time::timeout(timeout, connector.connect(addr)).await {
        Ok(c) => c?,
        Err(_) => {
            return Err(ProtocolError::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("connect to {addr} timed out"),
            )))
        }
    };
    conn.write_all(&upgrade_request()).await?;
    Ok(conn)
}

/// Reads one message; `Ok(None)` at a clean end of stream.
pub async fn read_message<R: AsyncRead + Unpin>(
    r: &mut R,
) -> Result<Option<Message>, ProtocolError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(ProtocolError::TooLarge(len));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    Message::decode(Bytes::from(body)).map(Some)
}

pub async fn write_message<W: AsyncWrite + Unpin>(
    w: &mut W,
    msg: &Message,
) -> Result<(), ProtocolError> {
    w.write_all(&msg.encode()).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_round_trips() {
        let s = SegmentKey { range: 7, seq: 3 };
        let all = [
            Message::Hello { from: 2 },
            Message::Append {
                segment: s,
                epoch: 4,
                position: 99,
                frames: Bytes::from_static(b"abc"),
            },
            Message::Ack {
                segment: s,
                durable: 5,
            },
            Message::Mismatch { segment: s, end: 4 },
            Message::Refused {
                segment: s,
                retry: true,
                reason: "behind".into(),
            },
            Message::Fence {
                segment: s,
                epoch: 2,
            },
            Message::Fenced {
                segment: s,
                end: 11,
                spans: vec![(0, 1, 5), (3, 0, 2)],
            },
            Message::Read {
                segment: s,
                from: 1,
                max: 1 << 20,
                pass: 3,
                epoch: 4,
            },
            Message::Data {
                segment: s,
                position: 0,
                frames: Bytes::new(),
            },
            Message::ReadSnapshot { segment: s },
            Message::ReadCopyState {
                segment: s,
                pass: 2,
                epoch: 5,
                size: 1 << 20,
            },
            Message::CopyState {
                segment: s,
                complete: true,
            },
            Message::SnapshotData {
                segment: s,
                bytes: Bytes::from_static(b"\0\x01snapshot"),
                aborted: Bytes::from_static(b"aborted"),
            },
            Message::SnapshotData {
                segment: s,
                bytes: Bytes::new(),
                aborted: Bytes::new(),
            },
        ];
        for m in all {
            let frame = m.encode();
            let back = Message::decode(frame.slice(4..)).unwrap();
            assert_eq!(back, m);
        }
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for body in [
            &b""[..],
            b"\x02\x00",
            b"\xff",
            b"\x03\0\0\0\0\0\0\0\x01\0\0\0\x01",
            b"\x0a\0\0\0\0\0\0\0\x01\0\0\0",
            b"\x0a\0\0\0\0\0\0\0\x01\0\0\0\x01\0",
            b"\x0b\0\0",
            // A Fence without its epoch, an Append without its position.
            b"\x06\0\0\0\0\0\0\0\x01\0\0\0\x01",
            b"\x02\0\0\0\0\0\0\0\x01\0\0\0\x01\0\0\0\x02",
            b"\x0b\0\0\0\0\0\0\0\x01\0\0\0\x01\0\0\0\x05ab",
        ] {
            assert!(Message::decode(Bytes::copy_from_slice(body)).is_err());
        }
    }
}
