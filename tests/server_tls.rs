//! TLS listeners (SSL, SASL_SSL) against a real broker, with librdkafka
//! (OpenSSL) as the client and a throw-away PKI (`common::tls`):
//! - on SSL, and on SASL_SSL with PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512:
//!   an admin creates a topic, a producer produces, a transactional
//!   producer commits, a consumer group reads everything and commits;
//! - SASL_SSL with a wrong password or an unknown user fails, and another
//!   connection still works;
//! - a plaintext Kafka client (or garbage) on the TLS port is disconnected
//!   while a TLS connection opened before keeps working;
//! - `--tls-client-auth required`: a client without a certificate is
//!   refused; one with a certificate is `User:` + its subject, which ACLs
//!   grant one topic and not another;
//! - SIGHUP reloads the certificate and key (a client trusting only the
//!   new CA connects; a bad file is refused and the old config kept).

mod common;

use common::client::{self, admin_opts, block_on};
use common::groups::member_config;
use common::raw::RawClient;
use common::tls::TestPki;
use common::{Broker, BrokerOpts};
use fjord::auth::scram::ScramMechanism;
use kafka_protocol::messages::alter_user_scram_credentials_request::ScramCredentialUpsertion;
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::{AlterUserScramCredentialsRequest, CreateAclsRequest};
use kafka_protocol::protocol::StrBytes;
use rdkafka::admin::{AdminClient, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::Producer;
use rdkafka::ClientConfig;
use std::collections::HashSet;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

/// How long the checks below wait for a client to succeed or fail.
const CLIENT_WAIT: Duration = Duration::from_secs(60);
/// Records produced plainly, and in the transaction, per workload.
const PLAIN_RECORDS: usize = 40;
const TXN_RECORDS: usize = 10;

/// A broker with its PLAINTEXT listener (port `broker.port`, for set-up)
/// and a `protocol` listener on the returned port, using `pki`'s server
/// certificate, with `extra` flags.
fn tls_broker(protocol: &str, pki: &TestPki, cores: usize, extra: &[&str]) -> (Broker, u16) {
    let port = common::free_port_base(cores);
    let mut opts = BrokerOpts::default()
        .cores(cores)
        .arg("--listener")
        .arg(format!("{protocol}://127.0.0.1:{port}"))
        .arg("--tls-cert")
        .arg(pki.server_cert_path.display().to_string())
        .arg("--tls-key")
        .arg(pki.server_key_path.display().to_string());
    for a in extra {
        opts = opts.arg(*a);
    }
    (Broker::start(opts), port)
}

/// librdkafka settings for SSL trusting `ca`.
fn ssl(ca: &std::path::Path) -> Vec<(String, String)> {
    vec![
        ("security.protocol".into(), "ssl".into()),
        ("ssl.ca.location".into(), ca.display().to_string()),
    ]
}

fn config(bootstrap: &str, settings: &[(String, String)]) -> ClientConfig {
    let mut c = client::base_config(bootstrap);
    for (k, v) in settings {
        c.set(k, v);
    }
    c
}

fn borrowed(settings: &[(String, String)]) -> Vec<(&str, &str)> {
    settings
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

/// Whether a client of `settings` gets the cluster's metadata.
fn metadata_ok(bootstrap: &str, settings: &[(String, String)]) -> Result<usize, String> {
    let c: BaseConsumer = config(bootstrap, settings)
        .set("group.id", "fjord-itest-probe")
        .create()
        .expect("create a probe client");
    c.fetch_metadata(None, Duration::from_secs(10))
        .map(|md| md.brokers().len())
        .map_err(|e| e.to_string())
}

/// Admin, produce, a transaction, and a consumer group reading it all,
/// every client with `settings` (the security ones) against `bootstrap`.
fn workload(bootstrap: &str, settings: &[(String, String)], tag: &str) {
    let topic = format!("{tag}-topic");
    let admin: AdminClient<DefaultClientContext> =
        config(bootstrap, settings).create().expect("admin");
    let created = block_on(admin.create_topics(
        &[NewTopic::new(&topic, 2, TopicReplication::Fixed(1))],
        &admin_opts(),
    ))
    .expect("CreateTopics over TLS");
    assert!(created.iter().all(|r| r.is_ok()), "{created:?}");

    let mut extra = borrowed(settings);
    extra.extend([("acks", "all"), ("linger.ms", "2")]);
    let producer = client::producer(bootstrap, &extra);
    for id in 0..PLAIN_RECORDS {
        client::send(&producer, &topic, &message(id));
    }
    for d in client::await_deliveries(&producer, PLAIN_RECORDS, CLIENT_WAIT) {
        assert!(d.error.is_none(), "{tag}: delivery failed: {:?}", d.error);
    }

    let txn_id = format!("{tag}-txn");
    let mut txn_extra = borrowed(settings);
    txn_extra.push(("transactional.id", &txn_id));
    let txn = client::producer(bootstrap, &txn_extra);
    txn.init_transactions(CLIENT_WAIT).expect("InitProducerId");
    txn.begin_transaction().expect("begin");
    for id in PLAIN_RECORDS..PLAIN_RECORDS + TXN_RECORDS {
        client::send(&txn, &topic, &message(id));
    }
    txn.commit_transaction(CLIENT_WAIT).expect("commit");

    let group = format!("{tag}-group");
    let mut member_extra = borrowed(settings);
    member_extra.push(("isolation.level", "read_committed"));
    let member: BaseConsumer = member_config(bootstrap, &group, &member_extra)
        .create()
        .expect("group member");
    member.subscribe(&[&topic]).expect("subscribe");
    let mut seen = HashSet::new();
    let deadline = Instant::now() + CLIENT_WAIT;
    while seen.len() < PLAIN_RECORDS + TXN_RECORDS {
        assert!(
            Instant::now() < deadline,
            "{tag}: the group read {} of {} records",
            seen.len(),
            PLAIN_RECORDS + TXN_RECORDS
        );
        match member.poll(Duration::from_millis(100)) {
            None => {}
            Some(Err(e)) => panic!("{tag}: consumer error: {e}"),
            Some(Ok(m)) => {
                seen.insert(client::numbered_id(&m));
            }
        }
    }
    member
        .commit_consumer_state(CommitMode::Sync)
        .expect("OffsetCommit");
    let position = member.position().expect("position");
    let committed = member
        .committed(Duration::from_secs(30))
        .expect("OffsetFetch");
    assert_eq!(
        committed.to_topic_map(),
        position.to_topic_map(),
        "{tag}: the group's committed offsets are where it read to"
    );
}

fn message(id: usize) -> client::TestMessage {
    client::TestMessage {
        id,
        key: format!("k{id}").into_bytes(),
        value: id.to_string().into_bytes(),
        headers: vec![],
    }
}

#[test]
fn ssl_serves_admin_produce_transactions_and_groups() {
    let pki = TestPki::new("fjord-test-ca");
    let (broker, port) = tls_broker("SSL", &pki, 2, &[]);
    let bootstrap = format!("127.0.0.1:{port}");
    workload(&bootstrap, &ssl(&pki.ca_path), "ssl");
    // Both shards advertise their SSL endpoints.
    assert_eq!(metadata_ok(&bootstrap, &ssl(&pki.ca_path)), Ok(2));
    // A client that does not trust the broker's CA does not connect.
    let other = TestPki::new("another-ca");
    assert!(metadata_ok(&bootstrap, &ssl(&other.ca_path)).is_err());
    drop(broker);
}

/// Creates `user` with SCRAM-SHA-256 and SCRAM-SHA-512 credentials (PLAIN
/// checks against them too), over the PLAINTEXT listener.
fn add_user(plaintext_port: u16, user: &str, password: &str) {
    // One request per mechanism: Kafka refuses to alter a user's
    // credentials twice in one request.
    for m in [ScramMechanism::Sha256, ScramMechanism::Sha512] {
        let salt = b"a-salt-for-the-test".to_vec();
        let upsertion = ScramCredentialUpsertion::default()
            .with_name(StrBytes::from_string(user.into()))
            .with_mechanism(m.type_id())
            .with_iterations(4096)
            .with_salted_password(m.salted_password(password.as_bytes(), &salt, 4096).into())
            .with_salt(salt.into());
        let resp = RawClient::connect(plaintext_port).request(
            0,
            &AlterUserScramCredentialsRequest::default().with_upsertions(vec![upsertion]),
        );
        for r in &resp.results {
            assert_eq!(r.error_code, 0, "{r:?}");
        }
    }
}

fn sasl_ssl(
    ca: &std::path::Path,
    mechanism: &str,
    user: &str,
    password: &str,
) -> Vec<(String, String)> {
    vec![
        ("security.protocol".into(), "sasl_ssl".into()),
        ("ssl.ca.location".into(), ca.display().to_string()),
        ("sasl.mechanisms".into(), mechanism.into()),
        ("sasl.username".into(), user.into()),
        ("sasl.password".into(), password.into()),
    ]
}

#[test]
fn sasl_ssl_serves_every_mechanism_and_refuses_bad_logins() {
    let pki = TestPki::new("fjord-test-ca");
    let (broker, port) = tls_broker(
        "SASL_SSL",
        &pki,
        1,
        &[
            "--sasl-enabled-mechanisms",
            "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        ],
    );
    add_user(broker.port, "alice", "alice-secret");
    let bootstrap = format!("127.0.0.1:{port}");
    for (mechanism, tag) in [
        ("PLAIN", "plain"),
        ("SCRAM-SHA-256", "scram256"),
        ("SCRAM-SHA-512", "scram512"),
    ] {
        workload(
            &bootstrap,
            &sasl_ssl(&pki.ca_path, mechanism, "alice", "alice-secret"),
            tag,
        );
    }
    for mechanism in ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] {
        let wrong = sasl_ssl(&pki.ca_path, mechanism, "alice", "wrong");
        assert!(
            metadata_ok(&bootstrap, &wrong).is_err(),
            "{mechanism}: wrong password"
        );
        let unknown = sasl_ssl(&pki.ca_path, mechanism, "mallory", "alice-secret");
        assert!(
            metadata_ok(&bootstrap, &unknown).is_err(),
            "{mechanism}: unknown user"
        );
        let good = sasl_ssl(&pki.ca_path, mechanism, "alice", "alice-secret");
        assert_eq!(
            metadata_ok(&bootstrap, &good),
            Ok(1),
            "{mechanism}: still served"
        );
    }
    let stderr = broker.stderr_since(0);
    assert!(
        stderr.contains("authentication failed") && !stderr.contains("alice-secret"),
        "failures are audited, without the password:\n{}",
        broker.stderr_tail()
    );
}

/// Sends `bytes` on a plain TCP connection to `port` and reads until the
/// broker closes it; returns what it sent back.
fn plain_bytes_until_closed(port: u16, bytes: &[u8]) -> Vec<u8> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(CLIENT_WAIT)).unwrap();
    s.write_all(bytes).expect("send");
    let mut got = Vec::new();
    match s.read_to_end(&mut got) {
        Ok(_) => got,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => got,
        Err(e) => panic!("the broker did not close the connection: {e}"),
    }
}

#[test]
fn a_plaintext_client_on_the_tls_port_is_closed_and_others_keep_working() {
    let pki = TestPki::new("fjord-test-ca");
    let (broker, port) = tls_broker("SSL", &pki, 1, &[]);
    let bootstrap = format!("127.0.0.1:{port}");
    // A client that connects and never starts the handshake: closed once
    // the handshake bound passes (the idle limit is 10 minutes).
    let mut silent = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let settings = ssl(&pki.ca_path);
    let mut extra = borrowed(&settings);
    extra.extend([("acks", "all"), ("linger.ms", "2")]);
    let producer = client::producer(&bootstrap, &extra);
    client::send(&producer, "kept", &message(0));
    client::await_deliveries(&producer, 1, CLIENT_WAIT);

    // A Kafka client speaking plaintext: an ApiVersions request.
    let (frame, _) = RawClient::connect(broker.port).encode_frame(
        3,
        &kafka_protocol::messages::ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("raw"))
            .with_client_software_version(StrBytes::from_static_str("1")),
    );
    let answer = plain_bytes_until_closed(port, &frame);
    assert!(
        answer.is_empty() || answer[0] == 0x15,
        "no Kafka answer, at most a TLS alert: {answer:02x?}"
    );
    // Garbage.
    plain_bytes_until_closed(port, &[0xff; 64]);

    // The TLS connection opened before still works.
    client::send(&producer, "kept", &message(1));
    let deliveries = client::await_deliveries(&producer, 2, CLIENT_WAIT);
    assert!(
        deliveries.iter().all(|d| d.error.is_none()),
        "{deliveries:?}"
    );
    silent.set_read_timeout(Some(CLIENT_WAIT)).unwrap();
    let mut rest = Vec::new();
    match silent.read_to_end(&mut rest) {
        Ok(_) => assert!(rest.is_empty() || rest[0] == 0x15, "{rest:02x?}"),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
    let stderr = broker.stderr_since(0);
    assert!(
        stderr.contains("TLS handshake failed") && stderr.contains("no handshake within"),
        "the failures are audited:\n{}",
        broker.stderr_tail()
    );
}

const ALICE: &str = "User:CN=alice,OU=eng,O=fjord";

fn allow(topic: &str, operation: i8) -> AclCreation {
    AclCreation::default()
        .with_resource_type(2) // TOPIC
        .with_resource_name(StrBytes::from_string(topic.into()))
        .with_resource_pattern_type(3) // LITERAL
        .with_principal(StrBytes::from_static_str(ALICE))
        .with_host(StrBytes::from_static_str("*"))
        .with_operation(operation)
        .with_permission_type(3) // ALLOW
}

#[test]
fn required_client_certificates_name_the_principal_acls_see() {
    let pki = TestPki::new("fjord-test-ca");
    let ca = pki.ca_path.display().to_string();
    // ANONYMOUS (the PLAINTEXT listener, set-up only) is a super user.
    let (broker, port) = tls_broker(
        "SSL",
        &pki,
        1,
        &[
            "--tls-client-ca",
            &ca,
            "--tls-client-auth",
            "required",
            "--authorizer",
            "standard",
            "--super-users",
            "User:ANONYMOUS",
        ],
    );
    client::create_topic(&broker.bootstrap(), "alice-topic", 1, &[]);
    client::create_topic(&broker.bootstrap(), "other-topic", 1, &[]);
    let resp = RawClient::connect(broker.port).request(
        3,
        &CreateAclsRequest::default()
            .with_creations(vec![allow("alice-topic", 4), allow("alice-topic", 8)]),
    );
    for r in &resp.results {
        assert_eq!(r.error_code, 0, "CreateAcls: {:?}", r.error_message);
    }
    let bootstrap = format!("127.0.0.1:{port}");

    // No certificate: refused in the handshake.
    assert!(metadata_ok(&bootstrap, &ssl(&pki.ca_path)).is_err());
    // A certificate from another CA: refused.
    let stranger_pki = TestPki::new("another-ca");
    let stranger = stranger_pki.client("mallory", &[(rcgen::DnType::CommonName, "mallory")]);
    let mut with_stranger = ssl(&pki.ca_path);
    with_stranger.push((
        "ssl.certificate.location".into(),
        stranger.cert_path.display().to_string(),
    ));
    with_stranger.push((
        "ssl.key.location".into(),
        stranger.key_path.display().to_string(),
    ));
    assert!(metadata_ok(&bootstrap, &with_stranger).is_err());

    // alice's certificate (subject O=fjord, OU=eng, CN=alice in the
    // certificate's order, which Kafka prints CN first).
    let alice = pki.client(
        "alice",
        &[
            (rcgen::DnType::OrganizationName, "fjord"),
            (rcgen::DnType::OrganizationalUnitName, "eng"),
            (rcgen::DnType::CommonName, "alice"),
        ],
    );
    let mut settings = ssl(&pki.ca_path);
    settings.push((
        "ssl.certificate.location".into(),
        alice.cert_path.display().to_string(),
    ));
    settings.push((
        "ssl.key.location".into(),
        alice.key_path.display().to_string(),
    ));
    let mut extra = borrowed(&settings);
    extra.extend([
        ("acks", "all"),
        ("linger.ms", "2"),
        ("message.timeout.ms", "10000"),
    ]);
    let producer = client::producer(&bootstrap, &extra);
    client::send(&producer, "alice-topic", &message(0));
    client::send(&producer, "other-topic", &message(1));
    let deliveries = client::await_deliveries(&producer, 2, CLIENT_WAIT);
    let by_id = |id| deliveries.iter().find(|d| d.id == id).expect("a report");
    assert_eq!(
        by_id(0).error,
        None,
        "the ACL lets {ALICE} write alice-topic"
    );
    let refused = by_id(1).error.clone().expect("other-topic is refused");
    assert!(refused.contains("Authorization"), "{refused}");
    let stderr = broker.stderr_since(0);
    assert!(
        stderr.contains(ALICE),
        "the principal is audited:\n{}",
        broker.stderr_tail()
    );
}

#[test]
fn sighup_reloads_the_certificate_for_new_connections() {
    let old = TestPki::new("old-ca");
    let new = TestPki::new("new-ca");
    // The broker's files, rewritten in place below.
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("server.pem");
    let key = dir.path().join("server.key");
    std::fs::copy(&old.server_cert_path, &cert).unwrap();
    std::fs::copy(&old.server_key_path, &key).unwrap();
    let port = common::free_port_base(1);
    let broker = Broker::start(
        BrokerOpts::default()
            .cores(1)
            .arg("--listener")
            .arg(format!("SSL://127.0.0.1:{port}"))
            .arg("--tls-cert")
            .arg(cert.display().to_string())
            .arg("--tls-key")
            .arg(key.display().to_string()),
    );
    let bootstrap = format!("127.0.0.1:{port}");
    assert_eq!(metadata_ok(&bootstrap, &ssl(&old.ca_path)), Ok(1));
    assert!(metadata_ok(&bootstrap, &ssl(&new.ca_path)).is_err());
    let old_settings = ssl(&old.ca_path);
    let mut extra = borrowed(&old_settings);
    extra.extend([("acks", "all"), ("linger.ms", "2")]);
    let open_before = client::producer(&bootstrap, &extra);
    client::send(&open_before, "reload", &message(0));
    client::await_deliveries(&open_before, 1, CLIENT_WAIT);

    let pid = broker.pid().expect("running") as i32;
    let hup_and_wait_for = |what: &str| {
        let from = broker.stderr_len();
        // SAFETY: signals the broker process this test started.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
        common::wait_for(CLIENT_WAIT, what, || {
            broker.stderr_since(from).contains(what).then_some(())
        });
    };
    std::fs::copy(&new.server_cert_path, &cert).unwrap();
    std::fs::copy(&new.server_key_path, &key).unwrap();
    hup_and_wait_for("TLS certificate, key and client CA reloaded");
    assert_eq!(
        metadata_ok(&bootstrap, &ssl(&new.ca_path)),
        Ok(1),
        "the new certificate"
    );
    assert!(
        metadata_ok(&bootstrap, &ssl(&old.ca_path)).is_err(),
        "not the old one"
    );
    // The connection opened before keeps its session.
    client::send(&open_before, "reload", &message(1));
    let deliveries = client::await_deliveries(&open_before, 2, CLIENT_WAIT);
    assert!(
        deliveries.iter().all(|d| d.error.is_none()),
        "{deliveries:?}"
    );

    // A bad key: the reload fails and the broker keeps the new config.
    std::fs::write(&key, "not a key").unwrap();
    hup_and_wait_for("TLS reload failed");
    assert_eq!(metadata_ok(&bootstrap, &ssl(&new.ca_path)), Ok(1), "kept");
}

#[test]
fn a_tls_listener_without_usable_files_refuses_to_start() {
    let pki = TestPki::new("fjord-test-ca");
    let missing = pki.dir().join("missing.pem");
    let garbage = pki.dir().join("garbage.pem");
    std::fs::write(&garbage, "no PEM here").unwrap();
    for (cert, key, expected) in [
        (&missing, &pki.server_key_path, "missing.pem: cannot read"),
        (
            &garbage,
            &pki.server_key_path,
            "garbage.pem: no certificate",
        ),
        (
            &pki.server_cert_path,
            &garbage,
            "garbage.pem: no usable private key",
        ),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_fjord"))
            .args(["serve", "--data-dir"])
            .arg(pki.dir().join("data"))
            .args(["--listener", "SSL://127.0.0.1:0", "--tls-cert"])
            .arg(cert)
            .arg("--tls-key")
            .arg(key)
            .output()
            .expect("run fjord serve");
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expected), "{expected}: {stderr}");
    }
}

#[test]
fn requested_client_auth_admits_clients_with_and_without_a_certificate() {
    let pki = TestPki::new("fjord-test-ca");
    let ca = pki.ca_path.display().to_string();
    let (broker, port) = tls_broker(
        "SSL",
        &pki,
        1,
        &["--tls-client-ca", &ca, "--tls-client-auth", "requested"],
    );
    let bootstrap = format!("127.0.0.1:{port}");
    assert_eq!(
        metadata_ok(&bootstrap, &ssl(&pki.ca_path)),
        Ok(1),
        "no certificate"
    );
    let bob = pki.client("bob", &[(rcgen::DnType::CommonName, "bob")]);
    let mut settings = ssl(&pki.ca_path);
    settings.push((
        "ssl.certificate.location".into(),
        bob.cert_path.display().to_string(),
    ));
    settings.push((
        "ssl.key.location".into(),
        bob.key_path.display().to_string(),
    ));
    assert_eq!(metadata_ok(&bootstrap, &settings), Ok(1), "a certificate");
    assert!(
        broker.stderr_since(0).contains("User:CN=bob"),
        "the certificate named the principal:\n{}",
        broker.stderr_tail()
    );
}

/// The value of record `id` in the catch-up test: its id, then filler of a
/// length that varies with it.
fn catch_up_value(id: usize) -> Vec<u8> {
    let mut v = format!("{id}:").into_bytes();
    v.extend((0..100 + (id * 37) % 2_000).map(|i| (i * 7 + id) as u8));
    v
}

/// Fetches served from segment files (a tail cache of 4 KiB holds next to
/// nothing) in both `--catch-up-reads` modes go through TLS byte-exact:
/// with `sendfile` configured, a TLS connection reads the file into memory
/// and encrypts it instead.
#[test]
fn catch_up_reads_through_tls_arrive_byte_exact_in_both_modes() {
    const RECORDS: usize = 3_000;
    let pki = TestPki::new("fjord-test-ca");
    for mode in ["direct", "sendfile"] {
        let (broker, port) = tls_broker(
            "SSL",
            &pki,
            1,
            &[
                "--tail-cache-bytes",
                "4096",
                "--catch-up-reads",
                mode,
                "--log-segment-bytes",
                "1048576",
            ],
        );
        let bootstrap = format!("127.0.0.1:{port}");
        let settings = ssl(&pki.ca_path);
        let topic = format!("catch-up-{mode}");
        let mut extra = borrowed(&settings);
        extra.extend([("acks", "all"), ("linger.ms", "5")]);
        let producer = client::producer(&bootstrap, &extra);
        for id in 0..RECORDS {
            client::send(
                &producer,
                &topic,
                &client::TestMessage {
                    id,
                    key: Vec::new(),
                    value: catch_up_value(id),
                    headers: vec![],
                },
            );
        }
        for d in client::await_deliveries(&producer, RECORDS, CLIENT_WAIT) {
            assert!(d.error.is_none(), "{mode}: delivery failed: {:?}", d.error);
        }
        let mut consumer_extra = borrowed(&settings);
        consumer_extra.push(("fetch.max.bytes", "8388608"));
        consumer_extra.push(("max.partition.fetch.bytes", "4194304"));
        let consumer = client::consumer(&bootstrap, &consumer_extra);
        let mut tpl = rdkafka::TopicPartitionList::new();
        tpl.add_partition_offset(&topic, 0, rdkafka::Offset::Beginning)
            .unwrap();
        consumer.assign(&tpl).unwrap();
        let mut seen = HashSet::new();
        let deadline = Instant::now() + CLIENT_WAIT;
        while seen.len() < RECORDS {
            assert!(
                Instant::now() < deadline,
                "{mode}: read {} of {RECORDS}",
                seen.len()
            );
            match consumer.poll(Duration::from_millis(100)) {
                None => {}
                Some(Err(e)) => panic!("{mode}: consumer error: {e}"),
                Some(Ok(m)) => {
                    use rdkafka::Message;
                    let value = m.payload().unwrap_or_default();
                    let digits = value.iter().position(|&b| b == b':').unwrap_or(0);
                    let id: usize = std::str::from_utf8(&value[..digits])
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .unwrap_or_else(|| panic!("{mode}: a value without its id"));
                    assert!(value == catch_up_value(id), "{mode}: record {id} differs");
                    seen.insert(id);
                }
            }
        }
        drop(broker);
    }
}
