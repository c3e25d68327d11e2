//! The broker an interop test runs against: a fjord broker of its own, or
//! the external broker named by `FJORD_TEST_BROKER=kafka:HOST:PORT` (the
//! differential run against stock Kafka, e.g. `scripts/kafka-peer.sh start`
//! then `FJORD_TEST_BROKER=kafka:127.0.0.1:19092 cargo test --test
//! interop_java`).

use super::{Broker, BrokerOpts};
use std::sync::OnceLock;

/// Environment variable naming an external broker (`kafka:HOST:PORT`).
pub const TARGET_ENV: &str = "FJORD_TEST_BROKER";

/// Where a test's clients and tools go.
pub enum Target {
    Fjord(Broker),
    External(String),
}

impl Target {
    /// The broker named by `FJORD_TEST_BROKER`, or a fresh fjord broker
    /// started with `opts`.
    pub fn start(opts: BrokerOpts) -> Target {
        match std::env::var(TARGET_ENV) {
            Ok(v) if !v.trim().is_empty() => {
                let addr = v.trim().strip_prefix("kafka:").unwrap_or_else(|| {
                    panic!("{TARGET_ENV} must look like kafka:HOST:PORT, not {v:?}")
                });
                Target::External(addr.to_string())
            }
            _ => Target::Fjord(Broker::start(opts)),
        }
    }

    pub fn bootstrap(&self) -> String {
        match self {
            Target::Fjord(b) => b.bootstrap(),
            Target::External(addr) => addr.clone(),
        }
    }

    /// The port of the target's (first) broker.
    pub fn port(&self) -> u16 {
        let b = self.bootstrap();
        b.rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {b}"))
    }

    pub fn is_fjord(&self) -> bool {
        matches!(self, Target::Fjord(_))
    }

    /// The broker, for reports.
    pub fn label(&self) -> String {
        match self {
            Target::Fjord(b) => format!("fjord at {}", b.bootstrap()),
            Target::External(addr) => format!("external broker at {addr}"),
        }
    }

    /// `base` as a topic, group or transactional id: as it is on a fresh
    /// fjord; with this run's process id and time on an external broker,
    /// which keeps what earlier runs created.
    pub fn name(&self, base: &str) -> String {
        match self {
            Target::Fjord(_) => base.to_string(),
            Target::External(_) => {
                static SUFFIX: OnceLock<String> = OnceLock::new();
                let suffix = SUFFIX.get_or_init(|| {
                    let ms = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_millis())
                        .unwrap_or_default();
                    format!("{}-{ms}", std::process::id())
                });
                format!("{base}-{suffix}")
            }
        }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        // A fjord broker that died during the test is a failure of its own,
        // even if everything the test read looked right.
        if let Target::Fjord(b) = self {
            if !std::thread::panicking() {
                b.assert_alive();
            }
        }
    }
}
