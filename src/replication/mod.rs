//! Partition replication across nodes, Kafka's ISR protocol
//! (`docs/replication.md` §4): followers fetch from their partition's
//! leader with a replica id and append its batches unchanged.
//!
//! Built so far: the follower's fetcher ([`fetcher`]) over a Kafka client
//! connection of the broker's own ([`client`]), driven against a real
//! leader through the [`fetcher::FollowerLog`] seam. Not built yet: the
//! shard's replica manager that starts one fetcher per leader broker from
//! the metadata image and implements `FollowerLog` over its partitions,
//! and the leader's side (follower fetch positions, the ISR, the high
//! watermark from them) — §9 step 3.

pub mod client;
pub mod fetcher;
