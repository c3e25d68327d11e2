//! The replica manager of one shard: the follower side of replicated
//! partitions (`docs/replication.md` §4.1, §9 step 3), driven by the
//! metadata image.
//!
//! Every image a shard applies (`ShardCtx::apply_image`) names, for each
//! replicated partition with a replica on this shard, who leads it. Before
//! the image is stored (so no request sees it before the role change), the
//! shard hands the manager the partitions it follows, each with its leader
//! broker and leader epoch ([`ReplicaManager::follow_only`]); the manager
//! then:
//! - runs **one [`ReplicaFetcher`] per leader broker** this shard follows
//!   partitions of (keyed by the leader's broker id, `node * 1000 +
//!   shard`), as a glommio task of this shard: a partition is added to the
//!   fetcher of its current leader, moved when the leader changes, and
//!   removed when this broker leads it, when it has no leader (-1), or when
//!   its topic is gone; a fetcher left with no partition is stopped. So
//!   there are at most as many fetchers as brokers the image registers;
//! - reaches the leader at its node's **`PLAINTEXT` endpoint** in the
//!   image's broker registration (host, port + the leader's shard). A node
//!   that registered no PLAINTEXT listener is not fetched from, and a
//!   warning says so once per node: replication over TLS or SASL is not
//!   built. A node not registered yet is fetched from once it is (the next
//!   image). A new registration with another address restarts the fetcher;
//! - fetches as replica `config.node_id_of(shard)`, this shard's broker id,
//!   with broker epoch -1 (broker epochs are not built);
//! - implements the fetcher's [`FollowerLog`] seam over the shard's open
//!   [`Partition`]s ([`Followers`], one view per leader, [`FollowerView`]):
//!   `append` is `Partition::append_replica` for each batch of the answer
//!   (a slice of the answer's frame: no copy), `truncate_to` and
//!   `restart_at` are `Partition::truncate_to` and
//!   `truncate_fully_and_start_at`, `leader_offsets` sets the follower's
//!   high watermark (`PartitionLog::set_high_watermark`, which bounds it by
//!   what the follower holds: `min(leader's HW, written)`) and moves its
//!   log start up to the leader's (`PartitionLog::follow_leader_log_start`:
//!   bounded by that HW, the segments below deleted, checkpointed before
//!   the next fetch reports it as `log_start_offset`), and `position`
//!   sends the leader epoch of the image as `current_leader_epoch`, so a
//!   new epoch is sent with the next fetch (the partition is also re-added,
//!   which ends a back-off). A view answers only for the partitions whose
//!   leader is its own: an answer from a leader the partition has left
//!   changes nothing.
//!
//! The leader's half of a role change is the shard's (`ShardCtx`): a
//! broker that leads calls `become_leader` when its log's newest epoch is
//! older than the partition's, and every replica's log runs in replicated
//! HW mode (its HW set from outside: by follower fetches on the leader,
//! by the leader's answers here). A follower's log is opened without an
//! epoch of its own (the log stamps none until `become_leader`), so a
//! follower restarted while its leader moved to a newer epoch keeps the
//! older epochs' batches it still has to fetch appendable.
//!
//! Not built: replication over TLS or SASL listeners, broker epochs in
//! `ReplicaState`, fetch sessions (KIP-227: every fetch names every
//! followed partition), and throttling. A follower applies its own
//! retention too, as Kafka's does.

use super::fetcher::{
    FetcherConfig, FetcherStats, FollowerLog, FollowerLogError, FollowerPosition, ReplicaFetcher,
};
use crate::metadata::{node_of, shard_of, MetadataImage};
use crate::partition::Partition;
use crate::record::BatchHeader;
use crate::types::{Offset, TopicPartition};
use bytes::Bytes;
use kafka_protocol::ResponseError;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// The listener protocol replicas fetch over.
pub const REPLICATION_PROTOCOL: &str = "PLAINTEXT";

/// One partition this shard follows.
pub struct Follower {
    pub partition: Rc<Partition>,
    pub topic_id: [u8; 16],
    /// The leader broker it follows (`node * 1000 + shard`).
    pub leader: i32,
    /// The leader epoch the image names, sent as `current_leader_epoch`.
    pub leader_epoch: i32,
    /// Partition errors the leader answered (NOT_LEADER_OR_FOLLOWER,
    /// FENCED_LEADER_EPOCH, ...).
    pub fetch_errors: Cell<u64>,
}

impl Follower {
    pub fn new(
        partition: Rc<Partition>,
        topic_id: [u8; 16],
        leader: i32,
        leader_epoch: i32,
    ) -> Follower {
        Follower {
            partition,
            topic_id,
            leader,
            leader_epoch,
            fetch_errors: Cell::new(0),
        }
    }
}

/// The partitions one shard follows, by partition: shared by every
/// fetcher of the shard, each through its own [`FollowerView`].
#[derive(Default)]
pub struct Followers {
    map: RefCell<HashMap<TopicPartition, Rc<Follower>>>,
}

impl Followers {
    pub fn get(&self, tp: &TopicPartition) -> Option<Rc<Follower>> {
        self.map.borrow().get(tp).cloned()
    }

    pub fn insert(&self, tp: TopicPartition, follower: Follower) {
        self.map.borrow_mut().insert(tp, Rc::new(follower));
    }

    pub fn remove(&self, tp: &TopicPartition) -> Option<Rc<Follower>> {
        self.map.borrow_mut().remove(tp)
    }

    pub fn len(&self) -> usize {
        self.map.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.borrow().is_empty()
    }

    fn snapshot(&self) -> Vec<(TopicPartition, Rc<Follower>)> {
        self.map
            .borrow()
            .iter()
            .map(|(tp, f)| (tp.clone(), f.clone()))
            .collect()
    }

    /// The followed partitions whose leader is `leader`, as that leader's
    /// fetcher sees them.
    pub fn view(self: &Rc<Self>, leader: i32) -> FollowerView {
        FollowerView {
            leader,
            followers: self.clone(),
        }
    }
}

/// [`Followers`] as the fetcher of one leader broker sees them: only the
/// partitions that leader leads.
pub struct FollowerView {
    leader: i32,
    followers: Rc<Followers>,
}

impl FollowerView {
    fn follower(&self, tp: &TopicPartition) -> Option<Rc<Follower>> {
        self.followers.get(tp).filter(|f| f.leader == self.leader)
    }

    fn partition(&self, tp: &TopicPartition) -> Result<Rc<Partition>, FollowerLogError> {
        self.follower(tp)
            .map(|f| f.partition.clone())
            .ok_or_else(|| FollowerLogError(format!("{tp} is no longer followed from this leader")))
    }
}

fn log_err(e: impl std::fmt::Display) -> FollowerLogError {
    FollowerLogError(e.to_string())
}

/// Where `p`'s log stands, for a fetch in `current_leader_epoch`. Its last
/// fetched epoch is the newest of its epoch cache, as Kafka's follower
/// sends (`log.latestEpoch`): that is the epoch of its last batch, or an
/// epoch it began as leader and appended nothing in, which the leader
/// then answers with a diverging epoch (`PartitionLog::truncate_to` drops
/// it).
pub fn follower_position(p: &Partition, current_leader_epoch: i32) -> FollowerPosition {
    let log = &p.log;
    let (start, end) = (log.log_start_offset().0, log.log_end_offset().0);
    FollowerPosition {
        log_end: end,
        last_epoch: log.latest_epoch().unwrap_or(-1),
        log_start: start,
        current_leader_epoch,
    }
}

impl FollowerLog for FollowerView {
    fn position(&self, tp: &TopicPartition) -> Option<FollowerPosition> {
        let f = self.follower(tp)?;
        Some(follower_position(&f.partition, f.leader_epoch))
    }

    fn end_offset_for_epoch(&self, tp: &TopicPartition, epoch: i32) -> Option<(i32, i64)> {
        let f = self.follower(tp)?;
        let (e, end) = f.partition.log.end_offset_for_epoch(epoch);
        (e >= 0 && end >= 0).then_some((e, end))
    }

    async fn append(
        &self,
        tp: &TopicPartition,
        batches: Bytes,
        last_offset: i64,
    ) -> Result<(), FollowerLogError> {
        let p = self.partition(tp)?;
        // Each batch a slice of the answer: no copy on the way in. The
        // fetcher checked them whole and contiguous; appended in order,
        // synchronously (nothing else runs on the shard meanwhile).
        let mut at = 0;
        while at < batches.len() {
            let h = BatchHeader::parse(&batches[at..]).map_err(log_err)?;
            let end = at
                .checked_add(h.total_size())
                .filter(|&e| e <= batches.len())
                .ok_or_else(|| FollowerLogError(format!("a partial batch at byte {at}")))?;
            p.append_replica(batches.slice(at..end), batches.len())
                .map_err(log_err)?;
            at = end;
        }
        let log_end = p.log.log_end_offset().0;
        if log_end != last_offset + 1 {
            return Err(FollowerLogError(format!(
                "the log ends at {log_end} after batches up to {last_offset}"
            )));
        }
        // The next fetch tells the leader this log ends here, which may
        // let its HW pass these batches and acks=all answer: so they must
        // first be written (durable under `--fsync-acks`), as a leader's
        // own append must be before it counts (`docs/replication.md`
        // §4.1; Kafka's follower writes to the page cache before fetching
        // again). A kill -9 of this node then loses none of what it
        // reported, and `--fsync-acks` holds on every ISR member.
        p.log
            .wait_locally_acked(Offset(last_offset))
            .await
            .map_err(log_err)?;
        Ok(())
    }

    async fn truncate_to(&self, tp: &TopicPartition, offset: i64) -> Result<(), FollowerLogError> {
        let p = self.partition(tp)?;
        p.truncate_to(Offset(offset)).await.map_err(log_err)?;
        Ok(())
    }

    async fn restart_at(&self, tp: &TopicPartition, offset: i64) -> Result<(), FollowerLogError> {
        let p = self.partition(tp)?;
        p.truncate_fully_and_start_at(Offset(offset))
            .await
            .map_err(log_err)?;
        Ok(())
    }

    async fn leader_offsets(
        &self,
        tp: &TopicPartition,
        high_watermark: i64,
        log_start: i64,
    ) -> Result<(), FollowerLogError> {
        let Some(f) = self.follower(tp) else {
            return Ok(());
        };
        // The follower's HW: the leader's, bounded by what this log holds
        // (`set_high_watermark` takes the minimum with what is written).
        if high_watermark >= 0 {
            f.partition.log.set_high_watermark(Offset(high_watermark));
        }
        // Its log start: the leader's, bounded by that HW, the segments
        // below deleted and the checkpoint written before the next fetch
        // reports it (the leader's DeleteRecords waits for that).
        if log_start > f.partition.log.log_start_offset().0 {
            f.partition
                .log
                .follow_leader_log_start(Offset(log_start))
                .await
                .map_err(log_err)?;
        }
        Ok(())
    }

    fn fetch_error(&self, tp: &TopicPartition, error: ResponseError) {
        if let Some(f) = self.follower(tp) {
            f.fetch_errors.set(f.fetch_errors.get() + 1);
            tracing::debug!(partition = %tp, leader = self.leader, ?error, "replica fetch refused by the leader");
        }
    }
}

/// A partition this shard should follow, from the image being applied.
pub struct Follow {
    pub tp: TopicPartition,
    pub topic_id: [u8; 16],
    pub partition: Rc<Partition>,
    /// The leader broker (never this shard's own, never -1).
    pub leader: i32,
    pub leader_epoch: i32,
}

/// Why a leader broker cannot be fetched from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NoAddress {
    /// Its node is not in the image's registrations (yet).
    Unregistered,
    /// Its node registered fewer shards than the broker id names.
    NoSuchShard,
    /// Its node has no PLAINTEXT listener: replication over TLS or SASL is
    /// not built.
    NoPlaintextListener,
}

/// The address replicas fetch from leader broker `leader` at: its node's
/// PLAINTEXT endpoint, at the port of its shard.
pub fn leader_address(image: &MetadataImage, leader: i32) -> Result<String, NoAddress> {
    if leader < 0 {
        return Err(NoAddress::Unregistered);
    }
    let registered = image
        .brokers
        .get(&node_of(leader))
        .ok_or(NoAddress::Unregistered)?;
    let registration = &registered.registration;
    let shard = shard_of(leader);
    if shard >= registration.shards {
        return Err(NoAddress::NoSuchShard);
    }
    let endpoint = registration
        .endpoint(REPLICATION_PROTOCOL)
        .ok_or(NoAddress::NoPlaintextListener)?;
    let port = u16::try_from(shard)
        .ok()
        .and_then(|s| endpoint.port.checked_add(s))
        .ok_or(NoAddress::NoSuchShard)?;
    Ok(if endpoint.host.contains(':') {
        format!("[{}]:{port}", endpoint.host)
    } else {
        format!("{}:{port}", endpoint.host)
    })
}

/// A running fetcher.
struct Running {
    address: String,
    fetcher: Rc<ReplicaFetcher<FollowerView>>,
}

/// One shard's followers and fetchers; see the module doc.
pub struct ReplicaManager {
    /// This shard's broker id, sent as the replica id.
    replica_id: i32,
    /// This process's broker epoch (KIP-903), sent by every fetcher: -1
    /// until the image holds this process's registration
    /// ([`Self::set_broker_epoch`]).
    broker_epoch: Cell<i64>,
    followers: Rc<Followers>,
    /// By leader broker id.
    fetchers: RefCell<BTreeMap<i32, Running>>,
    /// Nodes already warned about (no PLAINTEXT listener).
    warned: RefCell<BTreeSet<i32>>,
    /// Fetcher tasks not yet ended (stopped ones finish their request).
    tasks: Rc<Cell<usize>>,
    /// The fetchers' back-off (tests shorten it).
    backoff: Duration,
}

impl ReplicaManager {
    pub fn new(replica_id: i32) -> ReplicaManager {
        ReplicaManager {
            replica_id,
            broker_epoch: Cell::new(-1),
            followers: Rc::default(),
            fetchers: RefCell::default(),
            warned: RefCell::default(),
            tasks: Rc::default(),
            backoff: super::fetcher::FETCH_BACKOFF,
        }
    }

    /// This process's broker epoch from the image just applied (its
    /// registration's, -1 before it has one): every running fetcher sends
    /// it from its next fetch on, as the fetchers started later do. A node
    /// that registers again (a new registration) fetches with the new one.
    pub fn set_broker_epoch(&self, epoch: i64) {
        if self.broker_epoch.replace(epoch) != epoch {
            for r in self.fetchers.borrow().values() {
                r.fetcher.set_replica_epoch(epoch);
            }
        }
    }

    /// The partitions followed.
    pub fn followers(&self) -> &Rc<Followers> {
        &self.followers
    }

    /// The leader brokers fetched from.
    pub fn fetcher_leaders(&self) -> Vec<i32> {
        self.fetchers.borrow().keys().copied().collect()
    }

    /// The partitions the fetcher of `leader` fetches (none if none runs).
    pub fn fetched_from(&self, leader: i32) -> Vec<TopicPartition> {
        self.fetchers
            .borrow()
            .get(&leader)
            .map(|r| r.fetcher.followed())
            .unwrap_or_default()
    }

    /// The statistics of the fetcher of `leader`, if one runs.
    pub fn fetcher_stats(&self, leader: i32) -> Option<FetcherStats> {
        self.fetchers
            .borrow()
            .get(&leader)
            .map(|r| r.fetcher.stats())
    }

    /// Follows exactly `follow` from now on: every other partition is
    /// removed from its fetcher (this broker leads it, it has no leader, or
    /// its topic is gone), each of `follow` is in its leader's fetcher
    /// (moved if its leader changed, re-added if its epoch changed),
    /// fetchers are started for new leaders and stopped when they have no
    /// partition left or their leader's address changed. Runs without an
    /// await: the shard applies an image between two requests.
    pub fn follow_only(&self, image: &MetadataImage, follow: Vec<Follow>) {
        let wanted: HashMap<TopicPartition, Follow> =
            follow.into_iter().map(|f| (f.tp.clone(), f)).collect();
        // Partitions no longer followed from the same leader.
        for (tp, cur) in self.followers.snapshot() {
            let keep = wanted.get(&tp).is_some_and(|w| {
                w.leader == cur.leader
                    && w.topic_id == cur.topic_id
                    && Rc::ptr_eq(&w.partition, &cur.partition)
            });
            if !keep {
                if let Some(r) = self.fetchers.borrow().get(&cur.leader) {
                    r.fetcher.remove(&tp);
                }
                self.followers.remove(&tp);
            }
        }
        let mut by_leader: BTreeMap<i32, Vec<Follow>> = BTreeMap::new();
        for (_, w) in wanted {
            by_leader.entry(w.leader).or_default().push(w);
        }
        // Fetchers no longer needed, or whose leader moved.
        let leaders: Vec<i32> = self.fetcher_leaders();
        for leader in leaders {
            let address = leader_address(image, leader).ok();
            let keep = by_leader.contains_key(&leader)
                && self
                    .fetchers
                    .borrow()
                    .get(&leader)
                    .is_some_and(|r| Some(&r.address) == address.as_ref());
            if !keep {
                self.stop_fetcher(leader);
            }
        }
        for (leader, partitions) in by_leader {
            let mut changed = Vec::with_capacity(partitions.len());
            for w in partitions {
                let epoch_changed = match self.followers.get(&w.tp) {
                    Some(cur) if cur.leader_epoch == w.leader_epoch => false,
                    Some(cur) => {
                        let errors = cur.fetch_errors.get();
                        let next = Follower::new(w.partition, w.topic_id, leader, w.leader_epoch);
                        next.fetch_errors.set(errors);
                        self.followers.insert(w.tp.clone(), next);
                        true
                    }
                    None => {
                        let next = Follower::new(w.partition, w.topic_id, leader, w.leader_epoch);
                        self.followers.insert(w.tp.clone(), next);
                        true
                    }
                };
                changed.push((w.tp, w.topic_id, epoch_changed));
            }
            let Some(fetcher) = self.fetcher_for(image, leader) else {
                continue;
            };
            for (tp, topic_id, epoch_changed) in changed {
                if epoch_changed || !fetcher.contains(&tp) {
                    fetcher.add(tp, topic_id);
                }
            }
        }
    }

    /// The fetcher of `leader`, started if none runs; None when the leader
    /// has no address to fetch from.
    fn fetcher_for(
        &self,
        image: &MetadataImage,
        leader: i32,
    ) -> Option<Rc<ReplicaFetcher<FollowerView>>> {
        if let Some(r) = self.fetchers.borrow().get(&leader) {
            return Some(r.fetcher.clone());
        }
        let address = match leader_address(image, leader) {
            Ok(a) => a,
            Err(NoAddress::NoPlaintextListener) => {
                if self.warned.borrow_mut().insert(node_of(leader)) {
                    tracing::warn!(
                        leader,
                        node = node_of(leader),
                        "the leader's node has no PLAINTEXT listener: its partitions are not replicated here (replication over TLS or SASL is not built)"
                    );
                }
                return None;
            }
            Err(why) => {
                tracing::debug!(leader, ?why, "no address for the leader yet");
                return None;
            }
        };
        let mut config = FetcherConfig::new(self.replica_id, address.clone());
        config.backoff = self.backoff;
        config.replica_epoch = self.broker_epoch.get();
        let fetcher = ReplicaFetcher::new(config, Rc::new(self.followers.view(leader)));
        tracing::info!(leader, %address, replica = self.replica_id, "replica fetcher starts");
        let tasks = self.tasks.clone();
        tasks.set(tasks.get() + 1);
        let run = fetcher.clone().run();
        glommio::spawn_local(async move {
            run.await;
            tasks.set(tasks.get().saturating_sub(1));
        })
        .detach();
        self.fetchers.borrow_mut().insert(
            leader,
            Running {
                address,
                fetcher: fetcher.clone(),
            },
        );
        Some(fetcher)
    }

    /// Follows `tp` no longer (its topic is being deleted).
    pub fn unfollow(&self, tp: &TopicPartition) {
        if let Some(f) = self.followers.remove(tp) {
            let leader = f.leader;
            let empty = match self.fetchers.borrow().get(&leader) {
                Some(r) => {
                    r.fetcher.remove(tp);
                    r.fetcher.partitions() == 0
                }
                None => false,
            };
            if empty {
                self.stop_fetcher(leader);
            }
        }
    }

    /// Stops `leader`'s fetcher: its partitions are removed first, so an
    /// answer in flight changes nothing; the task ends after that request.
    fn stop_fetcher(&self, leader: i32) {
        let Some(r) = self.fetchers.borrow_mut().remove(&leader) else {
            return;
        };
        for tp in r.fetcher.followed() {
            r.fetcher.remove(&tp);
        }
        r.fetcher.stop();
        tracing::info!(leader, address = %r.address, "replica fetcher stops");
    }

    /// Stops every fetcher (at shutdown) and waits until their tasks end,
    /// at most until `deadline`: a truncation in flight completes before
    /// the logs close.
    pub async fn stop_all(&self, deadline: Instant) {
        for leader in self.fetcher_leaders() {
            self.stop_fetcher(leader);
        }
        while self.tasks.get() > 0 && crate::clock::monotonic() < deadline {
            glommio::timer::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::{BrokerEndpoint, BrokerRegistration, MetadataRecord};

    fn registered(node: i32, shards: usize, protocols: &[(&str, u16)]) -> MetadataRecord {
        MetadataRecord::RegisterBroker {
            registration: BrokerRegistration {
                node,
                shards,
                endpoints: protocols
                    .iter()
                    .map(|&(protocol, port)| BrokerEndpoint {
                        protocol: protocol.into(),
                        host: format!("10.0.0.{node}"),
                        port,
                    })
                    .collect(),
                incarnation: [node as u8; 16],
                leader_epoch: 0,
                clean_shutdown: true,
            },
        }
    }

    fn registered_at(node: i32, shards: usize, protocol: &str, port: u16) -> MetadataRecord {
        MetadataRecord::RegisterBroker {
            registration: BrokerRegistration {
                node,
                shards,
                endpoints: vec![BrokerEndpoint {
                    protocol: protocol.into(),
                    // Loopback, a port nothing listens on: the fetchers
                    // started here connect nowhere.
                    host: "127.0.0.1".into(),
                    port,
                }],
                incarnation: [port as u8; 16],
                leader_epoch: 0,
                clean_shutdown: true,
            },
        }
    }

    use super::super::test_partition as partition;

    /// One fetcher per leader broker, holding exactly the partitions that
    /// broker leads; a partition moves with its leader and leaves every
    /// fetcher when it is not followed; a fetcher with no partition stops;
    /// a new address restarts it; a new epoch is what the next fetch
    /// names; a leader without a PLAINTEXT listener gets no fetcher, its
    /// partitions stay followed for when it has one.
    #[test]
    fn fetchers_follow_the_image() {
        let dir = tempfile::tempdir().expect("a temporary dir");
        let path = dir.path().to_path_buf();
        crate::runtime::run_test_executor(move || async move {
            crate::runtime::probe_dma(&path).await.expect("dma probe");
            let tps: Vec<TopicPartition> = (0..4).map(|i| TopicPartition::new("t", i)).collect();
            let mut ps = Vec::new();
            for tp in &tps {
                ps.push(partition(&path, tp).await);
            }
            let follow = |i: usize, leader: i32, epoch: i32| Follow {
                tp: tps[i].clone(),
                topic_id: [7; 16],
                partition: ps[i].clone(),
                leader,
                leader_epoch: epoch,
            };
            let image = MetadataImage::default()
                .apply(&registered_at(1, 2, "PLAINTEXT", 1))
                .apply(&registered_at(2, 2, "PLAINTEXT", 2))
                .apply(&registered_at(3, 1, "SSL", 3));
            let mut m = ReplicaManager::new(4000);
            m.backoff = Duration::from_millis(10);
            m.follow_only(
                &image,
                vec![
                    follow(0, 1000, 0),
                    follow(1, 1000, 0),
                    follow(2, 2001, 0),
                    follow(3, 3000, 0),
                ],
            );
            assert_eq!(m.fetcher_leaders(), vec![1000, 2001]);
            assert_eq!(m.fetched_from(1000), tps[..2].to_vec());
            assert_eq!(m.fetched_from(2001), vec![tps[2].clone()]);
            assert_eq!(
                m.followers().len(),
                4,
                "3000's partition waits for an address"
            );
            let view = m.followers().view(1000);
            assert_eq!(view.position(&tps[0]).unwrap().current_leader_epoch, 0);
            assert!(view.position(&tps[2]).is_none(), "another leader's");

            // t-1 moves to 2001, t-0 is in epoch 3, t-2 is led here, and
            // node 3 now has a PLAINTEXT listener.
            let image = image.apply(&registered_at(3, 1, "PLAINTEXT", 3));
            m.follow_only(
                &image,
                vec![follow(0, 1000, 3), follow(1, 2001, 1), follow(3, 3000, 0)],
            );
            assert_eq!(m.fetcher_leaders(), vec![1000, 2001, 3000]);
            assert_eq!(m.fetched_from(1000), vec![tps[0].clone()]);
            assert_eq!(m.fetched_from(2001), vec![tps[1].clone()]);
            assert_eq!(m.fetched_from(3000), vec![tps[3].clone()]);
            assert!(m.followers().get(&tps[2]).is_none());
            assert_eq!(view.position(&tps[0]).unwrap().current_leader_epoch, 3);
            assert!(view.position(&tps[1]).is_none(), "moved to 2001");

            // Node 2 registers another address: its fetcher starts again
            // there. 1000 has nothing left: stopped.
            let image = image.apply(&registered_at(2, 2, "PLAINTEXT", 22));
            m.follow_only(&image, vec![follow(1, 2001, 1), follow(3, 3000, 0)]);
            assert_eq!(m.fetcher_leaders(), vec![2001, 3000]);
            assert_eq!(m.fetched_from(2001), vec![tps[1].clone()]);
            assert_eq!(
                m.fetchers.borrow().get(&2001).map(|r| r.address.clone()),
                Some("127.0.0.1:23".to_string())
            );
            m.unfollow(&tps[3]);
            assert_eq!(m.fetcher_leaders(), vec![2001]);

            m.follow_only(&image, Vec::new());
            assert!(m.fetcher_leaders().is_empty() && m.followers().is_empty());
            m.stop_all(crate::clock::monotonic() + Duration::from_secs(10))
                .await;
            assert_eq!(m.tasks.get(), 0, "every fetcher task ended");
        });
    }

    /// A follower's fetch names the newest epoch of its cache, as Kafka's
    /// does: an epoch it began as leader and appended nothing in too, which
    /// a truncation at the log end then drops (`STALE_EMPTY_EPOCH` of
    /// `shard::cluster_sim`: named by its last batch instead, the leader
    /// found no divergence and the follower never caught up).
    #[test]
    fn a_follower_names_its_newest_epoch() {
        let dir = tempfile::tempdir().expect("a temporary dir");
        let path = dir.path().to_path_buf();
        crate::runtime::run_test_executor(move || async move {
            crate::runtime::probe_dma(&path).await.expect("dma probe");
            let p = partition(&path, &TopicPartition::new("t", 0)).await;
            // A log opened with the default settings starts epoch 0.
            assert_eq!(follower_position(&p, 4).last_epoch, 0);
            p.log.become_leader(1).expect("epoch 1");
            let b = crate::record::BatchBuilder::new(crate::record::Compression::None)
                .record(None, Some(b"v".as_slice()), &[], 1_700_000_000_000)
                .build();
            let info = p.log.append(b).expect("appended");
            p.log.wait_written(info.last_offset).await.expect("written");
            p.log.become_leader(3).expect("epoch 3, empty");
            let pos = follower_position(&p, 4);
            assert_eq!((pos.log_end, pos.last_epoch), (1, 3));
            p.truncate_to(Offset(1))
                .await
                .expect("truncated at the end");
            let pos = follower_position(&p, 4);
            assert_eq!((pos.log_end, pos.last_epoch), (1, 1));
        });
    }

    /// The leader's address is its node's PLAINTEXT endpoint at the
    /// leader shard's port; a node without one, an unknown node or shard
    /// has none.
    #[test]
    fn leaders_are_reached_at_their_plaintext_endpoint() {
        let image = MetadataImage::default()
            .apply(&registered(1, 2, &[("SSL", 9093), ("PLAINTEXT", 9092)]))
            .apply(&registered(2, 1, &[("SASL_SSL", 9094)]));
        assert_eq!(leader_address(&image, 1000).unwrap(), "10.0.0.1:9092");
        assert_eq!(leader_address(&image, 1001).unwrap(), "10.0.0.1:9093");
        assert_eq!(leader_address(&image, 1002), Err(NoAddress::NoSuchShard));
        assert_eq!(
            leader_address(&image, 2000),
            Err(NoAddress::NoPlaintextListener)
        );
        assert_eq!(leader_address(&image, 3000), Err(NoAddress::Unregistered));
        assert_eq!(leader_address(&image, -1), Err(NoAddress::Unregistered));
        let v6 = MetadataImage::default().apply(&MetadataRecord::RegisterBroker {
            registration: BrokerRegistration {
                node: 4,
                shards: 1,
                endpoints: vec![BrokerEndpoint {
                    protocol: "PLAINTEXT".into(),
                    host: "::1".into(),
                    port: 9092,
                }],
                incarnation: [4; 16],
                leader_epoch: 0,
                clean_shutdown: true,
            },
        });
        assert_eq!(leader_address(&v6, 4000).unwrap(), "[::1]:9092");
    }
}
