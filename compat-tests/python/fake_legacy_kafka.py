"""A tiny fake Kafka broker serving one partition whose log holds legacy
message sets (message format v0 and v1, as a cluster upgraded from Kafka
0.8-0.10 still stores them) next to a v2 batch, for `tessera migrate`.

No Kafka broker here stores v0/v1 data any more (tessera and tansu refuse
magic < 2 on produce), so the frames are built by hand. It answers exactly
what the migrator asks a source, at the lowest versions the migrator
speaks: ApiVersions v0, Metadata v1, ListOffsets v2, Fetch v4 and
DescribeConfigs v1. A fetch returns the stored entries (a compressed
wrapper whole, even when the fetch offset lies inside it, as Kafka does)
at most `per_fetch` at a time, followed by the first bytes of the next
entry (a partial entry, as Kafka's fetch may end with).
"""

from __future__ import annotations

import asyncio
import gzip
import struct
import threading
import zlib
from dataclasses import dataclass, field

import lz4.frame
import snappy

# ---------------------------------------------------------------- frames


def _bytes(b: bytes | None) -> bytes:
    return struct.pack(">i", -1) if b is None else struct.pack(">i", len(b)) + b


def _str(s: str | None) -> bytes:
    if s is None:
        return struct.pack(">h", -1)
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def message(offset: int, magic: int, key: bytes | None, value: bytes | None,
            timestamp: int = -1, attributes: int = 0) -> bytes:
    """One legacy message: offset, size, CRC-32, magic, attributes,
    [timestamp], key, value."""
    body = struct.pack(">bb", magic, attributes)
    if magic == 1:
        body += struct.pack(">q", timestamp)
    body += _bytes(key) + _bytes(value)
    body = struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF) + body
    return struct.pack(">qi", offset, len(body)) + body


def _xerial_snappy(data: bytes) -> bytes:
    out = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    for i in range(0, len(data), 32 * 1024):
        block = snappy.compress(data[i:i + 32 * 1024])
        out += struct.pack(">i", len(block)) + block
    return out


def _xxh32_small(data: bytes) -> int:
    """xxHash32, seed 0, of fewer than 16 bytes (an LZ4 frame descriptor)."""
    p1, p2, p3, p4, p5 = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F, 0x165667B1
    m = 0xFFFFFFFF
    rotl = lambda x, r: ((x << r) | (x >> (32 - r))) & m  # noqa: E731
    h = (p5 + len(data)) & m
    i = 0
    while i + 4 <= len(data):
        h = (rotl((h + int.from_bytes(data[i:i + 4], "little") * p3) & m, 17) * p4) & m
        i += 4
    for b in data[i:]:
        h = (rotl((h + b * p5) & m, 11) * p1) & m
    h ^= h >> 15
    h = (h * p2) & m
    h ^= h >> 13
    h = (h * p3) & m
    h ^= h >> 16
    return h


def _kafka_v0_lz4(data: bytes) -> bytes:
    """An LZ4 frame with Kafka's v0 header checksum (KAFKA-3160: computed
    over the magic number and the descriptor)."""
    frame = bytearray(lz4.frame.compress(data, content_checksum=False,
                                         store_size=False, block_linked=False))
    assert frame[4] & 0x09 == 0  # no content size, no dictionary id
    frame[6] = (_xxh32_small(bytes(frame[0:6])) >> 8) & 0xFF
    return bytes(frame)


def wrapper(offset: int, magic: int, codec: int, inner: list[bytes],
            timestamp: int = -1, log_append_time: bool = False) -> bytes:
    """A compressed wrapper message holding `inner` (already framed, with
    the offsets the format wants inside: absolute for v0, relative for v1)."""
    data = b"".join(inner)
    if codec == 1:
        value = gzip.compress(data)
    elif codec == 2:
        value = _xerial_snappy(data)
    elif codec == 3:
        value = _kafka_v0_lz4(data) if magic == 0 else lz4.frame.compress(
            data, content_checksum=False, store_size=False, block_linked=False)
    else:
        raise ValueError(codec)
    attributes = codec | (0x08 if log_append_time else 0)
    return message(offset, magic, None, value, timestamp, attributes)


_CRC32C_TABLE = []
for _n in range(256):
    _c = _n
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _CRC32C_TABLE.append(_c)


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c = _CRC32C_TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _varint(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = b""
    while True:
        if z < 0x80:
            return out + bytes([z])
        out += bytes([(z & 0x7F) | 0x80])
        z >>= 7


def _vbytes(b: bytes | None) -> bytes:
    return _varint(-1) if b is None else _varint(len(b)) + b


def v2_batch(base: int, records: list[tuple[int, int, bytes | None, bytes | None, list]]) -> bytes:
    """An uncompressed v2 batch of (offset, timestamp, key, value, headers)."""
    first_ts = records[0][1]
    body = b""
    for off, ts, key, value, headers in records:
        r = struct.pack(">b", 0) + _varint(ts - first_ts) + _varint(off - base)
        r += _vbytes(key) + _vbytes(value) + _varint(len(headers))
        for hk, hv in headers:
            r += _vbytes(hk) + _vbytes(hv)
        body += _varint(len(r)) + r
    after_crc = struct.pack(">hiqqqhii", 0, records[-1][0] - base, first_ts,
                            max(r[1] for r in records), -1, -1, -1, len(records)) + body
    rest = struct.pack(">ibI", 0, 2, crc32c(after_crc)) + after_crc
    return struct.pack(">qi", base, len(rest)) + rest


# ---------------------------------------------------------------- the log


@dataclass
class Entry:
    last_offset: int
    data: bytes


def legacy_partition(tamper: bool = False) -> tuple[list[Entry], list[tuple]]:
    """The stored entries and the records they hold, as
    (offset, key, value, timestamp, headers): v0 messages, v1 messages,
    a gap, a v1 gzip wrapper (CreateTime, relative offsets), a v0 lz4 wrapper
    with Kafka's v0 framing, a v1 snappy wrapper under LogAppendTime, a v2
    batch, then v1 messages again. `tamper` changes one value (with a valid
    CRC: a different record, not a corrupt one)."""
    entries, expect = [], []

    def add(data: bytes, records: list[tuple]):
        entries.append(Entry(records[-1][0], data))
        expect.extend(records)

    add(message(0, 0, b"k0", b"v0-a"), [(0, b"k0", b"v0-a", -1, [])])
    add(message(1, 0, None, b"v0-b"), [(1, None, b"v0-b", -1, [])])
    add(message(2, 1, b"k2", b"v1-a", 1_600_000_000_002), [(2, b"k2", b"v1-a", 1_600_000_000_002, [])])
    add(message(3, 1, b"k3", b"tampered" if tamper else b"v1-b", 1_600_000_000_003),
        [(3, b"k3", b"tampered" if tamper else b"v1-b", 1_600_000_000_003, [])])
    # 4: a gap (compacted away). 5..7 in a gzip v1 wrapper at offset 7.
    inner = [(0, b"k5", b"gz-5", 1_600_000_000_005), (1, b"k6", b"gz-6", 1_600_000_000_006),
             (2, b"k7", b"gz-7", 1_600_000_000_007)]
    add(wrapper(7, 1, 1, [message(r, 1, k, v, t) for r, k, v, t in inner], 1_600_000_000_007),
        [(5 + r, k, v, t, []) for r, k, v, t in inner])
    # 8..9 in a v0 lz4 wrapper (absolute inner offsets).
    add(wrapper(9, 0, 3, [message(8, 0, b"k8", b"lz-8"), message(9, 0, b"k9", b"lz-9")]),
        [(8, b"k8", b"lz-8", -1, []), (9, b"k9", b"lz-9", -1, [])])
    # 10..11 in a v1 snappy wrapper under LogAppendTime: the wrapper's time.
    add(wrapper(11, 1, 2, [message(0, 1, b"k10", b"sn-10", 5), message(1, 1, b"k11", b"sn-11", 6)],
                1_600_000_000_011, log_append_time=True),
        [(10, b"k10", b"sn-10", 1_600_000_000_011, []), (11, b"k11", b"sn-11", 1_600_000_000_011, [])])
    # 12..13 a v2 batch (a header), after the upgrade to 0.11.
    v2 = [(12, 1_700_000_000_012, b"k12", b"v2-12", [(b"h", b"1")]),
          (13, 1_700_000_000_013, b"k13", None, [])]
    add(v2_batch(12, v2), [(o, k, v, t, h) for o, t, k, v, h in v2])
    # 15: after another gap, a v1 message (a client still writing v1).
    add(message(15, 1, b"k15", b"v1-c", 1_700_000_000_015), [(15, b"k15", b"v1-c", 1_700_000_000_015, [])])
    return entries, expect


def more_legacy(start: int, n: int) -> tuple[list[Entry], list[tuple]]:
    """n more records from offset `start` as a source still written by old
    clients stores them: v1 gzip wrappers of three, then v0 messages."""
    entries, expect = [], []
    at = start
    while at < start + n:
        count = min(3, start + n - at)
        if count == 3:
            inner = [(r, f"k{at + r}".encode(), f"more-{at + r}".encode(), 1_700_000_000_000 + at + r)
                     for r in range(3)]
            entries.append(Entry(at + 2, wrapper(at + 2, 1, 1, [message(r, 1, k, v, t) for r, k, v, t in inner],
                                                 1_700_000_000_000 + at + 2)))
            expect.extend((at + r, k, v, t, []) for r, k, v, t in inner)
        else:
            for o in range(at, at + count):
                entries.append(Entry(o, message(o, 0, f"k{o}".encode(), f"more-{o}".encode())))
                expect.append((o, f"k{o}".encode(), f"more-{o}".encode(), -1, []))
        at += count
    return entries, expect


# ---------------------------------------------------------------- server

API_VERSIONS, METADATA, LIST_OFFSETS, FETCH, DESCRIBE_CONFIGS = 18, 3, 2, 1, 32
SERVED = {API_VERSIONS: (0, 0), METADATA: (1, 1), LIST_OFFSETS: (2, 2), FETCH: (4, 4),
          DESCRIBE_CONFIGS: (1, 1)}


class _Reader:
    def __init__(self, b: bytes):
        self.b, self.at = b, 0

    def take(self, fmt: str):
        v = struct.unpack_from(fmt, self.b, self.at)
        self.at += struct.calcsize(fmt)
        return v[0] if len(v) == 1 else v

    def string(self) -> str | None:
        n = self.take(">h")
        if n < 0:
            return None
        s = self.b[self.at:self.at + n].decode()
        self.at += n
        return s


@dataclass
class FakeLegacyKafka:
    topic: str
    entries: list[Entry]
    per_fetch: int = 3
    host: str = "127.0.0.1"
    port: int = 0
    requests: list = field(default_factory=list)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def high_watermark(self) -> int:
        return self.entries[-1].last_offset + 1

    def start(self) -> "FakeLegacyKafka":
        ready = threading.Event()
        self.loop = asyncio.new_event_loop()

        async def serve():
            self.server = await asyncio.start_server(self._client, self.host, self.port)
            self.port = self.server.sockets[0].getsockname()[1]
            ready.set()

        self.thread = threading.Thread(target=self._run, args=(serve,), daemon=True)
        self.thread.start()
        ready.wait(10)
        return self

    def _run(self, serve):
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(serve())
        self.loop.run_forever()

    def stop(self):
        def close():
            self.server.close()
            self.loop.stop()
        self.loop.call_soon_threadsafe(close)
        self.thread.join(10)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        try:
            while True:
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                frame = _Reader(await reader.readexactly(size))
                key, version, correlation = frame.take(">hhi")
                frame.string()  # client id
                self.requests.append((key, version))
                body = self._answer(key, version, frame)
                out = struct.pack(">i", correlation) + body
                writer.write(struct.pack(">i", len(out)) + out)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def _answer(self, key: int, version: int, r: _Reader) -> bytes:
        lo, hi = SERVED.get(key, (1, 0))
        if not lo <= version <= hi:
            raise ConnectionError(f"api {key} v{version} not served")
        if key == API_VERSIONS:
            return struct.pack(">hi", 0, len(SERVED)) + b"".join(
                struct.pack(">hhh", k, a, b) for k, (a, b) in SERVED.items())
        if key == METADATA:
            brokers = struct.pack(">i", 1) + struct.pack(">i", 1) + _str(self.host) + \
                struct.pack(">i", self.port) + _str(None)
            partition = struct.pack(">hii", 0, 0, 1) + struct.pack(">ii", 1, 1) + struct.pack(">ii", 1, 1)
            topic = struct.pack(">h", 0) + _str(self.topic) + struct.pack(">?", False) + \
                struct.pack(">i", 1) + partition
            return brokers + struct.pack(">i", 1) + struct.pack(">i", 1) + topic
        if key == LIST_OFFSETS:
            r.take(">ib")  # replica id, isolation level
            out = b""
            topics = r.take(">i")
            out += struct.pack(">ii", 0, topics)
            for _ in range(topics):
                name = r.string()
                parts = r.take(">i")
                out += _str(name) + struct.pack(">i", parts)
                for _ in range(parts):
                    p, ts = r.take(">iq")
                    offset = 0 if ts == -2 else self.high_watermark
                    out += struct.pack(">ihqq", p, 0, -1, offset)
            return out
        if key == FETCH:
            r.take(">iiiib")  # replica, max wait, min bytes, max bytes, isolation
            topics = r.take(">i")
            out = struct.pack(">ii", 0, topics)
            for _ in range(topics):
                name = r.string()
                parts = r.take(">i")
                out += _str(name) + struct.pack(">i", parts)
                for _ in range(parts):
                    p, fetch_offset, _max = r.take(">iqi")
                    later = [e for e in self.entries if e.last_offset >= fetch_offset]
                    data = b"".join(e.data for e in later[:self.per_fetch])
                    if len(later) > self.per_fetch:
                        data += later[self.per_fetch].data[:20]  # a partial entry
                    hw = self.high_watermark
                    out += struct.pack(">ihqq", p, 0, hw, hw) + struct.pack(">i", -1) + _bytes(data)
            return out
        if key == DESCRIBE_CONFIGS:
            resources = r.take(">i")
            out = struct.pack(">ii", 0, resources)
            for _ in range(resources):
                rtype = r.take(">b")
                name = r.string()
                n = r.take(">i")
                for _ in range(max(n, 0)):
                    r.string()
                out += struct.pack(">h", 0) + _str(None) + struct.pack(">b", rtype) + _str(name) + \
                    struct.pack(">i", 0)
            return out
        raise ConnectionError(f"api {key}")
