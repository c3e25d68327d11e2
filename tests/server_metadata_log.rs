//! The metadata log on Raft (`metadata::store`: a raft-rs quorum of one,
//! `__cluster_metadata/raft.log`) against a real broker: topics, partition
//! counts, topic configs, ACLs and SCRAM credentials survive a kill -9 and
//! a clean restart through it; a kill -9 while topics are being created
//! loses none that was acknowledged; a data dir of the old one-JSON-line
//! `metadata.log` is migrated once into the Raft log. (Damage to the Raft
//! log: `tests/server_durability.rs`.)

mod common;

use common::client::{
    admin, admin_opts, block_on, consumer, create_topic, CLIENT_REQUEST_TIMEOUT_MS,
};
use common::raw::RawClient;
use common::{wait_for, Broker, BrokerOpts};
use fjord::auth::acl::{AclBinding, AclOperation, AclPermission, PatternType, ResourceType};
use fjord::auth::scram::ScramMechanism;
use fjord::metadata::MetadataRecord;
use kafka_protocol::messages::alter_user_scram_credentials_request::ScramCredentialUpsertion;
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use rdkafka::admin::{
    AlterConfig, ConfigSource, NewPartitions, NewTopic, ResourceSpecifier, TopicReplication,
};
use rdkafka::consumer::Consumer;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const SUPER_ANONYMOUS: &str = "--super-users=User:ANONYMOUS";

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// A broker whose ACL APIs work: the standard authorizer, ANONYMOUS a
/// super user.
fn opts(cores: usize) -> BrokerOpts {
    BrokerOpts::default()
        .cores(cores)
        .arg("--authorizer=standard")
        .arg(SUPER_ANONYMOUS)
}

/// Everything the metadata log holds that a client can read back.
#[derive(Debug, PartialEq)]
struct State {
    /// Topic (internal ones left out) → partition count.
    topics: BTreeMap<String, usize>,
    /// Topic → its overrides (DescribeConfigs, source DYNAMIC_TOPIC_CONFIG).
    configs: BTreeMap<String, BTreeMap<String, String>>,
    /// Every ACL, as `type/name/pattern principal host operation permission`.
    acls: BTreeSet<String>,
    /// Every SCRAM credential: (user, mechanism, iterations).
    scram: BTreeSet<(String, i8, i32)>,
}

fn state(broker: &Broker) -> State {
    let md = consumer(&broker.bootstrap(), &[])
        .fetch_metadata(None, Duration::from_millis(CLIENT_REQUEST_TIMEOUT_MS))
        .expect("metadata");
    let topics: BTreeMap<String, usize> = md
        .topics()
        .iter()
        .filter(|t| !t.name().starts_with("__"))
        .map(|t| (t.name().to_string(), t.partitions().len()))
        .collect();
    let a = admin(&broker.bootstrap());
    let mut configs = BTreeMap::new();
    for name in topics.keys() {
        let results =
            block_on(a.describe_configs([&ResourceSpecifier::Topic(name)], &admin_opts()))
                .expect("describe_configs");
        let resource = results[0].as_ref().expect("describe succeeded");
        let overrides: BTreeMap<String, String> = resource
            .entries
            .iter()
            .filter(|e| matches!(e.source, ConfigSource::DynamicTopic))
            .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
            .collect();
        configs.insert(name.clone(), overrides);
    }
    let mut raw = RawClient::connect(broker.port);
    let described = raw.request(
        3,
        &DescribeAclsRequest::default()
            .with_resource_type_filter(1)
            .with_resource_name_filter(None)
            .with_pattern_type_filter(1)
            .with_principal_filter(None)
            .with_host_filter(None)
            .with_operation(1)
            .with_permission_type(1),
    );
    assert_eq!(described.error_code, 0, "{:?}", described.error_message);
    let mut acls = BTreeSet::new();
    for r in &described.resources {
        for d in &r.acls {
            acls.insert(format!(
                "{}/{}/{} {} {} {} {}",
                r.resource_type,
                r.resource_name.as_str(),
                r.pattern_type,
                d.principal.as_str(),
                d.host.as_str(),
                d.operation,
                d.permission_type
            ));
        }
    }
    let users = raw.request(0, &DescribeUserScramCredentialsRequest::default());
    assert_eq!(users.error_code, 0, "{:?}", users.error_message);
    let scram = users
        .results
        .iter()
        .flat_map(|u| {
            u.credential_infos
                .iter()
                .map(|c| (u.user.to_string(), c.mechanism, c.iterations))
        })
        .collect();
    State {
        topics,
        configs,
        acls,
        scram,
    }
}

fn raft_log(data_dir: &Path) -> std::path::PathBuf {
    data_dir.join("__cluster_metadata/raft.log")
}

fn old_log(data_dir: &Path) -> std::path::PathBuf {
    data_dir.join("__cluster_metadata/metadata.log")
}

/// How often `needle` occurs in `bytes`.
fn occurrences(bytes: &[u8], needle: &str) -> usize {
    bytes
        .windows(needle.len())
        .filter(|w| *w == needle.as_bytes())
        .count()
}

#[test]
fn topics_configs_acls_and_scram_credentials_survive_restarts_through_the_raft_log() {
    let mut broker = Broker::start(opts(2));
    let bootstrap = broker.bootstrap();
    create_topic(&bootstrap, "ml-a", 3, &[("retention.ms", "123456")]);
    create_topic(&bootstrap, "ml-b", 1, &[]);
    create_topic(&bootstrap, "ml-gone", 1, &[]);
    let a = admin(&bootstrap);
    let grown = block_on(a.create_partitions(&[NewPartitions::new("ml-b", 2)], &admin_opts()))
        .expect("create_partitions");
    assert!(grown[0].is_ok(), "{grown:?}");
    let altered = block_on(a.alter_configs(
        &[AlterConfig::new(ResourceSpecifier::Topic("ml-b")).set("cleanup.policy", "compact")],
        &admin_opts(),
    ))
    .expect("alter_configs");
    assert!(altered[0].is_ok(), "{altered:?}");
    let deleted = block_on(a.delete_topics(&["ml-gone"], &admin_opts())).expect("delete_topics");
    assert!(deleted[0].is_ok(), "{deleted:?}");
    let mut raw = RawClient::connect(broker.port);
    let created = raw.request(
        3,
        &CreateAclsRequest::default().with_creations(vec![AclCreation::default()
            .with_resource_type(2)
            .with_resource_name(s("ml-a"))
            .with_resource_pattern_type(3)
            .with_principal(s("User:alice"))
            .with_host(s("*"))
            .with_operation(3)
            .with_permission_type(3)]),
    );
    assert_eq!(created.results[0].error_code, 0, "{:?}", created.results[0]);
    let m = ScramMechanism::Sha512;
    let salt = b"salt-of-the-metadata-log-test".to_vec();
    let upserted = raw.request(
        0,
        &AlterUserScramCredentialsRequest::default().with_upsertions(vec![
            ScramCredentialUpsertion::default()
                .with_name(s("alice"))
                .with_mechanism(m.type_id())
                .with_iterations(8192)
                .with_salt(salt.clone().into())
                .with_salted_password(m.salted_password(b"pw", &salt, 8192).into()),
        ]),
    );
    assert_eq!(
        upserted.results[0].error_code, 0,
        "{:?}",
        upserted.results[0]
    );

    let before = state(&broker);
    assert_eq!(
        before.topics,
        BTreeMap::from([("ml-a".to_string(), 3), ("ml-b".to_string(), 2)])
    );
    assert_eq!(before.configs["ml-a"]["retention.ms"], "123456");
    assert_eq!(before.configs["ml-b"]["cleanup.policy"], "compact");
    assert_eq!(before.acls.len(), 1, "{:?}", before.acls);
    assert_eq!(
        before.scram,
        BTreeSet::from([("alice".to_string(), 2, 8192)])
    );
    let data_dir = broker.data_dir();
    assert!(raft_log(&data_dir).exists());
    assert!(!old_log(&data_dir).exists(), "nothing writes the old log");

    broker.kill9();
    broker.restart();
    assert_eq!(state(&broker), before, "after a kill -9");
    broker.stop();
    broker.restart();
    assert_eq!(state(&broker), before, "after a clean stop");
}

/// Creates 2-partition topics `<prefix>-<i>` one after the other until
/// `stop` is set or a creation fails, recording each acknowledged one.
fn create_until_stopped(
    bootstrap: String,
    prefix: String,
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<String>>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let a = admin(&bootstrap);
        let opts = rdkafka::admin::AdminOptions::new()
            .request_timeout(Some(Duration::from_secs(5)))
            .operation_timeout(Some(Duration::from_secs(5)));
        for i in 0.. {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            let name = format!("{prefix}-{i}");
            let nt = NewTopic::new(&name, 2, TopicReplication::Fixed(1));
            match block_on(a.create_topics([&nt], &opts)) {
                Ok(r) if r[0].is_ok() => acked.lock().unwrap().push(name),
                _ => break,
            }
        }
    })
}

/// kill -9 while a client creates topics back to back (so most likely in
/// the middle of one's proposal, fdatasync or broadcast), three times:
/// every topic whose creation was acknowledged is there after the restart,
/// with its partitions; one in flight is there whole or not at all.
#[test]
fn kill9_in_the_middle_of_topic_creation_loses_no_acknowledged_topic() {
    let mut broker = Broker::start(BrokerOpts::default().cores(2));
    let acked = Arc::new(Mutex::new(Vec::new()));
    for cycle in 0..3 {
        let stop = Arc::new(AtomicBool::new(false));
        let before = acked.lock().unwrap().len();
        let creator = create_until_stopped(
            broker.bootstrap(),
            format!("k9-{cycle}"),
            stop.clone(),
            acked.clone(),
        );
        wait_for(Duration::from_secs(60), "topics acknowledged", || {
            (acked.lock().unwrap().len() >= before + 4).then_some(())
        });
        broker.kill9();
        stop.store(true, Ordering::SeqCst);
        creator.join().unwrap();
        broker.restart();
        let md = consumer(&broker.bootstrap(), &[])
            .fetch_metadata(None, Duration::from_millis(CLIENT_REQUEST_TIMEOUT_MS))
            .expect("metadata");
        let present: BTreeMap<String, usize> = md
            .topics()
            .iter()
            .filter(|t| t.name().starts_with("k9-"))
            .map(|t| (t.name().to_string(), t.partitions().len()))
            .collect();
        for name in acked.lock().unwrap().iter() {
            assert_eq!(
                present.get(name),
                Some(&2),
                "{name} after cycle {cycle}: {present:?}"
            );
        }
        for (name, partitions) in &present {
            assert_eq!(*partitions, 2, "{name} is whole");
        }
    }
    // The log still takes changes.
    create_topic(&broker.bootstrap(), "k9-after", 1, &[]);
}

/// One line of the old `metadata.log` (`<crc32c as 8 hex digits> <json>`),
/// as fjord wrote it before the Raft log.
fn old_line(record: &MetadataRecord) -> String {
    let json = serde_json::to_string(record).unwrap();
    format!("{:08x} {json}\n", crc32c::crc32c(json.as_bytes()))
}

/// A data dir with only the old `metadata.log` (and a torn last line, as a
/// crash left it) starts with every record of it, now in the Raft log; the
/// old file is kept as `metadata.log.migrated`, and the next start does not
/// migrate again.
#[test]
fn an_old_metadata_log_is_migrated_into_the_raft_log_once() {
    let mut broker = Broker::start(opts(1));
    broker.stop();
    let data_dir = broker.data_dir();
    std::fs::remove_file(raft_log(&data_dir)).unwrap();
    let records = [
        MetadataRecord::CreateTopic {
            name: "mig-a".into(),
            id: [3; 16],
            shards: vec![0, 0],
            configs: BTreeMap::from([("retention.ms".to_string(), "654321".to_string())]),
            node: None,
            replicated: Vec::new(),
        },
        MetadataRecord::CreateTopic {
            name: "mig-gone".into(),
            id: [4; 16],
            shards: vec![0],
            configs: BTreeMap::new(),
            node: None,
            replicated: Vec::new(),
        },
        MetadataRecord::DeleteTopic {
            name: "mig-gone".into(),
        },
        MetadataRecord::ProducerIdBlock { next: 5000 },
        MetadataRecord::LeaderEpoch { epoch: 4 },
        MetadataRecord::UserScramCredential {
            name: "bob".into(),
            mechanism: ScramMechanism::Sha256.type_id(),
            credential: ScramMechanism::Sha256.new_credential("bob-pw", 4096),
        },
        MetadataRecord::CreateAcls {
            acls: vec![AclBinding {
                resource_type: ResourceType::Topic,
                resource_name: "mig-a".into(),
                pattern_type: PatternType::Literal,
                principal: "User:bob".into(),
                host: "*".into(),
                operation: AclOperation::Write,
                permission: AclPermission::Allow,
            }],
        },
    ];
    let old: String = records.iter().map(old_line).collect();
    let torn = old_line(&MetadataRecord::DeleteTopic {
        name: "mig-a".into(),
    });
    std::fs::write(
        old_log(&data_dir),
        format!("{old}{}", &torn[..torn.len() / 2]),
    )
    .unwrap();

    broker.restart();
    let migrated = state(&broker);
    assert_eq!(
        migrated.topics,
        BTreeMap::from([("mig-a".to_string(), 2)]),
        "the torn last line was not applied"
    );
    assert_eq!(migrated.configs["mig-a"]["retention.ms"], "654321");
    assert_eq!(
        migrated.acls,
        BTreeSet::from(["2/mig-a/3 User:bob * 4 3".to_string()])
    );
    assert_eq!(
        migrated.scram,
        BTreeSet::from([("bob".to_string(), 1, 4096)])
    );
    assert!(!old_log(&data_dir).exists());
    assert_eq!(
        std::fs::read_to_string(data_dir.join("__cluster_metadata/metadata.log.migrated")).unwrap(),
        old,
        "the old log is kept (its torn line cut off)"
    );
    // The leader epoch goes on from the old log's: this start is epoch 5.
    let req = MetadataRequest::default()
        .with_topics(Some(vec![metadata_request::MetadataRequestTopic::default(
        )
        .with_name(Some(TopicName(s("mig-a"))))]))
        .with_allow_auto_topic_creation(false);
    let resp = RawClient::connect(broker.port).request::<MetadataRequest>(9, &req);
    let epochs: Vec<i32> = resp.topics[0]
        .partitions
        .iter()
        .map(|p| p.leader_epoch)
        .collect();
    assert_eq!(epochs, vec![5, 5]);
    // Changes go to the Raft log, and a restart neither migrates again nor
    // loses them.
    create_topic(&broker.bootstrap(), "mig-b", 1, &[]);
    broker.stop();
    let log = std::fs::read(raft_log(&data_dir)).unwrap();
    assert_eq!(occurrences(&log, "\"name\":\"mig-a\""), 1, "migrated once");
    broker.restart();
    let after = state(&broker);
    assert_eq!(
        after.topics,
        BTreeMap::from([("mig-a".to_string(), 2), ("mig-b".to_string(), 1)])
    );
    assert_eq!(after.acls, migrated.acls);
    assert_eq!(after.scram, migrated.scram);
    let log = std::fs::read(raft_log(&data_dir)).unwrap();
    assert_eq!(occurrences(&log, "\"name\":\"mig-a\""), 1, "migrated once");
}

/// `--controller-quorum` naming this node alone is the quorum of one: the
/// broker serves and keeps its metadata across a restart with the flags.
/// The same data dir started with a quorum naming other nodes is refused
/// (its log's voters are this node alone, and changing the voters is not
/// built), and the data dir is left as it was (docs/replication.md §3.2).
#[test]
fn a_controller_quorum_of_this_node_alone_serves_and_several_nodes_are_refused() {
    let controller = common::free_port_base(1);
    let mut broker = Broker::start(
        opts(1)
            .arg("--node-id=0")
            .arg(format!("--controller-quorum=0@127.0.0.1:{controller}")),
    );
    create_topic(&broker.bootstrap(), "mq-alone", 2, &[]);
    broker.stop();
    broker.restart();
    assert_eq!(state(&broker).topics["mq-alone"], 2);
    broker.stop();
    let raft_before = std::fs::read(raft_log(&broker.data_dir())).unwrap();

    let three = format!(
        "--controller-quorum=0@127.0.0.1:{controller},1@127.0.0.2:{controller},2@127.0.0.3:{controller}"
    );
    for arg in &mut broker.opts_mut().extra_args {
        if arg.starts_with("--controller-quorum=") {
            *arg = three.clone();
        }
    }
    let (status, output) = broker.start_expecting_exit(Duration::from_secs(30));
    assert!(!status.success(), "exit status {status}\n{output}");
    assert!(
        output.contains("its quorum's voters are [1]") && output.contains("not built yet"),
        "{output}"
    );
    assert_eq!(
        std::fs::read(raft_log(&broker.data_dir())).unwrap(),
        raft_before,
        "the refused start wrote nothing to the metadata log"
    );
}
