//! fjord: a Kafka-compatible message broker, thread-per-core on io_uring.
//!
//! Modules follow DESIGN.md §8's layering; a module uses only those listed
//! before it here:
//! `config`, `types` → `record`, `protocol` → `runtime`, `log` → `producer`,
//! `metadata` → `shard` → `fetch` → `handlers` → `net` → `server`.

pub mod config;
pub mod types;

pub mod protocol;
pub mod record;

pub mod log;
pub mod runtime;

pub mod metadata;
pub mod producer;

pub mod shard;

pub mod fetch;
pub mod handlers;
pub mod net;
pub mod server;

pub mod bench;
pub mod report;
