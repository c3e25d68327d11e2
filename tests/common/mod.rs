//! Shared harness for the `server_*` integration tests: a real `fjord serve`
//! process per test, driven by librdkafka (the `rdkafka` crate) and by a raw
//! Kafka-protocol client.
//!
//! What it owns: the broker child process, its temporary data directory and
//! its stderr log. Invariants: every wait is bounded by a deadline; a
//! [`Broker`] that is dropped kills its process; if the test is panicking the
//! broker's stderr is printed, so a failure shows what the broker logged.
//!
//! Tests run in parallel threads (and `cargo test` runs test binaries one
//! after another, but CI may not), so ports are picked at random in
//! [`PORT_RANGE_FIRST`]..[`PORT_RANGE_END`], each checked to bind before use,
//! and a first start is retried with new ports when it fails (a restart keeps
//! its ports: its clients know no others).

#![allow(dead_code)]

pub mod child;
pub mod client;
pub mod cluster;
pub mod disk;
pub mod groups;
pub mod leader;
pub mod netns;
pub mod raw;
pub mod target;
pub mod tls;

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// First port a broker may be given.
pub const PORT_RANGE_FIRST: u16 = 20_000;
/// One past the last port a broker may be given.
pub const PORT_RANGE_END: u16 = 60_000;
/// Start-up attempts (each with new ports) before a test gives up.
pub const START_ATTEMPTS_MAX: usize = 8;
/// Longest a broker may take to print `fjord: ready`.
pub const READY_TIMEOUT_MS: u64 = 30_000;
/// Longest a broker may take to exit after SIGTERM.
pub const STOP_TIMEOUT_MS: u64 = 20_000;
/// Lines of broker stderr printed when a test fails.
pub const STDERR_TAIL_LINES: usize = 300;

/// How to start a broker.
#[derive(Clone, Debug)]
pub struct BrokerOpts {
    /// `--cores`: number of shards (each its own Kafka node on port + k).
    pub cores: usize,
    /// More `fjord serve` flags, e.g. `["--fsync-acks"]`.
    pub extra_args: Vec<String>,
    /// RLIMIT_NOFILE of the broker process, soft and hard (the broker
    /// raises its soft limit to the hard one at start, so both are set).
    pub nofile: Option<u64>,
    /// Environment variables of the broker process.
    pub env: Vec<(String, String)>,
    /// Run in this network namespace (`netns::Host`), listening on this
    /// address instead of 127.0.0.1.
    pub netns: Option<(String, std::net::Ipv4Addr)>,
}

impl Default for BrokerOpts {
    fn default() -> Self {
        BrokerOpts {
            cores: 2,
            extra_args: Vec::new(),
            nofile: None,
            env: Vec::new(),
            netns: None,
        }
    }
}

impl BrokerOpts {
    pub fn cores(mut self, cores: usize) -> Self {
        self.cores = cores;
        self
    }

    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.extra_args.push(arg.into());
        self
    }

    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// Runs the broker in `host`'s namespace, listening on its address.
    pub fn in_host(mut self, host: &netns::Host) -> Self {
        self.netns = Some((host.ns.clone(), host.addr));
        self
    }

    pub fn nofile(mut self, files: u64) -> Self {
        self.nofile = Some(files);
        self
    }
}

/// A running (or stopped) `fjord serve` process and its data directory.
pub struct Broker {
    opts: BrokerOpts,
    /// Holds `data/` and `stderr.log`; removed on drop.
    root: tempfile::TempDir,
    child: Option<Child>,
    /// Lines the broker printed on stdout since it was last started.
    stdout: Option<Receiver<String>>,
    /// Port of shard 0; shard k listens on `port + k`.
    pub port: u16,
}

impl Broker {
    /// Starts a broker in a fresh temporary data directory.
    pub fn start(opts: BrokerOpts) -> Broker {
        let root = tempfile::Builder::new()
            .prefix("fjord-itest-")
            .tempdir()
            .expect("create a temporary directory");
        let mut broker = Broker {
            opts,
            root,
            child: None,
            stdout: None,
            port: 0,
        };
        broker.launch(None);
        broker
    }

    /// The address the broker listens on.
    pub fn host(&self) -> std::net::Ipv4Addr {
        self.opts
            .netns
            .as_ref()
            .map_or(std::net::Ipv4Addr::LOCALHOST, |(_, addr)| *addr)
    }

    /// The broker's `--data-dir`.
    pub fn data_dir(&self) -> PathBuf {
        self.root.path().join("data")
    }

    /// `HOST:<port of shard 0>` (127.0.0.1 unless in a namespace), for `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        format!("{}:{}", self.host(), self.port)
    }

    /// The port of shard `shard` (Kafka node `shard`).
    pub fn port_of(&self, shard: usize) -> u16 {
        self.port + shard as u16
    }

    pub fn cores(&self) -> usize {
        self.opts.cores
    }

    /// The options the next [`Broker::restart`] starts the broker with.
    pub fn opts_mut(&mut self) -> &mut BrokerOpts {
        &mut self.opts
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Sends the running process `sig` with kill(1) (`-STOP`, `-CONT`).
    pub fn signal(&self, sig: &str) {
        let pid = self.pid().expect("the broker runs").to_string();
        let status = std::process::Command::new("kill")
            .args([sig, pid.as_str()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {sig} {pid}");
    }

    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// The exit status once the process has exited (it is then reaped and
    /// the broker counts as stopped), else `None`.
    pub fn try_exit_status(&mut self) -> Option<ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        self.stdout = None;
        Some(status)
    }

    /// Asserts the process is still alive (it did not crash).
    pub fn assert_alive(&mut self) {
        if let Some(c) = self.child.as_mut() {
            if let Ok(Some(status)) = c.try_wait() {
                panic!("the broker exited unexpectedly: {status}");
            }
        } else {
            panic!("the broker is not running");
        }
    }

    /// SIGTERM, then waits for a clean exit and `fjord: stopped`.
    pub fn stop(&mut self) {
        let Some(pid) = self.pid() else { return };
        signal(pid, libc::SIGTERM);
        let status = self.wait_exit(Duration::from_millis(STOP_TIMEOUT_MS));
        assert!(
            status.success(),
            "broker exited with {status} after SIGTERM"
        );
        // The process has exited, but its last lines may still be on their
        // way through the reader thread: read until it hits the end of the
        // pipe (bounded, for a pipe some grandchild still holds open).
        let drain_deadline = Instant::now() + Duration::from_secs(10);
        let stopped = self.stdout.take().is_some_and(|rx| loop {
            let left = drain_deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(l) if l.trim() == "fjord: stopped" => break true,
                Ok(_) => {}
                Err(_) => break false,
            }
        });
        assert!(
            stopped,
            "broker did not print `fjord: stopped` after SIGTERM"
        );
    }

    /// SIGKILL: the broker gets no chance to flush or checkpoint.
    pub fn kill9(&mut self) {
        let Some(pid) = self.pid() else { return };
        signal(pid, libc::SIGKILL);
        self.wait_exit(Duration::from_millis(STOP_TIMEOUT_MS));
        self.stdout = None;
    }

    /// Starts the broker again on the same data directory (stopping it
    /// cleanly first if it runs), on the same ports.
    pub fn restart(&mut self) {
        if self.is_running() {
            self.stop();
        }
        self.child = None;
        let port = self.port;
        self.launch(Some(port));
    }

    fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let mut child = self.child.take().expect("a running broker");
        let deadline = Instant::now() + timeout;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return status,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("the broker did not exit within {timeout:?}");
                }
                Err(e) => panic!("waiting for the broker failed: {e}"),
            }
        }
    }

    /// Starts the process, retrying until it prints `fjord: ready`. A first
    /// start (`preferred` None) retries with fresh ports. A restart stays on
    /// its ports whatever happens: its clients know only those. (Right
    /// after a SIGKILL the old listening sockets stay bound for a moment
    /// while the kernel tears down the dead process's io_uring; the broker
    /// itself waits for its ports to be released.)
    fn launch(&mut self, preferred: Option<u16>) {
        let mut last_error = String::new();
        for _ in 0..START_ATTEMPTS_MAX {
            let port = preferred.unwrap_or_else(|| free_port_base(self.opts.cores));
            match self.try_launch(port) {
                Ok(()) => return,
                Err(e) => last_error = e,
            }
            if preferred.is_none() {
                // A first start begins again on an empty data dir: what the
                // failed try wrote (a metadata log, a leader epoch) would
                // make the broker a restarted one.
                let _ = std::fs::remove_dir_all(self.data_dir());
            }
        }
        panic!(
            "the broker did not start after {START_ATTEMPTS_MAX} attempts: {last_error}\n{}",
            self.stderr_tail()
        );
    }

    /// `fjord serve` on this broker's data dir and ports, with its output
    /// going to `stderr` (stdout piped).
    fn command(&self, port: u16, stderr: File) -> Command {
        // FJORD_TEST_BIN runs the tests against another build of fjord,
        // e.g. the commit before a fix, to see its regression test fail.
        let bin = std::env::var_os("FJORD_TEST_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_fjord")));
        let mut cmd = match &self.opts.netns {
            // `ip netns exec` execs the broker: the child is the broker.
            Some((ns, _)) => {
                let mut cmd = Command::new("ip");
                cmd.arg("netns").arg("exec").arg(ns).arg(bin);
                cmd
            }
            None => Command::new(bin),
        };
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(self.data_dir())
            .arg("--port")
            .arg(port.to_string())
            .arg("--listen")
            .arg(self.host().to_string())
            .arg("--cores")
            .arg(self.opts.cores.to_string())
            .arg("--no-pin")
            .args(&self.opts.extra_args)
            // Tests run brokers in parallel: none serves metrics on the
            // default port unless its test asks for an endpoint.
            .args(
                (!self.opts.extra_args.iter().any(|a| a == "--metrics-listen"))
                    .then_some(["--metrics-listen", "none"])
                    .into_iter()
                    .flatten(),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr));
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "info");
        }
        cmd.envs(self.opts.env.iter().map(|(k, v)| (k, v)));
        if let Some(files) = self.opts.nofile {
            use std::os::unix::process::CommandExt;
            // SAFETY: only setrlimit(2), async-signal-safe, runs between
            // fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    let limit = libc::rlimit {
                        rlim_cur: files as libc::rlim_t,
                        rlim_max: files as libc::rlim_t,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        cmd
    }

    fn try_launch(&mut self, port: u16) -> Result<(), String> {
        std::fs::create_dir_all(self.data_dir()).map_err(|e| e.to_string())?;
        let stderr = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.stderr_path())
            .map_err(|e| e.to_string())?;
        let mut child = self
            .command(port, stderr)
            .spawn()
            .map_err(|e| format!("spawn failed: {e}"))?;
        let out = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            // Drains stdout for the life of the process so it never blocks.
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_millis(READY_TIMEOUT_MS);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left.min(Duration::from_millis(100))) {
                Ok(line) if line.trim() == "fjord: ready" => {
                    self.child = Some(child);
                    self.stdout = Some(rx);
                    self.port = port;
                    return Ok(());
                }
                Ok(_) => {}
                Err(RecvTimeoutError::Disconnected) | Err(RecvTimeoutError::Timeout) => {
                    if let Ok(Some(status)) = child.try_wait() {
                        return Err(format!(
                            "broker on port {port} exited during start-up: {status}"
                        ));
                    }
                    if Instant::now() >= deadline {
                        let _ = child.kill();
                        let _ = child.wait();
                        return Err(format!(
                            "broker on port {port} not ready in {READY_TIMEOUT_MS} ms"
                        ));
                    }
                }
            }
        }
    }

    /// Starts the (stopped) broker once on its data dir and ports, expecting
    /// it to refuse to start: waits up to `timeout` for it to exit and
    /// returns its status and everything it printed on stdout and stderr
    /// in that run. Panics if it prints `fjord: ready` instead (the broker
    /// is then killed) or does not exit in time.
    pub fn start_expecting_exit(&mut self, timeout: Duration) -> (ExitStatus, String) {
        assert!(!self.is_running(), "stop the broker first");
        let run_log = self.root.path().join("failed-start.log");
        let stderr = File::create(&run_log).expect("create the start-up log");
        let mut child = self
            .command(self.port, stderr)
            .spawn()
            .expect("spawn the broker");
        let out = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let output = |stdout: &[String]| {
            let stderr = std::fs::read_to_string(&run_log).unwrap_or_default();
            format!("{}\n{stderr}", stdout.join("\n"))
        };
        let deadline = Instant::now() + timeout;
        let mut stdout = Vec::new();
        loop {
            while let Ok(line) = rx.try_recv() {
                if line.trim() == "fjord: ready" {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("the broker started:\n{}", output(&stdout));
                }
                stdout.push(line);
            }
            match child.try_wait() {
                Ok(Some(status)) => {
                    // What it printed last is in the pipe until EOF.
                    stdout.extend(rx.iter());
                    return (status, output(&stdout));
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "the broker did not exit within {timeout:?}:\n{}",
                        output(&stdout)
                    );
                }
                Err(e) => panic!("waiting for the broker failed: {e}"),
            }
        }
    }

    /// File descriptors the broker process holds now (`/proc/<pid>/fd`).
    pub fn open_fds(&self) -> usize {
        let pid = self.pid().expect("a running broker");
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| d.count())
            .unwrap_or_else(|e| panic!("list /proc/{pid}/fd: {e}"))
    }

    fn stderr_path(&self) -> PathBuf {
        self.root.path().join("stderr.log")
    }

    /// Bytes the broker has written on stderr so far (all starts).
    pub fn stderr_len(&self) -> u64 {
        std::fs::metadata(self.stderr_path()).map_or(0, |m| m.len())
    }

    /// What the broker wrote on stderr after its first `from` bytes.
    pub fn stderr_since(&self, from: u64) -> String {
        let mut text = String::new();
        if let Ok(mut f) = File::open(self.stderr_path()) {
            let _ = f.seek(SeekFrom::Start(from));
            let _ = f.read_to_string(&mut text);
        }
        text
    }

    /// The last lines the broker wrote on stderr (all starts).
    pub fn stderr_tail(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = File::open(self.stderr_path()) {
            let len = f.metadata().map(|m| m.len()).unwrap_or(0);
            let _ = f.seek(SeekFrom::Start(len.saturating_sub(256 * 1024)));
            let _ = f.read_to_string(&mut text);
        }
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(STDERR_TAIL_LINES);
        format!(
            "--- broker stderr (last lines) ---\n{}\n--- end ---",
            lines[from..].join("\n")
        )
    }

    /// The raw bytes of `<data-dir>/<topic>-<partition>/00000000000000000000.log`.
    pub fn first_segment(&self, topic: &str, partition: i32) -> Vec<u8> {
        std::fs::read(segment_path(&self.data_dir(), topic, partition)).unwrap_or_default()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.stderr_tail());
            // FJORD_TEST_KEEP_DATA=DIR keeps a failed test's data for a post-mortem.
            if let Some(keep) = std::env::var_os("FJORD_TEST_KEEP_DATA") {
                let to = Path::new(&keep).join(format!("broker-{}", self.port));
                let status = Command::new("cp")
                    .arg("-a")
                    .arg(self.root.path())
                    .arg(&to)
                    .status();
                eprintln!("kept the broker's data in {} ({status:?})", to.display());
            }
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Path of a partition's first segment.
pub fn segment_path(data_dir: &Path, topic: &str, partition: i32) -> PathBuf {
    data_dir
        .join(format!("{topic}-{partition}"))
        .join("00000000000000000000.log")
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on our own child's pid; no memory is touched.
    unsafe { libc::kill(pid as libc::pid_t, sig) };
}

/// True if every port in `base..base + count` binds on 127.0.0.1 right now.
fn ports_free(base: u16, count: usize) -> bool {
    (0..count).all(|k| {
        let Some(port) = base.checked_add(k as u16) else {
            return false;
        };
        TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)).is_ok()
    })
}

/// A random base port whose `count` consecutive ports are free now.
pub fn free_port_base(count: usize) -> u16 {
    for _ in 0..1000 {
        let base = rand::random_range(PORT_RANGE_FIRST..PORT_RANGE_END - count as u16);
        if ports_free(base, count) {
            return base;
        }
    }
    panic!("no {count} consecutive free ports found");
}

/// Polls `f` every 20 ms until it returns `Some`, or panics after `timeout`
/// with `what` in the message.
pub fn wait_for<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Resident memory of process `pid` (VmRSS from `/proc`), in bytes.
pub fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc status");
    kb * 1024
}

/// `text` without its terminal colour sequences (`ESC [ ... m`).
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
