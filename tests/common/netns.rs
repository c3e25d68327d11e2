//! Hosts on one machine for multi-node tests: the library's
//! `fjord::chaos::netns` (each host a Linux network namespace with its own
//! address on a private bridge, made by the test and removed when it ends;
//! issue 30, docs/replication.md §8), with the panics a test wants where
//! the library returns errors. `fjord chaos --netns` uses the same code.
//!
//! Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN), as `.ci/run` has. Names
//! carry the test process's id and each net takes a free /24 under a lock,
//! so concurrent test binaries (and chaos runs) never share a namespace or
//! a subnet.

pub use fjord::chaos::netns::Host;
use std::process::Command;

/// A bridge and the hosts on it; everything is removed on drop (the
/// processes started in the hosts must be stopped first).
pub struct Net {
    inner: fjord::chaos::netns::Net,
    /// The test's own address on the bridge.
    pub gateway: std::net::Ipv4Addr,
}

impl Net {
    /// A bridge with `hosts` hosts on it, each reachable from the test.
    /// Panics (with what `ip` said) where namespaces cannot be made: the
    /// multi-node tests need them, and skipping would hide that.
    pub fn new(hosts: usize) -> Net {
        let inner = fjord::chaos::netns::Net::new(hosts).unwrap_or_else(|e| panic!("{e}"));
        Net {
            gateway: inner.gateway,
            inner,
        }
    }

    pub fn host(&self, i: usize) -> &Host {
        self.inner.host(i)
    }

    pub fn hosts(&self) -> &[Host] {
        self.inner.hosts()
    }

    /// `program ARGS` to be run inside host `i`'s namespace.
    pub fn command(&self, i: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        self.inner.command(i, program)
    }

    /// Cuts host `i` off (its link down on both ends, as a pulled cable).
    pub fn cut(&self, i: usize) {
        self.inner.cut(i).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Reconnects host `i` after [`Self::cut`].
    pub fn heal(&self, i: usize) {
        self.inner.heal(i).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Cuts host `i` off from the other hosts only (blackhole routes both
    /// ways); the test still reaches it.
    pub fn isolate(&self, i: usize) {
        self.inner.isolate(i).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Reconnects host `i` to the other hosts after [`Self::isolate`].
    pub fn rejoin(&self, i: usize) {
        self.inner.rejoin(i).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Adds `ms` of delay to everything host `i` sends; 0 removes it.
    pub fn delay(&self, i: usize, ms: u32) {
        self.inner.delay(i, ms).unwrap_or_else(|e| panic!("{e}"));
    }
}
