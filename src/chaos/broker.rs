//! The broker under test: a `fjord serve` child process on a data
//! directory and ports that stay the same across every kill and restart.
//!
//! Owned by the orchestrator's (main) thread. Invariants: a started broker
//! is killed when the [`ChaosBroker`] is dropped, and also when the chaos
//! process itself dies (`PR_SET_PDEATHSIG`), so no run leaves a broker
//! behind; every wait is bounded. The broker's stderr, its stdout lines and
//! the orchestrator's own markers (`=== chaos: SIGKILL ...`) go to one log
//! file, so that what the broker logged around a kill can be found.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use super::ChaosError;

/// Longest a broker may take to print `fjord: ready` (recovery included).
pub const READY_TIMEOUT_MS: u64 = 120_000;
/// Longest a broker may take to exit after SIGTERM or SIGKILL.
pub const EXIT_TIMEOUT_MS: u64 = 30_000;
/// How long a clean stop waits for the broker's last stdout lines after it exited.
pub const STDOUT_DRAIN_MS: u64 = 5_000;
/// First and one-past-last port a broker may be given.
pub const PORT_RANGE_FIRST: u16 = 20_000;
pub const PORT_RANGE_END: u16 = 60_000;
/// Ports tried when looking for a free range.
pub const PORT_PICKS_MAX: usize = 1_000;
/// First starts tried (each on new ports) before giving up.
pub const FIRST_START_ATTEMPTS_MAX: usize = 5;
/// `--group-initial-rebalance-delay-ms` of the broker: Kafka's 3 s delay
/// would hold the group consumer's first assignment after every restart
/// for most of a cycle of a few seconds, so that its offsets would hardly
/// be exercised (Kafka's own test brokers set 0 too).
pub const GROUP_INITIAL_REBALANCE_DELAY_MS: u64 = 0;

/// How to run the broker.
#[derive(Clone, Debug)]
pub struct BrokerSpec {
    pub bin: PathBuf,
    pub data_dir: PathBuf,
    pub log: PathBuf,
    pub cores: usize,
    pub fsync_acks: bool,
    /// The address it listens on (`--listen`): loopback, or its host's
    /// address on the bridge when it runs in a network namespace.
    pub listen: Ipv4Addr,
    /// The network namespace it runs in (`ip netns exec`), if any.
    pub netns: Option<String>,
    /// More `fjord serve` arguments (a cluster node's `--node-id`,
    /// `--controller-quorum`, timeouts).
    pub extra_args: Vec<String>,
}

/// A `fjord serve` process (or none, between a kill and its restart).
pub struct ChaosBroker {
    spec: BrokerSpec,
    child: Option<Child>,
    stdout: Option<Receiver<String>>,
    /// Port of shard 0; shard k listens on `port + k`.
    pub port: u16,
    /// Starts so far (1 after the first).
    pub starts: u32,
}

impl ChaosBroker {
    /// Starts the broker on free ports; retries with new ports when a
    /// start fails (another process may have taken a port meanwhile).
    pub fn start(spec: BrokerSpec) -> Result<ChaosBroker, ChaosError> {
        let mut b = ChaosBroker {
            spec,
            child: None,
            stdout: None,
            port: 0,
            starts: 0,
        };
        let mut last = String::new();
        for _ in 0..FIRST_START_ATTEMPTS_MAX {
            b.port = free_port_base(b.spec.cores)?;
            match b.launch() {
                Ok(_) => return Ok(b),
                Err(e) => last = e.to_string(),
            }
        }
        Err(ChaosError::Broker(format!(
            "the broker did not start after {FIRST_START_ATTEMPTS_MAX} attempts: {last}; see {}",
            b.spec.log.display()
        )))
    }

    /// A broker that is not started yet, to listen on `port` (and the
    /// next `cores - 1` ports): [`Self::restart`] starts it.
    pub fn prepared(spec: BrokerSpec, port: u16) -> ChaosBroker {
        ChaosBroker {
            spec,
            child: None,
            stdout: None,
            port,
            starts: 0,
        }
    }

    pub fn bootstrap(&self) -> String {
        format!("{}:{}", self.spec.listen, self.port)
    }

    pub fn spec(&self) -> &BrokerSpec {
        &self.spec
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Appends a marker line to the broker log.
    pub fn mark(&self, what: &str) {
        if let Ok(mut f) = OpenOptions::new().append(true).open(&self.spec.log) {
            let _ = writeln!(f, "=== chaos: {what} ===");
        }
    }

    /// SIGKILL, then waits for the process to be gone.
    pub fn kill9(&mut self) -> Result<(), ChaosError> {
        let Some(pid) = self.pid() else {
            return Ok(());
        };
        signal(pid, libc::SIGKILL);
        self.wait_exit()?;
        Ok(())
    }

    /// SIGTERM; the broker must exit 0 and print `fjord: stopped`.
    pub fn stop(&mut self) -> Result<(), ChaosError> {
        self.term();
        self.wait_stopped()
    }

    /// Sends SIGTERM (a clean stop), if it runs; [`Self::wait_stopped`]
    /// waits for its end. Several nodes are stopped at once this way.
    pub fn term(&self) {
        if let Some(pid) = self.pid() {
            signal(pid, libc::SIGTERM);
        }
    }

    /// After [`Self::term`]: the broker must exit 0 and print `fjord: stopped`.
    pub fn wait_stopped(&mut self) -> Result<(), ChaosError> {
        if self.child.is_none() {
            return Ok(());
        }
        let rx = self.stdout.take();
        let status = self.wait_exit()?;
        // The reader thread may forward the last lines after the exit is
        // seen: read until it ends (EOF) or a bounded wait passes.
        let stopped = rx.is_some_and(|rx| {
            let deadline = Instant::now() + Duration::from_millis(STDOUT_DRAIN_MS);
            loop {
                match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                    Ok(l) if l.trim() == "fjord: stopped" => break true,
                    Ok(_) => {}
                    Err(_) => break false,
                }
            }
        });
        if !status.success() || !stopped {
            return Err(ChaosError::Broker(format!(
                "clean stop failed: exit {status}, `fjord: stopped` printed: {stopped}; see {}",
                self.spec.log.display()
            )));
        }
        Ok(())
    }

    /// Starts the broker again on the same data directory and ports;
    /// returns how long it took to be ready.
    pub fn restart(&mut self) -> Result<Duration, ChaosError> {
        if self.child.is_some() {
            return Err(ChaosError::Broker(
                "restart of a broker that still runs".to_string(),
            ));
        }
        self.launch()
    }

    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    fn wait_exit(&mut self) -> Result<std::process::ExitStatus, ChaosError> {
        let Some(mut child) = self.child.take() else {
            return Err(ChaosError::Broker("no broker process".to_string()));
        };
        let deadline = Instant::now() + Duration::from_millis(EXIT_TIMEOUT_MS);
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Ok(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(ChaosError::Broker(format!(
                        "the broker did not exit within {EXIT_TIMEOUT_MS} ms"
                    )));
                }
                Err(source) => {
                    return Err(ChaosError::Io {
                        what: "waiting for the broker".to_string(),
                        source,
                    })
                }
            }
        }
    }

    fn launch(&mut self) -> Result<Duration, ChaosError> {
        use std::os::unix::process::CommandExt;
        let io = |what: &str| {
            let what = what.to_string();
            move |source| ChaosError::Io { what, source }
        };
        std::fs::create_dir_all(&self.spec.data_dir).map_err(io("creating the data directory"))?;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.spec.log)
            .map_err(io("opening the broker log"))?;
        let mut cmd = match &self.spec.netns {
            // `ip netns exec` execs the broker: the child is the broker.
            Some(ns) => super::netns::command_in(ns, &self.spec.bin),
            None => Command::new(&self.spec.bin),
        };
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(&self.spec.data_dir)
            .arg("--port")
            .arg(self.port.to_string())
            .arg("--listen")
            .arg(self.spec.listen.to_string())
            .arg("--cores")
            .arg(self.spec.cores.to_string())
            .arg("--no-pin")
            .arg("--metrics-listen")
            .arg("none")
            .arg("--group-initial-rebalance-delay-ms")
            .arg(GROUP_INITIAL_REBALANCE_DELAY_MS.to_string())
            .args(&self.spec.extra_args);
        if self.spec.fsync_acks {
            cmd.arg("--fsync-acks");
        }
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "info");
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log));
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches
        // no memory of the parent; it makes the kernel kill the broker if
        // this process dies first.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
                Ok(())
            });
        }
        let started = Instant::now();
        let mut child = cmd.spawn().map_err(io("starting the broker"))?;
        self.starts += 1;
        let out = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        let log_path = self.spec.log.clone();
        std::thread::Builder::new()
            .name("chaos-broker-stdout".to_string())
            .spawn(move || drain_stdout(out, &log_path, tx))
            .map_err(io("spawning the stdout reader"))?;
        let deadline = started + Duration::from_millis(READY_TIMEOUT_MS);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left.min(Duration::from_millis(100))) {
                Ok(line) if line.trim() == "fjord: ready" => {
                    self.child = Some(child);
                    self.stdout = Some(rx);
                    return Ok(started.elapsed());
                }
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => {
                    if let Ok(Some(status)) = child.try_wait() {
                        return Err(ChaosError::Broker(format!(
                            "the broker exited during start-up ({status}); see {}",
                            self.spec.log.display()
                        )));
                    }
                    if Instant::now() >= deadline {
                        let _ = child.kill();
                        let _ = child.wait();
                        return Err(ChaosError::Broker(format!(
                            "the broker was not ready within {READY_TIMEOUT_MS} ms; see {}",
                            self.spec.log.display()
                        )));
                    }
                }
            }
        }
    }
}

impl Drop for ChaosBroker {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Forwards the broker's stdout lines to the orchestrator and the log, for
/// the life of the process (so that it never blocks on a full pipe).
fn drain_stdout(out: std::process::ChildStdout, log: &Path, tx: mpsc::Sender<String>) {
    let mut file: Option<File> = OpenOptions::new().append(true).open(log).ok();
    for line in BufReader::new(out).lines() {
        let Ok(line) = line else { break };
        if let Some(f) = file.as_mut() {
            let _ = writeln!(f, "stdout: {line}");
        }
        // The receiver is gone after a kill; keep draining regardless.
        let _ = tx.send(line);
    }
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on our own child's pid; no memory is touched.
    unsafe { libc::kill(pid as libc::pid_t, sig) };
}

/// A random base port whose `count` consecutive ports bind right now.
pub fn free_port_base(count: usize) -> Result<u16, ChaosError> {
    for _ in 0..PORT_PICKS_MAX {
        let base = rand::random_range(PORT_RANGE_FIRST..PORT_RANGE_END - count as u16);
        let free = (0..count as u16)
            .all(|k| TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, base + k)).is_ok());
        if free {
            return Ok(base);
        }
    }
    Err(ChaosError::Broker(format!(
        "no {count} consecutive free ports found"
    )))
}
