//! Which topic a partition directory belongs to, and how directories of
//! deleted topics go away without their data ever coming back.
//!
//! A partition directory is named `<topic>-<partition>`, so a topic deleted
//! and created again under the same name gets the same directory name. A
//! crash after DeleteTopics is durable in the metadata log but before the
//! directory is gone would otherwise hand the old records (and the old log
//! start and recovery point, from the checkpoint files) to the new topic.
//! Three guards, as Kafka has them:
//!
//! - Every directory the broker creates for a topic holds
//!   `partition.metadata` with the topic's id, in Kafka's format
//!   (`version: 0` / `topic_id: <base64url>`), written before any segment
//!   (temporary file, rename; for a log that fdatasyncs also the fsyncs
//!   of the file, the directory and the data dir, so that it survives a
//!   power loss as its data does; a crash of the broker alone never loses
//!   it, as the page cache keeps it). Opening a partition
//!   whose directory names another topic id removes that directory and
//!   starts the log empty, ignoring the checkpointed offsets
//!   (`LogManager::open_topic`). A directory without the file (written by a
//!   fjord from before it existed) is taken as the topic's and gets one.
//! - DeleteTopics renames the directory to `<topic>-<partition>.<random
//!   hex>-delete` (atomic; the data dir is fsynced after it) before removing
//!   it, so a crash in the middle of the removal never leaves a partly
//!   removed directory under the live name.
//! - At start-up, once the metadata log is replayed, [`sweep`] removes every
//!   `-delete` directory and every directory whose `partition.metadata`
//!   names a topic id the metadata no longer has (Kafka's stray logs).
//!   Directories without the file, or whose file cannot be read, are left
//!   alone: they are never assumed to be garbage.

use crate::types::{base64url, base64url_decode};
use std::collections::HashSet;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The file in a partition directory that names its topic id (Kafka's name).
pub const PARTITION_METADATA_FILE: &str = "partition.metadata";
/// Suffix of a partition directory being deleted (Kafka's).
pub const DELETE_DIR_SUFFIX: &str = "-delete";

/// `partition.metadata` as Kafka writes it.
pub fn encode(topic_id: &[u8; 16]) -> String {
    format!("version: 0\ntopic_id: {}\n", base64url(topic_id))
}

/// The topic id of a `partition.metadata` text; `None` if it is not one.
pub fn decode(text: &str) -> Option<[u8; 16]> {
    let mut lines = text.lines();
    if lines.next()?.trim() != "version: 0" {
        return None;
    }
    let id = lines.next()?.strip_prefix("topic_id:")?.trim();
    base64url_decode(id)?.try_into().ok()
}

/// The topic id recorded in `dir`: `None` if the directory or the file does
/// not exist; an `InvalidData` error if the file is not one (blocking).
pub fn read(dir: &Path) -> io::Result<Option<[u8; 16]>> {
    let path = dir.join(PARTITION_METADATA_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    decode(&text).map(Some).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: not a partition.metadata file", path.display()),
        )
    })
}

/// Writes `partition.metadata` into `dir`: temporary file, rename; with
/// `sync`, fsyncs of the file before the rename and of `dir` after it
/// (blocking).
pub fn write(dir: &Path, topic_id: &[u8; 16], sync: bool) -> io::Result<()> {
    let path = dir.join(PARTITION_METADATA_FILE);
    let tmp = dir.join(format!("{PARTITION_METADATA_FILE}.tmp"));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(encode(topic_id).as_bytes())?;
        if sync {
            f.sync_all()?;
        }
    }
    std::fs::rename(&tmp, &path)?;
    if sync {
        super::sync_dir(dir)?;
    }
    Ok(())
}

/// Makes `dir` (in `data_dir`) the directory of a partition of the topic
/// `topic_id` (blocking). Returns true if the directory is new (then the
/// log starts empty and nothing checkpointed for the partition applies),
/// false if it already belonged to the topic. A directory that belongs to
/// another topic id (a deleted topic's, left by a crash) is removed first.
/// `sync`: make what is written survive a power loss (see the module doc).
pub fn claim(data_dir: &Path, dir: &Path, topic_id: &[u8; 16], sync: bool) -> io::Result<bool> {
    match read(dir)? {
        Some(found) if found == *topic_id => return Ok(false),
        Some(found) => {
            tracing::warn!(
                dir = %dir.display(),
                found = %base64url(&found),
                topic_id = %base64url(topic_id),
                "partition directory belongs to a deleted topic of the same name; removing it"
            );
            delete_dir(data_dir, dir)?;
        }
        None if dir.is_dir() => {
            // Written before partition.metadata existed: the topic's own.
            write(dir, topic_id, sync)?;
            return Ok(false);
        }
        None => {}
    }
    std::fs::create_dir_all(dir)?;
    write(dir, topic_id, sync)?;
    if sync {
        super::sync_dir(data_dir)?;
    }
    Ok(true)
}

/// Removes partition directory `dir` of `data_dir`: renamed to a `-delete`
/// name first (atomic, made durable), then removed; a missing directory is
/// fine (blocking).
pub fn delete_dir(data_dir: &Path, dir: &Path) -> io::Result<()> {
    let Some(name) = dir.file_name().and_then(|n| n.to_str()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("not a partition directory: {}", dir.display()),
        ));
    };
    let doomed = data_dir.join(format!(
        "{name}.{:032x}{DELETE_DIR_SUFFIX}",
        rand::random::<u128>()
    ));
    match std::fs::rename(dir, &doomed) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    }
    super::sync_dir(data_dir)?;
    std::fs::remove_dir_all(&doomed)
}

/// Whether `name` is a directory name [`delete_dir`] gives.
fn is_delete_dir_name(name: &str) -> bool {
    name.strip_suffix(DELETE_DIR_SUFFIX)
        .and_then(|rest| rest.rsplit_once('.'))
        .is_some_and(|(_, hex)| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Removes, at start-up, the `-delete` directories of interrupted deletions
/// and the partition directories whose `partition.metadata` names a topic
/// id not in `live` (a topic deleted while its directories could not be
/// removed). Returns the directories removed. Errors are logged, not
/// returned: what is left is removed at the next start, and a re-created
/// topic never reads it ([`claim`]). Blocking.
pub fn sweep(data_dir: &Path, live: &HashSet<[u8; 16]>) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let entries = match std::fs::read_dir(data_dir) {
        Ok(e) => e,
        Err(e) => {
            if e.kind() != io::ErrorKind::NotFound {
                tracing::warn!(dir = %data_dir.display(), error = %e,
                    "cannot list the data dir for deleted partitions");
            }
            return removed;
        }
    };
    for ent in entries.flatten() {
        let path = ent.path();
        if !ent.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let Some(name) = ent.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let result = if is_delete_dir_name(&name) {
            std::fs::remove_dir_all(&path).map(|()| true)
        } else {
            match read(&path) {
                Ok(Some(id)) if !live.contains(&id) => {
                    tracing::warn!(dir = %path.display(), topic_id = %base64url(&id),
                        "removing the partition directory of a deleted topic");
                    delete_dir(data_dir, &path).map(|()| true)
                }
                Ok(_) => Ok(false),
                Err(e) => {
                    tracing::warn!(dir = %path.display(), error = %e,
                        "cannot read partition.metadata; leaving the directory alone");
                    Ok(false)
                }
            }
        };
        match result {
            Ok(true) => removed.push(path),
            Ok(false) => {}
            Err(e) => tracing::warn!(dir = %path.display(), error = %e,
                "cannot remove the directory of a deleted partition"),
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafka_format_round_trips() {
        let id = [
            0xe1, 0x96, 0xd5, 0x40, 0x62, 0xe1, 0x4a, 0xfa, 0x8f, 0x4e, 0xd0, 0xf7, 0xf9, 0x57,
            0x92, 0x67,
        ];
        let text = encode(&id);
        assert_eq!(text, "version: 0\ntopic_id: 4ZbVQGLhSvqPTtD3-VeSZw\n");
        assert_eq!(decode(&text), Some(id));
        assert_eq!(
            decode("version: 1\ntopic_id: 4ZbVQGLhSvqPTtD3-VeSZw\n"),
            None
        );
        assert_eq!(decode("version: 0\ntopic_id: short\n"), None);
    }

    #[test]
    fn claim_keeps_its_own_replaces_another_topics_and_sweep_removes_strays() {
        let data = tempfile::tempdir().unwrap();
        let dir = data.path().join("t-0");
        let (old, new) = ([1u8; 16], [2u8; 16]);
        assert!(
            claim(data.path(), &dir, &old, true).unwrap(),
            "a new directory"
        );
        std::fs::write(dir.join("00000000000000000000.log"), b"old records").unwrap();
        assert!(
            !claim(data.path(), &dir, &old, true).unwrap(),
            "its own directory"
        );
        assert!(dir.join("00000000000000000000.log").exists());
        // Another topic id under the same name: the old files go.
        assert!(claim(data.path(), &dir, &new, false).unwrap());
        assert_eq!(read(&dir).unwrap(), Some(new));
        assert!(!dir.join("00000000000000000000.log").exists());
        // A directory without the file is adopted as it is.
        let legacy = data.path().join("legacy-0");
        std::fs::create_dir(&legacy).unwrap();
        std::fs::write(legacy.join("00000000000000000000.log"), b"kept").unwrap();
        assert!(!claim(data.path(), &legacy, &old, false).unwrap());
        assert!(legacy.join("00000000000000000000.log").exists());
        assert_eq!(read(&legacy).unwrap(), Some(old));

        // Sweep: a stray (id not live) and an interrupted deletion go; a live
        // directory and one without partition.metadata stay.
        let interrupted = data.path().join(format!("x-1.{:032x}-delete", 7u128));
        std::fs::create_dir(&interrupted).unwrap();
        let bare = data.path().join("bare-0");
        std::fs::create_dir(&bare).unwrap();
        let live: HashSet<[u8; 16]> = [new].into_iter().collect();
        let mut removed = sweep(data.path(), &live);
        removed.sort();
        assert_eq!(removed, vec![legacy.clone(), interrupted.clone()]);
        assert!(dir.exists() && bare.exists());
        let left: Vec<String> = std::fs::read_dir(data.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(
            left.iter().all(|n| !n.ends_with(DELETE_DIR_SUFFIX)),
            "{left:?}"
        );
    }
}
