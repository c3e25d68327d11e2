//! Partition replication across nodes, Kafka's ISR protocol
//! (`docs/replication.md` §4): followers fetch from their partition's
//! leader with a replica id and append its batches unchanged.
//!
//! Built so far:
//! - the follower's fetcher ([`fetcher`]) over a Kafka client connection
//!   of the broker's own ([`client`]), driven against a real leader
//!   through the [`fetcher::FollowerLog`] seam;
//! - the shard's replica manager ([`manager`]): one fetcher per leader
//!   broker the shard follows partitions of, started, moved and stopped as
//!   the metadata image changes, and `FollowerLog` over the shard's
//!   partitions;
//! - the leader's rules ([`leader`]): follower fetch positions, caught-up
//!   followers, the high watermark from the maximal ISR (KIP-966 under
//!   `min.insync.replicas`), acks=all outcomes, ISR shrink and expand
//!   proposals — pure state, tested alone;
//! - the leader's Fetch path for replicas and its ISR ([`leading`]): a
//!   [`leader::LeaderState`] per led partition fed by follower fetches,
//!   the HW into the log, acks=all on it, AlterPartition proposals
//!   (`docs/replication.md` §4.3).
//!
//! The metadata side (replica placement, `PartitionChange`, AlterPartition
//! and elections at the controller) is in `metadata` and
//! `shard::controller` (§4.3, §4.4).

pub mod client;
pub mod fetcher;
pub mod leader;
pub mod leading;
pub mod manager;
pub mod peers;

/// A partition of `tp` over a fresh log in `dir`, with the default
/// settings (the unit tests' leader or follower replica).
#[cfg(test)]
async fn test_partition(
    dir: &std::path::Path,
    tp: &crate::types::TopicPartition,
) -> std::rc::Rc<crate::partition::Partition> {
    let mgr = crate::log::LogManager::new_for_shard(
        dir.to_path_buf(),
        crate::log::TailCache::new(1 << 20),
        0,
    );
    let log = mgr
        .open(tp, crate::log::LogConfig::default())
        .await
        .expect("a log");
    let config = crate::metadata::TopicConfig::resolve(
        &std::collections::BTreeMap::new(),
        &crate::config::ServeArgs::default()
            .resolve()
            .expect("default settings"),
    );
    crate::partition::Partition::open(tp.clone(), [7; 16], log, config, 1_000)
        .await
        .expect("a partition")
}
