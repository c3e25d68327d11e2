//! `fjord chaos --nodes 3 --netns` at a size that fits CI: three nodes of
//! one shard each, every one in its own network namespace (made by the
//! chaos command), topics with replication factor 3 and
//! `min.insync.replicas=2`, a few cycles that SIGKILL a partition's leader,
//! SIGKILL a follower and cut a leader off the network (each for longer
//! than the session timeout, so leaders move), in the default durability
//! mode and with `--fsync-acks`, with the full workload and with
//! `min.insync.replicas=1`. Each run must show real work (acknowledged
//! messages, kills of leaders and followers, a cut and heal, committed
//! offsets and log starts checked after restarts) and find zero anomalies:
//! no acknowledged write lost, no duplicate, no G1a, no partial or lost
//! transaction, no log start or committed offset moving back. What the
//! earlier runs found, and the fixes, are in docs/replication.md §8.1
//! (the last, committed offsets moving back when a node cut off and
//! healed answered OffsetFetch from its stale coordinator, was fixed by
//! the lease of `metadata::lease`).
//!
//! A third run gives the checker nodes whose data is destroyed at the
//! final restart (every replica of `chaos-idem-0`), and must see the loss.
//!
//! Needs root (network namespaces), as CI has. The runs go one after
//! another (a mutex): each starts three debug brokers and a handful of
//! clients on a two-core machine. `FJORD_CHAOS_SEED` repeats a run's plan.
//!
//! Idempotent and transactional producers (markers reach leaders on other
//! nodes since branch `txnx`), a consumer group, and a DeleteRecords in
//! every cycle (followers take the leader's log start and the leader
//! answers with the low watermark since branch `delrec`,
//! docs/replication.md §4.3): the log starts are checked after every
//! restart (`log-start-regression`).

#[path = "common/chaos_run.rs"]
mod chaos_run;

use chaos_run::{n, seed, Outcome, Root};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Fault cycles per run: with `--netns` the seed orders kill-leader,
/// kill-follower and cut-leader, so three cycles make each once.
const CYCLES: u32 = 3;
const CYCLE_MS: u64 = 2_500;
/// Messages per second per idempotent producer (debug brokers, 2 cores).
const RATE: &str = "40";
/// `--broker-session-timeout-ms`: 6 s, not the chaos command's 3 s. Debug
/// nodes on a busy 2-core machine miss heartbeats for 3 s now and then and
/// are fenced while alive; a run must survive that too (docs/replication.md
/// §8.1 has the writes lost that way before the fixes), but each spurious
/// fencing moves leaders on top of the seed's faults, and a CI-size run
/// should do the faults it plans. The faults still outlast the timeout.
const SESSION_TIMEOUT_MS: &str = "6000";
/// One run takes at most this long.
const RUN_TIMEOUT_MS: u64 = 240_000;

static SERIAL: Mutex<()> = Mutex::new(());

/// The run ended without a run error, and found no anomaly of any kind.
fn no_anomaly(json: &serde_json::Value, report: &str) {
    assert_eq!(
        json["runErrors"].as_array().map(Vec::len),
        Some(0),
        "{report}"
    );
    for (name, count) in json["anomalies"].as_object().expect("anomalies") {
        assert_eq!(count.as_u64(), Some(0), "anomaly {name}\n{report}");
    }
}

/// Runs `fjord chaos` with `args` in `root` and waits (bounded).
fn chaos(root: &Path, args: &[String]) -> Outcome {
    chaos_run::chaos(root, args, Duration::from_millis(RUN_TIMEOUT_MS))
}

fn args(seed: u64, extra: &[&str]) -> Vec<String> {
    args_with(seed, CYCLES, extra)
}

fn args_with(seed: u64, cycles: u32, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "--seed",
        &seed.to_string(),
        "--nodes",
        "3",
        "--netns",
        "--broker-cores",
        "1",
        "--cycles",
        &cycles.to_string(),
        "--cycle-ms",
        &CYCLE_MS.to_string(),
        "--rate",
        RATE,
        "--broker-session-timeout-ms",
        SESSION_TIMEOUT_MS,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// The sum over nodes of a per-node count.
fn per_node(json: &serde_json::Value, key: &str) -> u64 {
    json["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n[key].as_u64().expect("a count"))
        .sum()
}

/// No namespace of a chaos process is left once it ended.
fn no_namespaces_left() {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    let text = String::from_utf8_lossy(&out.stdout);
    for line in text.lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(pid) = name
            .strip_prefix("fjord-")
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        // Namespaces of processes still running are other tests'.
        assert!(
            Path::new(&format!("/proc/{pid}")).exists(),
            "namespace {name} left behind by a process that ended"
        );
    }
}

/// A CI-size run with a DeleteRecords in every cycle and `extra`: it must
/// do the work of each fault and find zero anomalies.
fn survives(extra: &[&str]) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let seed = seed();
    eprintln!("fjord chaos seed {seed} (repeat with FJORD_CHAOS_SEED={seed}), {extra:?}");
    let root = Root::new("fjord-chaos-cluster-test-");
    let started = Instant::now();
    let mut a = vec!["--delete-records-share", "1"];
    a.extend_from_slice(extra);
    let o = chaos(&root.path(), &args(seed, &a));
    eprintln!("fjord chaos took {:.1} s", started.elapsed().as_secs_f64());
    let report = format!("--- stdout ---\n{}\n--- stderr ---\n{}", o.stdout, o.stderr);
    let json = o.json.unwrap_or_else(|| panic!("no JSON result\n{report}"));
    no_anomaly(&json, &report);
    assert_eq!(
        json["cycles"].as_array().map(Vec::len),
        Some(CYCLES as usize)
    );
    // Real work, checked: each fault once, acknowledged writes read back,
    // committed offsets fetched after restarts.
    assert!(per_node(&json, "kills_as_leader") >= 1, "{report}");
    assert!(per_node(&json, "kills_as_follower") >= 1, "{report}");
    assert!(per_node(&json, "cuts") >= 1, "{report}");
    assert!(
        json["cycles"]
            .as_array()
            .expect("cycles")
            .iter()
            .any(|c| c["past_session_timeout"] == serde_json::Value::Bool(true)),
        "{report}"
    );
    chaos_run::assert_did_real_work(&json, &report);
    // DeleteRecords acknowledged, and log starts checked after restarts.
    assert!(n(&json, &["operations", "deletes_acked"]) >= 1, "{report}");
    assert!(
        n(&json, &["operations", "log_start_checks"]) >= 1,
        "{report}"
    );
    no_namespaces_left();
}

/// Default mode: three nodes in namespaces, a kill of a leader, a kill of
/// a follower and a cut, each past the session timeout; the checks after
/// restarts; the read-back; zero anomalies; everything removed at the end.
#[test]
fn acknowledged_data_survives_leader_and_follower_kills_and_cuts() {
    survives(&[]);
}

/// The same with `--fsync-acks`.
#[test]
fn acknowledged_data_survives_leader_and_follower_kills_and_cuts_with_fsync_acks() {
    survives(&["--fsync-acks"]);
}

/// The full workload with the chaos command's own DeleteRecords share:
/// zero anomalies.
#[test]
fn the_full_workload_survives_leader_and_follower_kills_and_cuts() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let seed = seed();
    eprintln!("fjord chaos seed {seed} (repeat with FJORD_CHAOS_SEED={seed}), full workload");
    let root = Root::new("fjord-chaos-cluster-test-");
    let o = chaos(&root.path(), &args(seed, &[]));
    let report = format!("--- stdout ---\n{}\n--- stderr ---\n{}", o.stdout, o.stderr);
    let json = o.json.unwrap_or_else(|| panic!("no JSON result\n{report}"));
    no_anomaly(&json, &report);
    no_namespaces_left();
}

/// A broker "executable" that destroys `chaos-idem-0` (segments, indexes,
/// snapshots) at the run's final restart, on every node, then runs the
/// real broker: every replica comes back empty. The final restart is the
/// first start after the chaos command wrote its "clean stop" marker into
/// the node's log (`run/node-<i>.log`, next to `run/data/node-<i>`).
fn damaging_broker(root: &Path) -> PathBuf {
    chaos_run::damaging_broker(
        root,
        r#"log="$dir/../../$(basename "$dir").log"
if grep -q "=== chaos: clean stop" "$log" 2>/dev/null; then
    rm -rf "$dir/chaos-idem-0"
fi"#,
    )
}

#[test]
fn the_checker_sees_every_replica_destroyed_at_the_final_restart() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let seed = seed();
    eprintln!("fjord chaos seed {seed} (repeat with FJORD_CHAOS_SEED={seed}), damaging broker");
    let root = Root::new("fjord-chaos-cluster-test-");
    let bin = damaging_broker(&root.path());
    let bin = bin.display().to_string();
    let a = args_with(
        seed,
        1,
        &[
            "--transactional-producers",
            "0",
            "--group-consumers",
            "0",
            "--partitions",
            "1",
            "--delete-records-share",
            "0",
            "--broker-bin",
            &bin,
        ],
    );
    let o = chaos(&root.path(), &a);
    let report = format!("--- stdout ---\n{}\n--- stderr ---\n{}", o.stdout, o.stderr);
    assert!(!o.success, "the run must fail\n{report}");
    let json = o.json.unwrap_or_else(|| panic!("no JSON result\n{report}"));
    assert!(n(&json, &["anomalies", "lost-write"]) > 0, "{report}");
    assert_eq!(json["ok"], serde_json::Value::Bool(false));
    no_namespaces_left();
}

/// `--min-insync-replicas 1`: two nodes may be down at once (half the
/// cycles kill a second node). The run may lose acknowledged writes only as
/// Kafka documents (counted apart, `lostWritesAllowedByMinInsync1`, when
/// the ISR was seen at the leader alone); anything else is an anomaly.
#[test]
fn with_min_insync_replicas_1_only_the_documented_losses_are_allowed() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let seed = seed();
    eprintln!(
        "fjord chaos seed {seed} (repeat with FJORD_CHAOS_SEED={seed}), min.insync.replicas=1"
    );
    let root = Root::new("fjord-chaos-cluster-test-");
    let o = chaos(
        &root.path(),
        &args(
            seed,
            &["--delete-records-share", "0", "--min-insync-replicas", "1"],
        ),
    );
    let report = format!("--- stdout ---\n{}\n--- stderr ---\n{}", o.stdout, o.stderr);
    let json = o.json.unwrap_or_else(|| panic!("no JSON result\n{report}"));
    no_anomaly(&json, &report);
    assert!(json["lostWritesAllowedByMinInsync1"].is_u64(), "{report}");
    assert!(
        n(&json, &["operations", "idempotent", "acked"]) > 100,
        "{report}"
    );
    no_namespaces_left();
}
