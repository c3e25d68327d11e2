//! Partition replication across nodes, Kafka's ISR protocol
//! (`docs/replication.md` §4): followers fetch from their partition's
//! leader with a replica id and append its batches unchanged.
//!
//! Built so far:
//! - the follower's fetcher ([`fetcher`]) over a Kafka client connection
//!   of the broker's own ([`client`]), driven against a real leader
//!   through the [`fetcher::FollowerLog`] seam;
//! - the leader's rules ([`leader`]): follower fetch positions, caught-up
//!   followers, the high watermark from the maximal ISR (KIP-966 under
//!   `min.insync.replicas`), acks=all outcomes, ISR shrink and expand
//!   proposals — pure state, tested alone.
//!
//! Not built yet (§9 step 3): replica assignments in the metadata, the
//! shard's replica manager that starts one fetcher per leader broker from
//! the metadata image and implements `FollowerLog` over its partitions,
//! the leader's Fetch path recording follower fetches into a
//! [`leader::LeaderState`] and reading replicas up to the log end, and
//! AlterPartition through the controller.

pub mod client;
pub mod fetcher;
pub mod leader;
pub mod leading;
