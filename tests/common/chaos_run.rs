//! Running `fjord chaos` from a test (tests/chaos.rs, tests/chaos_cluster.rs):
//! the seed, one bounded run and its JSON result, a run directory kept
//! when the test fails, and a broker "executable" that damages data.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `FJORD_CHAOS_SEED`, else a random one (the tests print it).
pub fn seed() -> u64 {
    std::env::var("FJORD_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::random::<u32>() as u64)
}

/// Output of one `fjord chaos` run.
pub struct Outcome {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
    pub json: Option<serde_json::Value>,
}

/// Runs `fjord chaos` with `args` in `root` and waits, at most `timeout`
/// (then SIGTERM, which stops its brokers and removes its namespaces, and
/// SIGKILL if it does not end).
pub fn chaos(root: &Path, args: &[String], timeout: Duration) -> Outcome {
    let out = root.join("result.json");
    let mut child = Command::new(env!("CARGO_BIN_EXE_fjord"))
        .arg("chaos")
        .arg("--data-dir")
        .arg(root.join("run"))
        .arg("--out")
        .arg(&out)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start fjord chaos");
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let so = drain(Box::new(child.stdout.take().expect("stdout")));
    let se = drain(Box::new(child.stderr.take().expect("stderr")));
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for fjord chaos") {
            break s;
        }
        if Instant::now() >= deadline {
            // SIGTERM first: the chaos command then stops its nodes and
            // removes its namespaces; SIGKILL if it does not end.
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            std::thread::sleep(Duration::from_secs(5));
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "fjord chaos did not finish within {timeout:?}; run directory {}",
                root.display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stdout = so.join().unwrap_or_default();
    let stderr = se.join().unwrap_or_default();
    let json = std::fs::read_to_string(&out)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    Outcome {
        success: status.success(),
        stdout,
        stderr,
        json,
    }
}

/// A run directory that is kept when the test fails.
pub struct Root(Option<tempfile::TempDir>);

impl Root {
    pub fn new(prefix: &str) -> Root {
        Root(Some(
            tempfile::Builder::new()
                .prefix(prefix)
                .tempdir()
                .expect("temporary directory"),
        ))
    }

    pub fn path(&self) -> PathBuf {
        self.0.as_ref().expect("root").path().to_path_buf()
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(d) = self.0.take() {
                eprintln!("kept the chaos run directory: {}", d.keep().display());
            }
        }
    }
}

/// The count at `path` in a run's JSON result.
pub fn n(v: &serde_json::Value, path: &[&str]) -> u64 {
    let mut v = v;
    for p in path {
        v = &v[*p];
    }
    v.as_u64()
        .unwrap_or_else(|| panic!("{path:?} is not a count in the result"))
}

/// Asserts the run's JSON result shows real, checked work: acknowledged
/// idempotent writes, committed and aborted transactions, committed group
/// offsets fetched back after restarts, records read back read_committed.
pub fn assert_did_real_work(json: &serde_json::Value, report: &str) {
    assert!(
        n(json, &["operations", "idempotent", "acked"]) > 100,
        "{report}"
    );
    assert!(
        n(json, &["operations", "transactions", "committed"]) > 0,
        "{report}"
    );
    assert!(
        n(json, &["operations", "transactions", "aborted_on_purpose"]) > 0,
        "{report}"
    );
    assert!(
        n(json, &["operations", "offset_commit_partitions_acked"]) > 0,
        "{report}"
    );
    assert!(n(json, &["operations", "offset_checks"]) > 0, "{report}");
    assert!(
        n(json, &["operations", "records_read_committed"]) > 0,
        "{report}"
    );
}

/// A broker "executable" in `root`: a shell script that finds
/// `--data-dir` among its arguments (as `$dir`), runs `damage` (shell
/// lines), then the real broker.
pub fn damaging_broker(root: &Path, damage: &str) -> PathBuf {
    let script = root.join("damaging-broker.sh");
    let text = format!(
        r#"#!/bin/sh
# Finds --data-dir among the arguments.
dir=""
prev=""
for a in "$@"; do
    if [ "$prev" = "--data-dir" ]; then dir="$a"; fi
    prev="$a"
done
{damage}
exec "{}" "$@"
"#,
        env!("CARGO_BIN_EXE_fjord")
    );
    std::fs::write(&script, text).expect("write the damaging broker");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))
        .expect("make it executable");
    script
}
