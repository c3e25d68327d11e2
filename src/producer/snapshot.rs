//! Producer-state snapshots: `<offset:020>.snapshot` in the partition's
//! directory, the producer table as of `offset` (every batch below it applied,
//! none at or above it).
//!
//! Layout: a 16-byte header — magic `FJPS`, format version (u16 LE), 2 zero
//! bytes, CRC-32C of the payload (u32 LE), payload length (u32 LE) — then the
//! payload, an rkyv archive of [`SnapshotData`]. The file is read into a
//! 16-byte-aligned buffer and the archive is accessed in place (validated by
//! rkyv's bytecheck, never trusted blindly): loading is a view, not a parse.
//! Version 3 added each producer's coordinator epoch; version 2 files
//! ([`SnapshotDataV2`]) are still read, their producers' coordinator epochs
//! unknown (-1) until their next marker.
//!
//! The files are small and written rarely (at every segment roll, as Kafka
//! does, at the new segment's base offset once the batches below it are
//! written; for a quiescent partition at most every few seconds; and at clean
//! shutdown), so writing is plain blocking I/O
//! run off the reactor: write a temporary file, fsync, rename, keep the newest
//! [`SNAPSHOTS_KEPT`].

use super::{BatchMeta, ProducerEntry};
use std::collections::VecDeque;
use std::io;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 4] = b"FJPS";
/// Version 2 added the open transaction's first offset, version 3 the
/// coordinator epoch. Written: the latest.
pub const FORMAT_VERSION: u16 = 3;
/// The older format still read.
pub const FORMAT_VERSION_2: u16 = 2;
const HEADER_BYTES: usize = 16;
/// Snapshots kept per partition; older ones are deleted after a new one is written.
pub const SNAPSHOTS_KEPT: usize = 2;
const SUFFIX: &str = ".snapshot";

#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Debug, Clone, PartialEq)]
pub struct SnapshotBatch {
    pub first_seq: i32,
    pub last_seq: i32,
    pub first_offset: i64,
    pub last_offset: i64,
    pub max_timestamp: i64,
}

#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Debug, Clone, PartialEq)]
pub struct SnapshotProducer {
    pub producer_id: i64,
    pub epoch: i16,
    pub last_update_ms: i64,
    pub batches: Vec<SnapshotBatch>,
    /// -1 = no open transaction.
    pub current_txn_first_offset: i64,
    /// The coordinator epoch of the producer's last marker, -1 = none.
    pub coordinator_epoch: i32,
}

#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Debug, Clone, PartialEq)]
pub struct SnapshotData {
    pub offset: i64,
    pub producers: Vec<SnapshotProducer>,
}

/// A producer in a version-2 snapshot: no coordinator epoch.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Debug, Clone, PartialEq)]
pub struct SnapshotProducerV2 {
    pub producer_id: i64,
    pub epoch: i16,
    pub last_update_ms: i64,
    pub batches: Vec<SnapshotBatch>,
    pub current_txn_first_offset: i64,
}

/// A version-2 snapshot, as written before version 3.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Debug, Clone, PartialEq)]
pub struct SnapshotDataV2 {
    pub offset: i64,
    pub producers: Vec<SnapshotProducerV2>,
}

/// A validated view of a snapshot's archive, in the format its header
/// names.
#[derive(Clone, Copy)]
pub enum SnapshotView<'a> {
    V2(&'a ArchivedSnapshotDataV2),
    V3(&'a ArchivedSnapshotData),
}

impl SnapshotView<'_> {
    /// The offset the snapshot was taken at.
    pub fn offset(&self) -> i64 {
        match self {
            SnapshotView::V2(v) => v.offset.to_native(),
            SnapshotView::V3(v) => v.offset.to_native(),
        }
    }

    /// How many producers it holds.
    pub fn len(&self) -> usize {
        match self {
            SnapshotView::V2(v) => v.producers.len(),
            SnapshotView::V3(v) => v.producers.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Why a snapshot file was not usable.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot too short ({0} bytes)")]
    Truncated(usize),
    #[error("not a fjord producer snapshot")]
    BadMagic,
    #[error("unsupported snapshot format version {0}")]
    UnsupportedVersion(u16),
    #[error("snapshot checksum mismatch")]
    Checksum,
    #[error("snapshot archive invalid: {0}")]
    Archive(String),
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// `<offset:020>.snapshot`, as Kafka names its producer snapshots.
pub fn file_name(offset: i64) -> String {
    format!("{offset:020}{SUFFIX}")
}

/// Serializes `producers` as of `offset`.
pub fn encode<'a>(
    offset: i64,
    producers: impl Iterator<Item = (&'a i64, &'a ProducerEntry)>,
) -> Result<Vec<u8>, SnapshotError> {
    let data = SnapshotData {
        offset,
        producers: producers
            .map(|(&producer_id, e)| SnapshotProducer {
                producer_id,
                epoch: e.epoch,
                last_update_ms: e.last_update_ms,
                current_txn_first_offset: e.current_txn_first_offset.unwrap_or(-1),
                coordinator_epoch: e.coordinator_epoch,
                batches: e
                    .batches
                    .iter()
                    .map(|b| SnapshotBatch {
                        first_seq: b.first_seq,
                        last_seq: b.last_seq,
                        first_offset: b.first_offset,
                        last_offset: b.last_offset,
                        max_timestamp: b.max_timestamp,
                    })
                    .collect(),
            })
            .collect(),
    };
    let payload = rkyv::to_bytes::<rkyv::rancor::Error>(&data)
        .map_err(|e| SnapshotError::Archive(e.to_string()))?;
    Ok(framed(FORMAT_VERSION, &payload))
}

/// `payload` behind the header of format `version`.
fn framed(version: u16, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// Checks the header and gives a validated view of the archive (version 2
/// or 3).
pub fn view(aligned: &rkyv::util::AlignedVec<16>) -> Result<SnapshotView<'_>, SnapshotError> {
    let bytes: &[u8] = aligned;
    if bytes.len() < HEADER_BYTES {
        return Err(SnapshotError::Truncated(bytes.len()));
    }
    if &bytes[0..4] != MAGIC {
        return Err(SnapshotError::BadMagic);
    }
    let version = u16::from_le_bytes([bytes[4], bytes[5]]);
    if version != FORMAT_VERSION && version != FORMAT_VERSION_2 {
        return Err(SnapshotError::UnsupportedVersion(version));
    }
    let crc = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    let len = u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]) as usize;
    let Some(payload) = bytes.get(HEADER_BYTES..HEADER_BYTES + len) else {
        return Err(SnapshotError::Truncated(bytes.len()));
    };
    if crc32c::crc32c(payload) != crc {
        return Err(SnapshotError::Checksum);
    }
    let invalid = |e: rkyv::rancor::Error| SnapshotError::Archive(e.to_string());
    if version == FORMAT_VERSION_2 {
        rkyv::access::<ArchivedSnapshotDataV2, rkyv::rancor::Error>(payload)
            .map(SnapshotView::V2)
            .map_err(invalid)
    } else {
        rkyv::access::<ArchivedSnapshotData, rkyv::rancor::Error>(payload)
            .map(SnapshotView::V3)
            .map_err(invalid)
    }
}

/// Reads a file into an aligned buffer for [`view`].
pub fn read_aligned(path: &Path) -> Result<rkyv::util::AlignedVec<16>, SnapshotError> {
    let bytes = std::fs::read(path)?;
    let mut aligned = rkyv::util::AlignedVec::<16>::with_capacity(bytes.len());
    aligned.extend_from_slice(&bytes);
    Ok(aligned)
}

/// The batches of an archived producer.
fn batches(archived: &[ArchivedSnapshotBatch]) -> VecDeque<BatchMeta> {
    archived
        .iter()
        .map(|b| BatchMeta {
            first_seq: b.first_seq.to_native(),
            last_seq: b.last_seq.to_native(),
            first_offset: b.first_offset.to_native(),
            last_offset: b.last_offset.to_native(),
            max_timestamp: b.max_timestamp.to_native(),
        })
        .collect()
}

/// The producer entries of a snapshot view (a version-2 snapshot's with
/// coordinator epoch -1: not known).
pub fn entries(view: SnapshotView<'_>) -> Vec<(i64, ProducerEntry)> {
    let first_offset = |o: i64| Some(o).filter(|o| *o >= 0);
    match view {
        SnapshotView::V2(v) => v
            .producers
            .iter()
            .map(|p| {
                (
                    p.producer_id.to_native(),
                    ProducerEntry {
                        epoch: p.epoch.to_native(),
                        batches: batches(&p.batches),
                        last_update_ms: p.last_update_ms.to_native(),
                        current_txn_first_offset: first_offset(
                            p.current_txn_first_offset.to_native(),
                        ),
                        coordinator_epoch: super::NO_COORDINATOR_EPOCH,
                    },
                )
            })
            .collect(),
        SnapshotView::V3(v) => v
            .producers
            .iter()
            .map(|p| {
                (
                    p.producer_id.to_native(),
                    ProducerEntry {
                        epoch: p.epoch.to_native(),
                        batches: batches(&p.batches),
                        last_update_ms: p.last_update_ms.to_native(),
                        current_txn_first_offset: first_offset(
                            p.current_txn_first_offset.to_native(),
                        ),
                        coordinator_epoch: p.coordinator_epoch.to_native(),
                    },
                )
            })
            .collect(),
    }
}

/// Snapshot files of a partition directory, oldest first.
pub fn list(dir: &Path) -> Vec<(i64, PathBuf)> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<(i64, PathBuf)> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let offset = name.strip_suffix(SUFFIX)?.parse::<i64>().ok()?;
            Some((offset, e.path()))
        })
        .collect();
    out.sort();
    out
}

/// Writes a snapshot durably and prunes old ones (blocking).
pub fn write(dir: &Path, offset: i64, bytes: &[u8]) -> io::Result<()> {
    let path = dir.join(file_name(offset));
    let tmp = dir.join(format!("{}.tmp", file_name(offset)));
    std::fs::write(&tmp, bytes)?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, &path)?;
    std::fs::File::open(dir)?.sync_all()?;
    let all = list(dir);
    if all.len() > SNAPSHOTS_KEPT {
        for (_, old) in &all[..all.len() - SNAPSHOTS_KEPT] {
            let _ = std::fs::remove_file(old);
        }
    }
    Ok(())
}

/// The newest usable snapshot at or below `max_offset` (blocking). Snapshots
/// beyond it (the log lost their data) and unreadable ones are deleted.
pub fn load_newest(dir: &Path, max_offset: i64) -> Option<(i64, Vec<(i64, ProducerEntry)>)> {
    for (offset, path) in list(dir).into_iter().rev() {
        if offset > max_offset {
            tracing::warn!(path = %path.display(), "producer snapshot beyond the log end; deleting it");
            let _ = std::fs::remove_file(&path);
            continue;
        }
        let loaded = read_aligned(&path).and_then(|buf| {
            let v = view(&buf)?;
            Ok((v.offset(), entries(v)))
        });
        match loaded {
            Ok((o, e)) if o == offset => return Some((o, e)),
            Ok(_) => {
                tracing::warn!(path = %path.display(), "producer snapshot offset does not match its name; deleting it")
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "unreadable producer snapshot; deleting it")
            }
        }
        let _ = std::fs::remove_file(&path);
    }
    None
}

/// Lines describing a snapshot file, for `fjord dump-log`.
pub fn describe(path: &Path) -> Result<Vec<String>, SnapshotError> {
    let buf = read_aligned(path)?;
    let v = view(&buf)?;
    let mut lines = vec![format!(
        "Producer snapshot at offset {} with {} producers",
        v.offset(),
        v.len()
    )];
    let mut producers = entries(v);
    producers.sort_by_key(|(pid, _)| *pid);
    for (pid, e) in producers {
        let (first_seq, last_seq, last_offset, ts) = match (e.batches.front(), e.batches.back()) {
            (Some(f), Some(l)) => (f.first_seq, l.last_seq, l.last_offset, l.max_timestamp),
            _ => (-1, -1, -1, -1),
        };
        lines.push(format!(
            "producerId: {pid} producerEpoch: {} coordinatorEpoch: {} currentTxnFirstOffset: {} firstSequence: {first_seq} lastSequence: {last_seq} lastOffset: {last_offset} lastTimestamp: {ts} lastUpdateMs: {} batches: {}",
            e.epoch,
            e.coordinator_epoch,
            e.current_txn_first_offset
                .map_or("None".to_string(), |o| format!("Some({o})")),
            e.last_update_ms,
            e.batches.len()
        ));
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::producer::ProducerStateTable;
    use crate::record::BatchHeader;

    fn header(pid: i64, seq: i32) -> BatchHeader {
        BatchHeader {
            base_offset: 0,
            batch_length: 100,
            partition_leader_epoch: -1,
            magic: 2,
            crc: 0,
            attributes: 0,
            last_offset_delta: 2,
            base_timestamp: 5,
            max_timestamp: 7,
            producer_id: pid,
            producer_epoch: 1,
            base_sequence: seq,
            records_count: 3,
        }
    }

    #[test]
    fn round_trip_prune_and_reject_damage() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = ProducerStateTable::new(100);
        t.record(&header(4, 0), 0, 1000);
        t.record(&header(4, 3), 3, 1001);
        t.record(&header(9, 0), 6, 1002);
        t.set_coordinator_epoch(4, 7);
        for offset in [9, 12, 15] {
            write(dir.path(), offset, &encode(offset, t.entries()).unwrap()).unwrap();
        }
        assert_eq!(
            list(dir.path()).iter().map(|(o, _)| *o).collect::<Vec<_>>(),
            vec![12, 15]
        );
        let (offset, entries) = load_newest(dir.path(), 100).unwrap();
        assert_eq!(offset, 15);
        let mut back = ProducerStateTable::new(100);
        for (pid, e) in entries {
            back.insert(pid, e);
        }
        assert_eq!(back.get(4), t.get(4));
        assert_eq!(back.get(4).map(|e| e.coordinator_epoch), Some(7));
        assert_eq!(back.get(9), t.get(9));
        assert!(describe(&dir.path().join(file_name(15))).unwrap()[1].contains("producerId: 4"));

        // Beyond the log end: ignored (and deleted); a damaged one too.
        assert_eq!(load_newest(dir.path(), 13).map(|(o, _)| o), Some(12));
        let p12 = dir.path().join(file_name(12));
        let mut bytes = std::fs::read(&p12).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(&p12, bytes).unwrap();
        assert!(load_newest(dir.path(), 100).is_none());
    }

    /// A version-2 snapshot (written before the coordinator epoch was
    /// stored) still loads, its producers' coordinator epochs unknown (-1);
    /// a version neither 2 nor 3 is refused.
    #[test]
    fn a_version_2_snapshot_loads_without_coordinator_epochs() {
        let data = SnapshotDataV2 {
            offset: 7,
            producers: vec![SnapshotProducerV2 {
                producer_id: 4,
                epoch: 1,
                last_update_ms: 1000,
                batches: vec![SnapshotBatch {
                    first_seq: 0,
                    last_seq: 2,
                    first_offset: 0,
                    last_offset: 2,
                    max_timestamp: 7,
                }],
                current_txn_first_offset: 3,
            }],
        };
        let payload = rkyv::to_bytes::<rkyv::rancor::Error>(&data).unwrap();
        let aligned = |bytes: &[u8]| {
            let mut a = rkyv::util::AlignedVec::<16>::with_capacity(bytes.len());
            a.extend_from_slice(bytes);
            a
        };
        let v2 = aligned(&framed(FORMAT_VERSION_2, &payload));
        let v = view(&v2).unwrap();
        assert_eq!((v.offset(), v.len()), (7, 1));
        let e = entries(v);
        assert_eq!(e.len(), 1);
        let (pid, entry) = &e[0];
        assert_eq!(*pid, 4);
        assert_eq!(entry.epoch, 1);
        assert_eq!(
            entry.coordinator_epoch,
            crate::producer::NO_COORDINATOR_EPOCH
        );
        assert_eq!(entry.current_txn_first_offset, Some(3));
        assert_eq!(entry.batches.len(), 1);
        let other = aligned(&framed(9, &payload));
        assert!(matches!(
            view(&other),
            Err(SnapshotError::UnsupportedVersion(9))
        ));
    }
}
