//! fjord: a Kafka-compatible message broker, thread-per-core on io_uring.
//!
//! Modules follow DESIGN.md §8's layering; a module uses only those listed
//! before it here:
//! `alloc`, `config`, `types` → `record`, `protocol` → `runtime`, `log` → `producer`,
//! `metadata`, `group` → `shard` → `txn` → `handlers` → `net` → `server`.
//! (`ShardCtx` holds its shard's transaction coordinator, so that handlers
//! reach all per-shard state through one context: the one reference from a
//! layer to one above it.)

pub mod alloc;
pub mod config;
pub mod types;

pub mod protocol;
pub mod record;

pub mod log;
pub mod runtime;

pub mod metadata;
pub mod producer;

pub mod group;

pub mod shard;

pub mod txn;

pub mod handlers;
pub mod net;
pub mod server;

pub mod bench;
pub mod chaos;
pub mod fuzzing;
pub mod report;
