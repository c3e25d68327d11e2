//! Offset checkpoint files in Kafka's text format:
//! ```text
//! 0                 <- version
//! 2                 <- number of entries
//! topic 0 1234      <- topic, partition, offset
//! other 3 0
//! ```
//! Kafka keeps one `recovery-point-offset-checkpoint` and one
//! `log-start-offset-checkpoint` per data directory, and one
//! `replication-offset-checkpoint` with the high watermark of every
//! replicated partition (`LogManager`'s module doc says when it is written
//! and read). In fjord several shards
//! own partitions of one data directory, and a shard must never wait on
//! another to write a shared file, so each shard writes its own files with a
//! `.shard-<k>` suffix. A partition may belong to another shard after a
//! restart with a different `--cores`, so [`read_all`] reads every shard's
//! file and keeps, per partition, the smallest offset seen: recovering from
//! too early a point only costs a longer scan, too late a point would trust
//! unverified data; too low a high watermark only delays consumers until
//! the leader raises it again, too high a one would show them records a
//! truncation may remove.
//!
//! Files are replaced atomically: written to `<name>.tmp`, fsynced, renamed,
//! and the directory fsynced (an error if that fails: a checkpoint is done
//! only once the rename survives a power loss).

use crate::types::TopicPartition;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

pub const RECOVERY_POINT_CHECKPOINT: &str = "recovery-point-offset-checkpoint";
pub const LOG_START_CHECKPOINT: &str = "log-start-offset-checkpoint";
/// Kafka's name: the high watermarks of the replicated partitions.
pub const REPLICATION_OFFSET_CHECKPOINT: &str = "replication-offset-checkpoint";
const CHECKPOINT_VERSION: u32 = 0;
/// The shortest entry line: an empty topic, one-digit partition and offset
/// (` 0 0`). Bounds the entries a text can hold, whatever count it declares.
const ENTRY_LINE_MIN_BYTES: usize = 4;

/// `<dir>/<name>.shard-<shard>`.
pub fn shard_file(dir: &Path, name: &str, shard: usize) -> PathBuf {
    dir.join(format!("{name}.shard-{shard}"))
}

pub fn encode(entries: &[(TopicPartition, i64)]) -> String {
    let mut s = format!("{CHECKPOINT_VERSION}\n{}\n", entries.len());
    for (tp, off) in entries {
        s.push_str(&format!("{} {} {}\n", tp.topic, tp.partition.0, off));
    }
    s
}

/// Parses a checkpoint file's text; `None` if it is malformed.
pub fn decode(text: &str) -> Option<Vec<(TopicPartition, i64)>> {
    let mut lines = text.lines();
    if lines.next()?.trim().parse::<u32>().ok()? != CHECKPOINT_VERSION {
        return None;
    }
    let n: usize = lines.next()?.trim().parse().ok()?;
    // The count comes from the file: reserve no more than its text can hold.
    let mut out = Vec::with_capacity(n.min(text.len() / ENTRY_LINE_MIN_BYTES));
    for _ in 0..n {
        let line = lines.next()?;
        let mut parts = line.rsplitn(3, ' ');
        let off: i64 = parts.next()?.parse().ok()?;
        let part: i32 = parts.next()?.parse().ok()?;
        let topic = parts.next()?;
        out.push((TopicPartition::new(topic, part), off));
    }
    Some(out)
}

/// Atomically replaces `path` with `entries`.
pub fn write(path: &Path, entries: &[(TopicPartition, i64)]) -> std::io::Result<()> {
    // `<name>.shard-<k>.tmp`: with_extension would drop `.shard-<k>` and
    // make every shard write the same temporary file.
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(encode(entries).as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    // The rename is durable only with the directory: DeleteRecords answers
    // once its log start is checkpointed, so a failure here is an error.
    if let Some(dir) = path.parent() {
        super::sync_dir(dir)?;
    }
    Ok(())
}

/// Reads every `<name>` and `<name>.shard-*` in `dir`, keeping the smallest
/// offset per partition. Malformed files are skipped with a warning.
pub fn read_all(dir: &Path, name: &str) -> HashMap<TopicPartition, i64> {
    let mut out: HashMap<TopicPartition, i64> = HashMap::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    let prefix = format!("{name}.shard-");
    for ent in rd.flatten() {
        let fname = ent.file_name();
        let Some(fname) = fname.to_str() else {
            continue;
        };
        let is_shard_file = fname.starts_with(&prefix) && !fname.ends_with(".tmp");
        if fname != name && !is_shard_file {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(ent.path()) else {
            continue;
        };
        match decode(&text) {
            Some(entries) => {
                for (tp, off) in entries {
                    let e = out.entry(tp).or_insert(off);
                    *e = (*e).min(off);
                }
            }
            None => {
                tracing::warn!(file = %ent.path().display(), "malformed checkpoint file ignored")
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_kafka_text_format() {
        let e = vec![
            (TopicPartition::new("a-b", 0), 42),
            (TopicPartition::new("t", 3), 0),
        ];
        let s = encode(&e);
        assert_eq!(s, "0\n2\na-b 0 42\nt 3 0\n");
        assert_eq!(decode(&s).unwrap(), e);
        assert!(decode("1\n0\n").is_none());
        assert!(decode("0\n2\na 0 1\n").is_none());
    }

    #[test]
    fn a_huge_declared_count_allocates_nothing_and_fails() {
        // Found by the `checkpoint` fuzz target (minimised): 222,333,033
        // declared entries once reserved ~9 GB before the first line.
        assert!(decode("0\n222333033").is_none());
        assert!(decode(&format!("0\n{}\n", usize::MAX)).is_none());
    }

    #[test]
    fn read_all_keeps_minimum_across_shards() {
        let d = tempfile::tempdir().unwrap();
        let tp = TopicPartition::new("t", 0);
        write(
            &shard_file(d.path(), LOG_START_CHECKPOINT, 0),
            &[(tp.clone(), 7)],
        )
        .unwrap();
        write(
            &shard_file(d.path(), LOG_START_CHECKPOINT, 1),
            &[(tp.clone(), 5)],
        )
        .unwrap();
        let m = read_all(d.path(), LOG_START_CHECKPOINT);
        assert_eq!(m.get(&tp), Some(&5));
    }
}
