//! The one way work crosses cores: a full glommio channel mesh between shards
//! and `invoke_on(shard, message)`.
//!
//! Only control traffic travels here — metadata changes to the controller
//! (shard 0), new metadata images back to every shard, and later coordinator
//! requests and transaction markers. Produce and Fetch never cross cores: a
//! partition is served only by the shard that owns it (each shard is its own
//! Kafka node), because a cross-core hop costs far more than a whole
//! same-core request (measured ~110 µs vs ~26 µs on this machine).
//!
//! A reply comes back on a `futures` oneshot channel carried in the message;
//! the receiving shard's task is woken by glommio's foreign-wakeup path.
//!
//! Every wait for another shard is bounded: [`Router::call`] gives up at a
//! deadline, by default `--cross-shard-timeout-ms` (30 s) from now, so one
//! slow or stuck shard cannot hold the requests of the others for ever.
//! Giving up only stops the waiting: a message already queued is still
//! handled by the slow shard when it gets to it (its answer is dropped), so
//! every message must be safe to apply late. What each caller answers on a
//! timeout, and why a late application is harmless there:
//!
//! | wait | answer on timeout (Kafka's for the same situation) | applied late |
//! |---|---|---|
//! | a controller request from another shard (CreateTopics, DeleteTopics, CreatePartitions, AlterConfigs, auto-creation) | REQUEST_TIMED_OUT | not at all: the controller drops a request whose deadline passed before it started (see `controller`) |
//! | the controller's broadcast of a new image | REQUEST_TIMED_OUT (the change is persisted and served by the shards that acked) | the slow shard applies it when it resumes; the controller re-sends its newest image until that shard acks, so it converges even if no later change comes |
//! | an internal topic created on first use (FindCoordinator, transactional InitProducerId, AddOffsetsToTxn) | COORDINATOR_NOT_AVAILABLE | as any controller request |
//! | a producer-id block (InitProducerId) | COORDINATOR_LOAD_IN_PROGRESS until a block arrives, as right after start-up; the next InitProducerId asks again | a block persisted after its requester gave up is skipped (ids are never reused) |
//! | AddPartitionsToTxn from a partition leader (Produce v12+, KIP-890 verification) | NOT_ENOUGH_REPLICAS, which every producer retries | a partition added to a transaction it was not written in gets a marker and nothing else |
//! | transaction markers to another shard | REQUEST_TIMED_OUT for those markers: the coordinator retries them | a marker written twice: the second is refused as stale (transaction version 2) or is a second marker for a transaction already ended, which readers skip |
//!
//! Not bounded: a shard's wait for its first image at start-up (log
//! recovery takes as long as it takes; the broker is not ready before), and
//! the controller's background re-sending of its image to a shard that
//! missed one (no request waits on it).

use super::messages::ShardMessage;
use futures::channel::oneshot;
use glommio::channels::channel_mesh::Senders;
use std::future::Future;
use std::time::{Duration, Instant};

/// Sends messages to other shards. Lives on one shard (not `Send`).
pub struct Router {
    shard: usize,
    cores: usize,
    senders: Senders<ShardMessage>,
    timeout: Duration,
}

/// The peer shard's mesh is gone (it is shutting down).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("shard {0} is not reachable")]
pub struct ShardUnreachable(pub usize);

/// Why a [`Router::call`] brought no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    #[error("shard {0} is not reachable")]
    Unreachable(usize),
    #[error("shard {0} did not answer in time")]
    TimedOut(usize),
}

pub use crate::runtime::within;

impl Router {
    pub fn new(
        shard: usize,
        cores: usize,
        senders: Senders<ShardMessage>,
        timeout: Duration,
    ) -> Router {
        Router {
            shard,
            cores,
            senders,
            timeout,
        }
    }

    pub fn shard(&self) -> usize {
        self.shard
    }

    pub fn cores(&self) -> usize {
        self.cores
    }

    /// `--cross-shard-timeout-ms`.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The deadline of a cross-shard wait that starts now.
    pub fn deadline(&self) -> Instant {
        crate::clock::monotonic() + self.timeout
    }

    /// Delivers `message` to `shard`'s receive loop. Must not be called with
    /// this shard's own id: local work is done by a direct call instead.
    /// Waits while the channel to `shard` is full; callers that wait for an
    /// answer use [`Router::call`], which bounds that too.
    pub async fn send_to(
        &self,
        shard: usize,
        message: ShardMessage,
    ) -> Result<(), ShardUnreachable> {
        debug_assert_ne!(shard, self.shard, "local work must not go through the mesh");
        self.senders
            .send_to(shard, message)
            .await
            .map_err(|_| ShardUnreachable(shard))
    }

    /// Sends the message `make` builds around a reply channel to `shard` and
    /// waits for the reply, both until `deadline`. A message sent before the
    /// deadline stays queued at `shard` (see the module doc).
    pub async fn call<T>(
        &self,
        shard: usize,
        deadline: Instant,
        make: impl FnOnce(oneshot::Sender<T>) -> ShardMessage,
    ) -> Result<T, CallError> {
        let (tx, rx) = oneshot::channel();
        let exchange = async {
            self.send_to(shard, make(tx))
                .await
                .map_err(|_| CallError::Unreachable(shard))?;
            // A dropped reply sender: the peer ended without answering.
            rx.await.map_err(|_| CallError::Unreachable(shard))
        };
        within(deadline, exchange)
            .await
            .unwrap_or(Err(CallError::TimedOut(shard)))
    }

    /// Runs a request on `shard`: on this shard by `local(payload)`
    /// directly, elsewhere as the message `make(payload, reply)` through
    /// the mesh, waiting for the answer until `deadline` ([`Router::call`]).
    /// The one way every caller picks between the local call and the mesh.
    pub async fn invoke<P, T, F: Future<Output = T>>(
        &self,
        shard: usize,
        deadline: Instant,
        payload: P,
        local: impl FnOnce(P) -> F,
        make: impl FnOnce(P, oneshot::Sender<T>) -> ShardMessage,
    ) -> Result<T, CallError> {
        if shard == self.shard {
            return Ok(local(payload).await);
        }
        self.call(shard, deadline, |reply| make(payload, reply))
            .await
    }

    /// Stops sending: peers' receive loops end once drained.
    pub fn close(&self) {
        self.senders.close();
    }
}
