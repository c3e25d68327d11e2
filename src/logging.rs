//! The broker's log output (`tracing`), and its filter changed at run time.
//!
//! One global subscriber serves every shard: `tracing`'s dispatcher is
//! process-wide, each shard's thread logs through it, and the filter sits
//! behind `tracing_subscriber`'s reload layer. Changing it
//! ([`set_filter`], `PUT /loglevel` on the metrics endpoint) swaps the
//! filter for all shards at once and rebuilds `tracing`'s per-callsite
//! interest cache, so a callsite that was off (a `debug!`) starts logging
//! on every shard from its next event. The cost: the reload layer keeps
//! the filter in an `RwLock`, so every event that is logged takes an
//! uncontended read lock (a few atomic operations, next to formatting and
//! writing a line); a disabled callsite is still decided by the interest
//! cache, as before, without touching the lock. Nothing on the request
//! path logs at the default `info`.
//!
//! The filter at start is `RUST_LOG` (an `EnvFilter` directive string,
//! e.g. `info,fjord::net=debug`), else `info`.

use std::sync::OnceLock;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, reload, EnvFilter, Registry};

/// Longest filter directive string [`set_filter`] accepts.
pub const FILTER_BYTES_MAX: usize = 4 * 1024;

/// The handle that swaps the filter; set once, by [`init`].
static FILTER: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();

/// Installs the process's subscriber: the text format, or one JSON object
/// per line (with the thread name, which says which shard logged). Does
/// nothing if a subscriber is installed already (tests in one process).
pub fn init(json: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let (filter, handle) = reload::Layer::new(filter);
    let registry = tracing_subscriber::registry().with(filter);
    let installed = if json {
        registry
            .with(
                fmt::layer()
                    .json()
                    .with_thread_names(true)
                    .with_current_span(false)
                    .with_writer(std::io::stderr),
            )
            .try_init()
    } else {
        registry
            .with(fmt::layer().with_writer(std::io::stderr))
            .try_init()
    };
    if installed.is_ok() {
        let _ = FILTER.set(handle);
    }
}

/// Why a filter was not applied.
#[derive(Debug, PartialEq)]
pub enum FilterError {
    /// No subscriber of ours is installed ([`init`] was not called or lost).
    NotInstalled,
    /// Empty, or longer than [`FILTER_BYTES_MAX`].
    BadLength,
    /// Not an `EnvFilter` directive string; the parser's message.
    Invalid(String),
}

impl std::fmt::Display for FilterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FilterError::NotInstalled => write!(f, "the log filter cannot be changed"),
            FilterError::BadLength => write!(
                f,
                "a filter is 1 to {FILTER_BYTES_MAX} bytes of EnvFilter directives"
            ),
            FilterError::Invalid(e) => write!(f, "invalid filter: {e}"),
        }
    }
}

/// The filter in force, as a directive string.
pub fn current_filter() -> Option<String> {
    FILTER.get()?.with_current(|f| f.to_string()).ok()
}

/// Parses `directives` (`EnvFilter` syntax, e.g. `debug` or
/// `info,fjord::handlers=trace`) and makes it the filter of every shard;
/// returns the filter now in force. A string that does not parse changes
/// nothing.
pub fn set_filter(directives: &str) -> Result<String, FilterError> {
    let directives = directives.trim();
    if directives.is_empty() || directives.len() > FILTER_BYTES_MAX {
        return Err(FilterError::BadLength);
    }
    let handle = FILTER.get().ok_or(FilterError::NotInstalled)?;
    let filter = EnvFilter::builder()
        .parse(directives)
        .map_err(|e| FilterError::Invalid(e.to_string()))?;
    handle
        .reload(filter)
        .map_err(|_| FilterError::NotInstalled)?;
    current_filter().ok_or(FilterError::NotInstalled)
}
