//! `fjord chaos` at a size that fits CI: a few kill -9 cycles of a few
//! seconds each, in the default durability mode and with `--fsync-acks`,
//! run through the built `fjord` binary; the JSON result must show zero
//! anomalies and real work (acknowledged messages, committed and aborted
//! transactions, group commits checked after restarts). A third run gives
//! the checker a broker whose data is damaged between a kill and the
//! restart, and must see the loss: a checker that cannot fail proves
//! nothing.
//!
//! The runs go one after another (a mutex), not in parallel: each starts a
//! two-shard broker and a handful of clients, and the CI machine has two
//! cores. `FJORD_CHAOS_SEED` repeats a run's plan; the seed is printed.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Kill -9 cycles per run.
const CYCLES: u32 = 3;
/// Mean load between kills.
const CYCLE_MS: u64 = 2_500;
/// Messages per second per idempotent producer (the default is sized for
/// release builds; tests run the debug binary).
const RATE: &str = "60";
/// One run takes at most this long (debug build, busy machine).
const RUN_TIMEOUT_MS: u64 = 150_000;

static SERIAL: Mutex<()> = Mutex::new(());

fn seed() -> u64 {
    std::env::var("FJORD_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::random::<u32>() as u64)
}

/// Output of one `fjord chaos` run.
struct Outcome {
    success: bool,
    stdout: String,
    stderr: String,
    json: Option<serde_json::Value>,
}

/// Runs `fjord chaos` with `args` in `root` and waits (bounded).
fn chaos(root: &Path, args: &[String]) -> Outcome {
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
    // Drain both pipes on threads so that the child never blocks on them.
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let so = drain(Box::new(child.stdout.take().expect("stdout")));
    let se = drain(Box::new(child.stderr.take().expect("stderr")));
    let deadline = Instant::now() + Duration::from_millis(RUN_TIMEOUT_MS);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for fjord chaos") {
            break s;
        }
        if Instant::now() >= deadline {
            // SIGKILL of the chaos process also kills its broker
            // (PR_SET_PDEATHSIG).
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "fjord chaos did not finish within {RUN_TIMEOUT_MS} ms; run directory {}",
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

fn args(seed: u64, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "--seed",
        &seed.to_string(),
        "--cycles",
        &CYCLES.to_string(),
        "--cycle-ms",
        &CYCLE_MS.to_string(),
        "--rate",
        RATE,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// A run directory that is kept when the test fails.
struct Root(Option<tempfile::TempDir>);

impl Root {
    fn new() -> Root {
        Root(Some(
            tempfile::Builder::new()
                .prefix("fjord-chaos-test-")
                .tempdir()
                .expect("temporary directory"),
        ))
    }

    fn path(&self) -> PathBuf {
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

fn n(v: &serde_json::Value, path: &[&str]) -> u64 {
    let mut v = v;
    for p in path {
        v = &v[*p];
    }
    v.as_u64()
        .unwrap_or_else(|| panic!("{path:?} is not a count in the result"))
}

fn survives(extra: &[&str]) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let seed = seed();
    eprintln!("fjord chaos seed {seed} (repeat with FJORD_CHAOS_SEED={seed}), {extra:?}");
    let root = Root::new();
    let started = Instant::now();
    let o = chaos(&root.path(), &args(seed, extra));
    eprintln!("fjord chaos took {:.1} s", started.elapsed().as_secs_f64());
    let report = format!("--- stdout ---\n{}\n--- stderr ---\n{}", o.stdout, o.stderr);
    let json = o.json.unwrap_or_else(|| panic!("no JSON result\n{report}"));
    assert!(o.success, "fjord chaos failed\n{report}");
    assert_eq!(n(&json, &["anomalyTotal"]), 0, "{report}");
    for (name, count) in json["anomalies"].as_object().expect("anomalies") {
        assert_eq!(count.as_u64(), Some(0), "anomaly {name}\n{report}");
    }
    assert_eq!(json["ok"], serde_json::Value::Bool(true), "{report}");
    assert_eq!(
        json["cycles"].as_array().map(Vec::len),
        Some(CYCLES as usize)
    );
    // The run did real work that was checked.
    assert!(
        n(&json, &["operations", "idempotent", "acked"]) > 100,
        "{report}"
    );
    assert!(
        n(&json, &["operations", "transactions", "committed"]) > 0,
        "{report}"
    );
    assert!(
        n(&json, &["operations", "transactions", "aborted_on_purpose"]) > 0,
        "{report}"
    );
    assert!(
        n(&json, &["operations", "offset_commit_partitions_acked"]) > 0,
        "{report}"
    );
    assert!(n(&json, &["operations", "offset_checks"]) > 0, "{report}");
    assert!(
        n(&json, &["operations", "records_read_committed"]) > 0,
        "{report}"
    );
}

#[test]
fn acknowledged_data_survives_kill9_cycles() {
    survives(&[]);
}

#[test]
fn acknowledged_data_survives_kill9_cycles_with_fsync_acks() {
    survives(&["--fsync-acks"]);
}

/// A broker "executable" that damages the data between a kill and the
/// restart: before every start but the first it deletes the directory of
/// `chaos-idem-0` (segments, indexes, snapshots), then runs the real broker,
/// which opens the partition empty.
fn damaging_broker(root: &Path) -> PathBuf {
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
if [ -e "$dir.started" ]; then
    rm -rf "$dir/chaos-idem-0"
fi
touch "$dir.started"
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

#[test]
fn the_checker_sees_acknowledged_writes_destroyed_between_kill_and_restart() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let seed = seed();
    eprintln!("fjord chaos seed {seed} (repeat with FJORD_CHAOS_SEED={seed}), damaging broker");
    let root = Root::new();
    let bin = damaging_broker(&root.path());
    let mut a = vec![
        "--seed".to_string(),
        seed.to_string(),
        "--cycles".into(),
        "1".into(),
        "--cycle-ms".into(),
        "2000".into(),
        "--rate".into(),
        RATE.into(),
        "--transactional-producers".into(),
        "0".into(),
        "--group-consumers".into(),
        "0".into(),
        "--partitions".into(),
        "1".into(),
        "--broker-bin".into(),
    ];
    a.push(bin.display().to_string());
    let o = chaos(&root.path(), &a);
    let report = format!("--- stdout ---\n{}\n--- stderr ---\n{}", o.stdout, o.stderr);
    assert!(!o.success, "the run must fail\n{report}");
    let json = o.json.unwrap_or_else(|| panic!("no JSON result\n{report}"));
    assert!(n(&json, &["anomalies", "lost-write"]) > 0, "{report}");
    assert_eq!(json["ok"], serde_json::Value::Bool(false));
}
