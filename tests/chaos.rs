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

#[path = "common/chaos_run.rs"]
mod chaos_run;

use chaos_run::{n, seed, Outcome, Root};
use std::path::{Path, PathBuf};

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

/// Runs `fjord chaos` with `args` in `root` and waits (bounded).
fn chaos(root: &Path, args: &[String]) -> Outcome {
    chaos_run::chaos(root, args, Duration::from_millis(RUN_TIMEOUT_MS))
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

fn survives(extra: &[&str]) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let seed = seed();
    eprintln!("fjord chaos seed {seed} (repeat with FJORD_CHAOS_SEED={seed}), {extra:?}");
    let root = Root::new("fjord-chaos-test-");
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
    chaos_run::assert_did_real_work(&json, &report);
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
    chaos_run::damaging_broker(
        root,
        r#"if [ -e "$dir.started" ]; then
    rm -rf "$dir/chaos-idem-0"
fi
touch "$dir.started""#,
    )
}

#[test]
fn the_checker_sees_acknowledged_writes_destroyed_between_kill_and_restart() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let seed = seed();
    eprintln!("fjord chaos seed {seed} (repeat with FJORD_CHAOS_SEED={seed}), damaging broker");
    let root = Root::new("fjord-chaos-test-");
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
