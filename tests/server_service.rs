//! `fjord serve` as a service: readiness and stop notifications over
//! systemd's notify socket, a second SIGTERM that ends a stop at once, and
//! `--log-format json`. Each test runs the real binary with a real notify
//! socket (a Unix datagram socket bound here, as systemd binds one).

mod common;

use common::client::{self, send, TestMessage};
use common::{free_port_base, wait_for};
use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixDatagram;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

/// How long a test waits for the broker to be ready or to exit.
const WAIT: Duration = Duration::from_secs(30);

/// Starts `fjord serve` on one shard in `dir` with `extra` flags and
/// `NOTIFY_SOCKET` pointing at `notify` (if any); returns the child and its
/// stdout and stderr lines.
fn serve(
    dir: &std::path::Path,
    notify: Option<&std::path::Path>,
    extra: &[&str],
) -> (Child, Receiver<String>, Receiver<String>) {
    let port = free_port_base(1).to_string();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fjord"));
    cmd.args(["serve", "--cores", "1", "--no-pin", "--listen", "127.0.0.1"])
        .args(["--port", &port])
        .arg("--data-dir")
        .arg(dir.join("data"))
        .args(extra)
        .env_remove("NOTIFY_SOCKET")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(n) = notify {
        cmd.env("NOTIFY_SOCKET", n);
    }
    let mut child = cmd.spawn().expect("spawn fjord serve");
    let out = lines(child.stdout.take().expect("stdout"));
    let err = lines(child.stderr.take().expect("stderr"));
    (child, out, err)
}

fn lines(r: impl std::io::Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for l in BufReader::new(r).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

fn wait_line(rx: &Receiver<String>, want: &str) -> Vec<String> {
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) if l.trim() == want => return seen,
            Ok(l) => seen.push(l),
            Err(_) => panic!("no line {want:?} within {WAIT:?}; saw {seen:?}"),
        }
    }
}

fn sigterm(child: &Child) {
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
}

fn recv_notification(socket: &UnixDatagram) -> String {
    let mut buf = [0u8; 4096];
    let n = socket
        .recv(&mut buf)
        .expect("a notification within the timeout");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn sd_notify_sends_ready_once_listening_and_stopping_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket_path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).expect("bind notify socket");
    socket.set_read_timeout(Some(WAIT)).expect("timeout");
    let (mut child, out, _err) = serve(dir.path(), Some(&socket_path), &[]);

    let ready = recv_notification(&socket);
    assert!(
        ready.lines().any(|l| l == "READY=1"),
        "first notification is READY=1: {ready:?}"
    );
    assert!(ready.contains("STATUS=1 shards listening"), "{ready:?}");
    // READY=1 comes after the shard listens: the listener line is printed
    // before it, and the port accepts connections.
    let before = wait_line(&out, "fjord: ready");
    let listening = before
        .iter()
        .find(|l| l.starts_with("fjord: shard 0 listening on "))
        .expect("shard 0 listening line");
    let addr = listening
        .trim_start_matches("fjord: shard 0 listening on ")
        .split(' ')
        .next()
        .expect("address");
    std::net::TcpStream::connect(addr).expect("the port accepts once READY=1 was sent");

    sigterm(&child);
    assert_eq!(recv_notification(&socket), "STOPPING=1");
    let status = wait_for(WAIT, "the broker to exit", || {
        child.try_wait().ok().flatten()
    });
    assert!(status.success(), "clean stop exits 0: {status}");
    wait_line(&out, "fjord: stopped");
}

/// How long every segment write of the broker in the second-signal test
/// waits (`--debug-write-delay-ms`): the stop it interrupts lasts at least
/// this long.
const SLOW_WRITE_MS: u64 = 4_000;

#[test]
fn a_second_sigterm_exits_at_once_with_status_130() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut child, out, err) = serve(
        dir.path(),
        None,
        &["--debug-write-delay-ms", &SLOW_WRITE_MS.to_string()],
    );
    let before = wait_line(&out, "fjord: ready");
    let port = before
        .iter()
        .find_map(|l| l.split("127.0.0.1:").nth(1))
        .and_then(|p| p.split(' ').next())
        .expect("the listening port")
        .to_string();
    // A produce whose write takes SLOW_WRITE_MS: the stop waits for it.
    let producer = client::producer(&format!("127.0.0.1:{port}"), &[("acks", "1")]);
    send(
        &producer,
        "slow",
        &TestMessage {
            id: 0,
            key: vec![],
            value: b"held up by a slow disk".to_vec(),
            headers: vec![],
        },
    );
    // Polling lets librdkafka send it.
    producer.poll(Duration::from_millis(500));
    sigterm(&child);
    // Signals sent back to back would merge into one pending signal: send
    // the second once the stop is under way (the watchdog logged it).
    let deadline = Instant::now() + WAIT;
    while !err
        .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        .expect("the stop is logged")
        .contains("stopping: no new connections")
    {}
    assert!(child.try_wait().expect("wait").is_none(), "still stopping");
    let second = Instant::now();
    sigterm(&child);
    let status = wait_for(WAIT, "the broker to exit", || {
        child.try_wait().ok().flatten()
    });
    let took = second.elapsed();
    assert_eq!(
        status.code(),
        Some(fjord::server::EXIT_SECOND_SIGNAL),
        "a second signal ends the process with EXIT_SECOND_SIGNAL: {status}"
    );
    assert!(
        took < Duration::from_millis(SLOW_WRITE_MS / 2),
        "at once, not after the stop: {took:?}"
    );
    let rest: Vec<String> = out.try_iter().collect();
    assert!(
        !rest.iter().any(|l| l == "fjord: stopped"),
        "a cut-short stop does not claim a clean one: {rest:?}"
    );
}

#[test]
fn log_format_json_writes_one_object_per_line_with_shard_thread() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut child, out, err) = serve(dir.path(), None, &["--log-format", "json"]);
    wait_line(&out, "fjord: ready");
    sigterm(&child);
    let status = wait_for(WAIT, "the broker to exit", || {
        child.try_wait().ok().flatten()
    });
    assert!(status.success(), "{status}");
    // The stderr reader ends when the pipe closes.
    let lines: Vec<String> = err.iter().collect();
    assert!(!lines.is_empty(), "the broker logged something");
    let mut shard_events = 0;
    for line in &lines {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not one JSON object per line ({e}): {line}"));
        for key in ["timestamp", "level", "target", "fields"] {
            assert!(v.get(key).is_some(), "no {key:?} in {line}");
        }
        assert!(v["fields"]["message"].is_string(), "no message in {line}");
        if v["threadName"]
            .as_str()
            .is_some_and(|t| t.starts_with("shard-0-"))
        {
            shard_events += 1;
        }
    }
    assert!(
        shard_events > 0,
        "events logged on shard 0 name its thread: {lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("stopping: no new connections")),
        "the stop is logged: {lines:?}"
    );
}
