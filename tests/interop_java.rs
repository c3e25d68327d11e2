//! Conformance with Apache Kafka's own Java client: every test runs one
//! scenario of the Maven module `interop/java` (kafka-clients and
//! kafka-streams 4.4.0) against a fresh fjord broker, and passes when the
//! scenario's checks all hold (exit status 0). The scenario's output, one
//! `check: ... ok` line per check, is printed (`--nocapture` shows it for
//! passing tests too).
//!
//! What it owns: one Maven build per test binary ([`java_build`], a
//! `OnceLock`; offline first, online if offline resolution fails, so that a
//! clean machine works), and likewise one resolve of `interop/connect` (the
//! Kafka Connect worker's jars, [`connect_build`]) for `connect-distributed`;
//! and the scenario child processes. Invariants: every child runs in its own
//! process group and is killed (the whole group, so also the Kafka Streams
//! child JVM of `streams-eos` and the Connect worker JVM of
//! `connect-distributed`) when it outlives its timeout.
//!
//! `FJORD_TEST_BROKER=kafka:HOST:PORT` runs the same scenarios against that
//! broker instead of starting fjord (the differential run against stock
//! Kafka, e.g. `scripts/kafka-peer.sh start` then
//! `FJORD_TEST_BROKER=kafka:127.0.0.1:19092 cargo test --test interop_java`).
//! Scenario names are unique per run, so several runs can share one broker.

mod common;

use common::child::{run_bounded, ChildRun, Streams};
use common::target::Target;
use common::BrokerOpts;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

/// Longest one Maven invocation may take (an online one downloads Kafka's jars).
const MAVEN_TIMEOUT_MS: u64 = 900_000;
/// Longest a scenario may run; the Java side's own watchdog fires at 420 s.
const SCENARIO_TIMEOUT_MS: u64 = 480_000;
/// Heap of a scenario JVM: enough for 100,000 records' bookkeeping, and bounded
/// because tests run in parallel on small machines.
const SCENARIO_HEAP: &str = "-Xmx1g";

/// The Maven module's directory.
fn java_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("interop/java")
}

/// Where the module's pom puts its build output (`classes/`, `lib/`): under
/// the repository's `target/`, not in the source tree.
fn java_build_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/interop-java")
}

/// Runs `mvn package` on `pom`: offline (`-o`, from the local repository)
/// first, then, if that fails, online, which downloads what is missing.
/// Returns Maven's output of both attempts when both fail.
fn maven_package(pom: &Path) -> Result<(), String> {
    let mut report = String::new();
    for offline in [true, false] {
        let mut cmd = Command::new("mvn");
        cmd.args(["-q", "-B"]);
        if offline {
            cmd.arg("-o");
        }
        cmd.arg("-f").arg(pom).arg("package");
        let out = run_bounded(
            &mut cmd,
            format!("mvn -f {} package (offline: {offline})", pom.display()),
            None,
            Streams::Merged,
            Duration::from_millis(MAVEN_TIMEOUT_MS),
        );
        if out.success() {
            return Ok(());
        }
        report.push_str(&format!(
            "--- mvn {} -f {} package: {} ---\n{}\n",
            if offline { "-o" } else { "(online)" },
            pom.display(),
            out.describe_status(),
            out.stdout
        ));
    }
    Err(report)
}

/// Builds the Maven module once per test binary ([`maven_package`]).
/// Panics with Maven's output when that fails.
fn java_build() {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    let result = BUILT.get_or_init(|| maven_package(&java_dir().join("pom.xml")));
    if let Err(report) = result {
        panic!("building interop/java with Maven failed (is Maven 3.8+ and Java 17 installed?):\n{report}");
    }
}

/// Resolves `interop/connect` (the Kafka Connect worker and the FileStream
/// connectors) once per test binary and returns the directory of its jars.
fn connect_build() -> PathBuf {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let result = BUILT.get_or_init(|| maven_package(&root.join("interop/connect/pom.xml")));
    if let Err(report) = result {
        panic!("resolving interop/connect with Maven failed:\n{report}");
    }
    root.join("target/interop-connect/lib")
}

/// Runs scenario `name` against `target`, with `extra` arguments after the
/// bootstrap option, and prints its output.
fn run_scenario(target: &Target, name: &str, extra: &[String]) -> ChildRun {
    java_build();
    let dir = java_build_dir();
    let classpath = format!(
        "{}:{}/*",
        dir.join("classes").display(),
        dir.join("lib").display()
    );
    let mut cmd = Command::new("java");
    cmd.arg(SCENARIO_HEAP)
        .arg("-XX:+UseSerialGC")
        .arg("-cp")
        .arg(classpath)
        .arg("fjord.interop.Main")
        .arg(name)
        .arg("--bootstrap")
        .arg(target.bootstrap())
        .args(extra);
    let out = run_bounded(
        &mut cmd,
        format!("scenario {name}"),
        None,
        Streams::Merged,
        Duration::from_millis(SCENARIO_TIMEOUT_MS),
    );
    println!(
        "=== {name} against {}: {} in {:.1} s ===\n{}",
        target.label(),
        out.describe_status(),
        out.elapsed.as_secs_f64(),
        out.stdout
    );
    out
}

/// The line the scenario printed for its failure, if any.
fn failure_line(out: &ChildRun) -> Option<&str> {
    out.stdout.lines().find(|l| l.starts_with("FAILED: "))
}

/// Runs `name` and asserts that every check passed.
fn assert_scenario_passes(name: &str) {
    assert_scenario_passes_with(name, &[]);
}

/// Runs `name` with `extra` arguments and asserts that every check passed.
fn assert_scenario_passes_with(name: &str, extra: &[String]) {
    let mut target = Target::start(BrokerOpts::default());
    let out = run_scenario(&target, name, extra);
    if let Target::Fjord(b) = &mut target {
        b.assert_alive();
    }
    assert!(
        out.success(),
        "scenario {name} against {}: {}\n{}",
        target.label(),
        out.describe_status(),
        failure_line(&out).unwrap_or("(no FAILED line; see the output above)")
    );
}

#[test]
fn producer_codecs() {
    assert_scenario_passes("producer-codecs");
}

#[test]
fn txn_layout() {
    assert_scenario_passes("txn-layout");
}

#[test]
fn txn_fencing() {
    assert_scenario_passes("txn-fencing");
}

#[test]
fn txn_consume_transform_produce() {
    assert_scenario_passes("txn-consume-transform-produce");
}

#[test]
fn group_classic() {
    assert_scenario_passes("group-classic");
}

#[test]
fn group_consumer() {
    assert_scenario_passes("group-consumer");
}

/// The online upgrade of a classic group (cooperative-sticky members) to
/// the consumer protocol, members replaced one by one while records flow.
#[test]
fn group_upgrade() {
    assert_scenario_passes("group-upgrade");
}

#[test]
fn admin() {
    assert_scenario_passes("admin");
}

/// Kafka Streams with `exactly_once_v2` and every other config at its
/// default: Streams creates its changelog topic with `cleanup.policy=compact`
/// and its repartition topic itself. The Java side checks the exact word
/// counts after a SIGKILL and restart of the app, and those two topics.
#[test]
fn streams_eos() {
    assert_scenario_passes("streams-eos");
}

/// Kafka Connect in distributed mode (stock `ConnectDistributed` 4.3.1 from
/// `interop/connect`, in a child JVM of the scenario, so in its process
/// group) with the FileStream connectors: Connect creates its compacted
/// config, offset and status topics itself, a FileStreamSource and a
/// FileStreamSink created over REST carry lines from one temp file to
/// another, and across a SIGTERM and restart of the worker the connectors
/// come back RUNNING from the config topic, the source resumes from the
/// position it stored in the offsets topic, and every line reaches the sink
/// file exactly once. The Java side (`ConnectFileStream.java`) says why
/// exactly once holds for a graceful restart.
#[test]
fn connect_distributed() {
    let lib = connect_build();
    assert_scenario_passes_with(
        "connect-distributed",
        &["--connect-lib".to_string(), lib.display().to_string()],
    );
}

/// The Java client on a SASL_PLAINTEXT listener with `mechanism`
/// (`SaslScenario.java`): a user created with AlterUserScramCredentials and
/// described, then produce, a consumer group, a re-authentication
/// (`--connections-max-reauth-ms` shorter than the scenario's wait), a
/// committed and an aborted transaction, and a wrong password and an
/// unknown user refused. fjord only: the stock peer of this harness has no
/// SASL listener (docs/security.md shows the SASL_PLAINTEXT peer the
/// behaviour was compared with; `scripts/kafka-peer-ssl.sh` runs the same
/// scenario over SASL_SSL against stock Kafka).
fn assert_sasl_scenario_passes(mechanism: &str) {
    if std::env::var(common::target::TARGET_ENV).is_ok_and(|v| !v.trim().is_empty()) {
        println!("skipped: the SASL scenario runs against fjord only");
        return;
    }
    let sasl_port = common::free_port_base(2);
    let mut broker = common::Broker::start(
        BrokerOpts::default()
            .arg("--listener")
            .arg(format!("SASL_PLAINTEXT://127.0.0.1:{sasl_port}"))
            .arg("--sasl-enabled-mechanisms")
            .arg("PLAIN,SCRAM-SHA-256,SCRAM-SHA-512")
            .arg("--connections-max-reauth-ms")
            .arg("3000"),
    );
    let target = Target::External(broker.bootstrap());
    let extra = [
        "--sasl-bootstrap".to_string(),
        format!("127.0.0.1:{sasl_port}"),
        "--mechanism".to_string(),
        mechanism.to_string(),
        "--reauth-wait-ms".to_string(),
        "4500".to_string(),
    ];
    let out = run_scenario(&target, "sasl", &extra);
    broker.assert_alive();
    assert!(
        out.success(),
        "scenario sasl ({mechanism}): {}\n{}\n{}",
        out.describe_status(),
        failure_line(&out).unwrap_or("(no FAILED line; see the output above)"),
        broker.stderr_tail()
    );
    // The broker's audit log, without the terminal colours of its text format.
    let log: String = broker
        .stderr_since(0)
        .split('\u{1b}')
        .map(|part| match part.strip_prefix('[') {
            Some(rest) => rest.split_once('m').map_or(rest, |(_, text)| text),
            None => part,
        })
        .collect();
    assert!(
        log.contains("authenticated") && log.contains("reauthentication=true"),
        "the broker logged a re-authentication:\n{}",
        broker.stderr_tail()
    );
}

#[test]
fn sasl_plain() {
    assert_sasl_scenario_passes("PLAIN");
}

#[test]
fn sasl_scram_sha_256() {
    assert_sasl_scenario_passes("SCRAM-SHA-256");
}

#[test]
fn sasl_scram_sha_512() {
    assert_sasl_scenario_passes("SCRAM-SHA-512");
}

/// The Java client under `--authorizer standard` with Kafka's documented
/// minimal ACLs for ANONYMOUS (set up while it is a super user, then the
/// broker restarts without that): an idempotent producer, a transactional
/// producer and a consumer group work; outside their ACLs each gets Kafka's
/// authorization exception; the topic listing hides the other topic; the
/// ACL APIs are refused. fjord only: the set-up needs fjord's restart.
#[test]
fn acls_minimal_for_producer_transactions_and_group() {
    use common::raw::RawClient;
    use kafka_protocol::messages::create_acls_request::AclCreation;
    use kafka_protocol::messages::CreateAclsRequest;
    use kafka_protocol::protocol::StrBytes;
    if std::env::var_os("FJORD_TEST_BROKER").is_some() {
        eprintln!("skipped: the ACL set-up restarts a fjord broker");
        return;
    }
    const SUPER: &str = "--super-users=User:ANONYMOUS";
    let mut broker = common::Broker::start(
        BrokerOpts::default()
            .cores(1)
            .arg("--authorizer=standard")
            .arg(SUPER),
    );
    for t in ["acl-orders", "acl-hidden"] {
        common::client::create_topic(&broker.bootstrap(), t, 1, &[]);
    }
    let s = |v: &str| StrBytes::from_string(v.to_string());
    // (resource type, name, pattern type, operation): TOPIC 2, GROUP 3,
    // TRANSACTIONAL_ID 5; LITERAL 3, PREFIXED 4; READ 3, WRITE 4.
    let acls = [
        (2, "acl-orders", 3, 4),
        (2, "acl-orders", 3, 3),
        (3, "acl-readers", 3, 3),
        (5, "acl-tx-", 4, 4),
    ]
    .into_iter()
    .map(|(rt, name, pt, op)| {
        AclCreation::default()
            .with_resource_type(rt)
            .with_resource_name(s(name))
            .with_resource_pattern_type(pt)
            .with_principal(s("User:ANONYMOUS"))
            .with_host(s("*"))
            .with_operation(op)
            .with_permission_type(3)
    })
    .collect();
    let created = RawClient::connect(broker.port)
        .request(3, &CreateAclsRequest::default().with_creations(acls));
    assert!(created.results.iter().all(|r| r.error_code == 0));
    broker.opts_mut().extra_args.retain(|a| a != SUPER);
    broker.restart();
    let target = Target::Fjord(broker);
    let extra: Vec<String> = [
        "--topic",
        "acl-orders",
        "--hidden-topic",
        "acl-hidden",
        "--group",
        "acl-readers",
        "--txn-prefix",
        "acl-tx-",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let out = run_scenario(&target, "acls", &extra);
    assert!(
        out.success(),
        "scenario acls: {}\n{}",
        out.describe_status(),
        failure_line(&out).unwrap_or("(no FAILED line; see the output above)")
    );
}
