//! Aborted transactions of a partition and Kafka's `.txnindex` files.
//!
//! Each ABORT marker appended to a partition records the aborted
//! transaction: producer id, first offset (its first data batch), last offset
//! (the marker) and the last stable offset when it was aborted. read_committed
//! fetches return the entries that overlap the fetched range, and clients
//! drop those producers' batches.
//!
//! On disk the entries go to the `.txnindex` of the segment holding the
//! marker, 34 bytes each, big-endian: version i16 (0), producerId i64,
//! firstOffset i64, lastOffset i64, lastStableOffset i64 — Kafka's layout, so
//! Kafka's tools read them. The entry of a live ABORT is appended after the
//! marker, off the reactor, so a crash can leave it unwritten. On start the
//! entries are loaded from every `.txnindex`, and the replay of the log tail
//! (from the producer snapshot) re-derives any entry that is missing; such an
//! entry is written back ([`rewrite`]) before the partition is served, since
//! the next snapshot, taken past the marker, ends the replay's reach.

use std::io::{self, Write};
use std::path::Path;

/// Bytes per `.txnindex` entry.
pub const ENTRY_BYTES: usize = 34;
const ENTRY_VERSION: i16 = 0;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AbortedTxn {
    pub producer_id: i64,
    pub first_offset: i64,
    pub last_offset: i64,
    pub last_stable_offset: i64,
}

impl AbortedTxn {
    pub fn encode(&self) -> [u8; ENTRY_BYTES] {
        let mut out = [0u8; ENTRY_BYTES];
        out[0..2].copy_from_slice(&ENTRY_VERSION.to_be_bytes());
        out[2..10].copy_from_slice(&self.producer_id.to_be_bytes());
        out[10..18].copy_from_slice(&self.first_offset.to_be_bytes());
        out[18..26].copy_from_slice(&self.last_offset.to_be_bytes());
        out[26..34].copy_from_slice(&self.last_stable_offset.to_be_bytes());
        out
    }

    pub fn decode(b: &[u8]) -> Option<AbortedTxn> {
        if b.len() < ENTRY_BYTES || i16::from_be_bytes([b[0], b[1]]) != ENTRY_VERSION {
            return None;
        }
        let i64_at = |at: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[at..at + 8]);
            i64::from_be_bytes(a)
        };
        Some(AbortedTxn {
            producer_id: i64_at(2),
            first_offset: i64_at(10),
            last_offset: i64_at(18),
            last_stable_offset: i64_at(26),
        })
    }
}

/// The aborted transactions of one partition, oldest first.
#[derive(Clone, Debug, Default)]
pub struct AbortedTxns {
    entries: Vec<AbortedTxn>,
}

impl AbortedTxns {
    /// Adds an entry unless the same (producer, first offset) is known.
    pub fn add(&mut self, e: AbortedTxn) -> bool {
        if self
            .entries
            .iter()
            .any(|x| x.producer_id == e.producer_id && x.first_offset == e.first_offset)
        {
            return false;
        }
        let at = self
            .entries
            .partition_point(|x| x.last_offset <= e.last_offset);
        self.entries.insert(at, e);
        true
    }

    /// Entries overlapping `[from, to)`: what a read_committed fetch of that
    /// range must carry, as `(producer id, first offset)`.
    pub fn overlapping(&self, from: i64, to: i64) -> Vec<(i64, i64)> {
        self.entries
            .iter()
            .filter(|e| e.last_offset >= from && e.first_offset < to)
            .map(|e| (e.producer_id, e.first_offset))
            .collect()
    }

    /// Forgets entries wholly below the log start offset.
    pub fn truncate_before(&mut self, log_start: i64) {
        self.entries.retain(|e| e.last_offset >= log_start);
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every entry, oldest marker first.
    pub fn entries(&self) -> &[AbortedTxn] {
        &self.entries
    }
}

/// `<base offset:020>.txnindex` for the segment with `base_offset`.
pub fn file_name(base_offset: i64) -> String {
    format!("{base_offset:020}.txnindex")
}

/// Every entry of every `.txnindex` file in a partition directory (blocking).
pub fn load_dir(dir: &Path) -> Vec<AbortedTxn> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in rd.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "txnindex") {
            continue;
        }
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        out.extend(
            bytes
                .chunks_exact(ENTRY_BYTES)
                .filter_map(AbortedTxn::decode),
        );
    }
    out
}

/// Appends one entry to the `.txnindex` of the segment `base_offset` (blocking).
pub fn append(dir: &Path, base_offset: i64, e: &AbortedTxn) -> io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(file_name(base_offset)))?;
    f.write_all(&e.encode())?;
    f.sync_data()
}

/// Replaces the `.txnindex` of the segment `base_offset` with `entries`
/// (ordered by last offset, as Kafka's reader expects): a new file is
/// written and synced, then renamed over the old one and the directory
/// synced (blocking).
pub fn rewrite(dir: &Path, base_offset: i64, entries: &[AbortedTxn]) -> io::Result<()> {
    let mut sorted = entries.to_vec();
    sorted.sort_by_key(|e| e.last_offset);
    let path = dir.join(file_name(base_offset));
    let tmp = dir.join(format!("{}.tmp", file_name(base_offset)));
    {
        let mut f = std::fs::File::create(&tmp)?;
        for e in &sorted {
            f.write_all(&e.encode())?;
        }
        f.sync_data()?;
    }
    std::fs::rename(&tmp, &path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// Makes the `.txnindex` files of a partition directory hold exactly
/// `entries`: every segment of `bases` whose file exists or that has
/// entries gets its file rewritten ([`rewrite`]); files of segments not in
/// `bases` are removed (blocking). For recovery, when an index holds
/// entries whose markers the log no longer has.
pub fn rewrite_all(dir: &Path, bases: &[i64], entries: &[AbortedTxn]) -> io::Result<()> {
    let mut existing = Vec::new();
    for ent in std::fs::read_dir(dir)?.flatten() {
        let name = ent.file_name();
        let Some(base) = name
            .to_str()
            .and_then(|n| n.strip_suffix(".txnindex"))
            .and_then(|b| b.parse::<i64>().ok())
        else {
            continue;
        };
        existing.push(base);
    }
    for &base in &existing {
        if !bases.contains(&base) {
            std::fs::remove_file(dir.join(file_name(base)))?;
        }
    }
    for &base in bases {
        let mine = of_segment(entries, bases, base);
        if existing.contains(&base) || !mine.is_empty() {
            rewrite(dir, base, &mine)?;
        }
    }
    std::fs::File::open(dir)?.sync_all()
}

/// Entries of `all` whose marker lies in the segment `base` (the segment
/// bases being `bases`).
pub fn of_segment(all: &[AbortedTxn], bases: &[i64], base: i64) -> Vec<AbortedTxn> {
    all.iter()
        .filter(|e| segment_of(bases, e.last_offset) == base)
        .copied()
        .collect()
}

/// The base offset of the segment holding `offset`: the greatest base not
/// above it (the first segment's when none is).
pub fn segment_of(bases: &[i64], offset: i64) -> i64 {
    bases
        .iter()
        .copied()
        .filter(|&b| b <= offset)
        .max()
        .or_else(|| bases.iter().copied().min())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cleaner_carries_entries_of_this_size() {
        assert_eq!(crate::log::compact::TXN_INDEX_ENTRY_BYTES, ENTRY_BYTES);
    }

    #[test]
    fn rewrite_replaces_a_segment_index_in_marker_order() {
        let e = |first, last| AbortedTxn {
            producer_id: 1,
            first_offset: first,
            last_offset: last,
            last_stable_offset: last + 1,
        };
        let dir = tempfile::tempdir().unwrap();
        append(dir.path(), 10, &e(10, 12)).unwrap();
        rewrite(dir.path(), 10, &[e(20, 25), e(10, 12), e(14, 16)]).unwrap();
        assert_eq!(load_dir(dir.path()), vec![e(10, 12), e(14, 16), e(20, 25)]);
        let bases = [0, 10, 30];
        assert_eq!(segment_of(&bases, 29), 10);
        assert_eq!(segment_of(&bases, 30), 30);
        assert_eq!(
            of_segment(&[e(1, 2), e(10, 12), e(31, 33)], &bases, 10),
            vec![e(10, 12)]
        );
    }

    #[test]
    fn entries_round_trip_and_overlap() {
        let e = AbortedTxn {
            producer_id: 0,
            first_offset: 4,
            last_offset: 7,
            last_stable_offset: 8,
        };
        assert_eq!(AbortedTxn::decode(&e.encode()), Some(e));
        let dir = tempfile::tempdir().unwrap();
        append(dir.path(), 0, &e).unwrap();
        assert_eq!(load_dir(dir.path()), vec![e]);

        let mut all = AbortedTxns::default();
        assert!(all.add(e));
        assert!(!all.add(e));
        assert_eq!(all.overlapping(0, 11), vec![(0, 4)]);
        assert_eq!(all.overlapping(8, 11), Vec::<(i64, i64)>::new());
        assert_eq!(all.overlapping(0, 4), Vec::<(i64, i64)>::new());
        assert_eq!(all.overlapping(7, 8), vec![(0, 4)]);
    }
}
