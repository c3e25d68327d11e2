//! The audit log of authentication: connections accepted, authenticated
//! (principal, mechanism, client address) and failed (client address, the
//! user named, the mechanism and why; never a password), as `tracing`
//! events with target `fjord::audit` so they can be routed apart
//! (`RUST_LOG=fjord::audit=info`).
//!
//! Rate-limited per shard and per kind of event: at most
//! `AUDIT_EVENTS_PER_WINDOW_MAX` lines a `AUDIT_WINDOW` per shard; the
//! rest are counted and the count is logged with the next line that gets
//! through, so a client hammering the port with bad passwords cannot fill
//! the disk, and the log still says how many attempts there were.
//! Accepted connections are logged at debug level (a busy broker accepts
//! many), authentications and failures at info and warn.

use std::cell::Cell;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Length of a rate-limiting window.
pub const AUDIT_WINDOW: Duration = Duration::from_secs(1);
/// Lines of one kind a shard logs per window.
pub const AUDIT_EVENTS_PER_WINDOW_MAX: u32 = 20;

#[derive(Clone, Copy)]
enum Kind {
    Accepted = 0,
    Authenticated = 1,
    Failed = 2,
}

struct Window {
    started: Cell<Option<Instant>>,
    logged: Cell<u32>,
    suppressed: Cell<u64>,
}

thread_local! {
    static WINDOWS: [Window; 3] = std::array::from_fn(|_| Window {
        started: Cell::new(None),
        logged: Cell::new(0),
        suppressed: Cell::new(0),
    });
}

/// Whether an event of `kind` may be logged now; Some(suppressed before it).
fn admit(kind: Kind) -> Option<u64> {
    let now = crate::clock::monotonic();
    WINDOWS.with(|w| {
        let w = &w[kind as usize];
        if w.started
            .get()
            .is_none_or(|s| now.saturating_duration_since(s) >= AUDIT_WINDOW)
        {
            w.started.set(Some(now));
            w.logged.set(0);
        }
        if w.logged.get() >= AUDIT_EVENTS_PER_WINDOW_MAX {
            w.suppressed.set(w.suppressed.get() + 1);
            return None;
        }
        w.logged.set(w.logged.get() + 1);
        Some(w.suppressed.replace(0))
    })
}

/// A connection was accepted on `listener` (e.g. `SASL_PLAINTEXT`).
pub fn accepted(peer: Option<SocketAddr>, listener: &str) {
    if let Some(suppressed) = admit(Kind::Accepted) {
        tracing::debug!(target: "fjord::audit", ?peer, listener, suppressed, "connection accepted");
    }
}

/// A client authenticated (or re-authenticated) as `principal`.
pub fn authenticated(
    peer: Option<SocketAddr>,
    principal: &super::Principal,
    mechanism: &str,
    reauthentication: bool,
) {
    if let Some(suppressed) = admit(Kind::Authenticated) {
        tracing::info!(
            target: "fjord::audit",
            ?peer,
            %principal,
            mechanism,
            reauthentication,
            suppressed,
            "authenticated"
        );
    }
}

/// An authentication failed (the connection is closed after the answer).
pub fn failed(peer: Option<SocketAddr>, user: Option<&str>, mechanism: &str, reason: &str) {
    if let Some(suppressed) = admit(Kind::Failed) {
        tracing::warn!(
            target: "fjord::audit",
            ?peer,
            user = user.unwrap_or("-"),
            mechanism,
            reason,
            suppressed,
            "authentication failed"
        );
    }
}

/// A connection was closed for a request its SASL state does not allow
/// (before authentication, or after its session expired).
pub fn refused(peer: Option<SocketAddr>, reason: &str) {
    if let Some(suppressed) = admit(Kind::Failed) {
        tracing::warn!(target: "fjord::audit", ?peer, reason, suppressed, "connection closed by SASL");
    }
}

/// A TLS handshake failed or timed out (the connection is closed): a
/// plaintext client on a TLS port, garbage, an untrusted or missing client
/// certificate.
pub fn tls_failed(peer: Option<SocketAddr>, listener: &str, reason: &str) {
    if let Some(suppressed) = admit(Kind::Failed) {
        tracing::warn!(target: "fjord::audit", ?peer, listener, reason, suppressed, "TLS handshake failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_logs_at_most_its_maximum_and_counts_the_rest() {
        let admitted = (0..AUDIT_EVENTS_PER_WINDOW_MAX + 5)
            .filter(|_| admit(Kind::Failed).is_some())
            .count();
        assert_eq!(admitted as u32, AUDIT_EVENTS_PER_WINDOW_MAX);
        WINDOWS.with(|w| assert_eq!(w[Kind::Failed as usize].suppressed.get(), 5));
    }
}
