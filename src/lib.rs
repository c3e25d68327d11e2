//! fjord: a Kafka-compatible message broker, thread-per-core on io_uring.
//!
//! Modules follow DESIGN.md §8's layering. The layers, lowest first; a
//! module uses only modules of lower layers (`tests/layering.rs` reads this
//! list and checks every `crate::` path in `src/` against it, tests and
//! comments aside):
//!
//! - layer: `alloc`, `clock`
//! - layer: `logging`, `metrics`, `types`
//! - layer: `record`
//! - layer: `protocol`, `runtime`
//! - layer: `log`
//! - layer: `config`
//! - layer: `auth`
//! - layer: `producer`, `metadata`
//! - layer: `partition`
//! - layer: `group`, `txn`, `replication`
//! - layer: `shard`
//! - layer: `handlers`
//! - layer: `net`
//! - layer: `server`
//! - layer: `bench`
//! - layer: `chaos`, `fuzzing`, `report`
//!
//! `auth` (principals, sessions, authentication and ACL evaluation) sits
//! below `metadata` so that the metadata log can store its records
//! (credentials, ACLs) while the handlers above both consult it.
//!
//! The coordinators are handed what they need instead of reaching up: the
//! group coordinator its `__consumer_offsets` partitions, the transaction
//! coordinator an environment (`txn::env::TxnEnv`) that the shard
//! implements.
//!
//! `bench`, `chaos` and `report` (and the librdkafka, tokio and plotters
//! they need) are compiled only with the `tools` feature, on by default;
//! the server build (`--no-default-features --features serve`, what the
//! Debian package ships) is the broker alone.

pub mod alloc;
pub mod clock;
pub mod logging;
pub mod metrics;
pub mod types;

pub mod config;

pub mod auth;

pub mod protocol;
pub mod record;

pub mod log;
pub mod runtime;

pub mod metadata;
pub mod producer;

pub mod partition;

pub mod group;
pub mod replication;
pub mod txn;

pub mod shard;

pub mod handlers;
pub mod net;
pub mod server;

#[cfg(feature = "tools")]
pub mod bench;
#[cfg(feature = "tools")]
pub mod chaos;
pub mod fuzzing;
#[cfg(feature = "tools")]
pub mod report;
