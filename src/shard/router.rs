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

use super::messages::ShardMessage;
use glommio::channels::channel_mesh::Senders;

/// Sends messages to other shards. Lives on one shard (not `Send`).
pub struct Router {
    shard: usize,
    cores: usize,
    senders: Senders<ShardMessage>,
}

/// The peer shard's mesh is gone (it is shutting down).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("shard {0} is not reachable")]
pub struct ShardUnreachable(pub usize);

impl Router {
    pub fn new(shard: usize, cores: usize, senders: Senders<ShardMessage>) -> Router {
        Router {
            shard,
            cores,
            senders,
        }
    }

    pub fn shard(&self) -> usize {
        self.shard
    }

    pub fn cores(&self) -> usize {
        self.cores
    }

    /// Delivers `message` to `shard`'s receive loop. Must not be called with
    /// this shard's own id: local work is done by a direct call instead.
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

    /// Stops sending: peers' receive loops end once drained.
    pub fn close(&self) {
        self.senders.close();
    }
}
