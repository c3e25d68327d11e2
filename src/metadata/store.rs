//! The metadata log: `<data-dir>/__cluster_metadata/metadata.log`, one record
//! a line (`<crc32c as 8 hex digits> <json>`), appended and fdatasync'ed
//! before the controller applies the change.
//!
//! Metadata changes are rare (topic creation, configs, producer-id blocks), so
//! this is plain blocking file I/O run off the reactor (glommio's
//! `spawn_blocking`); start-up replays the whole file. A torn or corrupt last
//! line (a crash mid-append) ends the replay and is cut off, so the next
//! append starts on a clean line. Snapshots (rkyv, DESIGN.md §6) are not
//! written yet: the log stays small because it holds only control records.

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

pub(crate) fn decode_line(line: &str) -> Option<MetadataRecord> {
    let (crc, json) = line.split_once(' ')?;
    let crc = u32::from_str_radix(crc, 16).ok()?;
    if crc32c::crc32c(json.as_bytes()) != crc {
        return None;
    }
    serde_json::from_str(json).ok()
}

/// Reads every intact record; truncates the file after the last one.
pub fn load(data_dir: &Path) -> io::Result<Vec<MetadataRecord>> {
    let path = metadata_path(data_dir);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut records = Vec::new();
    let mut valid_len = 0usize;
    for line in bytes.split_inclusive(|&b| b == b'\n') {
        let Some(text) = line.strip_suffix(b"\n") else {
            break; // no newline: torn last line
        };
        let Some(record) = std::str::from_utf8(text).ok().and_then(decode_line) else {
            break;
        };
        records.push(record);
        valid_len += line.len();
    }
    if valid_len < bytes.len() {
        tracing::warn!(
            path = %path.display(),
            kept_bytes = valid_len,
            dropped_bytes = bytes.len() - valid_len,
            "metadata log has a torn or corrupt tail; truncating it"
        );
        let f = OpenOptions::new().write(true).open(&path)?;
        f.set_len(valid_len as u64)?;
        f.sync_all()?;
    }
    Ok(records)
}

/// Appends one record and makes it durable before returning.
pub fn append(data_dir: &Path, record: &MetadataRecord) -> io::Result<()> {
    let path = metadata_path(data_dir);
    let dir = data_dir.join(METADATA_DIR);
    let created = !path.exists();
    if created {
        fs::create_dir_all(&dir)?;
    }
    let mut f = OpenOptions::new().create(true).append(true).open(&path)?;
    f.write_all(encode_line(record)?.as_bytes())?;
    f.sync_data()?;
    if created {
        File::open(&dir)?.sync_all()?;
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

        // A flipped byte in a line fails its CRC: replay stops there.
        let mut bytes = fs::read(&path).unwrap();
        let at = bytes.len() - 5;
        bytes[at] ^= 1;
        fs::write(&path, &bytes).unwrap();
        assert_eq!(load(dir.path()).unwrap(), vec![a, b]);
    }
}
