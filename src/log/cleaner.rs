//! The log cleaner's decisions (issue 26), without I/O: the key → latest
//! offset map built over a log's dirty section, and what cleaning does to
//! one batch. This is Kafka's `Cleaner.buildOffsetMap`,
//! `shouldRetainRecord` and `MemoryRecords.filterTo` as pure functions; the
//! part that reads sealed segments, writes `.cleaned` files, swaps them in
//! crash-safely and runs in the shard's background task queue is not built
//! yet, so nothing calls this module outside its tests today.
//!
//! Rules, as Kafka's cleaner applies them:
//! - A record at an offset above the map's latest offset is kept: the map
//!   knows nothing newer about its key (a dirty section that did not fit in
//!   the map is cleaned in several passes, each ending at the map's latest
//!   offset).
//! - Otherwise a record needs a key and must be its key's latest version
//!   (offset ≥ the map's offset for the key); a keyless record is dropped.
//! - A tombstone (null value) that is its key's latest is kept until its
//!   batch's delete horizon has passed. The first cleaning that keeps a
//!   tombstone sets the horizon to now + `delete.retention.ms` in the batch
//!   itself (KIP-534: attribute bit 0x40, baseTimestamp = horizon), so a
//!   restart does not restart the clock.
//! - Records of an aborted transaction are all dropped (the caller knows
//!   from the `.txnindex` which batches are aborted).
//! - A batch emptied of records is removed, unless it is its producer's last
//!   batch: then its header is kept with no records (Kafka's
//!   `writeEmptyHeader`), so an idempotent producer's sequence state
//!   survives the cleaning.
//! - A rewritten batch keeps its base offset, its original last offset
//!   delta, its producer fields and its codec: every kept record stays at
//!   its original offset (offset gaps are normal in a compacted log), and
//!   sequence numbers keep their meaning.
//! - Control batches (transaction markers) are the caller's decision
//!   ([`MarkerFate`]): a marker stays while records of its transaction remain
//!   and goes after the delete retention.
//!
//! Memory: the map is bounded by `bytes_max` (Kafka's
//! `log.cleaner.dedupe.buffer.size`), charging each key its length plus
//! [`OFFSET_MAP_ENTRY_OVERHEAD_BYTES`]. Kafka stores a 16-byte MD5 of each
//! key and accepts the collision risk; this map stores the key bytes, so a
//! collision can never delete a live record, at the cost of fewer keys per
//! byte for long keys. One map per cleaning, owned by the shard that owns
//! the log.

use crate::record::builder::{empty_batch, retained_batch};
use crate::record::records::{decode_records, from_batch_error};
use crate::record::{BatchHeader, Compression, RecordsError};
use bytes::{Bytes, BytesMut};
use std::collections::HashMap;

/// What one map entry costs beyond its key's bytes: the offset, the hash
/// table's slot and the key's allocation header, rounded up.
pub const OFFSET_MAP_ENTRY_OVERHEAD_BYTES: usize = 64;

/// Key → offset of its latest record in the section mapped so far.
pub struct OffsetMap {
    offsets: HashMap<Bytes, i64>,
    bytes: usize,
    bytes_max: usize,
    /// The highest offset put, -1 when empty.
    latest_offset: i64,
}

impl OffsetMap {
    pub fn new(bytes_max: usize) -> OffsetMap {
        OffsetMap {
            offsets: HashMap::new(),
            bytes: 0,
            bytes_max,
            latest_offset: -1,
        }
    }

    /// Records `key` at `offset`, or returns false (changing nothing) when
    /// a new key would take the map past its bytes. Offsets must be put in
    /// increasing order, as a log is read.
    pub fn put(&mut self, key: &[u8], offset: i64) -> bool {
        assert!(
            offset > self.latest_offset,
            "offsets are mapped in log order: {offset} after {}",
            self.latest_offset
        );
        if let Some(o) = self.offsets.get_mut(key) {
            *o = offset;
        } else {
            let cost = key.len() + OFFSET_MAP_ENTRY_OVERHEAD_BYTES;
            if self.bytes + cost > self.bytes_max {
                return false;
            }
            self.offsets.insert(Bytes::copy_from_slice(key), offset);
            self.bytes += cost;
        }
        self.latest_offset = offset;
        true
    }

    /// The offset of `key`'s latest record, if the map has it.
    pub fn get(&self, key: &[u8]) -> Option<i64> {
        self.offsets.get(key).copied()
    }

    /// The highest offset mapped; -1 when nothing is.
    pub fn latest_offset(&self) -> i64 {
        self.latest_offset
    }

    pub fn len(&self) -> usize {
        self.offsets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.offsets.is_empty()
    }

    /// Bytes charged so far (at most `bytes_max`).
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// How mapping one batch ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mapped {
    /// Every keyed record at or above the start offset is in the map.
    Whole,
    /// The map filled up inside this batch: it covers the section up to its
    /// latest offset, and the next pass starts after that.
    Full,
}

/// The records section of `batch`, decompressed to at most `limit_bytes`.
fn records_of(
    batch: &[u8],
    header: &BatchHeader,
    limit_bytes: usize,
) -> Result<Vec<crate::record::Record>, RecordsError> {
    let Some(body) = batch.get(crate::record::batch::BATCH_HEADER_BYTES..header.total_size())
    else {
        return Err(RecordsError::NoBatch {
            available: batch.len(),
        });
    };
    let codec = header
        .compression()
        .map_err(|_| RecordsError::UnknownCompression(header.compression_id()))?;
    let raw = match codec {
        Compression::None => Bytes::copy_from_slice(body),
        _ => Bytes::from(crate::record::compression::decompress(
            codec,
            body,
            limit_bytes,
        )?),
    };
    decode_records(&raw, header.records_count)
}

/// Puts the keyed records of `batch` at or above `start_offset` into `map`
/// (Kafka's `buildOffsetMapForSegment`): control batches and batches of
/// aborted transactions (`aborted`) add nothing.
pub fn map_batch(
    map: &mut OffsetMap,
    batch: &[u8],
    start_offset: i64,
    aborted: bool,
    limit_bytes: usize,
) -> Result<Mapped, RecordsError> {
    let header = BatchHeader::parse(batch).map_err(from_batch_error)?;
    if header.is_control() || aborted || header.last_offset() < start_offset {
        return Ok(Mapped::Whole);
    }
    for r in records_of(batch, &header, limit_bytes)? {
        let offset = r.offset(&header);
        let Some(key) = &r.key else { continue };
        if offset < start_offset || offset <= map.latest_offset() {
            continue;
        }
        if !map.put(key, offset) {
            return Ok(Mapped::Full);
        }
    }
    Ok(Mapped::Whole)
}

/// What the caller's transaction bookkeeping says about a control batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarkerFate {
    /// Records of its transaction remain, or its horizon has not passed.
    Keep,
    /// Nothing of its transaction remains and its delete horizon passed.
    Remove,
}

/// What cleaning does to one batch.
#[derive(Debug, PartialEq, Eq)]
pub enum Cleaned {
    /// Written as it was.
    Unchanged,
    /// Written as these bytes instead (fewer records, or a delete horizon
    /// set, or emptied but kept as its producer's last batch).
    Rewritten(BytesMut),
    /// Not written at all.
    Removed,
}

/// The inputs of cleaning one batch besides its bytes.
pub struct CleanBatch<'a> {
    pub map: &'a OffsetMap,
    /// The cleaning's clock, for delete horizons.
    pub now_ms: i64,
    /// The topic's `delete.retention.ms`.
    pub delete_retention_ms: i64,
    /// The batch belongs to an aborted transaction.
    pub aborted: bool,
    /// The batch is the last one of its producer in the log.
    pub last_of_producer: bool,
    /// For a control batch only.
    pub marker: MarkerFate,
    /// Decompression bound.
    pub limit_bytes: usize,
}

/// Whether a retained record survives (Kafka's `shouldRetainRecord`).
fn retain(c: &CleanBatch<'_>, header: &BatchHeader, r: &crate::record::Record) -> bool {
    let offset = r.offset(header);
    if offset > c.map.latest_offset() {
        return true;
    }
    let Some(key) = &r.key else {
        return false;
    };
    let latest = c.map.get(key).is_none_or(|found| offset >= found);
    let keep_tombstone = !header.has_delete_horizon() || c.now_ms < header.base_timestamp;
    latest && (r.value.is_some() || keep_tombstone)
}

/// Cleans one batch (Kafka's `cleanInto` for one batch).
pub fn clean_batch(batch: &[u8], c: &CleanBatch<'_>) -> Result<Cleaned, RecordsError> {
    let header = BatchHeader::parse(batch).map_err(from_batch_error)?;
    if header.is_control() {
        return Ok(match c.marker {
            MarkerFate::Remove => Cleaned::Removed,
            MarkerFate::Keep if header.has_delete_horizon() => Cleaned::Unchanged,
            // A marker's horizon starts with the first cleaning that sees it.
            MarkerFate::Keep => {
                let records = records_of(batch, &header, c.limit_bytes)?;
                if records.is_empty() {
                    Cleaned::Unchanged
                } else {
                    let horizon = c.now_ms.saturating_add(c.delete_retention_ms);
                    Cleaned::Rewritten(retained_batch(&header, &records, Some(horizon))?)
                }
            }
        });
    }
    let emptied = || {
        if c.last_of_producer && header.producer_id >= 0 {
            Cleaned::Rewritten(empty_batch(&header))
        } else {
            Cleaned::Removed
        }
    };
    if c.aborted {
        return Ok(emptied());
    }
    let records = records_of(batch, &header, c.limit_bytes)?;
    let total = records.len();
    let kept: Vec<_> = records
        .into_iter()
        .filter(|r| retain(c, &header, r))
        .collect();
    if kept.is_empty() {
        return Ok(if total == 0 {
            Cleaned::Unchanged
        } else {
            emptied()
        });
    }
    let needs_horizon = !header.has_delete_horizon() && kept.iter().any(|r| r.value.is_none());
    if kept.len() == total && !needs_horizon {
        return Ok(Cleaned::Unchanged);
    }
    let horizon = if needs_horizon {
        Some(c.now_ms.saturating_add(c.delete_retention_ms))
    } else if header.has_delete_horizon() {
        Some(header.base_timestamp)
    } else {
        None
    };
    Ok(Cleaned::Rewritten(retained_batch(&header, &kept, horizon)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{control_batch, decode_batch, BatchBuilder, ControlType};

    const LIMIT: usize = 1 << 20;
    const TS: i64 = 1_700_000_000_000;
    const DAY_MS: i64 = 24 * 3600 * 1000;

    /// One batch at `base` with (key, value) records.
    fn batch(base: i64, records: &[(Option<&str>, Option<&str>)], codec: Compression) -> Vec<u8> {
        let mut b = BatchBuilder::new(codec).base_offset(base);
        for (i, (k, v)) in records.iter().enumerate() {
            b = b.record(
                k.map(str::as_bytes),
                v.map(str::as_bytes),
                &[],
                TS + i as i64,
            );
        }
        b.build().to_vec()
    }

    fn ctx(map: &OffsetMap, now_ms: i64) -> CleanBatch<'_> {
        CleanBatch {
            map,
            now_ms,
            delete_retention_ms: DAY_MS,
            aborted: false,
            last_of_producer: false,
            marker: MarkerFate::Keep,
            limit_bytes: LIMIT,
        }
    }

    /// (offset, key, value) of every record in `batch`.
    fn contents(batch: &[u8]) -> Vec<(i64, Option<String>, Option<String>)> {
        let (h, records) = decode_batch(batch).unwrap();
        let s = |b: &Option<Bytes>| b.as_ref().map(|b| String::from_utf8_lossy(b).into_owned());
        records
            .iter()
            .map(|r| (r.offset(&h), s(&r.key), s(&r.value)))
            .collect()
    }

    fn map_of(batches: &[&[u8]], bytes_max: usize) -> (OffsetMap, Mapped) {
        let mut map = OffsetMap::new(bytes_max);
        let mut last = Mapped::Whole;
        for b in batches {
            last = map_batch(&mut map, b, 0, false, LIMIT).unwrap();
            if last == Mapped::Full {
                break;
            }
        }
        (map, last)
    }

    #[test]
    fn the_map_keeps_each_keys_latest_offset_within_its_bytes() {
        let mut map = OffsetMap::new(2 * (1 + OFFSET_MAP_ENTRY_OVERHEAD_BYTES));
        assert!(map.put(b"a", 0));
        assert!(map.put(b"b", 1));
        assert!(map.put(b"a", 2), "an update of a known key costs nothing");
        assert!(!map.put(b"c", 3), "a third key does not fit");
        assert_eq!(map.latest_offset(), 2, "a refused put changes nothing");
        assert_eq!(
            (map.get(b"a"), map.get(b"b"), map.get(b"c")),
            (Some(2), Some(1), None)
        );
        assert_eq!(map.len(), 2);
        assert!(map.bytes() <= 2 * (1 + OFFSET_MAP_ENTRY_OVERHEAD_BYTES));
    }

    #[test]
    fn only_each_keys_latest_record_stays_at_its_original_offset() {
        let b0 = batch(
            0,
            &[(Some("k1"), Some("a")), (Some("k2"), Some("b"))],
            Compression::None,
        );
        let b1 = batch(
            2,
            &[(Some("k1"), Some("c")), (Some("k3"), Some("d"))],
            Compression::None,
        );
        let (map, mapped) = map_of(&[&b0, &b1], LIMIT);
        assert_eq!(mapped, Mapped::Whole);
        let Cleaned::Rewritten(out) = clean_batch(&b0, &ctx(&map, TS)).unwrap() else {
            panic!("b0 loses k1@0")
        };
        assert_eq!(
            contents(&out),
            vec![(1, Some("k2".into()), Some("b".into()))]
        );
        let h = BatchHeader::parse(&out).unwrap();
        assert_eq!((h.base_offset, h.last_offset()), (0, 1), "offsets kept");
        assert_eq!(
            clean_batch(&b1, &ctx(&map, TS)).unwrap(),
            Cleaned::Unchanged
        );
    }

    #[test]
    fn a_compressed_batch_is_recompressed_with_its_codec() {
        let b0 = batch(
            10,
            &[
                (Some("k"), Some("old")),
                (Some("j"), Some("x")),
                (Some("k"), Some("new")),
            ],
            Compression::Gzip,
        );
        let (map, _) = map_of(&[&b0], LIMIT);
        let Cleaned::Rewritten(out) = clean_batch(&b0, &ctx(&map, TS)).unwrap() else {
            panic!("k@10 goes")
        };
        let h = BatchHeader::parse(&out).unwrap();
        assert_eq!(h.compression().unwrap(), Compression::Gzip);
        assert_eq!(h.records_count, 2);
        assert_eq!(h.last_offset_delta, 2);
        assert_eq!(
            contents(&out),
            vec![
                (11, Some("j".into()), Some("x".into())),
                (12, Some("k".into()), Some("new".into()))
            ]
        );
        assert_eq!(crate::record::batch::compute_crc(&out), h.crc, "valid CRC");
    }

    #[test]
    fn tombstones_get_a_delete_horizon_then_go_after_it() {
        let b0 = batch(
            0,
            &[(Some("k"), Some("v")), (Some("k"), None)],
            Compression::None,
        );
        let (map, _) = map_of(&[&b0], LIMIT);
        let Cleaned::Rewritten(first) = clean_batch(&b0, &ctx(&map, TS)).unwrap() else {
            panic!("k@0 goes, the tombstone gets its horizon")
        };
        let h = BatchHeader::parse(&first).unwrap();
        assert!(h.has_delete_horizon());
        assert_eq!(h.base_timestamp, TS + DAY_MS);
        assert_eq!(contents(&first), vec![(1, Some("k".into()), None)]);
        // The record keeps its timestamp under the new base.
        let (_, records) = decode_batch(&first).unwrap();
        assert_eq!(records[0].timestamp(&h), TS + 1);
        // Before the horizon a second cleaning keeps it as it is...
        assert_eq!(
            clean_batch(&first, &ctx(&map, TS + DAY_MS - 1)).unwrap(),
            Cleaned::Unchanged
        );
        // ...and after it the tombstone goes.
        assert_eq!(
            clean_batch(&first, &ctx(&map, TS + DAY_MS)).unwrap(),
            Cleaned::Removed
        );
    }

    #[test]
    fn aborted_records_go_and_a_producers_last_batch_stays_empty() {
        let txn = BatchBuilder::new(Compression::Lz4)
            .base_offset(5)
            .producer(7, 0, 3)
            .transactional(true)
            .record(Some(b"k"), Some(b"aborted"), &[], TS)
            .record(Some(b"j"), Some(b"aborted"), &[], TS)
            .build()
            .to_vec();
        let mut map = OffsetMap::new(LIMIT);
        assert_eq!(
            map_batch(&mut map, &txn, 0, true, LIMIT).unwrap(),
            Mapped::Whole
        );
        assert!(map.is_empty(), "aborted records are not mapped");
        let mut c = ctx(&map, TS);
        c.aborted = true;
        assert_eq!(clean_batch(&txn, &c).unwrap(), Cleaned::Removed);
        c.last_of_producer = true;
        let Cleaned::Rewritten(empty) = clean_batch(&txn, &c).unwrap() else {
            panic!("the producer's last batch stays")
        };
        let h = BatchHeader::parse(&empty).unwrap();
        assert_eq!(h.records_count, 0);
        assert_eq!((h.base_offset, h.last_offset()), (5, 6));
        assert_eq!(
            (h.producer_id, h.producer_epoch, h.base_sequence),
            (7, 0, 3)
        );
        assert_eq!(h.last_sequence(), 4, "the sequence state survives");
        assert!(h.is_transactional());
        assert_eq!(crate::record::batch::compute_crc(&empty), h.crc);
    }

    #[test]
    fn records_past_the_maps_latest_offset_are_kept_and_keyless_ones_go() {
        let b0 = batch(
            0,
            &[(None, Some("x")), (Some("a"), Some("1"))],
            Compression::None,
        );
        let b1 = batch(
            2,
            &[(Some("b"), Some("2")), (Some("a"), Some("3"))],
            Compression::None,
        );
        // Room for one key: the map stops at b1's first record, a new key.
        let (map, mapped) = map_of(&[&b0, &b1], 1 + OFFSET_MAP_ENTRY_OVERHEAD_BYTES);
        assert_eq!(mapped, Mapped::Full);
        assert_eq!(map.latest_offset(), 1);
        let Cleaned::Rewritten(out) = clean_batch(&b0, &ctx(&map, TS)).unwrap() else {
            panic!("the keyless record goes")
        };
        assert_eq!(
            contents(&out),
            vec![(1, Some("a".into()), Some("1".into()))]
        );
        // a@1 stays although a@3 supersedes it: this pass's map ends at 1;
        // the next pass, mapping from offset 2, removes it. b1 is past the
        // map and stays whole.
        assert_eq!(
            clean_batch(&b1, &ctx(&map, TS)).unwrap(),
            Cleaned::Unchanged
        );
    }

    #[test]
    fn markers_stay_with_a_horizon_until_the_caller_removes_them() {
        let marker = control_batch(ControlType::Commit, 7, 0, 0, TS).to_vec();
        let map = OffsetMap::new(LIMIT);
        let Cleaned::Rewritten(first) = clean_batch(&marker, &ctx(&map, TS)).unwrap() else {
            panic!("the marker's horizon is set")
        };
        let h = BatchHeader::parse(&first).unwrap();
        assert!(h.is_control() && h.has_delete_horizon());
        assert_eq!(h.base_timestamp, TS + DAY_MS);
        assert_eq!(
            clean_batch(&first, &ctx(&map, TS)).unwrap(),
            Cleaned::Unchanged
        );
        let mut c = ctx(&map, TS + DAY_MS);
        c.marker = MarkerFate::Remove;
        assert_eq!(clean_batch(&first, &c).unwrap(), Cleaned::Removed);
    }
}
