//! The log cleaner's decisions (issue 26), without I/O: the key → latest
//! offset map built over a log's dirty section, and what cleaning does to
//! one batch. This is Kafka's `Cleaner.buildOffsetMap`,
//! `shouldRetainRecord` and `MemoryRecords.filterTo` as pure functions; the
//! part that reads sealed segments, writes `.cleaned` files and swaps them
//! in crash-safely is `log::compact`, and the choice of a log and its
//! cleanable bounds is `partition::compaction`.
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
//! - Transaction markers: [`TxnTracker`] (Kafka's
//!   `CleanedTransactionMetadata`) follows the section's batches in log
//!   order with the aborted transactions from the `.txnindex`, says which
//!   data batches are aborted and whether a marker's transaction left
//!   anything; [`marker_fate`] removes a marker only when nothing of its
//!   transaction remains and the delete horizon its first cleaning set has
//!   passed.
//! - Which log: [`filthiest`] takes the log with the highest dirty ratio
//!   above its `min.cleanable.dirty.ratio`, or any past
//!   `max.compaction.lag.ms`; [`group_segments`] groups the sealed segments
//!   to rewrite so small cleaned segments merge up to `segment.bytes`.
//! - One segment: [`map_segment`] builds the map over a dirty segment's
//!   bytes; [`clean_segment`] writes a segment's cleaned batches into a
//!   buffer (what the I/O side will write as `<base>.log.cleaned`).
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

/// The smallest `--log-cleaner-dedupe-buffer-size` fjord takes: 64 KiB
/// (about a thousand short keys per pass).
pub const DEDUPE_BUFFER_MIN_BYTES: usize = 64 << 10;

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

/// Which batches of the section being cleaned belong to aborted
/// transactions, and which transaction markers may go (Kafka's
/// `CleanedTransactionMetadata`). Fed every batch in log order: data
/// batches through [`TxnTracker::on_data_batch`], control batches through
/// [`TxnTracker::on_marker`].
pub struct TxnTracker {
    /// Aborted transactions of the section from the `.txnindex`:
    /// (producer id, first offset), in first-offset order, not yet reached.
    aborted: std::collections::VecDeque<(i64, i64)>,
    /// Producers whose aborted transaction has begun and whose ABORT marker
    /// has not been read: whether a batch of it was seen in this pass.
    ongoing_aborted: HashMap<i64, bool>,
    /// Producers with a transaction under way that is not aborted.
    ongoing_committed: std::collections::HashSet<i64>,
}

impl TxnTracker {
    /// `aborted`: the aborted transactions overlapping the section,
    /// (producer id, first offset), any order.
    pub fn new(mut aborted: Vec<(i64, i64)>) -> TxnTracker {
        aborted.sort_by_key(|&(_, first)| first);
        TxnTracker {
            aborted: aborted.into(),
            ongoing_aborted: HashMap::new(),
            ongoing_committed: std::collections::HashSet::new(),
        }
    }

    fn reach(&mut self, last_offset: i64) {
        while let Some(&(producer_id, first)) = self.aborted.front() {
            if first > last_offset {
                break;
            }
            self.aborted.pop_front();
            self.ongoing_aborted.insert(producer_id, false);
        }
    }

    /// A data batch: true when it belongs to an aborted transaction (its
    /// records go).
    pub fn on_data_batch(&mut self, header: &BatchHeader) -> bool {
        self.reach(header.last_offset());
        if !header.is_transactional() {
            return false;
        }
        if let Some(seen) = self.ongoing_aborted.get_mut(&header.producer_id) {
            *seen = true;
            return true;
        }
        self.ongoing_committed.insert(header.producer_id);
        false
    }

    /// A transaction marker of `kind`: whether its transaction left nothing
    /// behind in this pass, so that the marker may go once its delete
    /// horizon has passed. An ABORT whose batches were seen in this pass is
    /// kept (this pass removes them; the next may remove the marker); a
    /// COMMIT is kept while records of its transaction remain.
    pub fn on_marker(&mut self, header: &BatchHeader, kind: crate::record::ControlType) -> bool {
        use crate::record::ControlType;
        self.reach(header.last_offset());
        match kind {
            ControlType::Abort => {
                !matches!(self.ongoing_aborted.remove(&header.producer_id), Some(true))
            }
            ControlType::Commit => !self.ongoing_committed.remove(&header.producer_id),
            ControlType::Unknown(_) => false,
        }
    }
}

/// The fate of a marker from the tracker's answer and its batch's delete
/// horizon: it goes only when its transaction left nothing and the horizon
/// (set by an earlier cleaning) has passed.
pub fn marker_fate(header: &BatchHeader, txn_left_nothing: bool, now_ms: i64) -> MarkerFate {
    if txn_left_nothing && header.has_delete_horizon() && now_ms >= header.base_timestamp {
        MarkerFate::Remove
    } else {
        MarkerFate::Keep
    }
}

/// A compacted log as the cleaner weighs it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LogDirt {
    /// Bytes already cleaned (below the first dirty offset).
    pub clean_bytes: u64,
    /// Cleanable dirty bytes: from the first dirty offset to the first
    /// uncleanable one (the active segment, the LSO, min.compaction.lag.ms).
    pub dirty_bytes: u64,
    /// Timestamp of the earliest dirty record, if any.
    pub first_dirty_ms: Option<i64>,
    pub min_cleanable_dirty_ratio: f64,
    pub max_compaction_lag_ms: i64,
}

impl LogDirt {
    /// dirty / (clean + dirty); 0 for an empty log.
    pub fn dirty_ratio(&self) -> f64 {
        let total = self.clean_bytes + self.dirty_bytes;
        if total == 0 {
            0.0
        } else {
            self.dirty_bytes as f64 / total as f64
        }
    }

    /// Kafka's `needCompactionNow`: a dirty record older than
    /// `max.compaction.lag.ms`.
    pub fn past_max_lag(&self, now_ms: i64) -> bool {
        self.first_dirty_ms
            .is_some_and(|t| now_ms.saturating_sub(t) > self.max_compaction_lag_ms)
    }
}

/// The log to clean next (Kafka's `grabFilthiestCompactedLog`): among the
/// logs with dirty bytes whose dirty ratio is above their
/// `min.cleanable.dirty.ratio`, or whose oldest dirty record is past
/// `max.compaction.lag.ms`, the one with the highest dirty ratio.
pub fn filthiest(logs: &[LogDirt], now_ms: i64) -> Option<usize> {
    logs.iter()
        .enumerate()
        .filter(|(_, l)| {
            l.dirty_bytes > 0
                && (l.past_max_lag(now_ms) || l.dirty_ratio() > l.min_cleanable_dirty_ratio)
        })
        .max_by(|(_, a), (_, b)| a.dirty_ratio().total_cmp(&b.dirty_ratio()))
        .map(|(i, _)| i)
}

/// A sealed segment as the cleaner groups them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentSize {
    pub base_offset: i64,
    /// The offset after its last batch.
    pub next_offset: i64,
    pub bytes: u64,
}

/// Groups consecutive segments so that each group is rewritten into one
/// cleaned segment (Kafka's `groupSegmentsBySize`): a group holds at most
/// `segment_bytes` bytes before cleaning, and its offsets stay within 32
/// bits of its base (the index stores relative offsets). Every segment is in
/// exactly one group, in order; a segment larger than `segment_bytes` is a
/// group of its own.
pub fn group_segments(segments: &[SegmentSize], segment_bytes: u64) -> Vec<Vec<SegmentSize>> {
    let mut groups: Vec<Vec<SegmentSize>> = Vec::new();
    for s in segments {
        let fits = groups.last().is_some_and(|g| {
            let bytes: u64 = g.iter().map(|x| x.bytes).sum();
            bytes + s.bytes <= segment_bytes
                && s.next_offset - 1 - g[0].base_offset <= i32::MAX as i64
        });
        if fits {
            groups.last_mut().expect("a group").push(*s);
        } else {
            groups.push(vec![*s]);
        }
    }
    debug_assert_eq!(groups.iter().map(Vec::len).sum::<usize>(), segments.len());
    groups
}

/// The type of the marker in a control batch (None for an empty one).
fn marker_kind(
    batch: &[u8],
    header: &BatchHeader,
    limit_bytes: usize,
) -> Result<Option<crate::record::ControlType>, RecordsError> {
    let records = records_of(batch, header, limit_bytes)?;
    match records.first().and_then(|r| r.key.as_ref()) {
        Some(key) => Ok(Some(crate::record::records::parse_control_key(key)?.1)),
        None => Ok(None),
    }
}

/// Maps every batch of `segment` (whole batches, in log order) from
/// `start_offset` on (Kafka's `buildOffsetMapForSegment`), following
/// transactions with `tracker` so that aborted records add nothing. Stops
/// at the batch where the map fills up.
pub fn map_segment(
    map: &mut OffsetMap,
    segment: &[u8],
    start_offset: i64,
    tracker: &mut TxnTracker,
    limit_bytes: usize,
) -> Result<Mapped, RecordsError> {
    let mut iter = crate::record::BatchIter::new(segment);
    for (at, header) in iter.by_ref() {
        let batch = &segment[at..at + header.total_size()];
        let aborted = if header.is_control() {
            if let Some(kind) = marker_kind(batch, &header, limit_bytes)? {
                tracker.on_marker(&header, kind);
            }
            continue;
        } else {
            tracker.on_data_batch(&header)
        };
        if map_batch(map, batch, start_offset, aborted, limit_bytes)? == Mapped::Full {
            return Ok(Mapped::Full);
        }
    }
    match iter.error() {
        Some(e) => Err(from_batch_error(e.clone())),
        None => Ok(Mapped::Whole),
    }
}

/// The inputs of cleaning a segment besides its bytes.
pub struct SegmentCleaning<'a> {
    pub map: &'a OffsetMap,
    /// Producer id → last offset of its last data batch in the log (from
    /// the producer-state table): that batch is kept, if only empty.
    pub last_of_producers: &'a HashMap<i64, i64>,
    pub now_ms: i64,
    pub delete_retention_ms: i64,
    pub limit_bytes: usize,
}

/// What cleaning a segment did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CleanStats {
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub batches_rewritten: u64,
    pub batches_removed: u64,
}

/// Cleans `segment` (whole batches, in log order) into `out` (Kafka's
/// `cleanInto`): every batch through [`clean_batch`], with `tracker`
/// deciding aborted batches and markers.
pub fn clean_segment(
    segment: &[u8],
    c: &SegmentCleaning<'_>,
    tracker: &mut TxnTracker,
    out: &mut Vec<u8>,
) -> Result<CleanStats, RecordsError> {
    let mut stats = CleanStats::default();
    let mut iter = crate::record::BatchIter::new(segment);
    for (at, header) in iter.by_ref() {
        let batch = &segment[at..at + header.total_size()];
        stats.bytes_read += batch.len() as u64;
        let (aborted, marker) = if header.is_control() {
            let left_nothing = match marker_kind(batch, &header, c.limit_bytes)? {
                Some(kind) => tracker.on_marker(&header, kind),
                None => false,
            };
            (false, marker_fate(&header, left_nothing, c.now_ms))
        } else {
            (tracker.on_data_batch(&header), MarkerFate::Keep)
        };
        let last_of_producer = header.producer_id >= 0
            && c.last_of_producers.get(&header.producer_id) == Some(&header.last_offset());
        let cleaned = clean_batch(
            batch,
            &CleanBatch {
                map: c.map,
                now_ms: c.now_ms,
                delete_retention_ms: c.delete_retention_ms,
                aborted,
                last_of_producer,
                marker,
                limit_bytes: c.limit_bytes,
            },
        )?;
        match cleaned {
            Cleaned::Unchanged => {
                out.extend_from_slice(batch);
                stats.bytes_written += batch.len() as u64;
            }
            Cleaned::Rewritten(b) => {
                out.extend_from_slice(&b);
                stats.bytes_written += b.len() as u64;
                stats.batches_rewritten += 1;
            }
            Cleaned::Removed => stats.batches_removed += 1,
        }
    }
    if let Some(e) = iter.error() {
        return Err(from_batch_error(e.clone()));
    }
    debug_assert!(stats.bytes_written <= stats.bytes_read + stats.batches_rewritten * 64);
    Ok(stats)
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

    fn header(b: &[u8]) -> BatchHeader {
        BatchHeader::parse(b).unwrap()
    }

    fn txn_batch(base: i64, producer_id: i64) -> Vec<u8> {
        BatchBuilder::new(Compression::None)
            .base_offset(base)
            .producer(producer_id, 0, 0)
            .transactional(true)
            .record(Some(b"k"), Some(b"v"), &[], TS)
            .build()
            .to_vec()
    }

    fn marker(base: i64, producer_id: i64, kind: ControlType) -> Vec<u8> {
        let mut b = control_batch(kind, producer_id, 0, 0, TS);
        b[..8].copy_from_slice(&base.to_be_bytes());
        b.to_vec()
    }

    #[test]
    fn the_tracker_finds_aborted_batches_and_markers_that_may_go() {
        // Producer 1 commits (0, marker 1); producer 2 aborts (2, marker 4);
        // producer 3 commits with no data here (marker 5).
        let mut t = TxnTracker::new(vec![(2, 2)]);
        assert!(!t.on_data_batch(&header(&txn_batch(0, 1))));
        assert!(t.on_data_batch(&header(&txn_batch(2, 2))), "aborted");
        assert!(!t.on_data_batch(&header(&batch(
            3,
            &[(Some("x"), Some("y"))],
            Compression::None
        ))));
        let commit = marker(1, 1, ControlType::Commit);
        assert!(
            !t.on_marker(&header(&commit), ControlType::Commit),
            "its records remain"
        );
        let abort = marker(4, 2, ControlType::Abort);
        assert!(
            !t.on_marker(&header(&abort), ControlType::Abort),
            "its batch was seen this pass"
        );
        let empty_commit = marker(5, 3, ControlType::Commit);
        assert!(t.on_marker(&header(&empty_commit), ControlType::Commit));
        // An abort whose batches are gone already leaves nothing.
        let mut t = TxnTracker::new(vec![(2, 6)]);
        let abort = marker(7, 2, ControlType::Abort);
        assert!(t.on_marker(&header(&abort), ControlType::Abort));
    }

    #[test]
    fn a_marker_goes_only_after_its_horizon_and_when_its_txn_left_nothing() {
        let map = OffsetMap::new(LIMIT);
        let fresh = marker(0, 1, ControlType::Commit);
        assert_eq!(
            marker_fate(&header(&fresh), true, TS),
            MarkerFate::Keep,
            "no horizon yet"
        );
        let Cleaned::Rewritten(with_horizon) = clean_batch(&fresh, &ctx(&map, TS)).unwrap() else {
            panic!("horizon set")
        };
        let h = header(&with_horizon);
        assert_eq!(marker_fate(&h, true, TS + DAY_MS - 1), MarkerFate::Keep);
        assert_eq!(marker_fate(&h, false, TS + DAY_MS), MarkerFate::Keep);
        assert_eq!(marker_fate(&h, true, TS + DAY_MS), MarkerFate::Remove);
    }

    #[test]
    fn the_filthiest_cleanable_log_is_chosen() {
        let log = |clean, dirty, first_dirty_ms| LogDirt {
            clean_bytes: clean,
            dirty_bytes: dirty,
            first_dirty_ms,
            min_cleanable_dirty_ratio: 0.5,
            max_compaction_lag_ms: 1000,
        };
        let now = TS;
        let logs = [
            log(60, 40, Some(now)), // 0.4: below the ratio
            log(30, 70, Some(now)), // 0.7
            log(10, 90, Some(now)), // 0.9: the filthiest
            log(100, 0, None),      // nothing dirty
        ];
        assert_eq!(filthiest(&logs, now), Some(2));
        assert_eq!(filthiest(&logs[..1], now), None);
        assert_eq!(logs[0].dirty_ratio(), 0.4);
        // Past max.compaction.lag.ms a log is cleaned whatever its ratio.
        assert_eq!(filthiest(&[log(99, 1, Some(now - 1001))], now), Some(0));
        assert_eq!(
            filthiest(&[log(50, 50, Some(now))], now),
            None,
            "strictly above"
        );
        assert_eq!(filthiest(&[], now), None);
    }

    #[test]
    fn segments_are_grouped_up_to_segment_bytes() {
        let seg = |base, next, bytes| SegmentSize {
            base_offset: base,
            next_offset: next,
            bytes,
        };
        let segs = [
            seg(0, 10, 40),
            seg(10, 20, 40),
            seg(20, 30, 40),
            seg(30, 40, 200),
            seg(40, 50, 10),
        ];
        let groups = group_segments(&segs, 100);
        let bases: Vec<Vec<i64>> = groups
            .iter()
            .map(|g| g.iter().map(|s| s.base_offset).collect())
            .collect();
        assert_eq!(bases, vec![vec![0, 10], vec![20], vec![30], vec![40]]);
        // Offsets must stay within 32 bits of the group's base.
        let far = [seg(0, 10, 1), seg(10, i32::MAX as i64 + 2, 1)];
        assert_eq!(group_segments(&far, 100).len(), 2);
        assert!(group_segments(&[], 100).is_empty());
    }

    #[test]
    fn a_segment_is_cleaned_to_the_latest_records_at_their_offsets() {
        let with_base = |mut b: BytesMut, base: i64| {
            b[..8].copy_from_slice(&base.to_be_bytes());
            b.to_vec()
        };
        let aborted_txn = BatchBuilder::new(Compression::None)
            .base_offset(1)
            .producer(7, 0, 0)
            .transactional(true)
            .record(Some(b"k2"), Some(b"x"), &[], TS)
            .build()
            .to_vec();
        let segment: Vec<u8> = [
            batch(0, &[(Some("k1"), Some("a"))], Compression::None),
            aborted_txn,
            with_base(control_batch(ControlType::Abort, 7, 0, 0, TS), 2),
            batch(3, &[(Some("k1"), Some("b"))], Compression::Snappy),
            batch(4, &[(Some("k3"), None)], Compression::None),
        ]
        .concat();
        let mut map = OffsetMap::new(LIMIT);
        let mut tracker = TxnTracker::new(vec![(7, 1)]);
        assert_eq!(
            map_segment(&mut map, &segment, 0, &mut tracker, LIMIT).unwrap(),
            Mapped::Whole
        );
        assert_eq!(
            (map.get(b"k1"), map.get(b"k2"), map.get(b"k3")),
            (Some(3), None, Some(4))
        );
        let last_of_producers = HashMap::from([(7, 1)]);
        let c = SegmentCleaning {
            map: &map,
            last_of_producers: &last_of_producers,
            now_ms: TS,
            delete_retention_ms: DAY_MS,
            limit_bytes: LIMIT,
        };
        let mut out = Vec::new();
        let stats =
            clean_segment(&segment, &c, &mut TxnTracker::new(vec![(7, 1)]), &mut out).unwrap();
        assert_eq!(stats.bytes_read, segment.len() as u64);
        assert_eq!(stats.bytes_written, out.len() as u64);
        assert_eq!(stats.batches_removed, 1, "k1@0");
        let kept: Vec<(i64, i64, i32, bool, bool)> = crate::record::BatchIter::new(&out)
            .map(|(_, h)| {
                (
                    h.base_offset,
                    h.last_offset(),
                    h.records_count,
                    h.is_control(),
                    h.has_delete_horizon(),
                )
            })
            .collect();
        assert_eq!(
            kept,
            vec![
                (1, 1, 0, false, false), // producer 7's last batch, emptied
                (2, 2, 1, true, true),   // its ABORT marker: its batch was seen
                (3, 3, 1, false, false), // k1's latest
                (4, 4, 1, false, true),  // k3's tombstone, with its horizon
            ]
        );
        // Every batch written is valid.
        for (at, h) in crate::record::BatchIter::new(&out) {
            let b = &out[at..at + h.total_size()];
            assert_eq!(crate::record::batch::compute_crc(b), h.crc);
        }
        // Cleaning again after the horizon: the tombstone goes; the ABORT
        // marker stays while its producer's emptied last batch does.
        let clean_again = |input: &[u8], c: &SegmentCleaning<'_>| {
            let mut out = Vec::new();
            clean_segment(input, c, &mut TxnTracker::new(vec![(7, 1)]), &mut out).unwrap();
            let offsets: Vec<i64> = crate::record::BatchIter::new(&out)
                .map(|(_, h)| h.base_offset)
                .collect();
            (out, offsets)
        };
        let later = SegmentCleaning {
            now_ms: TS + DAY_MS,
            ..c
        };
        let (second, offsets) = clean_again(&out, &later);
        assert_eq!(offsets, vec![1, 2, 3]);
        // Once producer 7 wrote later batches elsewhere, its empty batch
        // goes; the marker goes at the cleaning after that, when no batch
        // of its transaction is seen any more.
        let moved_on = HashMap::new();
        let later = SegmentCleaning {
            last_of_producers: &moved_on,
            ..later
        };
        let (third, offsets) = clean_again(&second, &later);
        assert_eq!(offsets, vec![2, 3]);
        let (_, offsets) = clean_again(&third, &later);
        assert_eq!(offsets, vec![3]);
    }
}
