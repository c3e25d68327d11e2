//! Produce versions as Kafka 4.x advertises and serves them (KAFKA-18659):
//! ApiVersions lists Produce 0-13, a Produce v0-2 request is refused the
//! way Kafka's socket server refuses an unsupported version (the connection
//! is closed, nothing is written), and librdkafka older than 2.11.1 —
//! Debian's kcat, linked with librdkafka 2.0 — then sends compressed
//! batches compressed. With an advertised minimum of 3 it sent gzip, snappy
//! and lz4 batches uncompressed (librdkafka #4956: it asked whether the
//! broker serves Produce v0, the version it ties those codecs to); zstd,
//! tied to v7, was not affected. The codec on disk is read with `fjord
//! dump-log`.

mod common;

use bytes::{BufMut, Bytes, BytesMut};
use common::child::{run_bounded, Streams};
use common::client::{create_topic, leader_port};
use common::disk::batches;
use common::raw::{only_partition, produce_request, RawClient};
use common::{segment_path, wait_for, Broker, BrokerOpts};
use fjord::record::{BatchBuilder, Compression};
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest};
use std::process::Command;
use std::time::Duration;

/// Bound on a kcat run (it produces a few hundred lines and exits).
const KCAT_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on waiting for the produced batches to reach the segment file.
const DISK_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on waiting for the broker to close a refused connection.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);
/// Lines kcat produces per codec: enough for a batch that compresses well.
const KCAT_LINES: usize = 300;
/// kcat's `linger.ms`: far longer than it takes to read its input.
const KCAT_LINGER_MS: u64 = 500;

fn one_record(value: &str) -> Bytes {
    BatchBuilder::new(Compression::None)
        .record(None, Some(value.as_bytes()), &[], 1_700_000_000_000)
        .build()
        .freeze()
}

/// A Produce v2 request frame (header v1, body of the v0-2 schema: acks,
/// timeout, topics; no transactional id) for `topic`-0 carrying `records`.
/// kafka-protocol's schemas start at v3, so it is written by hand.
fn produce_v2_frame(correlation_id: i32, topic: &str, records: &[u8]) -> Vec<u8> {
    let client_id = b"fjord-itest-raw";
    let mut b = BytesMut::new();
    b.put_i16(ApiKey::Produce as i16);
    b.put_i16(2);
    b.put_i32(correlation_id);
    b.put_i16(client_id.len() as i16);
    b.put_slice(client_id);
    b.put_i16(1); // acks
    b.put_i32(30_000); // timeout_ms
    b.put_i32(1); // topics
    b.put_i16(topic.len() as i16);
    b.put_slice(topic.as_bytes());
    b.put_i32(1); // partitions
    b.put_i32(0); // index
    b.put_i32(records.len() as i32);
    b.put_slice(records);
    let mut framed = (b.len() as i32).to_be_bytes().to_vec();
    framed.extend_from_slice(&b);
    framed
}

#[test]
fn produce_advertised_from_v0_and_v0_to_v2_refused_as_kafka_does() {
    let broker = Broker::start(BrokerOpts::default());
    let topic = "versions";
    create_topic(&broker.bootstrap(), topic, 1, &[]);
    let port = leader_port(&broker, topic, 0);

    // ApiVersions: Produce 0-13, as Kafka 4.4's broker listener says.
    let mut raw = RawClient::connect(port);
    let av = raw.request(3, &ApiVersionsRequest::default());
    assert_eq!(av.error_code, 0);
    let produce = av
        .api_keys
        .iter()
        .find(|k| k.api_key == ApiKey::Produce as i16)
        .expect("Produce is advertised");
    assert_eq!((produce.min_version, produce.max_version), (0, 13));

    // Produce v0, v1 and v2, each on its own connection: closed without
    // an answer, as Kafka's socket server does on UnsupportedVersionException.
    for version in 0..=2i16 {
        let mut raw = RawClient::connect(port);
        let mut frame = produce_v2_frame(7, topic, &one_record("refused"));
        frame[6..8].copy_from_slice(&version.to_be_bytes());
        raw.send_bytes(&frame);
        raw.assert_closed(CLOSE_TIMEOUT, &format!("Produce v{version}"));
    }

    // Nothing was written: the first record accepted (at v3, the lowest
    // version served) gets offset 0.
    let mut raw = RawClient::connect(port);
    let resp = raw.request(3, &produce_request(topic, 0, 1, one_record("accepted")));
    let p = only_partition(&resp);
    assert_eq!((p.error_code, p.base_offset), (0, 0));
}

/// `fjord dump-log` of `topic`-0's first segment.
fn dump_log(broker: &Broker, topic: &str) -> String {
    let path = segment_path(&broker.data_dir(), topic, 0);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fjord"));
    cmd.arg("dump-log").arg(&path);
    let run = run_bounded(
        &mut cmd,
        format!("fjord dump-log {}", path.display()),
        None,
        Streams::Separate,
        KCAT_TIMEOUT,
    );
    run.ok().to_string()
}

/// The first librdkafka release that reads an advertised range instead of
/// one version per feature (librdkafka #5130): the fix of #4956.
const LIBRDKAFKA_FIXED: (u32, u32, u32) = (2, 11, 1);

/// `kcat` with the system's librdkafka. `cargo test` puts the build's own
/// directories on `LD_LIBRARY_PATH`, and they hold the librdkafka that
/// rdkafka-sys built (2.12, already fixed): kcat would load that one.
fn kcat() -> Command {
    let mut cmd = Command::new("kcat");
    cmd.env_remove("LD_LIBRARY_PATH");
    cmd
}

/// The librdkafka version kcat runs with, from `kcat -V`
/// (`... librdkafka 2.0.2 builtin.features=...`).
fn kcat_librdkafka_version() -> (u32, u32, u32) {
    let out = kcat()
        .arg("-V")
        .output()
        .expect("kcat is not installed (.ci/run installs Debian's kcat)");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let version = text
        .split("librdkafka ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no librdkafka version in `kcat -V`: {text}"));
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let mut next = || parts.next().unwrap_or(0);
    (next(), next(), next())
}

#[test]
fn kcat_with_librdkafka_before_2_11_1_stores_compressed_batches() {
    let version = kcat_librdkafka_version();
    assert!(
        version < LIBRDKAFKA_FIXED,
        "kcat runs with librdkafka {version:?}, which has the fix: this test needs an \
         older one (Debian 12's kcat has 2.0.2)"
    );
    let broker = Broker::start(BrokerOpts::default());
    let payload: String = (0..KCAT_LINES)
        .map(|i| format!("a compressible line of text for the codec check, number {i}\n"))
        .collect();
    for codec in ["gzip", "lz4", "zstd"] {
        let topic = format!("kcat-{codec}");
        create_topic(&broker.bootstrap(), &topic, 1, &[]);
        let port = leader_port(&broker, &topic, 0);
        let mut cmd = kcat();
        cmd.args(["-b", &format!("127.0.0.1:{port}"), "-P", "-t", &topic])
            .args(["-p", "0", "-z", codec])
            // All lines in one batch: librdkafka sends a batch that does
            // not shrink (one short line) uncompressed by design, so a
            // first line sent on its own would fail the check below.
            .args(["-X", &format!("linger.ms={KCAT_LINGER_MS}")])
            // librdkafka's feature and message log, shown if the test fails.
            .args(["-d", "feature,msg"]);
        let run = run_bounded(
            &mut cmd,
            format!("kcat -P -t {topic} -z {codec}"),
            Some(payload.as_bytes()),
            Streams::Separate,
            KCAT_TIMEOUT,
        );
        run.ok();
        let kcat_log = &run.stderr;

        // Every line arrived, in batches stored with the producer's codec.
        let stored = wait_for(DISK_TIMEOUT, "kcat's records on disk", || {
            let b = batches(&broker.first_segment(&topic, 0));
            let records: usize = b.iter().map(|b| b.header.records_count as usize).sum();
            (records == KCAT_LINES).then_some(b)
        });
        for b in &stored {
            assert_eq!(
                b.header.compression().ok().map(|c| c.name()),
                Some(codec),
                "{topic}: batch at {} is stored with the producer's codec; kcat logged:\n{kcat_log}",
                b.position
            );
        }
        let dump = dump_log(&broker, &topic);
        let batch_lines: Vec<&str> = dump
            .lines()
            .filter(|l| l.starts_with("baseOffset:"))
            .collect();
        assert_eq!(batch_lines.len(), stored.len(), "{dump}");
        for line in batch_lines {
            assert!(
                line.contains(&format!("compresscodec: {codec} ")),
                "dump-log shows {codec}: {line}"
            );
        }
    }
}
