//! `<data-dir>/meta.properties`, in Kafka's format: the cluster id and
//! this node's id. A single node makes up its cluster id at its first
//! start. In a cluster of several nodes the metadata quorum's first leader
//! records its id in the metadata log (`MetadataRecord::ClusterId`) and
//! every node rewrites its file to that id once it has applied the record,
//! so tools reading the file and clients asking any node see one id.

use crate::types::base64url;
use std::path::Path;

/// The file's name in the data directory.
pub const FILE_NAME: &str = "meta.properties";

/// The cluster id in `data_dir`'s file, creating the file with a new
/// random id (16 bytes, base64url as Kafka's) on a first start.
pub fn read_or_create(data_dir: &Path, node_id: i32) -> std::io::Result<String> {
    if let Some(id) = read(data_dir) {
        return Ok(id);
    }
    let id = base64url(&rand::random::<[u8; 16]>());
    write(data_dir, &id, node_id)?;
    Ok(id)
}

/// The cluster id the file holds, if it exists and names one.
pub fn read(data_dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(data_dir.join(FILE_NAME)).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("cluster.id="))
        .map(str::trim)
        .filter(|id| !id.is_empty())
        .map(String::from)
}

/// Replaces the file (a synced temporary file renamed over it) with one
/// naming `cluster_id` and `node_id`.
pub fn write(data_dir: &Path, cluster_id: &str, node_id: i32) -> std::io::Result<()> {
    let text = format!("#fjord\ncluster.id={cluster_id}\nnode.id={node_id}\nversion=1\n");
    let tmp = data_dir.join("meta.properties.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, data_dir.join(FILE_NAME))?;
    std::fs::File::open(data_dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_start_makes_an_id_that_later_reads_and_rewrites_keep() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()), None);
        let id = read_or_create(dir.path(), 3).unwrap();
        assert_eq!(id.len(), 22);
        assert_eq!(read_or_create(dir.path(), 3).unwrap(), id);
        write(dir.path(), "the-cluster", 3).unwrap();
        assert_eq!(read(dir.path()).as_deref(), Some("the-cluster"));
        let text = std::fs::read_to_string(dir.path().join(FILE_NAME)).unwrap();
        assert!(text.contains("node.id=3\n"), "{text}");
    }
}
