//! The broker under test as seen from the bench: optionally started from a
//! shell command (`--broker-cmd`) and stopped at the end, or an existing
//! process (`--broker-pid`); its CPU time and memory are read from `/proc`.
//!
//! Owned by the bench's main thread only. Invariant: a broker this module
//! started is stopped (SIGTERM to its process group, then SIGKILL) when the
//! [`BrokerProcess`] is dropped, so a failed run never leaves a broker behind.

use std::net::{TcpStream, ToSocketAddrs};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::BenchError;

/// How long a started broker may take to accept connections, unless
/// `--broker-start-timeout` says otherwise.
pub const BROKER_START_TIMEOUT_MS: u64 = 30_000;
/// How long a broker may take to exit after SIGTERM before it is killed.
pub const BROKER_STOP_TIMEOUT_MS: u64 = 10_000;

/// CPU time and memory of a process, from `/proc/<pid>/stat` and `/proc/<pid>/status`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcSample {
    /// User + system CPU seconds since the process started.
    pub cpu_s: f64,
    /// Resident set size now, bytes.
    pub rss_bytes: u64,
    /// Peak resident set size (VmHWM), bytes.
    pub peak_rss_bytes: u64,
}

/// Reads one sample of `pid`; `None` when the process is gone or `/proc` unreadable.
pub fn sample(pid: u32) -> Option<ProcSample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start after ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the full line: 12 and 13 after ')'.
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let ticks = if ticks > 0 { ticks as f64 } else { 100.0 };
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = |key: &str| -> u64 {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    Some(ProcSample {
        cpu_s: (utime + stime) as f64 / ticks,
        rss_bytes: kb("VmRSS:"),
        peak_rss_bytes: kb("VmHWM:"),
    })
}

/// A broker started by the bench.
pub struct BrokerProcess {
    child: Child,
}

impl BrokerProcess {
    /// Starts `cmd` under `sh -c 'exec …'` in its own process group, with its
    /// output appended to `log`, and waits up to `timeout` until `bootstrap`
    /// accepts TCP connections.
    pub fn start(
        cmd: &str,
        bootstrap: &str,
        log: &Path,
        timeout: Duration,
    ) -> Result<Self, BenchError> {
        use std::os::unix::process::CommandExt;
        if accepts(bootstrap) {
            // Another broker already answers there: measuring it instead of
            // the one we start would silently be wrong.
            return Err(BenchError::Broker(format!(
                "{bootstrap} already accepts connections before --broker-cmd started; stop that broker first"
            )));
        }
        let io = |what: &str, source| BenchError::Io {
            what: what.to_string(),
            source,
        };
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| io("opening broker log", e))?;
        let err = out.try_clone().map_err(|e| io("opening broker log", e))?;
        let child = Command::new("sh")
            .arg("-c")
            .arg(format!("exec {cmd}"))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(|e| io("starting broker", e))?;
        let mut b = BrokerProcess { child };
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = b.child.try_wait() {
                return Err(BenchError::Broker(format!(
                    "broker exited at start ({status}); see {}",
                    log.display()
                )));
            }
            if accepts(bootstrap) {
                return Ok(b);
            }
            if Instant::now() > deadline {
                b.stop();
                return Err(BenchError::Broker(format!(
                    "broker did not accept connections on {bootstrap} within {} ms (--broker-start-timeout)",
                    timeout.as_millis()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM to the process group, then SIGKILL after [`BROKER_STOP_TIMEOUT_MS`].
    pub fn stop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        let pgid = self.child.id() as i32;
        // SAFETY: kill(2) with a process group we created; no memory is involved.
        unsafe { libc::kill(-pgid, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_millis(BROKER_STOP_TIMEOUT_MS);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // SAFETY: as above.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// True when the first address of a comma-separated bootstrap list accepts TCP.
pub fn accepts(bootstrap: &str) -> bool {
    let first = bootstrap.split(',').next().unwrap_or(bootstrap).trim();
    match first.to_socket_addrs() {
        Ok(mut addrs) => {
            addrs.any(|a| TcpStream::connect_timeout(&a, Duration::from_millis(200)).is_ok())
        }
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn own_process_can_be_sampled() {
        let s = super::sample(std::process::id()).unwrap();
        assert!(s.rss_bytes > 0);
        assert!(s.peak_rss_bytes >= s.rss_bytes);
    }
}
