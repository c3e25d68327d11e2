//! The sparse offset index (`.index`) and time index (`.timeindex`) of one
//! segment, kept in memory and written to disk in Kafka's byte format.
//!
//! - `.index`: 8-byte entries, big-endian `relativeOffset: i32` (a batch's
//!   last offset minus the segment's base offset) and `position: i32` (the
//!   byte position of that batch in the `.log`). One entry is added before a
//!   batch once more than `index_interval_bytes` were appended since the
//!   previous entry (Kafka's `LogSegment.append`), so the first batch of a
//!   segment has no entry.
//! - `.timeindex`: 12-byte entries, `timestamp: i64` (the largest timestamp
//!   so far in the segment) and `relativeOffset: i32` (the last offset of the
//!   batch that holds it). An entry is only added when the timestamp grows.
//!
//! Invariants: offsets and positions strictly increase in `.index`;
//! timestamps strictly increase in `.timeindex`. A file that breaks them, or
//! whose length is not a whole number of entries, is rejected by `decode_*`
//! and the caller rebuilds the index from the log. The owning shard is the
//! owner of the segment; no I/O happens here.

/// Bytes per `.index` entry.
pub const OFFSET_INDEX_ENTRY_BYTES: usize = 8;
/// Bytes per `.timeindex` entry.
pub const TIME_INDEX_ENTRY_BYTES: usize = 12;

/// One `.index` entry, relative to the segment's base offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffsetEntry {
    pub relative_offset: u32,
    pub position: u32,
}

/// One `.timeindex` entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimeEntry {
    pub timestamp_ms: i64,
    pub relative_offset: u32,
}

/// The in-memory `.index` of a segment.
#[derive(Clone, Debug, Default)]
pub struct OffsetIndex {
    pub entries: Vec<OffsetEntry>,
}

impl OffsetIndex {
    pub fn push(&mut self, relative_offset: u32, position: u32) {
        if let Some(last) = self.entries.last() {
            if relative_offset <= last.relative_offset || position <= last.position {
                return;
            }
        }
        self.entries.push(OffsetEntry {
            relative_offset,
            position,
        });
    }

    /// The position of the last entry whose offset is <= `relative_offset`
    /// (0 = scan from the segment start).
    pub fn lookup(&self, relative_offset: u32) -> u32 {
        let i = self
            .entries
            .partition_point(|e| e.relative_offset <= relative_offset);
        if i == 0 {
            0
        } else {
            self.entries[i - 1].position
        }
    }

    /// The position of the last entry after byte `after` and at or before
    /// byte `at_most` whose offset is below `relative_upper`. Every batch
    /// before such a position ends before that entry's batch, so all of
    /// them have offsets below `relative_upper` too: a read can take the
    /// bytes up to it without reading their headers.
    pub fn last_position_within(
        &self,
        after: u64,
        at_most: u64,
        relative_upper: u64,
    ) -> Option<u64> {
        let by_position = self
            .entries
            .partition_point(|e| u64::from(e.position) <= at_most);
        let by_offset = self
            .entries
            .partition_point(|e| u64::from(e.relative_offset) < relative_upper);
        let i = by_position.min(by_offset).checked_sub(1)?;
        let position = u64::from(self.entries[i].position);
        (position > after).then_some(position)
    }

    pub fn size_bytes(&self) -> usize {
        self.entries.len() * OFFSET_INDEX_ENTRY_BYTES
    }

    /// Drops entries at or after byte `position` (log truncation).
    pub fn truncate_to_position(&mut self, position: u32) {
        self.entries.retain(|e| e.position < position);
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.size_bytes());
        for e in &self.entries {
            out.extend_from_slice(&(e.relative_offset as i32).to_be_bytes());
            out.extend_from_slice(&(e.position as i32).to_be_bytes());
        }
        out
    }

    /// Decodes and sanity-checks an `.index` file against the size of its
    /// `.log`. Trailing all-zero entries (Kafka preallocates the file) are
    /// ignored. `None` = the file must be rebuilt.
    pub fn decode(bytes: &[u8], log_size_bytes: u64) -> Option<OffsetIndex> {
        if bytes.len() % OFFSET_INDEX_ENTRY_BYTES != 0 {
            return None;
        }
        let mut idx = OffsetIndex::default();
        for (i, c) in bytes.chunks_exact(OFFSET_INDEX_ENTRY_BYTES).enumerate() {
            let rel = i32::from_be_bytes([c[0], c[1], c[2], c[3]]);
            let pos = i32::from_be_bytes([c[4], c[5], c[6], c[7]]);
            if rel == 0 && pos == 0 && i > 0 {
                break;
            }
            if rel < 0 || pos < 0 || pos as u64 >= log_size_bytes {
                return None;
            }
            if let Some(last) = idx.entries.last() {
                if rel as u32 <= last.relative_offset || pos as u32 <= last.position {
                    return None;
                }
            }
            idx.entries.push(OffsetEntry {
                relative_offset: rel as u32,
                position: pos as u32,
            });
        }
        Some(idx)
    }
}

/// The in-memory `.timeindex` of a segment.
#[derive(Clone, Debug, Default)]
pub struct TimeIndex {
    pub entries: Vec<TimeEntry>,
}

impl TimeIndex {
    /// Adds an entry if `timestamp_ms` is larger than the last one's.
    pub fn maybe_push(&mut self, timestamp_ms: i64, relative_offset: u32) {
        match self.entries.last() {
            Some(last) if timestamp_ms <= last.timestamp_ms => {}
            Some(last) if relative_offset < last.relative_offset => {}
            _ => self.entries.push(TimeEntry {
                timestamp_ms,
                relative_offset,
            }),
        }
    }

    /// The relative offset of the last entry with timestamp <= `ts_ms`
    /// (0 = scan from the segment start).
    pub fn lookup(&self, ts_ms: i64) -> u32 {
        let i = self.entries.partition_point(|e| e.timestamp_ms <= ts_ms);
        if i == 0 {
            0
        } else {
            self.entries[i - 1].relative_offset
        }
    }

    pub fn last(&self) -> Option<TimeEntry> {
        self.entries.last().copied()
    }

    pub fn size_bytes(&self) -> usize {
        self.entries.len() * TIME_INDEX_ENTRY_BYTES
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.size_bytes());
        for e in &self.entries {
            out.extend_from_slice(&e.timestamp_ms.to_be_bytes());
            out.extend_from_slice(&(e.relative_offset as i32).to_be_bytes());
        }
        out
    }

    /// Decodes and sanity-checks a `.timeindex` file; trailing zero entries
    /// are ignored. `None` = rebuild.
    pub fn decode(bytes: &[u8]) -> Option<TimeIndex> {
        if bytes.len() % TIME_INDEX_ENTRY_BYTES != 0 {
            return None;
        }
        let mut idx = TimeIndex::default();
        for c in bytes.chunks_exact(TIME_INDEX_ENTRY_BYTES) {
            let mut t = [0u8; 8];
            t.copy_from_slice(&c[..8]);
            let ts = i64::from_be_bytes(t);
            let rel = i32::from_be_bytes([c[8], c[9], c[10], c[11]]);
            if ts == 0 && rel == 0 {
                break;
            }
            if rel < 0 {
                return None;
            }
            if let Some(last) = idx.entries.last() {
                if ts <= last.timestamp_ms || (rel as u32) < last.relative_offset {
                    return None;
                }
            }
            idx.entries.push(TimeEntry {
                timestamp_ms: ts,
                relative_offset: rel as u32,
            });
        }
        Some(idx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_lookup_finds_floor_entry() {
        let mut i = OffsetIndex::default();
        i.push(10, 4200);
        i.push(20, 8400);
        assert_eq!(i.lookup(5), 0);
        assert_eq!(i.lookup(10), 4200);
        assert_eq!(i.lookup(19), 4200);
        assert_eq!(i.lookup(25), 8400);
    }

    #[test]
    fn last_position_within_keeps_to_both_bounds() {
        let mut i = OffsetIndex::default();
        i.push(10, 4200);
        i.push(20, 8400);
        i.push(30, 12600);
        assert_eq!(i.last_position_within(0, 10_000, 100), Some(8400));
        assert_eq!(
            i.last_position_within(0, 8400, 100),
            Some(8400),
            "at most is inclusive"
        );
        assert_eq!(i.last_position_within(0, 8399, 100), Some(4200));
        assert_eq!(
            i.last_position_within(0, 100_000, 30),
            Some(8400),
            "offset 30 is not below 30"
        );
        assert_eq!(i.last_position_within(0, 100_000, 31), Some(12600));
        assert_eq!(
            i.last_position_within(8400, 10_000, 100),
            None,
            "after is exclusive"
        );
        assert_eq!(i.last_position_within(0, 4199, 100), None);
        assert_eq!(i.last_position_within(0, 100_000, 10), None);
        assert_eq!(
            OffsetIndex::default().last_position_within(0, 1 << 40, 1 << 40),
            None
        );
    }

    #[test]
    fn offset_index_round_trips_and_rejects_garbage() {
        let mut i = OffsetIndex::default();
        i.push(3, 5000);
        i.push(9, 9000);
        let bytes = i.encode();
        assert_eq!(bytes.len(), 16);
        assert_eq!(&bytes[..8], &[0, 0, 0, 3, 0, 0, 0x13, 0x88]);
        let back = OffsetIndex::decode(&bytes, 10_000).unwrap();
        assert_eq!(back.entries, i.entries);
        assert!(
            OffsetIndex::decode(&bytes, 8000).is_none(),
            "position past log end"
        );
        assert!(
            OffsetIndex::decode(&bytes[..7], 10_000).is_none(),
            "torn entry"
        );
        let mut swapped = bytes[8..].to_vec();
        swapped.extend_from_slice(&bytes[..8]);
        assert!(
            OffsetIndex::decode(&swapped, 10_000).is_none(),
            "not increasing"
        );
    }

    #[test]
    fn time_index_only_grows_and_looks_up() {
        let mut t = TimeIndex::default();
        t.maybe_push(100, 1);
        t.maybe_push(90, 2);
        t.maybe_push(200, 5);
        assert_eq!(t.entries.len(), 2);
        assert_eq!(t.lookup(50), 0);
        assert_eq!(t.lookup(150), 1);
        assert_eq!(t.lookup(250), 5);
        let back = TimeIndex::decode(&t.encode()).unwrap();
        assert_eq!(back.entries, t.entries);
    }
}
