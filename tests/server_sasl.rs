//! SASL on a SASL_PLAINTEXT listener, against a real broker: librdkafka
//! with PLAIN, and raw Kafka-protocol clients for what must fail and how
//! (the error code, Kafka's message, the closed connection), each followed
//! by a check that another connection of the same shard still works.
//! librdkafka with both SCRAM mechanisms (it has OpenSSL, which its SCRAM
//! needs): produce, a transaction, a consumer group, bad logins beside an
//! open session, and a session kept alive over several re-authentications
//! (KIP-368, which librdkafka does by itself). SCRAM with the Java client is
//! in `interop_java.rs`, with Kafka's CLI tools in `interop_cli.rs`.
//!
//! What Kafka answers (checked once against stock Kafka 4.4 with a
//! SASL_PLAINTEXT listener, `scripts/kafka-peer.sh` with the listener
//! settings in docs/security.md): a request other than ApiVersions or
//! SaslHandshake before authentication closes the connection without an
//! answer; a wrong PLAIN password or unknown PLAIN user is
//! SASL_AUTHENTICATION_FAILED (58) "Authentication failed: Invalid username
//! or password", then the connection is closed; an unknown mechanism is
//! UNSUPPORTED_SASL_MECHANISM (33) with the enabled list, then closed; a
//! SaslHandshake on a PLAINTEXT listener is ILLEGAL_SASL_STATE (34).

mod common;

use common::raw::{RawClient, ReadOutcome};
use common::{Broker, BrokerOpts};
use fjord::auth::scram::ScramMechanism;
use kafka_protocol::messages::alter_user_scram_credentials_request::ScramCredentialUpsertion;
use kafka_protocol::messages::describe_user_scram_credentials_request::UserName;
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, ApiVersionsRequest, DescribeUserScramCredentialsRequest,
    MetadataRequest, SaslAuthenticateRequest, SaslHandshakeRequest,
};
use kafka_protocol::protocol::StrBytes;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::Producer;
use rdkafka::Message;
use std::collections::HashMap;
use std::time::Duration;

/// How long a closed connection may take to be seen closed.
const CLOSE_WAIT: Duration = Duration::from_secs(10);
/// The session lifetime of the brokers here (`--connections-max-reauth-ms`).
const REAUTH_MS: u64 = 2_000;

/// A broker with its usual PLAINTEXT listener and a SASL_PLAINTEXT one
/// (PLAIN and both SCRAM mechanisms), and the SASL listener's port.
fn sasl_broker(cores: usize) -> (Broker, u16) {
    let sasl_port = common::free_port_base(cores);
    let broker = Broker::start(
        BrokerOpts::default()
            .cores(cores)
            .arg("--listener")
            .arg(format!("SASL_PLAINTEXT://127.0.0.1:{sasl_port}"))
            .arg("--sasl-enabled-mechanisms")
            .arg("PLAIN,SCRAM-SHA-256,SCRAM-SHA-512")
            .arg("--connections-max-reauth-ms")
            .arg(REAUTH_MS.to_string()),
    );
    (broker, sasl_port)
}

/// Creates `user` with a SCRAM-SHA-256 credential over the PLAINTEXT
/// listener, salting the password as the Java admin client does.
fn add_user(plaintext_port: u16, user: &str, password: &str) {
    add_scram_user(plaintext_port, user, password, ScramMechanism::Sha256);
}

/// Creates `user` with a credential for mechanism `m` over the PLAINTEXT
/// listener.
fn add_scram_user(plaintext_port: u16, user: &str, password: &str, m: ScramMechanism) {
    let salt = b"a-salt-for-the-test".to_vec();
    let salted = m.salted_password(password.as_bytes(), &salt, 4096);
    let mut raw = RawClient::connect(plaintext_port);
    let resp = raw.request(
        0,
        &AlterUserScramCredentialsRequest::default().with_upsertions(vec![
            ScramCredentialUpsertion::default()
                .with_name(StrBytes::from_string(user.into()))
                .with_mechanism(m.type_id())
                .with_iterations(4096)
                .with_salt(salt.into())
                .with_salted_password(salted.into()),
        ]),
    );
    assert_eq!(resp.results.len(), 1);
    assert_eq!(resp.results[0].error_code, 0, "{:?}", resp.results[0]);
}

fn handshake(raw: &mut RawClient, mechanism: &str) -> (i16, Vec<String>) {
    let r = raw.request(
        1,
        &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_string(mechanism.into())),
    );
    (
        r.error_code,
        r.mechanisms.iter().map(|m| m.to_string()).collect(),
    )
}

fn plain_token(user: &str, password: &str) -> Vec<u8> {
    format!("\0{user}\0{password}").into_bytes()
}

/// Handshake and PLAIN authentication; returns the SaslAuthenticate answer
/// (error code, message, session lifetime).
fn plain_login(raw: &mut RawClient, user: &str, password: &str) -> (i16, Option<String>, i64) {
    assert_eq!(handshake(raw, "PLAIN").0, 0);
    let r = raw.request(
        2,
        &SaslAuthenticateRequest::default().with_auth_bytes(plain_token(user, password).into()),
    );
    (
        r.error_code,
        r.error_message.map(|m| m.to_string()),
        r.session_lifetime_ms,
    )
}

/// A Metadata round trip works on `raw`, and names the brokers on `port`'s listener.
fn metadata_works(raw: &mut RawClient, port: u16) {
    let r = raw.request(12, &MetadataRequest::default().with_topics(Some(vec![])));
    assert!(!r.brokers.is_empty());
    for b in &r.brokers {
        assert!(
            (port as i32..port as i32 + r.brokers.len() as i32).contains(&b.port),
            "broker {b:?} is advertised on the listener the request came in on ({port})"
        );
    }
}

/// A fresh authenticated connection to `port` serves Metadata.
fn another_connection_works(port: u16) {
    let mut raw = RawClient::connect(port);
    assert_eq!(plain_login(&mut raw, "alice", "alice-secret").0, 0);
    metadata_works(&mut raw, port);
}

#[test]
fn librdkafka_plain_produces_and_consumes_on_the_sasl_listener() {
    let (broker, sasl_port) = sasl_broker(2);
    add_user(broker.port, "alice", "alice-secret");
    let bootstrap = format!("127.0.0.1:{sasl_port}");
    let sasl = [
        ("security.protocol", "SASL_PLAINTEXT"),
        ("sasl.mechanisms", "PLAIN"),
        ("sasl.username", "alice"),
        ("sasl.password", "alice-secret"),
    ];
    let mut extra = vec![("acks", "all"), ("linger.ms", "2")];
    extra.extend_from_slice(&sasl);
    let producer = common::client::producer(&bootstrap, &extra);
    for id in 0..50 {
        common::client::send(
            &producer,
            "sasl-topic",
            &common::client::TestMessage {
                id,
                key: format!("k{id}").into_bytes(),
                value: id.to_string().into_bytes(),
                headers: vec![],
            },
        );
    }
    for d in common::client::await_deliveries(&producer, 50, Duration::from_secs(60)) {
        assert!(d.error.is_none(), "delivery failed: {:?}", d.error);
    }
    let _ = producer.flush(Duration::from_secs(5));
    let consumer = common::client::consumer(&bootstrap, &sasl);
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset("sasl-topic", 0, rdkafka::Offset::Beginning)
        .unwrap();
    rdkafka::consumer::Consumer::assign(&consumer, &tpl).unwrap();
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while got.len() < 50 {
        assert!(
            std::time::Instant::now() < deadline,
            "consumed {} of 50",
            got.len()
        );
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m.expect("consumer error");
            got.push(common::client::numbered_id(&m));
        }
    }
    assert_eq!(got, (0..50).collect::<Vec<_>>());

    // A wrong password: librdkafka reports an authentication error.
    let bad = [
        ("security.protocol", "SASL_PLAINTEXT"),
        ("sasl.mechanisms", "PLAIN"),
        ("sasl.username", "alice"),
        ("sasl.password", "wrong"),
    ];
    let bad_consumer = common::client::consumer(&bootstrap, &bad);
    let md =
        rdkafka::consumer::Consumer::fetch_metadata(&bad_consumer, None, Duration::from_secs(10));
    assert!(md.is_err(), "a wrong password must not fetch metadata");
    let stderr = broker.stderr_since(0);
    assert!(
        stderr.contains("authentication failed") && !stderr.contains("alice-secret"),
        "the failure is audited, without the password:\n{}",
        broker.stderr_tail()
    );
}

#[test]
fn bad_logins_and_requests_before_authentication_close_only_their_connection() {
    let (broker, sasl_port) = sasl_broker(1);
    add_user(broker.port, "alice", "alice-secret");

    // A request before authentication: closed, no answer (Kafka:
    // "Unexpected Kafka request of type METADATA during SASL handshake").
    let mut raw = RawClient::connect(sasl_port);
    raw.send(12, &MetadataRequest::default().with_topics(Some(vec![])));
    raw.assert_closed(CLOSE_WAIT, "Metadata before authentication");
    another_connection_works(sasl_port);

    // A client that knows nothing of SASL: ApiVersions is answered (and
    // lists the SASL APIs), its Metadata then closes the connection.
    let mut raw = RawClient::connect(sasl_port);
    let versions = raw.request(3, &ApiVersionsRequest::default());
    assert_eq!(versions.error_code, 0);
    assert!(versions
        .api_keys
        .iter()
        .any(|k| k.api_key == 17 && k.max_version == 1));
    assert!(versions
        .api_keys
        .iter()
        .any(|k| k.api_key == 36 && k.max_version == 2));
    raw.send(12, &MetadataRequest::default().with_topics(Some(vec![])));
    raw.assert_closed(CLOSE_WAIT, "Metadata after ApiVersions, unauthenticated");
    another_connection_works(sasl_port);

    // A wrong password and an unknown user: 58 with Kafka's message, closed.
    for (user, password) in [("alice", "not-her-password"), ("mallory", "alice-secret")] {
        let mut raw = RawClient::connect(sasl_port);
        let (code, message, _) = plain_login(&mut raw, user, password);
        assert_eq!(code, 58, "SASL_AUTHENTICATION_FAILED for {user}");
        assert_eq!(
            message.as_deref(),
            Some("Authentication failed: Invalid username or password")
        );
        raw.assert_closed(CLOSE_WAIT, "after a failed authentication");
        another_connection_works(sasl_port);
    }

    // An unknown mechanism: 33 with the enabled ones, closed.
    let mut raw = RawClient::connect(sasl_port);
    let (code, mechanisms) = handshake(&mut raw, "GSSAPI");
    assert_eq!(code, 33);
    assert_eq!(mechanisms, ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]);
    raw.assert_closed(CLOSE_WAIT, "after an unsupported mechanism");

    // Pipelined: a failing authentication and a Metadata behind it in one
    // write. The authentication is decided first; the Metadata is never
    // served.
    let mut raw = RawClient::connect(sasl_port);
    let (hs, _) = raw.encode_frame(
        1,
        &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("PLAIN")),
    );
    let (auth, auth_id) = raw.encode_frame(
        2,
        &SaslAuthenticateRequest::default().with_auth_bytes(plain_token("alice", "nope").into()),
    );
    let (md, _) = raw.encode_frame(12, &MetadataRequest::default().with_topics(Some(vec![])));
    raw.send_bytes(&[hs, auth, md].concat());
    let _ = raw.receive::<SaslHandshakeRequest>(1, 1);
    let r = raw.receive::<SaslAuthenticateRequest>(2, auth_id);
    assert_eq!(r.error_code, 58);
    raw.assert_closed(CLOSE_WAIT, "the pipelined Metadata after a failed login");

    // Pipelined the other way: a good login and a Metadata behind it; the
    // Metadata is served, as the authenticated user.
    let mut raw = RawClient::connect(sasl_port);
    let (hs, _) = raw.encode_frame(
        1,
        &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("PLAIN")),
    );
    let (auth, auth_id) = raw.encode_frame(
        2,
        &SaslAuthenticateRequest::default()
            .with_auth_bytes(plain_token("alice", "alice-secret").into()),
    );
    let (md, md_id) = raw.encode_frame(12, &MetadataRequest::default().with_topics(Some(vec![])));
    raw.send_bytes(&[hs, auth, md].concat());
    let _ = raw.receive::<SaslHandshakeRequest>(1, 1);
    assert_eq!(
        raw.receive::<SaslAuthenticateRequest>(2, auth_id)
            .error_code,
        0
    );
    assert!(!raw.receive::<MetadataRequest>(12, md_id).brokers.is_empty());

    // An oversized token before authentication (over Kafka's
    // sasl.server.max.receive.size, 512 KiB) closes the connection.
    let mut raw = RawClient::connect(sasl_port);
    assert_eq!(handshake(&mut raw, "PLAIN").0, 0);
    // The broker may close before the whole frame is written.
    let (frame, _) = raw.encode_frame(
        2,
        &SaslAuthenticateRequest::default().with_auth_bytes(vec![b'x'; 600 * 1024].into()),
    );
    raw.send_bytes_within(&frame, CLOSE_WAIT);
    raw.assert_closed(CLOSE_WAIT, "an oversized SASL token");
    another_connection_works(sasl_port);

    // On the PLAINTEXT listener the SASL requests get KafkaApis' answer.
    let mut raw = RawClient::connect(broker.port);
    assert_eq!(handshake(&mut raw, "PLAIN").0, 34, "ILLEGAL_SASL_STATE");
    metadata_works(&mut raw, broker.port);
}

/// SaslHandshake v0 (pre-KIP-152 clients): the tokens that follow are bare
/// frames, answered with bare frames; a bad one closes the connection.
#[test]
fn handshake_v0_takes_bare_tokens() {
    let (broker, sasl_port) = sasl_broker(1);
    add_user(broker.port, "alice", "alice-secret");
    let mut raw = RawClient::connect(sasl_port);
    let r = raw.request(
        0,
        &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("PLAIN")),
    );
    assert_eq!(r.error_code, 0);
    raw.send_frame(&plain_token("alice", "alice-secret"));
    match raw.read_frame(CLOSE_WAIT) {
        ReadOutcome::Frame(f) => assert!(f.is_empty(), "PLAIN's empty server token"),
        other => panic!("expected a bare token, got {other:?}"),
    }
    metadata_works(&mut raw, sasl_port);

    let mut raw = RawClient::connect(sasl_port);
    let r = raw.request(
        0,
        &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("PLAIN")),
    );
    assert_eq!(r.error_code, 0);
    raw.send_frame(&plain_token("alice", "wrong"));
    raw.assert_closed(CLOSE_WAIT, "a bad bare token");
    another_connection_works(sasl_port);
}

#[test]
fn an_expired_session_closes_unless_it_re_authenticates() {
    let (broker, sasl_port) = sasl_broker(1);
    add_user(broker.port, "alice", "alice-secret");

    let mut expiring = RawClient::connect(sasl_port);
    let (code, _, lifetime_ms) = plain_login(&mut expiring, "alice", "alice-secret");
    assert_eq!((code, lifetime_ms), (0, REAUTH_MS as i64));
    metadata_works(&mut expiring, sasl_port);
    let mut renewing = RawClient::connect(sasl_port);
    assert_eq!(plain_login(&mut renewing, "alice", "alice-secret").0, 0);

    // Past the session lifetime (a wait for the broker's clock, not a
    // timed assertion).
    std::thread::sleep(Duration::from_millis(REAUTH_MS + 500));
    expiring.send(12, &MetadataRequest::default().with_topics(Some(vec![])));
    expiring.assert_closed(CLOSE_WAIT, "a request after the session expired");

    // Re-authentication (KIP-368) renews it; another principal may not.
    let (code, _, lifetime_ms) = plain_login(&mut renewing, "alice", "alice-secret");
    assert_eq!((code, lifetime_ms), (0, REAUTH_MS as i64));
    metadata_works(&mut renewing, sasl_port);
    another_connection_works(sasl_port);
    add_user(broker.port, "bob", "bob-secret");
    std::thread::sleep(Duration::from_millis(1_100));
    let (code, message, _) = plain_login(&mut renewing, "bob", "bob-secret");
    assert_eq!(code, 58);
    assert_eq!(
        message.as_deref(),
        Some("Cannot change principals during re-authentication from User.alice: User.bob")
    );
    renewing.assert_closed(CLOSE_WAIT, "a re-authentication as someone else");
    another_connection_works(sasl_port);
}

#[test]
fn scram_add_creates_a_user_offline_and_refuses_a_running_broker() {
    let (mut broker, sasl_port) = sasl_broker(1);
    let data_dir = broker.data_dir();
    let scram_add = |password: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_fjord"))
            .args(["scram", "add", "--data-dir"])
            .arg(&data_dir)
            .args(["--user", "admin", "--mechanism", "SCRAM-SHA-512"])
            .args(["--password", password, "--iterations", "8192"])
            .output()
            .expect("run fjord scram add")
    };
    let out = scram_add("admin-secret");
    assert!(!out.status.success(), "refused while the broker runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("in use"), "{stderr}");

    broker.stop();
    let out = scram_add("admin-secret");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = std::fs::read(data_dir.join("__cluster_metadata/raft.log")).unwrap();
    let log = String::from_utf8_lossy(&log);
    assert!(
        log.contains("\"name\":\"admin\""),
        "the record is in the Raft log"
    );
    assert!(!log.contains("admin-secret"), "only salted keys are stored");
    broker.restart();

    let mut raw = RawClient::connect(sasl_port);
    assert_eq!(plain_login(&mut raw, "admin", "admin-secret").0, 0);
    let described = raw.request(
        0,
        &DescribeUserScramCredentialsRequest::default().with_users(Some(vec![
            UserName::default().with_name(StrBytes::from_static_str("admin")),
            UserName::default().with_name(StrBytes::from_static_str("nobody")),
        ])),
    );
    let admin = described
        .results
        .iter()
        .find(|r| r.user.as_str() == "admin")
        .unwrap();
    assert_eq!(admin.error_code, 0);
    assert_eq!(admin.credential_infos.len(), 1);
    assert_eq!(admin.credential_infos[0].mechanism, 2);
    assert_eq!(admin.credential_infos[0].iterations, 8192);
    let nobody = described
        .results
        .iter()
        .find(|r| r.user.as_str() == "nobody")
        .unwrap();
    assert_eq!(nobody.error_code, 91, "RESOURCE_NOT_FOUND");
    assert_eq!(
        nobody.error_message.as_deref(),
        Some("Attempt to describe a user credential that does not exist: nobody")
    );
    match raw.read_frame(Duration::from_millis(200)) {
        ReadOutcome::TimedOut => {}
        other => panic!("nothing more was asked: {other:?}"),
    }
}

/// Runs `fjord serve` with `args` (no `--listen` from the harness) until it
/// is ready, and returns what it printed on stdout and stderr by then.
fn serve_until_ready(args: &[&str]) -> (String, String) {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let stderr_path = dir.path().join("stderr.log");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_fjord"))
        .arg("serve")
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["--cores", "1", "--no-pin", "--metrics-listen", "none"])
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .expect("spawn fjord serve");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut out = String::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(line) => {
                out.push_str(&line);
                out.push('\n');
                if line == "fjord: ready" {
                    break;
                }
            }
            Err(e) => {
                let _ = child.kill();
                panic!("fjord serve did not get ready ({e}): {out}");
            }
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let err = std::fs::read_to_string(&stderr_path).unwrap();
    (out, err)
}

/// Issue 28's safe default: with no listener and no address given, the
/// broker binds loopback and says so; a PLAINTEXT listener on another
/// address is warned about.
#[test]
fn without_a_listener_the_broker_binds_loopback_and_says_so() {
    let port = common::free_port_base(1).to_string();
    let (out, err) = serve_until_ready(&["--port", &port]);
    assert!(
        out.contains(&format!("listening on 127.0.0.1:{port} ")),
        "{out}"
    );
    assert!(err.contains("listening on loopback only"), "{err}");
    assert!(
        !err.contains("PLAINTEXT listener on a non-loopback address"),
        "{err}"
    );

    let port = common::free_port_base(1).to_string();
    let (out, err) = serve_until_ready(&["--port", &port, "--listen", "0.0.0.0"]);
    assert!(
        out.contains(&format!("listening on 0.0.0.0:{port} ")),
        "{out}"
    );
    assert!(
        err.contains("PLAINTEXT listener on a non-loopback address"),
        "{err}"
    );
    assert!(!err.contains("listening on loopback only"), "{err}");

    // SSL without a certificate is refused at start-up, with a clear
    // message (tests/server_tls.rs has the rest).
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fjord"))
        .arg("serve")
        .arg("--data-dir")
        .arg(dir.path())
        .args([
            "--listener",
            "SSL://127.0.0.1:9093",
            "--metrics-listen",
            "none",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("SSL://127.0.0.1:9093 needs a certificate and its key: --tls-cert"),
        "{err}"
    );
}

/// librdkafka settings for `user` with SASL `mechanism` on a SASL_PLAINTEXT
/// listener.
fn rdkafka_sasl<'a>(
    mechanism: &'a str,
    user: &'a str,
    password: &'a str,
) -> [(&'a str, &'a str); 4] {
    [
        ("security.protocol", "SASL_PLAINTEXT"),
        ("sasl.mechanisms", mechanism),
        ("sasl.username", user),
        ("sasl.password", password),
    ]
}

/// Produces `values` to `topic` with `producer` and asserts every delivery.
fn produce_all(producer: &common::client::TestProducer, topic: &str, values: &[String]) {
    let before = producer.context().deliveries.lock().unwrap().len();
    for (i, v) in values.iter().enumerate() {
        common::client::send(
            producer,
            topic,
            &common::client::TestMessage {
                id: before + i,
                key: format!("k{i}").into_bytes(),
                value: v.clone().into_bytes(),
                headers: vec![],
            },
        );
    }
    let all =
        common::client::await_deliveries(producer, before + values.len(), Duration::from_secs(60));
    for d in &all[before..] {
        assert!(d.error.is_none(), "delivery failed: {:?}", d.error);
    }
}

/// Polls `consumer` until it has read `n` records, and returns their values.
fn poll_values(consumer: &BaseConsumer, n: usize) -> Vec<String> {
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while got.len() < n {
        assert!(
            std::time::Instant::now() < deadline,
            "consumed {} of {n}: {got:?}",
            got.len()
        );
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m.expect("consumer error");
            got.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned());
        }
    }
    got
}

/// A subscribing, read_committed consumer of `group` that commits by hand.
fn group_consumer(bootstrap: &str, group: &str, sasl: &[(&str, &str)]) -> BaseConsumer {
    let mut extra = vec![
        ("group.id", group),
        ("isolation.level", "read_committed"),
        ("auto.offset.reset", "earliest"),
        ("session.timeout.ms", "10000"),
        ("enable.auto.offset.store", "true"),
    ];
    extra.extend_from_slice(sasl);
    // common::client::consumer sets its own group.id and turns the offset
    // store off first; the later settings win.
    common::client::consumer(bootstrap, &extra)
}

/// librdkafka with SASL `mechanism` on the SASL listener, as a user with a
/// credential for `m` (PLAIN checks the password against it): an idempotent producer,
/// a committed and an aborted transaction, a consumer group that reads
/// exactly the committed records and commits its offsets; then a wrong
/// password and an unknown user are refused while the group's connections
/// stay open and go on working.
fn librdkafka_sasl_workload(mechanism: &str, m: ScramMechanism) {
    let (broker, sasl_port) = sasl_broker(2);
    let user = "carol";
    let password = "carol-secret";
    add_scram_user(broker.port, user, password, m);
    let bootstrap = format!("127.0.0.1:{sasl_port}");
    let topic = format!("sasl-{}", mechanism.to_lowercase());
    common::client::create_topic(&broker.bootstrap(), &topic, 2, &[]);
    let sasl = rdkafka_sasl(mechanism, user, password);

    let mut extra = vec![("acks", "all"), ("enable.idempotence", "true")];
    extra.extend_from_slice(&sasl);
    let producer = common::client::producer(&bootstrap, &extra);
    let plain: Vec<String> = (0..40).map(|i| format!("plain-{i}")).collect();
    produce_all(&producer, &topic, &plain);

    let txn_id = format!("{topic}-txn");
    let mut extra = vec![("transactional.id", txn_id.as_str())];
    extra.extend_from_slice(&sasl);
    let txn = common::client::producer(&bootstrap, &extra);
    let t = Duration::from_secs(30);
    txn.init_transactions(t).expect("init_transactions");
    txn.begin_transaction().unwrap();
    let committed: Vec<String> = (0..10).map(|i| format!("committed-{i}")).collect();
    produce_all(&txn, &topic, &committed);
    txn.commit_transaction(t).expect("commit_transaction");
    txn.begin_transaction().unwrap();
    produce_all(
        &txn,
        &topic,
        &(0..5).map(|i| format!("aborted-{i}")).collect::<Vec<_>>(),
    );
    txn.abort_transaction(t).expect("abort_transaction");

    let group = format!("{topic}-group");
    let consumer = group_consumer(&bootstrap, &group, &sasl);
    consumer.subscribe(&[&topic]).unwrap();
    let mut got = poll_values(&consumer, 50);
    got.sort();
    let mut want: Vec<String> = plain.iter().chain(&committed).cloned().collect();
    want.sort();
    assert_eq!(got, want, "read_committed: the plain and committed records");
    consumer
        .commit_consumer_state(CommitMode::Sync)
        .expect("commit");
    let offsets = consumer.committed(t).expect("committed offsets");
    let sum: i64 = offsets
        .elements()
        .iter()
        .map(|e| e.offset().to_raw().unwrap_or(0))
        .sum();
    // At least past the 50 records read (the aborted ones and the markers
    // count too once the consumer has skipped them).
    assert!(
        offsets.count() == 2 && sum >= 50,
        "committed offsets {offsets:?}"
    );

    // Bad logins, each on a connection of its own, while the group's are open.
    let failed_before = broker
        .stderr_since(0)
        .matches("authentication failed")
        .count();
    for (u, p) in [(user, "not-the-password"), ("nobody", password)] {
        let bad = common::client::consumer(&bootstrap, &rdkafka_sasl(mechanism, u, p));
        let md = bad.fetch_metadata(None, Duration::from_secs(10));
        assert!(md.is_err(), "{u} with a bad login must not fetch metadata");
    }
    let log = broker.stderr_since(0);
    assert!(
        log.matches("authentication failed").count() >= failed_before + 2
            && !log.contains("not-the-password")
            && !log.contains(password),
        "both failures are audited, without the password:\n{}",
        broker.stderr_tail()
    );
    let more: Vec<String> = (0..10).map(|i| format!("after-{i}")).collect();
    produce_all(&producer, &topic, &more);
    let mut got = poll_values(&consumer, 10);
    got.sort();
    let mut want = more.clone();
    want.sort();
    assert_eq!(
        got, want,
        "the open group session goes on after the bad logins"
    );
}

#[test]
fn librdkafka_scram_sha_256_produces_transacts_and_consumes_in_a_group() {
    librdkafka_sasl_workload("SCRAM-SHA-256", ScramMechanism::Sha256);
}

#[test]
fn librdkafka_scram_sha_512_produces_transacts_and_consumes_in_a_group() {
    librdkafka_sasl_workload("SCRAM-SHA-512", ScramMechanism::Sha512);
}

/// PLAIN, checked against the salted SCRAM-SHA-256 credential.
#[test]
fn librdkafka_plain_transacts_and_consumes_in_a_group() {
    librdkafka_sasl_workload("PLAIN", ScramMechanism::Sha256);
}

/// The broker's log without the terminal colours of its text format.
fn plain_log(broker: &common::Broker) -> String {
    broker
        .stderr_since(0)
        .split('\u{1b}')
        .map(|part| match part.strip_prefix('[') {
            Some(rest) => rest.split_once('m').map_or(rest, |(_, text)| text),
            None => part,
        })
        .collect()
}

/// librdkafka re-authenticates on its own (KIP-368) before its session
/// expires: a producer and a consumer keep working over several session
/// lifetimes, and the broker logs several re-authentications of one
/// connection (the same client address), so they were not reconnections.
#[test]
fn librdkafka_scram_re_authenticates_across_several_session_lifetimes() {
    let (broker, sasl_port) = sasl_broker(1);
    add_scram_user(broker.port, "dave", "dave-secret", ScramMechanism::Sha512);
    let bootstrap = format!("127.0.0.1:{sasl_port}");
    common::client::create_topic(&broker.bootstrap(), "reauth", 1, &[]);
    let sasl = rdkafka_sasl("SCRAM-SHA-512", "dave", "dave-secret");
    let mut extra = vec![("acks", "all"), ("linger.ms", "0")];
    extra.extend_from_slice(&sasl);
    let producer = common::client::producer(&bootstrap, &extra);
    let consumer = common::client::consumer(&bootstrap, &sasl);
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset("reauth", 0, rdkafka::Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();

    // Four session lifetimes, one record every quarter of a lifetime, each
    // read back before the next (waits for the broker's clock, not timed
    // assertions).
    let rounds = 16;
    for i in 0..rounds {
        produce_all(&producer, "reauth", &[format!("r{i}")]);
        assert_eq!(poll_values(&consumer, 1), [format!("r{i}")]);
        std::thread::sleep(Duration::from_millis(REAUTH_MS / 4));
    }

    let log = plain_log(&broker);
    let mut per_peer: HashMap<&str, usize> = HashMap::new();
    for line in log
        .lines()
        .filter(|l| l.contains("authenticated") && l.contains("reauthentication=true"))
    {
        if let Some(peer) = line
            .split("peer=Some(")
            .nth(1)
            .and_then(|r| r.split(')').next())
        {
            *per_peer.entry(peer).or_default() += 1;
        }
    }
    assert!(
        per_peer.values().any(|&n| n >= 3),
        "one connection re-authenticated at least 3 times: {per_peer:?}\n{}",
        broker.stderr_tail()
    );
    assert!(
        !log.contains("connection closed by SASL"),
        "no connection was closed for an expired session:\n{}",
        broker.stderr_tail()
    );
}
