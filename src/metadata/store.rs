//! The metadata log: `<data-dir>/__cluster_metadata/metadata.log`, one record
//! a line (`<crc32c as 8 hex digits> <json>`), appended and fdatasync'ed
//! before the controller applies the change.
//!
//! Metadata changes are rare (topic creation, configs, producer-id blocks), so
//! this is plain blocking file I/O run off the reactor (glommio's
//! `spawn_blocking`); start-up replays the whole file.
//!
//! Damage, as Kafka's metadata loader treats it:
//! - A torn or corrupt **last** line is what a crash mid-append leaves (each
//!   append is fdatasync'ed before the next one starts, so only the last line
//!   can be half written, or zeros where a power loss kept the new length but
//!   not the data). It is cut off, with a warning, so the next append starts
//!   on a clean line; the change it held was never applied nor acknowledged.
//! - A corrupt line **followed by any other line** cannot come from a crash:
//!   the disk or someone changed the file. Replaying only the records before
//!   it would silently drop every topic, config and producer-id block after
//!   it (and hand out producer ids again), so [`load`] fails with an error
//!   naming the file, the line number and what is wrong with the line, and
//!   the broker refuses to start until the file is repaired.
//!
//! Snapshots (rkyv, DESIGN.md §6) are not written yet: the log stays small
//! because it holds only control records.

use super::MetadataRecord;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Directory of the metadata log inside the data dir (named as Kafka's KRaft log).
pub const METADATA_DIR: &str = "__cluster_metadata";
const METADATA_FILE: &str = "metadata.log";

/// Where the metadata log of `data_dir` lives.
pub fn metadata_path(data_dir: &Path) -> PathBuf {
    data_dir.join(METADATA_DIR).join(METADATA_FILE)
}

pub(crate) fn encode_line(record: &MetadataRecord) -> io::Result<String> {
    let json = serde_json::to_string(record).map_err(io::Error::other)?;
    Ok(format!("{:08x} {json}\n", crc32c::crc32c(json.as_bytes())))
}

/// The record of one line (without its newline), or what is wrong with it.
pub(crate) fn decode_line(line: &[u8]) -> Result<MetadataRecord, String> {
    let line = std::str::from_utf8(line).map_err(|_| "not UTF-8".to_string())?;
    let (crc, json) = line
        .split_once(' ')
        .ok_or_else(|| "not `<crc> <json>`".to_string())?;
    let stored = u32::from_str_radix(crc, 16).map_err(|_| format!("bad CRC field {crc:?}"))?;
    let computed = crc32c::crc32c(json.as_bytes());
    if computed != stored {
        return Err(format!(
            "CRC mismatch: stored {stored:08x}, computed {computed:08x}"
        ));
    }
    serde_json::from_str(json).map_err(|e| format!("undecodable record: {e}"))
}

/// Reads every record. A torn or corrupt last line is cut off (a crash
/// mid-append); a corrupt line with more lines after it is an
/// `InvalidData` error naming the file and the line (see the module doc).
pub fn load(data_dir: &Path) -> io::Result<Vec<MetadataRecord>> {
    let path = metadata_path(data_dir);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let lines: Vec<&[u8]> = bytes.split_inclusive(|&b| b == b'\n').collect();
    let mut records = Vec::with_capacity(lines.len());
    let mut valid_len = 0usize;
    for (i, line) in lines.iter().enumerate() {
        // Only the last piece can lack its newline.
        let decoded = match line.strip_suffix(b"\n") {
            Some(text) => decode_line(text),
            None => Err("no newline: torn line".to_string()),
        };
        match decoded {
            Ok(record) => {
                records.push(record);
                valid_len += line.len();
            }
            Err(reason) if i + 1 == lines.len() => {
                tracing::warn!(
                    path = %path.display(),
                    line = i + 1,
                    %reason,
                    kept_bytes = valid_len,
                    dropped_bytes = bytes.len() - valid_len,
                    "metadata log has a torn last line (a crash mid-append); truncating it"
                );
            }
            Err(reason) => {
                let after = lines.len() - i - 1;
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "metadata log {}: line {} is corrupt ({reason}) and {after} more line(s) \
                         follow it; refusing to start, as replaying only the {} record(s) before \
                         it would silently drop every change after it (restore the file, or \
                         repair or remove that line by hand)",
                        path.display(),
                        i + 1,
                        records.len(),
                    ),
                ));
            }
        }
    }
    if valid_len < bytes.len() {
        let f = OpenOptions::new().write(true).open(&path)?;
        f.set_len(valid_len as u64)?;
        f.sync_all()?;
    }
    Ok(records)
}

/// The data dir's lock file (Kafka's name): a running broker holds an
/// exclusive `flock` on it, so that `fjord scram add` (which appends to
/// the metadata log offline) refuses to write under a running broker.
pub const LOCK_FILE: &str = ".lock";

/// Takes the exclusive lock of `data_dir` without waiting; held until the
/// returned file is dropped (or the process ends, even by kill -9). Err
/// `WouldBlock`: another process holds it.
pub fn lock_data_dir(data_dir: &Path) -> io::Result<File> {
    use std::os::fd::AsRawFd;
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(data_dir.join(LOCK_FILE))?;
    // SAFETY: flock on a file descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(f)
}

/// Appends one record and makes it durable before returning.
pub fn append(data_dir: &Path, record: &MetadataRecord) -> io::Result<()> {
    let path = metadata_path(data_dir);
    let dir = data_dir.join(METADATA_DIR);
    let created = !path.exists();
    let dir_created = !dir.exists();
    if created {
        fs::create_dir_all(&dir)?;
    }
    let mut f = OpenOptions::new().create(true).append(true).open(&path)?;
    f.write_all(encode_line(record)?.as_bytes())?;
    f.sync_data()?;
    // The first record is acknowledged only once the file's directory entry
    // (and the directory's own, in the data dir) is durable too.
    if created {
        File::open(&dir)?.sync_all()?;
    }
    if dir_created {
        File::open(data_dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn append_load_and_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let a = MetadataRecord::CreateTopic {
            name: "t".into(),
            id: [7; 16],
            shards: vec![0, 1],
            configs: BTreeMap::new(),
        };
        let b = MetadataRecord::ProducerIdBlock { next: 1000 };
        append(dir.path(), &a).unwrap();
        append(dir.path(), &b).unwrap();
        assert_eq!(load(dir.path()).unwrap(), vec![a.clone(), b.clone()]);

        // A crash mid-append leaves half a line: it is dropped and cut off.
        let path = metadata_path(dir.path());
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"0badc0de {\"type\":\"Dele").unwrap();
        drop(f);
        assert_eq!(load(dir.path()).unwrap(), vec![a.clone(), b.clone()]);
        append(
            dir.path(),
            &MetadataRecord::DeleteTopic { name: "t".into() },
        )
        .unwrap();
        assert_eq!(load(dir.path()).unwrap().len(), 3);

        // A flipped byte in the last line fails its CRC: it is cut off as
        // a torn tail.
        let mut bytes = fs::read(&path).unwrap();
        let at = bytes.len() - 5;
        bytes[at] ^= 1;
        fs::write(&path, &bytes).unwrap();
        assert_eq!(load(dir.path()).unwrap(), vec![a, b]);
    }

    #[test]
    fn a_corrupt_line_before_others_is_an_error_naming_the_line() {
        let dir = tempfile::tempdir().unwrap();
        for next in [1000, 2000, 3000] {
            append(dir.path(), &MetadataRecord::ProducerIdBlock { next }).unwrap();
        }
        let path = metadata_path(dir.path());
        let good = fs::read(&path).unwrap();
        let second = good.iter().position(|&b| b == b'\n').unwrap() + 1;
        let mut bad = good.clone();
        bad[second + 12] ^= 0x20; // inside the second line's JSON
        fs::write(&path, &bad).unwrap();
        let e = load(dir.path()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        let text = e.to_string();
        assert!(text.contains("line 2 is corrupt"), "{text}");
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(text.contains("CRC mismatch"), "{text}");
        // Nothing was cut off: the file is left for repair.
        assert_eq!(fs::read(&path).unwrap(), bad);
    }
}
