//! A seeded simulation of one replicated partition on a cluster of three
//! nodes (`docs/replication.md` §8), on one thread: each node a real
//! `Partition` over the simulated disk (`log::storage::sim::SimDisk`), a
//! real Raft member of the metadata quorum (`QuorumNode`, raft-rs
//! unmodified, over an in-memory disk with crash semantics), and the real
//! rules of the controller and of the partition's leader and followers,
//! with every message between the nodes over a simulated network that
//! drops, delays, duplicates and reorders them and cuts nodes off.
//!
//! What is fjord's own code here, called as the broker calls it:
//! - the metadata: every change is a `MetadataRecord` proposed to the
//!   Raft quorum and applied to each node's `MetadataImage` once
//!   committed; the controller's decisions are its functions
//!   (`controller::heartbeat_records`: registration, unfencing, clean and
//!   unclean restarts, KIP-966 elections; `fence_records`: fencing a node
//!   whose heartbeats stopped for the session timeout, with the
//!   reconciliation of ISR, ELR and leader; `plan_alter_partition`:
//!   AlterPartition with its epoch fencing); a new controller first
//!   commits a `TermStart` and starts every node's heartbeat clock then,
//!   as the member loop does;
//! - the leader: `replication::leading::Leading` (follower fetch state,
//!   HW from the ISR under `min.insync.replicas`, ISR expansion on
//!   fetch, shrink every half `replica.lag.time.max.ms`, acks=all), the
//!   KIP-320 checks of a fetch (`check_leader_epoch`, `diverging`), the
//!   log read up to the written offset, `become_leader` in the image's
//!   epoch;
//! - the follower: `replication::manager::FollowerView` (the shard's
//!   `FollowerLog`: position, append that waits for the local
//!   acknowledgement, truncation, HW from the leader), the fetcher's
//!   `whole_batches` and `truncation_offset`;
//! - the producer side: `Partition::append_data` of idempotent batches on
//!   whichever node leads, refused under `min.insync.replicas`, and the
//!   produce path's acks=all wait (`wait_acked`, `Leading::advance`,
//!   `wait_for_hw_above`, then `Leading::acks_all_in` for the leader
//!   epoch it appended in: NOT_LEADER or
//!   NOT_ENOUGH_REPLICAS_AFTER_APPEND are not acknowledgements);
//! - each node's role changes (`ShardCtx::apply_replica_roles`'s rules):
//!   a node leads only once the image holds its current registration, in
//!   the image's leader epoch; it opens its log with `replica_log_epoch`;
//! - the lease (`metadata::lease`, `NodeLease` itself): a heartbeat is
//!   answered once the quorum's leader confirmed its lead
//!   (`QuorumNode::confirm_leadership`) or applied the heartbeat's
//!   records, and renews the node's lease from its send time once the
//!   node has applied as far as the answer names; a node serves fetches
//!   and takes produces as leader only while its lease holds
//!   (`ShardCtx::acts_in`).
//!
//! What is modelled, thinly: the carriers. Fetch, heartbeat and
//! AlterPartition requests are messages of this module, not Kafka
//! requests over TCP (the codec and handlers are tested elsewhere); a
//! follower has one fetch out at a time and drops an answer that is not
//! to it (a connection's answers come in order), and sends again after
//! a timeout; an OFFSET_OUT_OF_RANGE answer carries the leader's log
//! start and end, which the real fetcher asks ListOffsets for; a
//! controller that is busy with a proposal not yet applied, or does not
//! lead, drops a heartbeat and answers an AlterPartition with no clear
//! outcome (the real one queues or forwards it; the node heartbeats
//! again); a leader's AlterPartition without a clear answer (that one, a
//! proposal that lost its controller's lead, none in time) stays in
//! flight and is sent again, as `ShardCtx::alter_isr` does, since its
//! entry may still commit. One topic, one partition, three replicas,
//! `min.insync.replicas=2`, one shard per node.
//!
//! Faults, from the seed: a node killed (kill -9: its log fails with the
//! writes already issued landing, `PartitionLog::simulate_kill`; its raft
//! log keeps what it wrote, and its page cache is taken as written back,
//! as `partition::simulation` takes it) or, under `--fsync-acks` only, its power lost
//! (its files keep what they had fdatasynced and a random part of the
//! rest, `SimDisk::power_loss_under`; its raft log keeps its synced bytes
//! and part of the rest, maybe a torn record), restarted later with a
//! new incarnation as an unclean start; nodes cut off from the others
//! (heartbeats stop: fencing; fetches stop: ISR shrink); messages
//! dropped, delayed, duplicated, reordered; disk writes and fdatasyncs
//! completing out of order. Without `--fsync-acks` there is no power
//! loss: acknowledged writes are then only in page caches, and Kafka's
//! promise (and fjord's) does not cover losing the power of every replica
//! that holds them. The disk fails no write here (`partition::simulation`
//! covers EIO).
//!
//! Checked after every step (§8's invariants):
//! - at most one node acts as the partition's leader at a time (the
//!   image names it leader and its lease holds);
//! - every acknowledged acks=all batch is, byte for byte (CRC) and at its
//!   offset, in the log of every node when it becomes leader, and below
//!   the log end of the leader of the newest epoch;
//! - live replicas hold the same batches below the lower of their HWs
//!   (checked every few steps: it reads the logs);
//! - a leader's HW never moves back while it leads in one epoch;
//! - at most one node becomes leader in an epoch, each node leads in
//!   epochs that never go back, and the committed partition states never
//!   lower the leader or partition epoch, bump the leader epoch with every
//!   change of leader and name one leader per epoch;
//! - a new leader's producer state is what its log implies (each
//!   producer's epoch and last sequence);
//! - no two nodes apply different records at one Raft index.
//!
//! Findings fixed since (`tuning/simulation.md`): `STALE_EMPTY_EPOCH`
//! (seed 1796390887390 with `FJORD_CLUSTER_STEPS=500`: a node that led an
//! epoch without appending held it empty at its log end and, as a
//! follower, could never append the new leader's older-epoch batches; a
//! follower now names its epoch cache's newest epoch, as Kafka's does, and
//! `truncate_to` at the log end drops such an epoch), and zeros found
//! inside a live replica's log after power losses, which were this
//! module's disk model's: it replayed a truncated segment's old bytes, or
//! a deleted segment's over the file that reused its inode
//! (`log::storage::sim`'s `Shadow` now notices files changed outside its
//! seam).
//!
//! and at the end, after the faults stop and the cluster settles: one
//! leader, every replica's log equal to its log, every acknowledged batch
//! in it, and the healed cluster acknowledging new writes.
//!
//! Determinism: the operations, faults and network follow from the seed;
//! the disk's I/O completes on real io_uring and threads, so as in
//! `partition::simulation` a failing seed reproduces in most runs, not
//! all. `FJORD_CLUSTER_SEED=<seed> cargo test --lib shard::cluster_sim`
//! runs one seed, `FJORD_CLUSTER_SEEDS=<n>` n new seeds from the clock;
//! without either it runs the fixed seeds of `DEFAULT_SEEDS`;
//! `FJORD_CLUSTER_STEPS=<n>` sets the faulty steps (default 2000). Every
//! run prints its seeds.

use super::controller::{fence_records, heartbeat_records, plan_alter_partition, AlterPartition};
use super::{alter_partition_fate, AlterFate};
use crate::config::{BrokerConfig, ServeArgs};
use crate::log::storage::sim::{self as simdisk, Faults, SimDisk};
use crate::log::{LogConfig, LogManager, TailCache};
use crate::metadata::lease::NodeLease;
use crate::metadata::quorum::codec;
use crate::metadata::quorum::store::mem::MemDisk;
use crate::metadata::quorum::{QuorumConfig, QuorumNode};
use crate::metadata::store::{decode_record, encode_record};
use crate::metadata::{
    node_of, BrokerEndpoint, BrokerRegistration, MetadataImage, MetadataRecord, PartitionState,
    TopicConfig,
};
use crate::partition::simulation::{batch, run, Rng};
use crate::partition::{DataAppend, Partition};
use crate::record::{BatchHeader, RecordsChunk};
use crate::replication::fetcher::{truncation_offset, whole_batches, FollowerLog};
use crate::replication::leader::AcksAll;
use crate::replication::leading::{
    check_leader_epoch, diverging, FollowerFetch, IsrProposal, Leading,
};
use crate::replication::manager::{Follower, Followers};
use crate::types::{Offset, TopicPartition};
use bytes::Bytes;
use kafka_protocol::ResponseError;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const NODES: usize = 3;
const TOPIC: &str = "c";
const TOPIC_ID: [u8; 16] = [9; 16];
/// Simulated time per step.
const STEP_MS: u64 = 10;
/// Steps between a node's heartbeats (Kafka's 2 s scaled down).
const HEARTBEAT_STEPS: u64 = 20;
/// `--broker-session-timeout-ms`, in steps.
const SESSION_STEPS: u64 = 100;
/// The same as a duration (a lease's length).
const SESSION: Duration = Duration::from_millis(SESSION_STEPS * STEP_MS);
/// `--replica-lag-time-max-ms`.
const LAG_MAX_MS: i64 = 500;
/// The ISR shrink check runs every half of the lag time.
const SHRINK_EVERY: u64 = 25;
/// A fetch without an answer for this long is sent again.
const FETCH_TIMEOUT_STEPS: u64 = 30;
/// A partition error backs the follower off this long.
const FETCH_BACKOFF_STEPS: u64 = 10;
/// An AlterPartition not answered by then failed (REQUEST_TIMED_OUT).
const ALTER_TIMEOUT_STEPS: u64 = 50;
/// A produce not answered by then is answered REQUEST_TIMED_OUT.
const ACK_TIMEOUT_STEPS: u64 = 300;
/// Steps after the faults stop with producers, then without.
const SETTLE_STEPS: u64 = 800;
const QUIET_STEPS: u64 = 300;
/// The replicas' logs are compared every this many steps.
const COMPARE_EVERY: u64 = 25;
const SIM_START_MS: i64 = 1_700_000_000_000;

fn tp() -> TopicPartition {
    TopicPartition::new(TOPIC, 0)
}

fn broker(node: usize) -> i32 {
    (node as i32 + 1) * 1000
}

/// The node index of broker `b`.
fn index_of(b: i32) -> Option<usize> {
    let n = node_of(b);
    (1..=NODES as i32).contains(&n).then(|| (n - 1) as usize)
}

/// A message between two nodes.
#[derive(Clone)]
enum Msg {
    /// A Raft message, in the controller listener's encoding.
    Raft(Vec<u8>),
    /// A node's heartbeat, with the node's clock at its sending (the
    /// real heartbeat task keeps it while it waits for the answer).
    Heartbeat(BrokerRegistration, Instant),
    /// The quorum leader's answer to a heartbeat (of that incarnation,
    /// sent then), once its lead is confirmed or the heartbeat's records
    /// are applied: the index it had applied (`Controller::heartbeat`).
    HeartbeatAnswer {
        incarnation: [u8; 16],
        sent: Instant,
        index: u64,
    },
    /// A leader's AlterPartition.
    Alter(IsrProposal),
    /// What became of the change (`ShardCtx::alter_isr`'s fates: refused
    /// drops the proposal, `Leading::proposal_failed`; no clear answer
    /// keeps it in flight and asks again).
    AlterAnswer(IsrProposal, AlterFate),
    Fetch(FetchReq),
    FetchAnswer(FetchAnswer),
}

#[derive(Clone, Debug)]
struct FetchReq {
    id: u64,
    replica: i32,
    /// The follower's broker epoch: its registration's once its image
    /// holds this process's, else -1 (`ShardCtx::broker_epoch_in`).
    broker_epoch: i64,
    current_leader_epoch: i32,
    fetch_offset: i64,
    last_fetched_epoch: i32,
    log_start: i64,
}

#[derive(Clone, Debug)]
struct FetchAnswer {
    id: u64,
    error: Option<ResponseError>,
    diverging: Option<(i32, i64)>,
    records: Bytes,
    high_watermark: i64,
    log_start: i64,
    log_end: i64,
}

impl FetchAnswer {
    fn error(id: u64, e: ResponseError) -> FetchAnswer {
        FetchAnswer {
            id,
            error: Some(e),
            diverging: None,
            records: Bytes::new(),
            high_watermark: -1,
            log_start: -1,
            log_end: -1,
        }
    }
}

/// What a running node holds besides its Raft member.
struct Live {
    mgr: Rc<LogManager>,
    /// Opened once the image names the topic.
    p: Option<Rc<Partition>>,
    leading: Rc<Leading>,
    followers: Rc<Followers>,
    /// The leader epoch it leads in, once it became leader in it.
    leads: Option<i32>,
    /// Its AlterPartition out, and when it was sent: unanswered for
    /// [`ALTER_TIMEOUT_STEPS`], it is sent again while it is still the
    /// proposal in flight (the real request times out and is retried).
    alter_out: Option<(IsrProposal, u64)>,
    /// This start's lease (`metadata::lease`).
    lease: NodeLease,
    /// A heartbeat answered (its send time and the index the answer
    /// names) that renews the lease once the node has applied as far.
    answered: Option<(Instant, u64)>,
}

impl Live {
    fn new(dir: &Path) -> Live {
        let leading = Rc::new(Leading::default());
        leading.set_lag_max_ms(LAG_MAX_MS);
        Live {
            mgr: LogManager::new_for_shard(dir.to_path_buf(), TailCache::new(1 << 20), 0),
            p: None,
            leading,
            followers: Rc::new(Followers::default()),
            leads: None,
            alter_out: None,
            lease: NodeLease::cluster(),
            answered: None,
        }
    }
}

/// A proposal the controller waits to see applied.
struct Busy {
    term: u64,
    index: u64,
    /// The AlterPartition to answer: its leader's node and proposal.
    answer: Option<(usize, IsrProposal)>,
    /// The heartbeat to answer once applied: its node, incarnation and
    /// send time.
    heartbeat: Option<(usize, [u8; 16], Instant)>,
}

/// The controller's memory (it acts while its node leads the quorum).
#[derive(Default)]
struct Ctl {
    /// The term it last led in (its TermStart proposed).
    term: u64,
    /// When each node was last heard from, in steps.
    heartbeats: BTreeMap<i32, u64>,
    busy: Option<Busy>,
    /// Heartbeats waiting for the confirmation of its lead, by the
    /// confirmation's context: node, incarnation, send time. Cleared
    /// when it stops leading.
    confirming: BTreeMap<u64, (usize, [u8; 16], Instant)>,
    next_confirmation: u64,
}

struct Node {
    dir: PathBuf,
    quorum: QuorumConfig,
    raft: Option<QuorumNode<MemDisk>>,
    /// While down: its raft log's bytes, and the step it restarts at.
    down: Option<(Vec<u8>, u64)>,
    image: MetadataImage,
    applied: u64,
    /// Starts so far (the incarnation counter).
    starts: u64,
    live: Option<Live>,
    ctl: Ctl,
    next_heartbeat: u64,
    /// The fetch out: its id and when it was sent.
    fetch_out: Option<(u64, u64)>,
    fetch_not_before: u64,
}

impl Node {
    fn incarnation(&self, i: usize) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0] = i as u8 + 1;
        b[8..].copy_from_slice(&self.starts.to_be_bytes());
        b
    }

    fn registration(&self, i: usize) -> BrokerRegistration {
        BrokerRegistration {
            node: i as i32 + 1,
            shards: 1,
            endpoints: vec![BrokerEndpoint {
                protocol: "PLAINTEXT".into(),
                host: format!("node{}", i + 1),
                port: 9092,
            }],
            incarnation: self.incarnation(i),
            leader_epoch: self.starts as i32,
            // Every start after the first follows a kill or a power loss.
            clean_shutdown: self.starts == 1,
        }
    }

    /// This start's registration, if the node's image holds it.
    fn own_registration(&self, i: usize) -> Option<&BrokerRegistration> {
        self.image
            .brokers
            .get(&(i as i32 + 1))
            .map(|b| &b.registration)
            .filter(|r| r.incarnation == self.incarnation(i))
    }

    /// The image holds this start's registration.
    fn registered(&self, i: usize) -> bool {
        self.own_registration(i).is_some()
    }

    /// The node acts as the leader its image names it: registered in
    /// this start and its lease holds (`ShardCtx::acts_in`).
    fn acts(&self, i: usize) -> bool {
        self.registered(i)
            && self
                .live
                .as_ref()
                .is_some_and(|l| l.lease.holds(&self.image))
    }

    /// This process's broker epoch in the node's image (-1 until the
    /// image holds its registration).
    fn broker_epoch(&self, i: usize) -> i64 {
        self.own_registration(i)
            .map_or(-1, BrokerRegistration::broker_epoch)
    }

    fn state(&self) -> Option<PartitionState> {
        self.image
            .topic(TOPIC)
            .and_then(|t| t.replica_state(0))
            .cloned()
    }
}

/// A batch as the checks see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BatchId {
    base: i64,
    last: i64,
    crc: u32,
    producer: i64,
    epoch: i16,
    seq: i32,
}

/// A produce waiting for its acks=all answer.
struct Pending {
    node: usize,
    start: u64,
    batch: BatchId,
    sent: u64,
    outcome: Rc<Cell<Option<bool>>>,
    _task: glommio::Task<()>,
}

#[derive(Debug, Default)]
#[allow(dead_code)] // read through Debug
struct Stats {
    kills: u64,
    power_losses: u64,
    cuts: u64,
    leaderships: u64,
    fenced: u64,
    isr_changes: u64,
    truncations: u64,
    produced: u64,
    acknowledged: u64,
    refused: u64,
    not_acknowledged: u64,
}

struct Sim {
    rng: Rng,
    config: BrokerConfig,
    fsync: bool,
    nodes: Vec<Node>,
    /// Messages in flight: (deliver at step, from, to, message).
    net: Vec<(u64, usize, usize, Msg)>,
    /// Nodes cut off from the others until the given step.
    cut_off: BTreeMap<usize, u64>,
    step: u64,
    faults: bool,
    producing: bool,
    /// Every record applied anywhere, by Raft index.
    chosen: BTreeMap<u64, Vec<u8>>,
    /// Leader epoch → the node that became leader in it.
    epoch_leaders: BTreeMap<i32, usize>,
    /// The epoch each node last became leader in.
    led_in: BTreeMap<usize, i32>,
    /// Leader epoch → the leader the committed metadata names in it.
    image_leaders: BTreeMap<i32, i32>,
    /// A leader's HW by (node, start, leader epoch).
    hw_seen: BTreeMap<(usize, u64, i32), i64>,
    pending: Vec<Pending>,
    acked: Vec<BatchId>,
    /// Who acknowledged each batch (by base offset): node, the epoch it
    /// led in then, the steps of the append and of the answer.
    acked_by: BTreeMap<i64, (usize, Option<i32>, u64, u64)>,
    /// The producer: its id and next sequence.
    producer: Option<(i64, i32)>,
    next_producer: i64,
    next_fetch: u64,
    /// Acknowledged after the faults stopped.
    acked_after_heal: u64,
    stats: Stats,
}

impl Sim {
    fn new(rng: Rng, fsync: bool, root: &Path) -> Result<Sim, String> {
        let config = ServeArgs::default()
            .resolve()
            .map_err(|e| format!("default settings: {e}"))?;
        let voters: Vec<u64> = (1..=NODES as u64).collect();
        let mut nodes = Vec::new();
        for i in 0..NODES {
            let dir = root.join(format!("node{}", i + 1));
            std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
            let quorum = QuorumConfig {
                id: i as u64 + 1,
                voters: voters.clone(),
                learners: Vec::new(),
                election_tick: 10,
                heartbeat_tick: 2,
                max_election_tick: 11,
            };
            let raft = QuorumNode::open(&quorum, MemDisk::default(), &[])
                .map_err(|e| format!("raft open: {e}"))?;
            nodes.push(Node {
                live: Some(Live::new(&dir)),
                dir,
                quorum,
                raft: Some(raft),
                down: None,
                image: MetadataImage::default(),
                applied: 0,
                starts: 1,
                ctl: Ctl::default(),
                next_heartbeat: 0,
                fetch_out: None,
                fetch_not_before: 0,
            });
        }
        Ok(Sim {
            rng,
            config,
            fsync,
            nodes,
            net: Vec::new(),
            cut_off: BTreeMap::new(),
            step: 0,
            faults: true,
            producing: true,
            chosen: BTreeMap::new(),
            epoch_leaders: BTreeMap::new(),
            led_in: BTreeMap::new(),
            image_leaders: BTreeMap::new(),
            hw_seen: BTreeMap::new(),
            pending: Vec::new(),
            acked: Vec::new(),
            acked_by: BTreeMap::new(),
            producer: None,
            next_producer: 1,
            next_fetch: 1,
            acked_after_heal: 0,
            stats: Stats::default(),
        })
    }

    fn reachable(&self, from: usize, to: usize) -> bool {
        let cut = |i: usize| self.cut_off.get(&i).is_some_and(|&u| u > self.step);
        from == to || (!cut(from) && !cut(to))
    }

    /// Puts `msg` on the network (a node's message to itself never
    /// crosses it, and is never lost).
    fn send(&mut self, from: usize, to: usize, msg: Msg) {
        if from == to {
            self.net.push((self.step + 1, from, to, msg));
            return;
        }
        if self.faults && self.rng.chance(3) {
            return; // dropped
        }
        if !self.reachable(from, to) {
            return;
        }
        let delay = if self.faults {
            1 + self.rng.below(5)
        } else {
            1
        };
        if self.faults && self.rng.chance(1) {
            self.net
                .push((self.step + delay + 3, from, to, msg.clone())); // duplicated
        }
        self.net.push((self.step + delay, from, to, msg));
    }

    async fn run_step(&mut self) -> Result<(), String> {
        self.step += 1;
        crate::clock::advance(Duration::from_millis(STEP_MS));
        if self.faults {
            self.inject_faults().await?;
        }
        for i in 0..NODES {
            if self.nodes[i]
                .down
                .as_ref()
                .is_some_and(|(_, until)| *until <= self.step)
            {
                self.restart(i)?;
            }
        }
        // Ticks, staggered per node by the seed.
        for i in 0..NODES {
            if self.rng.chance(50) {
                if let Some(r) = self.nodes[i].raft.as_mut() {
                    r.tick();
                }
            }
        }
        // Deliveries due now, in a shuffled order.
        let (mut due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.net)
            .into_iter()
            .partition(|m| m.0 <= self.step);
        self.net = later;
        for k in (1..due.len()).rev() {
            let j = self.rng.below(k as u64 + 1) as usize;
            due.swap(k, j);
        }
        for (_, from, to, msg) in due {
            if self.nodes[to].raft.is_some() && self.reachable(from, to) {
                self.deliver(from, to, msg).await?;
            }
        }
        for i in 0..NODES {
            self.advance_raft(i).await?;
        }
        for i in 0..NODES {
            self.control(i)?;
        }
        for i in 0..NODES {
            self.duties(i);
        }
        if self.producing && self.rng.chance(40) {
            self.produce()?;
        }
        // The produce waits and the logs' writers run.
        for _ in 0..4 {
            futures_lite::future::yield_now().await;
        }
        self.resolve_acks();
        self.check_step().await
    }

    async fn inject_faults(&mut self) -> Result<(), String> {
        if self.rng.below(1000) < 3 {
            let i = self.rng.below(NODES as u64) as usize;
            if self.nodes[i].raft.is_some() {
                let power = self.fsync && self.rng.chance(50);
                self.crash(i, power).await?;
            }
        }
        if self.rng.below(1000) < 4 {
            let i = self.rng.below(NODES as u64) as usize;
            let until = self.step + 20 + self.rng.below(200);
            self.cut_off.insert(i, until);
            self.stats.cuts += 1;
        }
        Ok(())
    }

    /// Kills node `i` (kill -9), or cuts its power (`power`).
    async fn crash(&mut self, i: usize, power: bool) -> Result<(), String> {
        // Its produce requests die with it (their clients see no answer).
        self.pending.retain(|p| p.node != i);
        let node = &mut self.nodes[i];
        let Some(raft) = node.raft.take() else {
            return Ok(());
        };
        if let Some(live) = node.live.take() {
            if let Some(p) = &live.p {
                p.log.simulate_kill().await;
            }
        }
        let disk = raft.disk();
        let keep = if power {
            self.rng.below(disk.pending.len() as u64 + 1) as usize
        } else {
            usize::MAX
        };
        let bytes = disk.after_crash(keep);
        drop(raft);
        // A killed node's page cache is taken as written back (as
        // `partition::simulation` settles after a crash: recovery's own
        // truncations do not go through the disk's seam).
        let mut d = simdisk::take_simulated().ok_or("no simulated disk")?;
        let r = if power {
            d.power_loss_under(&node.dir)
        } else {
            d.settle_under(&node.dir)
        };
        simdisk::simulate(d);
        r.map_err(|e| format!("power loss or kill of node {}: {e}", i + 1))?;
        if power {
            self.stats.power_losses += 1;
        } else {
            self.stats.kills += 1;
        }
        let until = self.step + 20 + self.rng.below(130);
        node.down = Some((bytes, until));
        node.image = MetadataImage::default();
        node.applied = 0;
        node.ctl = Ctl::default();
        node.fetch_out = None;
        Ok(())
    }

    fn restart(&mut self, i: usize) -> Result<(), String> {
        let node = &mut self.nodes[i];
        let Some((bytes, _)) = node.down.take() else {
            return Ok(());
        };
        let disk = MemDisk {
            synced: bytes.clone(),
            pending: Vec::new(),
            syncs: 0,
        };
        let raft = QuorumNode::open(&node.quorum, disk, &bytes)
            .map_err(|e| format!("node {} reopens its raft log: {e}", i + 1))?;
        node.raft = Some(raft);
        node.starts += 1;
        node.live = Some(Live::new(&node.dir));
        node.next_heartbeat = self.step;
        node.fetch_not_before = 0;
        Ok(())
    }

    async fn deliver(&mut self, from: usize, to: usize, msg: Msg) -> Result<(), String> {
        match msg {
            Msg::Raft(bytes) => {
                let m = codec::decode_message(&bytes).map_err(|e| format!("raft codec: {e:?}"))?;
                if let Some(r) = self.nodes[to].raft.as_mut() {
                    // A message the node refuses is dropped, as the
                    // controller listener drops it.
                    let _ = r.step(m);
                }
            }
            Msg::Heartbeat(reg, sent) => self.on_heartbeat(to, reg, sent)?,
            Msg::HeartbeatAnswer {
                incarnation,
                sent,
                index,
            } => {
                let node = &mut self.nodes[to];
                let own = node.incarnation(to) == incarnation;
                if let (Some(live), true) = (node.live.as_mut(), own) {
                    if live.answered.is_none_or(|(s, _)| s < sent) {
                        live.answered = Some((sent, index));
                    }
                }
            }
            Msg::Alter(p) => self.on_alter(to, from, p)?,
            Msg::AlterAnswer(p, fate) => {
                if let Some(live) = self.nodes[to].live.as_mut() {
                    if fate != AlterFate::Unknown
                        && live.alter_out.as_ref().is_some_and(|(out, _)| *out == p)
                    {
                        live.alter_out = None;
                    }
                    if fate == AlterFate::Refused {
                        live.leading.proposal_failed(&p);
                    }
                }
            }
            Msg::Fetch(req) => self.on_fetch(to, from, req).await?,
            Msg::FetchAnswer(a) => self.on_fetch_answer(to, from, a).await?,
        }
        Ok(())
    }

    /// Node `i`'s Raft ready loop: messages out, committed records applied
    /// to its image, then its replica's role follows the image.
    async fn advance_raft(&mut self, i: usize) -> Result<(), String> {
        let Some(r) = self.nodes[i].raft.as_mut() else {
            return Ok(());
        };
        let progress = r.advance().map_err(|e| format!("raft advance: {e}"))?;
        let (leading, term) = (r.is_leader(), r.term());
        for m in progress.messages {
            let to = (m.to - 1) as usize;
            let bytes = codec::encode_message(&m).to_vec();
            self.send(i, to, Msg::Raft(bytes));
        }
        let changed = !progress.committed.is_empty();
        let mut answers = Vec::new();
        for context in progress.confirmed {
            if let Some(a) = self.nodes[i].ctl.confirming.remove(&context) {
                answers.push(a);
            }
        }
        if !leading {
            self.nodes[i].ctl.confirming.clear();
        }
        for c in progress.committed {
            let data = c.data.to_vec();
            let fresh = !self.chosen.contains_key(&c.index);
            let chosen = self.chosen.entry(c.index).or_insert_with(|| data.clone());
            if *chosen != data {
                return Err(format!(
                    "raft index {} applied as two different records (node {})",
                    c.index,
                    i + 1
                ));
            }
            let record = decode_record(&data)?;
            let node = &mut self.nodes[i];
            let next = node.image.apply(&record);
            check_partition_change(
                node.state().as_ref(),
                next.topic(TOPIC).and_then(|t| t.replica_state(0)),
                &mut self.image_leaders,
            )
            .map_err(|e| format!("node {} at raft index {}: {e}", i + 1, c.index))?;
            if fresh {
                match &record {
                    MetadataRecord::FenceBroker { .. } => self.stats.fenced += 1,
                    MetadataRecord::PartitionChange { .. } => self.stats.isr_changes += 1,
                    _ => {}
                }
            }
            node.image = next;
            node.applied = c.index;
        }
        // The controller's proposal: applied, or lost with its lead.
        let node = &mut self.nodes[i];
        let done = match &node.ctl.busy {
            // Lost with its lead: the entry may still commit under the
            // next leader (the real controller answers NOT_CONTROLLER).
            Some(b) if !leading || b.term != term => Some((b.answer.clone(), AlterFate::Unknown)),
            Some(b) if node.applied >= b.index => {
                answers.extend(b.heartbeat);
                Some((b.answer.clone(), AlterFate::Changed))
            }
            _ => None,
        };
        if let Some((answer, fate)) = done {
            node.ctl.busy = None;
            if let Some((to, p)) = answer {
                self.send(i, to, Msg::AlterAnswer(p, fate));
            }
        }
        let index = self.nodes[i].applied;
        for (to, incarnation, sent) in answers {
            let answer = Msg::HeartbeatAnswer {
                incarnation,
                sent,
                index,
            };
            self.send(i, to, answer);
        }
        if changed {
            self.apply_roles(i).await?;
        }
        Ok(())
    }

    /// Node `i`'s replica takes the role its image gives it
    /// (`ShardCtx::apply_replica_roles`).
    async fn apply_roles(&mut self, i: usize) -> Result<(), String> {
        let fsync = self.fsync;
        let registered = self.nodes[i].registered(i);
        let node = &mut self.nodes[i];
        let Some(live) = node.live.as_mut() else {
            return Ok(());
        };
        let Some(topic) = node.image.topic(TOPIC).cloned() else {
            return Ok(());
        };
        let Some(state) = topic.replica_state(0).cloned() else {
            return Ok(());
        };
        let me = broker(i);
        if live.p.is_none() {
            let log_config = LogConfig {
                segment_bytes: 4096,
                preallocate_bytes: 64 * 1024,
                fsync_acks: fsync,
                leader_epoch: super::replica_log_epoch(&state, me),
                ..LogConfig::default()
            };
            let log = live
                .mgr
                .open(&tp(), log_config)
                .await
                .map_err(|e| format!("node {} opens its log: {e}", i + 1))?;
            let tc = TopicConfig::resolve(&topic.configs, &self.config);
            let p = Partition::open(tp(), topic.id, log, tc, 1_000)
                .await
                .map_err(|e| format!("node {} recovers its partition: {e}", i + 1))?;
            // No HW checkpoint is written here: every start begins at 0.
            let _ = p.log.start_replicated_at(Offset(0));
            live.p = Some(p);
        }
        let p = live.p.clone().ok_or("opened above")?;
        let mut became = None;
        if state.leader == me {
            live.followers.remove(&tp());
            if registered {
                let epoch = state.leader_epoch;
                if p.log.latest_epoch().is_none_or(|l| l < epoch) {
                    p.log
                        .become_leader(epoch)
                        .map_err(|e| format!("node {} becomes leader: {e}", i + 1))?;
                }
                live.leading.refresh(&p, &state, me);
                if live.leads != Some(epoch) {
                    live.leads = Some(epoch);
                    became = Some(epoch);
                }
            } else {
                live.leads = None;
            }
        } else {
            live.leads = None;
            if state.leader >= 0 && index_of(state.leader) != Some(i) {
                let same = live.followers.get(&tp()).is_some_and(|f| {
                    f.leader == state.leader && f.leader_epoch == state.leader_epoch
                });
                if !same {
                    live.followers.insert(
                        tp(),
                        Follower::new(p.clone(), topic.id, state.leader, state.leader_epoch),
                    );
                    node.fetch_out = None;
                }
            } else {
                live.followers.remove(&tp());
            }
        }
        live.leading.retain(|_| state.leader == me);
        if let Some(epoch) = became {
            self.new_leader(i, epoch, &p).await?;
        }
        Ok(())
    }

    /// Node `i` just became leader in `epoch`: it is the only one in that
    /// epoch, holds every acknowledged batch, and its producer state is
    /// what its log implies.
    async fn new_leader(&mut self, i: usize, epoch: i32, p: &Partition) -> Result<(), String> {
        self.stats.leaderships += 1;
        let first = *self.epoch_leaders.entry(epoch).or_insert(i);
        if first != i {
            return Err(format!(
                "two leaders in leader epoch {epoch}: nodes {} and {}",
                first + 1,
                i + 1
            ));
        }
        let before = self.led_in.insert(i, epoch);
        if before.is_some_and(|b| b > epoch) {
            return Err(format!(
                "node {} became leader in epoch {epoch} after leading in epoch {:?}",
                i + 1,
                before
            ));
        }
        // The producer state holds the batches appended so far, the scan
        // reads what is written: the writes in flight land first.
        let end = p.log.log_end_offset().0;
        if end > p.log.log_start_offset().0 {
            p.log
                .wait_written(Offset(end - 1))
                .await
                .map_err(|e| format!("node {}, new leader: {e}", i + 1))?;
        }
        let log = scan(p).await?;
        for a in &self.acked {
            if !log.contains(a) {
                return Err(format!(
                    "node {} became leader in epoch {epoch} without the acknowledged batch {a:?} (acknowledged by node, in epoch, appended and answered at steps: {:?}; log end {}, its batch there: {:?})",
                    i + 1,
                    self.acked_by.get(&a.base),
                    p.log.log_end_offset().0,
                    log.iter().find(|b| b.base <= a.base && a.base <= b.last)
                ));
            }
        }
        let mut implied: BTreeMap<i64, (i16, i32)> = BTreeMap::new();
        for b in &log {
            if b.producer >= 0 && b.seq >= 0 {
                implied.insert(b.producer, (b.epoch, b.seq + (b.last - b.base) as i32));
            }
        }
        let table: BTreeMap<i64, (i16, i32)> = p
            .producers()
            .entries()
            .filter_map(|(&pid, e)| e.last_seq().map(|s| (pid, (e.epoch, s))))
            .collect();
        if table != implied {
            return Err(format!(
                "node {}, new leader in epoch {epoch}: producer state {table:?}, its log implies {implied:?}",
                i + 1
            ));
        }
        Ok(())
    }

    /// The controller's work on node `i` while it leads the quorum.
    fn control(&mut self, i: usize) -> Result<(), String> {
        let step = self.step;
        let node = &mut self.nodes[i];
        let Some(r) = node.raft.as_ref() else {
            return Ok(());
        };
        if !r.is_leader() || node.ctl.busy.is_some() {
            return Ok(());
        }
        let term = r.term();
        if node.ctl.term != term {
            // A new leader's first proposal; every node's clock starts now.
            node.ctl.term = term;
            node.ctl.heartbeats = node.image.brokers.keys().map(|&n| (n, step)).collect();
            node.ctl.confirming.clear();
            return self.propose(i, vec![MetadataRecord::TermStart { term }], None);
        }
        if node.image.topic(TOPIC).is_none() {
            if node.image.brokers.len() == NODES {
                let create = MetadataRecord::CreateTopic {
                    name: TOPIC.into(),
                    id: TOPIC_ID,
                    shards: vec![0],
                    configs: [("min.insync.replicas".to_string(), "2".to_string())].into(),
                    node: None,
                    replicated: vec![PartitionState::new((0..NODES).map(broker).collect())],
                };
                return self.propose(i, vec![create], None);
            }
            return Ok(());
        }
        let silent: Vec<i32> = node
            .image
            .brokers
            .iter()
            .filter(|(_, b)| !b.fenced)
            .map(|(&n, _)| n)
            .filter(|n| {
                node.ctl
                    .heartbeats
                    .get(n)
                    .is_some_and(|&t| step - t >= SESSION_STEPS)
            })
            .collect();
        let records = fence_records(&node.image, &silent, &self.config);
        if !records.is_empty() {
            return self.propose(i, records, None);
        }
        Ok(())
    }

    /// Proposes `records` on node `i`'s Raft member, which leads; the
    /// controller is busy until they are applied or its lead is lost.
    fn propose(
        &mut self,
        i: usize,
        records: Vec<MetadataRecord>,
        answer: Option<(usize, IsrProposal)>,
    ) -> Result<(), String> {
        self.propose_answering(i, records, answer, None)
    }

    /// [`Self::propose`], answering a heartbeat too once applied.
    fn propose_answering(
        &mut self,
        i: usize,
        records: Vec<MetadataRecord>,
        answer: Option<(usize, IsrProposal)>,
        heartbeat: Option<(usize, [u8; 16], Instant)>,
    ) -> Result<(), String> {
        let node = &mut self.nodes[i];
        let r = node
            .raft
            .as_mut()
            .ok_or("proposing on a node that is down")?;
        for rec in &records {
            let data = encode_record(rec).map_err(|e| e.to_string())?;
            if r.propose(data).is_err() {
                if let Some((to, p)) = answer {
                    self.send(i, to, Msg::AlterAnswer(p, AlterFate::Unknown));
                }
                return Ok(());
            }
        }
        node.ctl.busy = Some(Busy {
            term: r.term(),
            index: r.last_index(),
            answer,
            heartbeat,
        });
        Ok(())
    }

    fn on_heartbeat(
        &mut self,
        i: usize,
        reg: BrokerRegistration,
        sent: Instant,
    ) -> Result<(), String> {
        let step = self.step;
        let node = &mut self.nodes[i];
        if !node.raft.as_ref().is_some_and(|r| r.is_leader()) || node.ctl.term == 0 {
            return Ok(());
        }
        node.ctl.heartbeats.insert(reg.node, step);
        if node.ctl.busy.is_some() {
            return Ok(());
        }
        let from = (reg.node - 1) as usize;
        let incarnation = reg.incarnation;
        match heartbeat_records(&node.image, reg, &self.config) {
            Some(records) => {
                self.propose_answering(i, records, None, Some((from, incarnation, sent)))
            }
            None => {
                // Answered once a majority confirms the lead
                // (`Controller::confirm_leadership`).
                node.ctl.next_confirmation += 1;
                let context = node.ctl.next_confirmation;
                node.ctl
                    .confirming
                    .insert(context, (from, incarnation, sent));
                if let Some(r) = node.raft.as_mut() {
                    r.confirm_leadership(context);
                }
                Ok(())
            }
        }
    }

    fn on_alter(&mut self, i: usize, from: usize, p: IsrProposal) -> Result<(), String> {
        let node = &self.nodes[i];
        let ready = node.raft.as_ref().is_some_and(|r| r.is_leader())
            && node.ctl.busy.is_none()
            && node.ctl.term != 0;
        let planned = ready.then(|| {
            let change = AlterPartition {
                broker: broker(from),
                topic_id: p.topic_id,
                partition: p.tp.partition.0,
                leader_epoch: p.leader_epoch,
                partition_epoch: p.partition_epoch,
                isr: p.isr.clone(),
                broker_epochs: p.broker_epochs.clone(),
            };
            plan_alter_partition(&node.image, &self.config, &change)
        });
        let fate = match planned {
            Some(Ok(Some((record, _)))) => return self.propose(i, vec![record], Some((from, p))),
            Some(Ok(None)) => AlterFate::Refused,
            Some(Err(e)) => alter_partition_fate(&Err(e), p.partition_epoch),
            // Not the ready leader: NOT_CONTROLLER, or the real one queues.
            None => AlterFate::Unknown,
        };
        self.send(i, from, Msg::AlterAnswer(p, fate));
        Ok(())
    }

    /// A leader's answer to a follower's fetch (the Fetch handler's
    /// `read_all` for a replica).
    async fn on_fetch(&mut self, i: usize, from: usize, req: FetchReq) -> Result<(), String> {
        let me = broker(i);
        let node = &self.nodes[i];
        let Some(live) = node.live.as_ref() else {
            return Ok(()); // down: no answer
        };
        let led = match (&live.p, node.state()) {
            (Some(p), Some(s)) if s.leader == me && node.acts(i) => {
                Some((p.clone(), s, live.leading.clone()))
            }
            _ => None,
        };
        let Some((p, state, leading)) = led else {
            let a = FetchAnswer::error(req.id, ResponseError::NotLeaderOrFollower);
            self.send(i, from, Msg::FetchAnswer(a));
            return Ok(());
        };
        let log = &p.log;
        if let Some(e) = check_leader_epoch(req.current_leader_epoch, log.leader_epoch()) {
            self.send(i, from, Msg::FetchAnswer(FetchAnswer::error(req.id, e)));
            return Ok(());
        }
        let mut a = FetchAnswer {
            id: req.id,
            error: None,
            diverging: None,
            records: Bytes::new(),
            high_watermark: log.high_watermark().0,
            log_start: log.log_start_offset().0,
            log_end: log.log_end_offset().0,
        };
        match diverging(req.last_fetched_epoch, req.fetch_offset, log) {
            Ok(None) => {}
            Ok(Some(d)) => {
                a.diverging = Some(d);
                self.send(i, from, Msg::FetchAnswer(a));
                return Ok(());
            }
            Err(e) => {
                a.error = Some(e);
                self.send(i, from, Msg::FetchAnswer(a));
                return Ok(());
            }
        }
        if req.fetch_offset > log.log_end_offset().0 {
            a.error = Some(ResponseError::OffsetOutOfRange);
            self.send(i, from, Msg::FetchAnswer(a));
            return Ok(());
        }
        let fetch = FollowerFetch {
            replica: req.replica,
            broker_epoch: req.broker_epoch,
            fetch_offset: req.fetch_offset,
            log_start: req.log_start,
        };
        let recorded = leading.record_fetch(&p, &state, me, fetch, |b| {
            self.nodes[i].image.live_broker_epoch(b)
        });
        match recorded {
            Ok(Some(expand)) => self.send_alter(i, expand),
            Ok(None) => {}
            Err(_) => {
                let e = if req.current_leader_epoch >= 0 {
                    ResponseError::UnknownLeaderEpoch
                } else {
                    ResponseError::NotLeaderOrFollower
                };
                self.send(i, from, Msg::FetchAnswer(FetchAnswer::error(req.id, e)));
                return Ok(());
            }
        }
        a.high_watermark = log.high_watermark().0;
        let upper = log.written_offset();
        if req.fetch_offset < upper.0 {
            let r = log
                .read(Offset(req.fetch_offset), 32 << 10, upper)
                .await
                .map_err(|e| format!("node {} reads at {}: {e}", i + 1, req.fetch_offset))?;
            a.records = Bytes::from(chunk_bytes(&r)?);
        }
        self.send(i, from, Msg::FetchAnswer(a));
        Ok(())
    }

    /// A follower handles its leader's answer (the fetcher's
    /// `handle_partition` over `FollowerView`).
    async fn on_fetch_answer(
        &mut self,
        i: usize,
        from: usize,
        a: FetchAnswer,
    ) -> Result<(), String> {
        let node = &mut self.nodes[i];
        if node.fetch_out.map(|(id, _)| id) != Some(a.id) {
            return Ok(()); // not the fetch out (an old or duplicated answer)
        }
        node.fetch_out = None;
        let Some(live) = node.live.as_ref() else {
            return Ok(());
        };
        let Some(f) = live.followers.get(&tp()) else {
            return Ok(());
        };
        if index_of(f.leader) != Some(from) {
            return Ok(());
        }
        let view = live.followers.view(f.leader);
        let Some(pos) = view.position(&tp()) else {
            return Ok(());
        };
        let fail = |what: &str, e: crate::replication::fetcher::FollowerLogError| {
            format!("node {} {what}: {e}", i + 1)
        };
        if let Some(e) = a.error {
            if matches!(e, ResponseError::OffsetOutOfRange) && a.log_end >= 0 {
                // The real fetcher asks ListOffsets for these two.
                if pos.log_end > a.log_end {
                    view.truncate_to(&tp(), a.log_end)
                        .await
                        .map_err(|e| fail("truncates to the leader's end", e))?;
                    self.stats.truncations += 1;
                } else if pos.log_end < a.log_start {
                    view.restart_at(&tp(), a.log_start)
                        .await
                        .map_err(|e| fail("restarts at the leader's start", e))?;
                }
            } else {
                self.nodes[i].fetch_not_before = self.step + FETCH_BACKOFF_STEPS;
            }
            return Ok(());
        }
        if let Some((epoch, end)) = a.diverging {
            let own = view.end_offset_for_epoch(&tp(), epoch);
            let to = truncation_offset(own, epoch, end, pos.log_end);
            view.truncate_to(&tp(), to)
                .await
                .map_err(|e| fail("truncates where it diverged", e))?;
            self.stats.truncations += 1;
            return Ok(());
        }
        if !a.records.is_empty() {
            let (len, last, _, problem) = whole_batches(&a.records, pos.log_end);
            if let Some(problem) = problem {
                return Err(format!(
                    "node {}: a bad batch from the leader: {problem}",
                    i + 1
                ));
            }
            if len > 0 {
                view.append(&tp(), a.records.slice(..len), last)
                    .await
                    .map_err(|e| fail("appends the leader's batches", e))?;
            }
        }
        // The leader's log start too (DeleteRecords; this simulation makes
        // none, so it stays at 0).
        view.leader_offsets(&tp(), a.high_watermark, a.log_start)
            .await
            .map_err(|e| fail("takes the leader's offsets", e))?;
        Ok(())
    }

    /// Node `i` sends an AlterPartition to the quorum's leader it knows.
    fn send_alter(&mut self, i: usize, p: IsrProposal) {
        let leader = self.nodes[i].raft.as_ref().map_or(0, |r| r.leader_id());
        if let Some(live) = self.nodes[i].live.as_mut() {
            live.alter_out = Some((p.clone(), self.step));
        }
        // No leader known: asked again after the timeout, as the real
        // request is retried while it stays in flight.
        if leader != 0 {
            self.send(i, (leader - 1) as usize, Msg::Alter(p));
        }
    }

    /// Node `i`'s periodic work: heartbeats, its fetch, the ISR check.
    fn duties(&mut self, i: usize) {
        let step = self.step;
        let node = &mut self.nodes[i];
        let Some(r) = node.raft.as_ref() else {
            return;
        };
        let leader = r.leader_id();
        if step >= node.next_heartbeat {
            node.next_heartbeat = step + HEARTBEAT_STEPS;
            if leader != 0 {
                let reg = node.registration(i);
                let sent = crate::clock::monotonic();
                self.send(i, (leader - 1) as usize, Msg::Heartbeat(reg, sent));
            }
        }
        // An answered heartbeat renews the lease once the node applied
        // as far as the answer names (`Controller::forward`).
        let node = &mut self.nodes[i];
        let (applied, version) = (node.applied, node.image.version);
        if let Some(live) = node.live.as_mut() {
            if let Some((sent, _)) = live.answered.filter(|(_, index)| applied >= *index) {
                live.lease.renew(sent, SESSION, version);
                live.answered = None;
            }
        }
        let node = &mut self.nodes[i];
        let Some(live) = node.live.as_mut() else {
            return;
        };
        let mut again = None;
        if let Some((p, sent)) = &live.alter_out {
            if step >= sent + ALTER_TIMEOUT_STEPS {
                // Unanswered: it may still commit, so it stays in flight
                // and is asked again while it is the proposal
                // (`ShardCtx::alter_isr`).
                if live.leading.still_proposed(p) {
                    again = Some(p.clone());
                }
                live.alter_out = None;
            }
        }
        if let Some(p) = again {
            self.send_alter(i, p);
        }
        let own_epoch = self.nodes[i].broker_epoch(i);
        let node = &mut self.nodes[i];
        let Some(live) = node.live.as_mut() else {
            return;
        };
        let timed_out = node
            .fetch_out
            .is_none_or(|(_, sent)| step >= sent + FETCH_TIMEOUT_STEPS);
        let mut fetch = None;
        if timed_out && step >= node.fetch_not_before {
            if let Some(f) = live.followers.get(&tp()) {
                let view = live.followers.view(f.leader);
                if let (Some(pos), Some(to)) = (view.position(&tp()), index_of(f.leader)) {
                    fetch = Some((pos, to));
                }
            }
        }
        let proposals = if step % SHRINK_EVERY == 0 {
            live.leading.shrink_proposals(own_epoch)
        } else {
            Vec::new()
        };
        if let Some((pos, to)) = fetch {
            let id = self.next_fetch;
            self.next_fetch += 1;
            self.nodes[i].fetch_out = Some((id, step));
            let req = FetchReq {
                id,
                replica: broker(i),
                broker_epoch: self.nodes[i].broker_epoch(i),
                current_leader_epoch: pos.current_leader_epoch,
                fetch_offset: pos.log_end,
                last_fetched_epoch: pos.last_epoch,
                log_start: pos.log_start,
            };
            self.send(i, to, Msg::Fetch(req));
        }
        for p in proposals {
            self.send_alter(i, p);
        }
    }

    /// An idempotent producer's acks=all batch to a node that leads (a
    /// stale leader that does not know it was replaced included).
    fn produce(&mut self) -> Result<(), String> {
        let leaders: Vec<usize> = (0..NODES)
            .filter(|&i| {
                self.nodes[i]
                    .live
                    .as_ref()
                    .is_some_and(|l| l.leads.is_some() && l.p.is_some())
            })
            .collect();
        if leaders.is_empty() {
            return Ok(());
        }
        let i = leaders[self.rng.below(leaders.len() as u64) as usize];
        let me = broker(i);
        let (pid, seq) = match self.producer {
            Some(p) => p,
            None => {
                self.next_producer += 1;
                (self.next_producer, 0)
            }
        };
        let records = 1 + self.rng.below(3) as usize;
        let node = &self.nodes[i];
        let (Some(live), Some(state)) = (node.live.as_ref(), node.state()) else {
            return Ok(());
        };
        let p = live.p.clone().ok_or("leads without a partition")?;
        if !node.acts(i) {
            self.stats.refused += 1; // NOT_LEADER_OR_FOLLOWER: no lease
            return Ok(());
        }
        if !live.leading.enough_replicas(&p, &state, me) {
            self.stats.refused += 1; // NOT_ENOUGH_REPLICAS
            return Ok(());
        }
        let b = batch(pid, 0, seq, false, records);
        let h = BatchHeader::parse(&b).map_err(|e| e.to_string())?;
        let cap = b.capacity();
        let info = match p.append_data(&h, b, cap, None, 1 << 20) {
            Ok(DataAppend::Appended { info, .. }) => info,
            _ => {
                // Refused: this producer's client gives up; a new one
                // takes over.
                self.stats.refused += 1;
                self.producer = None;
                return Ok(());
            }
        };
        self.stats.produced += 1;
        self.producer = Some((pid, seq + records as i32));
        let last = info.last_offset;
        let batch = BatchId {
            base: info.base_offset.0,
            last: last.0,
            crc: h.crc,
            producer: pid,
            epoch: 0,
            seq,
        };
        // The produce path's acks=all wait (`handlers::produce`,
        // `ShardCtx::wait_acks_all`).
        let (log, leading, fsync) = (p.log.clone(), live.leading.clone(), self.fsync);
        let epoch = state.leader_epoch;
        let outcome = Rc::new(Cell::new(None));
        let out = outcome.clone();
        let task = glommio::spawn_local(async move {
            let written = log.wait_acked(last, fsync).await;
            let acked = match written {
                Ok(()) => {
                    leading.advance(&tp());
                    log.wait_for_hw_above(last).await;
                    // In the epoch it was appended in, as the produce
                    // path asks (`Leading::acks_all_in`).
                    !matches!(
                        leading.acks_all_in(&tp(), &log, epoch, last.0),
                        None | Some(AcksAll::DoneUnderMinIsr)
                    )
                }
                Err(_) => false,
            };
            out.set(Some(acked));
        });
        self.pending.push(Pending {
            node: i,
            start: self.nodes[i].starts,
            batch,
            sent: self.step,
            outcome,
            _task: task,
        });
        Ok(())
    }

    /// Produce answers that came, and those that timed out.
    fn resolve_acks(&mut self) {
        let step = self.step;
        let mut acked = Vec::new();
        let mut not = 0;
        let nodes = &self.nodes;
        let acked_by = &mut self.acked_by;
        self.pending.retain(|p| match p.outcome.get() {
            Some(true) => {
                acked.push(p.batch);
                let leads = nodes[p.node].live.as_ref().and_then(|l| l.leads);
                acked_by.insert(p.batch.base, (p.node + 1, leads, p.sent, step));
                false
            }
            Some(false) => {
                not += 1;
                false
            }
            None if step >= p.sent + ACK_TIMEOUT_STEPS => {
                not += 1;
                false
            }
            None => true,
        });
        self.stats.not_acknowledged += not;
        self.stats.acknowledged += acked.len() as u64;
        if !self.faults {
            self.acked_after_heal += acked.len() as u64;
        }
        self.acked.extend(acked);
        // Pending ones whose node restarted since are lost with it.
        let nodes = &self.nodes;
        self.pending.retain(|p| nodes[p.node].starts == p.start);
    }

    /// The invariants of every step (module doc).
    async fn check_step(&mut self) -> Result<(), String> {
        // At most one node acts as the partition's leader at a time
        // (`metadata::lease`): one cut off from the quorum stops before
        // the quorum can make another node leader.
        let acting: Vec<(usize, i32)> = (0..NODES)
            .filter_map(|i| {
                let node = &self.nodes[i];
                let s = node.state()?;
                (s.leader == broker(i) && node.acts(i)).then_some((i + 1, s.leader_epoch))
            })
            .collect();
        if acting.len() > 1 {
            return Err(format!(
                "two nodes act as the partition's leader at once (node, leader epoch): {acting:?}"
            ));
        }
        let max_acked = self.acked.iter().map(|a| a.last).max();
        for i in 0..NODES {
            let node = &self.nodes[i];
            let Some(live) = node.live.as_ref() else {
                continue;
            };
            let (Some(epoch), Some(p)) = (live.leads, live.p.as_ref()) else {
                continue;
            };
            let hw = p.log.high_watermark().0;
            let seen = self.hw_seen.entry((i, node.starts, epoch)).or_insert(hw);
            if hw < *seen {
                return Err(format!(
                    "the HW of node {}, leader in epoch {epoch}, moved back from {} to {hw}",
                    i + 1,
                    *seen
                ));
            }
            *seen = hw;
            // The newest leader holds every acknowledged batch (a stale
            // one, cut off, may not yet know it was replaced).
            let newest = self.epoch_leaders.keys().next_back() == Some(&epoch);
            if let (Some(m), true) = (max_acked, newest) {
                if p.log.log_end_offset().0 <= m {
                    return Err(format!(
                        "node {} leads in epoch {epoch} with its log ending at {}, below the acknowledged offset {m}",
                        i + 1,
                        p.log.log_end_offset().0
                    ));
                }
            }
        }
        if self.step % COMPARE_EVERY == 0 {
            self.compare_replicas().await?;
        }
        Ok(())
    }

    /// Live replicas hold the same batches below the lower of their HWs.
    async fn compare_replicas(&self) -> Result<(), String> {
        let mut logs = Vec::new();
        for (i, node) in self.nodes.iter().enumerate() {
            if let Some(p) = node.live.as_ref().and_then(|l| l.p.as_ref()) {
                logs.push((i, p.log.high_watermark().0, scan(p).await?));
            }
        }
        for (k, (a, hw_a, log_a)) in logs.iter().enumerate() {
            for (b, hw_b, log_b) in &logs[k + 1..] {
                let hw = (*hw_a).min(*hw_b);
                let below = |log: &Vec<BatchId>| -> Vec<BatchId> {
                    log.iter().copied().filter(|x| x.last < hw).collect()
                };
                let (x, y) = (below(log_a), below(log_b));
                if x != y {
                    let at = x.iter().zip(&y).position(|(p, q)| p != q);
                    return Err(format!(
                        "nodes {} and {} differ below their HWs ({hw_a}, {hw_b}): {} and {} batches, first difference {:?}",
                        a + 1,
                        b + 1,
                        x.len(),
                        y.len(),
                        at.map(|n| (x[n], y[n]))
                    ));
                }
            }
        }
        Ok(())
    }

    /// The end: the faults stop, every node runs and reaches every other;
    /// producers go on a while, then stop; one leader, every replica equal
    /// to it, every acknowledged batch in it.
    async fn heal_and_check(&mut self) -> Result<(), String> {
        self.faults = false;
        self.cut_off.clear();
        for i in 0..NODES {
            self.restart(i)?;
        }
        for _ in 0..SETTLE_STEPS {
            self.run_step().await?;
        }
        self.producing = false;
        for _ in 0..QUIET_STEPS {
            self.run_step().await?;
        }
        let leaders: Vec<usize> = (0..NODES)
            .filter(|&i| {
                self.nodes[i]
                    .live
                    .as_ref()
                    .is_some_and(|l| l.leads.is_some())
            })
            .collect();
        if leaders.len() != 1 {
            return Err(format!(
                "after healing, nodes {:?} lead (images: {:?})",
                leaders.iter().map(|i| i + 1).collect::<Vec<_>>(),
                self.nodes.iter().map(|n| n.state()).collect::<Vec<_>>()
            ));
        }
        let leader = leaders[0];
        let lp = self.nodes[leader]
            .live
            .as_ref()
            .and_then(|l| l.p.clone())
            .ok_or("the leader has no partition")?;
        let want = scan(&lp).await?;
        for a in &self.acked {
            if !want.contains(a) {
                return Err(format!("the final leader lacks acknowledged batch {a:?}"));
            }
        }
        for (i, node) in self.nodes.iter().enumerate() {
            let p = node
                .live
                .as_ref()
                .and_then(|l| l.p.clone())
                .ok_or(format!("node {} has no partition", i + 1))?;
            let got = scan(&p).await?;
            if got != want {
                return Err(format!(
                    "after healing node {} holds {} batches, the leader (node {}) {}",
                    i + 1,
                    got.len(),
                    leader + 1,
                    want.len()
                ));
            }
        }
        if self.acked_after_heal == 0 {
            let view: Vec<String> = self
                .nodes
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    let l = n.live.as_ref();
                    format!(
                        "node {}: raft leader {:?}, registered {}, fenced {:?}, leads {:?}, state {:?}, log end {:?}, HW {:?}",
                        i + 1,
                        n.raft.as_ref().map(|r| r.leader_id()),
                        n.registered(i),
                        n.image.brokers.iter().filter(|(_, b)| b.fenced).map(|(k, _)| *k).collect::<Vec<_>>(),
                        l.and_then(|l| l.leads),
                        n.state(),
                        l.and_then(|l| l.p.as_ref()).map(|p| p.log.log_end_offset().0),
                        l.and_then(|l| l.p.as_ref()).map(|p| p.log.high_watermark().0),
                    )
                })
                .collect();
            return Err(format!(
                "the healed cluster acknowledged nothing ({:?}):\n{}",
                self.stats,
                view.join("\n")
            ));
        }
        Ok(())
    }
}

/// The committed partition state moves from `prev` to `next`: epochs never
/// go back, a new leader comes with a new leader epoch, and no leader
/// epoch names two leaders (`leaders`, across nodes).
fn check_partition_change(
    prev: Option<&PartitionState>,
    next: Option<&PartitionState>,
    leaders: &mut BTreeMap<i32, i32>,
) -> Result<(), String> {
    let Some(next) = next else {
        return Ok(());
    };
    if let Some(prev) = prev {
        if next.leader_epoch < prev.leader_epoch || next.partition_epoch < prev.partition_epoch {
            return Err(format!("epochs went back: {prev:?} → {next:?}"));
        }
        if next.leader != prev.leader && next.leader_epoch == prev.leader_epoch {
            return Err(format!(
                "a new leader in the same epoch: {prev:?} → {next:?}"
            ));
        }
    }
    if next.leader >= 0 {
        let named = *leaders.entry(next.leader_epoch).or_insert(next.leader);
        if named != next.leader {
            return Err(format!(
                "leader epoch {} names leaders {named} and {}",
                next.leader_epoch, next.leader
            ));
        }
    }
    Ok(())
}

/// Every batch of `p`'s log.
async fn scan(p: &Partition) -> Result<Vec<BatchId>, String> {
    let mut out = Vec::new();
    p.log
        .scan(Offset(p.log.log_start_offset().0), &mut |h, _| {
            out.push(BatchId {
                base: h.base_offset,
                last: h.base_offset + h.last_offset_delta as i64,
                crc: h.crc,
                producer: h.producer_id,
                epoch: h.producer_epoch,
                seq: h.base_sequence,
            })
        })
        .await
        .map_err(|e| format!("scan: {e}"))?;
    Ok(out)
}

/// The bytes of a read.
fn chunk_bytes(r: &crate::log::ReadResult) -> Result<Vec<u8>, String> {
    use std::os::unix::fs::FileExt;
    let mut out = Vec::new();
    for c in &r.chunks {
        match c {
            RecordsChunk::Memory(b) => out.extend_from_slice(b),
            RecordsChunk::Loaded(b) => out.extend_from_slice(b),
            RecordsChunk::File(fr) => {
                let path = fr.file.path().ok_or("a segment file without a path")?;
                let mut v = vec![0u8; fr.len];
                std::fs::File::open(&*path)
                    .and_then(|f| f.read_exact_at(&mut v, fr.position))
                    .map_err(|e| format!("segment read: {e}"))?;
                out.extend_from_slice(&v);
            }
        }
    }
    Ok(out)
}

/// Runs one seed; returns what it went through.
fn run_seed(seed: u64, steps: u64) -> Result<String, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let root = dir.path().to_path_buf();
    let result = Arc::new(Mutex::new(Err("the simulation did not end".to_string())));
    let out = result.clone();
    run(root.clone(), move || async move {
        let r = simulate(seed, steps, &root).await;
        let _ = simdisk::take_simulated();
        *out.lock().unwrap_or_else(|e| e.into_inner()) = r;
    });
    let r = result.lock().unwrap_or_else(|e| e.into_inner()).clone();
    r
}

async fn simulate(seed: u64, steps: u64, root: &Path) -> Result<String, String> {
    let mut rng = Rng::new(seed);
    let fsync = rng.chance(50);
    let faults = Faults {
        write_error_per_10k: 0,
        sync_error_per_10k: 0,
        completion_yields_max: rng.below(4) as u32,
    };
    simdisk::simulate(SimDisk::new(seed ^ 0x5EED_5EED, faults));
    crate::clock::simulate(SIM_START_MS);
    let mut sim = Sim::new(rng, fsync, root)?;
    let r = async {
        for _ in 0..steps {
            sim.run_step().await?;
        }
        sim.heal_and_check().await
    }
    .await;
    r.map_err(|e| format!("step {}: {e}", sim.step))?;
    Ok(format!(
        "fsync_acks {fsync}, {} acknowledged batches, log end {}, {:?}, disk {:?}",
        sim.acked.len(),
        sim.acked.iter().map(|a| a.last + 1).max().unwrap_or(0),
        sim.stats,
        simdisk::simulated_stats()
    ))
}

/// The suite's seeds: kills, power losses (`--fsync-acks`) and cut-off
/// nodes in each, and one without `--fsync-acks`. 1796392071996 lost an
/// acknowledged write until the acks=all wait checked the leader epoch
/// the batch was appended in (a batch truncated away while its node
/// followed was acknowledged once the node led again); 1796390887390
/// left a follower that never caught up (`STALE_EMPTY_EPOCH`, module
/// doc); 1796392186473 and, on CI, 1796392071940 found zeros in a log
/// that were the disk model's.
const DEFAULT_SEEDS: [u64; 6] = [
    1796392071938,
    1796392071940,
    1796392071943,
    1796392071996,
    1796390887390,
    1796392186473,
];

#[test]
fn a_replicated_partition_keeps_every_acknowledged_write_through_node_failures() {
    let steps: u64 = std::env::var("FJORD_CLUSTER_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let seeds: Vec<u64> = match std::env::var("FJORD_CLUSTER_SEED") {
        Ok(s) => vec![s.parse().expect("FJORD_CLUSTER_SEED is a number")],
        Err(_) => match std::env::var("FJORD_CLUSTER_SEEDS") {
            Ok(n) => {
                let n: u64 = n.parse().expect("FJORD_CLUSTER_SEEDS is a number");
                let base = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_millis() as u64);
                (0..n).map(|k| base.wrapping_add(k)).collect()
            }
            Err(_) => DEFAULT_SEEDS.to_vec(),
        },
    };
    for seed in seeds {
        println!("FJORD_CLUSTER_SEED={seed}");
        match run_seed(seed, steps) {
            Ok(summary) => println!("  {summary}"),
            Err(e) => panic!(
                "seed {seed} failed (rerun: FJORD_CLUSTER_SEED={seed} cargo test --lib shard::cluster_sim -- --nocapture): {e}"
            ),
        }
    }
}
