//! `<seq>.aborted`: the aborted transactions of a range's history before
//! segment `seq`, every partition's (what Kafka's transaction indexes of the
//! segments before it hold), written by a replicated range's primary next to
//! `<seq>.snapshot`.
//!
//! A broker that holds the range's segments rebuilds this from their
//! indexes; a replica that joined the range later does not hold them, and
//! would otherwise answer read_committed fetches of that history (served
//! from other replicas' copies) with no aborted transaction. It fetches
//! this file with the snapshot; the range log's reload adds its entries to
//! what the local segments give.
//!
//! Layout (big-endian): `[version i16 = 1][crc32c u32 of everything after
//! it][count u32]` then per entry `[partition u32][producer id i64][first
//! offset i64][last offset i64]`, in marker order per partition.

use std::path::{Path, PathBuf};

use crate::error::LogError;
use crate::producer_snapshot_file::CorruptSnapshot;
use crate::txn_state::{AbortedTxn, TxnState};

const VERSION: i16 = 1;
const HEADER_LEN: usize = 2 + 4 + 4;
const ENTRY_LEN: usize = 4 + 8 + 8 + 8;

pub fn aborted_path(dir: &Path, seq: u32) -> PathBuf {
    dir.join(format!("{seq:010}.aborted"))
}

pub fn encode(entries: &[(u32, AbortedTxn)]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(HEADER_LEN + entries.len() * ENTRY_LEN);
    buf.extend_from_slice(&VERSION.to_be_bytes());
    buf.extend_from_slice(&0u32.to_be_bytes());
    buf.extend_from_slice(&(entries.len() as u32).to_be_bytes());
    for (partition, a) in entries {
        buf.extend_from_slice(&partition.to_be_bytes());
        buf.extend_from_slice(&a.producer_id.to_be_bytes());
        buf.extend_from_slice(&a.first_offset.to_be_bytes());
        buf.extend_from_slice(&a.last_offset.to_be_bytes());
    }
    let crc = crc32c::crc32c(&buf[6..]);
    buf[2..6].copy_from_slice(&crc.to_be_bytes());
    buf
}

pub fn decode(buf: &[u8]) -> Result<Vec<(u32, AbortedTxn)>, CorruptSnapshot> {
    if buf.len() < HEADER_LEN {
        return Err(CorruptSnapshot("truncated"));
    }
    if i16::from_be_bytes([buf[0], buf[1]]) != VERSION {
        return Err(CorruptSnapshot("unknown version"));
    }
    let crc = u32::from_be_bytes(buf[2..6].try_into().expect("4 bytes"));
    if crc32c::crc32c(&buf[6..]) != crc {
        return Err(CorruptSnapshot("CRC mismatch"));
    }
    let count = u32::from_be_bytes(buf[6..10].try_into().expect("4 bytes")) as usize;
    let body = &buf[HEADER_LEN..];
    if count.checked_mul(ENTRY_LEN) != Some(body.len()) {
        return Err(CorruptSnapshot("length does not match the count"));
    }
    let i64_at = |b: &[u8], at: usize| i64::from_be_bytes(b[at..at + 8].try_into().expect("8"));
    let entries: Vec<(u32, AbortedTxn)> = body
        .chunks_exact(ENTRY_LEN)
        .map(|e| {
            (
                u32::from_be_bytes(e[0..4].try_into().expect("4 bytes")),
                AbortedTxn {
                    producer_id: i64_at(e, 4),
                    first_offset: i64_at(e, 12),
                    last_offset: i64_at(e, 20),
                },
            )
        })
        .collect();
    if entries
        .iter()
        .any(|(_, a)| a.producer_id < 0 || a.first_offset < 0 || a.first_offset > a.last_offset)
    {
        return Err(CorruptSnapshot("invalid aborted transaction"));
    }
    Ok(entries)
}

/// Writes `<seq>.aborted` atomically from every partition's aborted
/// transactions (index `p - lo`); written even when there are none, so a
/// replica fetching it can tell "none" from "not written".
pub(crate) fn write(dir: &Path, seq: u32, lo: u32, txns: &[TxnState]) -> Result<(), LogError> {
    let entries: Vec<(u32, AbortedTxn)> = txns
        .iter()
        .enumerate()
        .flat_map(|(i, t)| t.aborted().iter().map(move |a| (lo + i as u32, *a)))
        .collect();
    Ok(tessera_fs::write_atomic(
        &aborted_path(dir, seq),
        &encode(&entries),
    )?)
}

/// The entries of `<seq>.aborted`, or none when it is absent or corrupt
/// (logged: the history's aborted transactions are then unknown here).
pub(crate) fn read(dir: &Path, seq: u32) -> Vec<(u32, AbortedTxn)> {
    let path = aborted_path(dir, seq);
    match std::fs::read(&path) {
        Ok(bytes) => decode(&bytes).unwrap_or_else(|e| {
            tracing::warn!(path = %path.display(), error = %e, "skipping aborted-transaction file");
            Vec::new()
        }),
        Err(_) => Vec::new(),
    }
}

fn seq_of(name: &std::ffi::OsStr) -> Option<u32> {
    name.to_string_lossy()
        .strip_suffix(".aborted")
        .and_then(|stem| stem.parse::<u32>().ok())
}

/// The segments that have a `<seq>.aborted` file in `dir`, ascending.
pub(crate) fn list(dir: &Path) -> Result<Vec<u32>, LogError> {
    let mut seqs = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        seqs.extend(seq_of(&entry?.file_name()));
    }
    seqs.sort_unstable();
    Ok(seqs)
}

/// Deletes the `<seq>.aborted` files whose segment `keep` rejects.
pub(crate) fn remove_unless(dir: &Path, keep: impl Fn(u32) -> bool) -> Result<(), LogError> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let seq = seq_of(&entry.file_name());
        if seq.is_some_and(|seq| !keep(seq)) {
            match std::fs::remove_file(entry.path()) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                _ => {}
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_damage() {
        let entries = vec![
            (
                0,
                AbortedTxn {
                    producer_id: 9,
                    first_offset: 5,
                    last_offset: 7,
                },
            ),
            (
                3,
                AbortedTxn {
                    producer_id: 1,
                    first_offset: 0,
                    last_offset: 2,
                },
            ),
        ];
        let bytes = encode(&entries);
        assert_eq!(decode(&bytes).unwrap(), entries);
        assert_eq!(decode(&encode(&[])).unwrap(), vec![]);
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err());
        }
        let mut flipped = bytes.clone();
        flipped[20] ^= 1;
        assert!(decode(&flipped).is_err());
    }
}
