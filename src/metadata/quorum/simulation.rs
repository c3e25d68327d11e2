//! A seeded simulation of the metadata quorum: several [`QuorumNode`]s,
//! raft-rs unmodified inside them, over a simulated network that drops,
//! delays, duplicates and reorders messages and cuts nodes off, with nodes
//! that crash (keeping only what their disk synced, plus a random part of
//! what it had not, possibly a torn record) and restart. Every message goes
//! through the wire codec, so the codec is in the loop too.
//!
//! Checked after every step:
//! - **state machine safety**: no two nodes ever applied different records
//!   at the same index;
//! - **election safety**: at most one leader per term;
//!
//! and at the end, after the faults stop and the cluster settles:
//! - **durability**: every record whose commit a leader reported (what the
//!   controller would have acknowledged to a client) is applied on every
//!   node, exactly once, at the index it was committed at;
//! - **liveness**: the healed cluster elects a leader and commits a new
//!   record.
//!
//! Time and randomness come from the seed only (raft-rs's election
//! randomness is disabled, `QuorumConfig::max_election_tick`, and each
//! node's ticks are staggered by the seed instead). Every run prints its
//! seed; `FJORD_QUORUM_SEED=<seed> cargo test --lib quorum::simulation`
//! replays one, `FJORD_QUORUM_SEEDS=<n>` runs n (default 8).

use super::store::mem::MemDisk;
use super::{codec, QuorumConfig, QuorumNode, LEARNERS_MAX};
use raft::eraftpb::{ConfChangeSingle, ConfChangeType, ConfChangeV2};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};

const STEPS: u64 = 3_000;
const SETTLE_STEPS: u64 = 1_000;
const QUIET_STEPS: u64 = 300;

struct Sim {
    rng: StdRng,
    config: Vec<QuorumConfig>,
    nodes: Vec<Option<QuorumNode<MemDisk>>>,
    /// A crashed node's disk, until it restarts.
    down: Vec<Option<(MemDisk, u64)>>,
    /// Messages in flight: (deliver at step, to, encoded).
    net: Vec<(u64, u64, Vec<u8>)>,
    /// Nodes cut off from the others until the given step.
    cut_off: HashMap<u64, u64>,
    /// What each node applied since its last start: index → record.
    applied: Vec<BTreeMap<u64, Vec<u8>>>,
    /// Every record applied anywhere: index → record (safety check).
    chosen: BTreeMap<u64, Vec<u8>>,
    /// Term → leader seen in it.
    leaders: HashMap<u64, u64>,
    /// Records acknowledged (their commit seen on their leader): record → index.
    acked: HashMap<Vec<u8>, u64>,
    /// Records proposed on a leader, not yet seen committed there.
    proposed: HashMap<u64, Vec<Vec<u8>>>,
    /// Leadership confirmations answered: (node index, context).
    confirmed: Vec<(usize, u64)>,
    next_value: u64,
    faults: bool,
    proposing: bool,
    step: u64,
    crashes: u64,
    cuts: u64,
}

impl Sim {
    fn new(seed: u64, voters: u64, learners: u64) -> Self {
        let ids: Vec<u64> = (1..=voters + learners).collect();
        let voter_ids: Vec<u64> = (1..=voters).collect();
        let learner_ids: Vec<u64> = (voters + 1..=voters + learners).collect();
        let config: Vec<QuorumConfig> = ids
            .iter()
            .map(|&id| QuorumConfig {
                id,
                voters: voter_ids.clone(),
                learners: learner_ids.clone(),
                election_tick: 10,
                heartbeat_tick: 2,
                max_election_tick: 11,
            })
            .collect();
        let nodes = config
            .iter()
            .map(|c| Some(QuorumNode::open(c, MemDisk::default(), &[]).unwrap()))
            .collect();
        let n = ids.len();
        Self {
            rng: StdRng::seed_from_u64(seed),
            config,
            nodes,
            down: (0..n).map(|_| None).collect(),
            net: Vec::new(),
            cut_off: HashMap::new(),
            applied: vec![BTreeMap::new(); n],
            chosen: BTreeMap::new(),
            leaders: HashMap::new(),
            acked: HashMap::new(),
            proposed: HashMap::new(),
            confirmed: Vec::new(),
            next_value: 0,
            faults: true,
            proposing: true,
            step: 0,
            crashes: 0,
            cuts: 0,
        }
    }

    fn reachable(&self, from: u64, to: u64) -> bool {
        let cut = |id: u64| {
            self.cut_off
                .get(&id)
                .is_some_and(|&until| until > self.step)
        };
        !cut(from) && !cut(to)
    }

    fn run_step(&mut self) {
        self.step += 1;
        let n = self.nodes.len();
        // Faults.
        if self.faults {
            if self.rng.random_bool(0.004) {
                let i = self.rng.random_range(0..n);
                self.crashes += u64::from(self.nodes[i].is_some());
                self.crash(i);
            }
            if self.rng.random_bool(0.003) {
                let id = self.rng.random_range(1..=n as u64);
                let until = self.step + self.rng.random_range(20..200);
                self.cut_off.insert(id, until);
                self.cuts += 1;
            }
        }
        for i in 0..n {
            if self.down[i]
                .as_ref()
                .is_some_and(|(_, until)| *until <= self.step)
            {
                self.restart(i);
            }
        }
        // Ticks, staggered per node by the seed.
        for i in 0..n {
            if self.rng.random_bool(0.5) {
                if let Some(node) = self.nodes[i].as_mut() {
                    node.tick();
                }
            }
        }
        // Deliveries due now, in a shuffled order.
        let mut due = Vec::new();
        let mut later = Vec::new();
        for m in std::mem::take(&mut self.net) {
            if m.0 <= self.step {
                due.push(m);
            } else {
                later.push(m);
            }
        }
        self.net = later;
        for k in (1..due.len()).rev() {
            let j = self.rng.random_range(0..=k);
            due.swap(k, j);
        }
        for (_, to, bytes) in due {
            let i = (to - 1) as usize;
            let msg = codec::decode_message(&bytes).expect("the codec reads what it wrote");
            // A learner the tests add without running it gets nothing.
            if let Some(Some(node)) = self.nodes.get_mut(i) {
                // A message the node refuses (e.g. implausible) is dropped,
                // as the controller listener will drop it.
                let _ = node.step(msg);
            }
        }
        // Proposals to whichever node leads.
        if self.proposing && self.rng.random_bool(0.3) {
            let i = self.rng.random_range(0..n);
            if let Some(node) = self.nodes[i].as_mut() {
                if node.is_leader() {
                    self.next_value += 1;
                    let value = format!("v{}", self.next_value).into_bytes();
                    if node.propose(value.clone()).is_ok() {
                        self.proposed.entry(node.term()).or_default().push(value);
                    }
                }
            }
        }
        // Ready loops, then sends.
        for i in 0..n {
            let Some(node) = self.nodes[i].as_mut() else {
                continue;
            };
            let progress = node.advance().expect("the simulated disk does not fail");
            let id = (i + 1) as u64;
            let (is_leader, term) = (node.is_leader(), node.term());
            if is_leader {
                let prev = self.leaders.insert(term, id);
                assert!(
                    prev.is_none_or(|p| p == id),
                    "two leaders in term {term}: {prev:?} and {id}"
                );
            }
            for c in progress.committed {
                let data = c.data.to_vec();
                if let Some(prev) = self.applied[i].insert(c.index, data.clone()) {
                    assert_eq!(
                        prev, data,
                        "node {id} applied index {} twice, differently",
                        c.index
                    );
                }
                let chosen = self.chosen.entry(c.index).or_insert_with(|| data.clone());
                assert_eq!(
                    *chosen, data,
                    "index {} applied as two different records (node {id})",
                    c.index
                );
                // A leader seeing its own proposal committed acknowledges it.
                if is_leader
                    && self
                        .proposed
                        .get(&c.term)
                        .is_some_and(|v| v.contains(&data))
                {
                    self.acked.insert(data.clone(), c.index);
                }
            }
            self.confirmed
                .extend(progress.confirmed.into_iter().map(|c| (i, c)));
            for m in progress.messages {
                let (from, to) = (m.from, m.to);
                let bytes = codec::encode_message(&m).to_vec();
                if self.faults && self.rng.random_bool(0.05) {
                    continue; // dropped
                }
                if !self.reachable(from, to) {
                    continue;
                }
                let delay = if self.faults {
                    self.rng.random_range(1..6)
                } else {
                    1
                };
                if self.faults && self.rng.random_bool(0.02) {
                    self.net.push((self.step + delay + 3, to, bytes.clone())); // duplicated
                }
                self.net.push((self.step + delay, to, bytes));
            }
        }
    }

    fn crash(&mut self, i: usize) {
        let Some(node) = self.nodes[i].take() else {
            return;
        };
        let disk = node.disk();
        let keep = self.rng.random_range(0..=disk.pending.len());
        let bytes = disk.after_crash(keep);
        let disk = MemDisk {
            synced: bytes,
            pending: Vec::new(),
            syncs: 0,
        };
        let until = self.step + self.rng.random_range(10..150);
        self.down[i] = Some((disk, until));
        self.applied[i].clear();
    }

    fn restart(&mut self, i: usize) {
        let (disk, _) = self.down[i].take().unwrap();
        let bytes = disk.synced.clone();
        self.nodes[i] = Some(
            QuorumNode::open(&self.config[i], disk, &bytes)
                .expect("a crash leaves a loadable raft log"),
        );
    }
}

fn run(seed: u64) -> Stats {
    let voters = 3 + 2 * (seed % 2); // 3 or 5
    let mut sim = Sim::new(seed, voters, 1);
    for _ in 0..STEPS {
        sim.run_step();
    }
    // Heal: no more faults, everyone up and reachable.
    sim.faults = false;
    sim.cut_off.clear();
    for i in 0..sim.nodes.len() {
        if sim.nodes[i].is_none() {
            sim.restart(i);
        }
    }
    let proposed_before_heal = sim.next_value;
    for _ in 0..SETTLE_STEPS {
        sim.run_step();
    }
    // Quiet: the last commits reach every follower.
    sim.proposing = false;
    for _ in 0..QUIET_STEPS {
        sim.run_step();
    }
    let new_after_heal = sim.acked.keys().any(|v| {
        std::str::from_utf8(&v[1..])
            .ok()
            .and_then(|n| n.parse::<u64>().ok())
            .is_some_and(|n| n > proposed_before_heal)
    });
    assert!(
        new_after_heal,
        "seed {seed}: the healed cluster acknowledged nothing new"
    );
    let commit = sim
        .nodes
        .iter()
        .map(|n| n.as_ref().unwrap().commit_index())
        .max()
        .unwrap();
    for (i, applied) in sim.applied.iter().enumerate() {
        let node = sim.nodes[i].as_ref().unwrap();
        assert_eq!(
            node.commit_index(),
            commit,
            "seed {seed}: node {} did not catch up",
            i + 1
        );
        for (value, index) in &sim.acked {
            assert_eq!(
                applied.get(index),
                Some(value),
                "seed {seed}: node {} lost acknowledged record {} at {index}",
                i + 1,
                String::from_utf8_lossy(value)
            );
        }
        let mut seen = std::collections::HashSet::new();
        for v in applied.values() {
            assert!(seen.insert(v), "seed {seed}: a record applied twice");
        }
    }
    Stats {
        voters,
        crashes: sim.crashes,
        cuts: sim.cuts,
        terms: sim.leaders.len(),
        proposed: sim.next_value,
        acknowledged: sim.acked.len(),
        committed: commit,
    }
}

/// What a run went through (printed, to see that the faults happened).
#[derive(Debug)]
#[allow(dead_code)] // read through Debug
struct Stats {
    voters: u64,
    crashes: u64,
    cuts: u64,
    terms: usize,
    proposed: u64,
    acknowledged: usize,
    committed: u64,
}

#[test]
fn the_quorum_keeps_every_acknowledged_record_through_crashes_and_partitions() {
    let seeds: Vec<u64> = match std::env::var("FJORD_QUORUM_SEED") {
        Ok(s) => vec![s.parse().expect("FJORD_QUORUM_SEED is a number")],
        Err(_) => {
            let n: u64 = std::env::var("FJORD_QUORUM_SEEDS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(8);
            let base: u64 = rand::random();
            (0..n).map(|k| base.wrapping_add(k)).collect()
        }
    };
    for seed in seeds {
        println!("FJORD_QUORUM_SEED={seed}");
        let stats = run(seed);
        println!("  {stats:?}");
    }
}

#[test]
fn a_fresh_single_voter_commits_alone_and_keeps_its_log_over_a_restart() {
    let config = QuorumConfig::new(1, vec![1], vec![]);
    let mut node = QuorumNode::open(&config, MemDisk::default(), &[]).unwrap();
    let mut committed = Vec::new();
    for _ in 0..100 {
        node.tick();
        if node.is_leader() && committed.is_empty() {
            node.propose(b"first".to_vec()).unwrap();
        }
        committed.extend(node.advance().unwrap().committed);
        if !committed.is_empty() {
            break;
        }
    }
    assert_eq!(committed.len(), 1);
    assert_eq!(&committed[0].data[..], b"first");
    // Everything written, synced or not (the commit index is not synced:
    // a lost one is learnt again).
    let bytes = node.disk().after_crash(usize::MAX);
    let mut again = QuorumNode::open(&config, MemDisk::default(), &bytes).unwrap();
    let replayed = again.advance().unwrap().committed;
    assert_eq!(
        replayed, committed,
        "a restart replays the committed records"
    );
}

/// The way `metadata::store` runs a quorum of one: it campaigns at open
/// (no election timeout to wait for), and after a crash that kept the
/// entries but not the commit index (written unsynced after them), the new
/// term's first entry commits them again, in order, with nothing twice.
#[test]
fn a_single_voter_that_campaigns_leads_at_once_and_recommits_after_a_crash() {
    let config = QuorumConfig::new(1, vec![1], vec![]);
    let mut node = QuorumNode::open(&config, MemDisk::default(), &[]).unwrap();
    node.campaign().unwrap();
    assert!(node.is_leader(), "a quorum of one wins at once");
    assert!(node.advance().unwrap().committed.is_empty());
    for data in [&b"a"[..], b"b", b"c"] {
        node.propose(data.to_vec()).unwrap();
    }
    let committed = node.advance().unwrap().committed;
    let data: Vec<&[u8]> = committed.iter().map(|c| &c.data[..]).collect();
    assert_eq!(
        data,
        [&b"a"[..], b"b", b"c"],
        "committed by its own fdatasync"
    );
    assert!(!node.has_ready());
    node.tick();
    assert!(!node.has_ready(), "a tick of a lone leader writes nothing");
    // The crash keeps what was synced: the entries, not the commit index.
    let bytes = node.disk().after_crash(0);
    let mut again = QuorumNode::open(&config, MemDisk::default(), &bytes).unwrap();
    assert!(
        again.advance().unwrap().committed.is_empty(),
        "the persisted commit index predates the entries"
    );
    again.campaign().unwrap();
    let mut replayed = Vec::new();
    while again.has_ready() {
        replayed.extend(again.advance().unwrap().committed);
    }
    assert_eq!(replayed, committed);
    assert!(again.term() > node.term());
}

#[test]
fn messages_a_correct_peer_never_sends_are_dropped_not_stepped() {
    use super::StepError;
    use raft::eraftpb::{Entry, Message, MessageType};
    let config = QuorumConfig::new(1, vec![1, 2, 3], vec![]);
    let mut node = QuorumNode::open(&config, MemDisk::default(), &[]).unwrap();
    let forged = |t: MessageType, from: u64, to: u64| {
        let mut m = Message::default();
        m.set_msg_type(t);
        m.from = from;
        m.to = to;
        m.term = 1;
        m
    };
    // raft-rs asserts a heartbeat never commits past the follower's log.
    let mut hb = forged(MessageType::MsgHeartbeat, 2, 1);
    hb.commit = 5;
    assert!(matches!(node.step(hb), Err(StepError::Implausible(_))));
    // Entries with a gap.
    let mut append = forged(MessageType::MsgAppend, 2, 1);
    let mut e1 = Entry::default();
    e1.index = 1;
    e1.term = 1;
    let mut e3 = e1.clone();
    e3.index = 3;
    append.set_entries(vec![e1, e3].into());
    assert!(matches!(node.step(append), Err(StepError::Implausible(_))));
    assert!(matches!(
        node.step(forged(MessageType::MsgSnapshot, 2, 1)),
        Err(StepError::Implausible(_))
    ));
    assert!(matches!(
        node.step(forged(MessageType::MsgHeartbeat, 9, 1)),
        Err(StepError::UnknownPeer(9))
    ));
    assert!(matches!(
        node.step(forged(MessageType::MsgHeartbeat, 2, 3)),
        Err(StepError::NotForMe { to: 3, me: 1 })
    ));
    // A local message type from the network is refused by raft-rs itself.
    assert!(node.step(forged(MessageType::MsgHup, 2, 1)).is_err());
    // The node still works: a correct heartbeat is stepped.
    let mut ok = forged(MessageType::MsgHeartbeat, 2, 1);
    ok.commit = 0;
    node.step(ok).unwrap();
    assert_eq!(node.leader_id(), 2);
}

/// Disk damage that keeps every CRC valid (a record rewritten with its CRC
/// fixed up: a bug or a hand edit, never a crash) either opens or is
/// refused; it never reaches one of raft-rs's aborts. Every bit of every
/// record body is flipped in turn.
#[test]
fn a_log_with_any_one_record_rewritten_opens_or_is_refused_never_aborts() {
    let config = QuorumConfig::new(1, vec![1], vec![]);
    let mut node = QuorumNode::open(&config, MemDisk::default(), &[]).unwrap();
    node.campaign().unwrap();
    node.advance().unwrap();
    for data in [&b"a"[..], b"bb"] {
        node.propose(data.to_vec()).unwrap();
        node.advance().unwrap();
    }
    let good = node.disk().after_crash(usize::MAX);
    let mut frames = Vec::new();
    let mut at = 0;
    while at < good.len() {
        let len = u32::from_be_bytes(good[at..at + 4].try_into().unwrap()) as usize;
        frames.push((at, at + 8 + len));
        at += 8 + len;
    }
    for &(start, end) in &frames {
        for byte in start + 8..end {
            for bit in 0..8 {
                let mut bad = good.clone();
                bad[byte] ^= 1 << bit;
                let crc = crc32c::crc32c(&bad[start + 8..end]);
                bad[start + 4..start + 8].copy_from_slice(&crc.to_be_bytes());
                let opened = std::panic::catch_unwind(|| {
                    let Ok(mut n) = QuorumNode::open(&config, MemDisk::default(), &bad) else {
                        return;
                    };
                    if n.campaign().is_err() {
                        return;
                    }
                    for _ in 0..4 {
                        if n.advance().is_err() {
                            return;
                        }
                    }
                });
                assert!(
                    opened.is_ok(),
                    "byte {byte} bit {bit} of the record at {start}"
                );
            }
        }
    }
}

/// Three voters running without faults, and node 4 started as a learner
/// of its own log (as `MetadataLog::open_member` starts a node outside
/// `--controller-quorum`), not yet in the voters' membership.
fn sim_with_a_learner_outside(seed: u64) -> Sim {
    let mut sim = Sim::new(seed, 3, 0);
    let mut learner = sim.config[0].clone();
    learner.id = 4;
    learner.learners = vec![4];
    sim.nodes.push(Some(
        QuorumNode::open(&learner, MemDisk::default(), &[]).unwrap(),
    ));
    sim.config.push(learner);
    sim.down.push(None);
    sim.applied.push(BTreeMap::new());
    sim.faults = false;
    sim
}

/// The quorum's leader proposes adding learner `id` at `address`; returns
/// the leader's index.
fn propose_learner(sim: &mut Sim, id: u64, address: &str) -> usize {
    let leader = leader_of(sim);
    sim.nodes[leader]
        .as_mut()
        .unwrap()
        .propose_add_learner(id, address)
        .unwrap();
    leader
}

fn leader_of(sim: &Sim) -> usize {
    (0..sim.nodes.len())
        .find(|&i| sim.nodes[i].as_ref().is_some_and(|n| n.is_leader()))
        .expect("a leader")
}

fn settle(sim: &mut Sim, steps: u64) {
    for _ in 0..steps {
        sim.run_step();
    }
}

/// docs/replication.md §3.2: a learner joins a running quorum by the
/// leader's AddLearnerNode; it then receives every committed entry from
/// index 1 (the log is never compacted), its address is known on every
/// member, the membership is on every member's disk, and a restarted
/// learner comes back with it and catches up.
#[test]
fn a_learner_added_while_the_quorum_runs_gets_every_committed_entry() {
    let mut sim = sim_with_a_learner_outside(11);
    settle(&mut sim, 400);
    assert!(!sim.applied[0].is_empty(), "the voters commit");
    assert!(sim.applied[3].is_empty(), "not a member yet: nothing sent");
    let leader = propose_learner(&mut sim, 4, "10.0.0.4:9093");
    settle(&mut sim, 400);
    let commit = sim.nodes[leader].as_ref().unwrap().commit_index();
    for (i, node) in sim.nodes.iter().enumerate() {
        let node = node.as_ref().unwrap();
        assert_eq!(node.conf_state().learners, vec![4], "node {}", i + 1);
        assert_eq!(node.conf_state().voters, vec![1, 2, 3], "node {}", i + 1);
        assert_eq!(
            node.learners().get(&4).map(String::as_str),
            Some("10.0.0.4:9093")
        );
        assert_eq!(node.commit_index(), commit, "node {} caught up", i + 1);
    }
    assert_eq!(
        sim.applied[3], sim.applied[leader],
        "the learner applied every record the leader applied"
    );
    assert_eq!(
        sim.applied[3].keys().next(),
        sim.applied[leader].keys().next()
    );
    // The learner restarts: its membership from its file, its records and
    // the address from the log, and it catches up with what came since.
    sim.crash(3);
    let bytes = sim.down[3].as_ref().unwrap().0.synced.clone();
    let reopened = QuorumNode::open(&sim.config[3], MemDisk::default(), &bytes).unwrap();
    assert_eq!(reopened.conf_state().learners, vec![4]);
    assert_eq!(
        reopened.learners().get(&4).map(String::as_str),
        Some("10.0.0.4:9093"),
        "the address from the file, before any replay"
    );
    drop(reopened);
    // So does a voter's.
    let voter = (leader + 1) % 3;
    let bytes = sim.nodes[voter].as_ref().unwrap().disk().after_crash(0);
    let reopened = QuorumNode::open(&sim.config[voter], MemDisk::default(), &bytes).unwrap();
    assert_eq!(reopened.conf_state().learners, vec![4]);
    assert_eq!(
        reopened.learners().get(&4).map(String::as_str),
        Some("10.0.0.4:9093")
    );
    drop(reopened);
    sim.down[3].as_mut().unwrap().1 = u64::MAX;
    settle(&mut sim, 200); // the others go on committing
    sim.restart(3);
    settle(&mut sim, 400);
    let leader = leader_of(&sim);
    let node = sim.nodes[3].as_ref().unwrap();
    assert_eq!(
        node.commit_index(),
        sim.nodes[leader].as_ref().unwrap().commit_index()
    );
    assert_eq!(
        node.learners().get(&4).map(String::as_str),
        Some("10.0.0.4:9093")
    );
    let leaders_records: Vec<_> = sim.applied[leader].values().collect();
    let learners_records: Vec<_> = sim.applied[3].values().collect();
    assert_eq!(learners_records, leaders_records, "replayed and caught up");
    assert!(
        !sim.leaders.values().any(|&l| l == 4),
        "a learner never leads"
    );
}

/// A learner never counts in a majority: with two of three voters down,
/// the leader and the learner commit nothing (and the leader steps down,
/// check-quorum counting voters only); the learner never campaigns.
#[test]
fn a_learner_never_counts_in_a_majority_and_never_leads() {
    let mut sim = sim_with_a_learner_outside(12);
    settle(&mut sim, 400);
    let leader = propose_learner(&mut sim, 4, "10.0.0.4:9093");
    settle(&mut sim, 300);
    assert_eq!(
        sim.nodes[3].as_ref().unwrap().conf_state().learners,
        vec![4]
    );
    sim.proposing = false;
    for i in (0..3).filter(|&i| i != leader) {
        sim.crash(i);
        sim.down[i].as_mut().unwrap().1 = u64::MAX;
    }
    let before = sim.nodes[leader].as_ref().unwrap().commit_index();
    sim.nodes[leader]
        .as_mut()
        .unwrap()
        .propose(b"lonely".to_vec())
        .unwrap();
    settle(&mut sim, 600);
    for i in [leader, 3] {
        let node = sim.nodes[i].as_ref().unwrap();
        assert_eq!(
            node.commit_index(),
            before,
            "node {} committed alone",
            i + 1
        );
        assert!(!node.is_leader(), "node {} leads without a majority", i + 1);
    }
    assert!(!sim.applied[3].values().any(|v| v == b"lonely"));
    assert!(
        !sim.leaders.values().any(|&l| l == 4),
        "a learner never leads"
    );
}

/// A committed change that would make a voter a learner (raft-rs would
/// demote it), or name a second address for a learner, is skipped on
/// every member: the membership stays as it was.
#[test]
fn a_membership_change_this_code_does_not_take_is_skipped_everywhere() {
    let mut sim = sim_with_a_learner_outside(13);
    settle(&mut sim, 400);
    let leader = leader_of(&sim);
    let voter = (leader + 1) % 3 + 1;
    propose_learner(&mut sim, voter as u64, "10.0.0.9:9093");
    settle(&mut sim, 300);
    propose_learner(&mut sim, 4, "10.0.0.4:9093");
    settle(&mut sim, 300);
    propose_learner(&mut sim, 4, "10.0.0.5:9093");
    settle(&mut sim, 300);
    for (i, node) in sim.nodes.iter().enumerate() {
        let node = node.as_ref().unwrap();
        assert_eq!(node.conf_state().voters, vec![1, 2, 3], "node {}", i + 1);
        assert_eq!(node.conf_state().learners, vec![4], "node {}", i + 1);
        assert_eq!(
            node.learners().get(&4).map(String::as_str),
            Some("10.0.0.4:9093"),
            "node {}",
            i + 1
        );
    }
}

/// The quorum's leader proposes removing learner `id`; returns the
/// leader's index.
fn remove_learner(sim: &mut Sim, id: u64) -> usize {
    let leader = leader_of(sim);
    sim.nodes[leader]
        .as_mut()
        .unwrap()
        .propose_remove_learner(id)
        .unwrap();
    leader
}

/// Reopens voter `i` from everything its disk holds (a clean restart),
/// replays its log and returns what that first step produced.
fn reopen(sim: &mut Sim, i: usize) -> super::Progress {
    let node = sim.nodes[i].take().unwrap();
    let bytes = node.disk().after_crash(usize::MAX);
    let disk = MemDisk {
        synced: bytes.clone(),
        pending: Vec::new(),
        syncs: 0,
    };
    let mut node = QuorumNode::open(&sim.config[i], disk, &bytes).unwrap();
    let progress = node.advance().unwrap();
    sim.nodes[i] = Some(node);
    sim.applied[i].clear();
    progress
}

/// A learner added, then removed (its node unregistered): no voter holds
/// it in its membership, its address or its file any more; a restart of
/// every voter replays the whole log from index 1 to the same membership
/// without applying either change again; the learner can then be added
/// again and catches up with everything committed meanwhile.
#[test]
fn a_removed_learner_leaves_every_member_and_can_come_back() {
    let mut sim = sim_with_a_learner_outside(14);
    settle(&mut sim, 400);
    propose_learner(&mut sim, 4, "10.0.0.4:9093");
    settle(&mut sim, 300);
    assert_eq!(
        sim.nodes[3].as_ref().unwrap().conf_state().learners,
        vec![4]
    );
    remove_learner(&mut sim, 4);
    settle(&mut sim, 300);
    let voters_state = |sim: &Sim| {
        for i in 0..3 {
            let node = sim.nodes[i].as_ref().unwrap();
            assert_eq!(node.conf_state().voters, vec![1, 2, 3], "node {}", i + 1);
            assert!(node.conf_state().learners.is_empty(), "node {}", i + 1);
            assert!(node.learners().is_empty(), "node {}", i + 1);
            assert!(node.log().addresses.is_empty(), "node {}", i + 1);
            assert!(node.log().added.is_empty(), "node {}", i + 1);
        }
    };
    voters_state(&sim);
    let learners_commit = sim.nodes[3].as_ref().unwrap().commit_index();
    settle(&mut sim, 200);
    assert_eq!(
        sim.nodes[3].as_ref().unwrap().commit_index(),
        learners_commit,
        "a removed learner is sent nothing new"
    );
    assert!(sim.nodes[leader_of(&sim)].as_ref().unwrap().commit_index() > learners_commit);
    // Every voter restarts: the membership comes from its file, and the
    // replay from index 1 applies neither the addition nor the removal
    // again (nothing joins or leaves, nothing is written).
    for i in 0..3 {
        let membership = sim.nodes[i].as_ref().unwrap().log().membership_index;
        assert!(membership > 0, "node {}", i + 1);
        let progress = reopen(&mut sim, i);
        assert!(progress.learners_added.is_empty(), "node {}", i + 1);
        assert!(progress.learners_removed.is_empty(), "node {}", i + 1);
        let node = sim.nodes[i].as_ref().unwrap();
        assert_eq!(node.log().membership_index, membership, "node {}", i + 1);
    }
    voters_state(&sim);
    settle(&mut sim, 400);
    voters_state(&sim);
    // The node comes back: added again, it catches up.
    let leader = propose_learner(&mut sim, 4, "10.0.0.4:9093");
    settle(&mut sim, 300);
    sim.proposing = false;
    settle(&mut sim, 100);
    let commit = sim.nodes[leader].as_ref().unwrap().commit_index();
    for (i, node) in sim.nodes.iter().enumerate() {
        let node = node.as_ref().unwrap();
        assert_eq!(node.conf_state().learners, vec![4], "node {}", i + 1);
        assert_eq!(node.commit_index(), commit, "node {} caught up", i + 1);
    }
    // The voters restarted (their `applied` starts there); the learner
    // has every record they applied since, at the same index.
    for (index, record) in &sim.applied[leader] {
        assert_eq!(sim.applied[3].get(index), Some(record), "index {index}");
    }
}

/// Removing a voter (a demotion or a voter change, not built) is refused
/// by the proposer, and a committed one is skipped on every member: the
/// voters stay, and they go on committing.
#[test]
fn a_voters_removal_is_skipped_on_every_member() {
    let mut sim = sim_with_a_learner_outside(15);
    settle(&mut sim, 400);
    let leader = leader_of(&sim);
    let voter = ((leader + 1) % 3 + 1) as u64;
    let node = sim.nodes[leader].as_mut().unwrap();
    assert!(node.propose_remove_learner(voter).is_err());
    let mut single = ConfChangeSingle::default();
    single.set_change_type(ConfChangeType::RemoveNode);
    single.node_id = voter;
    let mut cc = ConfChangeV2::default();
    cc.mut_changes().push(single);
    node.raw.propose_conf_change(Vec::new(), cc).unwrap();
    let before = node.commit_index();
    settle(&mut sim, 400);
    for (i, node) in sim.nodes.iter().enumerate().take(3) {
        let node = node.as_ref().unwrap();
        assert_eq!(node.conf_state().voters, vec![1, 2, 3], "node {}", i + 1);
        assert!(node.commit_index() > before + 5, "node {} commits", i + 1);
    }
}

/// Learners that come and go never use up the quorum's LEARNERS_MAX: after
/// more add-and-remove cycles than it, one more learner is added and
/// catches up.
#[test]
fn add_and_remove_cycles_do_not_exhaust_the_learners() {
    let mut sim = sim_with_a_learner_outside(16);
    settle(&mut sim, 400);
    for k in 0..LEARNERS_MAX as u64 + 2 {
        let id = 10 + k;
        propose_learner(&mut sim, id, &format!("10.0.1.{k}:9093"));
        settle(&mut sim, 60);
        assert!(sim.nodes[0].as_ref().unwrap().learners().contains_key(&id));
        remove_learner(&mut sim, id);
        settle(&mut sim, 60);
        for i in 0..3 {
            let node = sim.nodes[i].as_ref().unwrap();
            assert!(node.conf_state().learners.is_empty(), "cycle {k}");
        }
    }
    let leader = propose_learner(&mut sim, 4, "10.0.0.4:9093");
    settle(&mut sim, 300);
    sim.proposing = false;
    settle(&mut sim, 100);
    let node = sim.nodes[3].as_ref().unwrap();
    assert_eq!(node.conf_state().learners, vec![4]);
    assert_eq!(
        node.commit_index(),
        sim.nodes[leader].as_ref().unwrap().commit_index()
    );
}

/// `metadata::lease`: the quorum's leader confirms it still leads (a
/// ReadIndex round) only with a majority's answers; cut off from the
/// others it gets none, and once a new leader is elected the old one's
/// round is dropped, never answered late.
#[test]
fn a_leader_confirms_its_lead_only_with_a_majority() {
    let mut sim = Sim::new(5, 3, 0);
    sim.faults = false;
    settle(&mut sim, 300);
    let leader = leader_of(&sim);
    sim.nodes[leader].as_mut().unwrap().confirm_leadership(1);
    settle(&mut sim, 20);
    assert_eq!(sim.confirmed, vec![(leader, 1)]);
    // Cut off: no confirmation, and the others elect another leader.
    sim.cut_off.insert(leader as u64 + 1, u64::MAX);
    sim.nodes[leader].as_mut().unwrap().confirm_leadership(2);
    settle(&mut sim, 300);
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    assert!(
        others
            .iter()
            .any(|&i| sim.nodes[i].as_ref().unwrap().is_leader()),
        "the majority elects a new leader"
    );
    sim.cut_off.clear();
    settle(&mut sim, 300);
    assert_eq!(
        sim.confirmed,
        vec![(leader, 1)],
        "the cut-off leader's round is never answered"
    );
    // The new leader confirms its own.
    let now = leader_of(&sim);
    sim.nodes[now].as_mut().unwrap().confirm_leadership(3);
    settle(&mut sim, 20);
    assert_eq!(sim.confirmed.last(), Some(&(now, 3)));
}
