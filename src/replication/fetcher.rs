//! The replica fetcher: the follower's half of Kafka's replication protocol
//! (`docs/replication.md` §4.1). One fetcher runs per leader broker a
//! shard follows partitions of; it sends that broker Fetch requests as a
//! replica (its broker id in `ReplicaState`, v15+, or `replica_id`) and
//! hands what comes back to the follower's log through [`FollowerLog`],
//! which the shard implements over its partitions (`append_replica`,
//! `truncate_to`). The fetcher owns no log: it decides what to ask and what
//! an answer means, so it can be driven against a real leader in tests
//! with any log behind it.
//!
//! What each answer makes it do, as Kafka's `AbstractFetcherThread` does:
//! - **Records**: only whole batches, each checked (magic, length, counts,
//!   CRC: a follower must never store what the leader did not write) and
//!   contiguous from the follower's log end, are appended. A partial batch
//!   at the end of the answer (a leader may cut one at the size limit) is
//!   left for the next fetch; a corrupt one, or a gap, stops that
//!   partition's answer there and backs the partition off. The leader's
//!   high watermark and log start go to the log with every answer: the
//!   follower's log start follows the leader's (DeleteRecords reaches every
//!   replica this way), and the next fetch's `log_start_offset` tells the
//!   leader where it stands (its low watermark).
//! - **`diverging_epoch`** (KIP-320; the leader checked the follower's
//!   `last_fetched_epoch`): the log is truncated to where the two logs
//!   agree, by Kafka's rule: to the smaller of the leader's end for that
//!   epoch and the follower's own end for it, when the follower knows the
//!   epoch; to the follower's end of its largest epoch below, when it does
//!   not (the next fetch then carries that older epoch, and the leader
//!   answers again until the logs agree).
//! - **OFFSET_OUT_OF_RANGE**: the fetcher asks the leader for its earliest
//!   and latest offsets (ListOffsets as a replica). A follower past the
//!   leader's end truncates to it (possible only after an unclean
//!   election); one below the leader's log start empties its log and
//!   starts again at the leader's log start.
//! - **NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH,
//!   unknown topic** and other errors: the partition is told
//!   ([`FollowerLog::fetch_error`]) and backed off for [`FETCH_BACKOFF`];
//!   the metadata that changes who leads it comes from the metadata log,
//!   not from here.
//!
//! A broken connection, a request without an answer in time, or an answer
//! that does not decode ends the connection; the fetcher reconnects after
//! [`FETCH_BACKOFF`] (Kafka's `replica.fetch.backoff.ms`). One Fetch is in
//! flight at a time; the leader long-polls it ([`FETCH_MAX_WAIT`]).
//!
//! Not built yet: fetch sessions (KIP-227; every fetch names every
//! partition, which costs bytes per idle partition but no state on the
//! leader), throttling of reassignment traffic, and authentication (the
//! fetcher connects to a plaintext listener; inter-broker TLS/SASL comes
//! with the listener configuration for it).

use super::client::{ClientError, Connection};
use crate::record::batch::{self, BatchHeader};
use crate::types::TopicPartition;
use bytes::Bytes;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ReplicaState};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{
    ApiKey, BrokerId, FetchRequest, FetchResponse, ListOffsetsRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// How long the leader may hold a fetch that has nothing new
/// (`replica.fetch.wait.max.ms`).
pub const FETCH_MAX_WAIT: Duration = Duration::from_millis(500);
/// Bytes of records one fetch may bring back (`replica.fetch.response.max.bytes`).
pub const FETCH_MAX_BYTES: i32 = 10 << 20;
/// Bytes one partition may bring back (`replica.fetch.max.bytes`).
pub const PARTITION_MAX_BYTES: i32 = 1 << 20;
/// Wait after a failed connection, and for a partition that failed
/// (`replica.fetch.backoff.ms`).
pub const FETCH_BACKOFF: Duration = Duration::from_secs(1);
/// How long a request may go unanswered beyond the leader's long poll
/// (`replica.socket.timeout.ms`).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The Fetch versions the fetcher speaks: 12 brings `last_fetched_epoch`
/// and `diverging_epoch`, 13 topic ids, 15 `ReplicaState`.
const FETCH_VERSION_MIN: i16 = 12;
const FETCH_VERSION_MAX: i16 = 17;
const FETCH_FIRST_TOPIC_ID_VERSION: i16 = 13;
const FETCH_FIRST_REPLICA_STATE_VERSION: i16 = 15;
/// ListOffsets versions: 4 brings `current_leader_epoch`.
const LIST_OFFSETS_VERSION_MIN: i16 = 4;
const LIST_OFFSETS_VERSION_MAX: i16 = 9;
/// ListOffsets timestamps: the log start and the log end.
const EARLIEST_TIMESTAMP: i64 = -2;
const LATEST_TIMESTAMP: i64 = -1;

/// Where a follower's log stands, for its next fetch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FollowerPosition {
    /// The next offset it needs: its log end.
    pub log_end: i64,
    /// The newest epoch of its epoch cache (the epoch of its last batch,
    /// or a newer one it began as leader and appended nothing in), -1 for
    /// none.
    pub last_epoch: i32,
    pub log_start: i64,
    /// The leader epoch it believes the leader leads in (from the
    /// metadata), -1 for none: a leader in another epoch refuses it.
    pub current_leader_epoch: i32,
}

/// Why the follower's log refused what the fetcher handed it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct FollowerLogError(pub String);

/// The follower's side of one shard's followed partitions, as the fetcher
/// needs it. Implemented by the shard over its partitions (and by tests).
#[allow(async_fn_in_trait)] // one thread per shard: the futures need not be Send
pub trait FollowerLog {
    /// Where `tp`'s log stands; `None` if this node no longer follows it.
    fn position(&self, tp: &TopicPartition) -> Option<FollowerPosition>;
    /// Kafka's `endOffsetForEpoch` on the follower's own log: the largest
    /// epoch at or below `epoch` it holds and where that ends, or `None`.
    fn end_offset_for_epoch(&self, tp: &TopicPartition, epoch: i32) -> Option<(i32, i64)>;
    /// Appends whole batches, checked and contiguous from the log end, as
    /// the leader wrote them (offsets, epochs and CRCs kept).
    async fn append(
        &self,
        tp: &TopicPartition,
        batches: Bytes,
        last_offset: i64,
    ) -> Result<(), FollowerLogError>;
    /// Truncates the log so that it ends at `offset`.
    async fn truncate_to(&self, tp: &TopicPartition, offset: i64) -> Result<(), FollowerLogError>;
    /// Empties the log and starts it again at `offset` (the leader's log
    /// start is above the follower's end).
    async fn restart_at(&self, tp: &TopicPartition, offset: i64) -> Result<(), FollowerLogError>;
    /// The leader's high watermark and log start, from its latest answer
    /// (after its records are appended): the follower's HW follows the
    /// leader's, and its log start moves up to the leader's (Kafka's
    /// follower `maybeIncrementLogStartOffset`), persisted before this
    /// returns, since the next fetch reports it to the leader.
    async fn leader_offsets(
        &self,
        tp: &TopicPartition,
        high_watermark: i64,
        log_start: i64,
    ) -> Result<(), FollowerLogError>;
    /// The leader refused to serve `tp`.
    fn fetch_error(&self, tp: &TopicPartition, error: ResponseError);
}

/// Who fetches, from where.
#[derive(Clone, Debug)]
pub struct FetcherConfig {
    /// The follower's broker id (the shard's node id), sent as the replica.
    pub replica_id: i32,
    /// The follower's broker epoch (KIP-903: its node's registration's,
    /// `BrokerRegistration::broker_epoch`) when the fetcher starts, -1 for
    /// none; [`ReplicaFetcher::set_replica_epoch`] changes it.
    pub replica_epoch: i64,
    /// The leader broker's address (`host:port`).
    pub leader: String,
    pub max_wait: Duration,
    pub backoff: Duration,
    pub request_timeout: Duration,
}

impl FetcherConfig {
    pub fn new(replica_id: i32, leader: String) -> FetcherConfig {
        FetcherConfig {
            replica_id,
            replica_epoch: -1,
            leader,
            max_wait: FETCH_MAX_WAIT,
            backoff: FETCH_BACKOFF,
            request_timeout: REQUEST_TIMEOUT,
        }
    }
}

/// A followed partition, as the fetcher tracks it.
#[derive(Clone, Debug)]
struct Followed {
    topic_id: [u8; 16],
    /// Not fetched before this instant (after an error).
    delayed_until: Option<Instant>,
}

/// What the fetcher did, for logs and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FetcherStats {
    pub fetches: u64,
    pub batches_appended: u64,
    pub truncations: u64,
    pub restarts: u64,
    pub partition_errors: u64,
    pub reconnects: u64,
}

/// The fetcher for one leader broker.
pub struct ReplicaFetcher<L: FollowerLog> {
    config: FetcherConfig,
    log: Rc<L>,
    partitions: RefCell<BTreeMap<TopicPartition, Followed>>,
    /// The broker epoch sent as `ReplicaState.ReplicaEpoch`.
    replica_epoch: Cell<i64>,
    stats: Cell<FetcherStats>,
    stopped: Cell<bool>,
}

impl<L: FollowerLog> ReplicaFetcher<L> {
    pub fn new(config: FetcherConfig, log: Rc<L>) -> Rc<Self> {
        Rc::new(ReplicaFetcher {
            replica_epoch: Cell::new(config.replica_epoch),
            config,
            log,
            partitions: RefCell::new(BTreeMap::new()),
            stats: Cell::new(FetcherStats::default()),
            stopped: Cell::new(false),
        })
    }

    /// Starts fetching `tp` (of the topic with id `topic_id`). Adding a
    /// partition already fetched replaces its topic id and ends its back-off,
    /// so it is fetched in the next request: the replica manager does so
    /// when the partition's leader epoch changes, so that the new
    /// `current_leader_epoch` (which [`FollowerLog::position`] gives) is
    /// sent at once rather than after the back-off a FENCED_LEADER_EPOCH
    /// or UNKNOWN_LEADER_EPOCH answer started.
    pub fn add(&self, tp: TopicPartition, topic_id: [u8; 16]) {
        self.partitions.borrow_mut().insert(
            tp,
            Followed {
                topic_id,
                delayed_until: None,
            },
        );
    }

    /// The follower's broker epoch sent from the next fetch on (its node
    /// registered again, or the image now holds this process's
    /// registration): the leader takes a follower into the ISR only with
    /// its current one (KIP-903).
    pub fn set_replica_epoch(&self, epoch: i64) {
        self.replica_epoch.set(epoch);
    }

    /// Stops fetching `tp`. An answer already in flight for it is dropped.
    pub fn remove(&self, tp: &TopicPartition) {
        self.partitions.borrow_mut().remove(tp);
    }

    pub fn partitions(&self) -> usize {
        self.partitions.borrow().len()
    }

    /// Whether `tp` is fetched.
    pub fn contains(&self, tp: &TopicPartition) -> bool {
        self.partitions.borrow().contains_key(tp)
    }

    /// The partitions fetched.
    pub fn followed(&self) -> Vec<TopicPartition> {
        self.partitions.borrow().keys().cloned().collect()
    }

    /// Whether [`Self::stop`] was called.
    pub fn is_stopped(&self) -> bool {
        self.stopped.get()
    }

    pub fn stats(&self) -> FetcherStats {
        self.stats.get()
    }

    /// Ends [`Self::run`] after its current request.
    pub fn stop(&self) {
        self.stopped.set(true);
    }

    fn count(&self, f: impl FnOnce(&mut FetcherStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    /// Fetches until [`Self::stop`]: connects (again after every failure,
    /// [`FetcherConfig::backoff`] later) and sends one Fetch after another.
    pub async fn run(self: Rc<Self>) {
        let client_id = format!("fjord-replica-{}", self.config.replica_id);
        while !self.stopped.get() {
            let conn =
                Connection::open(&self.config.leader, &client_id, self.config.request_timeout)
                    .await;
            let mut conn = match conn {
                Ok(c) => c,
                Err(e) => {
                    tracing::debug!(leader = %self.config.leader, error = %e, "replica fetcher: cannot connect");
                    self.count(|s| s.reconnects += 1);
                    glommio::timer::sleep(self.config.backoff).await;
                    continue;
                }
            };
            while !self.stopped.get() {
                if let Err(e) = self.fetch_once(&mut conn).await {
                    tracing::debug!(leader = %self.config.leader, error = %e, "replica fetcher: connection ends");
                    self.count(|s| s.reconnects += 1);
                    glommio::timer::sleep(self.config.backoff).await;
                    break;
                }
            }
        }
    }

    /// One Fetch and what its answer makes the logs do. With nothing to
    /// fetch, waits a moment instead.
    pub async fn fetch_once(&self, conn: &mut Connection) -> Result<(), ClientError> {
        let version = conn.version(ApiKey::Fetch, FETCH_VERSION_MIN, FETCH_VERSION_MAX)?;
        let Some((req, names)) = self.request(version) else {
            glommio::timer::sleep(self.config.max_wait.min(self.config.backoff)).await;
            return Ok(());
        };
        let timeout = self.config.max_wait + self.config.request_timeout;
        let resp: FetchResponse = conn.request(version, &req, timeout).await?;
        self.count(|s| s.fetches += 1);
        if resp.error_code != 0 {
            // A top-level error (a session error cannot happen without a
            // session; an authorization failure can): every partition waits.
            tracing::warn!(leader = %self.config.leader, error = resp.error_code, "replica fetcher: fetch refused");
            let until = crate::clock::monotonic() + self.config.backoff;
            for f in self.partitions.borrow_mut().values_mut() {
                f.delayed_until = Some(until);
            }
            return Ok(());
        }
        for topic in resp.responses {
            let name = if version >= FETCH_FIRST_TOPIC_ID_VERSION {
                names.get(topic.topic_id.as_bytes()).cloned()
            } else {
                Some(topic.topic.0.to_string())
            };
            let Some(name) = name else { continue };
            for p in topic.partitions {
                let tp = TopicPartition::new(name.clone(), p.partition_index);
                if !self.partitions.borrow().contains_key(&tp) {
                    continue; // removed while the fetch was out
                }
                self.handle_partition(conn, &tp, p).await?;
            }
        }
        Ok(())
    }

    /// The Fetch for every partition not backed off, and the topic names
    /// by id (for the answer); `None` when there is none to fetch.
    fn request(&self, version: i16) -> Option<(FetchRequest, BTreeMap<[u8; 16], String>)> {
        let now = crate::clock::monotonic();
        let mut by_topic: BTreeMap<(String, [u8; 16]), Vec<FetchPartition>> = BTreeMap::new();
        for (tp, f) in self.partitions.borrow_mut().iter_mut() {
            if f.delayed_until.is_some_and(|t| t > now) {
                continue;
            }
            f.delayed_until = None;
            let Some(pos) = self.log.position(tp) else {
                continue;
            };
            by_topic
                .entry((tp.topic.to_string(), f.topic_id))
                .or_default()
                .push(
                    FetchPartition::default()
                        .with_partition(tp.partition.0)
                        .with_current_leader_epoch(pos.current_leader_epoch)
                        .with_fetch_offset(pos.log_end)
                        .with_last_fetched_epoch(pos.last_epoch)
                        .with_log_start_offset(pos.log_start)
                        .with_partition_max_bytes(PARTITION_MAX_BYTES),
                );
        }
        if by_topic.is_empty() {
            return None;
        }
        let mut names = BTreeMap::new();
        let topics = by_topic
            .into_iter()
            .map(|((name, id), partitions)| {
                names.insert(id, name.clone());
                let t = FetchTopic::default().with_partitions(partitions);
                if version >= FETCH_FIRST_TOPIC_ID_VERSION {
                    t.with_topic_id(uuid::Uuid::from_bytes(id))
                } else {
                    t.with_topic(TopicName(StrBytes::from_string(name)))
                }
            })
            .collect();
        let mut req = FetchRequest::default()
            .with_max_wait_ms(self.config.max_wait.as_millis() as i32)
            .with_min_bytes(1)
            .with_max_bytes(FETCH_MAX_BYTES)
            .with_isolation_level(0)
            .with_session_id(0)
            .with_session_epoch(-1)
            .with_topics(topics);
        if version >= FETCH_FIRST_REPLICA_STATE_VERSION {
            req = req.with_replica_state(
                ReplicaState::default()
                    .with_replica_id(BrokerId(self.config.replica_id))
                    .with_replica_epoch(self.replica_epoch.get()),
            );
        } else {
            req = req.with_replica_id(BrokerId(self.config.replica_id));
        }
        Some((req, names))
    }

    /// Backs `tp` off for the configured wait.
    fn delay(&self, tp: &TopicPartition) {
        if let Some(f) = self.partitions.borrow_mut().get_mut(tp) {
            f.delayed_until = Some(crate::clock::monotonic() + self.config.backoff);
        }
    }

    async fn handle_partition(
        &self,
        conn: &mut Connection,
        tp: &TopicPartition,
        p: kafka_protocol::messages::fetch_response::PartitionData,
    ) -> Result<(), ClientError> {
        let error = ResponseError::try_from_code(p.error_code);
        match error {
            None => {}
            Some(ResponseError::OffsetOutOfRange) => {
                return self.out_of_range(conn, tp).await;
            }
            Some(e) => {
                tracing::debug!(partition = %tp, error = ?e, leader = %self.config.leader, "replica fetcher: the leader refused a partition");
                self.count(|s| s.partition_errors += 1);
                self.log.fetch_error(tp, e);
                self.delay(tp);
                return Ok(());
            }
        }
        if p.diverging_epoch.epoch >= 0 && p.diverging_epoch.end_offset >= 0 {
            self.diverged(tp, p.diverging_epoch.epoch, p.diverging_epoch.end_offset)
                .await;
            return Ok(());
        }
        if let Some(records) = p.records.filter(|r| !r.is_empty()) {
            self.append(tp, records).await;
        }
        if let Err(e) = self
            .log
            .leader_offsets(tp, p.high_watermark, p.log_start_offset)
            .await
        {
            tracing::warn!(partition = %tp, error = %e, "replica fetcher: the log could not follow the leader's offsets");
            self.delay(tp);
        }
        Ok(())
    }

    /// Appends the whole, valid, contiguous batches at the start of
    /// `records`; backs the partition off at the first bad one.
    async fn append(&self, tp: &TopicPartition, records: Bytes) {
        let Some(pos) = self.log.position(tp) else {
            return;
        };
        let (len, last, count, problem) = whole_batches(&records, pos.log_end);
        if len > 0 {
            match self.log.append(tp, records.slice(..len), last).await {
                Ok(()) => self.count(|s| s.batches_appended += count),
                Err(e) => {
                    tracing::warn!(partition = %tp, error = %e, "replica fetcher: the log refused the leader's batches");
                    self.delay(tp);
                    return;
                }
            }
        }
        if let Some(problem) = problem {
            tracing::warn!(partition = %tp, leader = %self.config.leader, %problem, "replica fetcher: a bad batch from the leader; fetching it again later");
            self.delay(tp);
        }
    }

    /// Truncates after the leader named where the logs diverge.
    async fn diverged(&self, tp: &TopicPartition, leader_epoch: i32, leader_end: i64) {
        let Some(pos) = self.log.position(tp) else {
            return;
        };
        let own = self.log.end_offset_for_epoch(tp, leader_epoch);
        let to = truncation_offset(own, leader_epoch, leader_end, pos.log_end);
        tracing::info!(partition = %tp, leader_epoch, leader_end, truncate_to = to, "replica fetcher: the log diverged from the leader's; truncating");
        match self.log.truncate_to(tp, to).await {
            Ok(()) => self.count(|s| s.truncations += 1),
            Err(e) => {
                tracing::warn!(partition = %tp, error = %e, "replica fetcher: truncation failed");
                self.delay(tp);
            }
        }
    }

    /// OFFSET_OUT_OF_RANGE: where the leader's log starts and ends decides.
    async fn out_of_range(
        &self,
        conn: &mut Connection,
        tp: &TopicPartition,
    ) -> Result<(), ClientError> {
        let Some(pos) = self.log.position(tp) else {
            return Ok(());
        };
        let earliest = self.list_offset(conn, tp, &pos, EARLIEST_TIMESTAMP).await?;
        let latest = self.list_offset(conn, tp, &pos, LATEST_TIMESTAMP).await?;
        let (Some(earliest), Some(latest)) = (earliest, latest) else {
            self.delay(tp);
            return Ok(());
        };
        let result = if pos.log_end > latest {
            tracing::warn!(partition = %tp, follower_end = pos.log_end, leader_end = latest, "replica fetcher: the follower is past the leader's end; truncating to it");
            self.log.truncate_to(tp, latest).await.map(|()| {
                self.count(|s| s.truncations += 1);
            })
        } else if pos.log_end < earliest {
            tracing::info!(partition = %tp, follower_end = pos.log_end, leader_start = earliest, "replica fetcher: the leader's log starts past the follower's end; starting again there");
            self.log.restart_at(tp, earliest).await.map(|()| {
                self.count(|s| s.restarts += 1);
            })
        } else {
            // In range by now (the leader's log moved meanwhile): fetch again.
            Ok(())
        };
        if let Err(e) = result {
            tracing::warn!(partition = %tp, error = %e, "replica fetcher: could not follow the leader's range");
            self.delay(tp);
        }
        Ok(())
    }

    /// The leader's offset for `timestamp` (earliest or latest), asked as
    /// this replica; `None` when the leader refuses.
    async fn list_offset(
        &self,
        conn: &mut Connection,
        tp: &TopicPartition,
        pos: &FollowerPosition,
        timestamp: i64,
    ) -> Result<Option<i64>, ClientError> {
        let version = conn.version(
            ApiKey::ListOffsets,
            LIST_OFFSETS_VERSION_MIN,
            LIST_OFFSETS_VERSION_MAX,
        )?;
        let req = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(self.config.replica_id))
            .with_topics(vec![ListOffsetsTopic::default()
                .with_name(TopicName(StrBytes::from_string(tp.topic.to_string())))
                .with_partitions(vec![ListOffsetsPartition::default()
                    .with_partition_index(tp.partition.0)
                    .with_current_leader_epoch(pos.current_leader_epoch)
                    .with_timestamp(timestamp)])]);
        let resp = conn
            .request(version, &req, self.config.request_timeout)
            .await?;
        let p = resp
            .topics
            .first()
            .and_then(|t| t.partitions.first())
            .filter(|p| p.error_code == 0 && p.offset >= 0);
        Ok(p.map(|p| p.offset))
    }
}

/// Where a follower whose log ends at `log_end` truncates when the leader
/// answers that it diverged, with `diverging_epoch` (`leader_epoch`,
/// `leader_end`); `own` is the follower's own end offset for that epoch
/// (its largest epoch at or below it, and where that ends), if any.
pub fn truncation_offset(
    own: Option<(i32, i64)>,
    leader_epoch: i32,
    leader_end: i64,
    log_end: i64,
) -> i64 {
    match own {
        // The follower has nothing at or below that epoch.
        None => leader_end.min(log_end),
        // It has an older epoch only: truncate to that epoch's end; the
        // next fetch names it, and the leader answers again.
        Some((epoch, end)) if epoch != leader_epoch => end.min(log_end),
        Some((_, end)) => leader_end.min(end).min(log_end),
    }
}

/// The prefix of `records` the follower may append: whole batches, each
/// valid (`batch::validate`) and starting where the previous ended, the
/// first at `log_end`. Returns its length, its last offset, its batch
/// count, and why it stops short of the end, if it does because of a bad
/// batch (a partial last batch is not a problem: it comes whole next time).
pub fn whole_batches(records: &[u8], log_end: i64) -> (usize, i64, u64, Option<String>) {
    let mut at = 0usize;
    let mut next = log_end;
    let mut count = 0u64;
    while at < records.len() {
        let rest = &records[at..];
        let header = match BatchHeader::parse(rest) {
            Ok(h) => h,
            Err(batch::BatchError::Truncated { .. }) => break,
            Err(e) => return (at, next - 1, count, Some(e.to_string())),
        };
        if header.total_size() > rest.len() {
            break;
        }
        if let Err(e) = batch::validate(rest) {
            return (at, next - 1, count, Some(e.to_string()));
        }
        if header.base_offset != next {
            let problem = format!(
                "a batch at offset {} where {} was expected",
                header.base_offset, next
            );
            return (at, next - 1, count, Some(problem));
        }
        next = header.last_offset() + 1;
        at += header.total_size();
        count += 1;
    }
    (at, next - 1, count, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{BatchBuilder, Compression};

    fn batch_at(base: i64, records: usize) -> bytes::BytesMut {
        let mut b = BatchBuilder::new(Compression::None);
        for i in 0..records {
            b = b.record(
                None,
                Some(format!("v{i}").as_bytes()),
                &[],
                1_700_000_000_000,
            );
        }
        let mut out = b.build();
        batch::set_base_offset(&mut out, base);
        out
    }

    #[test]
    fn whole_batches_takes_contiguous_valid_batches_and_leaves_a_partial_one() {
        let mut all = batch_at(5, 2);
        all.extend_from_slice(&batch_at(7, 3));
        let whole = all.len();
        let third = batch_at(10, 1);
        all.extend_from_slice(&third[..third.len() - 4]);
        assert_eq!(whole_batches(&all, 5), (whole, 9, 2, None));
        // Starting elsewhere than the follower's end: nothing taken.
        let (len, _, count, problem) = whole_batches(&all, 4);
        assert_eq!((len, count), (0, 0));
        assert!(problem.unwrap().contains("offset 5 where 4"));
    }

    /// A follower's log that only says where it stands: enough to build
    /// the fetcher's requests.
    struct Positions;

    impl FollowerLog for Positions {
        fn position(&self, _: &TopicPartition) -> Option<FollowerPosition> {
            Some(FollowerPosition {
                log_end: 7,
                last_epoch: 2,
                log_start: 0,
                current_leader_epoch: 2,
            })
        }
        fn end_offset_for_epoch(&self, _: &TopicPartition, _: i32) -> Option<(i32, i64)> {
            None
        }
        async fn append(
            &self,
            _: &TopicPartition,
            _: Bytes,
            _: i64,
        ) -> Result<(), FollowerLogError> {
            Ok(())
        }
        async fn truncate_to(&self, _: &TopicPartition, _: i64) -> Result<(), FollowerLogError> {
            Ok(())
        }
        async fn restart_at(&self, _: &TopicPartition, _: i64) -> Result<(), FollowerLogError> {
            Ok(())
        }
        async fn leader_offsets(
            &self,
            _: &TopicPartition,
            _: i64,
            _: i64,
        ) -> Result<(), FollowerLogError> {
            Ok(())
        }
        fn fetch_error(&self, _: &TopicPartition, _: ResponseError) {}
    }

    /// KIP-903: the fetch names the follower's broker epoch
    /// (`ReplicaState.ReplicaEpoch`, v15+), the one it started with and,
    /// once changed (the node registered again), the new one; before v15
    /// there is no field for it, only the replica id.
    #[test]
    fn a_replica_fetch_names_the_followers_broker_epoch() {
        let mut config = FetcherConfig::new(2001, "leader:9092".into());
        config.replica_epoch = 5;
        let fetcher = ReplicaFetcher::new(config, Rc::new(Positions));
        fetcher.add(TopicPartition::new("t", 0), [1; 16]);
        let state = |version: i16| fetcher.request(version).expect("a request").0;
        let r = state(FETCH_VERSION_MAX).replica_state;
        assert_eq!((r.replica_id.0, r.replica_epoch), (2001, 5));
        fetcher.set_replica_epoch(6);
        let r = state(FETCH_FIRST_REPLICA_STATE_VERSION).replica_state;
        assert_eq!((r.replica_id.0, r.replica_epoch), (2001, 6));
        let old = state(FETCH_FIRST_REPLICA_STATE_VERSION - 1);
        assert_eq!(old.replica_id.0, 2001);
    }

    #[test]
    fn whole_batches_stops_at_a_corrupt_batch() {
        let first = batch_at(0, 1);
        let mut all = first.clone();
        let mut bad = batch_at(1, 1);
        let n = bad.len();
        bad[n - 1] ^= 0xff;
        all.extend_from_slice(&bad);
        let (len, last, count, problem) = whole_batches(&all, 0);
        assert_eq!((len, last, count), (first.len(), 0, 1));
        assert!(problem.is_some());
    }
}
