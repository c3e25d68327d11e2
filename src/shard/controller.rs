//! The controller: the single writer of cluster metadata, on shard 0.
//!
//! Requests are handled one at a time (a one-permit semaphore), each in three
//! steps: validate against the current image, propose the resulting records
//! to the metadata log (a Raft quorum of one, `metadata::store`; its writes
//! and fdatasyncs run off the reactor, its ticks come from a timer), then
//! build the new image from the records the log committed and broadcast it
//! to every shard, waiting for all acks. Only then is
//! the request answered, so a client that sees a topic created can produce to
//! every partition of it at once, on whichever shard leads it.
//!
//! Timeouts (`--cross-shard-timeout-ms`, see `router`): every request comes
//! with the deadline at which its requester stops waiting.
//! - A request still waiting for the semaphore at its deadline, or that gets
//!   it after the deadline, is answered TimedOut and changes nothing: its
//!   requester has answered REQUEST_TIMED_OUT (or COORDINATOR_NOT_AVAILABLE)
//!   already, and a retry must not find half of an old request applied.
//! - A request that started is carried to its end (never cancelled between
//!   persisting and broadcasting, which would leave the log and the images
//!   apart); only the wait for the shards' acks stops at the deadline. The
//!   items that were applied are then answered TimedOut (REQUEST_TIMED_OUT,
//!   as Kafka answers a CreateTopics whose change is not yet everywhere):
//!   the change is persisted, the shards that acked serve it, and a retry
//!   sees it (TOPIC_ALREADY_EXISTS, say).
//! - A shard that did not ack in time is "lagging": a background task sends
//!   it the controller's newest image and waits for the ack, again and again
//!   until the shard has acked the newest one. Images are whole and
//!   versioned (a shard ignores an older one), so the lagging shard
//!   converges to the controller's state once it resumes, even if the
//!   broadcast's own message never reached it (the channel was full) and no
//!   later change comes.
//!
//! The start-up broadcast ([`Controller::load`]) waits without a deadline:
//! shards open and recover their logs for as long as that takes, and the
//! broker is not ready before.
//!
//! With several voters (`--controller-quorum`, `docs/replication.md` §3.2)
//! the log is one member of a Raft group: a member loop on this shard
//! steps the peers' messages, ticks, writes off the reactor and applies
//! and broadcasts every committed record, wherever it was proposed, since
//! every node must hold the same image. A request then runs only on the
//! leader, is proposed, and is answered once the loop has applied it, or
//! REQUEST_TIMED_OUT at its deadline; an entry of another term at its
//! index means it was replaced, and is answered NOT_CONTROLLER.
//!
//! A node that does not lead forwards each request to the leader's
//! controller over the controller listener (`quorum::transport::forward`,
//! at most `FORWARDS_IN_FLIGHT_MAX` at once, within the request's
//! deadline); the leader runs it as its own and answers with the index it
//! has applied up to, and the forwarding node answers its requester once it
//! has applied as far, so the requester sees its change on that node too.
//! Not sent: NOT_CONTROLLER (nothing changed); sent without an answer:
//! REQUEST_TIMED_OUT (it may have been made).
//!
//! Broker registration and fencing (`docs/replication.md` §3.2): every
//! node, once its log has caught up, heartbeats the leader through the
//! same path every `broker_heartbeat_interval`; the first heartbeat of a
//! process registers it (`RegisterBroker`, with a fresh incarnation), a
//! heartbeat of a fenced node unfences it, any other is not logged. The
//! leader keeps heartbeat times in memory (a new leader starts every
//! registered node's clock at its election) and fences a node silent for
//! `--broker-session-timeout-ms`.

use super::messages::{
    ConfigChange, ControllerError, ControllerReply, ControllerRequest, NewTopic, ScramChange,
    ShardMessage,
};
use super::router::within;
use super::ShardCtx;
use crate::auth::acl::{AclBinding, AclBindingFilter, ACLS_MAX};
use crate::config::BrokerConfig;
use crate::log::partition_meta;
use crate::metadata::quorum::transport::{
    self, ForwardError, ForwardHandler, Handlers, Inbound, Members, Peers, FORWARDS_IN_FLIGHT_MAX,
    FORWARD_BYTES_MAX,
};
use crate::metadata::quorum::{ADDRESS_BYTES_MAX, LEARNERS_MAX};
use crate::metadata::store::MetadataLog;
use crate::metadata::{
    new_topic_id, next_leader_epoch, node_of, shard_of, topic_config, validate_topic_name,
    MetadataImage, MetadataRecord, PartitionState, PRODUCER_ID_BLOCK_SIZE,
};
use futures::channel::oneshot;
use futures::FutureExt;
use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};
use glommio::sync::Semaphore;
use raft::eraftpb::Message;
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

/// Largest partition count accepted for one topic, a guard against a request
/// that would open millions of logs.
pub const PARTITIONS_PER_TOPIC_MAX: i32 = 10_000;

/// Kafka's `default.replication.factor` default: the factor of a topic
/// created with -1 (auto-created topics included).
const DEFAULT_REPLICATION_FACTOR: i16 = 1;

pub struct Controller {
    config: Arc<BrokerConfig>,
    /// Held for the whole of a request (and of the start-up replay), so
    /// requests see each other's effects in order.
    lock: Semaphore,
    /// The controller's own, authoritative image: what the metadata log
    /// says. Shards (shard 0 included) serve from the copies broadcast to
    /// them; producer-id blocks change only this one.
    image: RefCell<Arc<MetadataImage>>,
    /// Shards that did not ack an image in time and are being sent the
    /// newest one in the background (see the module doc).
    lagging: RefCell<BTreeSet<usize>>,
    /// The metadata log (a Raft quorum of one, `metadata::store`): None
    /// before [`Self::load`], while a step of it runs on a blocking thread,
    /// and for good after it failed.
    log: RefCell<Option<MetadataLog>>,
    /// Held for every step of the log (a request's append, a tick's
    /// advance), so the log is taken out by one step at a time.
    log_lock: Semaphore,
    /// The metadata log failed: no change is accepted until a restart.
    log_failed: std::cell::Cell<bool>,
    /// Set when the quorum has other voters (`docs/replication.md` §3.2):
    /// the loop that runs the log with its peers.
    member: RefCell<Option<Member>>,
    /// This process's incarnation id (several nodes: its registration).
    incarnation: [u8; 16],
    /// Whether this process found the clean-shutdown marker at start
    /// (several nodes: its registration says so, `set_clean_start`).
    clean_start: std::cell::Cell<bool>,
}

/// The controller's side of a metadata quorum of several voters.
struct Member {
    /// This node's Raft id.
    me: u64,
    peers: Peers,
    /// Wakes the loop (peers' messages, and a proposal to advance).
    wake: Rc<LocalSender<Inbox>>,
    /// The index of the last committed record applied to the image and
    /// broadcast to the shards.
    applied: u64,
    /// This node's last proposal as leader: (term, index of its last
    /// entry). The first of a term is the leader's `LeaderEpoch`.
    proposed: (u64, u64),
    /// The controller address of every other voter and of every learner
    /// the log added, by Raft id (where requests are forwarded).
    addresses: HashMap<u64, String>,
    /// The Raft ids the controller listener takes handshakes from: the
    /// voters, and the learners once their addition is applied.
    members: Members,
    /// Requests being forwarded to the leader, at most
    /// [`FORWARDS_IN_FLIGHT_MAX`].
    forward_permits: Rc<Semaphore>,
    /// On the leader: when each node last heartbeat (not logged; a new
    /// leader starts every registered node's clock at its election).
    heartbeats: HashMap<i32, Instant>,
    /// Requests waiting for their proposal, by the index of its last entry,
    /// with its term. At most one, as requests run one at a time and a
    /// request is not started while an earlier proposal is not applied.
    waiters: BTreeMap<u64, (u64, oneshot::Sender<Result<(), ControllerError>>)>,
    /// The index of each node's last committed UnregisterBroker, from the
    /// log, while the node is unregistered: at most one entry per node in
    /// the image's `retired_epochs` (pruned to it as the image changes).
    unregistered_at: HashMap<i32, u64>,
    /// On the leader: the learner whose removal it proposed last, and
    /// when (another is proposed [`LEARNER_REMOVAL_RETRY`] later at the
    /// earliest).
    removal: Option<(u64, Instant)>,
    /// A learner: whether its join loop ([`Controller::start_join`]) runs.
    joining: Rc<std::cell::Cell<bool>>,
    /// On the leader: the leadership confirmations under way
    /// ([`Controller::confirm_leadership`]), by their context. Each is
    /// removed by its requester when it ends, answered or not, and every
    /// request runs under the request lock: at most one at a time.
    confirmations: HashMap<u64, oneshot::Sender<()>>,
    /// The context of the next leadership confirmation.
    next_confirmation: u64,
}

/// What the member loop is woken with.
enum Inbox {
    Message(Message),
    Wake,
}

/// Messages from peers (and wakes) queued for the loop, at most; more are
/// dropped (Raft retransmits).
const INBOX_MAX: usize = 1024;

/// A learner's request to be added to the quorum (`docs/replication.md`
/// §3.2), sent on a join connection (`transport::join`) by its Raft id.
#[derive(Serialize, Deserialize)]
struct JoinRequest {
    /// Its controller listener, `host:port`.
    address: String,
}

/// The answer to a [`JoinRequest`].
#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
enum JoinAnswer {
    /// The learner is in the committed membership at that address.
    Joined,
    /// This node does not lead: ask Raft id `id` (0: no leader known).
    Leader { id: u64 },
    /// Never made (a voter's id, a conflicting address, too many
    /// learners): the learner logs it and asks again only slowly.
    Refused { why: String },
    /// Not made yet (proposed but not committed within [`JOIN_WAIT`], a
    /// step running): ask again.
    Retry { why: String },
}

/// How long the leader waits for a learner's addition to commit before it
/// answers Retry.
const JOIN_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
/// A learner asks again this long after an answer that was not Joined
/// (and after no answer), doubling up to [`JOIN_RETRY_MAX`].
const JOIN_RETRY: std::time::Duration = std::time::Duration::from_millis(500);
const JOIN_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(10);

/// A learner that has heard nothing from the quorum's leader for this many
/// Raft ticks ([`RAFT_TICK`] each: 10 s) asks to join again: the quorum
/// may have removed it (its node was unregistered), and a removed learner
/// is sent nothing. Asking while still a member is answered Joined at once.
const REJOIN_QUIET_TICKS: usize = 100;
/// The leader proposes a learner's removal again after this long when the
/// last proposal did not take (lost with a leader change, or turned into
/// an empty entry by raft-rs while another membership change was pending).
const LEARNER_REMOVAL_RETRY: std::time::Duration = std::time::Duration::from_secs(2);

/// Clears a learner's `joining` flag when its join loop ends.
struct Joining(Rc<std::cell::Cell<bool>>);

impl Drop for Joining {
    fn drop(&mut self) {
        self.0.set(false);
    }
}

/// Notes the index of every UnregisterBroker among `records` (committed,
/// in log order) in `at`.
fn note_unregistrations(at: &mut HashMap<i32, u64>, records: &[(u64, MetadataRecord)]) {
    for (index, record) in records {
        if let MetadataRecord::UnregisterBroker { node } = record {
            at.insert(*node, *index);
        }
    }
}

/// The learners (Raft ids) the leader removes from the quorum: those whose
/// node is unregistered (in the image's `retired_epochs`: an
/// UnregisterBroker committed and no RegisterBroker since) by an
/// UnregisterBroker committed after the learner's addition. The rule is a
/// function of the committed log only, so every leader finds the same
/// learners (a removal lost with a leader change is proposed again by the
/// next); and a learner that joined after its node was unregistered (a
/// node coming back, not registered yet) is never one of them.
fn learners_to_remove(
    image: &MetadataImage,
    unregistered_at: &HashMap<i32, u64>,
    learners: impl Iterator<Item = (u64, u64)>,
) -> Vec<u64> {
    learners
        .filter(|&(id, added_at)| {
            let node = id as i64 - 1;
            i32::try_from(node).is_ok_and(|node| {
                image.retired_epochs.contains_key(&node)
                    && unregistered_at.get(&node).is_some_and(|&at| at > added_at)
            })
        })
        .map(|(id, _)| id)
        .collect()
}

/// Whether `address` looks like `host:port` (a port other than 0).
fn valid_address(address: &str) -> bool {
    address.len() <= ADDRESS_BYTES_MAX
        && address.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty()
                && !host.chars().any(|c| c.is_whitespace() || c.is_control())
                && port.parse::<u16>().is_ok_and(|p| p != 0)
        })
}

/// How long a request waits for a leader to be known before it is
/// answered NOT_CONTROLLER (an election takes about a second).
const LEADER_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// The longest a forwarded request may ask its leader to work on it (its
/// sender's deadline is `--cross-shard-timeout-ms` away at most; a larger
/// claim is cut to this).
const FORWARDED_TIMEOUT_MAX: std::time::Duration = std::time::Duration::from_secs(300);

/// Whether the leader takes `request` forwarded by Raft id `from`: never
/// a FenceBrokers (only the leader fences); a heartbeat only for the
/// sender's own node, with at most [`SHARDS_REGISTERED_MAX`] shards (broker
/// ids are node * 1000 + shard) and one endpoint per security protocol, so
/// what the leader keeps per node is bounded by the voters.
fn forwardable(request: &ControllerRequest, from: u64) -> Result<(), &'static str> {
    match request {
        ControllerRequest::FenceBrokers { .. } => Err("a FenceBrokers"),
        ControllerRequest::AlterPartition {
            broker,
            isr,
            broker_epochs,
            ..
        } => {
            if i64::from(node_of(*broker)) + 1 != from as i64 {
                Err("an AlterPartition for another node's broker")
            } else if isr.len() > REPLICAS_MAX || broker_epochs.len() > REPLICAS_MAX {
                Err("an AlterPartition with too many replicas")
            } else {
                Ok(())
            }
        }
        ControllerRequest::BrokerHeartbeat { registration: r } => {
            if r.node < 0 || i64::from(r.node) + 1 != from as i64 {
                Err("a heartbeat for another node")
            } else if r.shards == 0 || r.shards > SHARDS_REGISTERED_MAX {
                Err("a registration's shard count out of range")
            } else if r.endpoints.len() > ENDPOINTS_REGISTERED_MAX {
                Err("a registration with too many endpoints")
            } else {
                Ok(())
            }
        }
        _ => Ok(()),
    }
}

/// Most replicas an AlterPartition may name (one per node at most).
const REPLICAS_MAX: usize = 1000;

/// Most shards a node may register (its broker ids are node * 1000 + shard).
const SHARDS_REGISTERED_MAX: usize = 1000;
/// Most endpoints a node may register: one per security protocol
/// (PLAINTEXT, SASL_PLAINTEXT, SSL, SASL_SSL).
const ENDPOINTS_REGISTERED_MAX: usize = 4;

/// A request forwarded to the leader's controller.
#[derive(Serialize, Deserialize)]
struct Forwarded {
    /// How long its sender waits for the answer.
    timeout_ms: u64,
    request: ControllerRequest,
}

/// The leader's answer to a [`Forwarded`] request.
#[derive(Serialize, Deserialize)]
struct ForwardAnswer {
    /// The leader had applied the log up to here when it answered: the
    /// forwarding node answers once it has applied as far.
    index: u64,
    reply: Result<ControllerReply, ControllerError>,
}

/// How often the leader looks for nodes whose heartbeats stopped.
const FENCE_CHECK: std::time::Duration = std::time::Duration::from_millis(250);

/// How often the metadata log's Raft node ticks (`docs/replication.md` §2).
const RAFT_TICK: std::time::Duration = std::time::Duration::from_millis(100);

impl Controller {
    /// Whether this process started after a clean shutdown (`server`'s
    /// marker), told to the quorum in the node's registration.
    pub fn set_clean_start(&self, clean: bool) {
        self.clean_start.set(clean);
    }

    pub fn new(config: Arc<BrokerConfig>) -> Controller {
        Controller {
            config,
            lock: Semaphore::new(1),
            image: RefCell::new(Arc::new(MetadataImage::default())),
            lagging: RefCell::new(BTreeSet::new()),
            log: RefCell::new(None),
            log_lock: Semaphore::new(1),
            log_failed: std::cell::Cell::new(false),
            member: RefCell::new(None),
            incarnation: crate::metadata::process_incarnation(),
            clean_start: std::cell::Cell::new(true),
        }
    }

    /// Replays the metadata log, removes the partition directories of
    /// deleted topics (`log::partition_meta::sweep`) and sends the
    /// resulting image to every shard.
    pub async fn load(&self, ctx: &Rc<ShardCtx>) -> std::io::Result<()> {
        let _permit = self
            .lock
            .acquire_permit(1)
            .await
            .map_err(|_| std::io::Error::other("controller lock closed"))?;
        if self.config.several_nodes() {
            return self.load_member(ctx).await;
        }
        let dir = self.config.data_dir.clone();
        let (log, records) = glommio::executor()
            .spawn_blocking(move || MetadataLog::open(&dir))
            .await?;
        tracing::info!(path = %log.path().display(), "metadata log opened");
        *self.log.borrow_mut() = Some(log);
        let image = apply_all(&MetadataImage::default(), &records);
        // This start leads every partition in a new leader epoch, durable
        // before any shard opens a log and stamps it (`types::FIRST_LEADER_EPOCH`).
        let epoch = next_leader_epoch(&image, !records.is_empty());
        let committed = self
            .with_log(move |log| log.append(&[MetadataRecord::LeaderEpoch { epoch }]))
            .await?;
        let image = apply_all(&image, &committed);
        self.start_ticks(ctx);
        tracing::info!(
            records = records.len(),
            topics = image.topics.len(),
            leader_epoch = epoch,
            "metadata log replayed"
        );
        // Before any shard opens a log: directories of topics deleted while
        // the broker could not remove them (a crash) go (`log::partition_meta`).
        let live: HashSet<[u8; 16]> = image.topic_ids.keys().copied().collect();
        let dir = self.config.data_dir.clone();
        let removed = glommio::executor()
            .spawn_blocking(move || partition_meta::sweep(&dir, &live))
            .await;
        if !removed.is_empty() {
            tracing::info!(
                directories = removed.len(),
                "removed partition directories of deleted topics"
            );
        }
        let image = Arc::new(image);
        *self.image.borrow_mut() = image.clone();
        self.broadcast(ctx, image, None).await;
        Ok(())
    }

    /// Runs one request whose requester waits until `deadline` (see the
    /// module doc). Err: the request was not started and changed nothing,
    /// or (forwarded, TimedOut) may have been made. Several nodes: on a
    /// node that does not lead the quorum, the request is forwarded to the
    /// leader's controller ([`Self::forward`]).
    pub async fn handle(
        &self,
        ctx: &Rc<ShardCtx>,
        request: ControllerRequest,
        deadline: Instant,
    ) -> Result<ControllerReply, ControllerError> {
        if self.member.borrow().is_some() {
            if let Some(leader) = self.leader_elsewhere(deadline).await? {
                return self.forward(leader, request, deadline).await;
            }
        }
        self.handle_local(ctx, request, deadline).await
    }

    /// Runs one request on this node's controller: the single node's path,
    /// and the leader's (a forwarded request comes here and is never
    /// forwarded again; a node that does not lead answers NOT_CONTROLLER).
    async fn handle_local(
        &self,
        ctx: &Rc<ShardCtx>,
        request: ControllerRequest,
        deadline: Instant,
    ) -> Result<ControllerReply, ControllerError> {
        let not_started = || {
            ControllerError::TimedOut(format!(
                "The controller did not start the request within {} ms (--cross-shard-timeout-ms); nothing was changed.",
                ctx.router.timeout().as_millis()
            ))
        };
        let Some(permit) = within(deadline, self.lock.acquire_permit(1)).await else {
            return Err(not_started());
        };
        let Ok(_permit) = permit else {
            return Err(ControllerError::Unavailable);
        };
        if crate::clock::monotonic() >= deadline {
            return Err(not_started());
        }
        if self.member.borrow().is_some() {
            self.member_gate(deadline).await?;
        }
        let image = self.image.borrow().clone();
        let mut items = Vec::new();
        let mut records = Vec::new();
        let mut next = (*image).clone();
        let mut budget = PartitionBudget {
            request_left: self.config.create_topics_partitions_max,
            total: next
                .topics
                .values()
                .map(|t| t.partition_count() as i64)
                .sum(),
            total_max: self.config.partitions_max,
        };
        match request {
            ControllerRequest::CreateTopics {
                topics,
                validate_only,
            } => {
                for t in topics {
                    let name = t.name.clone();
                    let planned = self.plan_create(&next, &t).and_then(|record| {
                        let count = match &record {
                            MetadataRecord::CreateTopic { shards, .. } => shards.len() as i32,
                            _ => 0,
                        };
                        budget.take(count as i64)?;
                        Ok((record, count))
                    });
                    match planned {
                        Ok((record, count)) => {
                            if !validate_only {
                                next = next.apply(&record);
                                records.push(record);
                            }
                            items.push((name, Ok(count)));
                        }
                        Err(e) => items.push((name, Err(e))),
                    }
                }
            }
            ControllerRequest::DeleteTopics { names } => {
                for name in names {
                    if next.topic(&name).is_some() {
                        let record = MetadataRecord::DeleteTopic { name: name.clone() };
                        next = next.apply(&record);
                        records.push(record);
                        items.push((name, Ok(0)));
                    } else {
                        items.push((name.clone(), Err(ControllerError::UnknownTopic(name))));
                    }
                }
            }
            ControllerRequest::CreatePartitions {
                topics,
                validate_only,
                assignments,
            } => {
                for (name, count) in topics {
                    let manual = assignments
                        .iter()
                        .find(|(n, _)| *n == name)
                        .map(|(_, a)| a.as_slice());
                    let planned =
                        self.plan_partitions(&next, &name, count, manual)
                            .and_then(|record| {
                                if let MetadataRecord::AddPartitions { shards, .. } = &record {
                                    budget.take(shards.len() as i64)?;
                                }
                                Ok(record)
                            });
                    match planned {
                        Ok(record) => {
                            if !validate_only {
                                next = next.apply(&record);
                                records.push(record);
                            }
                            items.push((name, Ok(count)));
                        }
                        Err(e) => items.push((name, Err(e))),
                    }
                }
            }
            ControllerRequest::AllocateProducerIds => {
                let start = next.next_producer_id;
                let end = start + PRODUCER_ID_BLOCK_SIZE;
                let record = MetadataRecord::ProducerIdBlock { next: end };
                let committed = match self.persist(vec![record], deadline).await {
                    Ok(committed) => committed,
                    Err(e) => {
                        tracing::error!(error = %e, "persisting a producer id block failed");
                        return Ok(ControllerReply::ProducerIds(Err(persist_error(&e))));
                    }
                };
                // Only the controller's own image needs the new high-water
                // mark (several nodes: the member loop applied it).
                if let Some(committed) = committed {
                    *self.image.borrow_mut() = Arc::new(apply_all(&image, &committed));
                }
                return Ok(ControllerReply::ProducerIds(Ok(start..end)));
            }
            ControllerRequest::AlterScramCredentials { changes } => {
                for (name, change) in changes {
                    let record = match change {
                        ScramChange::Upsert {
                            mechanism,
                            credential,
                        } => Ok(MetadataRecord::UserScramCredential {
                            name: name.clone(),
                            mechanism,
                            credential,
                        }),
                        // Kafka's ScramControlManager.validateDeletion.
                        ScramChange::Delete { mechanism } => {
                            if next.scram_credential(&name, mechanism).is_some() {
                                Ok(MetadataRecord::RemoveUserScramCredential {
                                    name: name.clone(),
                                    mechanism,
                                })
                            } else {
                                Err(ControllerError::ResourceNotFound(
                                    "Attempt to delete a user credential that does not exist"
                                        .into(),
                                ))
                            }
                        }
                    };
                    match record {
                        Ok(record) => {
                            next = next.apply(&record);
                            records.push(record);
                            items.push((name, Ok(0)));
                        }
                        Err(e) => items.push((name, Err(e))),
                    }
                }
            }
            ControllerRequest::CreateAcls { acls } => {
                return Ok(self.create_acls(ctx, next, acls, deadline).await);
            }
            ControllerRequest::BrokerHeartbeat { registration } => {
                return Ok(self.heartbeat(&next, registration, deadline).await);
            }
            ControllerRequest::FenceBrokers { nodes } => {
                return Ok(self.fence(&next, nodes, deadline).await);
            }
            ControllerRequest::UnregisterBroker { broker } => {
                return Ok(self.unregister(&next, broker, deadline).await);
            }
            ControllerRequest::ElectLeaders { unclean, topics } => {
                let wanted: Vec<(String, Vec<i32>)> = match topics {
                    Some(topics) => topics,
                    None => next
                        .topics
                        .values()
                        .map(|t| (t.name.clone(), (0..t.partition_count()).collect()))
                        .collect(),
                };
                let several = self.member.borrow().is_some();
                let mut out = Vec::with_capacity(wanted.len());
                for (name, partitions) in wanted {
                    let mut results = Vec::with_capacity(partitions.len());
                    for p in partitions {
                        match plan_election(&next, several, &name, p, unclean) {
                            Ok(record) => {
                                next = next.apply(&record);
                                records.push(record);
                                results.push((p, Ok(())));
                            }
                            Err(e) => results.push((p, Err(e))),
                        }
                    }
                    out.push((name, results));
                }
                if !records.is_empty() {
                    tracing::info!(
                        changes = records.len(),
                        unclean,
                        "ElectLeaders: leaders change"
                    );
                    if let Err(e) = self.commit(ctx, &image, records, deadline).await {
                        for (_, results) in &mut out {
                            for (_, r) in results.iter_mut() {
                                if r.is_ok() {
                                    *r = Err(e.clone());
                                }
                            }
                        }
                    }
                }
                return Ok(ControllerReply::Elections(out));
            }
            ControllerRequest::AlterPartitionReassignments {
                allow_rf_change,
                topics,
            } => {
                let mut out = Vec::with_capacity(topics.len());
                for (name, partitions) in topics {
                    let mut results = Vec::with_capacity(partitions.len());
                    for (p, target) in partitions {
                        let planned =
                            plan_reassignment(&next, &name, p, target.as_deref(), allow_rf_change);
                        match planned {
                            Ok(Some(record)) => {
                                next = next.apply(&record);
                                records.push(record);
                                results.push((p, Ok(())));
                            }
                            Ok(None) => results.push((p, Ok(()))),
                            Err(e) => results.push((p, Err(e))),
                        }
                    }
                    out.push((name, results));
                }
                if !records.is_empty() {
                    tracing::info!(
                        changes = records.len(),
                        "AlterPartitionReassignments: replicas change"
                    );
                    if let Err(e) = self.commit(ctx, &image, records, deadline).await {
                        for (_, results) in &mut out {
                            for (_, r) in results.iter_mut() {
                                if r.is_ok() {
                                    *r = Err(e.clone());
                                }
                            }
                        }
                    }
                }
                return Ok(ControllerReply::Reassignments(out));
            }
            ControllerRequest::AlterPartition {
                broker,
                topic_id,
                partition,
                leader_epoch,
                partition_epoch,
                isr,
                broker_epochs,
            } => {
                let change = AlterPartition {
                    broker,
                    topic_id,
                    partition,
                    leader_epoch,
                    partition_epoch,
                    isr,
                    broker_epochs,
                };
                let planned = plan_alter_partition(&next, &self.config, &change);
                let (record, state) = match planned {
                    Ok(Some((record, state))) => (record, state),
                    Ok(None) => {
                        let state = next
                            .topic_by_id(&topic_id)
                            .and_then(|t| t.replica_state(partition))
                            .cloned();
                        return Ok(ControllerReply::Partition(state.ok_or_else(|| {
                            ControllerError::UnknownTopicId("The topic is gone.".into())
                        })));
                    }
                    Err(e) => return Ok(ControllerReply::Partition(Err(e))),
                };
                let topic = next.topic_by_id(&topic_id).map_or("", |t| t.name.as_str());
                tracing::info!(broker, topic, partition, isr = ?state.isr, elr = ?state.elr, "AlterPartition: the ISR changes");
                return Ok(ControllerReply::Partition(
                    self.commit(ctx, &image, vec![record], deadline)
                        .await
                        .map(|()| state),
                ));
            }
            ControllerRequest::DeleteAcls { filters } => {
                return Ok(self.delete_acls(ctx, next, filters, deadline).await);
            }
            ControllerRequest::AlterConfigs {
                changes,
                validate_only,
            } => {
                for (name, change) in changes {
                    match plan_configs(&next, &name, change, &self.config) {
                        Ok(record) => {
                            if !validate_only {
                                next = next.apply(&record);
                                records.push(record);
                            }
                            items.push((name, Ok(0)));
                        }
                        Err(e) => items.push((name, Err(e))),
                    }
                }
            }
        }
        if records.is_empty() {
            return Ok(ControllerReply::Items(items));
        }
        // `next` was the plan; the image is what the log committed.
        let committed = match self.persist(records, deadline).await {
            Ok(Some(committed)) => committed,
            // Several nodes: applied and broadcast by the member loop.
            Ok(None) => return Ok(ControllerReply::Items(items)),
            Err(e) => {
                tracing::error!(error = %e, "metadata log append failed");
                let err = persist_error(&e);
                let items = items
                    .into_iter()
                    .map(|(n, r)| (n, r.and(Err(err.clone()))))
                    .collect();
                return Ok(ControllerReply::Items(items));
            }
        };
        let next = Arc::new(apply_all(&image, &committed));
        *self.image.borrow_mut() = next.clone();
        let late = self.broadcast(ctx, next, Some(deadline)).await;
        if late.is_empty() {
            return Ok(ControllerReply::Items(items));
        }
        let msg = format!(
            "The change is saved, but shard(s) {late:?} did not apply it within {} ms (--cross-shard-timeout-ms); they will.",
            ctx.router.timeout().as_millis()
        );
        let items = items
            .into_iter()
            .map(|(n, r)| (n, r.and(Err(ControllerError::TimedOut(msg.clone())))))
            .collect();
        Ok(ControllerReply::Items(items))
    }

    /// Persists `records` planned on `image` and, on a single node, applies
    /// them and broadcasts the image (several nodes: the member loop does).
    /// Ok once every shard has it; a shard late is TimedOut (the change is
    /// made and will reach it).
    async fn commit(
        &self,
        ctx: &Rc<ShardCtx>,
        image: &MetadataImage,
        records: Vec<MetadataRecord>,
        deadline: Instant,
    ) -> Result<(), ControllerError> {
        let committed = match self.persist(records, deadline).await {
            Ok(Some(committed)) => committed,
            Ok(None) => return Ok(()),
            Err(e) => return Err(persist_error(&e)),
        };
        let next = Arc::new(apply_all(image, &committed));
        *self.image.borrow_mut() = next.clone();
        let late = self.broadcast(ctx, next, Some(deadline)).await;
        if late.is_empty() {
            return Ok(());
        }
        Err(ControllerError::TimedOut(format!(
            "The change is saved, but shard(s) {late:?} did not apply it within {} ms (--cross-shard-timeout-ms); they will.",
            ctx.router.timeout().as_millis()
        )))
    }

    /// CreateAcls: each binding is added unless present (a no-op success,
    /// as in Kafka's `AclControlManager`), up to [`ACLS_MAX`] in all.
    async fn create_acls(
        &self,
        ctx: &Rc<ShardCtx>,
        image: MetadataImage,
        acls: Vec<AclBinding>,
        deadline: Instant,
    ) -> ControllerReply {
        let mut added: Vec<AclBinding> = Vec::new();
        let mut results = Vec::with_capacity(acls.len());
        for b in acls {
            if image.acls.contains(&b) || added.contains(&b) {
                results.push(Ok(Vec::new()));
            } else if image.acls.len() + added.len() >= ACLS_MAX {
                results.push(Err(ControllerError::InvalidRequest(format!(
                    "The broker holds {ACLS_MAX} ACLs, its limit; delete some first."
                ))));
            } else {
                added.push(b);
                results.push(Ok(Vec::new()));
            }
        }
        if added.is_empty() {
            return ControllerReply::Acls(results);
        }
        let record = MetadataRecord::CreateAcls { acls: added };
        self.commit_acls(ctx, image, record, results, deadline)
            .await
    }

    /// DeleteAcls: per filter, the bindings it matches are removed (a
    /// binding two filters match is removed once, and reported by the
    /// first).
    async fn delete_acls(
        &self,
        ctx: &Rc<ShardCtx>,
        image: MetadataImage,
        filters: Vec<AclBindingFilter>,
        deadline: Instant,
    ) -> ControllerReply {
        let mut removed: BTreeSet<AclBinding> = BTreeSet::new();
        let mut results = Vec::with_capacity(filters.len());
        for f in filters {
            if let Err(e) = f.validate() {
                results.push(Err(ControllerError::InvalidRequest(e)));
                continue;
            }
            let matched: Vec<AclBinding> = image
                .acls
                .matching(&f)
                .filter(|b| !removed.contains(*b))
                .cloned()
                .collect();
            removed.extend(matched.iter().cloned());
            results.push(Ok(matched));
        }
        if removed.is_empty() {
            return ControllerReply::Acls(results);
        }
        let record = MetadataRecord::DeleteAcls {
            acls: removed.into_iter().collect(),
        };
        self.commit_acls(ctx, image, record, results, deadline)
            .await
    }

    /// Persists one ACL record, broadcasts the image, and turns the
    /// successes of `results` into errors if either step failed.
    async fn commit_acls(
        &self,
        ctx: &Rc<ShardCtx>,
        image: MetadataImage,
        record: MetadataRecord,
        results: Vec<Result<Vec<AclBinding>, ControllerError>>,
        deadline: Instant,
    ) -> ControllerReply {
        let fail = |results: Vec<Result<Vec<AclBinding>, ControllerError>>, e: ControllerError| {
            ControllerReply::Acls(results.into_iter().map(|r| r.and(Err(e.clone()))).collect())
        };
        let committed = match self.persist(vec![record], deadline).await {
            Ok(Some(committed)) => committed,
            Ok(None) => return ControllerReply::Acls(results),
            Err(e) => {
                tracing::error!(error = %e, "metadata log append failed");
                return fail(results, persist_error(&e));
            }
        };
        let next = Arc::new(apply_all(&image, &committed));
        *self.image.borrow_mut() = next.clone();
        let late = self.broadcast(ctx, next, Some(deadline)).await;
        if late.is_empty() {
            return ControllerReply::Acls(results);
        }
        let msg = format!(
            "The change is saved, but shard(s) {late:?} did not apply it within {} ms (--cross-shard-timeout-ms); they will.",
            ctx.router.timeout().as_millis()
        );
        fail(results, ControllerError::TimedOut(msg))
    }

    /// Proposes `records` to the metadata log and returns what it
    /// committed (those records, in order), to be applied to the image.
    /// Several nodes: proposes them and waits, until `deadline`, for the
    /// member loop to apply and broadcast them; None then (see
    /// [`persist_error`] for the errors).
    async fn persist(
        &self,
        records: Vec<MetadataRecord>,
        deadline: Instant,
    ) -> std::io::Result<Option<Vec<MetadataRecord>>> {
        if self.member.borrow().is_none() {
            return self
                .with_log(move |log| log.append(&records))
                .await
                .map(Some);
        }
        let done = self.propose_member(&records).await?;
        match within(deadline, done).await {
            Some(Ok(Ok(()))) => Ok(None),
            Some(Ok(Err(e))) => Err(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                e.to_string(),
            )),
            Some(Err(_)) => Err(std::io::Error::other(
                "the metadata log failed before the change was committed",
            )),
            None => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "The change was proposed but not committed by the metadata quorum in time; it may or may not be made.",
            )),
        }
    }

    /// Proposes `records` (this node must lead) and registers a waiter
    /// for them; wakes the loop to write and send them.
    async fn propose_member(
        &self,
        records: &[MetadataRecord],
    ) -> std::io::Result<oneshot::Receiver<Result<(), ControllerError>>> {
        let (target, term) = self
            .on_log(|log| {
                let target = log.propose(records)?;
                Ok((target, log.term()))
            })
            .await?;
        let (tx, rx) = oneshot::channel();
        let mut member = self.member.borrow_mut();
        let member = member.as_mut().expect("several nodes");
        member.proposed = (term, target);
        member.waiters.insert(target, (term, tx));
        let _ = member.wake.try_send(Inbox::Wake);
        Ok(rx)
    }

    /// Runs a step of the log that does no I/O (propose, step, tick) on
    /// the reactor, between the steps [`Self::with_log`] runs off it.
    async fn on_log<R>(
        &self,
        step: impl FnOnce(&mut MetadataLog) -> std::io::Result<R>,
    ) -> std::io::Result<R> {
        let _permit = self
            .log_lock
            .acquire_permit(1)
            .await
            .map_err(|_| std::io::Error::other("metadata log lock closed"))?;
        let mut log = self.log.borrow_mut();
        let Some(log) = log.as_mut() else {
            return Err(std::io::Error::other(
                "the metadata log failed earlier; no metadata change is accepted until the broker restarts",
            ));
        };
        step(log)
    }

    /// The leader's side of a node's heartbeat (`docs/replication.md`
    /// §3.2): its time is noted (in memory only); a node not registered
    /// with this incarnation, endpoints and shards is registered, a fenced
    /// one unfenced, through the log; anything else logs nothing.
    async fn heartbeat(
        &self,
        image: &MetadataImage,
        registration: crate::metadata::BrokerRegistration,
        deadline: Instant,
    ) -> ControllerReply {
        let node = registration.node;
        {
            let mut member = self.member.borrow_mut();
            let Some(m) = member.as_mut() else {
                return ControllerReply::Broker(Err(ControllerError::InvalidRequest(
                    "A single node takes no broker heartbeats.".into(),
                )));
            };
            m.heartbeats.insert(node, crate::clock::monotonic());
        }
        let Some(records) = heartbeat_records(image, registration, &self.config) else {
            // Answered once a majority confirmed, after the heartbeat came,
            // that this node still leads: the answer renews the node's
            // lease (`metadata::lease`).
            return ControllerReply::Broker(self.confirm_leadership(deadline).await);
        };
        tracing::info!(node, change = ?records[0], "metadata quorum: a node registers or comes back");
        // A commit confirms the lead as well.
        ControllerReply::Broker(match self.persist(records, deadline).await {
            Ok(_) => Ok(()),
            Err(e) => Err(persist_error(&e)),
        })
    }

    /// Several nodes, on the leader: resolves once a majority of the
    /// quorum confirmed, after this call, that this node still leads it
    /// (`QuorumNode::confirm_leadership`); NOT_CONTROLLER at `deadline`
    /// (it lost the lead, or cannot reach a majority).
    async fn confirm_leadership(&self, deadline: Instant) -> Result<(), ControllerError> {
        let (tx, rx) = oneshot::channel();
        let context = {
            let mut member = self.member.borrow_mut();
            let m = member.as_mut().expect("several nodes");
            m.next_confirmation += 1;
            m.confirmations.insert(m.next_confirmation, tx);
            m.next_confirmation
        };
        let started = self
            .on_log(|log| {
                log.confirm_leadership(context);
                Ok(())
            })
            .await;
        if let Some(m) = self.member.borrow().as_ref() {
            let _ = m.wake.try_send(Inbox::Wake);
        }
        let confirmed = match started {
            Ok(()) => matches!(within(deadline, rx).await, Some(Ok(()))),
            Err(_) => false,
        };
        if let Some(m) = self.member.borrow_mut().as_mut() {
            m.confirmations.remove(&context);
        }
        if confirmed {
            Ok(())
        } else {
            Err(ControllerError::NotController(
                "This node could not confirm that it still leads the metadata quorum; the heartbeat renews nothing.".into(),
            ))
        }
    }

    /// Fences those of `nodes` that are registered, unfenced and still
    /// silent for the session timeout (checked again under the request
    /// lock: a heartbeat may have come meanwhile).
    async fn fence(
        &self,
        image: &MetadataImage,
        nodes: Vec<i32>,
        deadline: Instant,
    ) -> ControllerReply {
        let silent = self.silent_nodes(image);
        let nodes: Vec<i32> = nodes.into_iter().filter(|n| silent.contains(n)).collect();
        let records = fence_records(image, &nodes, &self.config);
        if records.is_empty() {
            return ControllerReply::Broker(Ok(()));
        }
        tracing::warn!(
            fenced = ?records,
            session_timeout_ms = self.config.broker_session_timeout_ms,
            "metadata quorum: fencing nodes whose heartbeats stopped"
        );
        ControllerReply::Broker(match self.persist(records, deadline).await {
            Ok(_) => Ok(()),
            Err(e) => Err(persist_error(&e)),
        })
    }

    /// Kafka's UnregisterBroker on the leader (`docs/replication.md`
    /// §3.2): the node of broker `broker` is unregistered and its
    /// partitions reconciled as a fenced node's are
    /// ([`unregister_records`]), answered once committed and applied. A
    /// single node keeps no registrations: its own broker ids are
    /// answered done with nothing to change (Kafka's combined node would
    /// register again with its next heartbeat), any other
    /// BROKER_ID_NOT_REGISTERED.
    async fn unregister(
        &self,
        image: &MetadataImage,
        broker: i32,
        deadline: Instant,
    ) -> ControllerReply {
        if self.member.borrow().is_none() {
            let own = (0..self.config.cores).any(|s| self.config.node_id_of(s) == broker);
            return ControllerReply::Broker(if own {
                Ok(())
            } else {
                Err(not_registered(broker))
            });
        }
        let records = match unregister_records(image, broker, &self.config) {
            Ok(records) => records,
            Err(e) => return ControllerReply::Broker(Err(e)),
        };
        tracing::warn!(
            broker,
            node = node_of(broker),
            partition_changes = records.len() - 1,
            "metadata quorum: unregistering a node (UnregisterBroker)"
        );
        ControllerReply::Broker(match self.persist(records, deadline).await {
            Ok(_) => Ok(()),
            Err(e) => Err(persist_error(&e)),
        })
    }

    /// The registered, unfenced nodes the leader has not heard from for
    /// the session timeout (every node's clock starts at this leader's
    /// election, or at its first heartbeat after it).
    fn silent_nodes(&self, image: &MetadataImage) -> Vec<i32> {
        let member = self.member.borrow();
        let Some(m) = member.as_ref() else {
            return Vec::new();
        };
        let now = crate::clock::monotonic();
        let timeout = self.config.broker_session_timeout();
        image
            .brokers
            .iter()
            .filter(|(_, b)| !b.fenced)
            .map(|(n, _)| *n)
            .filter(|n| {
                m.heartbeats
                    .get(n)
                    .is_some_and(|t| now.saturating_duration_since(*t) >= timeout)
            })
            .collect()
    }

    /// Several nodes: this node's registration (its brokers' endpoints
    /// per listener, and this process's incarnation).
    fn registration(&self) -> crate::metadata::BrokerRegistration {
        crate::metadata::BrokerRegistration {
            node: self.config.node_id,
            shards: self.config.cores,
            endpoints: self
                .config
                .listeners
                .iter()
                .map(|l| crate::metadata::BrokerEndpoint {
                    protocol: l.protocol.name().to_string(),
                    host: l.advertised_host.clone(),
                    port: l.port,
                })
                .collect(),
            incarnation: self.incarnation,
            leader_epoch: self.image.borrow().leader_epoch(),
            clean_shutdown: self.clean_start.get(),
        }
    }

    /// Several nodes: heartbeats the quorum's leader every
    /// `broker_heartbeat_interval` once this node's log has caught up
    /// (a leader is known and every entry it knows committed is applied);
    /// the first heartbeat of this process registers it.
    fn start_heartbeats(&self, ctx: &Rc<ShardCtx>) {
        let ctx = Rc::downgrade(ctx);
        let interval = self.config.broker_heartbeat_interval();
        glommio::spawn_local(async move {
            // Whether the lease held at the last look (logged as it changes).
            let mut held = false;
            loop {
                glommio::timer::sleep(interval).await;
                let Some(ctx) = ctx.upgrade() else { break };
                let holds = ctx.lease.holds(&ctx.image());
                if holds != held {
                    held = holds;
                    if holds {
                        tracing::info!("this node's lease holds: it acts as the leader and coordinator its metadata names it");
                    } else {
                        tracing::warn!(
                            session_timeout_ms = ctx.config.broker_session_timeout_ms,
                            "this node's lease ran out (no heartbeat answered by the metadata quorum's leader within the session timeout): it leads and coordinates nothing until one is"
                        );
                    }
                }
                let Some(controller) = ctx.controller.as_ref() else {
                    break;
                };
                if controller.log_failed.get() {
                    break;
                }
                let caught_up = {
                    let log = controller.log.borrow();
                    let member = controller.member.borrow();
                    match (log.as_ref(), member.as_ref()) {
                        (Some(log), Some(m)) => {
                            log.leader_id() != 0 && m.applied >= log.commit_index()
                        }
                        _ => false,
                    }
                };
                if !caught_up {
                    continue;
                }
                let request = ControllerRequest::BrokerHeartbeat {
                    registration: controller.registration(),
                };
                let session = controller.config.broker_session_timeout();
                let sent = crate::clock::monotonic();
                let deadline = sent + ctx.router.timeout().min(session);
                match controller.handle(&ctx, request, deadline).await {
                    // Answered by the quorum's leader, and applied here as
                    // far as it had applied then (`forward`): the lease
                    // runs from the send time.
                    Ok(ControllerReply::Broker(Ok(()))) => {
                        let version = controller.image.borrow().version;
                        ctx.lease.renew(sent, session, version);
                    }
                    Ok(ControllerReply::Broker(Err(e))) | Err(e) => {
                        tracing::debug!(error = %e, "metadata quorum: a heartbeat failed");
                    }
                    Ok(other) => tracing::warn!(reply = ?other, "metadata quorum: an unexpected heartbeat answer"),
                }
            }
        })
        .detach();
    }

    /// Several nodes: on the leader, fences the nodes silent for the
    /// session timeout, looking every [`FENCE_CHECK`].
    fn start_fencing(&self, ctx: &Rc<ShardCtx>) {
        let ctx = Rc::downgrade(ctx);
        glommio::spawn_local(async move {
            loop {
                glommio::timer::sleep(FENCE_CHECK).await;
                let Some(ctx) = ctx.upgrade() else { break };
                let Some(controller) = ctx.controller.as_ref() else {
                    break;
                };
                if controller.log_failed.get() {
                    break;
                }
                let leading = controller.log.borrow().as_ref().is_some_and(|l| l.is_leader());
                if !leading {
                    continue;
                }
                let silent = controller.silent_nodes(&controller.image.borrow());
                if silent.is_empty() {
                    continue;
                }
                let deadline = crate::clock::monotonic() + ctx.router.timeout();
                let request = ControllerRequest::FenceBrokers { nodes: silent };
                match controller.handle_local(&ctx, request, deadline).await {
                    Ok(ControllerReply::Broker(Ok(()))) => {}
                    Ok(ControllerReply::Broker(Err(e))) | Err(e) => {
                        tracing::warn!(error = %e, "metadata quorum: fencing failed");
                    }
                    Ok(other) => tracing::warn!(reply = ?other, "metadata quorum: an unexpected fencing answer"),
                }
            }
        })
        .detach();
    }

    /// Several nodes: the leader to forward a request to (its Raft id and
    /// controller address), or None when this node leads. With no leader
    /// known, waits for one up to [`LEADER_WAIT`] (and `deadline`), then
    /// NOT_CONTROLLER: nothing was sent.
    async fn leader_elsewhere(
        &self,
        deadline: Instant,
    ) -> Result<Option<(u64, String)>, ControllerError> {
        let give_up = deadline.min(crate::clock::monotonic() + LEADER_WAIT);
        loop {
            let known = self
                .log
                .borrow()
                .as_ref()
                .map(|log| (log.is_leader(), log.leader_id()));
            match known {
                Some((true, _)) => return Ok(None),
                Some((false, leader)) if leader != 0 => {
                    let member = self.member.borrow();
                    let m = member.as_ref().expect("several nodes");
                    if let Some(addr) = m.addresses.get(&leader) {
                        return Ok(Some((leader, addr.clone())));
                    }
                }
                // No leader known, or a step runs off the reactor.
                _ if self.log_failed.get() => return Ok(None),
                _ => {}
            }
            if crate::clock::monotonic() >= give_up {
                return Err(ControllerError::NotController(
                    "No node leads the metadata quorum at the moment (an election is under way, or this node is cut off from the others); nothing was changed.".into(),
                ));
            }
            glommio::timer::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// Forwards `request` to the leader's controller (`docs/replication.md`
    /// §3.2) and answers with its answer once this node has applied the
    /// leader's log up to the index the answer names, so the requester
    /// sees its change here. Not sent (no connection): NOT_CONTROLLER, the
    /// client retries. Sent without an answer by `deadline`:
    /// REQUEST_TIMED_OUT, it may have been made. Answered but not applied
    /// here by `deadline`: the successes become REQUEST_TIMED_OUT (made,
    /// and this node will apply it).
    async fn forward(
        &self,
        (to, addr): (u64, String),
        request: ControllerRequest,
        deadline: Instant,
    ) -> Result<ControllerReply, ControllerError> {
        let (me, permits) = {
            let member = self.member.borrow();
            let m = member.as_ref().expect("several nodes");
            (m.me, m.forward_permits.clone())
        };
        let leader_node = to - 1;
        let Some(Ok(_permit)) = within(deadline, permits.acquire_permit(1)).await else {
            return Err(ControllerError::TimedOut(format!(
                "{FORWARDS_IN_FLIGHT_MAX} metadata changes were being forwarded to the quorum's leader (node {leader_node}) until the deadline; this one was not sent."
            )));
        };
        let timeout_ms = deadline
            .saturating_duration_since(crate::clock::monotonic())
            .as_millis() as u64;
        let payload = serde_json::to_vec(&Forwarded {
            timeout_ms,
            request,
        })
        .map_err(|e| ControllerError::InvalidRequest(e.to_string()))?;
        if payload.len() > FORWARD_BYTES_MAX {
            return Err(ControllerError::InvalidRequest(format!(
                "The change takes {} bytes, over the {FORWARD_BYTES_MAX} a forwarded metadata change may take.",
                payload.len()
            )));
        }
        let answer = match transport::forward(me, to, &addr, &payload, deadline).await {
            Ok(bytes) => bytes,
            Err(ForwardError::NotSent(why)) => {
                return Err(ControllerError::NotController(format!(
                    "This node does not lead the metadata quorum and could not reach node {leader_node}, which does ({why}); nothing was changed."
                )))
            }
            Err(ForwardError::NoAnswer(why)) => {
                return Err(ControllerError::TimedOut(format!(
                    "The change was forwarded to node {leader_node}, which leads the metadata quorum, but no answer came ({why}); it may or may not be made."
                )))
            }
        };
        let answer: ForwardAnswer = serde_json::from_slice(&answer).map_err(|e| {
            tracing::warn!(node = leader_node, error = %e, "metadata quorum: an undecodable answer to a forwarded request");
            ControllerError::TimedOut(format!(
                "Node {leader_node} answered the forwarded change undecodably; it may or may not be made."
            ))
        })?;
        let reply = answer.reply?;
        if self.wait_applied(answer.index, deadline).await {
            return Ok(reply);
        }
        let late = ControllerError::TimedOut(format!(
            "Node {leader_node}, which leads the metadata quorum, made the change, but this node had not applied it by the deadline; it will."
        ));
        Ok(match reply {
            ControllerReply::Items(items) => ControllerReply::Items(
                items
                    .into_iter()
                    .map(|(n, r)| (n, r.and(Err(late.clone()))))
                    .collect(),
            ),
            ControllerReply::Acls(results) => ControllerReply::Acls(
                results
                    .into_iter()
                    .map(|r| r.and(Err(late.clone())))
                    .collect(),
            ),
            // Not applied here yet: a heartbeat's answer renews no lease
            // (`metadata::lease`).
            ControllerReply::Broker(Ok(())) => ControllerReply::Broker(Err(late)),
            // A block handed out by the log is this node's whatever its
            // image says.
            other => other,
        })
    }

    /// Waits until this node has applied the metadata log up to `index`,
    /// at most until `deadline`; whether it has.
    async fn wait_applied(&self, index: u64, deadline: Instant) -> bool {
        loop {
            let applied = self.member.borrow().as_ref().map_or(0, |m| m.applied);
            if applied >= index {
                return true;
            }
            if crate::clock::monotonic() >= deadline {
                return false;
            }
            glommio::timer::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    /// The leader's side of forwarding: the handler the controller
    /// listener gives each forwarded request (`quorum::transport`). A
    /// request that does not decode closes its connection; one that does
    /// runs as a local request ([`Self::handle_local`]) within the
    /// requester's remaining time, and is answered with the index this
    /// node has applied up to, which covers the change.
    fn forward_handler(ctx: &Rc<ShardCtx>) -> ForwardHandler {
        let ctx = Rc::downgrade(ctx);
        Rc::new(move |from, bytes| {
            let ctx = ctx.clone();
            Box::pin(async move {
                let forwarded: Forwarded = match serde_json::from_slice(&bytes) {
                    Ok(f) => f,
                    Err(e) => {
                        tracing::warn!(node = from - 1, error = %e, "metadata quorum: an undecodable forwarded request; its connection is closed");
                        return None;
                    }
                };
                if let Err(why) = forwardable(&forwarded.request, from) {
                    tracing::warn!(
                        node = from - 1,
                        why,
                        "metadata quorum: a forwarded request refused; its connection is closed"
                    );
                    return None;
                }
                let ctx = ctx.upgrade()?;
                let controller = ctx.controller.as_ref()?;
                let timeout = std::time::Duration::from_millis(forwarded.timeout_ms)
                    .min(FORWARDED_TIMEOUT_MAX);
                let deadline = crate::clock::monotonic() + timeout;
                let reply = controller
                    .handle_local(&ctx, forwarded.request, deadline)
                    .await;
                let index = controller.member.borrow().as_ref().map_or(0, |m| m.applied);
                serde_json::to_vec(&ForwardAnswer { index, reply }).ok()
            })
        })
    }

    /// Several nodes: a request starts only on the leader, once its term's
    /// first entry and its own last proposal are applied (so it validates
    /// against an image that holds every committed change). Err, nothing
    /// changed: NOT_CONTROLLER on a node that does not lead, TimedOut when
    /// the leader is not ready by `deadline`.
    async fn member_gate(&self, deadline: Instant) -> Result<(), ControllerError> {
        loop {
            let (leader, term, leading) = {
                let log = self.log.borrow();
                match log.as_ref() {
                    Some(log) => (log.leader_id(), log.term(), log.is_leader()),
                    // A step runs off the reactor: look again shortly.
                    None if !self.log_failed.get() => (u64::MAX, 0, false),
                    None => {
                        return Err(ControllerError::Storage(
                            "the metadata log failed earlier; no metadata change is accepted until the broker restarts".into(),
                        ))
                    }
                }
            };
            if leader != u64::MAX && !leading {
                let node = if leader == 0 {
                    "no leader is known".to_string()
                } else {
                    format!("node {} leads it", leader - 1)
                };
                return Err(ControllerError::NotController(format!(
                    "This node does not lead the metadata quorum ({node}); nothing was changed."
                )));
            }
            if leading {
                let member = self.member.borrow();
                let m = member.as_ref().expect("several nodes");
                if m.proposed.0 == term && m.applied >= m.proposed.1 {
                    return Ok(());
                }
            }
            if crate::clock::monotonic() >= deadline {
                return Err(ControllerError::TimedOut(
                    "This node leads the metadata quorum but has not yet applied every committed change; nothing was changed.".into(),
                ));
            }
            glommio::timer::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// Several nodes: opens the log as a member, applies what it holds,
    /// sends the image to every shard and starts the transport and the
    /// member loop (`docs/replication.md` §3.2).
    async fn load_member(&self, ctx: &Rc<ShardCtx>) -> std::io::Result<()> {
        let q = self.config.quorum.clone().expect("several nodes");
        let me = q.node_id as u64 + 1;
        let voters: Vec<u64> = q.voters.iter().map(|v| v.node_id as u64 + 1).collect();
        let learner = !q.is_voter();
        let dir = self.config.data_dir.clone();
        let members = voters.clone();
        let (log, records) = glommio::executor()
            .spawn_blocking(move || MetadataLog::open_member(&dir, me, members, learner))
            .await?;
        tracing::info!(path = %log.path().display(), node = q.node_id, voters = ?voters, learner, "metadata log opened as a member of the quorum");
        let learners = log.learners().clone();
        let applied = log.applied_index();
        *self.log.borrow_mut() = Some(log);
        let mut unregistered_at = HashMap::new();
        note_unregistrations(&mut unregistered_at, &records);
        let records: Vec<MetadataRecord> = records.into_iter().map(|(_, r)| r).collect();
        let mut image = apply_all(&MetadataImage::default(), &records);
        unregistered_at.retain(|node, _| image.retired_epochs.contains_key(node));
        // This start leads this node's partitions in a new epoch: one more
        // than its last registration's (the image's epoch is this node's
        // own from here on; TermStart records leave it alone).
        let epoch = member_start_epoch(&image, q.node_id);
        image.leader_epoch = Some(epoch);
        tracing::info!(
            records = records.len(),
            topics = image.topics.len(),
            leader_epoch = epoch,
            "metadata log replayed"
        );
        let mut addresses: Vec<(u64, String)> = q
            .voters
            .iter()
            .map(|v| (v.node_id as u64 + 1, format!("{}:{}", v.host, v.port)))
            .collect();
        addresses.extend(learners.iter().map(|(id, a)| (*id, a.clone())));
        let listener = glommio::net::TcpListener::bind(format!("{}:{}", q.listen.0, q.listen.1))
            .map_err(|e| {
                std::io::Error::other(format!(
                    "cannot listen for the metadata quorum on {}:{}: {e}",
                    q.listen.0, q.listen.1
                ))
            })?;
        let (tx, rx) = local_channel::new_bounded::<Inbox>(INBOX_MAX);
        let tx = Rc::new(tx);
        let deliver_tx = tx.clone();
        let deliver: Rc<dyn Fn(Message)> = Rc::new(move |m| {
            let _ = deliver_tx.try_send(Inbox::Message(m));
        });
        let handlers = Handlers::new(deliver, Some(Self::forward_handler(ctx)))
            .with_join(Self::join_handler(ctx));
        let members: Members = Rc::new(RefCell::new(
            voters.iter().chain(learners.keys()).copied().collect(),
        ));
        glommio::spawn_local(Inbound::serve(listener, me, members.clone(), handlers)).detach();
        *self.member.borrow_mut() = Some(Member {
            me,
            peers: Peers::start(me, &addresses),
            addresses: addresses.iter().cloned().collect(),
            members,
            forward_permits: Rc::new(Semaphore::new(FORWARDS_IN_FLIGHT_MAX as u64)),
            heartbeats: HashMap::new(),
            wake: tx,
            applied,
            proposed: (0, 0),
            waiters: BTreeMap::new(),
            unregistered_at,
            removal: None,
            joining: Rc::new(std::cell::Cell::new(false)),
            confirmations: HashMap::new(),
            next_confirmation: 0,
        });
        let image = Arc::new(image);
        *self.image.borrow_mut() = image.clone();
        self.broadcast(ctx, image, None).await;
        self.start_member_loop(ctx, rx);
        self.start_heartbeats(ctx);
        self.start_fencing(ctx);
        if learner {
            self.start_join(ctx, format!("{}:{}", q.listen.0, q.listen.1));
        }
        Ok(())
    }

    /// A learner: asks the quorum's leader to add it
    /// (`docs/replication.md` §3.2) until the answer is Joined, the leader
    /// it knows of first, else each voter in turn (a voter that does not
    /// lead names the leader). Also on every restart: the answer is then
    /// Joined at once.
    fn start_join(&self, ctx: &Rc<ShardCtx>, address: String) {
        let ctx = Rc::downgrade(ctx);
        let voters: Vec<(u64, String)> = self
            .config
            .quorum
            .as_ref()
            .map(|q| {
                q.voters
                    .iter()
                    .map(|v| (v.node_id as u64 + 1, format!("{}:{}", v.host, v.port)))
                    .collect()
            })
            .unwrap_or_default();
        let Ok(payload) = serde_json::to_vec(&JoinRequest {
            address: address.clone(),
        }) else {
            return;
        };
        let Some(joining) = self.member.borrow().as_ref().map(|m| m.joining.clone()) else {
            return;
        };
        if joining.replace(true) {
            return; // asking already
        }
        glommio::spawn_local(async move {
            let _done = Joining(joining);
            let mut next = 0usize;
            let mut hint: Option<u64> = None;
            let mut wait = JOIN_RETRY;
            loop {
                let (me, known_leader) = {
                    let Some(ctx) = ctx.upgrade() else { return };
                    let Some(controller) = ctx.controller.as_ref() else {
                        return;
                    };
                    if controller.log_failed.get() {
                        return;
                    }
                    let me = controller.member.borrow().as_ref().map_or(0, |m| m.me);
                    let leader = controller.log.borrow().as_ref().map(|l| l.leader_id());
                    (me, leader.filter(|&l| l != 0))
                };
                let target = hint
                    .take()
                    .or(known_leader)
                    .and_then(|id| voters.iter().find(|(v, _)| *v == id).cloned())
                    .or_else(|| {
                        next += 1;
                        voters.get(next % voters.len().max(1)).cloned()
                    });
                let Some((to, to_addr)) = target else { return };
                let deadline = crate::clock::monotonic() + JOIN_WAIT + std::time::Duration::from_secs(1);
                let answer = transport::join(me, to, &to_addr, &payload, deadline).await;
                let answer = answer
                    .map_err(|e| e.to_string())
                    .and_then(|b| serde_json::from_slice::<JoinAnswer>(&b).map_err(|e| e.to_string()));
                match answer {
                    Ok(JoinAnswer::Joined) => {
                        tracing::info!(node = me - 1, %address, leader = to - 1, "joined the metadata quorum as a learner");
                        return;
                    }
                    Ok(JoinAnswer::Leader { id }) if id != 0 && id != to => {
                        hint = Some(id);
                        glommio::timer::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                    Ok(JoinAnswer::Refused { why }) => {
                        tracing::error!(node = me - 1, %address, why, "the metadata quorum refused this learner; asking again later");
                        wait = JOIN_RETRY_MAX;
                    }
                    Ok(other) => {
                        tracing::debug!(answer = ?other, "metadata quorum: joining, not yet");
                    }
                    Err(e) => {
                        tracing::debug!(node = to - 1, error = %e, "metadata quorum: a join request got no answer");
                    }
                }
                glommio::timer::sleep(wait).await;
                wait = (wait * 2).min(JOIN_RETRY_MAX);
            }
        })
        .detach();
    }

    /// The join handler the controller listener gives each join request
    /// (`quorum::transport`): an undecodable one closes its connection.
    fn join_handler(ctx: &Rc<ShardCtx>) -> ForwardHandler {
        let ctx = Rc::downgrade(ctx);
        Rc::new(move |from, bytes| {
            let ctx = ctx.clone();
            Box::pin(async move {
                let request: JoinRequest = match serde_json::from_slice(&bytes) {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::warn!(node = from.saturating_sub(1), error = %e, "metadata quorum: an undecodable join request; its connection is closed");
                        return None;
                    }
                };
                let ctx = ctx.upgrade()?;
                let controller = ctx.controller.as_ref()?;
                let answer = controller.join(from, request.address).await;
                serde_json::to_vec(&answer).ok()
            })
        })
    }

    /// The leader's side of a join: checks the learner (not a voter, an
    /// address of its own), proposes its addition and answers Joined once
    /// it is applied here, within [`JOIN_WAIT`]. Idempotent: a learner
    /// already added at that address is answered Joined at once.
    async fn join(&self, from: u64, address: String) -> JoinAnswer {
        let node = from as i64 - 1;
        let refuse = |why: String| {
            tracing::warn!(node, %address, why, "metadata quorum: a join request refused");
            JoinAnswer::Refused { why }
        };
        let Some(q) = self.config.quorum.as_ref() else {
            return refuse("this node runs no quorum".into());
        };
        if !valid_address(&address) {
            return refuse(format!(
                "the address is not HOST:PORT of at most {ADDRESS_BYTES_MAX} bytes"
            ));
        }
        for v in &q.voters {
            if v.node_id as u64 + 1 == from {
                return refuse(format!("node {node} is a voter of the quorum"));
            }
            if format!("{}:{}", v.host, v.port) == address {
                return refuse(format!("{address} is voter {}'s address", v.node_id));
            }
        }
        let state = self.log.borrow().as_ref().map(|log| {
            (
                log.is_leader(),
                log.leader_id(),
                log.learners().get(&from).cloned(),
                log.learners()
                    .iter()
                    .find(|(id, a)| **id != from && **a == address)
                    .map(|(id, _)| *id),
                log.learners().len(),
            )
        });
        let Some((leading, leader, known, taken, count)) = state else {
            return JoinAnswer::Retry {
                why: "a step of the log is running".into(),
            };
        };
        match known {
            Some(a) if a == address => return JoinAnswer::Joined,
            Some(a) => {
                return refuse(format!(
                    "node {node} is a learner at {a} already; a learner's address does not change"
                ))
            }
            None => {}
        }
        if let Some(other) = taken {
            return refuse(format!("{address} is learner {}'s address", other - 1));
        }
        if !leading {
            return JoinAnswer::Leader { id: leader };
        }
        if count >= LEARNERS_MAX {
            return refuse(format!(
                "the quorum has {LEARNERS_MAX} learners, the most it takes"
            ));
        }
        let proposed = self
            .on_log(|log| log.propose_add_learner(from, &address))
            .await;
        if let Err(e) = proposed {
            return JoinAnswer::Retry { why: e.to_string() };
        }
        if let Some(m) = self.member.borrow().as_ref() {
            let _ = m.wake.try_send(Inbox::Wake);
        }
        tracing::info!(node, %address, "metadata quorum: proposing a learner's addition");
        let give_up = crate::clock::monotonic() + JOIN_WAIT;
        while crate::clock::monotonic() < give_up {
            glommio::timer::sleep(std::time::Duration::from_millis(20)).await;
            let added = self
                .log
                .borrow()
                .as_ref()
                .and_then(|log| log.learners().get(&from).cloned());
            match added {
                Some(a) if a == address => return JoinAnswer::Joined,
                Some(_) => return refuse("another address was added for it".into()),
                None => {}
            }
        }
        JoinAnswer::Retry {
            why: "the addition did not commit in time".into(),
        }
    }

    /// The member loop: ticks every [`RAFT_TICK`], steps peers' messages,
    /// runs `advance_member` off the reactor when raft-rs has work, sends
    /// its messages, applies committed records (on every node, wherever
    /// they were proposed), broadcasts the image and answers the waiting
    /// request; a new leader proposes its term's `LeaderEpoch` first.
    fn start_member_loop(&self, ctx: &Rc<ShardCtx>, rx: LocalReceiver<Inbox>) {
        let ctx = Rc::downgrade(ctx);
        glommio::spawn_local(async move {
            let mut next_tick = crate::clock::monotonic() + RAFT_TICK;
            loop {
                let now = crate::clock::monotonic();
                let mut inbox = Vec::new();
                if now < next_tick {
                    let first = futures_lite::future::or(rx.recv(), async {
                        glommio::timer::sleep(next_tick - now).await;
                        None
                    })
                    .await;
                    inbox.extend(first);
                }
                while inbox.len() < INBOX_MAX {
                    match rx.recv().now_or_never() {
                        Some(Some(m)) => inbox.push(m),
                        _ => break,
                    }
                }
                let Some(ctx) = ctx.upgrade() else { break };
                let Some(controller) = ctx.controller.as_ref() else {
                    break;
                };
                let tick = crate::clock::monotonic() >= next_tick;
                if tick {
                    next_tick = crate::clock::monotonic() + RAFT_TICK;
                }
                let stepped = controller
                    .on_log(|log| {
                        for item in inbox {
                            if let Inbox::Message(m) = item {
                                if let Err(e) = log.step(m) {
                                    tracing::debug!(error = %e, "metadata quorum: a message was dropped");
                                }
                            }
                        }
                        let mut quiet = 0;
                        if tick {
                            log.tick_member();
                            quiet = log.ticks_without_leader();
                        }
                        Ok((log.has_ready(), quiet))
                    })
                    .await;
                if let Some(q) = controller.config.quorum.as_ref().filter(|q| !q.is_voter()) {
                    if let Ok((_, quiet)) = stepped {
                        if quiet >= REJOIN_QUIET_TICKS && quiet % REJOIN_QUIET_TICKS == 0 {
                            tracing::warn!(
                                quiet_s = quiet as u64 * RAFT_TICK.as_millis() as u64 / 1000,
                                "metadata quorum: this learner hears nothing from a leader; asking to join again (the quorum may have removed it)"
                            );
                            controller.start_join(&ctx, format!("{}:{}", q.listen.0, q.listen.1));
                        }
                    }
                }
                match stepped.map(|(ready, _)| ready) {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(_) => {
                        controller.fail_waiters();
                        break;
                    }
                }
                if !controller.advance_member(&ctx).await {
                    controller.fail_waiters();
                    break;
                }
            }
        })
        .detach();
    }

    /// The member's log is applied up to `index`: requests waiting for an
    /// entry at or below it are answered, each done if the entry there is
    /// the one proposed (its term), else NOT_CONTROLLER (by Raft's log
    /// matching, another leader's entry took its place: the change was
    /// not made).
    fn answer_applied(&self, index: u64) {
        let done = {
            let mut member = self.member.borrow_mut();
            let member = member.as_mut().expect("several nodes");
            member.applied = member.applied.max(index);
            let later = member.waiters.split_off(&(member.applied + 1));
            std::mem::replace(&mut member.waiters, later)
        };
        let log = self.log.borrow();
        for (index, (term, reply)) in done {
            let same = log.as_ref().and_then(|l| l.term_of(index)) == Some(term);
            let _ = reply.send(if same {
                Ok(())
            } else {
                Err(ControllerError::NotController(
                    "This node lost the lead of the metadata quorum before the change committed; it was not made.".into(),
                ))
            });
        }
    }

    /// One `advance_member` and what follows it (see
    /// [`Self::start_member_loop`]); false when the log failed.
    async fn advance_member(&self, ctx: &Rc<ShardCtx>) -> bool {
        let advanced = self
            .with_log(|log| {
                let progress = log.advance_member()?;
                let leading = log.is_leader();
                Ok((
                    progress,
                    log.applied_index(),
                    log.learners().clone(),
                    leading,
                ))
            })
            .await;
        let (progress, applied_index, learners, leading) = match advanced {
            Ok(progress) => progress,
            Err(_) => return false, // logged, and the log closed, by with_log
        };
        let crate::metadata::store::MemberProgress {
            messages,
            committed,
            confirmed,
        } = progress;
        {
            let mut member = self.member.borrow_mut();
            let member = member.as_mut().expect("several nodes");
            // Learners the log removed: no longer reached nor let in.
            let voters: Vec<u64> = self
                .config
                .quorum
                .as_ref()
                .map(|q| q.voters.iter().map(|v| v.node_id as u64 + 1).collect())
                .unwrap_or_default();
            let left: Vec<u64> = member
                .members
                .borrow()
                .iter()
                .copied()
                .filter(|id| !voters.contains(id) && !learners.contains_key(id))
                .collect();
            for id in left {
                member.members.borrow_mut().remove(&id);
                member.peers.remove(id);
                member.addresses.remove(&id);
                tracing::info!(
                    node = id as i64 - 1,
                    "metadata quorum: a removed learner is no longer reached nor let in"
                );
            }
            // Learners the log added: reached, and let in, from now on.
            for (id, address) in learners {
                if id != member.me && !member.peers.has(id) {
                    member.peers.add(id, address.clone());
                }
                member.addresses.entry(id).or_insert(address);
                member.members.borrow_mut().insert(id);
            }
            for m in messages {
                member.peers.send(m);
            }
            for context in confirmed {
                if let Some(tx) = member.confirmations.remove(&context) {
                    let _ = tx.send(());
                }
            }
            // raft-rs dropped the rounds of a lead it lost: their
            // heartbeats are answered NOT_CONTROLLER now.
            if !leading {
                member.confirmations.clear();
            }
        }
        let last_record = committed.last().map(|(i, _)| *i);
        if let Some(m) = self.member.borrow_mut().as_mut() {
            note_unregistrations(&mut m.unregistered_at, &committed);
        }
        if let Some(last) = last_record {
            let records: Vec<MetadataRecord> = committed.into_iter().map(|(_, r)| r).collect();
            tracing::debug!(records = ?records, index = last, "metadata quorum: applying committed records");
            let next = Arc::new(apply_all(&self.image.borrow(), &records));
            *self.image.borrow_mut() = next.clone();
            // Only unregistered nodes keep their UnregisterBroker's index
            // (on every member: any may lead next).
            if let Some(m) = self.member.borrow_mut().as_mut() {
                m.unregistered_at
                    .retain(|node, _| next.retired_epochs.contains_key(node));
            }
            let deadline = crate::clock::monotonic() + ctx.router.timeout();
            self.broadcast(ctx, next, Some(deadline)).await;
            self.answer_applied(last);
        }
        // Entries that are not records (a membership change, a leader's
        // empty entry) count as applied too: a node whose newest committed
        // entry is one has caught up.
        if applied_index > last_record.unwrap_or(0) {
            self.answer_applied(applied_index);
        }
        // A new leader's first proposal: its term's LeaderEpoch, which
        // commits every earlier entry; requests wait for it (member_gate).
        let new_term = {
            let log = self.log.borrow();
            let member = self.member.borrow();
            matches!((log.as_ref(), member.as_ref()),
                (Some(log), Some(m)) if log.is_leader() && m.proposed.0 != log.term())
        };
        if new_term {
            let term = self.log.borrow().as_ref().map_or(0, |l| l.term());
            let mut first = vec![MetadataRecord::TermStart { term }];
            // The quorum's first leader names the cluster (its own id).
            if self.image.borrow().cluster_id.is_none() {
                first.push(MetadataRecord::ClusterId {
                    id: self.config.cluster_id.clone(),
                });
            }
            match self.propose_member(&first).await {
                Ok(_) => {
                    // Every registered node's clock starts now: this
                    // leader has heard from none of them yet.
                    let now = crate::clock::monotonic();
                    let nodes: Vec<i32> = self.image.borrow().brokers.keys().copied().collect();
                    if let Some(m) = self.member.borrow_mut().as_mut() {
                        m.heartbeats = nodes.into_iter().map(|n| (n, now)).collect();
                    }
                    let me = self.member.borrow().as_ref().map_or(0, |m| m.me);
                    tracing::info!(node = me - 1, term, "this node leads the metadata quorum");
                }
                Err(e) => tracing::warn!(error = %e, "a new leader's first proposal failed"),
            }
        } else {
            self.remove_unregistered_learners().await;
        }
        true
    }

    /// On the leader, once its term's first proposal is applied: proposes
    /// the removal of the first learner [`learners_to_remove`] names, at
    /// most once per [`LEARNER_REMOVAL_RETRY`] (one membership change at a
    /// time; the next comes once this one is applied).
    async fn remove_unregistered_learners(&self) {
        let now = crate::clock::monotonic();
        let candidate = {
            let log = self.log.borrow();
            let member = self.member.borrow();
            let (Some(log), Some(m)) = (log.as_ref(), member.as_ref()) else {
                return;
            };
            let started =
                log.is_leader() && m.proposed.0 == log.term() && m.applied >= m.proposed.1;
            if !started {
                return;
            }
            let learners = log
                .learners()
                .keys()
                .filter_map(|&id| log.learner_added_at(id).map(|at| (id, at)));
            learners_to_remove(&self.image.borrow(), &m.unregistered_at, learners)
                .into_iter()
                .next()
                .filter(|&id| {
                    !m.removal.is_some_and(|(last, when)| {
                        last == id && now.saturating_duration_since(when) < LEARNER_REMOVAL_RETRY
                    })
                })
        };
        let Some(id) = candidate else { return };
        if let Some(m) = self.member.borrow_mut().as_mut() {
            m.removal = Some((id, now));
        }
        match self.on_log(|log| log.propose_remove_learner(id)).await {
            Ok(()) => {
                tracing::info!(
                    node = id as i64 - 1,
                    "metadata quorum: proposing the removal of an unregistered node's learner"
                );
                if let Some(m) = self.member.borrow().as_ref() {
                    let _ = m.wake.try_send(Inbox::Wake);
                }
            }
            Err(e) => {
                tracing::debug!(node = id as i64 - 1, error = %e, "metadata quorum: a learner's removal was not proposed")
            }
        }
    }

    /// The log failed: every waiting request is answered with a storage
    /// error.
    fn fail_waiters(&self) {
        if let Some(member) = self.member.borrow_mut().as_mut() {
            for (_, (_, reply)) in std::mem::take(&mut member.waiters) {
                let _ = reply.send(Err(ControllerError::Storage(
                    "the metadata log failed; no metadata change is accepted until the broker restarts".into(),
                )));
            }
        }
    }

    /// Runs one step of the metadata log on a blocking thread (its writes
    /// and fdatasyncs never block the reactor), one step at a time. A step
    /// that fails midway (`MetadataLog::failed`) leaves the Raft node in an
    /// unknown state (and a failed fdatasync may have lost writes the page
    /// cache reported done): the log is closed, every later change fails
    /// with the error below, and the next start recovers from the file. A
    /// record refused before it was proposed (too large) closes nothing.
    async fn with_log<R: Send + 'static>(
        &self,
        step: impl FnOnce(&mut MetadataLog) -> std::io::Result<R> + Send + 'static,
    ) -> std::io::Result<R> {
        let _permit = self
            .log_lock
            .acquire_permit(1)
            .await
            .map_err(|_| std::io::Error::other("metadata log lock closed"))?;
        let taken = self.log.borrow_mut().take();
        let Some(mut log) = taken else {
            return Err(std::io::Error::other(if self.log_failed.get() {
                "the metadata log failed earlier; no metadata change is accepted until the broker restarts"
            } else {
                "the metadata log is not open"
            }));
        };
        let (log, result) = glommio::executor()
            .spawn_blocking(move || {
                let result = step(&mut log);
                (log, result)
            })
            .await;
        if log.failed() {
            self.log_failed.set(true);
            tracing::error!(
                error = %result.as_ref().err().map_or(String::new(), |e| e.to_string()),
                "the metadata log failed; it is closed and no metadata change is accepted until the broker restarts"
            );
        } else {
            *self.log.borrow_mut() = Some(log);
        }
        result
    }

    /// Ticks the metadata log's Raft node from a glommio timer. A tick that
    /// leaves raft-rs something to write runs it off the reactor; anything
    /// it commits is applied with the next append (a quorum of one commits
    /// only its own proposals, so nothing in practice).
    fn start_ticks(&self, ctx: &Rc<ShardCtx>) {
        let ctx = Rc::downgrade(ctx);
        glommio::spawn_local(async move {
            loop {
                glommio::timer::sleep(RAFT_TICK).await;
                let Some(ctx) = ctx.upgrade() else { break };
                let Some(controller) = ctx.controller.as_ref() else {
                    break;
                };
                if controller.log_failed.get() {
                    break;
                }
                let Ok(permit) = controller.log_lock.try_acquire_permit(1) else {
                    continue; // a step is running: this tick waits for the next
                };
                let ready = controller
                    .log
                    .borrow_mut()
                    .as_mut()
                    .is_some_and(|log| log.tick());
                drop(permit);
                if ready {
                    // The error is logged and the log closed by with_log.
                    let _ = controller.with_log(|log| log.advance()).await;
                }
            }
        })
        .detach();
    }

    /// Sends `image` to every shard and waits until all have applied it, or
    /// until `deadline`; returns the shards that had not acked by then (they
    /// are caught up in the background, see [`Self::catch_up`]).
    async fn broadcast(
        &self,
        ctx: &Rc<ShardCtx>,
        image: Arc<MetadataImage>,
        deadline: Option<Instant>,
    ) -> Vec<usize> {
        let deliveries = (0..ctx.cores())
            .filter(|&shard| shard != ctx.shard)
            .map(|shard| {
                let image = image.clone();
                async move {
                    let make = |reply| ShardMessage::ApplyMetadata { image, reply };
                    let acked = match deadline {
                        Some(d) => ctx.router.call(shard, d, make).await,
                        None => ctx.router.call(shard, far_future(), make).await,
                    };
                    (shard, acked)
                }
            });
        let remote = futures::future::join_all(deliveries);
        let ((), acks) = futures::future::join(ctx.apply_image(image), remote).await;
        let mut late = Vec::new();
        for (shard, acked) in acks {
            match acked {
                Ok(()) => {}
                Err(super::router::CallError::TimedOut(_)) => {
                    tracing::warn!(
                        shard,
                        timeout_ms = ctx.router.timeout().as_millis() as u64,
                        "a shard did not apply a metadata change in time; it is sent the newest image until it does"
                    );
                    self.catch_up(ctx, shard);
                    late.push(shard);
                }
                // Shutting down: its receive loop is gone.
                Err(super::router::CallError::Unreachable(_)) => {}
            }
        }
        late
    }

    /// Sends `shard` the controller's newest image, in the background, until
    /// it has acked the newest one (one task per lagging shard). Not bounded
    /// by a deadline: no request waits on it.
    fn catch_up(&self, ctx: &Rc<ShardCtx>, shard: usize) {
        if !self.lagging.borrow_mut().insert(shard) {
            return; // a task is at it already
        }
        let ctx = ctx.clone();
        glommio::spawn_local(async move {
            let Some(controller) = ctx.controller.as_ref() else {
                return;
            };
            loop {
                let image = controller.image.borrow().clone();
                let version = image.version;
                let make = |reply| ShardMessage::ApplyMetadata { image, reply };
                if ctx.router.call(shard, far_future(), make).await.is_err() {
                    break; // shutting down
                }
                if controller.image.borrow().version <= version {
                    tracing::info!(
                        shard,
                        version,
                        "a lagging shard applied the newest metadata"
                    );
                    break;
                }
            }
            controller.lagging.borrow_mut().remove(&shard);
        })
        .detach();
    }

    fn plan_create(
        &self,
        image: &MetadataImage,
        t: &NewTopic,
    ) -> Result<MetadataRecord, ControllerError> {
        validate_topic_name(&t.name).map_err(ControllerError::InvalidTopic)?;
        if image.topic(&t.name).is_some() {
            return Err(ControllerError::TopicAlreadyExists(t.name.clone()));
        }
        topic_config::validate_all(&t.configs, &self.config)
            .map_err(|e| ControllerError::InvalidConfig(e.to_string()))?;
        let cores = self.config.cores;
        let several = self.member.borrow().is_some();
        if several {
            let replicated = self.plan_replicated(image, t)?;
            return Ok(MetadataRecord::CreateTopic {
                name: t.name.clone(),
                id: new_topic_id(),
                shards: replicated.iter().map(|p| shard_of(p.leader)).collect(),
                configs: topic_config::normalized(t.configs.clone()),
                node: None,
                replicated,
            });
        }
        let shards = if !t.assignments.is_empty() {
            let assignments = sorted_assignments(t)?;
            let mut shards = Vec::with_capacity(assignments.len());
            for (i, (partition, replicas)) in assignments.iter().enumerate() {
                check_consecutive(i, *partition)?;
                let [node] = replicas.as_slice() else {
                    return Err(ControllerError::InvalidReplicaAssignment(format!(
                        "Partition {partition} must have exactly one replica: fjord keeps a single replica of each partition"
                    )));
                };
                let Some(shard) = self.config.shard_of_node(*node) else {
                    return Err(ControllerError::InvalidReplicaAssignment(format!(
                        "Replica assignment for partition {partition} names unknown broker {node}"
                    )));
                };
                shards.push(shard);
            }
            shards
        } else {
            let count = self.partition_count(t)?;
            check_replication_factor(t.replication_factor, cores)?;
            image.assign_shards(count as usize, cores)
        };
        Ok(MetadataRecord::CreateTopic {
            name: t.name.clone(),
            id: new_topic_id(),
            shards,
            configs: topic_config::normalized(t.configs.clone()),
            node: None,
            replicated: Vec::new(),
        })
    }

    /// A new topic's partition count: `num.partitions` for -1, Kafka's
    /// errors for a count below 1 or over [`PARTITIONS_PER_TOPIC_MAX`].
    fn partition_count(&self, t: &NewTopic) -> Result<i32, ControllerError> {
        let count = match t.num_partitions {
            -1 => self.config.num_partitions,
            n if n < 1 => {
                return Err(ControllerError::InvalidPartitions(
                    "Number of partitions was set to an invalid non-positive value.".into(),
                ))
            }
            n => n,
        };
        if count > PARTITIONS_PER_TOPIC_MAX {
            return Err(ControllerError::InvalidPartitions(format!(
                "Number of partitions {count} exceeds the limit of {PARTITIONS_PER_TOPIC_MAX}."
            )));
        }
        Ok(count)
    }

    /// Several nodes: the partitions of a new topic, placed on the live
    /// nodes or as manually assigned (`docs/replication.md` §4.3), with
    /// Kafka's errors. Every topic is a replicated one, replication factor
    /// 1 included (Kafka's placement: partitions spread over the nodes, a
    /// manual assignment to any live broker). The shard-placed topic of
    /// one node (§3.2) is made only on a single node now; topics made so
    /// by earlier versions stay as they are.
    fn plan_replicated(
        &self,
        image: &MetadataImage,
        t: &NewTopic,
    ) -> Result<Vec<PartitionState>, ControllerError> {
        if !t.assignments.is_empty() {
            let assignments = sorted_assignments(t)?;
            let factor = assignments[0].1.len();
            let mut out = Vec::with_capacity(assignments.len());
            for (i, (partition, replicas)) in assignments.into_iter().enumerate() {
                check_consecutive(i, partition)?;
                check_assignment(image, &replicas, factor)?;
                out.push(PartitionState::new(replicas));
            }
            return Ok(out);
        }
        let factor = match t.replication_factor {
            -1 => DEFAULT_REPLICATION_FACTOR,
            n => n,
        };
        let live = image.live_node_count();
        check_replication_factor(factor, live)?;
        let count = self.partition_count(t)?;
        let placed = image
            .place_replicas(count as usize, factor as usize)
            .ok_or_else(|| {
                ControllerError::InvalidReplicationFactor(format!(
                    "Unable to replicate the partition {factor} time(s): only {live} node(s) are live."
                ))
            })?;
        Ok(placed.into_iter().map(PartitionState::new).collect())
    }

    /// CreatePartitions of one topic to `count` partitions, the new ones
    /// placed as a new topic's are, or on the replicas `manual` names
    /// (Kafka's checks: one list per new partition, each as a manual
    /// assignment of CreateTopics with as many replicas as the topic's
    /// first partition).
    fn plan_partitions(
        &self,
        image: &MetadataImage,
        name: &str,
        count: i32,
        manual: Option<&[Vec<i32>]>,
    ) -> Result<MetadataRecord, ControllerError> {
        let Some(topic) = image.topic(name) else {
            return Err(ControllerError::UnknownTopic(name.into()));
        };
        let current = topic.partition_count();
        if count == current {
            return Err(ControllerError::InvalidPartitions(format!(
                "Topic already has {current} partitions."
            )));
        }
        if count < current {
            return Err(ControllerError::InvalidPartitions(format!(
                "Topic currently has {current} partitions, which is higher than the requested {count}."
            )));
        }
        if count > PARTITIONS_PER_TOPIC_MAX {
            return Err(ControllerError::InvalidPartitions(format!(
                "Number of partitions {count} exceeds the limit of {PARTITIONS_PER_TOPIC_MAX}."
            )));
        }
        let added = (count - current) as usize;
        if let Some(manual) = manual {
            if manual.len() != added {
                return Err(ControllerError::InvalidReplicaAssignment(format!(
                    "Attempted to add {added} additional partition(s), but only {} assignment(s) were specified.",
                    manual.len()
                )));
            }
            if let Some(first) = topic.replicated.first() {
                let factor = first.replicas.len();
                let replicated = manual
                    .iter()
                    .map(|replicas| {
                        check_assignment(image, replicas, factor)?;
                        Ok(PartitionState::new(replicas.clone()))
                    })
                    .collect::<Result<Vec<_>, ControllerError>>()?;
                return Ok(MetadataRecord::AddPartitions {
                    name: name.into(),
                    shards: replicated.iter().map(|p| shard_of(p.leader)).collect(),
                    replicated,
                });
            }
            // A topic placed by shard (one node): one replica per
            // partition, a broker of this node.
            let shards = manual
                .iter()
                .map(|replicas| {
                    let [broker] = replicas.as_slice() else {
                        return Err(ControllerError::InvalidReplicaAssignment(format!(
                            "The manual partition assignment includes a partition with {} replica(s), but this is not consistent with previous partitions, which have 1 replica(s).",
                            replicas.len()
                        )));
                    };
                    self.config.shard_of_node(*broker).ok_or_else(|| {
                        ControllerError::InvalidReplicaAssignment(format!(
                            "The manual partition assignment includes broker {broker}, but no such broker is registered."
                        ))
                    })
                })
                .collect::<Result<Vec<_>, ControllerError>>()?;
            return Ok(MetadataRecord::AddPartitions {
                name: name.into(),
                shards,
                replicated: Vec::new(),
            });
        }
        if let Some(first) = topic.replicated.first() {
            // As many replicas as the topic's first partition.
            let factor = first.replicas.len();
            let live = image.live_node_count();
            let placed = image.place_replicas(added, factor).ok_or_else(|| {
                ControllerError::InvalidReplicationFactor(format!(
                    "Unable to replicate the partition {factor} time(s): The target replication factor of {factor} cannot be reached because only {live} broker(s) are registered."
                ))
            })?;
            let replicated: Vec<PartitionState> =
                placed.into_iter().map(PartitionState::new).collect();
            return Ok(MetadataRecord::AddPartitions {
                name: name.into(),
                shards: replicated.iter().map(|p| shard_of(p.leader)).collect(),
                replicated,
            });
        }
        Ok(MetadataRecord::AddPartitions {
            name: name.into(),
            shards: image.assign_shards(added, self.config.cores),
            replicated: Vec::new(),
        })
    }
}

/// `image` with `records` applied in order.
/// The answer for a failed [`Controller::persist`]: NOT_CONTROLLER when
/// this node does not lead (nothing was proposed, or another leader's entry
/// replaced it), REQUEST_TIMED_OUT when the quorum did not commit it in
/// time (it may still be made), else a storage error.
fn persist_error(e: &std::io::Error) -> ControllerError {
    match e.kind() {
        std::io::ErrorKind::NotConnected => ControllerError::NotController(e.to_string()),
        std::io::ErrorKind::TimedOut => ControllerError::TimedOut(e.to_string()),
        _ => ControllerError::Storage(e.to_string()),
    }
}

/// The records a heartbeat of `registration` makes on the leader
/// (`docs/replication.md` §3.2, §4.4), None when it changes nothing: a
/// node not registered with this incarnation, endpoints and shards is
/// registered, a fenced one unfenced; a restarted node's partitions get
/// a new leader epoch (clean restart) or lose it from every ISR and ELR
/// (unclean); an offline partition whose ISR or ELR member came back gets
/// it as leader.
pub(super) fn heartbeat_records(
    image: &MetadataImage,
    registration: crate::metadata::BrokerRegistration,
    config: &BrokerConfig,
) -> Option<Vec<MetadataRecord>> {
    let node = registration.node;
    let restarted = image
        .brokers
        .get(&node)
        .is_some_and(|b| b.registration.incarnation != registration.incarnation);
    let clean = registration.clean_shutdown;
    let record = match image.brokers.get(&node) {
        Some(b) if b.registration == registration && !b.fenced => return None,
        Some(b) if b.registration == registration => MetadataRecord::UnfenceBroker { node },
        _ => MetadataRecord::RegisterBroker { registration },
    };
    let mut records = vec![record];
    if restarted && clean {
        records.extend(restarted_leaders(image, node));
    } else if restarted {
        records.extend(unclean_restart(image, node));
    }
    // An offline partition whose ISR or ELR member came back gets it
    // as leader (§4.4).
    records.extend(reconcile_partitions(&apply_all(image, &records), config));
    Some(records)
}

/// The records that fence `nodes` (silent for the session timeout, as the
/// leader found): their replicas leave the ISRs, and their partitions get
/// new leaders (`docs/replication.md` §4.4). Empty for no node.
pub(super) fn fence_records(
    image: &MetadataImage,
    nodes: &[i32],
    config: &BrokerConfig,
) -> Vec<MetadataRecord> {
    let mut records: Vec<MetadataRecord> = nodes
        .iter()
        .map(|&node| MetadataRecord::FenceBroker { node })
        .collect();
    if records.is_empty() {
        return records;
    }
    records.extend(reconcile_partitions(&apply_all(image, &records), config));
    records
}

/// The leader epoch node `node` leads its partitions in from this start
/// (several nodes, `docs/replication.md` §3.2): one more than its last
/// registration's, or, unregistered since, than the epoch its
/// registration had then ([`MetadataImage::retired_epochs`]), so that an
/// epoch is never led twice; at least the image's.
fn member_start_epoch(image: &MetadataImage, node: i32) -> i32 {
    let last = match image.brokers.get(&node) {
        Some(b) => Some(b.registration.leader_epoch),
        None => image.retired_epochs.get(&node).copied(),
    };
    match last {
        Some(last) => last.saturating_add(1).max(image.leader_epoch()),
        None => image.leader_epoch(),
    }
}

/// The records that unregister the node of broker `broker` (Kafka's
/// `handleBrokerUnregistered`, `docs/replication.md` §3.2): its
/// registration goes, and every replicated partition is reconciled as on
/// fencing ([`reconcile_partitions`]: its replicas leave the ISRs, and the
/// ELRs too as it is no longer registered; partitions it led get new
/// leaders); its replicas stay assigned until reassigned.
/// BROKER_ID_NOT_REGISTERED unless `broker` is a shard of a registered
/// node (fenced or not): broker ids are `node * 1000 + shard`, and a
/// node's registration covers all its shards, so any of them names it.
pub(super) fn unregister_records(
    image: &MetadataImage,
    broker: i32,
    config: &BrokerConfig,
) -> Result<Vec<MetadataRecord>, ControllerError> {
    let node = node_of(broker);
    let registered = broker >= 0
        && image
            .brokers
            .get(&node)
            .is_some_and(|b| shard_of(broker) < b.registration.shards);
    if !registered {
        return Err(not_registered(broker));
    }
    let mut records = vec![MetadataRecord::UnregisterBroker { node }];
    records.extend(reconcile_partitions(&apply_all(image, &records), config));
    Ok(records)
}

/// Kafka's BROKER_ID_NOT_REGISTERED, with its message.
fn not_registered(broker: i32) -> ControllerError {
    ControllerError::BrokerIdNotRegistered(format!(
        "Broker ID {broker} is not currently registered"
    ))
}

fn apply_all(image: &MetadataImage, records: &[MetadataRecord]) -> MetadataImage {
    let mut next = image.clone();
    for r in records {
        next = next.apply(r);
    }
    next
}

/// One partition of an ElectLeaders (Kafka's `electLeader`): the change
/// that makes its preferred replica leader (or, `unclean`, the first live
/// replica of a partition without a leader, alone in the ISR), or Kafka's
/// error. A topic of one replica has nothing to elect: its replica leads
/// while its node is live (`several`: the nodes' registrations say).
fn plan_election(
    image: &MetadataImage,
    several: bool,
    name: &str,
    partition: i32,
    unclean: bool,
) -> Result<MetadataRecord, ControllerError> {
    let Some(t) = image.topic(name) else {
        return Err(ControllerError::UnknownPartition(format!(
            "No such topic as {name}"
        )));
    };
    if !(0..t.partition_count()).contains(&partition) {
        return Err(ControllerError::UnknownPartition(format!(
            "No such partition as {name}-{partition}"
        )));
    }
    let unavailable = if unclean {
        ControllerError::EligibleLeadersNotAvailable
    } else {
        ControllerError::PreferredLeaderNotAvailable
    };
    let Some(p) = t.replica_state(partition) else {
        let live = !several || t.node.is_some_and(|n| image.live_broker(n).is_some());
        return Err(if live {
            ControllerError::ElectionNotNeeded
        } else {
            unavailable
        });
    };
    let live = |b: i32| image.is_live_broker(b);
    let mut next = p.clone();
    if unclean {
        if p.leader >= 0 {
            return Err(ControllerError::ElectionNotNeeded);
        }
        let Some(b) = p.replicas.iter().copied().find(|&b| live(b)) else {
            return Err(unavailable);
        };
        next.leader = b;
        next.isr = vec![b];
        next.elr.clear();
    } else {
        let Some(&preferred) = p.replicas.first() else {
            return Err(unavailable);
        };
        if p.leader == preferred {
            return Err(ControllerError::ElectionNotNeeded);
        }
        if !p.isr.contains(&preferred) || !live(preferred) {
            return Err(unavailable);
        }
        next.leader = preferred;
    }
    next.leader_epoch = p.leader_epoch.saturating_add(1);
    next.partition_epoch = p.partition_epoch.saturating_add(1);
    Ok(MetadataRecord::PartitionChange {
        topic_id: t.id,
        partition,
        state: next,
    })
}

/// An AlterPartition, as the controller checks it.
pub(super) struct AlterPartition {
    pub(super) broker: i32,
    pub(super) topic_id: [u8; 16],
    pub(super) partition: i32,
    pub(super) leader_epoch: i32,
    pub(super) partition_epoch: i32,
    pub(super) isr: Vec<i32>,
    /// Each member's broker epoch as the leader saw it; a member not
    /// named is -1 (not checked).
    pub(super) broker_epochs: Vec<(i32, i64)>,
}

impl AlterPartition {
    /// The broker epoch the leader gave for ISR member `broker`, -1 if none.
    fn broker_epoch(&self, broker: i32) -> i64 {
        self.broker_epochs
            .iter()
            .find(|(b, _)| *b == broker)
            .map_or(-1, |(_, e)| *e)
    }
}

/// Kafka's checks of an AlterPartition (`ReplicationControlManager`), in
/// its order, and the change it makes: the new ISR with the partition
/// epoch bumped; under KIP-966, while the ISR is below
/// `min.insync.replicas` the members it loses join the eligible leader
/// replicas, and once it is back at the minimum the ELR empties. None when
/// the ISR asked for is the ISR already (nothing to log). KIP-903: a member
/// the change adds must come with its node's current broker epoch (the
/// leader's from that member's last fetch; -1 is not checked, as Kafka's
/// controller skips it): one from an older process of the node (a restart
/// that may have lost what it fetched) is INELIGIBLE_REPLICA.
pub(super) fn plan_alter_partition(
    image: &MetadataImage,
    config: &crate::config::BrokerConfig,
    change: &AlterPartition,
) -> Result<Option<(MetadataRecord, PartitionState)>, ControllerError> {
    let Some(topic) = image.topic_by_id(&change.topic_id) else {
        return Err(ControllerError::UnknownTopicId(
            "This server does not host this topic ID.".into(),
        ));
    };
    let Some(current) = topic.replica_state(change.partition) else {
        return Err(ControllerError::UnknownTopic(topic.name.clone()));
    };
    if change.broker != current.leader {
        return Err(ControllerError::NotLeader(format!(
            "Broker {} is not the leader of partition {}-{} (broker {} is).",
            change.broker, topic.name, change.partition, current.leader
        )));
    }
    if change.leader_epoch != current.leader_epoch {
        return Err(ControllerError::FencedLeaderEpoch(format!(
            "The leader epoch {} is not the partition's, {}.",
            change.leader_epoch, current.leader_epoch
        )));
    }
    if change.partition_epoch != current.partition_epoch {
        return Err(ControllerError::InvalidUpdateVersion(format!(
            "The partition epoch {} is not the partition's, {}.",
            change.partition_epoch, current.partition_epoch
        )));
    }
    let mut isr = change.isr.clone();
    isr.dedup();
    if !isr.contains(&current.leader) {
        return Err(ControllerError::InvalidRequest(
            "The new ISR must contain the leader.".into(),
        ));
    }
    for &r in &isr {
        let leader_itself = r == current.leader;
        if !current.replicas.contains(&r) || !(leader_itself || image.is_live_broker(r)) {
            return Err(ControllerError::IneligibleReplica(format!(
                "Broker {r} is not an assigned, live replica of the partition."
            )));
        }
        let given = change.broker_epoch(r);
        if !leader_itself && !current.isr.contains(&r) && given >= 0 {
            let now = image.live_broker_epoch(r).unwrap_or(-1);
            if given != now {
                return Err(ControllerError::IneligibleReplica(format!(
                    "Partition {}-{} cannot add replica {r} to the ISR: its broker epoch {given} is stale (its current registration's is {now}).",
                    topic.name, change.partition
                )));
            }
        }
    }
    if isr == current.isr {
        return Ok(None);
    }
    let min_isr = crate::metadata::TopicConfig::resolve(&topic.configs, config)
        .min_insync_replicas
        .max(1) as usize;
    let mut state = current.clone();
    state.elr = elr_after(current, &isr, min_isr);
    state.isr = isr;
    // The ISR may now hold every replica a reassignment waits for.
    complete_reassignment(&mut state);
    elect_within(image, current, &mut state);
    state.partition_epoch = state.partition_epoch.saturating_add(1);
    Ok(Some((
        MetadataRecord::PartitionChange {
            topic_id: change.topic_id,
            partition: change.partition,
            state: state.clone(),
        },
        state,
    )))
}

/// The partition changes that make every replicated partition agree with
/// which nodes are live (`docs/replication.md` §4.4; Kafka's
/// `ReplicationControlManager` on fencing and unfencing, with KIP-966):
/// - replicas of fenced or unregistered nodes leave the ISR; while the ISR
///   is below `min.insync.replicas` the members it loses join the ELR
///   (which held everything committed), and once it is back at the
///   minimum the ELR empties; replicas of unregistered nodes leave the ELR
///   too (Kafka's `handleBrokerUnregistered`: a fenced node may come back
///   with its log, an unregistered one is gone);
/// - a leader that is no longer live in the ISR is replaced by the first
///   replica, in assignment order, that is live and in the ISR; with none,
///   by the first live ELR member, which becomes the ISR alone (KIP-966);
///   with neither the partition is offline (leader -1) until one returns,
///   unless the topic's `unclean.leader.election.enable` is true: then the
///   first live replica leads, alone in the ISR, the ELR cleared (Kafka's
///   unclean election: what it lacks of the acknowledged writes is lost);
/// - a new leader bumps the leader epoch; any change bumps the partition
///   epoch.
fn reconcile_partitions(
    image: &MetadataImage,
    config: &crate::config::BrokerConfig,
) -> Vec<MetadataRecord> {
    let mut out = Vec::new();
    for t in image.topics.values() {
        if t.replicated.is_empty() {
            continue;
        }
        let tc = crate::metadata::TopicConfig::resolve(&t.configs, config);
        let min_isr = tc.min_insync_replicas.max(1) as usize;
        for (i, p) in t.replicated.iter().enumerate() {
            let next = reconciled(image, p, min_isr, tc.unclean_leader_election);
            if next != *p {
                out.push(MetadataRecord::PartitionChange {
                    topic_id: t.id,
                    partition: i as i32,
                    state: next,
                });
            }
        }
    }
    out
}

/// The ELR once `p`'s ISR becomes `isr` (KIP-966): empty while the ISR
/// has `min.insync.replicas` (at most the replica count); below it, the
/// ELR keeps its members (but those back in the ISR) and gains the ISR
/// members lost.
fn elr_after(p: &PartitionState, isr: &[i32], min_isr: usize) -> Vec<i32> {
    if isr.len() >= min_isr.min(p.replicas.len()) {
        return Vec::new();
    }
    let mut elr: Vec<i32> = Vec::new();
    for &b in p.elr.iter().chain(&p.isr) {
        if !isr.contains(&b) && !elr.contains(&b) {
            elr.push(b);
        }
    }
    elr
}

/// One partition's state per [`reconcile_partitions`].
fn reconciled(
    image: &MetadataImage,
    p: &PartitionState,
    min_isr: usize,
    unclean: bool,
) -> PartitionState {
    let live = |b: i32| image.is_live_broker(b);
    let mut next = p.clone();
    next.isr = p.isr.iter().copied().filter(|&b| live(b)).collect();
    next.elr = elr_after(p, &next.isr, min_isr);
    next.elr
        .retain(|&b| image.brokers.contains_key(&node_of(b)));
    complete_reassignment(&mut next);
    let leads = p.leader >= 0 && next.isr.contains(&p.leader);
    if !leads {
        let from_isr = next.replicas.iter().copied().find(|b| next.isr.contains(b));
        next.leader = match from_isr {
            Some(b) => b,
            None => match next
                .replicas
                .iter()
                .copied()
                .find(|&b| next.elr.contains(&b) && live(b))
            {
                Some(b) => {
                    next.isr = vec![b];
                    next.elr.retain(|&e| e != b);
                    b
                }
                None => match next.replicas.iter().copied().find(|&b| unclean && live(b)) {
                    Some(b) => {
                        tracing::warn!(broker = b, "unclean leader election");
                        next.isr = vec![b];
                        next.elr.clear();
                        b
                    }
                    None => -1,
                },
            },
        };
    }
    if next.leader != p.leader {
        next.leader_epoch = p.leader_epoch.saturating_add(1);
    }
    if next != *p {
        next.partition_epoch = p.partition_epoch.saturating_add(1);
    }
    next
}

/// One partition of an AlterPartitionReassignments (KIP-455; Kafka's
/// `ReplicationControlManager.alterPartitionReassignment`,
/// `docs/replication.md` §4.5): the change that starts, replaces,
/// completes or (`target` None) cancels its reassignment, None when there
/// is nothing to change, or Kafka's error.
///
/// Toward target replicas T from the original replicas R (the replicas
/// less those being added by a reassignment in progress), the partition's
/// replicas become T followed by R − T, adding T − R and removing R − T;
/// ISR and ELR keep only members of that set (a replica a replaced
/// reassignment was adding goes at once). The reassignment completes in
/// the same change when the ISR less the removed replicas holds all of T
/// (a reordering, a pure removal), else when an AlterPartition brings
/// the last of them into the ISR ([`complete_reassignment`]). A leader
/// outside the new replicas or ISR is replaced by the first live ISR
/// member ([`elect_within`]).
///
/// A cancellation goes back to R (the same change with T = R), and is
/// NO_REASSIGNMENT_IN_PROGRESS when none is. A topic of one replica (its
/// partitions placed by shard on one node, §3.2) cannot be reassigned:
/// INVALID_REPLICA_ASSIGNMENT with a message that says so.
fn plan_reassignment(
    image: &MetadataImage,
    name: &str,
    partition: i32,
    target: Option<&[i32]>,
    allow_rf_change: bool,
) -> Result<Option<MetadataRecord>, ControllerError> {
    let invalid = |m: String| Err(ControllerError::InvalidReplicaAssignment(m));
    let Some(t) = image.topic(name) else {
        return Err(ControllerError::UnknownPartition(format!(
            "Unable to find a topic named {name}."
        )));
    };
    if !(0..t.partition_count()).contains(&partition) {
        return Err(ControllerError::UnknownPartition(format!(
            "Unable to find partition {name}:{partition}."
        )));
    }
    let Some(p) = t.replica_state(partition) else {
        return invalid(format!(
            "Topic {name} has one replica per partition, placed on one node: fjord reassigns only the partitions of topics created with a replication factor above 1."
        ));
    };
    let original = p.original_replicas();
    let cancel = target.is_none();
    let target: Vec<i32> = match target {
        None if !p.is_reassigning() => return Err(ControllerError::NoReassignmentInProgress),
        None => original.clone(),
        Some(target) => {
            check_reassignment_target(image, target)?;
            if !allow_rf_change && target.len() != original.len() {
                return Err(ControllerError::InvalidReplicationFactor(format!(
                    "The replication factor is changed from {} to {}",
                    original.len(),
                    target.len()
                )));
            }
            target.to_vec()
        }
    };
    let mut next = p.clone();
    next.adding = target
        .iter()
        .copied()
        .filter(|b| !original.contains(b))
        .collect();
    next.removing = original
        .iter()
        .copied()
        .filter(|b| !target.contains(b))
        .collect();
    next.replicas = target.clone();
    next.replicas.extend_from_slice(&next.removing);
    for (i, &b) in next.replicas.iter().enumerate() {
        if next.replicas[..i].iter().any(|&o| node_of(o) == node_of(b)) {
            return invalid(format!(
                "Broker {b} is on node {}, which holds another replica of {name}-{partition}: a replica cannot move between shards of one node.",
                node_of(b)
            ));
        }
    }
    next.isr.retain(|b| next.replicas.contains(b));
    next.elr.retain(|b| next.replicas.contains(b));
    if next.isr.is_empty() {
        let what = if cancel { "revert" } else { "change" };
        return invalid(format!(
            "Unable to {what} partition assignment for {name}:{partition} because it would require an unclean leader election."
        ));
    }
    complete_reassignment(&mut next);
    elect_within(image, p, &mut next);
    if next == *p {
        return Ok(None);
    }
    next.partition_epoch = p.partition_epoch.saturating_add(1);
    Ok(Some(MetadataRecord::PartitionChange {
        topic_id: t.id,
        partition,
        state: next,
    }))
}

/// Kafka's checks of a reassignment's target replicas
/// (`validateManualPartitionAssignment`): not empty, no broker twice,
/// every broker registered (fenced ones count: a replica of a node that is
/// down joins once it is back); and fjord's: at most one replica per node.
fn check_reassignment_target(image: &MetadataImage, target: &[i32]) -> Result<(), ControllerError> {
    let invalid = |m: String| Err(ControllerError::InvalidReplicaAssignment(m));
    if target.is_empty() {
        return invalid("The manual partition assignment includes an empty replica list.".into());
    }
    let mut seen = HashSet::with_capacity(target.len());
    let mut nodes = HashSet::with_capacity(target.len());
    for &b in target {
        let registered = b >= 0
            && image
                .brokers
                .get(&node_of(b))
                .is_some_and(|r| shard_of(b) < r.registration.shards);
        if !registered {
            return invalid(format!(
                "The manual partition assignment includes broker {b}, but no such broker is registered."
            ));
        }
        if !seen.insert(b) {
            return invalid(format!(
                "The manual partition assignment includes the broker {b} more than once."
            ));
        }
        if !nodes.insert(node_of(b)) {
            return invalid(format!(
                "The manual partition assignment places two replicas on node {}: the replicas of a partition must be on different nodes.",
                node_of(b)
            ));
        }
    }
    Ok(())
}

/// Completes `p`'s reassignment when its ISR allows (Kafka's
/// `PartitionReassignmentReplicas.maybeCompleteReassignment`): the ISR
/// less the replicas being removed is not empty and holds every other
/// replica. The replicas and ISR then lose the removed ones (the ELR too)
/// and the reassignment is over. Nothing changes otherwise.
fn complete_reassignment(p: &mut PartitionState) {
    if !p.is_reassigning() {
        return;
    }
    let removing = std::mem::take(&mut p.removing);
    let isr: Vec<i32> = p
        .isr
        .iter()
        .copied()
        .filter(|b| !removing.contains(b))
        .collect();
    let replicas: Vec<i32> = p
        .replicas
        .iter()
        .copied()
        .filter(|b| !removing.contains(b))
        .collect();
    if isr.is_empty() || replicas.is_empty() || !replicas.iter().all(|b| isr.contains(b)) {
        p.removing = removing;
        return;
    }
    p.replicas = replicas;
    p.isr = isr;
    p.elr.retain(|b| !removing.contains(b));
    p.adding.clear();
}

/// A leader that is no longer a replica in the ISR of `next` (a
/// reassignment removed it) is replaced by the first replica that is live
/// and in the ISR, or none (-1); a new leader bumps the leader epoch
/// (from `prev`'s).
fn elect_within(image: &MetadataImage, prev: &PartitionState, next: &mut PartitionState) {
    let leads =
        next.leader >= 0 && next.replicas.contains(&next.leader) && next.isr.contains(&next.leader);
    if !leads && next.leader >= 0 {
        next.leader = next
            .replicas
            .iter()
            .copied()
            .find(|&b| next.isr.contains(&b) && image.is_live_broker(b))
            .unwrap_or(-1);
    }
    if next.leader != prev.leader {
        next.leader_epoch = prev.leader_epoch.saturating_add(1);
    }
}

/// A restarted node leads its replicated partitions in a new epoch, as
/// a single node's restart begins one (`next_leader_epoch`): what it
/// appends from now on is told apart from what its followers fetched
/// before (KIP-101: a follower holding more of the old epoch than the
/// restarted leader kept truncates to the leader's end of it).
fn restarted_leaders(image: &MetadataImage, node: i32) -> Vec<MetadataRecord> {
    partition_changes(image, |p| {
        (p.leader >= 0 && node_of(p.leader) == node).then(|| {
            let mut state = p.clone();
            state.leader_epoch = state.leader_epoch.saturating_add(1);
            state.partition_epoch = state.partition_epoch.saturating_add(1);
            state
        })
    })
}

/// A PartitionChange for every replicated partition `change` gives a new
/// state (None: unchanged).
fn partition_changes(
    image: &MetadataImage,
    mut change: impl FnMut(&PartitionState) -> Option<PartitionState>,
) -> Vec<MetadataRecord> {
    let mut out = Vec::new();
    for t in image.topics.values() {
        for (i, p) in t.replicated.iter().enumerate() {
            if let Some(state) = change(p) {
                out.push(MetadataRecord::PartitionChange {
                    topic_id: t.id,
                    partition: i as i32,
                    state,
                });
            }
        }
    }
    out
}

/// A node restarted after an unclean shutdown (Kafka's
/// `handleBrokerUncleanShutdown`, KIP-966): its log may lack what its
/// page cache held when its machine crashed, so its replicas leave every
/// ISR and ELR and rejoin the ISR only by catching up again; a partition
/// it led is led by another ISR (else ELR) member, elected by
/// [`reconcile_partitions`] right after. Without this, a leader back
/// before it was fenced would lead on with its shorter log and its
/// followers would truncate acknowledged writes to it.
///
/// Except where it is the last member of both: a partition whose every
/// other replica is out of its ISR and ELR keeps it (leading again once
/// live), rather than going offline for good until an unclean election
/// (Kafka 4.x's ELR does the latter): after a power loss of every node,
/// each restart is unclean, and the last replica the partition has is
/// the best it can have (under `--fsync-acks` it holds every acknowledged
/// write).
fn unclean_restart(image: &MetadataImage, node: i32) -> Vec<MetadataRecord> {
    let on_node = |b: &i32| node_of(*b) == node;
    partition_changes(image, |p| {
        // In neither, or their last member: unchanged.
        let member = p.isr.iter().chain(&p.elr).any(on_node);
        let last = p.isr.iter().chain(&p.elr).all(on_node);
        if !member || last {
            return None;
        }
        // The leader stays named here; `reconcile_partitions` replaces one
        // no longer in the ISR, in a new leader epoch.
        let mut state = p.clone();
        state.isr.retain(|b| !on_node(b));
        state.elr.retain(|b| !on_node(b));
        state.partition_epoch = state.partition_epoch.saturating_add(1);
        Some(state)
    })
}

/// A manual assignment by partition index, refused (Kafka's message) when
/// a partition count or replication factor was set too.
fn sorted_assignments(t: &NewTopic) -> Result<Vec<(i32, Vec<i32>)>, ControllerError> {
    if t.num_partitions != -1 || t.replication_factor != -1 {
        return Err(ControllerError::InvalidReplicaAssignment(
            "Both numPartitions or replicationFactor and replicasAssignments were set. Both cannot be used at the same time.".into(),
        ));
    }
    let mut assignments = t.assignments.clone();
    assignments.sort_by_key(|(p, _)| *p);
    Ok(assignments)
}

/// The `i`-th partition of a sorted manual assignment must be partition `i`.
fn check_consecutive(i: usize, partition: i32) -> Result<(), ControllerError> {
    if partition != i as i32 {
        return Err(ControllerError::InvalidReplicaAssignment(
            "Partitions should be a consecutive 0-based integer sequence".into(),
        ));
    }
    Ok(())
}

/// Kafka's checks of one partition's manual assignment of several
/// replicas (its `ReplicationControlManager`), and fjord's one more: two
/// replicas on one node protect against nothing (`docs/replication.md`
/// §4.1).
fn check_assignment(
    image: &MetadataImage,
    replicas: &[i32],
    factor: usize,
) -> Result<(), ControllerError> {
    let invalid = |m: String| Err(ControllerError::InvalidReplicaAssignment(m));
    if replicas.is_empty() {
        return invalid("The manual partition assignment includes an empty replica list.".into());
    }
    if replicas.len() != factor {
        return invalid(format!(
            "The manual partition assignment includes a partition with {} replica(s), but this is not consistent with previous partitions, which have {factor} replica(s).",
            replicas.len()
        ));
    }
    for (i, &b) in replicas.iter().enumerate() {
        if !image.is_live_broker(b) {
            return invalid(format!(
                "The manual partition assignment includes broker {b}, but no such broker is registered."
            ));
        }
        if replicas[..i].contains(&b) {
            return invalid(format!(
                "The manual partition assignment includes the broker {b} more than once."
            ));
        }
        if replicas[..i].iter().any(|&o| node_of(o) == node_of(b)) {
            return invalid(format!(
                "The manual partition assignment places two replicas on node {}: the replicas of a partition must be on different nodes.",
                node_of(b)
            ));
        }
    }
    Ok(())
}

/// Kafka's check of a CreateTopics replication factor (`-1`: the broker's
/// `default.replication.factor`, 1), against the brokers a client sees:
/// one per shard. A factor up to that count is accepted and the topic gets
/// one replica per partition, which Metadata and DescribeTopicPartitions
/// report as it is; see `docs/replication-factor.md` for why. Above it,
/// INVALID_REPLICATION_FACTOR with Kafka's message.
pub fn check_replication_factor(
    replication_factor: i16,
    brokers: usize,
) -> Result<(), ControllerError> {
    match replication_factor {
        -1 => Ok(()),
        n if n < 1 => Err(ControllerError::InvalidReplicationFactor(
            "Replication factor must be larger than 0, or -1 to use the default value.".into(),
        )),
        n if n as usize > brokers => Err(ControllerError::InvalidReplicationFactor(format!(
            "Unable to replicate the partition {n} time(s): The target replication factor of {n} cannot be reached because only {brokers} broker(s) are registered or some brokers have all their log directories cordoned."
        ))),
        _ => Ok(()),
    }
}

/// A deadline that does not come (waits that are deliberately unbounded).
fn far_future() -> Instant {
    const YEAR: std::time::Duration = std::time::Duration::from_secs(365 * 24 * 3600);
    crate::clock::monotonic() + YEAR
}

fn plan_configs(
    image: &MetadataImage,
    name: &str,
    change: ConfigChange,
    broker: &BrokerConfig,
) -> Result<MetadataRecord, ControllerError> {
    let Some(topic) = image.topic(name) else {
        return Err(ControllerError::UnknownTopic(name.into()));
    };
    let configs: BTreeMap<String, String> = match change {
        ConfigChange::ReplaceAll(all) => all,
        ConfigChange::Incremental(ops) => {
            let mut c = topic.configs.clone();
            let mut seen = HashSet::new();
            for (k, v) in ops {
                if !seen.insert(k.clone()) {
                    return Err(ControllerError::InvalidConfig(format!(
                        "Error due to duplicate config keys: {k}"
                    )));
                }
                match v {
                    Some(v) => c.insert(k, v),
                    None => c.remove(&k),
                };
            }
            c
        }
    };
    topic_config::validate_all(&configs, broker)
        .map_err(|e| ControllerError::InvalidConfig(e.to_string()))?;
    Ok(MetadataRecord::SetTopicConfigs {
        name: name.into(),
        configs: topic_config::normalized(configs),
    })
}

/// What one CreateTopics or CreatePartitions request may still create:
/// `create_topics_partitions_max` for the request, `partitions_max` for the
/// broker (internal topics included). A topic over either is refused with
/// INVALID_PARTITIONS and creates nothing; later, smaller topics of the same
/// request may still fit.
struct PartitionBudget {
    request_left: i64,
    total: i64,
    total_max: i64,
}

impl PartitionBudget {
    fn take(&mut self, partitions: i64) -> Result<(), ControllerError> {
        if partitions > self.request_left {
            return Err(ControllerError::InvalidPartitions(format!(
                "Creating {partitions} partitions exceeds what one request may still create ({} of --create-topics-partitions-max).",
                self.request_left
            )));
        }
        if self.total + partitions > self.total_max {
            return Err(ControllerError::InvalidPartitions(format!(
                "Creating {partitions} partitions would make {} in all, over the broker's limit of {} (--partitions-max).",
                self.total + partitions,
                self.total_max
            )));
        }
        self.request_left -= partitions;
        self.total += partitions;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    /// A learner's join names `HOST:PORT` (a port other than 0), at most
    /// `ADDRESS_BYTES_MAX` bytes; anything else is refused before any
    /// proposal.
    #[test]
    fn a_join_address_is_host_and_port() {
        assert!(super::valid_address("10.0.0.4:9093"));
        assert!(super::valid_address("node-4.example:19303"));
        for bad in [
            "", "no port", "h:0", ":9093", "h:65536", "h:x", "a b:1", "h\n:1",
        ] {
            assert!(!super::valid_address(bad), "{bad:?}");
        }
        let long = format!("{}:1", "h".repeat(super::ADDRESS_BYTES_MAX));
        assert!(!super::valid_address(&long));
    }

    use super::*;
    use crate::metadata::{BrokerEndpoint, BrokerRegistration};

    /// The learners the leader removes: those whose node is unregistered
    /// by an UnregisterBroker committed after their addition; never one
    /// added after it (a node coming back, not registered yet), nor one
    /// whose node registered again.
    #[test]
    fn only_learners_unregistered_after_their_addition_are_removed() {
        let mut image = MetadataImage::default();
        image.retired_epochs.insert(3, 1);
        image.retired_epochs.insert(4, 1);
        let unregistered_at: HashMap<i32, u64> = [(3, 50), (4, 50), (5, 50)].into();
        // Raft ids: node + 1; (id, addition index).
        let learners = [(4, 10), (5, 60), (6, 10), (7, 10)];
        assert_eq!(
            learners_to_remove(&image, &unregistered_at, learners.into_iter()),
            vec![4],
            "node 4 joined after its unregistration, node 5 registered again, node 6 never was unregistered"
        );
        assert!(
            learners_to_remove(&image, &unregistered_at, [(u64::MAX, 0)].into_iter()).is_empty()
        );
        let mut records = vec![(70, MetadataRecord::UnregisterBroker { node: 4 })];
        records.push((71, MetadataRecord::TermStart { term: 2 }));
        let mut at = unregistered_at.clone();
        note_unregistrations(&mut at, &records);
        assert_eq!(at[&4], 70);
        assert_eq!(
            learners_to_remove(&image, &at, learners.into_iter()),
            vec![4, 5],
            "unregistered again after it joined"
        );
    }

    fn heartbeat(node: i32, shards: usize, endpoints: usize) -> ControllerRequest {
        let endpoint = BrokerEndpoint {
            protocol: "PLAINTEXT".into(),
            host: "h".into(),
            port: 1,
        };
        ControllerRequest::BrokerHeartbeat {
            registration: BrokerRegistration {
                node,
                shards,
                endpoints: vec![endpoint; endpoints],
                incarnation: [1; 16],
                leader_epoch: 0,
                clean_shutdown: true,
            },
        }
    }

    /// A forwarded heartbeat is taken only for its sender's own node and
    /// within the registration bounds; a forwarded fencing never.
    #[test]
    fn forwarded_requests_are_bounded_by_their_sender() {
        // Raft id 3 is node 2.
        assert_eq!(forwardable(&heartbeat(2, 4, 1), 3), Ok(()));
        assert!(forwardable(&heartbeat(1, 4, 1), 3).is_err());
        assert!(forwardable(&heartbeat(-1, 4, 1), 0).is_err());
        assert!(forwardable(&heartbeat(2, 0, 1), 3).is_err());
        assert!(forwardable(&heartbeat(2, SHARDS_REGISTERED_MAX + 1, 1), 3).is_err());
        assert!(forwardable(&heartbeat(2, 1, ENDPOINTS_REGISTERED_MAX + 1), 3).is_err());
        assert!(forwardable(&ControllerRequest::FenceBrokers { nodes: vec![1] }, 3).is_err());
        let create = ControllerRequest::DeleteTopics {
            names: vec!["t".into()],
        };
        assert_eq!(forwardable(&create, 3), Ok(()));
        // Every request survives the forwarding encoding.
        let json = serde_json::to_vec(&Forwarded {
            timeout_ms: 5,
            request: heartbeat(2, 4, 1),
        })
        .unwrap();
        let back: Forwarded = serde_json::from_slice(&json).unwrap();
        assert!(matches!(
            back.request,
            ControllerRequest::BrokerHeartbeat { .. }
        ));
    }

    /// A three-replica topic on nodes 1, 2, 3 (2 fenced if `fenced`),
    /// `min.insync.replicas=2`.
    fn replicated(fenced: bool) -> (MetadataImage, [u8; 16]) {
        let mut image = MetadataImage::default();
        for node in 1..=3 {
            let ControllerRequest::BrokerHeartbeat { registration } = heartbeat(node, 1, 1) else {
                unreachable!()
            };
            image = image.apply(&MetadataRecord::RegisterBroker { registration });
        }
        if fenced {
            image = image.apply(&MetadataRecord::FenceBroker { node: 2 });
        }
        let id = [7; 16];
        image = image.apply(&MetadataRecord::CreateTopic {
            name: "r".into(),
            id,
            shards: vec![0],
            configs: [("min.insync.replicas".to_string(), "2".to_string())].into(),
            node: None,
            replicated: vec![PartitionState::new(vec![1000, 2000, 3000])],
        });
        (image, id)
    }

    /// A manual assignment: Kafka's refusals (an empty replica list, a
    /// broker that is not registered, a broker twice, lists of different
    /// lengths); one replica on any live broker is taken.
    #[test]
    fn manual_assignments_are_checked_as_kafka_checks_them() {
        let (image, _) = replicated(false);
        let message =
            |replicas: &[i32], factor: usize| match check_assignment(&image, replicas, factor) {
                Err(ControllerError::InvalidReplicaAssignment(m)) => m,
                other => panic!("{replicas:?}: {other:?}"),
            };
        assert_eq!(
            message(&[], 0),
            "The manual partition assignment includes an empty replica list."
        );
        assert!(message(&[4000], 1).contains("broker 4000, but no such broker is registered"));
        assert!(message(&[1000, 1000], 2).contains("more than once"));
        assert!(message(&[1000], 2).contains("with 1 replica(s)"));
        assert_eq!(check_assignment(&image, &[2000], 1), Ok(()));
        assert_eq!(check_assignment(&image, &[3000, 1000], 2), Ok(()));
    }

    fn alter(id: [u8; 16], broker: i32, epochs: (i32, i32), isr: &[i32]) -> AlterPartition {
        AlterPartition {
            broker,
            topic_id: id,
            partition: 0,
            leader_epoch: epochs.0,
            partition_epoch: epochs.1,
            isr: isr.to_vec(),
            broker_epochs: Vec::new(),
        }
    }

    /// KIP-903: an AlterPartition that adds a member with a broker epoch
    /// that is not its node's current registration's (a fetch of the
    /// node's previous process) is INELIGIBLE_REPLICA and changes nothing;
    /// with the current epoch, or -1 (not checked, as an older node's
    /// request that names none), it is made. Members already in the ISR
    /// are not checked. A forwarded request without the epochs (an older
    /// node's) still decodes, with none.
    #[test]
    fn alter_partition_refuses_a_new_member_with_a_stale_broker_epoch() {
        let config = crate::config::ServeArgs::default().resolve().unwrap();
        let (image, id) = replicated(false);
        let plan =
            |image: &MetadataImage, a: &AlterPartition| plan_alter_partition(image, &config, a);
        // The ISR shrinks to 1000 and 2000: 3000 is the one to add back.
        let (record, _) = plan(&image, &alter(id, 1000, (0, 0), &[1000, 2000]))
            .unwrap()
            .unwrap();
        // Node 3 restarted: its registration is its fifth start's.
        let ControllerRequest::BrokerHeartbeat { mut registration } = heartbeat(3, 1, 1) else {
            unreachable!()
        };
        registration.leader_epoch = 5;
        let image = image
            .apply(&record)
            .apply(&MetadataRecord::RegisterBroker { registration });
        let epoch = |node: i32| image.brokers[&node].registration.broker_epoch();
        assert_eq!(epoch(3), 5);
        let with = |epochs: Vec<(i32, i64)>| AlterPartition {
            broker_epochs: epochs,
            ..alter(id, 1000, (0, 1), &[1000, 2000, 3000])
        };
        let stale = with(vec![
            (1000, epoch(1)),
            (2000, epoch(2)),
            (3000, epoch(3) - 1),
        ]);
        match plan(&image, &stale) {
            Err(ControllerError::IneligibleReplica(m)) => {
                assert!(m.contains("replica 3000") && m.contains("stale"), "{m}")
            }
            other => panic!("a stale epoch: {other:?}"),
        }
        assert_eq!(
            crate::handlers::errors::controller(&plan(&image, &stale).unwrap_err()),
            kafka_protocol::ResponseError::IneligibleReplica.code()
        );
        let state = image.topic("r").unwrap().replica_state(0).unwrap();
        assert_eq!(
            (state.isr.clone(), state.partition_epoch),
            (vec![1000, 2000], 1)
        );
        // A stale epoch of a member already in the ISR is not checked.
        let current = with(vec![(1000, -1), (2000, epoch(2) - 1), (3000, epoch(3))]);
        let (_, state) = plan(&image, &current).unwrap().unwrap();
        assert_eq!(
            (state.isr, state.partition_epoch),
            (vec![1000, 2000, 3000], 2)
        );
        for unchecked in [vec![(3000, -1)], vec![]] {
            let (_, state) = plan(&image, &with(unchecked)).unwrap().unwrap();
            assert_eq!(state.isr, vec![1000, 2000, 3000]);
        }
        // An older node's forwarded request, without the epochs.
        let older = r#"{"AlterPartition":{"broker":1000,"topic_id":[7,7,7,7,7,7,7,7,7,7,7,7,7,7,7,7],"partition":0,"leader_epoch":0,"partition_epoch":1,"isr":[1000,2000,3000]}}"#;
        match serde_json::from_str::<ControllerRequest>(older).unwrap() {
            ControllerRequest::AlterPartition {
                isr, broker_epochs, ..
            } => {
                assert_eq!((isr.len(), broker_epochs), (3, vec![]));
            }
            other => panic!("{other:?}"),
        }
    }

    /// AlterPartition: Kafka's refusals (unknown topic id, not the leader,
    /// stale leader epoch, stale partition epoch, an ISR without the
    /// leader, a fenced or unassigned member); a shrink bumps the
    /// partition epoch, and below `min.insync.replicas` the lost members
    /// join the ELR, which empties once the ISR is back at the minimum;
    /// asking for the ISR it has changes nothing.
    #[test]
    fn alter_partition_is_fenced_by_epochs_and_keeps_the_elr() {
        let config = crate::config::ServeArgs::default().resolve().unwrap();
        let (image, id) = replicated(false);
        let plan =
            |image: &MetadataImage, a: AlterPartition| plan_alter_partition(image, &config, &a);
        let refused = |a: AlterPartition| match plan(&image, a) {
            Err(e) => crate::handlers::errors::controller(&e),
            Ok(_) => 0,
        };
        use kafka_protocol::ResponseError as E;
        assert_eq!(
            refused(alter([9; 16], 1000, (0, 0), &[1000])),
            E::UnknownTopicId.code()
        );
        assert_eq!(
            refused(alter(id, 2000, (0, 0), &[2000])),
            E::NotLeaderOrFollower.code()
        );
        assert_eq!(
            refused(alter(id, 1000, (1, 0), &[1000])),
            E::FencedLeaderEpoch.code()
        );
        assert_eq!(
            refused(alter(id, 1000, (0, 3), &[1000])),
            E::InvalidUpdateVersion.code()
        );
        assert_eq!(
            refused(alter(id, 1000, (0, 0), &[2000])),
            E::InvalidRequest.code()
        );
        assert_eq!(
            refused(alter(id, 1000, (0, 0), &[1000, 4000])),
            E::IneligibleReplica.code()
        );
        let (fenced, _) = replicated(true);
        assert!(matches!(
            plan(&fenced, alter(id, 1000, (0, 0), &[1000, 2000])),
            Err(ControllerError::IneligibleReplica(_))
        ));
        assert!(plan(&image, alter(id, 1000, (0, 0), &[1000, 2000, 3000]))
            .unwrap()
            .is_none());

        let (record, state) = plan(&image, alter(id, 1000, (0, 0), &[1000, 2000]))
            .unwrap()
            .unwrap();
        assert_eq!(
            (state.isr.clone(), state.elr.clone(), state.partition_epoch),
            (vec![1000, 2000], vec![], 1)
        );
        assert_eq!(state.leader_epoch, 0);
        let image = image.apply(&record);
        let (record, state) = plan(&image, alter(id, 1000, (0, 1), &[1000]))
            .unwrap()
            .unwrap();
        assert_eq!(
            (state.isr.clone(), state.elr.clone()),
            (vec![1000], vec![2000])
        );
        let image = image.apply(&record);
        let (_, state) = plan(&image, alter(id, 1000, (0, 2), &[1000, 3000]))
            .unwrap()
            .unwrap();
        assert_eq!(
            (state.isr, state.elr, state.partition_epoch),
            (vec![1000, 3000], vec![], 3)
        );
    }

    /// An AlterPartition is forwarded only from its broker's own node.
    #[test]
    fn a_forwarded_alter_partition_comes_from_its_leaders_node() {
        let a = |broker: i32| ControllerRequest::AlterPartition {
            broker,
            topic_id: [1; 16],
            partition: 0,
            leader_epoch: 0,
            partition_epoch: 0,
            isr: vec![broker],
            broker_epochs: vec![(broker, 0)],
        };
        assert_eq!(forwardable(&a(2001), 3), Ok(()));
        assert!(forwardable(&a(1001), 3).is_err());
    }

    /// Fencing and unfencing (§4.4): a fenced follower leaves the ISR; a
    /// fenced leader is replaced by the next live ISR member in assignment
    /// order with the leader epoch bumped; below `min.insync.replicas` the
    /// lost members join the ELR; with the ISR empty the partition is
    /// offline until an ELR member returns and leads alone; every change
    /// bumps the partition epoch and a live partition changes nothing.
    #[test]
    fn fencing_moves_leaders_within_the_isr_and_the_elr() {
        let config = crate::config::ServeArgs::default().resolve().unwrap();
        let (image, _) = replicated(false);
        let state =
            |image: &MetadataImage| image.topic("r").unwrap().replica_state(0).unwrap().clone();
        let step = |image: &MetadataImage, r: MetadataRecord| {
            let image = image.apply(&r);
            let changes = reconcile_partitions(&image, &config);
            assert!(changes.len() <= 1);
            apply_all(&image, &changes)
        };
        assert!(reconcile_partitions(&image, &config).is_empty());
        // A follower fenced: out of the ISR, still at the minimum.
        let image = step(&image, MetadataRecord::FenceBroker { node: 3 });
        let s = state(&image);
        assert_eq!(
            (s.leader, s.isr.clone(), s.elr.clone()),
            (1000, vec![1000, 2000], vec![])
        );
        assert_eq!((s.leader_epoch, s.partition_epoch), (0, 1));
        // The leader fenced: the next ISR member leads in a new epoch; the
        // ISR is below the minimum, so the old leader is eligible.
        let image = step(&image, MetadataRecord::FenceBroker { node: 1 });
        let s = state(&image);
        assert_eq!(
            (s.leader, s.isr.clone(), s.elr.clone()),
            (2000, vec![2000], vec![1000])
        );
        assert_eq!((s.leader_epoch, s.partition_epoch), (1, 2));
        // The last ISR member fenced: offline, every lost member eligible.
        let image = step(&image, MetadataRecord::FenceBroker { node: 2 });
        let s = state(&image);
        assert_eq!(
            (s.leader, s.isr.clone(), s.elr.clone()),
            (-1, vec![], vec![1000, 2000])
        );
        assert_eq!(s.leader_epoch, 2);
        // Node 3 (out of ISR and ELR) returns: no unclean election.
        let image = step(&image, MetadataRecord::UnfenceBroker { node: 3 });
        assert_eq!(state(&image).leader, -1);
        // An ELR member returns: it leads alone, in a new epoch.
        let image = step(&image, MetadataRecord::UnfenceBroker { node: 2 });
        let s = state(&image);
        assert_eq!(
            (s.leader, s.isr.clone(), s.elr.clone()),
            (2000, vec![2000], vec![1000])
        );
        assert_eq!(s.leader_epoch, 3);
        assert!(reconcile_partitions(&image, &config).is_empty());
    }

    /// UnregisterBroker (§3.2, Kafka's `handleBrokerUnregistered`): any
    /// shard's broker id names its registered node, anything else is
    /// BROKER_ID_NOT_REGISTERED; the registration goes and the partitions
    /// are reconciled as on fencing, but the node's replicas also leave
    /// the ELR (a fenced node's stay), leadership moves within the ISR or
    /// the partition is offline, and the replicas stay assigned; a node
    /// still running registers again with its next heartbeat.
    #[test]
    fn unregistering_a_node_reconciles_its_partitions_as_fencing_does() {
        let config = crate::config::ServeArgs::default().resolve().unwrap();
        let (image, _) = replicated(false);
        let state =
            |image: &MetadataImage| image.topic("r").unwrap().replica_state(0).unwrap().clone();
        let not_registered = |broker: i32| {
            let e = unregister_records(&image, broker, &config).unwrap_err();
            assert_eq!(
                e,
                ControllerError::BrokerIdNotRegistered(format!(
                    "Broker ID {broker} is not currently registered"
                ))
            );
        };
        // Node 4 is not registered; node 1 has one shard (1001 is none of
        // its brokers); node ids are not broker ids.
        for broker in [4000, 1001, -1, 3, i32::MIN] {
            not_registered(broker);
        }
        // Nodes 1 (the leader) and 2 fenced: node 3 alone in the ISR, the
        // ELR holding 2000 (min.insync.replicas 2); node 1 had left the
        // ISR at the minimum, so it is in neither.
        let fenced = apply_all(&image, &fence_records(&image, &[1], &config));
        let fenced = apply_all(&fenced, &fence_records(&fenced, &[2], &config));
        let s = state(&fenced);
        assert_eq!(
            (s.leader, s.isr.clone(), s.elr.clone()),
            (3000, vec![3000], vec![2000])
        );
        // Unregistering fenced node 2 takes 2000 out of the ELR in the
        // same proposal; its replica stays assigned.
        let records = unregister_records(&fenced, 2000, &config).unwrap();
        assert_eq!(records[0], MetadataRecord::UnregisterBroker { node: 2 });
        assert_eq!(records.len(), 2, "{records:?}");
        let gone = apply_all(&fenced, &records);
        assert!(!gone.brokers.contains_key(&2));
        let s = state(&gone);
        assert_eq!(
            (s.leader, s.isr.clone(), s.elr.clone()),
            (3000, vec![3000], vec![])
        );
        assert_eq!(s.replicas, vec![1000, 2000, 3000]);
        assert_eq!(s.partition_epoch, state(&fenced).partition_epoch + 1);
        assert_eq!(s.leader_epoch, state(&fenced).leader_epoch);
        // Fencing node 2 alone would have kept it eligible.
        assert!(reconcile_partitions(&fenced, &config).is_empty());
        // Unknown now.
        assert!(matches!(
            unregister_records(&gone, 2000, &config),
            Err(ControllerError::BrokerIdNotRegistered(_))
        ));
        // Unregistering the live leader, node 3: it leaves the ISR and is
        // not eligible; node 1 is fenced, so the partition is offline in
        // a new leader epoch.
        let records = unregister_records(&gone, 3000, &config).unwrap();
        let offline = apply_all(&gone, &records);
        let s = state(&offline);
        assert_eq!(
            (s.leader, s.isr.clone(), s.elr.clone()),
            (-1, vec![], vec![])
        );
        assert_eq!(s.leader_epoch, state(&gone).leader_epoch + 1);
        assert!(offline.brokers.keys().eq([1].iter()));
        // Node 3, still running, heartbeats: registered again.
        let ControllerRequest::BrokerHeartbeat { registration } = heartbeat(3, 1, 1) else {
            unreachable!()
        };
        let records = heartbeat_records(&offline, registration.clone(), &config).unwrap();
        assert_eq!(records[0], MetadataRecord::RegisterBroker { registration });
        let back = apply_all(&offline, &records);
        assert!(back.live_broker(3).is_some());
        // Its replica is out of the ISR and ELR: no clean leader for it.
        assert_eq!(state(&back).leader, -1);
        // Node 2 restarting after its unregistration leads in an epoch
        // after its last registration's, as a registered node does.
        let epoch_of = |node: i32| image.brokers[&node].registration.leader_epoch;
        assert_eq!(member_start_epoch(&image, 2), epoch_of(2) + 1);
        assert_eq!(member_start_epoch(&gone, 2), epoch_of(2) + 1);
        assert_eq!(member_start_epoch(&gone, 7), 0);
        // A client's UnregisterBroker is forwarded from any node, and
        // survives the forwarding encoding.
        let request = ControllerRequest::UnregisterBroker { broker: 2000 };
        assert_eq!(forwardable(&request, 1), Ok(()));
        let json = serde_json::to_vec(&request).unwrap();
        assert!(matches!(
            serde_json::from_slice::<ControllerRequest>(&json).unwrap(),
            ControllerRequest::UnregisterBroker { broker: 2000 }
        ));
    }

    /// A node back from an unclean shutdown leaves every ISR and ELR (its
    /// log may have lost what its page cache held): a partition it led is
    /// led by the next ISR member in a new epoch; an ELR it was in loses
    /// it. A clean restart keeps it leading, in a new epoch.
    #[test]
    fn an_unclean_restart_takes_the_node_out_of_every_isr_and_elr() {
        let config = crate::config::ServeArgs::default().resolve().unwrap();
        let (image, _) = replicated(false);
        let state =
            |image: &MetadataImage| image.topic("r").unwrap().replica_state(0).unwrap().clone();
        // A restart's registration unfences the node.
        let restart = |image: &MetadataImage, node: i32, clean: bool| {
            let image = &image.apply(&MetadataRecord::UnfenceBroker { node });
            let changes = if clean {
                restarted_leaders(image, node)
            } else {
                unclean_restart(image, node)
            };
            let image = apply_all(image, &changes);
            let reconciled = reconcile_partitions(&image, &config);
            apply_all(&image, &reconciled)
        };
        // The leader, node 1, restarts cleanly: it leads on, epoch 1.
        let image = restart(&image, 1, true);
        let s = state(&image);
        assert_eq!((s.leader, s.leader_epoch), (1000, 1));
        assert_eq!(s.isr, vec![1000, 2000, 3000]);
        // Uncleanly: node 2 leads, epoch 2, node 1 out of the ISR.
        let image = restart(&image, 1, false);
        let s = state(&image);
        assert_eq!((s.leader, s.leader_epoch), (2000, 2));
        assert_eq!((s.isr.clone(), s.elr.clone()), (vec![2000, 3000], vec![]));
        // Nodes 3 then 2 fenced: the ISR empty, both eligible
        // (min.insync.replicas=2); node 1, live, is neither: offline.
        let fence = |image: &MetadataImage, node: i32| {
            let image = image.apply(&MetadataRecord::FenceBroker { node });
            let changes = reconcile_partitions(&image, &config);
            apply_all(&image, &changes)
        };
        let image = fence(&fence(&image, 3), 2);
        let s = state(&image);
        assert_eq!((s.leader, s.elr.clone()), (-1, vec![3000, 2000]));
        // Node 3, eligible, restarts uncleanly: no longer eligible.
        let image = restart(&image, 3, false);
        assert_eq!(state(&image).elr, vec![2000]);
        // Node 2, the last eligible replica, restarts uncleanly: kept, and
        // it leads once live (it is: its restart registered it).
        let image = restart(&image, 2, false);
        let s = state(&image);
        assert_eq!(
            (s.leader, s.isr.clone(), s.elr.clone()),
            (2000, vec![2000], vec![])
        );
    }

    /// With `unclean.leader.election.enable=true`, a partition whose ISR
    /// and ELR have no live member is led by the first live replica, alone
    /// in the ISR, the ELR cleared, in a new leader epoch (Kafka's unclean
    /// election); a returning ELR member then joins no ISR it was not in.
    #[test]
    fn unclean_election_when_the_topic_allows_it() {
        let config = crate::config::ServeArgs::default().resolve().unwrap();
        let (image, _) = replicated(false);
        let image = image.apply(&MetadataRecord::SetTopicConfigs {
            name: "r".into(),
            configs: [
                ("min.insync.replicas".to_string(), "2".to_string()),
                (
                    "unclean.leader.election.enable".to_string(),
                    "true".to_string(),
                ),
            ]
            .into(),
        });
        let state =
            |image: &MetadataImage| image.topic("r").unwrap().replica_state(0).unwrap().clone();
        let step = |image: &MetadataImage, r: MetadataRecord| {
            let image = image.apply(&r);
            let changes = reconcile_partitions(&image, &config);
            apply_all(&image, &changes)
        };
        // Node 3 fenced, then 1 and 2: offline, 1 and 2 eligible (ELR),
        // as without the config.
        let image = step(&image, MetadataRecord::FenceBroker { node: 3 });
        let image = step(&image, MetadataRecord::FenceBroker { node: 1 });
        let image = step(&image, MetadataRecord::FenceBroker { node: 2 });
        let s = state(&image);
        assert_eq!((s.leader, s.elr.clone()), (-1, vec![1000, 2000]));
        let epoch = s.leader_epoch;
        // Node 3, out of ISR and ELR, returns: it leads, uncleanly.
        let image = step(&image, MetadataRecord::UnfenceBroker { node: 3 });
        let s = state(&image);
        assert_eq!(
            (s.leader, s.isr.clone(), s.elr.clone()),
            (3000, vec![3000], vec![])
        );
        assert_eq!(s.leader_epoch, epoch + 1);
        assert!(reconcile_partitions(&image, &config).is_empty());
    }

    /// Four nodes of one shard each; topic "m" of two replicas on nodes 1
    /// and 2 (1 leading), `min.insync.replicas=2`.
    fn four_nodes() -> (MetadataImage, [u8; 16]) {
        let mut image = MetadataImage::default();
        for node in 1..=4 {
            let ControllerRequest::BrokerHeartbeat { registration } = heartbeat(node, 1, 1) else {
                unreachable!()
            };
            image = image.apply(&MetadataRecord::RegisterBroker { registration });
        }
        let id = [9; 16];
        image = image.apply(&MetadataRecord::CreateTopic {
            name: "m".into(),
            id,
            shards: vec![0],
            configs: [("min.insync.replicas".to_string(), "2".to_string())].into(),
            node: None,
            replicated: vec![PartitionState::new(vec![1000, 2000])],
        });
        (image, id)
    }

    fn state_of(image: &MetadataImage) -> PartitionState {
        image.topic("m").unwrap().replica_state(0).unwrap().clone()
    }

    fn reassign(
        image: &MetadataImage,
        target: Option<&[i32]>,
    ) -> Result<Option<MetadataImage>, ControllerError> {
        plan_reassignment(image, "m", 0, target, true).map(|r| r.map(|r| image.apply(&r)))
    }

    /// KIP-455: {1,2} to {2,3} adds 3 and removes 1, the replicas listed
    /// as the target then the removed ones; the leader's AlterPartition
    /// that brings 3 into the ISR completes it in the same change, and the
    /// removed leader is replaced by the first ISR member of the target in
    /// a new leader epoch.
    #[test]
    fn a_reassignment_completes_when_the_added_replicas_join_the_isr() {
        let config = crate::config::ServeArgs::default().resolve().unwrap();
        let (image, id) = four_nodes();
        let image = reassign(&image, Some(&[2000, 3000])).unwrap().unwrap();
        let s = state_of(&image);
        assert_eq!(s.replicas, vec![2000, 3000, 1000]);
        assert_eq!(
            (s.adding.clone(), s.removing.clone()),
            (vec![3000], vec![1000])
        );
        assert_eq!(s.isr, vec![1000, 2000]);
        assert_eq!((s.leader, s.leader_epoch, s.partition_epoch), (1000, 0, 1));
        assert!(s.is_reassigning());
        // The same target again changes nothing.
        assert!(reassign(&image, Some(&[2000, 3000])).unwrap().is_none());
        // 3 joins the ISR: the reassignment completes.
        let (record, done) = plan_alter_partition(
            &image,
            &config,
            &alter(id, 1000, (0, 1), &[1000, 2000, 3000]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(done.replicas, vec![2000, 3000]);
        assert_eq!(done.isr, vec![2000, 3000]);
        assert!(done.adding.is_empty() && done.removing.is_empty());
        assert_eq!(
            (done.leader, done.leader_epoch, done.partition_epoch),
            (2000, 1, 2)
        );
        assert_eq!(state_of(&image.apply(&record)), done);
    }

    /// A reordering or a pure removal whose target is already in the ISR
    /// completes at once; a reordering keeps the leader.
    #[test]
    fn a_reassignment_within_the_isr_completes_at_once() {
        let (image, _) = four_nodes();
        let reordered = state_of(&reassign(&image, Some(&[2000, 1000])).unwrap().unwrap());
        assert_eq!(reordered.replicas, vec![2000, 1000]);
        assert!(!reordered.is_reassigning());
        assert_eq!((reordered.leader, reordered.leader_epoch), (1000, 0));
        let shrunk = state_of(&reassign(&image, Some(&[2000])).unwrap().unwrap());
        assert_eq!(
            (shrunk.replicas.clone(), shrunk.isr.clone()),
            (vec![2000], vec![2000])
        );
        assert!(!shrunk.is_reassigning());
        assert_eq!((shrunk.leader, shrunk.leader_epoch), (2000, 1));
        // v1 without allowReplicationFactorChange: the removal is refused.
        assert!(matches!(
            plan_reassignment(&image, "m", 0, Some(&[2000]), false),
            Err(ControllerError::InvalidReplicationFactor(_))
        ));
        assert!(plan_reassignment(&image, "m", 0, Some(&[2000, 3000]), false).is_ok());
    }

    /// Cancelling goes back to the original replicas (the added ones leave
    /// the replicas and the ISR; the leader stays); with nothing in progress it is
    /// NO_REASSIGNMENT_IN_PROGRESS. A new target replaces one in progress
    /// from the original replicas.
    #[test]
    fn a_reassignment_is_cancelled_or_replaced() {
        let (image, _) = four_nodes();
        assert_eq!(
            reassign(&image, None).unwrap_err(),
            ControllerError::NoReassignmentInProgress
        );
        let moving = reassign(&image, Some(&[2000, 3000])).unwrap().unwrap();
        let back = state_of(&reassign(&moving, None).unwrap().unwrap());
        // The original replicas in the reassignment's order, as Kafka's
        // `PartitionReassignmentRevert` (the replicas less the added ones).
        assert_eq!(
            (back.replicas.clone(), back.isr.clone()),
            (vec![2000, 1000], vec![1000, 2000])
        );
        assert!(!back.is_reassigning());
        assert_eq!(
            (back.leader, back.leader_epoch, back.partition_epoch),
            (1000, 0, 2)
        );
        // Replaced: 3 is no longer added, 4 is.
        let replaced = state_of(&reassign(&moving, Some(&[4000, 2000])).unwrap().unwrap());
        assert_eq!(replaced.replicas, vec![4000, 2000, 1000]);
        assert_eq!(
            (replaced.adding.clone(), replaced.removing.clone()),
            (vec![4000], vec![1000])
        );
    }

    /// Kafka's errors: unknown topic or partition, an empty target, a
    /// broker twice, an unregistered broker; fjord's: two replicas on one
    /// node, and a topic of one replica.
    #[test]
    fn reassignment_errors_are_kafkas() {
        let (mut image, _) = four_nodes();
        let unknown = |r: Result<Option<MetadataRecord>, ControllerError>| {
            matches!(r, Err(ControllerError::UnknownPartition(_)))
        };
        assert!(unknown(plan_reassignment(
            &image,
            "x",
            0,
            Some(&[1000]),
            true
        )));
        assert!(unknown(plan_reassignment(
            &image,
            "m",
            1,
            Some(&[1000]),
            true
        )));
        assert!(unknown(plan_reassignment(&image, "m", -1, None, true)));
        let invalid = |image: &MetadataImage, target: &[i32]| {
            matches!(
                plan_reassignment(image, "m", 0, Some(target), true),
                Err(ControllerError::InvalidReplicaAssignment(_))
            )
        };
        assert!(invalid(&image, &[]));
        assert!(invalid(&image, &[2000, 2000]));
        assert!(invalid(&image, &[2000, 9000]));
        assert!(invalid(&image, &[2000, 3001]));
        assert!(invalid(&image, &[-1]));
        // Fenced but registered brokers are accepted (Kafka's).
        image = image.apply(&MetadataRecord::FenceBroker { node: 3 });
        assert!(!invalid(&image, &[2000, 3000]));
        image = image.apply(&MetadataRecord::CreateTopic {
            name: "one".into(),
            id: [3; 16],
            shards: vec![0],
            configs: BTreeMap::new(),
            node: Some(1),
            replicated: vec![],
        });
        assert!(matches!(
            plan_reassignment(&image, "one", 0, Some(&[2000]), true),
            Err(ControllerError::InvalidReplicaAssignment(_))
        ));
    }

    /// The new fields are left out of records without a reassignment and
    /// default when absent, so logs written before still load.
    #[test]
    fn partition_states_without_reassignment_fields_still_load() {
        let s = PartitionState::new(vec![1000, 2000]);
        let json = serde_json::to_string(&s).unwrap();
        assert!(!json.contains("adding") && !json.contains("removing"));
        let back: PartitionState = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s);
    }
}
