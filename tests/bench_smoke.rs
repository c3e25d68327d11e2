//! Smoke test of `fjord bench` and `fjord report` against a real `fjord serve`:
//! a short low-rate run (plain, idempotent, then transactional) must produce an OMB-shaped
//! JSON result with non-zero counts in every metric, and `fjord report` must
//! turn the results into HTML, Markdown and SVG charts.
//!
//! No timing assertions: latencies are only checked to be present and
//! ordered (p50 ≤ p99 ≤ max), never compared with a bound.

mod common;

use std::path::Path;
use std::process::Command;

use common::{Broker, BrokerOpts};

fn bench(broker: &Broker, out: &Path, label: &str, extra: &[&str]) -> serde_json::Value {
    let pid = broker.pid().expect("broker is running").to_string();
    let bootstrap = broker.bootstrap();
    let mut args = vec!["bench"];
    if !extra.contains(&"--bootstrap") {
        args.extend_from_slice(&["--bootstrap", &bootstrap]);
    }
    args.extend_from_slice(&[
        "--label",
        label,
        "--name",
        "smoke",
        "--message-size",
        "100",
        "--duration",
        "3s",
        "--warmup",
        "1s",
        "--status-interval-secs",
        "1",
        "--broker-pid",
        &pid,
        "--output",
        out.to_str().expect("utf-8 temp path"),
    ]);
    if !extra.contains(&"--rate") {
        args.extend_from_slice(&["--rate", "500"]);
    }
    args.extend_from_slice(extra);
    let run = Command::new(env!("CARGO_BIN_EXE_fjord"))
        .args(&args)
        .output()
        .expect("run fjord bench");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "fjord bench failed\nstdout:\n{stdout}\nstderr:\n{stderr}\nbroker:\n{}",
        broker.stderr_tail()
    );
    assert!(
        stdout.contains("records sent,") && stdout.contains("ms 99.9th."),
        "no kafka-producer-perf-test line:\n{stdout}"
    );
    assert!(stdout.contains("[    1s] pub"), "no status line:\n{stdout}");
    let file = std::fs::read_dir(out)
        .expect("output dir")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            p.extension().is_some_and(|e| e == "json")
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(&format!("smoke-{label}-")))
        })
        .expect("result JSON written");
    serde_json::from_str(&std::fs::read_to_string(file).expect("read result")).expect("valid JSON")
}

fn check_result(r: &serde_json::Value) {
    let num = |k: &str| {
        r[k].as_f64()
            .unwrap_or_else(|| panic!("{k} missing in {r:#}"))
    };
    for prefix in [
        "aggregatedPublishLatency",
        "aggregatedEndToEndLatency",
        "aggregatedPublishDelayLatency",
    ] {
        for suffix in [
            "Avg", "50pct", "75pct", "95pct", "99pct", "999pct", "9999pct", "Max",
        ] {
            assert!(num(&format!("{prefix}{suffix}")) >= 0.0);
        }
        assert!(num(&format!("{prefix}50pct")) <= num(&format!("{prefix}99pct")));
        assert!(num(&format!("{prefix}99pct")) <= num(&format!("{prefix}Max")));
        assert!(
            num(&format!("{prefix}Count")) > 0.0,
            "{prefix}Count is zero"
        );
        assert!(r[format!("{prefix}Quantiles")]
            .as_object()
            .is_some_and(|m| !m.is_empty()));
    }
    assert!(num("aggregatedPublishLatency50pct") > 0.0);
    for series in [
        "publishRate",
        "consumeRate",
        "backlog",
        "publishLatency99pct",
        "endToEndLatency99pct",
    ] {
        let s = r[series]
            .as_array()
            .unwrap_or_else(|| panic!("{series} missing"));
        assert!(!s.is_empty(), "{series} is empty");
    }
    let t = &r["totals"];
    assert!(
        t["acked"].as_u64().unwrap_or(0) > 0,
        "nothing acknowledged: {t}"
    );
    assert!(
        t["consumed"].as_u64().unwrap_or(0) > 0,
        "nothing consumed: {t}"
    );
    assert_eq!(t["errors"].as_u64(), Some(0), "errors: {t}");
    assert!(
        r["broker"]["cpuSeconds"].as_f64().is_some_and(|c| c > 0.0),
        "{}",
        r["broker"]
    );
    assert!(r["broker"]["peakRssBytes"].as_u64().is_some_and(|b| b > 0));
    assert!(r["environment"]["kernel"].as_str().is_some());
    assert_eq!(r["messageSize"].as_u64(), Some(100));
}

#[test]
fn bench_plain_idempotent_and_transactional_then_report() {
    let broker = Broker::start(BrokerOpts::default().cores(1));
    let out = tempfile::tempdir().expect("tempdir");
    let plain = bench(&broker, out.path(), "plain", &[]);
    check_result(&plain);
    assert_eq!(plain["config"]["idempotence"].as_bool(), Some(false));
    let idem = bench(
        &broker,
        out.path(),
        "idempotent",
        &["--idempotence", "true"],
    );
    check_result(&idem);
    assert_eq!(idem["config"]["idempotence"].as_bool(), Some(true));
    // Transactions: every commit flushes the producer, which serves its
    // own delivery reports while it waits.
    let txn = bench(
        &broker,
        out.path(),
        "transactional",
        &["--idempotence", "true", "--transaction-duration-ms", "200"],
    );
    check_result(&txn);
    let committed = txn["transactions"]["committed"].as_u64().unwrap_or(0);
    assert!(
        committed > 0,
        "no transaction committed: {}",
        txn["transactions"]
    );

    let mut files: Vec<_> = std::fs::read_dir(out.path())
        .expect("output dir")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    let report_dir = out.path().join("report");
    let run = Command::new(env!("CARGO_BIN_EXE_fjord"))
        .arg("report")
        .args(&files)
        .arg("--output")
        .arg(&report_dir)
        .output()
        .expect("run fjord report");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let md = std::fs::read_to_string(report_dir.join("report.md")).expect("report.md");
    assert!(
        md.contains("idempotent (smoke)") && md.contains("plain (smoke)"),
        "{md}"
    );
    assert!(
        md.starts_with("# ") && md.contains("**Verdict.** Under smoke"),
        "a verdict first:\n{md}"
    );
    // Ratio cells read " · same" or " · 1.3× slower" (faster, more, less).
    let ratios: Vec<&str> = md
        .lines()
        .filter(|l| l.starts_with("| "))
        .flat_map(|l| l.split(" | "))
        .filter_map(|cell| {
            cell.split_once(" · ")
                .map(|(_, r)| r.trim_end_matches(" |"))
        })
        .collect();
    assert!(!ratios.is_empty(), "no ratio column:\n{md}");
    for r in &ratios {
        let words = r == &"same"
            || r.split_once("× ").is_some_and(|(n, w)| {
                n.parse::<f64>().is_ok() && ["slower", "faster", "more", "less"].contains(&w)
            });
        assert!(words, "ratio {r:?} is not in words:\n{md}");
    }
    let html = std::fs::read_to_string(report_dir.join("index.html")).expect("index.html");
    assert!(html.contains("publish-latency-percentiles.svg"));
    let svg = std::fs::read_to_string(report_dir.join("publish-latency-percentiles.svg"))
        .expect("percentile chart");
    assert!(
        svg.starts_with("<svg") && svg.contains("p99.9"),
        "chart lacks p99.9 label"
    );
}

/// A producer far behind its schedule hands librdkafka what is due in
/// bursts (`rd_kafka_produce_batch`) and retries what a full queue refused.
/// Every measured message must still be acknowledged and consumed exactly
/// once, with keys spread over four partitions. librdkafka's queue holds
/// 1,000 messages and lingers 5 ms, so the producer is refused again and
/// again, and the run stays small enough for the consumer to drain. (A
/// refused message that was never sent again would fail the producer's own
/// check that every scheduled message was accepted or failed: the bench is
/// a debug build here.)
#[test]
fn saturating_bursts_deliver_every_message_once() {
    let broker = Broker::start(BrokerOpts::default().cores(1));
    let out = tempfile::tempdir().expect("tempdir");
    let r = bench(
        &broker,
        out.path(),
        "bursts",
        &[
            "--rate",
            "1000000",
            "--partitions",
            "4",
            "--keys",
            "round-robin",
            "--linger-ms",
            "5",
            "--producer-config",
            "queue.buffering.max.messages=1000",
        ],
    );
    check_result(&r);
    let t = &r["totals"];
    let sent = t["sent"].as_u64().unwrap_or(0);
    assert!(sent > 0, "{t}");
    assert_eq!(t["acked"].as_u64(), Some(sent), "{t}");
    assert_eq!(t["consumed"].as_u64(), Some(sent), "{t}");
    // The precondition: the full queue refused sends, which were retried.
    assert!(
        t["refusedQueueFull"].as_u64().unwrap_or(0) > 0,
        "no send was refused: {t}"
    );
}

/// `--client-config` reaches every client of a run, the admin client that
/// creates the topic and the set-up consumer included: the whole run goes
/// through a SASL_PLAINTEXT listener (which closes any connection that
/// sends Metadata before authenticating), as `User:bench`, and the result
/// file does not hold the password.
#[test]
fn client_config_authenticates_every_client_on_a_sasl_listener() {
    let sasl_port = common::free_port_base(1);
    let mut broker = Broker::start(
        BrokerOpts::default()
            .cores(1)
            .arg("--listener")
            .arg(format!("SASL_PLAINTEXT://127.0.0.1:{sasl_port}"))
            .arg("--sasl-enabled-mechanisms")
            .arg("SCRAM-SHA-256"),
    );
    broker.stop();
    let added = Command::new(env!("CARGO_BIN_EXE_fjord"))
        .args(["scram", "add", "--data-dir"])
        .arg(broker.data_dir())
        .args(["--user", "bench", "--mechanism", "SCRAM-SHA-256"])
        .args(["--password", "bench-secret"])
        .output()
        .expect("run fjord scram add");
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    broker.restart();
    let out = tempfile::tempdir().expect("tempdir");
    let bootstrap = format!("127.0.0.1:{sasl_port}");
    let r = bench(
        &broker,
        out.path(),
        "sasl",
        &[
            "--bootstrap",
            &bootstrap,
            "--client-config",
            "security.protocol=SASL_PLAINTEXT",
            "--client-config",
            "sasl.mechanisms=SCRAM-SHA-256",
            "--client-config",
            "sasl.username=bench",
            "--client-config",
            "sasl.password=bench-secret",
        ],
    );
    check_result(&r);
    let text = r.to_string();
    assert!(!text.contains("bench-secret"), "password recorded: {text}");
    assert!(text.contains("SASL_PLAINTEXT"), "{text}");
    let log = broker.stderr_since(0);
    assert!(
        log.contains("authenticated") && log.contains("User:bench"),
        "the bench's clients authenticated:\n{}",
        broker.stderr_tail()
    );
}

/// The same over an SSL listener: `--client-config security.protocol=ssl`
/// and `ssl.ca.location` take every client of the run (admin included)
/// through TLS, and the run measures as over PLAINTEXT.
#[test]
fn client_config_runs_a_bench_over_an_ssl_listener() {
    let pki = common::tls::TestPki::new("bench-ca");
    let ssl_port = common::free_port_base(1);
    let broker = Broker::start(
        BrokerOpts::default()
            .cores(1)
            .arg("--listener")
            .arg(format!("SSL://127.0.0.1:{ssl_port}"))
            .arg("--tls-cert")
            .arg(pki.server_cert_path.display().to_string())
            .arg("--tls-key")
            .arg(pki.server_key_path.display().to_string()),
    );
    let out = tempfile::tempdir().expect("tempdir");
    let bootstrap = format!("127.0.0.1:{ssl_port}");
    let ca = format!("ssl.ca.location={}", pki.ca_path.display());
    let r = bench(
        &broker,
        out.path(),
        "ssl",
        &[
            "--bootstrap",
            &bootstrap,
            "--client-config",
            "security.protocol=ssl",
            "--client-config",
            &ca,
        ],
    );
    check_result(&r);
    let log = broker.stderr_since(0);
    assert!(
        !log.contains("TLS handshake failed"),
        "every client spoke TLS:\n{}",
        broker.stderr_tail()
    );
}
