//! The lease that lets a node of a cluster act as a partition leader or
//! coordinator (`docs/replication.md` §3.3).
//!
//! The metadata quorum fences a node whose broker heartbeats stopped for
//! the session timeout and gives its partitions (coordinators included)
//! to other nodes. A node cut off from the quorum learns that only once
//! it hears from the quorum again; until then its image still names it
//! leader. Kafka's brokers go on serving from such an image; fjord's do
//! not: a node acts as a leader or coordinator only while it holds a
//! lease, which a heartbeat renews once the quorum's leader answered it:
//!
//! - it runs from the heartbeat's *send* time for the session timeout.
//!   The controller received the heartbeat after that, and fences the
//!   node no sooner than a session timeout after the last heartbeat it
//!   received, so the lease ends before any other node can be made
//!   leader in its place (both clocks are monotonic clocks that run at
//!   the same rate over seconds);
//! - the quorum's leader answers a heartbeat only once it has confirmed,
//!   after receiving it, that a majority still follows it (a Raft
//!   ReadIndex round, or a commit): a deposed leader that does not know
//!   it yet renews nobody's lease, its own node's included;
//! - it counts on a shard only once that shard's image holds everything
//!   the quorum's leader had applied when it answered
//!   ([`MetadataImage::version`] at least the version the node's
//!   controller had reached after applying as far): a healed node's
//!   first heartbeat is answered (it unfences the node) before the node
//!   has applied the records that moved its leaderships away, and a shard
//!   may apply an image later than the controller.
//!
//! Without the lease the node answers NOT_LEADER_OR_FOLLOWER and
//! NOT_COORDINATOR, which clients retry. A single node has no quorum to
//! hear from and always acts.
//!
//! One lease per node, shared by its shards (the heartbeats run on
//! shard 0); renewals only move it forward.

use super::MetadataImage;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A node's lease (module doc).
#[derive(Debug)]
pub struct NodeLease {
    /// None: a single node, which always acts.
    base: Option<Instant>,
    /// Nanoseconds after `base` until which the lease holds; 0: never
    /// renewed.
    until: AtomicU64,
    /// The image version a shard must hold for the lease to count.
    version: AtomicU64,
}

impl NodeLease {
    /// A single node's: it always holds.
    pub fn single() -> NodeLease {
        NodeLease {
            base: None,
            until: AtomicU64::new(0),
            version: AtomicU64::new(0),
        }
    }

    /// A cluster node's: it holds from the first renewal on.
    pub fn cluster() -> NodeLease {
        NodeLease {
            base: Some(crate::clock::monotonic()),
            until: AtomicU64::new(0),
            version: AtomicU64::new(0),
        }
    }

    /// A heartbeat sent at `sent` was answered by the quorum's leader, and
    /// this node's controller has applied the log as far as that answer
    /// named, reaching image `version`: the lease holds until `sent +
    /// duration` on shards whose image is at least `version`. A renewal
    /// older than the last one changes nothing.
    pub fn renew(&self, sent: Instant, duration: Duration, version: u64) {
        let Some(base) = self.base else { return };
        let until = (sent + duration).saturating_duration_since(base).as_nanos();
        let until = u64::try_from(until).unwrap_or(u64::MAX).max(1);
        // The version first: a shard that sees the new end sees it too.
        self.version.fetch_max(version, Ordering::AcqRel);
        self.until.fetch_max(until, Ordering::AcqRel);
    }

    /// Whether a shard holding `image` may act as a leader or coordinator
    /// now.
    pub fn holds(&self, image: &MetadataImage) -> bool {
        let Some(base) = self.base else { return true };
        let until = self.until.load(Ordering::Acquire);
        let version = self.version.load(Ordering::Acquire);
        let now = crate::clock::monotonic().saturating_duration_since(base);
        until != 0 && (now.as_nanos() as u64) < until && image.version >= version
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(version: u64) -> MetadataImage {
        MetadataImage {
            version,
            ..Default::default()
        }
    }

    #[test]
    fn a_single_node_always_holds_it() {
        assert!(NodeLease::single().holds(&image(0)));
    }

    #[test]
    fn it_runs_from_the_send_time_for_the_duration() {
        let lease = NodeLease::cluster();
        assert!(!lease.holds(&image(5)), "not before the first renewal");
        let now = crate::clock::monotonic();
        lease.renew(now, Duration::from_secs(60), 3);
        assert!(lease.holds(&image(3)));
        // Sent long enough ago that it is over already.
        let lease = NodeLease::cluster();
        std::thread::sleep(Duration::from_millis(20));
        lease.renew(
            crate::clock::monotonic() - Duration::from_millis(15),
            Duration::from_millis(10),
            0,
        );
        assert!(!lease.holds(&image(0)));
    }

    #[test]
    fn it_counts_only_on_an_image_as_new_as_the_answer() {
        let lease = NodeLease::cluster();
        lease.renew(crate::clock::monotonic(), Duration::from_secs(60), 7);
        assert!(!lease.holds(&image(6)));
        assert!(lease.holds(&image(7)));
        assert!(lease.holds(&image(8)));
    }

    #[test]
    fn an_older_renewal_moves_nothing_back() {
        let lease = NodeLease::cluster();
        let now = crate::clock::monotonic();
        lease.renew(now, Duration::from_secs(60), 7);
        lease.renew(now, Duration::from_millis(0), 2);
        assert!(lease.holds(&image(7)));
        assert!(!lease.holds(&image(2)));
    }
}
