//! The leader-epoch cache of one partition log and its file,
//! `leader-epoch-checkpoint` (Kafka's `LeaderEpochFileCache` and
//! `LeaderEpochCheckpointFile`): for every leader epoch the log holds data
//! of, the offset where that epoch starts. It answers OffsetForLeaderEpoch
//! (KIP-101, KIP-320): a consumer that read up to offset X in epoch E asks
//! for the end offset of E, and if that is below X, the log was truncated
//! under it (fjord truncates a torn tail at recovery) and the consumer
//! resets its position instead of silently reading past the gap.
//!
//! File format, Kafka's text checkpoint:
//! ```text
//! 0                 <- version
//! 2                 <- number of entries
//! 0 0               <- epoch, start offset
//! 3 1200
//! ```
//!
//! Invariants: epochs and start offsets both strictly increase along the
//! entries; every start offset lies within [log start, log end] of the log
//! at the time it was written. The entries change when a new epoch starts
//! ([`LeaderEpochCache::assign`], written at once: at open, when the node
//! becomes leader at run time, when a replica append carries a newer epoch
//! — the file is written before the batch is staged, `log::replica`),
//! when recovery or a follower's truncation cuts the log's tail
//! ([`LeaderEpochCache::truncate_from_end`], written after the data is
//! cut, `log::truncate`) and when the log start moves
//! ([`LeaderEpochCache::truncate_from_start`]). So a crash can leave only
//! epochs that start at or past the recovered log end, never a batch whose
//! epoch the file does not name. Recovery (at every open) loads the file,
//! applies the recovered log end and the checkpointed log start, assigns
//! this node's epoch at the log end unless the log holds a newer one, and
//! rewrites the file atomically (temporary file, fsync, rename, directory
//! fsync) if that changed anything. A log start moved by retention or
//! DeleteRecords is applied in memory at once and reaches the file at the
//! next open, as Kafka flushes that truncation asynchronously: a file whose
//! first epoch starts too early only says an epoch began before the log
//! start. A missing or unreadable file is rebuilt from the
//! `partitionLeaderEpoch` of the log's batches.
//!
//! Lives inside its [`super::PartitionLog`], on the shard that owns it.

use std::io::Write;
use std::path::{Path, PathBuf};

/// The file's name in the partition directory (Kafka's).
pub const LEADER_EPOCH_CHECKPOINT: &str = "leader-epoch-checkpoint";
/// The only version of the file format.
const LEADER_EPOCH_CHECKPOINT_VERSION: u32 = 0;
/// Kafka's UNDEFINED_EPOCH and UNDEFINED_EPOCH_OFFSET: the answer for an
/// epoch the log knows no end for.
pub const UNDEFINED_EPOCH: i32 = -1;
pub const UNDEFINED_EPOCH_OFFSET: i64 = -1;
/// Entries a file may declare; a count beyond it is a corrupt file (an
/// epoch per leader election: no partition sees a million).
const ENTRIES_MAX: usize = 1 << 20;

/// One epoch and the offset of its first record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpochEntry {
    pub epoch: i32,
    pub start_offset: i64,
}

/// The epochs of one log, oldest first. See the module doc.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaderEpochCache {
    entries: Vec<EpochEntry>,
}

impl LeaderEpochCache {
    pub fn entries(&self) -> &[EpochEntry] {
        &self.entries
    }

    /// The newest epoch, if any.
    pub fn latest_epoch(&self) -> Option<i32> {
        self.entries.last().map(|e| e.epoch)
    }

    /// Records that `epoch` starts at `start_offset`, as Kafka's `assign`
    /// does: nothing changes when `epoch` is the newest known and starts no
    /// earlier; otherwise the entries that would break monotonicity (an
    /// epoch not older, or a start offset not lower) are dropped and the
    /// new one is added. Returns whether the entries changed.
    pub fn assign(&mut self, epoch: i32, start_offset: i64) -> bool {
        if epoch < 0 || start_offset < 0 {
            return false;
        }
        if let Some(last) = self.entries.last() {
            if epoch == last.epoch && start_offset >= last.start_offset {
                return false;
            }
        }
        self.entries
            .retain(|e| e.epoch < epoch && e.start_offset < start_offset);
        self.entries.push(EpochEntry {
            epoch,
            start_offset,
        });
        self.check_invariants();
        true
    }

    /// Drops the epochs that start at or after `end_offset` (the log was
    /// truncated to end there). Returns whether the entries changed.
    pub fn truncate_from_end(&mut self, end_offset: i64) -> bool {
        let before = self.entries.len();
        self.entries.retain(|e| e.start_offset < end_offset);
        before != self.entries.len()
    }

    /// The log now starts at `start_offset`: epochs that started at or
    /// before it are dropped except the newest of them, which now starts at
    /// `start_offset` (Kafka's `truncateFromStart`). Returns whether the
    /// entries changed.
    pub fn truncate_from_start(&mut self, start_offset: i64) -> bool {
        let below = self
            .entries
            .iter()
            .take_while(|e| e.start_offset <= start_offset)
            .count();
        if below == 0 {
            return false;
        }
        let kept = EpochEntry {
            epoch: self.entries[below - 1].epoch,
            start_offset,
        };
        let changed = below > 1 || self.entries[0] != kept;
        self.entries.drain(..below - 1);
        self.entries[0] = kept;
        self.check_invariants();
        changed
    }

    /// Kafka's `endOffsetFor(requestedEpoch, logEndOffset)`: the largest
    /// epoch ≤ `requested` the log knows and the offset where the epoch
    /// after it starts (`log_end` for the newest epoch), or
    /// ([`UNDEFINED_EPOCH`], [`UNDEFINED_EPOCH_OFFSET`]) when `requested`
    /// is undefined (-1) or newer than every known epoch. For an epoch
    /// older than every known one the answer is (`requested`, start of the
    /// first known epoch), as Kafka gives: the data before it is gone.
    pub fn end_offset_for(&self, requested: i32, log_end: i64) -> (i32, i64) {
        const UNDEFINED: (i32, i64) = (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET);
        if requested == UNDEFINED_EPOCH {
            return UNDEFINED;
        }
        if self.latest_epoch() == Some(requested) {
            return (requested, log_end);
        }
        let Some(higher) = self.entries.iter().find(|e| e.epoch > requested) else {
            return UNDEFINED;
        };
        match self.entries.iter().rev().find(|e| e.epoch <= requested) {
            Some(floor) => (floor.epoch, higher.start_offset),
            None => (requested, higher.start_offset),
        }
    }

    /// Kafka's `epochForOffset`: the epoch `offset` was appended in (the
    /// newest epoch starting at or before it), if the log knows one.
    pub fn epoch_for_offset(&self, offset: i64) -> Option<i32> {
        self.entries
            .iter()
            .rev()
            .find(|e| e.start_offset <= offset)
            .map(|e| e.epoch)
    }

    /// The file's text.
    pub fn encode(&self) -> String {
        let mut s = format!(
            "{LEADER_EPOCH_CHECKPOINT_VERSION}\n{}\n",
            self.entries.len()
        );
        for e in &self.entries {
            s.push_str(&format!("{} {}\n", e.epoch, e.start_offset));
        }
        s
    }

    /// Parses the file's text; `None` if it is not a well-formed version-0
    /// checkpoint with increasing epochs and offsets.
    pub fn decode(text: &str) -> Option<LeaderEpochCache> {
        let mut lines = text.lines();
        if lines.next()?.trim().parse::<u32>().ok()? != LEADER_EPOCH_CHECKPOINT_VERSION {
            return None;
        }
        let count: usize = lines.next()?.trim().parse().ok()?;
        if count > ENTRIES_MAX {
            return None;
        }
        let mut entries = Vec::with_capacity(count);
        for _ in 0..count {
            let mut parts = lines.next()?.split_whitespace();
            let epoch: i32 = parts.next()?.parse().ok()?;
            let start_offset: i64 = parts.next()?.parse().ok()?;
            if parts.next().is_some() || epoch < 0 || start_offset < 0 {
                return None;
            }
            if let Some(last) = entries.last() {
                let last: &EpochEntry = last;
                if epoch <= last.epoch || start_offset <= last.start_offset {
                    return None;
                }
            }
            entries.push(EpochEntry {
                epoch,
                start_offset,
            });
        }
        if lines.any(|l| !l.trim().is_empty()) {
            return None;
        }
        Some(LeaderEpochCache { entries })
    }

    /// Reads `dir`'s checkpoint; `None` if it is missing or malformed
    /// (malformed: with a warning; the caller rebuilds it).
    pub fn read(dir: &Path) -> Option<LeaderEpochCache> {
        let path = dir.join(LEADER_EPOCH_CHECKPOINT);
        let text = std::fs::read_to_string(&path).ok()?;
        let cache = LeaderEpochCache::decode(&text);
        if cache.is_none() {
            tracing::warn!(file = %path.display(), "malformed leader-epoch checkpoint; rebuilding it");
        }
        cache
    }

    /// Atomically replaces `dir`'s checkpoint with these entries.
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        let path = dir.join(LEADER_EPOCH_CHECKPOINT);
        let tmp: PathBuf = dir.join(format!("{LEADER_EPOCH_CHECKPOINT}.tmp"));
        {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(self.encode().as_bytes())?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &path)?;
        super::sync_dir(dir)
    }

    fn check_invariants(&self) {
        debug_assert!(
            self.entries
                .windows(2)
                .all(|w| w[0].epoch < w[1].epoch && w[0].start_offset < w[1].start_offset),
            "leader epochs and their start offsets increase: {:?}",
            self.entries
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(entries: &[(i32, i64)]) -> LeaderEpochCache {
        let mut c = LeaderEpochCache::default();
        for &(epoch, start_offset) in entries {
            assert!(c.assign(epoch, start_offset));
        }
        c
    }

    #[test]
    fn end_offsets_follow_kafkas_rules() {
        let c = cache(&[(1, 10), (3, 20), (5, 30)]);
        // The newest epoch ends at the log end.
        assert_eq!(c.end_offset_for(5, 42), (5, 42));
        // An older epoch ends where the next one starts.
        assert_eq!(c.end_offset_for(1, 42), (1, 20));
        assert_eq!(c.end_offset_for(3, 42), (3, 30));
        // An unknown epoch between two known ones: the largest known below.
        assert_eq!(c.end_offset_for(2, 42), (1, 20));
        assert_eq!(c.end_offset_for(4, 42), (3, 30));
        // Older than every known epoch: itself and the first start offset.
        assert_eq!(c.end_offset_for(0, 42), (0, 10));
        // Newer than every known epoch, or undefined: UNDEFINED.
        assert_eq!(c.end_offset_for(6, 42), (-1, -1));
        assert_eq!(c.end_offset_for(-1, 42), (-1, -1));
        // An empty cache knows no epoch.
        assert_eq!(LeaderEpochCache::default().end_offset_for(0, 42), (-1, -1));
        // The epoch an offset was appended in.
        assert_eq!(c.epoch_for_offset(9), None);
        assert_eq!(c.epoch_for_offset(10), Some(1));
        assert_eq!(c.epoch_for_offset(29), Some(3));
        assert_eq!(c.epoch_for_offset(1000), Some(5));
    }

    #[test]
    fn assign_keeps_epochs_and_offsets_increasing() {
        let mut c = cache(&[(0, 0)]);
        assert!(!c.assign(0, 5), "the same epoch later is no new start");
        assert!(c.assign(2, 5));
        // An older epoch later drops the newer one (Kafka's
        // maybeTruncateNonMonotonicEntries).
        assert!(c.assign(1, 9));
        assert_eq!(c.latest_epoch(), Some(1));
        // A newer epoch at an offset where known ones started replaces them.
        assert!(c.assign(4, 5));
        assert_eq!(
            c.entries(),
            &[
                EpochEntry {
                    epoch: 0,
                    start_offset: 0
                },
                EpochEntry {
                    epoch: 4,
                    start_offset: 5
                }
            ]
        );
    }

    #[test]
    fn truncation_from_either_end() {
        let mut c = cache(&[(0, 0), (2, 10), (3, 20)]);
        assert!(!c.truncate_from_end(21));
        assert!(c.truncate_from_end(20));
        assert_eq!(c.latest_epoch(), Some(2));
        assert!(c.truncate_from_start(12));
        assert_eq!(
            c.entries(),
            &[EpochEntry {
                epoch: 2,
                start_offset: 12
            }]
        );
        assert!(!c.truncate_from_start(12));
        assert!(
            !c.truncate_from_start(3),
            "a start below the first entry changes nothing"
        );
    }

    #[test]
    fn file_text_round_trips_and_rejects_malformed() {
        let c = cache(&[(0, 0), (4, 1200)]);
        assert_eq!(c.encode(), "0\n2\n0 0\n4 1200\n");
        assert_eq!(LeaderEpochCache::decode(&c.encode()), Some(c));
        assert_eq!(
            LeaderEpochCache::decode("0\n0\n"),
            Some(LeaderEpochCache::default())
        );
        for bad in [
            "",
            "1\n1\n0 0\n",
            "0\n2\n0 0\n",
            "0\n1\n0\n",
            "0\n1\n0 0 7\n",
            "0\n2\n3 0\n1 5\n",
            "0\n2\n0 5\n1 5\n",
            "0\n1\n-2 0\n",
            "0\n1\n0 0\n9 9\n",
            "0\n99999999999\n",
        ] {
            assert_eq!(LeaderEpochCache::decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn write_then_read() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(LeaderEpochCache::read(dir.path()), None);
        let c = cache(&[(0, 3)]);
        c.write(dir.path()).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join(LEADER_EPOCH_CHECKPOINT)).unwrap(),
            "0\n1\n0 3\n"
        );
        assert_eq!(LeaderEpochCache::read(dir.path()), Some(c));
    }
}
