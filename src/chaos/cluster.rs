//! The nodes under test: one `fjord serve` ([`ChaosBroker`]) per node, all
//! voters of one metadata quorum when there are several (`--nodes N`), on
//! loopback (distinct ports, each node its own controller port) or each in
//! its own network namespace (`--netns`, [`super::netns`]), where a node
//! can also be cut off the network and healed.
//!
//! Owned by the orchestrator's (main) thread. Invariants: a started node
//! is killed when [`Nodes`] is dropped (and when the chaos process dies,
//! `PR_SET_PDEATHSIG`); the namespaces, bridge and links are removed after
//! the nodes are gone, also on an error (field order: nodes before net);
//! every wait is bounded.
//!
//! The ISR monitor ([`spawn_isr_monitor`]) polls Metadata on its own
//! thread for the whole load and records, per partition, the stretches of
//! polls that saw the same leader and ISR: what the checker needs to tell
//! a loss that `min.insync.replicas=1` allows from one it does not.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::broker::{self, BrokerSpec, ChaosBroker};
use super::clients::Shared;
use super::history::{IsrSpan, Tp};
use super::netns::Net;
use super::readback::{self, PartitionState};
use super::{ChaosArgs, ChaosError};

/// Client port of shard 0 of every node in its own namespace (each has its
/// own address); the controller listens right after the last shard's port.
pub const NETNS_CLIENT_PORT: u16 = 9092;
/// How often the ISR monitor polls Metadata.
pub const ISR_POLL_MS: u64 = 200;
/// Timeout of one of the monitor's Metadata requests.
pub const ISR_POLL_TIMEOUT_MS: u64 = 2_000;
/// How long the orchestrator waits, after a fault is repaired, for every
/// workload partition's ISR to hold all its replicas again before the next
/// fault (so that no more than N - min.insync.replicas replicas are ever
/// out of the ISR at once).
pub const ISR_FULL_TIMEOUT_MS: u64 = 30_000;
/// How long every node may take to register and be unfenced at the start.
pub const REGISTER_TIMEOUT_MS: u64 = 60_000;
/// Metadata timeout of the orchestrator's own lookups (leader, ISR).
pub const METADATA_TIMEOUT_MS: u64 = 5_000;

/// What happened to one node over a run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct NodeStats {
    pub node: usize,
    /// SIGKILLs when it led the partition chosen for the cycle.
    pub kills_as_leader: u32,
    /// SIGKILLs when it followed the partition chosen for the cycle.
    pub kills_as_follower: u32,
    /// SIGKILLs of a single-node run, or of a second node taken down.
    pub kills_other: u32,
    pub cuts: u32,
    pub restarts: u32,
    /// The node exited by itself during the load (a run error).
    pub exits_unasked: u32,
}

/// The nodes, the network they are on, and what was done to them.
pub struct Nodes {
    /// Declared before `net`: dropped (killed) first.
    pub nodes: Vec<ChaosBroker>,
    pub net: Option<Net>,
    pub stats: Vec<NodeStats>,
    /// Nodes cut off the network right now.
    pub cut: BTreeSet<usize>,
}

/// How to start every node of a run, from the flags.
pub struct NodeSetup<'a> {
    pub args: &'a ChaosArgs,
    pub bin: &'a Path,
    pub dir: &'a Path,
}

impl Nodes {
    /// Makes the namespaces (`--netns`) and starts every node. A single
    /// node without `--netns` is today's broker: `data/`, `broker.log`.
    pub fn start(setup: NodeSetup<'_>) -> Result<Nodes, ChaosError> {
        let a = setup.args;
        let n = a.nodes;
        if n == 1 && !a.netns {
            let spec = BrokerSpec {
                bin: setup.bin.to_path_buf(),
                data_dir: setup.dir.join("data"),
                log: setup.dir.join("broker.log"),
                cores: a.broker_cores,
                fsync_acks: a.fsync_acks,
                listen: Ipv4Addr::LOCALHOST,
                netns: None,
                extra_args: Vec::new(),
            };
            let b = ChaosBroker::start(spec)?;
            return Ok(Nodes {
                nodes: vec![b],
                net: None,
                stats: vec![NodeStats::default()],
                cut: BTreeSet::new(),
            });
        }
        let net = if a.netns {
            Some(Net::new(n).map_err(|e| ChaosError::Config(format!("--netns: {e}")))?)
        } else {
            None
        };
        // Addresses: (listen, client port, controller port) per node.
        let mut addrs: Vec<(Ipv4Addr, u16, u16)> = Vec::new();
        for i in 0..n {
            match &net {
                // Shard k listens on the client port + k; the controller
                // port comes right after the last shard's.
                Some(net) => addrs.push((
                    net.host(i).addr,
                    NETNS_CLIENT_PORT,
                    NETNS_CLIENT_PORT + a.broker_cores as u16,
                )),
                None => {
                    let base = broker::free_port_base(a.broker_cores + 1)?;
                    addrs.push((Ipv4Addr::LOCALHOST, base, base + a.broker_cores as u16));
                }
            }
        }
        let quorum: Vec<String> = addrs
            .iter()
            .enumerate()
            .map(|(i, (ip, _, c))| format!("{i}@{ip}:{c}"))
            .collect();
        let quorum = quorum.join(",");
        let mut nodes = Nodes {
            nodes: Vec::new(),
            net,
            stats: Vec::new(),
            cut: BTreeSet::new(),
        };
        for (i, &(listen, port, _)) in addrs.iter().enumerate() {
            let mut extra_args = vec![
                format!("--node-id={i}"),
                format!("--controller-quorum={quorum}"),
                format!(
                    "--broker-session-timeout-ms={}",
                    a.broker_session_timeout_ms
                ),
                format!("--replica-lag-time-max-ms={}", a.replica_lag_time_max_ms),
            ];
            if n > 1 {
                let rf = a.replication_factor();
                extra_args.push(format!("--offsets-topic-replication-factor={rf}"));
                extra_args.push(format!("--transaction-state-log-replication-factor={rf}"));
            }
            let spec = BrokerSpec {
                bin: setup.bin.to_path_buf(),
                data_dir: setup.dir.join(format!("data/node-{i}")),
                log: setup.dir.join(format!("node-{i}.log")),
                cores: a.broker_cores,
                fsync_acks: a.fsync_acks,
                listen,
                netns: nodes.net.as_ref().map(|net| net.host(i).ns.clone()),
                extra_args,
            };
            nodes.nodes.push(ChaosBroker::prepared(spec, port));
            nodes.stats.push(NodeStats {
                node: i,
                ..NodeStats::default()
            });
        }
        // Ready comes before the quorum forms: nodes start one by one.
        for b in &mut nodes.nodes {
            b.restart()?;
        }
        nodes.wait_registered(Duration::from_millis(REGISTER_TIMEOUT_MS))?;
        Ok(nodes)
    }

    /// Waits until Metadata lists a broker of every node (registered and
    /// unfenced): topics with a replica on each can be created then.
    pub fn wait_registered(&self, timeout: Duration) -> Result<(), ChaosError> {
        let start = Instant::now();
        let mut seen = BTreeSet::new();
        loop {
            if let Ok(ids) = readback::broker_ids(
                &self.bootstrap(),
                Duration::from_millis(METADATA_TIMEOUT_MS),
            ) {
                seen = ids.into_iter().map(node_of).collect();
                if seen.len() >= self.len() {
                    return Ok(());
                }
            }
            if start.elapsed() >= timeout {
                return Err(ChaosError::Broker(format!(
                    "only nodes {seen:?} of {} registered within {} ms",
                    self.len(),
                    timeout.as_millis()
                )));
            }
            std::thread::sleep(Duration::from_millis(readback::ATTEMPT_PAUSE_MS));
        }
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Every node's first shard, comma-separated: clients bootstrap at all.
    pub fn bootstrap(&self) -> String {
        self.nodes
            .iter()
            .map(ChaosBroker::bootstrap)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Node starts so far, summed: the run's "generation" (1 for a single
    /// broker before its first kill).
    pub fn generation(&self) -> u32 {
        self.nodes.iter().map(|b| b.starts).sum::<u32>() + 1 - self.nodes.len() as u32
    }

    /// A marker line in every node's log.
    pub fn mark(&self, what: &str) {
        for b in &self.nodes {
            b.mark(what);
        }
    }

    pub fn cut(&mut self, i: usize) -> Result<(), ChaosError> {
        let net = self
            .net
            .as_ref()
            .ok_or_else(|| ChaosError::Config("cutting a node needs --netns".to_string()))?;
        net.cut(i)
            .map_err(|e| ChaosError::Broker(format!("cutting node {i}: {e}")))?;
        self.cut.insert(i);
        self.stats[i].cuts += 1;
        Ok(())
    }

    pub fn heal(&mut self, i: usize) -> Result<(), ChaosError> {
        if let Some(net) = &self.net {
            net.heal(i)
                .map_err(|e| ChaosError::Broker(format!("healing node {i}: {e}")))?;
        }
        self.cut.remove(&i);
        Ok(())
    }

    /// Heals every cut node (best effort; the first error is returned).
    pub fn heal_all(&mut self) -> Result<(), ChaosError> {
        let mut first = Ok(());
        for i in self.cut.clone() {
            if let Err(e) = self.heal(i) {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }

    /// Leader and replicas of every workload partition, asking the nodes
    /// given (all when empty) through one Metadata request.
    pub fn partition_states(
        &self,
        ask: &[usize],
    ) -> Result<BTreeMap<Tp, PartitionState>, ChaosError> {
        let bootstrap = if ask.is_empty() {
            self.bootstrap()
        } else {
            ask.iter()
                .map(|&i| self.nodes[i].bootstrap())
                .collect::<Vec<_>>()
                .join(",")
        };
        readback::partition_states(&bootstrap, Duration::from_millis(METADATA_TIMEOUT_MS))
    }

    /// Waits until every partition in `tps` has a leader and an ISR of all
    /// its replicas in the Metadata of every node that is up and not cut
    /// (each asked alone: a node just healed answers from its stale image
    /// until it hears from the quorum, and would name the ISR it had before
    /// its cut); returns how long it took, or None when `timeout` passed
    /// first.
    pub fn wait_isr_full(&mut self, tps: &[Tp], timeout: Duration) -> Option<Duration> {
        let start = Instant::now();
        let live: Vec<usize> = (0..self.len())
            .filter(|i| !self.cut.contains(i) && self.nodes[*i].is_running())
            .collect();
        loop {
            let full_at = |i: usize| {
                self.partition_states(&[i]).is_ok_and(|states| {
                    tps.iter().all(|tp| {
                        states.get(tp).is_some_and(|s| {
                            s.leader >= 0
                                && !s.replicas.is_empty()
                                && s.replicas.iter().all(|r| s.isr.contains(r))
                        })
                    })
                })
            };
            if !live.is_empty() && live.iter().all(|&i| full_at(i)) {
                return Some(start.elapsed());
            }
            if start.elapsed() >= timeout {
                return None;
            }
            std::thread::sleep(Duration::from_millis(readback::ATTEMPT_PAUSE_MS));
        }
    }
}

/// The node of a broker id (`node * 1000 + shard`).
pub fn node_of(broker: i32) -> usize {
    crate::metadata::node_of(broker).max(0) as usize
}

/// Polls Metadata every [`ISR_POLL_MS`] until the clients stop, and
/// returns per partition the stretches of polls that saw the same leader
/// and ISR. Polls that fail are skipped (a stretch then spans the gap only
/// if the next poll sees the same state, which the checker's use allows
/// for: see `check`).
pub fn spawn_isr_monitor(
    bootstrap: String,
    shared: Arc<Shared>,
) -> Result<JoinHandle<BTreeMap<Tp, Vec<IsrSpan>>>, ChaosError> {
    std::thread::Builder::new()
        .name("chaos-isr-monitor".to_string())
        .spawn(move || {
            let mut out: BTreeMap<Tp, Vec<IsrSpan>> = BTreeMap::new();
            let client = match readback::metadata_client(&bootstrap) {
                Ok(c) => c,
                Err(e) => {
                    shared.log.line("isr-monitor", &format!("no client: {e}"));
                    return out;
                }
            };
            while !shared.stop.load(Ordering::Relaxed) {
                let t = shared.log.elapsed_ms();
                if let Ok(states) = readback::partition_states_with(
                    &client,
                    Duration::from_millis(ISR_POLL_TIMEOUT_MS),
                ) {
                    for (tp, s) in states {
                        let mut isr = s.isr.clone();
                        isr.sort_unstable();
                        let spans = out.entry(tp).or_default();
                        match spans.last_mut() {
                            Some(last) if last.leader == s.leader && last.isr == isr => {
                                last.last_ms = t;
                            }
                            _ => spans.push(IsrSpan {
                                first_ms: t,
                                last_ms: t,
                                leader: s.leader,
                                isr,
                            }),
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(ISR_POLL_MS));
            }
            out
        })
        .map_err(|source| ChaosError::Io {
            what: "spawning the ISR monitor".to_string(),
            source,
        })
}
