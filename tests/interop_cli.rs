//! Conformance with Apache Kafka's own command-line tools (4.4.0, run by
//! `scripts/kafka-cli` from the jars `scripts/kafka-peer.sh resolve` fetches
//! with Maven): every test starts a fjord broker (2 shards, so Kafka nodes 0
//! and 1), drives it with one tool family and checks what the tool prints,
//! the way an operator would read it. Each tool's command line and output
//! are printed (`--nocapture` shows them for passing tests too).
//!
//! What it owns: one resolve of Kafka's classpath per test binary
//! ([`kafka_resolved`], a `OnceLock`), and the tool child processes.
//! Invariants: every child runs in its own process group with a timeout that
//! kills the whole group, so no JVM outlives its test.
//!
//! librdkafka (`tests/common/client.rs`) sets up data where a Kafka tool
//! would only cost JVM start-ups (each is 1–4 s on a loaded 2-core machine);
//! the checks themselves always read the Kafka tool's output.

mod common;

use common::child::{run_bounded, ChildRun, Streams};
use common::client::{self, TestMessage};
use common::target::Target;
use common::{Broker, BrokerOpts};
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::producer::Producer;
use rdkafka::{Offset, TopicPartitionList};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

/// Longest `scripts/kafka-peer.sh resolve` may take (an online resolve on an
/// empty `~/.m2` downloads about 80 MB).
const RESOLVE_TIMEOUT_MS: u64 = 900_000;
/// Longest one tool invocation may run; the slowest here (kafka-dump-log
/// over a few MiB of segments, a console consumer waiting for its group)
/// take well under 30 s.
const TOOL_TIMEOUT_MS: u64 = 120_000;
/// JVM options for the short-lived tool JVMs (unless `KAFKA_CLI_OPTS` is
/// set): the C1 compiler only and the serial collector start a JVM about a
/// third faster, and no tool here runs long enough to gain from C2.
const TOOL_JVM_OPTS: &str = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1";
/// Lines of a tool's stdout printed from its head and from its tail; the
/// dumps of several MiB of segments are cut in the middle.
const PRINT_LINES_MAX: usize = 60;
/// Bound on librdkafka's transaction calls and flushes.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);
/// `--timeout-ms` of a console consumer: it exits (and the test fails on
/// the missing messages) instead of waiting forever.
const CONSUMER_IDLE_TIMEOUT_MS: u64 = 30_000;

/// The repository's root (where `scripts/` is).
fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Resolves Kafka's jars once per test binary with
/// `scripts/kafka-peer.sh resolve` (offline first; it returns at once when
/// the cache in `target/kafka-peer/` is fresh). Panics with its output when
/// that fails.
fn kafka_resolved() {
    static RESOLVED: OnceLock<Result<(), String>> = OnceLock::new();
    let result = RESOLVED.get_or_init(|| {
        let script = repo_root().join("scripts/kafka-peer.sh");
        let mut cmd = Command::new("bash");
        cmd.arg(&script).arg("resolve");
        let run = run_bounded(
            &mut cmd,
            format!("{} resolve", script.display()),
            None,
            Streams::Separate,
            Duration::from_millis(RESOLVE_TIMEOUT_MS),
        );
        println!("$ {}\n{}{}", run.command, run.stdout, run.stderr);
        if run.success() {
            Ok(())
        } else {
            Err(format!(
                "{}: {}\n{}{}",
                run.command,
                run.describe_status(),
                run.stdout,
                run.stderr
            ))
        }
    });
    if let Err(report) = result {
        panic!("resolving Kafka's jars failed (are Java 17 and Maven 3.8 installed?):\n{report}");
    }
}

/// The head and tail of `text`, at most [`PRINT_LINES_MAX`] lines each.
fn head_tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() <= 2 * PRINT_LINES_MAX {
        return text.to_string();
    }
    format!(
        "{}\n... ({} lines not shown) ...\n{}\n",
        lines[..PRINT_LINES_MAX].join("\n"),
        lines.len() - 2 * PRINT_LINES_MAX,
        lines[lines.len() - PRINT_LINES_MAX..].join("\n")
    )
}

/// Runs Kafka's tool `tool` (the name of its `bin/` script) with `args`
/// through `scripts/kafka-cli`, feeding it `stdin`, and prints the command
/// line and the output.
fn kafka_tool_with_input(tool: &str, args: &[&str], stdin: Option<&[u8]>) -> ChildRun {
    kafka_resolved();
    let script = repo_root().join("scripts/kafka-cli");
    let mut cmd = Command::new("bash");
    cmd.arg(&script).arg(tool).args(args);
    if std::env::var_os("KAFKA_CLI_OPTS").is_none() {
        cmd.env("KAFKA_CLI_OPTS", TOOL_JVM_OPTS);
    }
    let command = format!("scripts/kafka-cli {tool} {}", args.join(" "));
    let run = run_bounded(
        &mut cmd,
        command,
        stdin,
        Streams::Separate,
        Duration::from_millis(TOOL_TIMEOUT_MS),
    );
    println!(
        "$ {}\n--- {} in {:.1} s; stdout ({} lines) ---\n{}--- stderr ---\n{}",
        run.command,
        run.describe_status(),
        run.elapsed.as_secs_f64(),
        run.stdout.lines().count(),
        head_tail(&run.stdout),
        head_tail(&run.stderr)
    );
    run
}

fn kafka_tool(tool: &str, args: &[&str]) -> ChildRun {
    kafka_tool_with_input(tool, args, None)
}

/// A line of `Key: value` fields separated by tabs (kafka-topics
/// --describe), as a map.
fn tab_fields(line: &str) -> HashMap<String, String> {
    line.split('\t')
        .filter_map(|f| f.split_once(": "))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// A line of `key: value` pairs separated by spaces (kafka-dump-log): a
/// token that ends in `:` starts a key; the tokens up to the next key are its
/// value. Good for the fields before `key:`/`payload:`, whose values have no
/// spaces in this file's data.
fn space_fields(line: &str) -> HashMap<String, String> {
    let mut out: HashMap<String, String> = HashMap::new();
    let mut key: Option<String> = None;
    for token in line.split_whitespace() {
        if token.len() > 1 && token.ends_with(':') {
            key = Some(token.trim_end_matches(':').to_string());
            out.entry(key.clone().expect("key")).or_default();
        } else if let Some(k) = &key {
            let v = out.get_mut(k).expect("key present");
            if !v.is_empty() {
                v.push(' ');
            }
            v.push_str(token);
        }
    }
    out
}

/// The rows of a whitespace-aligned table (kafka-consumer-groups,
/// kafka-transactions) whose header line starts with `first_column`, as
/// column → value maps. Stops at the first blank line after the header.
fn table_rows(text: &str, first_column: &str) -> Vec<HashMap<String, String>> {
    let mut rows = Vec::new();
    let mut header: Option<Vec<String>> = None;
    for line in text.lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        match &header {
            None => {
                if cols.first() == Some(&first_column) {
                    header = Some(cols.iter().map(|c| c.to_string()).collect());
                }
            }
            Some(h) => {
                if cols.is_empty() {
                    break;
                }
                rows.push(
                    h.iter()
                        .cloned()
                        .zip(cols.iter().map(|c| c.to_string()))
                        .collect(),
                );
            }
        }
    }
    rows
}

fn num(fields: &HashMap<String, String>, key: &str) -> i64 {
    let v = fields
        .get(key)
        .unwrap_or_else(|| panic!("no field {key} in {fields:?}"));
    v.parse()
        .unwrap_or_else(|e| panic!("field {key}={v:?} is not a number: {e}"))
}

/// `kafka-get-offsets` output (`topic:partition:offset` lines) of `topic`.
fn get_offsets(bootstrap: &str, topic: &str, time: &str) -> BTreeMap<i32, i64> {
    let run = kafka_tool(
        "kafka-get-offsets",
        &[
            "--bootstrap-server",
            bootstrap,
            "--topic",
            topic,
            "--time",
            time,
        ],
    );
    run.ok()
        .lines()
        .filter_map(|l| {
            let (rest, offset) = l.trim().rsplit_once(':')?;
            let (t, p) = rest.rsplit_once(':')?;
            (t == topic).then(|| {
                (
                    p.parse().expect("partition"),
                    offset.parse().expect("offset"),
                )
            })
        })
        .collect()
}

/// Produces `messages` to `topic` with librdkafka (acks=all plus `extra`)
/// and returns the acknowledged (partition, offset) of each, by id.
fn produce(
    bootstrap: &str,
    topic: &str,
    messages: &[TestMessage],
    extra: &[(&str, &str)],
) -> HashMap<usize, (i32, i64)> {
    let mut config = vec![("acks", "all")];
    config.extend_from_slice(extra);
    let p = client::producer(bootstrap, &config);
    for m in messages {
        client::send(&p, topic, m);
    }
    acknowledged(&p, messages.len())
}

/// Waits for `count` delivery reports (all the producer's so far) and
/// returns their (partition, offset) by id; every one must be a success.
fn acknowledged(p: &client::TestProducer, count: usize) -> HashMap<usize, (i32, i64)> {
    client::await_deliveries(p, count, CLIENT_TIMEOUT)
        .into_iter()
        .map(|d| {
            assert!(
                d.error.is_none(),
                "delivery of {} failed: {:?}",
                d.id,
                d.error
            );
            (d.id, (d.partition, d.offset))
        })
        .collect()
}

fn message(id: usize, key: String, value: String) -> TestMessage {
    TestMessage {
        id,
        key: key.into_bytes(),
        value: value.into_bytes(),
        headers: Vec::new(),
    }
}

/// A broker of 2 shards whose groups rebalance at once (Kafka's test peer
/// also sets `group.initial.rebalance.delay.ms=0`).
fn broker_opts() -> BrokerOpts {
    BrokerOpts::default()
        .cores(2)
        .arg("--group-initial-rebalance-delay-ms")
        .arg("0")
}

/// The broker of a test that needs no data directory: fjord's, or the one
/// `FJORD_TEST_BROKER` names.
fn start_target() -> Target {
    Target::start(broker_opts())
}

/// kafka-topics: --create with a config, --list, --describe (partitions,
/// leaders on fjord's nodes 0 and 1, the config), --alter --partitions,
/// --delete.
#[test]
fn topics_create_list_describe_alter_delete() {
    let target = start_target();
    let b = target.bootstrap();
    let topic = target.name("cli-topics");
    const RETENTION_MS: &str = "3600000";
    let bs = ["--bootstrap-server", b.as_str()];
    let topics = |args: &[&str]| kafka_tool("kafka-topics", &[&bs[..], args].concat());

    let out = topics(&[
        "--create",
        "--topic",
        &topic,
        "--partitions",
        "3",
        "--replication-factor",
        "1",
        "--config",
        &format!("retention.ms={RETENTION_MS}"),
    ]);
    assert!(
        out.ok().contains(&format!("Created topic {topic}.")),
        "create output"
    );

    let listed: Vec<String> = topics(&["--list"])
        .ok()
        .lines()
        .map(str::to_string)
        .collect();
    assert!(
        listed.iter().any(|t| t == &topic),
        "--list shows {topic}: {listed:?}"
    );

    // The leaders the tool prints must be the ones librdkafka is told; on
    // fjord they are its two shards, nodes 0 and 1.
    let check_describe = |text: &str, partitions: usize| {
        let leaders = client::partition_leaders(&b, &topic);
        let header = text
            .lines()
            .map(tab_fields)
            .find(|f| f.contains_key("PartitionCount"))
            .unwrap_or_else(|| panic!("no topic line in --describe:\n{text}"));
        assert_eq!(header["Topic"], topic);
        assert_eq!(num(&header, "PartitionCount"), partitions as i64);
        assert_eq!(num(&header, "ReplicationFactor"), 1);
        assert!(!header["TopicId"].is_empty(), "a topic id");
        let configs: Vec<&str> = header["Configs"].split(',').collect();
        assert!(
            configs.contains(&format!("retention.ms={RETENTION_MS}").as_str()),
            "Configs shows retention.ms: {configs:?}"
        );
        let rows: Vec<HashMap<String, String>> = text
            .lines()
            .map(tab_fields)
            .filter(|f| f.contains_key("Partition"))
            .collect();
        assert_eq!(rows.len(), partitions, "one line per partition:\n{text}");
        let mut seen_nodes = BTreeSet::new();
        for (i, row) in rows.iter().enumerate() {
            assert_eq!(num(row, "Partition"), i as i64, "partitions in order");
            let leader = num(row, "Leader");
            assert_eq!(row["Replicas"], leader.to_string(), "replicas = leader");
            assert_eq!(row["Isr"], leader.to_string(), "ISR = leader");
            assert_eq!(
                Some(leader),
                leaders.get(&(i as i32)).map(|&l| l as i64),
                "partition {i}: the leader Metadata names"
            );
            seen_nodes.insert(leader);
        }
        if target.is_fjord() {
            assert_eq!(
                seen_nodes,
                BTreeSet::from([0, 1]),
                "the leaders are fjord's two shards, and both lead partitions"
            );
        }
    };
    check_describe(topics(&["--describe", "--topic", &topic]).ok(), 3);

    topics(&["--alter", "--topic", &topic, "--partitions", "5"]).ok();
    check_describe(topics(&["--describe", "--topic", &topic]).ok(), 5);

    topics(&["--delete", "--topic", &topic]).ok();
    let listed: Vec<String> = topics(&["--list"])
        .ok()
        .lines()
        .map(str::to_string)
        .collect();
    assert!(
        !listed.iter().any(|t| t == &topic),
        "--list after --delete: {listed:?}"
    );
}

/// kafka-console-producer with keys, then kafka-console-consumer
/// --from-beginning reads every record back, in order per partition.
#[test]
fn console_producer_to_console_consumer() {
    let target = start_target();
    let b = target.bootstrap();
    let topic = target.name("cli-console");
    const COUNT: usize = 200;
    const KEYS: usize = 7;
    client::create_topic(&b, &topic, 3, &[]);
    let sent: Vec<(String, String)> = (0..COUNT)
        .map(|i| (format!("key{}", i % KEYS), format!("value-{i:04}")))
        .collect();
    let input: String = sent.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
    kafka_tool_with_input(
        "kafka-console-producer",
        &[
            "--bootstrap-server",
            &b,
            "--topic",
            &topic,
            "--reader-property",
            "parse.key=true",
            "--reader-property",
            "key.separator=:",
            "--producer-property",
            "acks=all",
        ],
        Some(input.as_bytes()),
    )
    .ok();

    let count = COUNT.to_string();
    let timeout = CONSUMER_IDLE_TIMEOUT_MS.to_string();
    let run = kafka_tool(
        "kafka-console-consumer",
        &[
            "--bootstrap-server",
            &b,
            "--topic",
            &topic,
            "--from-beginning",
            "--max-messages",
            &count,
            "--timeout-ms",
            &timeout,
            "--formatter-property",
            "print.key=true",
            "--formatter-property",
            "print.partition=true",
            "--formatter-property",
            "print.offset=true",
            "--formatter-property",
            "key.separator=|",
        ],
    );
    let out = run.ok();
    assert!(
        run.stderr
            .contains(&format!("Processed a total of {COUNT} messages")),
        "the consumer's summary"
    );
    // Lines are `Partition:P|Offset:O|key|value`: the formatter puts its
    // key.separator after every field it prints before the value.
    let mut got: Vec<(i32, i64, String, String)> = Vec::new();
    for line in out.lines() {
        let fields: Vec<&str> = line.split('|').collect();
        assert_eq!(fields.len(), 4, "consumer line {line:?}");
        let p = fields[0]
            .strip_prefix("Partition:")
            .expect("partition")
            .parse()
            .expect("p");
        let o = fields[1]
            .strip_prefix("Offset:")
            .expect("offset")
            .parse()
            .expect("o");
        got.push((p, o, fields[2].to_string(), fields[3].to_string()));
    }
    let mut sent_multiset: Vec<(String, String)> = sent.clone();
    let mut got_multiset: Vec<(String, String)> = got
        .iter()
        .map(|(_, _, k, v)| (k.clone(), v.clone()))
        .collect();
    sent_multiset.sort();
    got_multiset.sort();
    assert_eq!(
        got_multiset, sent_multiset,
        "every record once, keys intact"
    );
    // Per partition: offsets 0, 1, 2, ... and values in the order they were
    // sent; a key always lands on one partition.
    let mut by_partition: BTreeMap<i32, Vec<(i64, String)>> = BTreeMap::new();
    let mut key_partition: HashMap<String, i32> = HashMap::new();
    for (p, o, k, v) in &got {
        by_partition.entry(*p).or_default().push((*o, v.clone()));
        let first = *key_partition.entry(k.clone()).or_insert(*p);
        assert_eq!(first, *p, "key {k} on one partition");
    }
    for (p, records) in &by_partition {
        let offsets: Vec<i64> = records.iter().map(|(o, _)| *o).collect();
        assert_eq!(
            offsets,
            (0..records.len() as i64).collect::<Vec<_>>(),
            "partition {p}: contiguous offsets from 0 in order"
        );
        let values: Vec<&String> = records.iter().map(|(_, v)| v).collect();
        let mut sorted = values.clone();
        sorted.sort();
        assert_eq!(values, sorted, "partition {p}: send order");
    }
}

/// A describe table's rows for `group`, by partition.
fn group_rows(text: &str, group: &str) -> BTreeMap<i32, HashMap<String, String>> {
    table_rows(text, "GROUP")
        .into_iter()
        .filter(|r| r.get("GROUP").map(String::as_str) == Some(group))
        .map(|r| (num(&r, "PARTITION") as i32, r))
        .collect()
}

/// kafka-consumer-groups: a console consumer in a group consumes and
/// commits; --describe (offsets, lag), --state, --reset-offsets (--shift-by
/// -1, --to-earliest), --delete-offsets, --delete.
#[test]
fn consumer_groups_describe_reset_delete() {
    let target = start_target();
    let b = target.bootstrap();
    let topic = target.name("cli-groups");
    let group = target.name("cli-group");
    const COUNT: usize = 60;
    client::create_topic(&b, &topic, 3, &[]);
    let messages: Vec<TestMessage> = (0..COUNT)
        .map(|i| message(i, format!("k{i}"), format!("v{i}")))
        .collect();
    let acked = produce(&b, &topic, &messages, &[]);
    let mut end: BTreeMap<i32, i64> = BTreeMap::new();
    for (p, o) in acked.values() {
        let e = end.entry(*p).or_insert(0);
        *e = (*e).max(o + 1);
    }
    assert_eq!(end.len(), 3, "records on every partition: {end:?}");

    let count = COUNT.to_string();
    let timeout = CONSUMER_IDLE_TIMEOUT_MS.to_string();
    let consumer = kafka_tool(
        "kafka-console-consumer",
        &[
            "--bootstrap-server",
            &b,
            "--topic",
            &topic,
            "--group",
            &group,
            "--from-beginning",
            "--max-messages",
            &count,
            "--timeout-ms",
            &timeout,
        ],
    );
    assert_eq!(
        consumer.ok().lines().count(),
        COUNT,
        "the consumer printed every record"
    );

    let groups = |args: &[&str]| {
        kafka_tool(
            "kafka-consumer-groups",
            &[&["--bootstrap-server", b.as_str()][..], args].concat(),
        )
    };
    let describe = || groups(&["--describe", "--group", &group]);

    // Closing the consumer committed its positions: nothing left to read.
    let rows = group_rows(describe().ok(), &group);
    assert_eq!(rows.keys().copied().collect::<Vec<_>>(), vec![0, 1, 2]);
    for (p, row) in &rows {
        assert_eq!(row["TOPIC"], topic);
        assert_eq!(
            num(row, "CURRENT-OFFSET"),
            end[p],
            "partition {p} committed at its end"
        );
        assert_eq!(num(row, "LOG-END-OFFSET"), end[p], "partition {p} log end");
        assert_eq!(num(row, "LAG"), 0, "partition {p} lag");
        assert_eq!(row["CONSUMER-ID"], "-", "no member any more");
    }

    let state = groups(&["--describe", "--group", &group, "--state"]);
    let state_rows = table_rows(state.ok(), "GROUP");
    assert_eq!(state_rows.len(), 1, "one state row");
    assert_eq!(state_rows[0]["STATE"], "Empty");
    assert_eq!(num(&state_rows[0], "#MEMBERS"), 0);

    // --shift-by -1 moves every committed offset back by one.
    let shifted = groups(&[
        "--reset-offsets",
        "--group",
        &group,
        "--topic",
        &topic,
        "--shift-by",
        "-1",
        "--execute",
    ]);
    let rows = group_rows(shifted.ok(), &group);
    assert_eq!(rows.len(), 3, "the reset covers every partition");
    for (p, row) in &rows {
        assert_eq!(
            num(row, "NEW-OFFSET"),
            end[p] - 1,
            "partition {p} shifted by -1"
        );
    }

    let earliest = groups(&[
        "--reset-offsets",
        "--group",
        &group,
        "--topic",
        &topic,
        "--to-earliest",
        "--execute",
    ]);
    let rows = group_rows(earliest.ok(), &group);
    assert_eq!(rows.len(), 3);
    for (p, row) in &rows {
        assert_eq!(num(row, "NEW-OFFSET"), 0, "partition {p} reset to earliest");
    }
    let rows = group_rows(describe().ok(), &group);
    assert_eq!(rows.len(), 3);
    for (p, row) in &rows {
        assert_eq!(
            num(row, "CURRENT-OFFSET"),
            0,
            "partition {p} after --to-earliest"
        );
        assert_eq!(
            num(row, "LAG"),
            end[p],
            "partition {p}: everything to read again"
        );
    }

    let deleted = groups(&[
        "--delete-offsets",
        "--group",
        &group,
        "--topic",
        &format!("{topic}:1"),
    ]);
    let text = deleted.ok();
    assert!(
        text.contains(&format!(
            "Request succeeded for deleting offsets from group {group}."
        )),
        "--delete-offsets summary"
    );
    let status = table_rows(text, "TOPIC");
    assert_eq!(status.len(), 1, "one partition's status");
    assert_eq!(num(&status[0], "PARTITION"), 1);
    assert_eq!(status[0]["STATUS"], "Successful");
    let rows = group_rows(describe().ok(), &group);
    assert_eq!(
        rows.keys().copied().collect::<Vec<_>>(),
        vec![0, 2],
        "partition 1's offset is gone"
    );

    let gone = groups(&["--delete", "--group", &group]);
    assert!(
        gone.ok().contains(&format!(
            "Deletion of requested consumer groups ('{group}') was successful."
        )),
        "--delete summary"
    );
    let listed = groups(&["--list"]);
    assert!(
        !listed.ok().lines().any(|l| l.trim() == group),
        "--list after --delete"
    );
}

/// kafka-transactions list / describe / describe-producers after Kafka's
/// transactional perf-test producer committed its transactions.
#[test]
fn transactions_list_describe() {
    let target = start_target();
    let b = target.bootstrap();
    let topic = target.name("cli-txn");
    let txn_id = target.name("cli-txn-perf");
    const RECORDS: usize = 1000;
    client::create_topic(&b, &topic, 1, &[]);
    let records = RECORDS.to_string();
    let perf = kafka_tool(
        "kafka-producer-perf-test",
        &[
            "--topic",
            &topic,
            "--num-records",
            &records,
            "--record-size",
            "100",
            "--throughput",
            "-1",
            "--transactional-id",
            &txn_id,
            "--transaction-duration-ms",
            "100",
            "--command-property",
            &format!("bootstrap.servers={b}"),
        ],
    );
    assert!(
        perf.ok().contains(&format!("{RECORDS} records sent")),
        "perf-test summary"
    );

    let txns = |args: &[&str]| {
        kafka_tool(
            "kafka-transactions",
            &[&["--bootstrap-server", b.as_str()][..], args].concat(),
        )
    };
    let listed = table_rows(txns(&["list"]).ok(), "TransactionalId");
    let row = listed
        .iter()
        .find(|r| r["TransactionalId"] == txn_id)
        .unwrap_or_else(|| panic!("list shows {txn_id}: {listed:?}"));
    let producer_id = num(row, "ProducerId");
    assert!(producer_id >= 0, "a producer id");
    let coordinator = num(row, "Coordinator");
    if target.is_fjord() {
        assert!(
            coordinator == 0 || coordinator == 1,
            "the coordinator is a fjord shard"
        );
    }
    assert_eq!(row["TransactionState"], "CompleteCommit");

    let described = table_rows(
        txns(&["describe", "--transactional-id", &txn_id]).ok(),
        "CoordinatorId",
    );
    assert_eq!(described.len(), 1, "one transactional id described");
    let d = &described[0];
    assert_eq!(d["TransactionalId"], txn_id);
    assert_eq!(num(d, "CoordinatorId"), coordinator);
    assert_eq!(num(d, "ProducerId"), producer_id);
    let epoch = num(d, "ProducerEpoch");
    assert!(
        epoch >= 1,
        "a version-2 producer's epoch moves with each commit: {epoch}"
    );
    assert!(
        ["CompleteCommit", "Empty"].contains(&d["TransactionState"].as_str()),
        "state {}",
        d["TransactionState"]
    );
    // An empty last column leaves the row one field short, so a finished
    // transaction's row has no TopicPartitions at all.
    assert!(
        !d.contains_key("TopicPartitions"),
        "no partitions in a finished transaction: {d:?}"
    );

    // The topic's one partition took part in every transaction, so it knows
    // the producer at the coordinator's epoch (the last commit's marker
    // carries it), with no open transaction.
    let producers = table_rows(
        txns(&["describe-producers", "--topic", &topic, "--partition", "0"]).ok(),
        "ProducerId",
    );
    let pr = producers
        .iter()
        .find(|r| num(r, "ProducerId") == producer_id)
        .unwrap_or_else(|| panic!("describe-producers shows {producer_id}: {producers:?}"));
    assert_eq!(num(pr, "ProducerEpoch"), epoch, "the partition's epoch");
    assert_eq!(
        pr["CurrentTransactionStartOffset"], "None",
        "no open transaction"
    );
}

/// kafka-delete-records moves the low watermark (kafka-get-offsets
/// --time -2); offset -1 means the high watermark; an offset beyond it is
/// OFFSET_OUT_OF_RANGE.
#[test]
fn delete_records_moves_low_watermark() {
    let target = start_target();
    let b = target.bootstrap();
    let topic = target.name("cli-delete");
    const PER_PARTITION: i64 = 10;
    client::create_topic(&b, &topic, 3, &[]);
    let p = client::producer(&b, &[("acks", "all")]);
    let mut id = 0;
    for partition in 0..3 {
        for _ in 0..PER_PARTITION {
            let m = message(id, format!("k{id}"), format!("v{id}"));
            p.send(
                rdkafka::producer::BaseRecord::with_opaque_to(&topic, id)
                    .key(&m.key)
                    .payload(&m.value)
                    .partition(partition),
            )
            .map_err(|(e, _)| e)
            .expect("enqueue");
            id += 1;
        }
    }
    acknowledged(&p, id);
    assert_eq!(
        get_offsets(&b, &topic, "-1"),
        BTreeMap::from([(0, PER_PARTITION), (1, PER_PARTITION), (2, PER_PARTITION)]),
        "high watermarks"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("offsets.json");
    std::fs::write(
        &json,
        format!(
            r#"{{"version":1,"partitions":[{{"topic":"{topic}","partition":0,"offset":4}},{{"topic":"{topic}","partition":1,"offset":{}}},{{"topic":"{topic}","partition":2,"offset":-1}}]}}"#,
            PER_PARTITION + 90
        ),
    )
    .expect("write the offsets file");
    let run = kafka_tool(
        "kafka-delete-records",
        &[
            "--bootstrap-server",
            &b,
            "--offset-json-file",
            json.to_str().expect("utf-8 path"),
        ],
    );
    let out = run.ok();
    let line_of = |partition: i32| {
        out.lines()
            .find(|l| l.starts_with(&format!("partition: {topic}-{partition}\t")))
            .unwrap_or_else(|| panic!("no result for partition {partition}:\n{out}"))
    };
    assert!(line_of(0).ends_with("low_watermark: 4"), "{}", line_of(0));
    assert!(
        line_of(1).contains("OffsetOutOfRangeException"),
        "an offset beyond the HW: {}",
        line_of(1)
    );
    assert!(
        line_of(2).ends_with(&format!("low_watermark: {PER_PARTITION}")),
        "offset -1 deletes up to the HW: {}",
        line_of(2)
    );
    assert_eq!(
        get_offsets(&b, &topic, "-2"),
        BTreeMap::from([(0, 4), (1, 0), (2, PER_PARTITION)]),
        "low watermarks"
    );
}

/// kafka-log-dirs --describe: the Java admin client's describeLogDirs,
/// which sends DescribeLogDirs v5 (the newest both sides advertise) to
/// every broker and reads the hand-coded v5 answer. Every partition of the
/// topic is listed once, in a log directory without error, with the bytes
/// produced to it.
#[test]
fn log_dirs_describe() {
    let target = start_target();
    let b = target.bootstrap();
    let topic = target.name("cli-log-dirs");
    client::create_topic(&b, &topic, 3, &[]);
    let p = client::producer(&b, &[("acks", "all")]);
    for id in 0..3 {
        let m = message(id, format!("k{id}"), format!("v{id}"));
        p.send(
            rdkafka::producer::BaseRecord::with_opaque_to(&topic, id)
                .key(&m.key)
                .payload(&m.value)
                .partition(0),
        )
        .map_err(|(e, _)| e)
        .expect("enqueue");
    }
    acknowledged(&p, 3);
    let run = kafka_tool(
        "kafka-log-dirs",
        &[
            "--bootstrap-server",
            &b,
            "--describe",
            "--topic-list",
            &topic,
        ],
    );
    let out = run.ok();
    let json = out
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON in:\n{out}"));
    let v: serde_json::Value = serde_json::from_str(json).expect("kafka-log-dirs prints JSON");
    let mut sizes = BTreeMap::new();
    for broker in v["brokers"].as_array().expect("brokers") {
        for dir in broker["logDirs"].as_array().expect("logDirs") {
            assert!(dir["error"].is_null(), "{dir}");
            for part in dir["partitions"].as_array().expect("partitions") {
                let name = part["partition"].as_str().expect("partition name");
                let index: i32 = name
                    .strip_prefix(&format!("{topic}-"))
                    .and_then(|i| i.parse().ok())
                    .unwrap_or_else(|| panic!("a partition of another topic: {name}"));
                let size = part["size"].as_i64().expect("size");
                assert!(sizes.insert(index, size).is_none(), "{name} listed twice");
            }
        }
    }
    assert_eq!(sizes.keys().copied().collect::<Vec<_>>(), vec![0, 1, 2]);
    assert!(sizes[&0] > 0, "partition 0 holds three records: {sizes:?}");
}

// ---------------------------------------------------------------------------
// kafka-dump-log on segments fjord wrote.

/// How a phase of the dump test's producers writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum How {
    /// A plain (non-transactional) producer with this `compression.type`.
    Plain(&'static str),
    /// One transaction of the transactional producer, committed or not.
    Txn { commit: bool },
}

/// One phase: how, and how many records of [`DUMP_VALUE_BYTES`].
struct Phase {
    write: How,
    records: usize,
}

/// Size of each record's value: large enough that a few thousand records
/// roll several segments of Kafka's smallest `segment.bytes`.
const DUMP_VALUE_BYTES: usize = 4096;
/// Kafka's lower bound for `segment.bytes` (1 MiB).
const DUMP_SEGMENT_BYTES: usize = 1024 * 1024;

/// Plain, compressed and transactional batches, with a filler between the
/// aborted transactions so that they end in different segments: its 300
/// plain records of 4 KiB are more than one segment, so at least one roll
/// falls between the two ABORT markers wherever the first one landed.
const DUMP_PHASES: &[Phase] = &[
    Phase {
        write: How::Plain("none"),
        records: 300,
    },
    Phase {
        write: How::Plain("gzip"),
        records: 150,
    },
    Phase {
        write: How::Plain("lz4"),
        records: 150,
    },
    Phase {
        write: How::Plain("zstd"),
        records: 150,
    },
    Phase {
        write: How::Txn { commit: true },
        records: 40,
    },
    Phase {
        write: How::Txn { commit: false },
        records: 40,
    },
    Phase {
        write: How::Plain("none"),
        records: 300,
    },
    Phase {
        write: How::Txn { commit: false },
        records: 30,
    },
    Phase {
        write: How::Txn { commit: true },
        records: 30,
    },
];

/// The value of record `id`: words of a small vocabulary in a fixed
/// pseudo-random order, joined by `-` (no spaces, so kafka-dump-log's
/// `payload:` is one token). lz4 and zstd find the repeated words, so the
/// compressed batches stay compressed: librdkafka sends a batch uncompressed
/// when its codec does not make it smaller, which random letters would cause.
fn dump_value(id: usize) -> String {
    const WORDS: &[&str] = &[
        "fjord", "kafka", "segment", "offset", "batch", "record", "marker", "abort", "commit",
        "index", "shard", "leader", "replica", "epoch", "producer", "consumer",
    ];
    let mut x = (id as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut v = format!("id{id:05}");
    while v.len() < DUMP_VALUE_BYTES {
        // xorshift64: cheap and deterministic.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push('-');
        v.push_str(WORDS[(x % WORDS.len() as u64) as usize]);
    }
    v
}

/// One batch as kafka-dump-log prints it, with its records.
#[derive(Debug)]
struct DumpedBatch {
    fields: HashMap<String, String>,
    records: Vec<DumpedRecord>,
}

impl DumpedBatch {
    fn base(&self) -> i64 {
        num(&self.fields, "baseOffset")
    }
    fn last(&self) -> i64 {
        num(&self.fields, "lastOffset")
    }
    fn is_control(&self) -> bool {
        self.fields["isControl"] == "true"
    }
}

#[derive(Debug)]
struct DumpedRecord {
    offset: i64,
    key: Option<String>,
    payload: Option<String>,
    end_txn_marker: Option<String>,
}

/// The text of one file's section of a kafka-dump-log run, by path.
fn dump_sections(text: &str) -> BTreeMap<PathBuf, String> {
    let mut out: BTreeMap<PathBuf, String> = BTreeMap::new();
    let mut current: Option<PathBuf> = None;
    for line in text.lines() {
        if let Some(path) = line.strip_prefix("Dumping ") {
            current = Some(PathBuf::from(path.trim()));
            out.entry(current.clone().expect("path")).or_default();
        } else if let Some(p) = &current {
            let s = out.get_mut(p).expect("section");
            s.push_str(line);
            s.push('\n');
        }
    }
    out
}

/// The batches of a `.log` section printed with --deep-iteration
/// --print-data-log.
fn dumped_batches(section: &str) -> Vec<DumpedBatch> {
    let mut batches: Vec<DumpedBatch> = Vec::new();
    for line in section.lines() {
        if line.starts_with("baseOffset:") {
            batches.push(DumpedBatch {
                fields: space_fields(line),
                records: Vec::new(),
            });
        } else if line.starts_with("| offset:") {
            let f = space_fields(line);
            let batch = batches
                .last_mut()
                .expect("a record line after its batch line");
            batch.records.push(DumpedRecord {
                offset: num(&f, "offset"),
                key: f.get("key").cloned(),
                payload: f.get("payload").cloned(),
                end_txn_marker: f.get("endTxnMarker").cloned(),
            });
        }
    }
    batches
}

/// `(first, second)` numbers of every line `first_key: A second_key: B` of a
/// section (`.index`: offset/position, `.timeindex`: timestamp/offset).
fn index_entries(section: &str, first_key: &str, second_key: &str) -> Vec<(i64, i64)> {
    section
        .lines()
        .filter(|l| l.starts_with(&format!("{first_key}:")))
        .map(|l| {
            let f = space_fields(l);
            (num(&f, first_key), num(&f, second_key))
        })
        .collect()
}

/// The offset a segment file's name gives (its base offset).
fn file_base_offset(path: &Path) -> i64 {
    path.file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{} is not named by an offset", path.display()))
}

/// Files of `dir` that end in `.ext`, sorted by name (so by base offset).
fn files_with(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    v.sort();
    v
}

/// Non-empty `.log` files of every partition of an internal topic.
fn internal_logs(data_dir: &Path, topic: &str) -> Vec<PathBuf> {
    let mut logs = Vec::new();
    for entry in std::fs::read_dir(data_dir).expect("read the data dir") {
        let path = entry.expect("dir entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name
            .strip_prefix(topic)
            .is_some_and(|rest| rest.starts_with('-'))
        {
            for log in files_with(&path, "log") {
                if std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0) > 0 {
                    logs.push(log);
                }
            }
        }
    }
    logs.sort();
    logs
}

/// Asserts a kafka-dump-log run ended well and reported no damage.
fn assert_clean_dump(run: &ChildRun) -> &str {
    let out = run.ok();
    for text in [out, run.stderr.as_str()] {
        let lower = text.to_lowercase();
        for bad in [
            "exception",
            "corrupt",
            "isvalid: false",
            "mismatch",
            "out of order",
        ] {
            assert!(
                !lower.contains(bad),
                "`{}` reported {bad:?}:\n{}",
                run.command,
                text.lines()
                    .filter(|l| l.to_lowercase().contains(bad))
                    .take(20)
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
    }
    out
}

/// kafka-dump-log --files on every `.log`, `.index`, `.timeindex` and
/// `.txnindex` of a partition fjord rolled over several segments with
/// plain, gzip, lz4, zstd and transactional (committed and aborted)
/// batches, after a clean stop; then the offsets and transaction-log
/// decoders on `__consumer_offsets` and `__transaction_state`.
#[test]
fn dump_log_reads_fjord_segments() {
    const TOPIC: &str = "cli-dump";
    const TXN_ID: &str = "cli-dump-txn";
    const GROUP: &str = "cli-dump-group";
    const GROUP_OFFSET: i64 = 123;
    let mut broker = Broker::start(broker_opts());
    let b = broker.bootstrap();
    client::create_topic(
        &b,
        TOPIC,
        1,
        &[("segment.bytes", &DUMP_SEGMENT_BYTES.to_string())],
    );

    // What was acknowledged: offset → (phase, id), and each phase's offsets.
    let mut sent: BTreeMap<i64, (usize, usize)> = BTreeMap::new();
    let mut phase_offsets: Vec<Vec<i64>> = Vec::new();
    let batching = [("linger.ms", "5"), ("batch.size", "131072")];
    let txn_producer = client::producer(
        &b,
        &[
            &batching[..],
            &[
                ("transactional.id", TXN_ID),
                ("transaction.timeout.ms", "60000"),
            ],
        ]
        .concat(),
    );
    txn_producer
        .init_transactions(CLIENT_TIMEOUT)
        .expect("init_transactions");
    let mut txn_sent = 0;
    let mut next_id = 0;
    for (phase_index, phase) in DUMP_PHASES.iter().enumerate() {
        let messages: Vec<TestMessage> = (next_id..next_id + phase.records)
            .map(|id| message(id, format!("key{id:05}"), dump_value(id)))
            .collect();
        next_id += phase.records;
        let acked = match phase.write {
            How::Plain(codec) => produce(
                &b,
                TOPIC,
                &messages,
                &[&batching[..], &[("compression.type", codec)]].concat(),
            ),
            How::Txn { commit } => {
                txn_producer.begin_transaction().expect("begin");
                for m in &messages {
                    client::send(&txn_producer, TOPIC, m);
                }
                txn_sent += messages.len();
                // Every record is acknowledged (so its offset known) before
                // the transaction ends.
                let all = acknowledged(&txn_producer, txn_sent);
                if commit {
                    txn_producer
                        .commit_transaction(CLIENT_TIMEOUT)
                        .expect("commit");
                } else {
                    txn_producer
                        .abort_transaction(CLIENT_TIMEOUT)
                        .expect("abort");
                }
                messages.iter().map(|m| (m.id, all[&m.id])).collect()
            }
        };
        let mut offsets = Vec::new();
        for m in &messages {
            let (partition, offset) = acked[&m.id];
            assert_eq!(partition, 0);
            assert!(
                sent.insert(offset, (phase_index, m.id)).is_none(),
                "offset {offset} twice"
            );
            offsets.push(offset);
        }
        offsets.sort();
        phase_offsets.push(offsets);
    }
    drop(txn_producer);

    // A group commit, for the offsets decoder.
    let committer = client::consumer(&b, &[("group.id", GROUP)]);
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(TOPIC, 0, Offset::Offset(GROUP_OFFSET))
        .expect("tpl");
    committer
        .commit(&tpl, CommitMode::Sync)
        .expect("commit offsets");
    drop(committer);

    // A clean stop seals every segment: truncated to its logical end, with
    // its indexes written.
    broker.stop();

    let dir = broker.data_dir().join(format!("{TOPIC}-0"));
    let logs = files_with(&dir, "log");
    assert!(logs.len() >= 3, "several segments rolled: {logs:?}");
    let mut files = Vec::new();
    for ext in ["log", "index", "timeindex", "txnindex"] {
        files.extend(files_with(&dir, ext));
    }
    let file_list = files
        .iter()
        .map(|p| p.to_str().expect("utf-8 path").to_string())
        .collect::<Vec<_>>()
        .join(",");
    let run = kafka_tool(
        "kafka-dump-log",
        &[
            "--deep-iteration",
            "--print-data-log",
            "--files",
            &file_list,
        ],
    );
    let sections = dump_sections(assert_clean_dump(&run));
    for f in &files {
        assert!(
            sections.contains_key(f),
            "kafka-dump-log dumped {}",
            f.display()
        );
    }

    // Batches, segment by segment: contiguous from offset 0, each segment
    // starting at the offset in its name.
    let segment_bases: Vec<i64> = logs.iter().map(|l| file_base_offset(l)).collect();
    let mut batches_by_segment: BTreeMap<i64, Vec<DumpedBatch>> = BTreeMap::new();
    let mut expected_next = 0;
    for log in &logs {
        let batches = dumped_batches(&sections[log]);
        assert!(!batches.is_empty(), "{} has batches", log.display());
        assert_eq!(
            batches[0].base(),
            file_base_offset(log),
            "{} starts at its name",
            log.display()
        );
        for batch in &batches {
            assert_eq!(
                batch.base(),
                expected_next,
                "no gap before batch {:?}",
                batch.fields
            );
            assert_eq!(
                num(&batch.fields, "count"),
                batch.last() - batch.base() + 1,
                "count of {:?}",
                batch.fields
            );
            let offsets: Vec<i64> = batch.records.iter().map(|r| r.offset).collect();
            assert_eq!(
                offsets,
                (batch.base()..=batch.last()).collect::<Vec<_>>(),
                "--deep-iteration shows every record of {:?}",
                batch.fields
            );
            expected_next = batch.last() + 1;
        }
        batches_by_segment.insert(file_base_offset(log), batches);
    }

    // Data batches: each holds records of one phase, with that phase's
    // codec and transactional flag, and every record is the one acknowledged
    // at its offset. Control batches: one marker per transaction, right
    // after its last record.
    let mut txn_pids = BTreeSet::new();
    let mut data_offsets = BTreeSet::new();
    let mut markers: Vec<(i64, String)> = Vec::new();
    for batch in batches_by_segment.values().flatten() {
        if batch.is_control() {
            assert_eq!(batch.records.len(), 1, "one marker per control batch");
            let marker = batch.records[0]
                .end_txn_marker
                .clone()
                .unwrap_or_else(|| panic!("control record without endTxnMarker: {batch:?}"));
            assert_eq!(batch.fields["isTransactional"], "true");
            txn_pids.insert(num(&batch.fields, "producerId"));
            markers.push((batch.base(), marker));
            continue;
        }
        let (phase, _) = sent.get(&batch.base()).unwrap_or_else(|| {
            panic!(
                "batch {:?} starts at an unacknowledged offset",
                batch.fields
            )
        });
        let (last_phase, _) = sent
            .get(&batch.last())
            .unwrap_or_else(|| panic!("batch {:?} ends at an unacknowledged offset", batch.fields));
        assert_eq!(phase, last_phase, "batch {:?} mixes phases", batch.fields);
        let (codec, transactional) = match DUMP_PHASES[*phase].write {
            How::Plain(codec) => (codec, false),
            How::Txn { .. } => ("none", true),
        };
        assert_eq!(
            batch.fields["compresscodec"], codec,
            "codec of {:?}",
            batch.fields
        );
        assert_eq!(
            batch.fields["isTransactional"],
            transactional.to_string(),
            "transactional flag of {:?}",
            batch.fields
        );
        if transactional {
            txn_pids.insert(num(&batch.fields, "producerId"));
        }
        for r in &batch.records {
            let (_, id) = sent
                .get(&r.offset)
                .unwrap_or_else(|| panic!("record at {} was never acknowledged", r.offset));
            assert_eq!(
                r.key.as_deref(),
                Some(format!("key{id:05}").as_str()),
                "key at {}",
                r.offset
            );
            assert!(
                r.payload.as_deref() == Some(dump_value(*id).as_str()),
                "the payload at offset {} is record {id}'s",
                r.offset
            );
            data_offsets.insert(r.offset);
        }
    }
    assert_eq!(
        data_offsets,
        sent.keys().copied().collect::<BTreeSet<_>>(),
        "every acknowledged record is in the dump, and nothing else"
    );
    assert_eq!(
        txn_pids.len(),
        1,
        "one transactional producer: {txn_pids:?}"
    );
    let txn_pid = *txn_pids.first().expect("pid");
    let expected_markers: Vec<(i64, String)> = DUMP_PHASES
        .iter()
        .zip(&phase_offsets)
        .filter_map(|(phase, offsets)| match phase.write {
            How::Txn { commit } => Some((
                offsets.last().expect("records") + 1,
                if commit { "COMMIT" } else { "ABORT" }.to_string(),
            )),
            How::Plain(_) => None,
        })
        .collect();
    assert_eq!(
        markers, expected_markers,
        "COMMIT/ABORT markers after each transaction"
    );
    let codecs_seen: BTreeSet<&str> = batches_by_segment
        .values()
        .flatten()
        .map(|b| b.fields["compresscodec"].as_str())
        .collect();
    assert_eq!(codecs_seen, BTreeSet::from(["gzip", "lz4", "none", "zstd"]));

    // .txnindex: the aborted transactions, each in the segment that holds
    // its ABORT marker.
    let segment_of = |offset: i64| {
        *segment_bases
            .iter()
            .rev()
            .find(|&&base| base <= offset)
            .expect("a segment holds the offset")
    };
    let mut aborted = Vec::new();
    for txnindex in files_with(&dir, "txnindex") {
        for line in sections[&txnindex]
            .lines()
            .filter(|l| l.contains("producerId"))
        {
            let f = space_fields(line);
            let last = num(&f, "lastOffset");
            assert_eq!(
                segment_of(last),
                file_base_offset(&txnindex),
                "{} holds the abort at {last}",
                txnindex.display()
            );
            aborted.push((
                num(&f, "producerId"),
                num(&f, "firstOffset"),
                last,
                num(&f, "lastStableOffset"),
            ));
        }
    }
    let expected_aborted: Vec<(i64, i64, i64, i64)> = DUMP_PHASES
        .iter()
        .zip(&phase_offsets)
        .filter(|(phase, _)| phase.write == How::Txn { commit: false })
        .map(|(_, offsets)| {
            let marker = offsets.last().expect("records") + 1;
            (txn_pid, offsets[0], marker, marker + 1)
        })
        .collect();
    assert_eq!(
        aborted, expected_aborted,
        ".txnindex lists (producerId, firstOffset, lastOffset, lastStableOffset) of each abort"
    );
    assert!(
        segment_of(expected_aborted[0].2) != segment_of(expected_aborted[1].2),
        "the two aborts are in different segments (the filler rolled one)"
    );

    // .index: every entry points at the batch whose last offset it names;
    // .timeindex: every entry names an offset of its segment and the max
    // timestamp of the batch holding it.
    for (log, base) in logs.iter().zip(&segment_bases) {
        let batches = &batches_by_segment[base];
        let index = log.with_extension("index");
        let timeindex = log.with_extension("timeindex");
        for (offset, position) in index_entries(&sections[&index], "offset", "position") {
            let batch = batches
                .iter()
                .find(|b| num(&b.fields, "position") == position)
                .unwrap_or_else(|| panic!("{}: no batch at position {position}", index.display()));
            assert_eq!(
                batch.last(),
                offset,
                "{}: entry {offset} → {position}",
                index.display()
            );
        }
        let mut previous = (i64::MIN, i64::MIN);
        for (timestamp, offset) in index_entries(&sections[&timeindex], "timestamp", "offset") {
            let batch = batches
                .iter()
                .find(|b| b.base() <= offset && offset <= b.last())
                .unwrap_or_else(|| {
                    panic!(
                        "{}: offset {offset} not in its segment",
                        timeindex.display()
                    )
                });
            assert_eq!(
                num(&batch.fields, "CreateTime"),
                timestamp,
                "{}: entry {timestamp} → {offset}",
                timeindex.display()
            );
            assert!(
                timestamp >= previous.0 && offset > previous.1,
                "{}: entries increase",
                timeindex.display()
            );
            previous = (timestamp, offset);
        }
    }

    // The group's commit through the offsets decoder.
    let offset_logs = internal_logs(&broker.data_dir(), "__consumer_offsets");
    assert!(!offset_logs.is_empty(), "__consumer_offsets has data");
    let paths: Vec<&str> = offset_logs
        .iter()
        .map(|p| p.to_str().expect("utf-8"))
        .collect();
    let run = kafka_tool(
        "kafka-dump-log",
        &["--offsets-decoder", "--files", &paths.join(",")],
    );
    let out = assert_clean_dump(&run);
    let key = format!(r#"{{"group":"{GROUP}","topic":"{TOPIC}","partition":0}}"#);
    let commit_line = out
        .lines()
        .find(|l| l.contains(&key))
        .unwrap_or_else(|| panic!("the offsets decoder shows {key}"));
    assert!(
        commit_line.contains(&format!(r#""offset":{GROUP_OFFSET},"#)),
        "the committed offset: {commit_line}"
    );

    // The transactional id's history through the transaction-log decoder.
    let txn_logs = internal_logs(&broker.data_dir(), "__transaction_state");
    assert!(!txn_logs.is_empty(), "__transaction_state has data");
    let paths: Vec<&str> = txn_logs
        .iter()
        .map(|p| p.to_str().expect("utf-8"))
        .collect();
    let run = kafka_tool(
        "kafka-dump-log",
        &["--transaction-log-decoder", "--files", &paths.join(",")],
    );
    let out = assert_clean_dump(&run);
    let key = format!(r#"{{"transactionalId":"{TXN_ID}"}}"#);
    let txn_lines: Vec<&str> = out.lines().filter(|l| l.contains(&key)).collect();
    assert!(
        !txn_lines.is_empty(),
        "the transaction-log decoder shows {key}"
    );
    for state in [
        "Empty",
        "Ongoing",
        "PrepareCommit",
        "CompleteCommit",
        "PrepareAbort",
        "CompleteAbort",
    ] {
        assert!(
            txn_lines
                .iter()
                .any(|l| l.contains(&format!(r#""transactionStatus":"{state}""#))),
            "a {state} record for {TXN_ID}"
        );
    }
    assert!(
        txn_lines
            .iter()
            .all(|l| l.contains(&format!(r#""producerId":{txn_pid},"#))),
        "every record of {TXN_ID} names producer {txn_pid}"
    );
    assert!(
        txn_lines
            .iter()
            .any(|l| l.contains(&format!(r#""topic":"{TOPIC}","partitionIds":[0]"#))),
        "an ongoing transaction lists {TOPIC}-0"
    );
}

/// Replication factors as Connect and Schema Registry ask for them, through
/// kafka-topics (the Java admin client): each of fjord's shards is
/// advertised as a broker, so a factor up to the shard count is accepted
/// as Kafka accepts it on that many brokers, and the topic has one replica
/// per partition, which --describe shows (docs/replication-factor.md).
/// Schema Registry asks for min(3, brokers); Connect's internal topics for
/// 3. Above the broker count: Kafka's INVALID_REPLICATION_FACTOR message.
#[test]
fn replication_factors_of_connect_and_schema_registry_on_one_node() {
    let broker = Broker::start(broker_opts().cores(3));
    let b = broker.bootstrap();
    let bs = ["--bootstrap-server", b.as_str()];
    let topics = |args: &[&str]| kafka_tool("kafka-topics", &[&bs[..], args].concat());
    for (topic, rf) in [("_schemas", "3"), ("connect-configs", "3"), ("rf-two", "2")] {
        let out = topics(&[
            "--create",
            "--topic",
            topic,
            "--partitions",
            "1",
            "--replication-factor",
            rf,
            "--config",
            "cleanup.policy=delete",
        ]);
        assert!(
            out.ok().contains(&format!("Created topic {topic}.")),
            "RF {rf} accepted"
        );
        let described = topics(&["--describe", "--topic", topic]);
        let header = described
            .ok()
            .lines()
            .map(tab_fields)
            .find(|f| f.contains_key("PartitionCount"))
            .expect("a topic line");
        assert_eq!(num(&header, "ReplicationFactor"), 1, "{topic}: one replica");
    }
    let out = topics(&[
        "--create",
        "--topic",
        "rf-four",
        "--partitions",
        "1",
        "--replication-factor",
        "4",
    ]);
    assert!(!out.success(), "RF 4 on 3 advertised brokers is refused");
    let message =
        "The target replication factor of 4 cannot be reached because only 3 broker(s) are registered";
    assert!(
        out.stdout.contains(message) || out.stderr.contains(message),
        "Kafka's message"
    );
}

/// `kafka-configs` manages SCRAM users as against Kafka: `--alter
/// --add-config 'SCRAM-SHA-256=[iterations=8192,password=...]'` (the Java
/// admin client salts the password and sends AlterUserScramCredentials),
/// `--describe` shows the mechanism and iterations, and the user then
/// authenticates with SCRAM-SHA-256 on the SASL_PLAINTEXT listener
/// (`kafka-topics --command-config`); a wrong password does not.
#[test]
fn configs_add_and_describe_a_scram_user_that_then_authenticates() {
    let sasl_port = common::free_port_base(2);
    let broker = Broker::start(
        broker_opts()
            .arg("--listener")
            .arg(format!("SASL_PLAINTEXT://127.0.0.1:{sasl_port}")),
    );
    let b = broker.bootstrap();
    let out = kafka_tool(
        "kafka-configs",
        &[
            "--bootstrap-server",
            &b,
            "--alter",
            "--add-config",
            "SCRAM-SHA-256=[iterations=8192,password=alice-secret]",
            "--entity-type",
            "users",
            "--entity-name",
            "alice",
        ],
    );
    assert!(out.success(), "kafka-configs --alter: {}", out.stderr);
    let out = kafka_tool(
        "kafka-configs",
        &[
            "--bootstrap-server",
            &b,
            "--describe",
            "--entity-type",
            "users",
            "--entity-name",
            "alice",
        ],
    );
    assert!(out.success(), "kafka-configs --describe: {}", out.stderr);
    assert!(
        out.stdout.contains("SCRAM-SHA-256=iterations=8192"),
        "{}",
        out.stdout
    );

    let dir = tempfile::tempdir().unwrap();
    let props = |password: &str| {
        let path = dir.path().join(format!("client-{password}.properties"));
        std::fs::write(
            &path,
            format!(
                "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-256\n\
                 sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule \
                 required username=\"alice\" password=\"{password}\";\n"
            ),
        )
        .unwrap();
        path.display().to_string()
    };
    let sasl_bootstrap = format!("127.0.0.1:{sasl_port}");
    let good = props("alice-secret");
    let out = kafka_tool(
        "kafka-topics",
        &[
            "--bootstrap-server",
            &sasl_bootstrap,
            "--command-config",
            &good,
            "--create",
            "--topic",
            "scram-cli",
            "--partitions",
            "2",
        ],
    );
    assert!(out.success(), "kafka-topics as alice: {}", out.stderr);
    let bad = props("not-alice-secret");
    let out = kafka_tool(
        "kafka-topics",
        &[
            "--bootstrap-server",
            &sasl_bootstrap,
            "--command-config",
            &bad,
            "--list",
        ],
    );
    assert!(!out.success(), "a wrong password is refused");
    let all = format!("{}{}", out.stdout, out.stderr);
    let refused = "Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-256";
    assert!(
        all.contains("SaslAuthenticationException") && all.contains(refused),
        "{all}"
    );

    // Deleted, the credential no longer logs in.
    let out = kafka_tool(
        "kafka-configs",
        &[
            "--bootstrap-server",
            &b,
            "--alter",
            "--delete-config",
            "SCRAM-SHA-256",
            "--entity-type",
            "users",
            "--entity-name",
            "alice",
        ],
    );
    assert!(
        out.success(),
        "kafka-configs --delete-config: {}",
        out.stderr
    );
    let out = kafka_tool(
        "kafka-topics",
        &[
            "--bootstrap-server",
            &sasl_bootstrap,
            "--command-config",
            &good,
            "--list",
        ],
    );
    assert!(!out.success(), "a deleted user is refused");
    assert!(format!("{}{}", out.stdout, out.stderr).contains(refused));
}

/// kafka-acls: --add (PREFIXED allow, literal deny), --list, --remove
/// against fjord with `--authorizer standard` (ANONYMOUS a super user to
/// manage them), and the ACLs read back from the metadata log after a
/// restart.
#[test]
fn acls_add_list_remove_survive_restart() {
    let mut broker = Broker::start(
        BrokerOpts::default()
            .cores(1)
            .arg("--authorizer=standard")
            .arg("--super-users=User:ANONYMOUS;User:admin"),
    );
    let b = broker.bootstrap();
    let acls = |args: &[&str]| {
        let mut all = vec!["--bootstrap-server", b.as_str()];
        all.extend_from_slice(args);
        kafka_tool("kafka-acls", &all).ok().to_string()
    };
    acls(&[
        "--add",
        "--allow-principal",
        "User:alice",
        "--operation",
        "Read",
        "--operation",
        "Write",
        "--topic",
        "orders",
        "--resource-pattern-type",
        "prefixed",
    ]);
    acls(&[
        "--add",
        "--deny-principal",
        "User:bob",
        "--operation",
        "All",
        "--group",
        "g1",
    ]);
    let listed = acls(&["--list"]);
    assert!(
        listed.contains("name=orders, patternType=PREFIXED"),
        "{listed}"
    );
    assert!(
        listed.contains("principal=User:alice, host=*, operation=WRITE, permissionType=ALLOW"),
        "{listed}"
    );
    assert!(
        listed.contains("principal=User:bob, host=*, operation=ALL, permissionType=DENY"),
        "{listed}"
    );
    acls(&[
        "--remove",
        "--force",
        "--allow-principal",
        "User:alice",
        "--operation",
        "Write",
        "--topic",
        "orders",
        "--resource-pattern-type",
        "prefixed",
    ]);
    broker.restart();
    let listed = acls(&["--list"]);
    assert!(
        listed.contains("principal=User:alice, host=*, operation=READ, permissionType=ALLOW"),
        "{listed}"
    );
    assert!(!listed.contains("operation=WRITE"), "{listed}");
    assert!(listed.contains("principal=User:bob"), "{listed}");
}
