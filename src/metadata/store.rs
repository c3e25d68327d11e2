//! The metadata log: `<data-dir>/__cluster_metadata/raft.log`, the Raft log
//! of a metadata quorum of one ([`super::quorum`], raft-rs), through which
//! every [`MetadataRecord`] goes before the controller applies it.
//!
//! [`MetadataLog`] owns the quorum node. The controller proposes a
//! request's records ([`MetadataLog::append`]); they come back committed
//! once the Raft log is fdatasync'ed (with one voter, its own durable copy
//! is the majority), and only then does the controller apply them to the
//! image and answer. Each record is one Raft entry whose data is the
//! record's JSON (serde, the shape the old log stored), of at most
//! `quorum::store::ENTRY_BYTES_MAX` (32 MiB; a larger record is refused
//! before it is proposed). The node is a
//! `Send` value: the controller moves it to a blocking thread (glommio's
//! `spawn_blocking`) for every step that writes or syncs, so the reactor
//! never waits on the disk; ticks come from a glommio timer and touch the
//! disk only when raft-rs has something to write.
//!
//! Start-up ([`MetadataLog::open`]) replays the Raft log: the node opens
//! its log, campaigns (a quorum of one wins at once), and the new term's
//! first entry commits every entry the log holds, which are returned in
//! order to be applied to a fresh image, as the old log's lines were.
//! Every start therefore adds the leader's empty entry and a hard state
//! to the log, a few dozen bytes.
//!
//! Damage, as Kafka's metadata loader treats it (`quorum::store` frames and
//! checks every record with a CRC):
//! - A torn or corrupt **last** record is what a crash mid-append leaves
//!   (nothing after it was synced, nothing depended on it). It is cut off,
//!   with a warning; the change it held was never applied nor acknowledged.
//! - A corrupt record **followed by another** cannot come from a crash: the
//!   disk or someone changed the file. Replaying only the records before it
//!   would silently drop every topic, config and producer-id block after it
//!   (and hand out producer ids again), so [`MetadataLog::open`] fails with
//!   an error naming the file, the byte offset and what is wrong, and the
//!   broker refuses to start until the file is restored. So does a
//!   committed entry whose record does not decode.
//!
//! Migration: a data dir written before the Raft log has
//! `__cluster_metadata/metadata.log` (one record a line, `<crc32c as 8 hex
//! digits> <json>`). At the first start the old file is read with its own
//! damage rules ([`load_legacy`]), its records are committed as the first
//! entries of a new Raft log written under a temporary name, and only when
//! that log is durable is it renamed to `raft.log`, then the old file to
//! `metadata.log.migrated`. A crash before the first rename leaves the old
//! file in charge (the temporary log is written again from scratch); a crash
//! between the renames leaves both, and the Raft log wins (the old file is
//! retired then). Never are the records applied twice or lost.
//!
//! Not built yet: snapshots of the applied image and compaction of the Raft
//! log behind them (raft-rs's compaction stays off; the log holds only
//! control records, replayed whole at start-up). The single node's Raft id
//! is 1, the only voter.
//!
//! Several voters (`docs/replication.md` §9 step 2), the log's half:
//! [`MetadataLog::open_member`] opens the log as one member of a fixed set
//! of voters (or as a learner outside them, added by the leader while the
//! quorum runs: [`MetadataLog::propose_add_learner`]), and [`MetadataLog::propose`], [`MetadataLog::step`] and
//! [`MetadataLog::advance_member`] drive it without waiting: messages go to
//! the peers (`quorum::transport`), committed records come back with their
//! index, wherever they were proposed. The controller does not run it yet
//! (a broker refuses a quorum of several nodes at start).

use super::quorum::store::{FileDisk, LoadError, ENTRY_BYTES_MAX};
use super::quorum::{QuorumConfig, QuorumNode, StepError};
use super::MetadataRecord;
use raft::eraftpb::Message;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

/// Directory of the metadata log inside the data dir (named as Kafka's KRaft log).
pub const METADATA_DIR: &str = "__cluster_metadata";
/// The Raft log, in [`METADATA_DIR`].
pub const RAFT_LOG_FILE: &str = "raft.log";
/// The Raft log being written by a migration, renamed to [`RAFT_LOG_FILE`]
/// once durable.
const MIGRATING_FILE: &str = "raft.log.migrating";
/// The metadata log of fjord before the Raft log, one JSON record a line.
const LEGACY_FILE: &str = "metadata.log";
/// What the old file is renamed to once migrated (kept for the operator).
pub const MIGRATED_FILE: &str = "metadata.log.migrated";
/// The Raft id of the only voter (raft-rs ids are not 0).
const NODE_ID: u64 = 1;
/// How many `advance` rounds opening or appending may take before the
/// quorum of one is declared broken (each normally takes one or two).
const ROUNDS_MAX: usize = 16;

/// Where the Raft metadata log of `data_dir` lives.
pub fn raft_log_path(data_dir: &Path) -> PathBuf {
    data_dir.join(METADATA_DIR).join(RAFT_LOG_FILE)
}

/// Where the old (pre-Raft) metadata log of `data_dir` lives.
pub fn legacy_path(data_dir: &Path) -> PathBuf {
    data_dir.join(METADATA_DIR).join(LEGACY_FILE)
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

/// Reads every record of the old (pre-Raft) metadata log, for the
/// migration. A torn or corrupt last line is cut off (a crash mid-append);
/// a corrupt line with more lines after it is an `InvalidData` error naming
/// the file and the line (see the module doc).
pub fn load_legacy(data_dir: &Path) -> io::Result<Vec<MetadataRecord>> {
    let path = legacy_path(data_dir);
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

/// The record a Raft entry carries.
pub fn encode_record(record: &MetadataRecord) -> io::Result<Vec<u8>> {
    serde_json::to_vec(record).map_err(io::Error::other)
}

/// The Raft entry data of each record, in order; `InvalidInput` (nothing
/// to propose) if one is over `ENTRY_BYTES_MAX`.
fn encode_entries(records: &[MetadataRecord]) -> io::Result<Vec<Vec<u8>>> {
    records
        .iter()
        .map(|r| {
            let data = encode_record(r)?;
            if data.len() > ENTRY_BYTES_MAX {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "a metadata record of {} bytes is over the metadata log's limit of \
                         {ENTRY_BYTES_MAX} bytes",
                        data.len()
                    ),
                ));
            }
            Ok(data)
        })
        .collect()
}

/// The record of a Raft entry's data, or what is wrong with it.
pub fn decode_record(data: &[u8]) -> Result<MetadataRecord, String> {
    serde_json::from_slice(data).map_err(|e| format!("undecodable record: {e}"))
}

/// What one [`MetadataLog::advance_member`] produced.
#[derive(Debug, Default)]
pub struct MemberProgress {
    /// Messages for the peers.
    pub messages: Vec<Message>,
    /// The records committed since the last call with their Raft index,
    /// in order.
    pub committed: Vec<(u64, MetadataRecord)>,
    /// The contexts of the leadership confirmations
    /// ([`MetadataLog::confirm_leadership`]) a majority answered.
    pub confirmed: Vec<u64>,
}

/// The metadata log of this node: a Raft quorum of one over
/// `raft.log` (see the module doc).
pub struct MetadataLog {
    node: QuorumNode<FileDisk>,
    path: PathBuf,
    /// Committed and decoded, not yet handed to the controller, with
    /// their Raft index.
    committed: Vec<(u64, MetadataRecord)>,
    /// Messages for peers from the last steps, not yet taken (a member of
    /// several voters; a quorum of one has no peer).
    outbox: Vec<Message>,
    /// Leadership confirmations answered, not yet taken.
    confirmed: Vec<u64>,
    /// A step of the Raft node failed midway: the log must not be used
    /// again (see [`Self::append`]).
    failed: bool,
}

impl MetadataLog {
    /// Opens the metadata log of `data_dir` (creating it, or migrating the
    /// old `metadata.log` into it, on the first start) and returns it with
    /// every record it holds, in order. Blocking: run it off the reactor.
    /// Err `InvalidData`: damage a crash cannot cause (module doc).
    pub fn open(data_dir: &Path) -> io::Result<(Self, Vec<MetadataRecord>)> {
        migrate(data_dir)?;
        Self::open_at(&raft_log_path(data_dir))
    }

    fn open_at(path: &Path) -> io::Result<(Self, Vec<MetadataRecord>)> {
        let dir = path.parent().expect("the log is in a directory");
        let dir_created = !dir.exists();
        let created = !path.exists();
        let (disk, bytes) = FileDisk::open(path)?;
        let config = QuorumConfig::new(NODE_ID, vec![NODE_ID], Vec::new());
        let node = QuorumNode::open(&config, disk, &bytes).map_err(|e| {
            match e.downcast_ref::<LoadError>() {
                Some(LoadError::Corrupt { at, what }) => io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "metadata log {}: the record at byte {at} is corrupt ({what}) and more \
                         records follow it; refusing to start, as replaying only the records \
                         before it would silently drop every change after it (restore the file \
                         from a backup)",
                        path.display()
                    ),
                ),
                Some(e @ LoadError::Inconsistent(_)) => io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "metadata log {}: {e}; refusing to start (restore the file from a backup)",
                        path.display()
                    ),
                ),
                None => io::Error::other(format!("metadata log {}: {e}", path.display())),
            }
        })?;
        // The file's directory entry (and the directory's own) is durable
        // before anything written to it is acknowledged.
        if created {
            File::open(dir)?.sync_all()?;
        }
        if dir_created {
            if let Some(parent) = dir.parent() {
                File::open(parent)?.sync_all()?;
            }
        }
        let mut log = MetadataLog {
            node,
            path: path.to_path_buf(),
            committed: Vec::new(),
            outbox: Vec::new(),
            confirmed: Vec::new(),
            failed: false,
        };
        let last = log.node.last_index();
        log.node.campaign().map_err(io::Error::other)?;
        // The new term's first entry commits everything before it.
        let mut rounds = 0;
        while log.node.has_ready() || !log.node.is_leader() || log.node.commit_index() < last {
            rounds += 1;
            if rounds > ROUNDS_MAX {
                return Err(io::Error::other(format!(
                    "metadata log {}: the quorum of one did not commit its log (leader: {}, \
                     commit index {}, last index {last})",
                    path.display(),
                    log.node.is_leader(),
                    log.node.commit_index()
                )));
            }
            log.advance()?;
        }
        let records = log.take_committed();
        Ok((log, records))
    }

    fn take_committed(&mut self) -> Vec<MetadataRecord> {
        std::mem::take(&mut self.committed)
            .into_iter()
            .map(|(_, r)| r)
            .collect()
    }

    /// Opens `data_dir`'s metadata log as Raft node `me` of a quorum of
    /// several `voters` (Raft ids, not 0), and returns it with the records
    /// it knows to be committed, in order. Unlike [`Self::open`] it does not
    /// campaign nor wait for a commit: that takes the peers, reached through
    /// [`Self::step`], [`Self::advance_member`] and
    /// `quorum::transport`. Refused: a data dir of a single node (its log's
    /// voters differ; voter changes are not built) or with the old
    /// `metadata.log` (migration is for a single node). Blocking.
    ///
    /// A `learner` (a node outside the voters) creates its log with itself
    /// as a learner: it receives the log once the leader has added it
    /// ([`Self::propose_add_learner`], asked by the learner's join).
    pub fn open_member(
        data_dir: &Path,
        me: u64,
        voters: Vec<u64>,
        learner: bool,
    ) -> io::Result<(Self, Vec<(u64, MetadataRecord)>)> {
        if legacy_path(data_dir).exists() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} holds a single node's metadata log from before the Raft log; it cannot \
                     join a quorum of several nodes",
                    legacy_path(data_dir).display()
                ),
            ));
        }
        let path = raft_log_path(data_dir);
        let dir = path.parent().expect("the log is in a directory");
        fs::create_dir_all(dir)?;
        let created = !path.exists();
        let (disk, bytes) = FileDisk::open(&path)?;
        let learners = if learner { vec![me] } else { Vec::new() };
        let config = QuorumConfig::new(me, voters.clone(), learners);
        let node = QuorumNode::open(&config, disk, &bytes)
            .map_err(|e| io::Error::other(format!("metadata log {}: {e}", path.display())))?;
        if created {
            File::open(dir)?.sync_all()?;
            if let Some(parent) = dir.parent() {
                File::open(parent)?.sync_all()?;
            }
        }
        let mut held = node.conf_state().voters;
        held.sort_unstable();
        let mut wanted = voters;
        wanted.sort_unstable();
        if held != wanted {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "metadata log {}: its quorum's voters are {held:?}, the configured ones \
                     {wanted:?}; changing the voters of an existing quorum is not built yet",
                    path.display()
                ),
            ));
        }
        let mut log = MetadataLog {
            node,
            path,
            committed: Vec::new(),
            outbox: Vec::new(),
            confirmed: Vec::new(),
            failed: false,
        };
        // The commit index the log kept: its entries are applied now.
        if log.node.has_ready() {
            log.advance()?;
        }
        let records = std::mem::take(&mut log.committed);
        Ok((log, records))
    }

    /// Proposes `records` as consecutive entries on the leader and returns
    /// the index the last one will have; they come back from
    /// [`Self::advance_member`] once committed (here or on any member).
    /// Err `NotConnected`: this node does not lead (the caller answers
    /// NOT_CONTROLLER, or forwards); `InvalidInput`: a record over the
    /// size limit, nothing proposed.
    pub fn propose(&mut self, records: &[MetadataRecord]) -> io::Result<u64> {
        let encoded = encode_entries(records)?;
        if !self.node.is_leader() {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                format!(
                    "this node does not lead the metadata quorum (leader: {})",
                    self.node.leader_id()
                ),
            ));
        }
        let target = self.node.last_index() + records.len() as u64;
        for data in encoded {
            // Leadership was checked: raft-rs drops a proposal only while a
            // leader transfer runs, which fjord never starts.
            if let Err(e) = self.node.propose(data) {
                return Err(io::Error::new(
                    io::ErrorKind::NotConnected,
                    format!("metadata log: proposal refused: {e}"),
                ));
            }
        }
        Ok(target)
    }

    /// Proposes adding Raft id `id` as a learner at controller address
    /// `address` (`quorum`'s module doc). Err `NotConnected`: this node
    /// does not lead. Whether it was made shows in [`Self::learners`]
    /// once committed (raft-rs drops a change while another is pending).
    pub fn propose_add_learner(&mut self, id: u64, address: &str) -> io::Result<()> {
        self.node
            .propose_add_learner(id, address)
            .map_err(|e| io::Error::new(io::ErrorKind::NotConnected, e.to_string()))
    }

    /// Proposes removing learner `id` (`quorum`'s module doc). Err
    /// `NotConnected`: this node does not lead, or `id` is not a learner.
    /// Whether it was made shows in [`Self::learners`] once committed.
    pub fn propose_remove_learner(&mut self, id: u64) -> io::Result<()> {
        self.node
            .propose_remove_learner(id)
            .map_err(|e| io::Error::new(io::ErrorKind::NotConnected, e.to_string()))
    }

    /// The learners the committed log has added, with their controller
    /// addresses (Raft ids).
    pub fn learners(&self) -> &std::collections::BTreeMap<u64, String> {
        self.node.learners()
    }

    /// The index of learner `id`'s addition (0: added before that was
    /// kept); None when it is not a learner.
    pub fn learner_added_at(&self, id: u64) -> Option<u64> {
        self.node.learner_added_at(id)
    }

    /// Ticks since this node last heard from the quorum's leader (0 while
    /// it leads).
    pub fn ticks_without_leader(&self) -> usize {
        self.node.ticks_without_leader()
    }

    /// The Raft ids of the voters (the log's membership).
    pub fn voters(&self) -> Vec<u64> {
        self.node.conf_state().voters
    }

    /// The index of the last committed entry handed out, records,
    /// membership changes and a leader's empty entries alike (so a node
    /// whose newest committed entry is not a record knows it caught up).
    pub fn applied_index(&self) -> u64 {
        self.node.applied()
    }

    /// Hands a peer's message to the Raft node (dropped when implausible,
    /// see `quorum`'s module doc); [`Self::advance_member`] then runs.
    pub fn step(&mut self, m: Message) -> Result<(), StepError> {
        self.node.step(m)
    }

    /// Runs raft-rs's Ready protocol once and returns the messages for the
    /// peers and the records committed since the last call, with their
    /// Raft index, in order. Blocking (writes and fdatasync).
    pub fn advance_member(&mut self) -> io::Result<MemberProgress> {
        if self.node.has_ready() {
            self.advance()?;
        }
        Ok(MemberProgress {
            messages: std::mem::take(&mut self.outbox),
            committed: std::mem::take(&mut self.committed),
            confirmed: std::mem::take(&mut self.confirmed),
        })
    }

    /// Starts a round that confirms this node still leads the quorum
    /// (`QuorumNode::confirm_leadership`); `context` comes back in
    /// [`MemberProgress::confirmed`] if a majority answers it.
    pub fn confirm_leadership(&mut self, context: u64) {
        self.node.confirm_leadership(context);
    }

    /// Whether this node leads the quorum now.
    pub fn is_leader(&self) -> bool {
        self.node.is_leader()
    }

    /// The Raft id of the leader this node knows of (0: none).
    pub fn leader_id(&self) -> u64 {
        self.node.leader_id()
    }

    /// The highest index this node knows committed (a follower learns it
    /// from the leader).
    pub fn commit_index(&self) -> u64 {
        self.node.commit_index()
    }

    /// The current Raft term (a proposal's term is the term when it was made).
    pub fn term(&self) -> u64 {
        self.node.term()
    }

    /// The term of the entry at `index`, if the log holds it: the
    /// controller checks that the entry committed at a proposal's index is
    /// of the proposal's term (else another leader's entry took its place).
    pub fn term_of(&self, index: u64) -> Option<u64> {
        self.node.term_of(index)
    }

    /// Whether [`Self::advance_member`] has work (after [`Self::step`]).
    pub fn has_ready(&self) -> bool {
        self.node.has_ready()
    }

    /// One timer tick of a member; true when [`Self::advance_member`] has
    /// work.
    pub fn tick_member(&mut self) -> bool {
        self.node.tick();
        self.node.has_ready()
    }

    /// The Raft log file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Proposes `records` as consecutive entries and returns them once
    /// committed (durable), with any committed before them that were not
    /// returned yet, in log order. Blocking: run it off the reactor.
    ///
    /// A record over [`ENTRY_BYTES_MAX`] is refused (`InvalidInput`) before
    /// anything is proposed, and the log stays usable. Any other error may
    /// leave the Raft node midway through a step: [`Self::failed`] is then
    /// true, the log must be dropped, and the next start recovers from the
    /// file.
    pub fn append(&mut self, records: &[MetadataRecord]) -> io::Result<Vec<MetadataRecord>> {
        let encoded = encode_entries(records)?;
        let target = self.node.last_index() + records.len() as u64;
        for data in encoded {
            if let Err(e) = self.node.propose(data) {
                self.failed = true;
                return Err(io::Error::other(format!(
                    "metadata log: proposal refused: {e}"
                )));
            }
        }
        let mut rounds = 0;
        while self.node.has_ready() || self.node.commit_index() < target {
            rounds += 1;
            if rounds > ROUNDS_MAX {
                self.failed = true;
                return Err(io::Error::other(format!(
                    "metadata log {}: {} record(s) proposed were not committed (commit index {}, \
                     wanted {target})",
                    self.path.display(),
                    records.len(),
                    self.node.commit_index()
                )));
            }
            self.advance()?;
        }
        // A quorum of one has no peer: nothing to keep for one.
        debug_assert!(self.outbox.is_empty());
        self.outbox.clear();
        Ok(self.take_committed())
    }

    /// One timer tick; true when raft-rs has something for
    /// [`Self::advance`] (rare for a quorum of one), which the caller then
    /// runs off the reactor.
    pub fn tick(&mut self) -> bool {
        self.node.tick();
        self.node.has_ready()
    }

    /// Whether a step failed midway (see [`Self::append`]).
    pub fn failed(&self) -> bool {
        self.failed
    }

    /// Runs raft-rs's Ready protocol once (writes, fdatasync). Committed
    /// records are kept for the next [`Self::append`]. Blocking.
    pub fn advance(&mut self) -> io::Result<()> {
        // Set until this step completes.
        self.failed = true;
        let progress = self.node.advance()?;
        // A quorum of one has no peer to send messages to.
        self.outbox.extend(progress.messages);
        self.confirmed.extend(progress.confirmed);
        for c in progress.committed {
            let record = decode_record(&c.data).map_err(|what| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "metadata log {}: committed entry {} (term {}) does not decode ({what}); \
                         refusing to start (restore the file from a backup)",
                        self.path.display(),
                        c.index,
                        c.term
                    ),
                )
            })?;
            self.committed.push((c.index, record));
        }
        self.failed = false;
        Ok(())
    }
}

/// Converts the old `metadata.log` of `data_dir` into the Raft log, once
/// (crash-safe; see the module doc). Nothing to do when the Raft log
/// exists or there is no old file.
fn migrate(data_dir: &Path) -> io::Result<()> {
    let dir = data_dir.join(METADATA_DIR);
    let raft = raft_log_path(data_dir);
    let legacy = legacy_path(data_dir);
    let migrated = dir.join(MIGRATED_FILE);
    if raft.exists() {
        if legacy.exists() {
            // A crash came between the two renames: the Raft log has it all.
            fs::rename(&legacy, &migrated)?;
            File::open(&dir)?.sync_all()?;
            tracing::info!(
                path = %legacy.display(),
                "metadata log: retired the old log the last migration had copied"
            );
        }
        return Ok(());
    }
    if !legacy.exists() {
        return Ok(());
    }
    let records = load_legacy(data_dir)?;
    let temp = dir.join(MIGRATING_FILE);
    match fs::remove_file(&temp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    {
        let (mut log, replayed) = MetadataLog::open_at(&temp)?;
        if !replayed.is_empty() {
            return Err(io::Error::other(format!(
                "metadata log migration: {} is not empty",
                temp.display()
            )));
        }
        let committed = log.append(&records)?;
        if committed != records {
            return Err(io::Error::other(
                "metadata log migration: the new log does not hold the old log's records",
            ));
        }
    }
    fs::rename(&temp, &raft)?;
    File::open(&dir)?.sync_all()?;
    fs::rename(&legacy, &migrated)?;
    File::open(&dir)?.sync_all()?;
    tracing::info!(
        records = records.len(),
        from = %legacy.display(),
        to = %raft.display(),
        "metadata log migrated to the Raft log; the old file is kept as {MIGRATED_FILE}"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::io::Write;

    fn topic(name: &str) -> MetadataRecord {
        MetadataRecord::CreateTopic {
            name: name.into(),
            id: [7; 16],
            shards: vec![0, 1],
            configs: BTreeMap::new(),
            node: None,
            replicated: Vec::new(),
        }
    }

    /// Appends records to the old log the way fjord wrote it.
    fn write_legacy(data_dir: &Path, records: &[MetadataRecord]) {
        fs::create_dir_all(data_dir.join(METADATA_DIR)).unwrap();
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(legacy_path(data_dir))
            .unwrap();
        for r in records {
            f.write_all(encode_line(r).unwrap().as_bytes()).unwrap();
        }
    }

    /// Three members over their own directories, messages passed by hand
    /// (crash = drop: every step is synced before it returns).
    struct Cluster {
        dirs: Vec<tempfile::TempDir>,
        logs: Vec<Option<MetadataLog>>,
        applied: Vec<Vec<(u64, MetadataRecord)>>,
    }

    impl Cluster {
        fn new() -> Cluster {
            let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
            let mut c = Cluster {
                logs: Vec::new(),
                applied: vec![Vec::new(); 3],
                dirs,
            };
            for i in 0..3 {
                c.logs.push(None);
                c.start(i);
            }
            c
        }

        fn start(&mut self, i: usize) {
            let (log, replayed) =
                MetadataLog::open_member(self.dirs[i].path(), i as u64 + 1, vec![1, 2, 3], false)
                    .unwrap();
            self.applied[i] = replayed;
            self.logs[i] = Some(log);
        }

        /// Runs every live member until no message is left.
        fn pump(&mut self) {
            for _ in 0..100 {
                let mut mail = Vec::new();
                for (i, log) in self.logs.iter_mut().enumerate() {
                    if let Some(log) = log {
                        let MemberProgress {
                            messages,
                            committed,
                            ..
                        } = log.advance_member().unwrap();
                        mail.extend(messages);
                        self.applied[i].extend(committed);
                    }
                }
                if mail.is_empty() {
                    return;
                }
                for m in mail {
                    if let Some(log) = self.logs[m.to as usize - 1].as_mut() {
                        let _ = log.step(m);
                    }
                }
            }
            panic!("the members did not settle");
        }

        /// Ticks until some live member leads; returns its index.
        fn elect(&mut self) -> usize {
            for _ in 0..200 {
                for log in self.logs.iter_mut().flatten() {
                    log.tick_member();
                }
                self.pump();
                if let Some(i) =
                    (0..3).find(|&i| self.logs[i].as_ref().is_some_and(|l| l.is_leader()))
                {
                    return i;
                }
            }
            panic!("no leader elected");
        }

        fn records(&self, i: usize) -> Vec<MetadataRecord> {
            self.applied[i].iter().map(|(_, r)| r.clone()).collect()
        }
    }

    /// Several voters share one log: what the leader proposes is committed
    /// and applied on every member; a follower refuses proposals; after
    /// the leader dies the others elect one and commit; the dead one comes
    /// back with what it had committed and catches up.
    #[test]
    fn three_members_commit_the_same_records_through_a_leader_failure() {
        let mut c = Cluster::new();
        let leader = c.elect();
        let follower = (leader + 1) % 3;
        let e = c.logs[follower]
            .as_mut()
            .unwrap()
            .propose(&[topic("x")])
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotConnected, "{e}");
        assert_eq!(
            c.logs[follower].as_ref().unwrap().leader_id(),
            leader as u64 + 1
        );
        c.logs[leader]
            .as_mut()
            .unwrap()
            .propose(&[topic("a")])
            .unwrap();
        c.pump();
        // Followers learn the commit with the next heartbeat.
        for log in c.logs.iter_mut().flatten() {
            log.tick_member();
        }
        c.pump();
        for i in 0..3 {
            assert_eq!(c.records(i), vec![topic("a")], "member {i}");
        }

        c.logs[leader] = None; // killed
        let second = c.elect();
        assert_ne!(second, leader);
        c.logs[second]
            .as_mut()
            .unwrap()
            .propose(&[topic("b")])
            .unwrap();
        c.pump();
        for log in c.logs.iter_mut().flatten() {
            log.tick_member();
        }
        c.pump();
        let survivor = (0..3).find(|&i| i != leader && i != second).unwrap();
        for i in [second, survivor] {
            assert_eq!(c.records(i), vec![topic("a"), topic("b")], "member {i}");
        }

        c.start(leader);
        assert_eq!(c.records(leader), vec![topic("a")], "what it had committed");
        for _ in 0..3 {
            for log in c.logs.iter_mut().flatten() {
                log.tick_member();
            }
            c.pump();
        }
        assert_eq!(c.records(leader), vec![topic("a"), topic("b")], "caught up");
        let indexes: Vec<u64> = c.applied[leader].iter().map(|(i, _)| *i).collect();
        assert_eq!(
            indexes,
            c.applied[survivor]
                .iter()
                .map(|(i, _)| *i)
                .collect::<Vec<_>>(),
            "the same entries"
        );

        // The voters are the log's: another list is refused.
        drop(c.logs[leader].take());
        let e =
            MetadataLog::open_member(c.dirs[leader].path(), leader as u64 + 1, vec![1, 2], false)
                .err()
                .unwrap();
        assert!(e.to_string().contains("changing the voters"), "{e}");
    }

    /// The log's members over the real transport (`quorum::transport`, TCP
    /// on loopback), each driven by a task the way a controller would: a
    /// record proposed on the leader is applied on all three.
    #[test]
    fn three_members_commit_over_tcp() {
        use crate::metadata::quorum::transport::{Inbound, Peers};
        use glommio::net::TcpListener;
        use std::cell::RefCell;
        use std::rc::Rc;
        use std::time::Duration;
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .spawn(|| async {
                let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
                let listeners: Vec<_> = (0..3)
                    .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
                    .collect();
                let addrs: Vec<(u64, String)> = listeners
                    .iter()
                    .enumerate()
                    .map(|(i, l)| (i as u64 + 1, l.local_addr().unwrap().to_string()))
                    .collect();
                let logs: Vec<Rc<RefCell<MetadataLog>>> = (0..3)
                    .map(|i| {
                        let (log, _) = MetadataLog::open_member(
                            dirs[i].path(),
                            i as u64 + 1,
                            vec![1, 2, 3],
                            false,
                        )
                        .unwrap();
                        Rc::new(RefCell::new(log))
                    })
                    .collect();
                let applied: Vec<Rc<RefCell<Vec<MetadataRecord>>>> =
                    (0..3).map(|_| Rc::default()).collect();
                for (i, listener) in listeners.into_iter().enumerate() {
                    let me = i as u64 + 1;
                    let inbox: Rc<RefCell<Vec<Message>>> = Rc::default();
                    let sink = inbox.clone();
                    glommio::spawn_local(Inbound::serve(
                        listener,
                        me,
                        std::rc::Rc::new(std::cell::RefCell::new([1, 2, 3].into_iter().collect())),
                        crate::metadata::quorum::transport::Handlers::new(
                            Rc::new(move |m| sink.borrow_mut().push(m)),
                            None,
                        ),
                    ))
                    .detach();
                    let peers = Peers::start(me, &addrs);
                    let log = logs[i].clone();
                    let applied = applied[i].clone();
                    glommio::spawn_local(async move {
                        loop {
                            glommio::timer::sleep(Duration::from_millis(10)).await;
                            let mut log = log.borrow_mut();
                            for m in inbox.borrow_mut().drain(..) {
                                let _ = log.step(m);
                            }
                            log.tick_member();
                            let MemberProgress {
                                messages,
                                committed,
                                ..
                            } = log.advance_member().unwrap();
                            for m in messages {
                                peers.send(m);
                            }
                            applied
                                .borrow_mut()
                                .extend(committed.into_iter().map(|(_, r)| r));
                        }
                    })
                    .detach();
                }
                let mut proposed = false;
                for _ in 0..1000 {
                    glommio::timer::sleep(Duration::from_millis(10)).await;
                    if !proposed {
                        if let Some(l) = logs.iter().find(|l| l.borrow().is_leader()) {
                            l.borrow_mut().propose(&[topic("tcp")]).unwrap();
                            proposed = true;
                        }
                    }
                    if applied.iter().all(|a| *a.borrow() == vec![topic("tcp")]) {
                        return;
                    }
                }
                panic!(
                    "not applied everywhere: {:?}",
                    applied
                        .iter()
                        .map(|a| a.borrow().clone())
                        .collect::<Vec<_>>()
                );
            })
            .unwrap()
            .join()
            .unwrap();
    }

    #[test]
    fn legacy_load_and_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let a = topic("t");
        let b = MetadataRecord::ProducerIdBlock { next: 1000 };
        write_legacy(dir.path(), &[a.clone(), b.clone()]);
        assert_eq!(load_legacy(dir.path()).unwrap(), vec![a.clone(), b.clone()]);

        // A crash mid-append leaves half a line: it is dropped and cut off.
        let path = legacy_path(dir.path());
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"0badc0de {\"type\":\"Dele").unwrap();
        drop(f);
        assert_eq!(load_legacy(dir.path()).unwrap(), vec![a.clone(), b.clone()]);
        write_legacy(
            dir.path(),
            &[MetadataRecord::DeleteTopic { name: "t".into() }],
        );
        assert_eq!(load_legacy(dir.path()).unwrap().len(), 3);

        // A flipped byte in the last line fails its CRC: it is cut off as
        // a torn tail.
        let mut bytes = fs::read(&path).unwrap();
        let at = bytes.len() - 5;
        bytes[at] ^= 1;
        fs::write(&path, &bytes).unwrap();
        assert_eq!(load_legacy(dir.path()).unwrap(), vec![a, b]);
    }

    #[test]
    fn a_corrupt_legacy_line_before_others_is_an_error_naming_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let blocks: Vec<_> = [1000, 2000, 3000]
            .map(|next| MetadataRecord::ProducerIdBlock { next })
            .to_vec();
        write_legacy(dir.path(), &blocks);
        let path = legacy_path(dir.path());
        let good = fs::read(&path).unwrap();
        let second = good.iter().position(|&b| b == b'\n').unwrap() + 1;
        let mut bad = good.clone();
        bad[second + 12] ^= 0x20; // inside the second line's JSON
        fs::write(&path, &bad).unwrap();
        let e = load_legacy(dir.path()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        let text = e.to_string();
        assert!(text.contains("line 2 is corrupt"), "{text}");
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(text.contains("CRC mismatch"), "{text}");
        // Nothing was cut off, and nothing migrated: the file is left for
        // repair and the broker does not start.
        let e = MetadataLog::open(dir.path()).err().unwrap();
        assert!(e.to_string().contains("line 2 is corrupt"), "{e}");
        assert_eq!(fs::read(&path).unwrap(), bad);
        assert!(!raft_log_path(dir.path()).exists());
    }

    #[test]
    fn records_come_back_committed_and_are_replayed_in_order_at_every_start() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, replayed) = MetadataLog::open(dir.path()).unwrap();
        assert!(replayed.is_empty());
        let first = vec![topic("a"), MetadataRecord::ProducerIdBlock { next: 1000 }];
        assert_eq!(log.append(&first).unwrap(), first);
        drop(log);
        let (mut log, replayed) = MetadataLog::open(dir.path()).unwrap();
        assert_eq!(replayed, first);
        let second = vec![MetadataRecord::DeleteTopic { name: "a".into() }];
        assert_eq!(log.append(&second).unwrap(), second);
        // Nothing to do on a tick of a quorum of one.
        assert!(!log.tick());
        drop(log);
        let (_, replayed) = MetadataLog::open(dir.path()).unwrap();
        assert_eq!(replayed, [first, second].concat());
        assert!(!legacy_path(dir.path()).exists());
    }

    #[test]
    fn a_record_over_the_limit_is_refused_and_the_log_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = MetadataLog::open(dir.path()).unwrap();
        let huge = MetadataRecord::DeleteTopic {
            name: "x".repeat(ENTRY_BYTES_MAX),
        };
        let e = log.append(&[topic("a"), huge]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        assert!(!log.failed());
        assert_eq!(log.append(&[topic("b")]).unwrap(), vec![topic("b")]);
        drop(log);
        assert_eq!(MetadataLog::open(dir.path()).unwrap().1, vec![topic("b")]);
    }

    #[test]
    fn a_torn_raft_record_is_cut_and_a_corrupt_one_before_others_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = raft_log_path(dir.path());
        let (mut log, _) = MetadataLog::open(dir.path()).unwrap();
        log.append(&[topic("a")]).unwrap();
        let kept = fs::metadata(&path).unwrap().len() as usize;
        log.append(&[topic("b")]).unwrap();
        drop(log);
        let good = fs::read(&path).unwrap();
        // Every cut inside what the second append wrote keeps the first topic
        // and loses the second (never acknowledged), or keeps both.
        for cut in kept..good.len() {
            fs::write(&path, &good[..cut]).unwrap();
            let (_, replayed) = MetadataLog::open(dir.path()).unwrap();
            assert!(
                replayed == vec![topic("a")] || replayed == vec![topic("a"), topic("b")],
                "cut at {cut}: {replayed:?}"
            );
        }
        // A flipped byte in the entry of topic "a", with records after it.
        let at = good
            .windows(3)
            .position(|w| w == b"\"a\"")
            .expect("the record's JSON");
        let mut bad = good.clone();
        bad[at + 1] ^= 0x20;
        fs::write(&path, &bad).unwrap();
        let e = MetadataLog::open(dir.path()).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        let text = e.to_string();
        assert!(text.contains("is corrupt (CRC mismatch)"), "{text}");
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert_eq!(fs::read(&path).unwrap(), bad, "left for repair");
    }

    #[test]
    fn the_old_log_is_migrated_once_and_every_crash_point_recovers() {
        let old = vec![
            topic("a"),
            MetadataRecord::ProducerIdBlock { next: 1000 },
            MetadataRecord::LeaderEpoch { epoch: 3 },
        ];
        // A plain migration: the records, then the same records again at the
        // next start (not twice), the old file retired.
        let dir = tempfile::tempdir().unwrap();
        write_legacy(dir.path(), &old);
        let legacy_bytes = fs::read(legacy_path(dir.path())).unwrap();
        let (mut log, replayed) = MetadataLog::open(dir.path()).unwrap();
        assert_eq!(replayed, old);
        assert!(!legacy_path(dir.path()).exists());
        let migrated = dir.path().join(METADATA_DIR).join(MIGRATED_FILE);
        assert_eq!(fs::read(&migrated).unwrap(), legacy_bytes);
        log.append(&[topic("b")]).unwrap();
        drop(log);
        let (_, replayed) = MetadataLog::open(dir.path()).unwrap();
        assert_eq!(replayed, [old.clone(), vec![topic("b")]].concat());

        // A crash before the Raft log was renamed into place: a partial
        // temporary log is there, and the old file is still in charge.
        let dir = tempfile::tempdir().unwrap();
        write_legacy(dir.path(), &old);
        let temp = dir.path().join(METADATA_DIR).join(MIGRATING_FILE);
        fs::write(&temp, b"\x00\x00\x00\x09half a record").unwrap();
        let (_, replayed) = MetadataLog::open(dir.path()).unwrap();
        assert_eq!(replayed, old);
        assert!(!temp.exists());

        // A crash between the two renames: both logs are there; the Raft
        // log wins and the old file is retired.
        let dir = tempfile::tempdir().unwrap();
        write_legacy(dir.path(), &old);
        drop(MetadataLog::open(dir.path()).unwrap());
        let migrated = dir.path().join(METADATA_DIR).join(MIGRATED_FILE);
        fs::rename(&migrated, legacy_path(dir.path())).unwrap();
        let (_, replayed) = MetadataLog::open(dir.path()).unwrap();
        assert_eq!(replayed, old, "applied once");
        assert!(!legacy_path(dir.path()).exists());
        assert!(migrated.exists());
    }
}
