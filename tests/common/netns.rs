//! Hosts on one machine for multi-node tests: each a Linux network
//! namespace with its own address on a private bridge, made by the test and
//! removed when it ends (issue 30, docs/replication.md §8).
//!
//! ```text
//!   root namespace (the test, its clients)   10.77.B.254 on bridge fb<tag>
//!        │ fh<tag><i>  (veth, host side, enslaved to the bridge)
//!        │ eth0 in namespace fjord-<pid>-<c>-<i>      10.77.B.(i+1)
//! ```
//!
//! Every host reaches every other host and the test through the bridge, so
//! a broker started in host i with `--listen 10.77.B.(i+1)` is reached by
//! librdkafka from the test process and by the brokers of the other hosts.
//! [`Net::cut`] takes a host's link down (its processes keep running but
//! reach nobody and nobody reaches them, as a pulled cable) and
//! [`Net::heal`] brings it back; [`Net::delay`] adds latency with netem.
//!
//! Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN), as `.ci/run` has. Names
//! carry the test process's id and each net takes a free /24 under a lock,
//! so concurrent test binaries never share a namespace or a subnet, and a run killed before its clean-up leaves
//! namespaces that the next [`Net::new`] removes (their process is gone).

use std::net::Ipv4Addr;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

/// Hosts one [`Net`] may have (the last octet; .254 is the test's side).
pub const HOSTS_MAX: usize = 200;

static NETS_MADE: AtomicU32 = AtomicU32::new(0);

/// One host: a network namespace and its address.
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
    /// The test's own address on the bridge.
    pub gateway: Ipv4Addr,
}

/// Runs `ip ARGS`, panicking with its output if it fails.
fn ip(args: &[&str]) {
    let out = run("ip", args);
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e} (iproute2 is needed for network namespaces)"))
}

fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Removes what earlier test processes that no longer run left behind.
fn sweep_leftovers() {
    let out = run("ip", &["netns", "list"]);
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
    let out = run("ip", &["-o", "link", "show", "type", "bridge"]);
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
}

impl Net {
    /// A bridge with `hosts` hosts on it, each reachable from the test.
    /// Panics (with what `ip` said) where namespaces cannot be made: the
    /// multi-node tests need them, and skipping would hide that.
    pub fn new(hosts: usize) -> Net {
        assert!((1..=HOSTS_MAX).contains(&hosts), "1 to {HOSTS_MAX} hosts");
        sweep_leftovers();
        let pid = std::process::id();
        assert!(
            pid <= 0xff_ffff,
            "pid {pid} does not fit the interface names"
        );
        let made = NETS_MADE.fetch_add(1, Ordering::Relaxed);
        assert!(made < 16, "at most 16 nets per test process");
        // Interface names are at most 15 bytes: fb + 6 + 1, fh + 6 + 1 + 2.
        let tag = format!("{pid:06x}{made:x}");
        let bridge = format!("fb{tag}");
        // A /24 of its own, 10.77.B.0, B the first not on any interface:
        // chosen and taken under a lock, as test binaries run at once.
        let lock = std::fs::File::create(std::env::temp_dir().join("fjord-netns.lock"))
            .expect("the netns lock file");
        // SAFETY: flock on a file descriptor we own; released when `lock`
        // is closed at the end of this block.
        assert_eq!(
            unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) },
            0
        );
        let used =
            String::from_utf8_lossy(&run("ip", &["-o", "-4", "addr", "show"]).stdout).into_owned();
        let b = (0..=255u8)
            .find(|b| !used.contains(&format!(" 10.77.{b}.")))
            .expect("a free 10.77.B.0/24");
        let subnet = |last: u8| Ipv4Addr::new(10, 77, b, last);
        let gateway = subnet(254);
        let mut net = Net {
            bridge: bridge.clone(),
            hosts: Vec::new(),
            gateway,
        };
        ip(&["link", "add", &bridge, "type", "bridge"]);
        ip(&["addr", "add", &format!("{gateway}/24"), "dev", &bridge]);
        ip(&["link", "set", &bridge, "up"]);
        drop(lock);
        for i in 0..hosts {
            let ns = format!("fjord-{pid}-{made}-{i}");
            let veth = format!("fh{tag}{i:02x}");
            let inner = format!("fn{tag}{i:02x}");
            let addr = subnet(i as u8 + 1);
            ip(&["netns", "add", &ns]);
            net.hosts.push(Host {
                ns: ns.clone(),
                addr,
                veth: veth.clone(),
            });
            ip(&["link", "add", &veth, "type", "veth", "peer", "name", &inner]);
            ip(&["link", "set", &inner, "netns", &ns]);
            ip(&["link", "set", &veth, "master", &bridge, "up"]);
            ip(&["-n", &ns, "link", "set", &inner, "name", "eth0"]);
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                "eth0",
            ]);
            ip(&["-n", &ns, "link", "set", "eth0", "up"]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
        }
        net
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
        let mut cmd = Command::new("ip");
        cmd.arg("netns")
            .arg("exec")
            .arg(&self.hosts[i].ns)
            .arg(program);
        cmd
    }

    /// Cuts host `i` off: its link goes down on both ends, so nothing
    /// reaches it and it reaches nothing (connections stay open on both
    /// sides and time out as over a pulled cable).
    pub fn cut(&self, i: usize) {
        let h = &self.hosts[i];
        ip(&["-n", &h.ns, "link", "set", "eth0", "down"]);
        ip(&["link", "set", &h.veth, "down"]);
    }

    /// Reconnects host `i` after [`Self::cut`].
    pub fn heal(&self, i: usize) {
        let h = &self.hosts[i];
        ip(&["link", "set", &h.veth, "up"]);
        ip(&["-n", &h.ns, "link", "set", "eth0", "up"]);
    }

    /// Adds `ms` of delay to everything host `i` sends (netem on its
    /// eth0); 0 removes it.
    pub fn delay(&self, i: usize, ms: u32) {
        let h = &self.hosts[i];
        let _ = run(
            "ip",
            &[
                "netns", "exec", &h.ns, "tc", "qdisc", "del", "dev", "eth0", "root",
            ],
        );
        if ms > 0 {
            let out = run(
                "ip",
                &[
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
                ],
            );
            assert!(
                out.status.success(),
                "tc netem: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for h in &self.hosts {
            let _ = run("ip", &["netns", "del", &h.ns]);
        }
        let _ = run("ip", &["link", "del", &self.bridge]);
    }
}
