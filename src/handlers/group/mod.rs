//! Handlers of the group APIs: FindCoordinator, the classic membership
//! protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup), offsets
//! (OffsetCommit, OffsetFetch, OffsetDelete, TxnOffsetCommit) and the
//! admin APIs (ListGroups, DescribeGroups, DeleteGroups), and KIP-848's
//! ConsumerGroupHeartbeat and ConsumerGroupDescribe. They translate
//! between kafka-protocol's types and [`crate::group::GroupCoordinator`];
//! all group logic lives there. A request for a group this shard does not
//! coordinate gets NOT_COORDINATOR (never forwarded: the client asks
//! FindCoordinator and reconnects, as with Kafka).

pub mod admin;
pub mod consumer;
pub mod find_coordinator;
pub mod membership;
pub mod offsets;
