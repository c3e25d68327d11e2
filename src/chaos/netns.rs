//! Hosts on one machine for multi-node runs: each a Linux network
//! namespace with its own address on a private bridge, made by the caller
//! and removed when the [`Net`] is dropped. `fjord chaos --netns` runs its
//! nodes in them, and the several-node tests use the same code through
//! `tests/common/netns.rs` (docs/replication.md §8).
//!
//! ```text
//!   root namespace (the caller, its clients)  10.77.B.254 on bridge fb<tag>
//!        │ fh<tag><i>  (veth, host side, enslaved to the bridge)
//!        │ eth0 in namespace fjord-<pid>-<c>-<i>      10.77.B.(i+1)
//! ```
//!
//! Every host reaches every other host and the caller through the bridge,
//! so a broker started in host i with `--listen 10.77.B.(i+1)` is reached
//! by librdkafka from the caller's process and by the brokers of the other
//! hosts. [`Net::cut`] takes a host's link down (its processes keep
//! running but reach nobody and nobody reaches them, as a pulled cable) and
//! [`Net::heal`] brings it back. [`Net::isolate`] cuts a host off from the
//! other hosts only: blackhole routes (`ip route add blackhole ADDR/32`)
//! in its namespace for every other host's address, and in every other
//! host's namespace for its address, so traffic between it and its peers
//! is dropped both ways while the caller (the gateway, which has no such
//! route) still reaches it, as a client on the far side of a partition
//! would; [`Net::rejoin`] removes those routes. [`Net::delay`] adds latency
//! with netem.
//!
//! Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2. Names carry
//! the calling process's id and each net takes a free /24 under a lock
//! (`$TMPDIR/fjord-netns.lock`), so concurrent processes never share a
//! namespace or a subnet, and a process killed before its clean-up leaves
//! namespaces and a bridge that the next [`Net::new`] of any process
//! removes (their process is gone).

use std::net::Ipv4Addr;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

/// Hosts one [`Net`] may have (the last octet; .254 is the caller's side).
pub const HOSTS_MAX: usize = 200;
/// Nets one process may make (one hex digit of the interface names).
pub const NETS_PER_PROCESS_MAX: u32 = 16;

static NETS_MADE: AtomicU32 = AtomicU32::new(0);

/// Why a namespace, link or qdisc could not be made or changed.
#[derive(Debug, thiserror::Error)]
#[error("network namespaces: {0}")]
pub struct NetError(pub String);

/// One host: a network namespace and its address.
#[derive(Clone, Debug)]
pub struct Host {
    /// The namespace's name, for `ip netns exec`.
    pub ns: String,
    /// The host's address on the bridge.
    pub addr: Ipv4Addr,
    /// The host side of its veth pair, in the root namespace.
    veth: String,
}

/// A bridge and the hosts on it; everything is removed on drop (the
/// processes started in the hosts must be stopped first: a namespace with
/// a process in it lives on after `ip netns del`).
pub struct Net {
    bridge: String,
    hosts: Vec<Host>,
    /// The caller's own address on the bridge.
    pub gateway: Ipv4Addr,
}

fn run(program: &str, args: &[&str]) -> Result<Output, NetError> {
    Command::new(program).args(args).output().map_err(|e| {
        NetError(format!(
            "{program}: {e} (iproute2 is needed for network namespaces)"
        ))
    })
}

/// Runs `ip ARGS`; an error carries what `ip` said.
fn ip(args: &[&str]) -> Result<(), NetError> {
    let out = run("ip", args)?;
    if out.status.success() {
        Ok(())
    } else {
        Err(NetError(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Removes what earlier processes that no longer run left behind.
fn sweep_leftovers() -> Result<(), NetError> {
    let out = run("ip", &["netns", "list"])?;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(rest) = name.strip_prefix("fjord-") else {
            continue;
        };
        let pid = rest.split('-').next().and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|p| !pid_alive(p)) {
            let _ = run("ip", &["netns", "del", name]);
        }
    }
    let out = run("ip", &["-o", "link", "show", "type", "bridge"])?;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // "12: fb0012ab3: <BROADCAST,...": the pid is the 6 hex digits.
        let Some(name) = line.split(':').nth(1).map(str::trim) else {
            continue;
        };
        let Some(hex) = name.strip_prefix("fb").filter(|h| h.len() == 7) else {
            continue;
        };
        let pid = u32::from_str_radix(&hex[..6], 16).ok();
        if pid.is_some_and(|p| !pid_alive(p)) {
            let _ = run("ip", &["link", "del", name]);
        }
    }
    Ok(())
}

/// Holds `$TMPDIR/fjord-netns.lock` (flock) while it lives.
struct SubnetLock {
    _file: std::fs::File,
}

impl SubnetLock {
    fn take() -> Result<SubnetLock, NetError> {
        let path = std::env::temp_dir().join("fjord-netns.lock");
        let f = std::fs::File::create(&path)
            .map_err(|e| NetError(format!("{}: {e}", path.display())))?;
        // SAFETY: flock on a file descriptor we own; released when the file
        // is closed.
        let rc = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&f), libc::LOCK_EX) };
        if rc != 0 {
            return Err(NetError(format!(
                "flock {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            )));
        }
        Ok(SubnetLock { _file: f })
    }
}

impl Net {
    /// A bridge with `hosts` hosts on it, each reachable from the caller.
    /// On an error, what was made so far is removed.
    pub fn new(hosts: usize) -> Result<Net, NetError> {
        if !(1..=HOSTS_MAX).contains(&hosts) {
            return Err(NetError(format!("1 to {HOSTS_MAX} hosts, not {hosts}")));
        }
        sweep_leftovers()?;
        let pid = std::process::id();
        if pid > 0xff_ffff {
            return Err(NetError(format!(
                "pid {pid} does not fit the interface names"
            )));
        }
        let made = NETS_MADE.fetch_add(1, Ordering::Relaxed);
        if made >= NETS_PER_PROCESS_MAX {
            return Err(NetError(format!(
                "at most {NETS_PER_PROCESS_MAX} nets per process"
            )));
        }
        // Interface names are at most 15 bytes: fb + 6 + 1, fh + 6 + 1 + 2.
        let tag = format!("{pid:06x}{made:x}");
        let bridge = format!("fb{tag}");
        // A /24 of its own, 10.77.B.0, B the first not on any interface:
        // chosen and taken under a lock, as other processes make nets too.
        let lock = SubnetLock::take()?;
        let used =
            String::from_utf8_lossy(&run("ip", &["-o", "-4", "addr", "show"])?.stdout).into_owned();
        let b = (0..=255u8)
            .find(|b| !used.contains(&format!(" 10.77.{b}.")))
            .ok_or_else(|| NetError("no free 10.77.B.0/24".to_string()))?;
        let subnet = |last: u8| Ipv4Addr::new(10, 77, b, last);
        let gateway = subnet(254);
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        // From here on, dropping `net` removes what was made.
        let mut net = Net {
            bridge: bridge.clone(),
            hosts: Vec::new(),
            gateway,
        };
        ip(&["addr", "add", &format!("{gateway}/24"), "dev", &bridge])?;
        ip(&["link", "set", &bridge, "up"])?;
        drop(lock);
        for i in 0..hosts {
            let ns = format!("fjord-{pid}-{made}-{i}");
            let veth = format!("fh{tag}{i:02x}");
            let inner = format!("fn{tag}{i:02x}");
            let addr = subnet(i as u8 + 1);
            ip(&["netns", "add", &ns])?;
            net.hosts.push(Host {
                ns: ns.clone(),
                addr,
                veth: veth.clone(),
            });
            ip(&["link", "add", &veth, "type", "veth", "peer", "name", &inner])?;
            ip(&["link", "set", &inner, "netns", &ns])?;
            ip(&["link", "set", &veth, "master", &bridge, "up"])?;
            ip(&["-n", &ns, "link", "set", &inner, "name", "eth0"])?;
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    pub fn host(&self, i: usize) -> &Host {
        &self.hosts[i]
    }

    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// `program ARGS` to be run inside host `i`'s namespace (`ip netns
    /// exec` execs it: the child's pid is the program's).
    pub fn command(&self, i: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        command_in(&self.hosts[i].ns, program)
    }

    /// Cuts host `i` off: its link goes down on both ends, so nothing
    /// reaches it and it reaches nothing (connections stay open on both
    /// sides and time out as over a pulled cable).
    pub fn cut(&self, i: usize) -> Result<(), NetError> {
        let h = &self.hosts[i];
        ip(&["-n", &h.ns, "link", "set", "eth0", "down"])?;
        ip(&["link", "set", &h.veth, "down"])
    }

    /// Reconnects host `i` after [`Self::cut`].
    pub fn heal(&self, i: usize) -> Result<(), NetError> {
        let h = &self.hosts[i];
        ip(&["link", "set", &h.veth, "up"])?;
        ip(&["-n", &h.ns, "link", "set", "eth0", "up"])
    }

    /// Cuts host `i` off from the other hosts only: a blackhole route in
    /// its namespace for each other host's address, and one in each other
    /// host's namespace for its address (either alone would already drop
    /// one direction's packets; both make the cut symmetric, as a partition
    /// between racks is). The caller still reaches host `i` and host `i`
    /// the caller: the gateway's address has no such route. A connection
    /// between host `i` and a peer stays open and times out as over a
    /// pulled cable; a new one fails at once (a blackhole route makes a
    /// local `connect` fail with EINVAL). Fails if host `i` is isolated
    /// already (`ip` refuses a route that exists).
    pub fn isolate(&self, i: usize) -> Result<(), NetError> {
        self.blackholes(i, "add")
    }

    /// Removes the routes of [`Self::isolate`]: host `i` and its peers
    /// reach each other again.
    pub fn rejoin(&self, i: usize) -> Result<(), NetError> {
        self.blackholes(i, "del")
    }

    /// `ip route ACTION blackhole` for every pair of host `i` and another
    /// host, in both their namespaces.
    fn blackholes(&self, i: usize, action: &str) -> Result<(), NetError> {
        let h = &self.hosts[i];
        for (j, peer) in self.hosts.iter().enumerate() {
            if j == i {
                continue;
            }
            for (ns, to) in [(&h.ns, peer.addr), (&peer.ns, h.addr)] {
                ip(&["-n", ns, "route", action, "blackhole", &format!("{to}/32")])?;
            }
        }
        Ok(())
    }

    /// Adds `ms` of delay to everything host `i` sends (netem on its
    /// eth0); 0 removes it.
    pub fn delay(&self, i: usize, ms: u32) -> Result<(), NetError> {
        let h = &self.hosts[i];
        let _ = run(
            "ip",
            &[
                "netns", "exec", &h.ns, "tc", "qdisc", "del", "dev", "eth0", "root",
            ],
        );
        if ms > 0 {
            ip(&[
                "netns",
                "exec",
                &h.ns,
                "tc",
                "qdisc",
                "add",
                "dev",
                "eth0",
                "root",
                "netem",
                "delay",
                &format!("{ms}ms"),
            ])?;
        }
        Ok(())
    }
}

/// `program` to be run inside namespace `ns` (`ip netns exec`).
pub fn command_in(ns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new("ip");
    cmd.arg("netns").arg("exec").arg(ns).arg(program);
    cmd
}

impl Drop for Net {
    fn drop(&mut self) {
        for h in &self.hosts {
            let _ = run("ip", &["netns", "del", &h.ns]);
        }
        let _ = run("ip", &["link", "del", &self.bridge]);
    }
}
