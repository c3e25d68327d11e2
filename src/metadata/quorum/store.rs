//! The metadata quorum's Raft log: the entries, the hard state (term, vote,
//! commit) and the membership (`ConfState`) raft-rs needs, in memory for
//! `raft::Storage` and in one append-only file for restarts.
//!
//! The file is a sequence of records, each `[length u32][crc32c u32]
//! [kind i8][body]` (length and CRC cover kind and body):
//! - `ENTRIES`: entries to append at the first one's index, replacing any
//!   entries from there on (raft-rs's `append`: a new leader may overwrite
//!   an uncommitted suffix);
//! - `HARD_STATE`, `CONF_STATE`: the new value, replacing the old;
//! - `ADDRESSES`: the learners' controller addresses (count, then Raft id
//!   u64 and address bytes each), replacing the old, written after the
//!   `CONF_STATE` of each learner's addition, so a restart knows where
//!   every learner listens before it replays anything (written by logs
//!   from before learners could be removed; still read);
//! - `MEMBERSHIP`: the whole membership after a membership change, in one
//!   record so that no crash keeps half of it: the index of the change's
//!   entry, the `ConfState`, the learners' addresses (as `ADDRESSES`) and
//!   the index of each learner's addition (count, then Raft id u64 and
//!   index u64 each). A restart starts from it and replays only the
//!   changes after that index: replaying a change already in it against
//!   the final membership (an addition whose learner was removed since)
//!   would not give what applying it in order gave.
//!
//! A record is written before raft-rs is told it is stable, and
//! [`RaftDisk::sync`] makes the writes durable before any message that
//! depends on them leaves the node (`QuorumNode::advance`), which is
//! raft-rs's contract: a vote or an acknowledged append is never forgotten
//! by a node that crashes after sending it.
//!
//! Damage at start-up is treated as the metadata log treats it
//! (`metadata::store`): a torn or corrupt **last** record is what a crash
//! mid-append leaves and is cut off (its content was never synced, so no
//! message depended on it); a corrupt record followed by another is damage
//! a crash cannot cause, and loading fails instead of silently forgetting a
//! vote or an entry. (One damage looks exactly like a torn append and is
//! cut as one: a length field corrupted to point past the end of the
//! file. Raft assumes disks that do not corrupt synced data; the CRC
//! catches every other flip.)
//!
//! Compaction (snapshots of the applied image, entries dropped behind
//! them) is not built yet: the log holds only control records. The storage
//! already keeps the index and term of the entry before its first one, the
//! shape compaction needs.

use super::codec;
use crate::protocol::wire::Reader;
use bytes::{BufMut, BytesMut};
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState, StorageError};
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

const ENTRIES: i8 = 1;
const HARD_STATE: i8 = 2;
const CONF_STATE: i8 = 3;
const ADDRESSES: i8 = 4;
const MEMBERSHIP: i8 = 5;
/// Length and CRC before each record's kind and body.
const RECORD_HEADER_BYTES: usize = 8;
/// A record larger than this is damage, not something fjord wrote.
pub const RECORD_BYTES_MAX: usize = 64 << 20;
/// The largest entry (data and context) this log takes (a caller refuses
/// larger ones before proposing them): with its framing, one such entry
/// always fits a record.
pub const ENTRY_BYTES_MAX: usize = RECORD_BYTES_MAX / 2;
/// Entries are written in records of about this many bytes at most, so a
/// `Ready` with many entries never makes a record the loader would take
/// for damage.
const ENTRIES_RECORD_BYTES: usize = RECORD_BYTES_MAX / 4;

/// Where the Raft log's records go: a file in production, memory with
/// crash semantics in the simulation.
pub trait RaftDisk {
    /// Appends one framed record after the previous ones.
    fn append(&mut self, record: &[u8]) -> io::Result<()>;
    /// Makes every record appended so far durable.
    fn sync(&mut self) -> io::Result<()>;
    /// Cuts the file to `len` bytes (a torn tail found at load).
    fn truncate(&mut self, len: u64) -> io::Result<()>;
}

/// A Raft log file that does not follow the format.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("raft log record at byte {at} is corrupt ({what}) and is followed by more records")]
    Corrupt { at: usize, what: String },
    /// Every record is intact but together they are not a state this code
    /// writes (raft-rs would abort on it).
    #[error("raft log is inconsistent: {0}")]
    Inconsistent(String),
}

/// The log's in-memory state.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Core {
    pub hard_state: HardState,
    pub conf_state: ConfState,
    /// Learners' controller addresses, by Raft id.
    pub addresses: std::collections::BTreeMap<u64, String>,
    /// The index of each learner's addition (0: added before this was
    /// kept, or configured when the log was created).
    pub added: std::collections::BTreeMap<u64, u64>,
    /// The index of the last membership change `conf_state`, `addresses`
    /// and `added` hold (0: none, or a log from before `MEMBERSHIP`).
    pub membership_index: u64,
    /// Index and term of the entry just before `entries[0]` (0, 0 for a log
    /// that was never compacted).
    pub offset_index: u64,
    pub offset_term: u64,
    pub entries: Vec<Entry>,
}

impl Core {
    pub fn last_index(&self) -> u64 {
        self.offset_index + self.entries.len() as u64
    }

    fn append(&mut self, ents: &[Entry]) {
        let Some(first) = ents.first() else { return };
        // Entries from `first.index` on are replaced; raft-rs never appends
        // with a gap nor below the compaction point.
        let keep = first.index.saturating_sub(self.offset_index + 1) as usize;
        self.entries.truncate(keep);
        self.entries.extend_from_slice(ents);
    }

    /// Applies one decoded record (at load).
    fn apply(&mut self, kind: i8, body: &[u8]) -> Result<(), String> {
        let mut r = Reader::new(body);
        match kind {
            ENTRIES => {
                let ents = codec::entries(&mut r).map_err(|e| e.to_string())?;
                if let Some(first) = ents.first() {
                    if first.index <= self.offset_index || first.index > self.last_index() + 1 {
                        return Err(format!(
                            "entries at {} do not follow the log ending at {}",
                            first.index,
                            self.last_index()
                        ));
                    }
                    if ents.windows(2).any(|w| w[1].index != w[0].index + 1) {
                        return Err("entries are not consecutive".into());
                    }
                }
                self.append(&ents);
            }
            HARD_STATE => self.hard_state = codec::hard_state(&mut r).map_err(|e| e.to_string())?,
            CONF_STATE => self.conf_state = codec::conf_state(&mut r).map_err(|e| e.to_string())?,
            ADDRESSES => self.addresses = addresses(&mut r).map_err(|e| e.to_string())?,
            MEMBERSHIP => {
                let e = |e: crate::protocol::ProtocolError| e.to_string();
                let index = r.i64("membership index").map_err(e)? as u64;
                let cs = codec::conf_state(&mut r).map_err(e)?;
                let addresses = addresses(&mut r)?;
                let n = r.i32("additions").map_err(e)?;
                if n < 0 || n as usize > super::LEARNERS_MAX {
                    return Err(format!("{n} additions"));
                }
                let mut added = std::collections::BTreeMap::new();
                for _ in 0..n {
                    let id = r.i64("addition id").map_err(e)? as u64;
                    added.insert(id, r.i64("addition index").map_err(e)? as u64);
                }
                self.membership_index = index;
                self.conf_state = cs;
                self.addresses = addresses;
                self.added = added;
            }
            k => return Err(format!("unknown record kind {k}")),
        }
        if r.remaining() != 0 {
            return Err("bytes after the record's body".into());
        }
        Ok(())
    }
}

/// Most addresses an `ADDRESSES` record may hold (`super::LEARNERS_MAX`).
fn addresses(r: &mut Reader) -> Result<std::collections::BTreeMap<u64, String>, String> {
    let n = r.i32("addresses").map_err(|e| e.to_string())?;
    if n < 0 || n as usize > super::LEARNERS_MAX {
        return Err(format!("{n} addresses"));
    }
    let mut out = std::collections::BTreeMap::new();
    for _ in 0..n {
        let id = r.i64("address id").map_err(|e| e.to_string())? as u64;
        let len = r.i32("address length").map_err(|e| e.to_string())?;
        if len < 0 || len as usize > super::ADDRESS_BYTES_MAX {
            return Err(format!("an address of {len} bytes"));
        }
        let bytes = r.take(len as usize, "address").map_err(|e| e.to_string())?;
        let address = String::from_utf8(bytes.to_vec()).map_err(|e| e.to_string())?;
        out.insert(id, address);
    }
    Ok(out)
}

/// The body of an `ADDRESSES` record (and that part of `MEMBERSHIP`).
fn put_addresses(b: &mut BytesMut, addresses: &std::collections::BTreeMap<u64, String>) {
    b.put_i32(addresses.len() as i32);
    for (id, a) in addresses {
        b.put_u64(*id);
        b.put_i32(a.len() as i32);
        b.put_slice(a.as_bytes());
    }
}

/// Frames one record.
fn record(kind: i8, body: impl FnOnce(&mut BytesMut)) -> BytesMut {
    let mut out = BytesMut::with_capacity(64);
    out.put_u64(0); // length and CRC, filled below
    out.put_i8(kind);
    body(&mut out);
    let len = (out.len() - RECORD_HEADER_BYTES) as u32;
    let crc = crc32c::crc32c(&out[RECORD_HEADER_BYTES..]);
    out[0..4].copy_from_slice(&len.to_be_bytes());
    out[4..8].copy_from_slice(&crc.to_be_bytes());
    out
}

/// Replays a Raft log file: the state, and the length of its valid prefix
/// (shorter than `bytes` when a torn last record must be cut off).
pub fn load(bytes: &[u8]) -> Result<(Core, usize), LoadError> {
    let mut core = Core::default();
    let mut at = 0usize;
    while at < bytes.len() {
        let rest = &bytes[at..];
        let problem = if rest.len() < RECORD_HEADER_BYTES {
            Some("a header cut short".into())
        } else {
            let len = u32::from_be_bytes(rest[0..4].try_into().unwrap()) as usize;
            let crc = u32::from_be_bytes(rest[4..8].try_into().unwrap());
            if len == 0 || len > RECORD_BYTES_MAX {
                Some(format!("length {len}"))
            } else if rest.len() < RECORD_HEADER_BYTES + len {
                Some("a body cut short".into())
            } else {
                let payload = &rest[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + len];
                if crc32c::crc32c(payload) != crc {
                    Some("CRC mismatch".into())
                } else {
                    match core.apply(payload[0] as i8, &payload[1..]) {
                        Ok(()) => {
                            at += RECORD_HEADER_BYTES + len;
                            None
                        }
                        Err(e) => Some(e),
                    }
                }
            }
        };
        if let Some(what) = problem {
            // Torn tail: only if nothing valid could follow. A record's
            // length is unknown once its header is bad, so any non-zero
            // byte after a damaged record's claimed end counts as "more".
            let claimed_end = if rest.len() >= 4 {
                let len = u32::from_be_bytes(rest[0..4].try_into().unwrap()) as usize;
                (RECORD_HEADER_BYTES + len).min(rest.len())
            } else {
                rest.len()
            };
            if rest[claimed_end..].iter().any(|&b| b != 0) {
                return Err(LoadError::Corrupt { at, what });
            }
            return consistent(core, at);
        }
    }
    consistent(core, at)
}

/// The loaded state, unless it is one this code never writes, on which
/// raft-rs would abort (its `fatal!`) or go wrong: a commit index past the
/// last entry (a cut log is never behind its hard state, which is written
/// after the entries it commits), entry terms that go down, a membership
/// that lists a node twice, names node 0 or is mid change (a joint
/// consensus: only learners are added, which takes none). Only a bug or an edit that fixed up the CRCs
/// gets here. (Entries of a term above the hard state's are possible: a
/// crash can keep a `Ready`'s entries and lose its hard state written after
/// them; nothing was sent that depended on either.)
fn consistent(core: Core, valid: usize) -> Result<(Core, usize), LoadError> {
    let bad = |what: String| Err(LoadError::Inconsistent(what));
    let hs = &core.hard_state;
    if hs.commit > core.last_index() {
        return bad(format!(
            "commit index {} is past the last entry {}",
            hs.commit,
            core.last_index()
        ));
    }
    let mut term = core.offset_term;
    for e in &core.entries {
        if e.term < term {
            return bad(format!(
                "entry {} has term {}, below the {term} of the entry before",
                e.index, e.term
            ));
        }
        term = e.term;
    }
    let cs = &core.conf_state;
    let mut ids: Vec<u64> = cs.voters.iter().chain(&cs.learners).copied().collect();
    ids.sort_unstable();
    if *cs != ConfState::default()
        && (!cs.voters_outgoing.is_empty()
            || !cs.learners_next.is_empty()
            || cs.auto_leave
            || ids.contains(&0)
            || ids.windows(2).any(|w| w[0] == w[1]))
    {
        return bad(format!("membership {cs:?} is not one this version writes"));
    }
    Ok((core, valid))
}

/// raft-rs's view of the log (`raft::Storage`), shared with the node that
/// writes it. Behind a mutex (never contended: one node, one thread at a
/// time) so that a node can be moved to a blocking thread for its disk
/// I/O and back (`metadata::store`).
#[derive(Clone)]
pub struct RaftStore {
    core: Arc<Mutex<Core>>,
}

impl RaftStore {
    pub fn new(core: Core) -> Self {
        Self {
            core: Arc::new(Mutex::new(core)),
        }
    }

    /// The state. A panic while it was held (a bug) is not hidden: the
    /// state is used as it is, as it would have been without the mutex.
    fn core(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The membership as last set.
    pub fn conf_state(&self) -> ConfState {
        self.core().conf_state.clone()
    }

    /// A copy of the state (tests, diagnostics).
    pub fn snapshot_core(&self) -> Core {
        self.core().clone()
    }

    /// Appends entries (replacing any from the first one's index on), in
    /// as many records as keep each under [`ENTRIES_RECORD_BYTES`] (one
    /// entry alone may exceed that, up to [`ENTRY_BYTES_MAX`]).
    pub fn append(&self, ents: &[Entry], disk: &mut impl RaftDisk) -> io::Result<()> {
        let payload = |e: &Entry| e.data.len() + e.context.len();
        if let Some(e) = ents.iter().find(|e| payload(e) > ENTRY_BYTES_MAX) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "raft entry {} of {} bytes is over the limit",
                    e.index,
                    payload(e)
                ),
            ));
        }
        // With the entry's own framing (index, term, type, lengths).
        let size = |e: &Entry| payload(e) + 64;
        let mut rest = ents;
        while !rest.is_empty() {
            let mut bytes = 0;
            let n = rest
                .iter()
                .take_while(|e| {
                    bytes += size(e);
                    bytes <= ENTRIES_RECORD_BYTES
                })
                .count()
                .max(1);
            let (chunk, after) = rest.split_at(n);
            disk.append(&record(ENTRIES, |b| codec::put_entries(b, chunk)))?;
            self.core().append(chunk);
            rest = after;
        }
        Ok(())
    }

    pub fn set_hard_state(&self, hs: &HardState, disk: &mut impl RaftDisk) -> io::Result<()> {
        if self.core().hard_state == *hs {
            return Ok(());
        }
        disk.append(&record(HARD_STATE, |b| codec::put_hard_state(b, hs)))?;
        self.core().hard_state = hs.clone();
        Ok(())
    }

    pub fn set_commit(&self, commit: u64, disk: &mut impl RaftDisk) -> io::Result<()> {
        let mut hs = self.core().hard_state.clone();
        hs.commit = commit;
        self.set_hard_state(&hs, disk)
    }

    /// Replaces the membership, as the membership change at `index` left
    /// it, in one `MEMBERSHIP` record.
    pub fn set_membership(
        &self,
        index: u64,
        cs: &ConfState,
        addresses: &std::collections::BTreeMap<u64, String>,
        added: &std::collections::BTreeMap<u64, u64>,
        disk: &mut impl RaftDisk,
    ) -> io::Result<()> {
        disk.append(&record(MEMBERSHIP, |b| {
            b.put_u64(index);
            codec::put_conf_state(b, cs);
            put_addresses(b, addresses);
            b.put_i32(added.len() as i32);
            for (id, at) in added {
                b.put_u64(*id);
                b.put_u64(*at);
            }
        }))?;
        let mut core = self.core();
        core.membership_index = index;
        core.conf_state = cs.clone();
        core.addresses = addresses.clone();
        core.added = added.clone();
        Ok(())
    }

    /// The learners' addresses as last set.
    pub fn addresses(&self) -> std::collections::BTreeMap<u64, String> {
        self.core().addresses.clone()
    }

    /// The index of each learner's addition, as last set.
    pub fn added(&self) -> std::collections::BTreeMap<u64, u64> {
        self.core().added.clone()
    }

    /// The index of the last membership change the membership holds.
    pub fn membership_index(&self) -> u64 {
        self.core().membership_index
    }

    pub fn set_conf_state(&self, cs: &ConfState, disk: &mut impl RaftDisk) -> io::Result<()> {
        disk.append(&record(CONF_STATE, |b| codec::put_conf_state(b, cs)))?;
        self.core().conf_state = cs.clone();
        Ok(())
    }
}

impl raft::Storage for RaftStore {
    fn initial_state(&self) -> raft::Result<RaftState> {
        let c = self.core();
        Ok(RaftState::new(c.hard_state.clone(), c.conf_state.clone()))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        let c = self.core();
        if low <= c.offset_index {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > c.last_index() + 1 || low > high {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let from = (low - c.offset_index - 1) as usize;
        let to = (high - c.offset_index - 1) as usize;
        let mut ents = c.entries[from..to].to_vec();
        raft::util::limit_size(&mut ents, max_size.into());
        Ok(ents)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        let c = self.core();
        if idx == c.offset_index {
            return Ok(c.offset_term);
        }
        if idx < c.offset_index {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if idx > c.last_index() {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        Ok(c.entries[(idx - c.offset_index - 1) as usize].term)
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.core().offset_index + 1)
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.core().last_index())
    }

    fn snapshot(&self, _request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        // Nothing is compacted yet, so a follower never needs one.
        Err(raft::Error::Store(
            StorageError::SnapshotTemporarilyUnavailable,
        ))
    }
}

/// The production disk: one append-only file, fdatasync'ed by `sync`.
pub struct FileDisk {
    file: std::fs::File,
}

impl FileDisk {
    /// Opens (creating) the file at `path` and returns it with its bytes.
    pub fn open(path: &std::path::Path) -> io::Result<(Self, Vec<u8>)> {
        use std::io::Read;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok((Self { file }, bytes))
    }
}

impl RaftDisk for FileDisk {
    fn append(&mut self, record: &[u8]) -> io::Result<()> {
        use std::io::Write;
        self.file.write_all(record)
    }

    fn sync(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn truncate(&mut self, len: u64) -> io::Result<()> {
        self.file.set_len(len)?;
        self.file.sync_data()
    }
}

#[cfg(test)]
pub(crate) mod mem {
    //! An in-memory disk with crash semantics, for the simulation.
    use super::RaftDisk;
    use std::io;

    /// What a crash keeps: everything synced, and of the rest a prefix
    /// chosen by the simulation (possibly cutting a record in two).
    #[derive(Default, Clone, Debug)]
    pub struct MemDisk {
        pub synced: Vec<u8>,
        pub pending: Vec<u8>,
        pub syncs: u64,
    }

    impl MemDisk {
        /// The bytes a crash leaves when `keep` of the unsynced bytes
        /// reached the disk.
        pub fn after_crash(&self, keep: usize) -> Vec<u8> {
            let mut b = self.synced.clone();
            b.extend_from_slice(&self.pending[..keep.min(self.pending.len())]);
            b
        }
    }

    impl RaftDisk for MemDisk {
        fn append(&mut self, record: &[u8]) -> io::Result<()> {
            self.pending.extend_from_slice(record);
            Ok(())
        }
        fn sync(&mut self) -> io::Result<()> {
            let p = std::mem::take(&mut self.pending);
            self.synced.extend_from_slice(&p);
            self.syncs += 1;
            Ok(())
        }
        fn truncate(&mut self, len: u64) -> io::Result<()> {
            self.sync()?;
            self.synced.truncate(len as usize);
            Ok(())
        }
    }
}

#[cfg(test)]
#[allow(clippy::field_reassign_with_default)] // protobuf structs
mod tests {
    use super::mem::MemDisk;
    use super::*;
    use bytes::Bytes;
    use raft::Storage;

    fn entry(index: u64, term: u64, data: &'static [u8]) -> Entry {
        let mut e = Entry::default();
        e.index = index;
        e.term = term;
        e.data = Bytes::from_static(data);
        e
    }

    #[test]
    fn a_reloaded_log_is_the_log_written_including_overwritten_suffixes() {
        let mut disk = MemDisk::default();
        let store = RaftStore::new(Core::default());
        store
            .append(
                &[entry(1, 1, b"a"), entry(2, 1, b"b"), entry(3, 1, b"c")],
                &mut disk,
            )
            .unwrap();
        let mut hs = HardState::default();
        hs.term = 2;
        hs.vote = 3;
        store.set_hard_state(&hs, &mut disk).unwrap();
        // A new leader replaces the uncommitted suffix from index 2.
        store.append(&[entry(2, 2, b"B")], &mut disk).unwrap();
        let mut cs = ConfState::default();
        cs.voters = vec![1, 2, 3];
        store.set_conf_state(&cs, &mut disk).unwrap();
        let addresses: std::collections::BTreeMap<u64, String> =
            [(4, "10.0.0.4:9093".to_string())].into();
        // A log from before MEMBERSHIP records wrote the addresses alone.
        disk.append(&record(ADDRESSES, |b| put_addresses(b, &addresses)))
            .unwrap();
        store.set_commit(2, &mut disk).unwrap();
        disk.sync().unwrap();
        let (core, valid) = load(&disk.synced).unwrap();
        assert_eq!(valid, disk.synced.len());
        assert_eq!(core.addresses, addresses);
        assert_eq!(core.membership_index, 0);
        // A membership change replaces all of it in one record.
        cs.learners = vec![5];
        let addresses: std::collections::BTreeMap<u64, String> =
            [(5, "10.0.0.5:9093".to_string())].into();
        let added = [(5, 2)].into();
        store
            .set_membership(2, &cs, &addresses, &added, &mut disk)
            .unwrap();
        disk.sync().unwrap();
        let (core, valid) = load(&disk.synced).unwrap();
        assert_eq!(valid, disk.synced.len());
        assert_eq!(core, store.snapshot_core());
        assert_eq!(core.last_index(), 2);
        assert_eq!(store.term(2).unwrap(), 2);
        assert_eq!(core.hard_state.commit, 2);
        assert_eq!(core.conf_state.voters, vec![1, 2, 3]);
        assert_eq!(core.conf_state.learners, vec![5]);
        assert_eq!(core.addresses, addresses);
        assert_eq!(core.added, added);
        assert_eq!(core.membership_index, 2);
        let got = store
            .entries(1, 3, None, GetEntriesContext::empty(false))
            .unwrap();
        assert_eq!(got, vec![entry(1, 1, b"a"), entry(2, 2, b"B")]);
        assert!(store
            .entries(1, 4, None, GetEntriesContext::empty(false))
            .is_err());
    }

    #[test]
    fn many_large_entries_are_written_in_records_the_loader_takes() {
        let big = Bytes::from(vec![7u8; ENTRIES_RECORD_BYTES / 3]);
        let ents: Vec<Entry> = (1..=7)
            .map(|i| {
                let mut e = entry(i, 1, b"");
                e.data = big.clone();
                e
            })
            .collect();
        let mut disk = MemDisk::default();
        let store = RaftStore::new(Core::default());
        store.append(&ents, &mut disk).unwrap();
        disk.sync().unwrap();
        let (core, valid) = load(&disk.synced).unwrap();
        assert_eq!(valid, disk.synced.len());
        assert_eq!(core.entries, ents);
        // One entry over the limit is refused before anything is written.
        let mut huge = entry(8, 1, b"");
        huge.data = Bytes::from(vec![0u8; ENTRY_BYTES_MAX + 1]);
        let before = disk.synced.len();
        assert!(store.append(&[huge], &mut disk).is_err());
        disk.sync().unwrap();
        assert_eq!(disk.synced.len(), before);
        assert_eq!(store.snapshot_core().last_index(), 7);
    }

    #[test]
    fn a_torn_last_record_is_cut_and_damage_before_the_end_refuses_to_load() {
        let mut disk = MemDisk::default();
        let store = RaftStore::new(Core::default());
        store.append(&[entry(1, 1, b"a")], &mut disk).unwrap();
        disk.sync().unwrap();
        let whole = disk.synced.len();
        store.append(&[entry(2, 1, b"b")], &mut disk).unwrap();
        let bytes = disk.after_crash(usize::MAX);
        for cut in whole..bytes.len() {
            let (core, valid) = load(&bytes[..cut]).unwrap();
            assert_eq!((core.last_index(), valid), (1, whole), "cut at {cut}");
        }
        // Zeros after the last record (preallocation, a power loss) are a tail.
        let mut zeros = bytes.clone();
        zeros.extend_from_slice(&[0; 32]);
        assert_eq!(load(&zeros).unwrap().0.last_index(), 2);
        // A commit index past the log (raft-rs would abort on it).
        let mut hs = HardState::default();
        hs.commit = 3;
        let mut past = MemDisk::default();
        RaftStore::new(Core::default())
            .set_hard_state(&hs, &mut past)
            .unwrap();
        past.sync().unwrap();
        assert!(matches!(
            load(&past.synced),
            Err(LoadError::Inconsistent(_))
        ));
        // A flipped byte in the first record, with a valid one after it.
        let mut bad = bytes.clone();
        bad[RECORD_HEADER_BYTES + 3] ^= 0xff;
        assert!(matches!(load(&bad), Err(LoadError::Corrupt { at: 0, .. })));
    }
}
