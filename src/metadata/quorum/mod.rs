//! The metadata quorum's Raft node: raft-rs (`raft` 0.7, TiKV's) driven by
//! fjord, as `docs/replication.md` §2–3 decides. This module is the first
//! step of that plan: the node, its durable log ([`store`]), its own wire
//! codec ([`codec`]) and a seeded multi-node simulation that checks Raft's
//! guarantees through this code (`simulation`, tests only). The
//! controller's metadata log is a quorum of one of these nodes
//! (`metadata::store::MetadataLog`, `docs/replication.md` §9 step 1);
//! several voters, learners and the network between them are step 2.
//!
//! raft-rs is sans-io. A [`QuorumNode`] is a plain value owned by one shard
//! (the controller shard); the caller ticks it from a timer, steps it with
//! messages from peers, proposes records, and calls [`QuorumNode::advance`]
//! after any of these. `advance` runs raft-rs's `Ready` protocol:
//!
//! 1. messages raft-rs allows to go before persistence (a leader's appends)
//!    are handed out;
//! 2. new entries and the hard state are written to the log, then synced
//!    (`RaftDisk::sync`) before the messages that depend on them (votes,
//!    append acknowledgements) are handed out — a node never acknowledges
//!    what a crash could make it forget;
//! 3. committed entries are returned in order for the caller to apply.
//!
//! Peers are trusted to run this code (Raft tolerates crashes, not lies),
//! but a message read from the network must still never crash the shard:
//! the codec bounds everything, and [`QuorumNode::step`] drops messages
//! that are not for this node, come from outside the membership, or would
//! trip one of raft-rs's internal assertions (a heartbeat committing past
//! this node's log, an append rewriting a committed entry, a snapshot,
//! which this log does not take yet) — only a broken or hostile peer sends
//! those, and dropping them is always safe in Raft.
//!
//! Membership changes: the voters are fixed when the log is created; a
//! **learner** (Kafka's observer) is added while the quorum runs
//! (`docs/replication.md` §3.2), and removed again once its node is
//! unregistered. The leader proposes a raft-rs `ConfChangeV2` with one
//! `AddLearnerNode` and the learner's controller address as its context
//! ([`QuorumNode::propose_add_learner`]), or with one `RemoveNode`
//! ([`QuorumNode::propose_remove_learner`]); every member, when the entry
//! commits, checks it (one change, not naming a voter; an addition: an
//! address of at most [`ADDRESS_BYTES_MAX`], at most [`LEARNERS_MAX`]
//! learners, an address not already another learner's; a removal: of a
//! current learner), applies it (`RawNode::apply_conf_change`) and writes
//! the new membership, the learners' addresses and the index of each
//! learner's addition to the log's file in one record, with the change's
//! index ([`QuorumNode::learners`], `store`'s `MEMBERSHIP`). A change that
//! fails the check is skipped on every member alike (they all apply the
//! same entries in the same order). A restart reads the membership back
//! from the file, then replays every committed entry from index 1 (the
//! log is never compacted), passing over the changes at or below the
//! index the file's membership holds: so the replay gives the membership
//! applying every change in order gave, never re-adding a learner removed
//! since. (A file from before that record holds no index; it has only
//! additions, which are no-ops when already applied.) A learner never
//! votes nor campaigns (raft-rs counts only voters); promotion to voter
//! and a voter's removal (Kafka's KIP-853) are not built: a removal
//! naming a voter is refused by the proposer and skipped by every member.

pub mod codec;
#[cfg(test)]
#[allow(clippy::field_reassign_with_default)] // protobuf structs
mod simulation;
pub mod store;
pub mod transport;

use bytes::Bytes;
use raft::eraftpb::{
    ConfChangeSingle, ConfChangeType, ConfChangeV2, ConfState, EntryType, Message, MessageType,
};
use raft::{RawNode, StateRole};
use std::io;
use store::{Core, RaftDisk, RaftStore};

/// Learners a quorum takes at most (each costs the leader a stream of
/// appends and a connection).
pub const LEARNERS_MAX: usize = 16;
/// Longest controller address (`host:port`) a learner may give.
pub const ADDRESS_BYTES_MAX: usize = 255;

/// A node's place in the quorum and its timing.
#[derive(Clone, Debug)]
pub struct QuorumConfig {
    /// This node's id (not 0).
    pub id: u64,
    /// The voters, when the log is created (Kafka's `controller.quorum.voters`).
    pub voters: Vec<u64>,
    /// Nodes that receive the log without voting (Kafka's observers).
    pub learners: Vec<u64>,
    /// Ticks without a leader before a follower campaigns.
    pub election_tick: usize,
    /// Ticks between a leader's heartbeats.
    pub heartbeat_tick: usize,
    /// The election timeout is drawn from `[election_tick,
    /// max_election_tick)`; the simulation sets `election_tick + 1` so no
    /// randomness outside its seed is used.
    pub max_election_tick: usize,
}

impl QuorumConfig {
    /// Production timing: tick every 100 ms, heartbeat every tick, an
    /// election after 1–2 s of silence.
    pub fn new(id: u64, voters: Vec<u64>, learners: Vec<u64>) -> Self {
        Self {
            id,
            voters,
            learners,
            election_tick: 10,
            heartbeat_tick: 1,
            max_election_tick: 20,
        }
    }
}

/// An entry the quorum committed, in log order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Committed {
    pub index: u64,
    pub term: u64,
    pub data: Bytes,
}

/// What one [`QuorumNode::advance`] produced.
#[derive(Default, Debug)]
pub struct Progress {
    /// Messages to send, each to `message.to`.
    pub messages: Vec<Message>,
    /// Newly committed records to apply, in order.
    pub committed: Vec<Committed>,
    /// Learners added by the membership changes committed in this step:
    /// (raft id, controller address).
    pub learners_added: Vec<(u64, String)>,
    /// Learners removed by the membership changes committed in this step.
    pub learners_removed: Vec<u64>,
    /// The contexts of the [`QuorumNode::confirm_leadership`] rounds a
    /// majority answered in this step.
    pub confirmed: Vec<u64>,
}

/// Why a peer's message was not stepped.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error("message for node {to}, this is node {me}")]
    NotForMe { to: u64, me: u64 },
    #[error("message from node {0}, which is not in the quorum")]
    UnknownPeer(u64),
    #[error("message dropped: {0}")]
    Implausible(&'static str),
    #[error(transparent)]
    Raft(#[from] raft::Error),
}

/// One node of the metadata quorum.
pub struct QuorumNode<D: RaftDisk> {
    raw: RawNode<RaftStore>,
    store: RaftStore,
    disk: D,
    /// Learners' controller addresses, from the log's file at open and the
    /// committed membership changes applied since.
    learners: std::collections::BTreeMap<u64, String>,
    /// The index of the last committed entry handed out (records,
    /// membership changes and empty entries alike).
    applied: u64,
    /// Ticks since the last message from the leader this node knows of
    /// (0 while it leads): a learner the quorum removed hears nothing
    /// any more, and asks to join again after a while (the controller).
    quiet_ticks: usize,
}

impl<D: RaftDisk> QuorumNode<D> {
    /// Opens the node over `disk`, whose current content is `bytes`: a torn
    /// tail is cut; an empty log is created with `config`'s membership.
    pub fn open(config: &QuorumConfig, mut disk: D, bytes: &[u8]) -> anyhow::Result<Self> {
        let (core, valid) = store::load(bytes)?;
        if valid < bytes.len() {
            tracing::warn!(
                cut = bytes.len() - valid,
                "metadata quorum: cutting a torn record off the raft log"
            );
            disk.truncate(valid as u64)?;
        }
        let fresh = core == Core::default();
        let store = RaftStore::new(core);
        if fresh {
            let cs = ConfState {
                voters: config.voters.clone(),
                learners: config.learners.clone(),
                ..Default::default()
            };
            store.set_conf_state(&cs, &mut disk)?;
            disk.sync()?;
        }
        let raft_config = raft::Config {
            id: config.id,
            election_tick: config.election_tick,
            heartbeat_tick: config.heartbeat_tick,
            min_election_tick: config.election_tick,
            max_election_tick: config.max_election_tick,
            pre_vote: true,
            check_quorum: true,
            max_size_per_msg: 1 << 20,
            max_inflight_msgs: 256,
            ..Default::default()
        };
        let raw = RawNode::new(&raft_config, store.clone(), &logger())?;
        let learners = store.addresses();
        Ok(Self {
            raw,
            store,
            disk,
            learners,
            applied: 0,
            quiet_ticks: 0,
        })
    }

    /// One timer tick.
    pub fn tick(&mut self) {
        self.raw.tick();
        self.quiet_ticks = if self.is_leader() {
            0
        } else {
            self.quiet_ticks.saturating_add(1)
        };
    }

    /// Ticks since this node last heard from the leader it knows of (0
    /// while it leads).
    pub fn ticks_without_leader(&self) -> usize {
        self.quiet_ticks
    }

    /// Starts an election now instead of after an election timeout. A
    /// quorum of one (`metadata::store`) wins it at once, so a single node
    /// leads, and can commit, as soon as it has opened its log.
    pub fn campaign(&mut self) -> Result<(), raft::Error> {
        self.raw.campaign()
    }

    /// Whether [`Self::advance`] has anything to do (a tick usually leaves
    /// nothing for a quorum of one; the caller can skip the disk then).
    pub fn has_ready(&self) -> bool {
        self.raw.has_ready()
    }

    /// Starts a round that confirms this node still leads: raft-rs's
    /// ReadIndex, which sends the followers a heartbeat carrying `context`
    /// (as its 8 big-endian bytes)
    /// and comes back in [`Progress::confirmed`] once a majority answered
    /// it in this term. A follower that answered will not vote for another
    /// candidate for an election timeout after it got the heartbeat
    /// (`check_quorum`), so no other node leads the quorum before then.
    /// Nothing comes back on a node that does not lead, or leads but has
    /// not committed an entry of its term yet (raft-rs drops the round).
    pub fn confirm_leadership(&mut self, context: u64) {
        self.raw.read_index(context.to_be_bytes().to_vec());
    }

    /// Hands a peer's message to raft-rs, unless it must be dropped (module
    /// doc).
    pub fn step(&mut self, m: Message) -> Result<(), StepError> {
        let me = self.raw.raft.id;
        if m.to != me {
            return Err(StepError::NotForMe { to: m.to, me });
        }
        // Only the membership: the whole log is not copied per message.
        let cs = self.store.conf_state();
        let member = |id: u64| {
            cs.voters.contains(&id)
                || cs.learners.contains(&id)
                || cs.voters_outgoing.contains(&id)
                || cs.learners_next.contains(&id)
        };
        if !member(m.from) {
            return Err(StepError::UnknownPeer(m.from));
        }
        self.plausible(&m)?;
        let from = m.from;
        self.raw.step(m)?;
        if from == self.raw.raft.leader_id {
            self.quiet_ticks = 0;
        }
        Ok(())
    }

    /// Checks a message against the assertions raft-rs makes about what a
    /// correct leader sends.
    fn plausible(&self, m: &Message) -> Result<(), StepError> {
        let log = &self.raw.raft.raft_log;
        match m.get_msg_type() {
            MessageType::MsgSnapshot => Err(StepError::Implausible("snapshots are not taken yet")),
            MessageType::MsgHeartbeat if m.commit > log.last_index() => Err(
                StepError::Implausible("a heartbeat commits past this node's log"),
            ),
            MessageType::MsgAppend => {
                let committed = log.committed;
                if m.index < committed && m.term >= self.raw.raft.term {
                    // Entries at or below the commit index must match ours.
                    for e in m.entries.iter().filter(|e| e.index <= committed) {
                        if log.term(e.index).ok() != Some(e.term) {
                            return Err(StepError::Implausible(
                                "an append rewrites a committed entry",
                            ));
                        }
                    }
                }
                if m.entries.windows(2).any(|w| w[1].index != w[0].index + 1)
                    || m.entries.first().is_some_and(|e| e.index != m.index + 1)
                {
                    return Err(StepError::Implausible(
                        "an append's entries are not consecutive",
                    ));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Proposes a record; fails unless this node leads.
    pub fn propose(&mut self, data: Vec<u8>) -> Result<(), raft::Error> {
        if !self.is_leader() {
            return Err(raft::Error::ProposalDropped);
        }
        self.raw.propose(Vec::new(), data)
    }

    /// Proposes adding `id` as a learner whose controller listens at
    /// `address` (module doc); fails unless this node leads. raft-rs
    /// takes one membership change at a time: while one is not applied it
    /// turns another into an empty entry, so the caller checks
    /// [`Self::learners`] for the result, and asks again if need be.
    pub fn propose_add_learner(&mut self, id: u64, address: &str) -> Result<(), raft::Error> {
        if !self.is_leader() {
            return Err(raft::Error::ProposalDropped);
        }
        let mut single = ConfChangeSingle::default();
        single.set_change_type(ConfChangeType::AddLearnerNode);
        single.node_id = id;
        let mut cc = ConfChangeV2::default();
        cc.mut_changes().push(single);
        cc.context = Bytes::copy_from_slice(address.as_bytes());
        self.raw.propose_conf_change(Vec::new(), cc)
    }

    /// Proposes removing learner `id` (module doc); fails unless this
    /// node leads and `id` is a learner (a voter is never removed: voter
    /// changes are not built). Like an addition, it may be turned into an
    /// empty entry while another change is pending: the caller checks
    /// [`Self::learners`] and asks again.
    pub fn propose_remove_learner(&mut self, id: u64) -> Result<(), raft::Error> {
        if !self.is_leader() {
            return Err(raft::Error::ProposalDropped);
        }
        if !self.store.conf_state().learners.contains(&id) {
            return Err(raft::Error::NotExists {
                id,
                set: "learners",
            });
        }
        let mut single = ConfChangeSingle::default();
        single.set_change_type(ConfChangeType::RemoveNode);
        single.node_id = id;
        let mut cc = ConfChangeV2::default();
        cc.mut_changes().push(single);
        self.raw.propose_conf_change(Vec::new(), cc)
    }

    /// The learners added by committed membership changes, with their
    /// controller addresses.
    pub fn learners(&self) -> &std::collections::BTreeMap<u64, String> {
        &self.learners
    }

    /// The index of learner `id`'s addition (0: added before this was
    /// kept); None when it is not a learner.
    pub fn learner_added_at(&self, id: u64) -> Option<u64> {
        self.learners
            .contains_key(&id)
            .then(|| self.store.added().get(&id).copied().unwrap_or(0))
    }

    /// The index of the last committed entry handed out by
    /// [`Self::advance`] (records, membership changes and empty entries).
    pub fn applied(&self) -> u64 {
        self.applied
    }

    pub fn is_leader(&self) -> bool {
        self.raw.raft.state == StateRole::Leader
    }

    /// The leader this node knows of (0: none).
    pub fn leader_id(&self) -> u64 {
        self.raw.raft.leader_id
    }

    pub fn term(&self) -> u64 {
        self.raw.raft.term
    }

    /// The term of the entry at `index`, if the log holds it.
    pub fn term_of(&self, index: u64) -> Option<u64> {
        self.raw.raft.raft_log.term(index).ok()
    }

    /// The index of the last entry in the log (committed or not).
    pub fn last_index(&self) -> u64 {
        self.raw.raft.raft_log.last_index()
    }

    pub fn commit_index(&self) -> u64 {
        self.raw.raft.raft_log.committed
    }

    /// The membership the log holds.
    pub fn conf_state(&self) -> ConfState {
        self.store.conf_state()
    }

    /// The log's state (tests, diagnostics).
    pub fn log(&self) -> Core {
        self.store.snapshot_core()
    }

    /// The disk (the simulation crashes it).
    pub fn disk(&self) -> &D {
        &self.disk
    }

    /// Runs raft-rs's Ready protocol once (module doc). An I/O error leaves
    /// the node unusable: the caller must stop it (and, as for any log
    /// failure, the process ends and restarts from the disk).
    pub fn advance(&mut self) -> io::Result<Progress> {
        let mut out = Progress::default();
        if !self.raw.has_ready() {
            return Ok(out);
        }
        let mut ready = self.raw.ready();
        out.messages.extend(ready.take_messages());
        // Only `confirm_leadership` starts rounds: every context is 8 bytes.
        out.confirmed
            .extend(ready.take_read_states().into_iter().filter_map(|r| {
                <[u8; 8]>::try_from(r.request_ctx.as_slice())
                    .ok()
                    .map(u64::from_be_bytes)
            }));
        if !ready.snapshot().is_empty() {
            return Err(io::Error::other(
                "a raft snapshot arrived; snapshots are not built",
            ));
        }
        self.collect(ready.take_committed_entries(), &mut out)?;
        self.store.append(ready.entries(), &mut self.disk)?;
        if let Some(hs) = ready.hs() {
            self.store.set_hard_state(hs, &mut self.disk)?;
        }
        // Everything raft-rs will now treat as stable is made durable before
        // a message that depends on it leaves.
        self.disk.sync()?;
        out.messages.extend(ready.take_persisted_messages());
        let mut light = self.raw.advance(ready);
        if let Some(commit) = light.commit_index() {
            // Not synced: a lost commit index is learnt again from the leader.
            self.store.set_commit(commit, &mut self.disk)?;
        }
        out.messages.extend(light.take_messages());
        self.collect(light.take_committed_entries(), &mut out)?;
        self.raw.advance_apply();
        Ok(out)
    }

    fn collect(
        &mut self,
        entries: Vec<raft::eraftpb::Entry>,
        out: &mut Progress,
    ) -> io::Result<()> {
        for e in entries {
            self.applied = self.applied.max(e.index);
            match e.get_entry_type() {
                EntryType::EntryNormal => {}
                EntryType::EntryConfChangeV2 => {
                    self.apply_membership(&e, out)?;
                    continue;
                }
                EntryType::EntryConfChange => {
                    // fjord proposes only ConfChangeV2.
                    tracing::warn!(
                        index = e.index,
                        "metadata quorum: a committed membership change of the old form is skipped"
                    );
                    continue;
                }
            }
            if e.data.is_empty() {
                continue; // a new leader's empty entry
            }
            out.committed.push(Committed {
                index: e.index,
                term: e.term,
                data: e.data,
            });
        }
        Ok(())
    }

    /// Applies a committed membership change, or skips it (the same way on
    /// every member) when it is not one this code takes (module doc). Its
    /// new membership is written to the log's file in one record. A change
    /// at or below the index that record holds is in it already (a replay
    /// after a restart) and is passed over.
    fn apply_membership(&mut self, e: &raft::eraftpb::Entry, out: &mut Progress) -> io::Result<()> {
        if e.index <= self.store.membership_index() {
            return Ok(());
        }
        let change = match self.membership_change(&e.data) {
            Ok(change) => change,
            Err(why) => {
                tracing::warn!(
                    index = e.index,
                    why,
                    "metadata quorum: a committed membership change is skipped"
                );
                return Ok(());
            }
        };
        let Some(change) = change else {
            return Ok(()); // already applied (a log from before MEMBERSHIP)
        };
        let (kind, id) = match change {
            Change::Add(id, _) => (ConfChangeType::AddLearnerNode, id),
            Change::Remove(id) => (ConfChangeType::RemoveNode, id),
        };
        let mut single = ConfChangeSingle::default();
        single.set_change_type(kind);
        single.node_id = id;
        let mut cc = ConfChangeV2::default();
        cc.mut_changes().push(single);
        let cs = match self.raw.apply_conf_change(&cc) {
            Ok(cs) => cs,
            Err(err) => {
                tracing::warn!(index = e.index, error = %err, "metadata quorum: a committed membership change is skipped");
                return Ok(());
            }
        };
        let mut learners = self.learners.clone();
        let mut added = self.store.added();
        match &change {
            Change::Add(id, address) => {
                learners.insert(*id, address.clone());
                added.insert(*id, e.index);
            }
            Change::Remove(id) => {
                learners.remove(id);
                added.remove(id);
            }
        }
        self.store
            .set_membership(e.index, &cs, &learners, &added, &mut self.disk)?;
        self.learners = learners;
        match change {
            Change::Add(id, address) => {
                tracing::info!(
                    learner = id,
                    %address,
                    index = e.index,
                    "metadata quorum: a learner joined"
                );
                out.learners_added.push((id, address));
            }
            Change::Remove(id) => {
                tracing::info!(
                    learner = id,
                    index = e.index,
                    "metadata quorum: a learner left"
                );
                out.learners_removed.push(id);
            }
        }
        Ok(())
    }

    /// The change a committed membership change makes; Ok(None) when it
    /// is the addition of a learner already known at that address; Err
    /// when it is not one this code applies.
    fn membership_change(&self, data: &[u8]) -> Result<Option<Change>, &'static str> {
        let cc = codec::conf_change(data).map_err(|_| "it does not decode")?;
        let [(kind, id)] = cc.changes[..] else {
            return Err("not a single change");
        };
        if cc.transition != 0 {
            return Err("not a simple change");
        }
        if id == 0 {
            return Err("node id 0");
        }
        let cs = self.store.conf_state();
        if cs.voters.contains(&id) || cs.voters_outgoing.contains(&id) {
            return Err("the node is a voter");
        }
        match kind {
            codec::ADD_LEARNER_NODE => {}
            codec::REMOVE_NODE => {
                return if cs.learners.contains(&id) {
                    Ok(Some(Change::Remove(id)))
                } else {
                    Err("the node to remove is not a learner")
                };
            }
            _ => return Err("neither a learner's addition nor its removal"),
        }
        if cc.context.is_empty() || cc.context.len() > ADDRESS_BYTES_MAX {
            return Err("no address, or one too long");
        }
        let address = String::from_utf8(cc.context).map_err(|_| "an address not in UTF-8")?;
        match self.learners.get(&id) {
            Some(known) if *known == address => return Ok(None),
            Some(_) => return Err("the learner is known at another address"),
            None => {}
        }
        if self.learners.values().any(|a| *a == address) {
            return Err("another learner has that address");
        }
        let learners = cs.learners.iter().filter(|&&l| l != id).count();
        if learners >= LEARNERS_MAX {
            return Err("the quorum has the most learners it takes");
        }
        Ok(Some(Change::Add(id, address)))
    }
}

/// A membership change this code applies.
enum Change {
    /// A learner's addition: raft id, controller address.
    Add(u64, String),
    /// A learner's removal.
    Remove(u64),
}

/// A node over a `Send` disk can be moved to a blocking thread for its disk
/// I/O and back (`metadata::store::MetadataLog`): checked here, at compile
/// time.
const _: fn() = || {
    fn is_send<T: Send>() {}
    is_send::<QuorumNode<store::FileDisk>>();
};

/// raft-rs logs through `slog`; this forwards its records to `tracing`.
fn logger() -> slog::Logger {
    slog::Logger::root(TracingDrain, slog::o!())
}

struct TracingDrain;

impl slog::Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &slog::Record, _: &slog::OwnedKVList) -> Result<(), slog::Never> {
        let msg = record.msg();
        match record.level() {
            slog::Level::Critical | slog::Level::Error => {
                tracing::error!(target: "raft", "{msg}")
            }
            slog::Level::Warning => tracing::warn!(target: "raft", "{msg}"),
            slog::Level::Info => tracing::debug!(target: "raft", "{msg}"),
            slog::Level::Debug | slog::Level::Trace => tracing::trace!(target: "raft", "{msg}"),
        }
        Ok(())
    }
}
