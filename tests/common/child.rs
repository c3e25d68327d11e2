//! Bounded child processes for the interop tests (Maven, Kafka's tools, the
//! Java scenarios): each runs in a process group of its own and is killed,
//! the whole group, when it outlives its timeout, so that no JVM outlives
//! its test and a grandchild holding a pipe open cannot hang one.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Time between SIGTERM and SIGKILL of a child that timed out.
pub const KILL_GRACE_MS: u64 = 5_000;
/// Longest the output readers may take to drain after the child exited.
pub const DRAIN_TIMEOUT_MS: u64 = 10_000;
/// Poll period while waiting for a child.
pub const WAIT_POLL_MS: u64 = 50;

/// How a child's two output streams are collected.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Streams {
    /// stdout and stderr apart.
    Separate,
    /// Both into `stdout`, interleaved by line as they arrive.
    Merged,
}

/// A finished (or killed) child.
pub struct ChildRun {
    /// The command line, as a user would type it.
    pub command: String,
    /// None when the child was killed for running longer than its timeout
    /// (or could not be started; `stderr` says which).
    pub status: Option<ExitStatus>,
    pub stdout: String,
    /// Empty with [`Streams::Merged`].
    pub stderr: String,
    pub elapsed: Duration,
}

impl ChildRun {
    pub fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    pub fn describe_status(&self) -> String {
        match self.status {
            Some(s) => format!("{s}"),
            None => format!("killed after running longer than {:?}", self.elapsed),
        }
    }

    /// Asserts exit status 0 and returns stdout.
    pub fn ok(&self) -> &str {
        assert!(
            self.success(),
            "`{}` failed: {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.command,
            self.describe_status(),
            self.stdout,
            self.stderr
        );
        &self.stdout
    }
}

/// Sends `sig` to every process of the group led by `pid`.
pub fn signal_group(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on the process group of our own child; no memory is touched.
    unsafe { libc::kill(-(pid as libc::pid_t), sig) };
}

/// A thread that appends `pipe`'s lines to `into`.
fn reader(pipe: impl Read + Send + 'static, into: Arc<Mutex<String>>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = BufReader::new(pipe);
        let mut line = Vec::new();
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let mut t = into.lock().unwrap_or_else(|p| p.into_inner());
                    t.push_str(&String::from_utf8_lossy(&line));
                    if !line.ends_with(b"\n") {
                        t.push('\n');
                    }
                }
            }
        }
    })
}

/// Waits for `handles` until `deadline`; those still running are left.
fn join_by(handles: Vec<JoinHandle<()>>, deadline: Instant) {
    for h in handles {
        while !h.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(WAIT_POLL_MS));
        }
        if h.is_finished() {
            let _ = h.join();
        }
    }
}

/// Runs `cmd` in a process group of its own with `stdin` as its standard
/// input (none: /dev/null), and kills the whole group if it runs longer
/// than `timeout`. `command` is how the run is named in reports.
pub fn run_bounded(
    cmd: &mut Command,
    command: String,
    stdin: Option<&[u8]>,
    streams: Streams,
    timeout: Duration,
) -> ChildRun {
    let started = Instant::now();
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .process_group(0);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return ChildRun {
                command,
                status: None,
                stdout: String::new(),
                stderr: format!("could not start: {e}"),
                elapsed: started.elapsed(),
            }
        }
    };
    // The input is written from its own thread: a child that writes a lot
    // before it reads all of its input must not deadlock against us.
    let writer = stdin.map(|bytes| {
        let bytes = bytes.to_vec();
        let mut pipe = child.stdin.take().expect("piped stdin");
        std::thread::spawn(move || {
            let _ = pipe.write_all(&bytes);
        })
    });
    let out = Arc::new(Mutex::new(String::new()));
    let err = match streams {
        Streams::Separate => Arc::new(Mutex::new(String::new())),
        Streams::Merged => Arc::clone(&out),
    };
    let readers = vec![
        reader(child.stdout.take().expect("piped stdout"), Arc::clone(&out)),
        reader(child.stderr.take().expect("piped stderr"), Arc::clone(&err)),
    ];
    let deadline = started + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(WAIT_POLL_MS))
            }
            Ok(None) | Err(_) => {
                signal_group(child.id(), libc::SIGTERM);
                let grace = Instant::now() + Duration::from_millis(KILL_GRACE_MS);
                while Instant::now() < grace && matches!(child.try_wait(), Ok(None)) {
                    std::thread::sleep(Duration::from_millis(WAIT_POLL_MS));
                }
                signal_group(child.id(), libc::SIGKILL);
                let _ = child.wait();
                break None;
            }
        }
    };
    // Whatever is left of the group (a grandchild that ignored its parent's
    // end) goes too, so that the pipes close.
    signal_group(child.id(), libc::SIGKILL);
    if let Some(w) = writer {
        let _ = w.join();
    }
    join_by(
        readers,
        Instant::now() + Duration::from_millis(DRAIN_TIMEOUT_MS),
    );
    let take = |s: &Arc<Mutex<String>>| s.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let stdout = take(&out);
    let stderr = match streams {
        Streams::Separate => take(&err),
        Streams::Merged => String::new(),
    };
    ChildRun {
        command,
        status,
        stdout,
        stderr,
        elapsed: started.elapsed(),
    }
}
