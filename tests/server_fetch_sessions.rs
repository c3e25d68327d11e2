//! Incremental fetch sessions (KIP-227) through the raw protocol: a full
//! fetch opens a session, incremental fetches answer only partitions with
//! news and take new positions and forgotten partitions, a session is
//! closed with epoch -1, the two session errors (FETCH_SESSION_ID_NOT_FOUND,
//! INVALID_FETCH_SESSION_EPOCH), topic ids (v13), and eviction when the
//! shard's 1000 slots (Kafka's `max.incremental.fetch.session.cache.slots`)
//! are full.

mod common;

use common::client::create_topic;
use common::client::{admin, admin_opts, block_on};
use common::raw::{produce_values, RawClient};
use common::{wait_for, Broker, BrokerOpts};
use fjord::shard::fetch_sessions::FETCH_SESSION_CACHE_SLOTS;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ForgottenTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{FetchRequest, FetchResponse, MetadataRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use std::time::Duration;

const TOPIC: &str = "sessions";
/// Fetch by topic name, as the Java client does before topic ids.
const BY_NAME: i16 = 12;
const BY_ID: i16 = 13;

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

/// A fetch of `partitions` (index, fetch offset) of `topic` in session
/// (`id`, `epoch`), forgetting `forget`.
fn fetch(
    raw: &mut RawClient,
    version: i16,
    topic: (&str, uuid::Uuid),
    session: (i32, i32),
    partitions: &[(i32, i64)],
    forget: &[i32],
) -> FetchResponse {
    let req = fetch_request(version, topic, session, partitions, forget);
    raw.request(version, &req)
}

/// The request [`fetch`] sends (50 MiB `max_bytes`, no wait).
fn fetch_request(
    version: i16,
    topic: (&str, uuid::Uuid),
    session: (i32, i32),
    partitions: &[(i32, i64)],
    forget: &[i32],
) -> FetchRequest {
    let mut t = FetchTopic::default().with_partitions(
        partitions
            .iter()
            .map(|&(p, offset)| {
                FetchPartition::default()
                    .with_partition(p)
                    .with_current_leader_epoch(-1)
                    .with_fetch_offset(offset)
                    .with_last_fetched_epoch(-1)
                    .with_log_start_offset(-1)
                    .with_partition_max_bytes(1 << 20)
            })
            .collect(),
    );
    let mut f = ForgottenTopic::default().with_partitions(forget.to_vec());
    if version >= 13 {
        t = t.with_topic_id(topic.1);
        f = f.with_topic_id(topic.1);
    } else {
        t = t.with_topic(name(topic.0));
        f = f.with_topic(name(topic.0));
    }
    FetchRequest::default()
        .with_replica_id((-1).into())
        .with_max_wait_ms(0)
        .with_min_bytes(0)
        .with_max_bytes(50 << 20)
        .with_session_id(session.0)
        .with_session_epoch(session.1)
        .with_topics(if partitions.is_empty() {
            vec![]
        } else {
            vec![t]
        })
        .with_forgotten_topics_data(if forget.is_empty() { vec![] } else { vec![f] })
}

/// (partition, records bytes, high watermark) of each partition answered.
fn answered(resp: &FetchResponse) -> Vec<(i32, usize, i64)> {
    resp.responses
        .iter()
        .flat_map(|t| &t.partitions)
        .map(|p| {
            (
                p.partition_index,
                p.records.as_ref().map_or(0, |r| r.len()),
                p.high_watermark,
            )
        })
        .collect()
}

fn topic_id(raw: &mut RawClient, topic: &str) -> uuid::Uuid {
    let md = raw.request(
        12,
        &MetadataRequest::default().with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(name(topic)))
        ])),
    );
    md.topics[0].topic_id
}

#[test]
fn full_incremental_forget_close_and_errors() {
    let broker = Broker::start(BrokerOpts::default().cores(1));
    let mut raw = RawClient::connect(broker.port_of(0));
    for version in [BY_NAME, BY_ID] {
        let topic = format!("{TOPIC}-v{version}");
        let topic = topic.as_str();
        create_topic(&broker.bootstrap(), topic, 2, &[]);
        let id = topic_id(&mut raw, topic);
        produce_values(&mut raw, topic, 0, 3);
        let t = (topic, id);
        // A full fetch with epoch 0 opens a session and answers everything.
        let full = fetch(&mut raw, version, t, (0, 0), &[(0, 0), (1, 0)], &[]);
        assert_eq!(full.error_code, 0);
        let session = full.session_id;
        assert_ne!(session, 0, "v{version}: a session was opened");
        let got = answered(&full);
        assert_eq!(got.len(), 2);
        assert!(
            got[0].1 > 0 && got[0].2 == 3 && got[1] == (1, 0, 0),
            "{got:?}"
        );

        // Epoch 1: p0 moves to its end; nothing has news, nothing is
        // answered, the session goes on.
        let r = fetch(&mut raw, version, t, (session, 1), &[(0, 3)], &[]);
        assert_eq!((r.error_code, r.session_id), (0, session));
        assert_eq!(answered(&r), vec![]);

        // Records arrive on p1 (still at offset 0 in the session): only
        // p1 is answered, without being named.
        produce_values(&mut raw, topic, 1, 2);
        let r = fetch(&mut raw, version, t, (session, 2), &[], &[]);
        let got = answered(&r);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!((got[0].0, got[0].2), (1, 2));
        assert!(got[0].1 > 0);

        // p1 is forgotten: more records there are not answered; p0's new
        // records are.
        produce_values(&mut raw, topic, 1, 1);
        produce_values(&mut raw, topic, 0, 1);
        let r = fetch(&mut raw, version, t, (session, 3), &[], &[1]);
        let got = answered(&r);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!((got[0].0, got[0].2), (0, 4));

        // An epoch used already: INVALID_FETCH_SESSION_EPOCH, nothing else.
        let r = fetch(&mut raw, version, t, (session, 3), &[], &[]);
        assert_eq!(
            (r.error_code, r.session_id, r.responses.len()),
            (ResponseError::InvalidFetchSessionEpoch.code(), 0, 0)
        );
        // The session survives a wrong epoch.
        let r = fetch(&mut raw, version, t, (session, 4), &[(0, 4)], &[]);
        assert_eq!((r.error_code, r.session_id), (0, session));

        // Epoch -1 closes it, with a full answer and no session.
        let r = fetch(&mut raw, version, t, (session, -1), &[(0, 0)], &[]);
        assert_eq!((r.error_code, r.session_id), (0, 0));
        assert_eq!(answered(&r).len(), 1);
        let r = fetch(&mut raw, version, t, (session, 5), &[], &[]);
        assert_eq!(
            (r.error_code, r.session_id, r.responses.len()),
            (ResponseError::FetchSessionIdNotFound.code(), 0, 0)
        );
        // A full fetch with epoch -1 opens none.
        let r = fetch(&mut raw, version, t, (0, -1), &[(0, 0)], &[]);
        assert_eq!((r.error_code, r.session_id), (0, 0));
    }

    // A session opened by name is not used by id (Kafka's
    // FETCH_SESSION_TOPIC_ID_ERROR).
    let topic = format!("{TOPIC}-v{BY_NAME}");
    let t = (topic.as_str(), topic_id(&mut raw, &topic));
    let full = fetch(&mut raw, BY_NAME, t, (0, 0), &[(0, 0)], &[]);
    let r = fetch(&mut raw, BY_ID, t, (full.session_id, 1), &[], &[]);
    assert_eq!(r.error_code, ResponseError::FetchSessionTopicIdError.code());
    // An id never handed out.
    let r = fetch(&mut raw, BY_NAME, t, (12345, 1), &[], &[]);
    assert_eq!(r.error_code, ResponseError::FetchSessionIdNotFound.code());
}

#[test]
fn a_full_cache_evicts_only_for_a_larger_session() {
    let broker = Broker::start(BrokerOpts::default().cores(1));
    create_topic(&broker.bootstrap(), TOPIC, 2, &[]);
    let mut raw = RawClient::connect(broker.port_of(0));
    let t = (TOPIC, uuid::Uuid::nil());
    let sessions: Vec<i32> = (0..FETCH_SESSION_CACHE_SLOTS)
        .map(|_| {
            let r = fetch(&mut raw, BY_NAME, t, (0, 0), &[(0, 0)], &[]);
            assert_ne!(r.session_id, 0);
            r.session_id
        })
        .collect();
    // Every slot taken by a 1-partition session used just now: another
    // 1-partition fetch gets no session...
    let r = fetch(&mut raw, BY_NAME, t, (0, 0), &[(0, 0)], &[]);
    assert_eq!((r.error_code, r.session_id), (0, 0));
    // ... a 2-partition one evicts one of them.
    let r = fetch(&mut raw, BY_NAME, t, (0, 0), &[(0, 0), (1, 0)], &[]);
    let big = r.session_id;
    assert_ne!(big, 0);
    let gone = sessions
        .iter()
        .filter(|&&s| {
            let r = fetch(&mut raw, BY_NAME, t, (s, 1), &[], &[]);
            r.error_code == ResponseError::FetchSessionIdNotFound.code()
        })
        .count();
    assert_eq!(gone, 1, "exactly one session was evicted");
    let r = fetch(&mut raw, BY_NAME, t, (big, 1), &[], &[]);
    assert_eq!((r.error_code, r.session_id), (0, big));
}

/// `--max-incremental-fetch-session-cache-slots 0` (Kafka's
/// `max.incremental.fetch.session.cache.slots=0`) turns sessions off: a
/// fetch asking for a new session is answered in full with session id 0,
/// and an incremental fetch finds no session.
#[test]
fn zero_cache_slots_turn_sessions_off() {
    let broker = Broker::start(
        BrokerOpts::default()
            .cores(1)
            .arg("--max-incremental-fetch-session-cache-slots")
            .arg("0"),
    );
    create_topic(&broker.bootstrap(), TOPIC, 2, &[]);
    let mut raw = RawClient::connect(broker.port_of(0));
    produce_values(&mut raw, TOPIC, 0, 3);
    let t = (TOPIC, uuid::Uuid::nil());
    let r = fetch(&mut raw, BY_NAME, t, (0, 0), &[(0, 0), (1, 0)], &[]);
    assert_eq!((r.error_code, r.session_id), (0, 0), "no session opened");
    let got = answered(&r);
    assert_eq!(got.len(), 2, "both partitions answered: {got:?}");
    assert!(got
        .iter()
        .any(|&(p, bytes, hw)| p == 0 && bytes > 0 && hw == 3));
    let r = fetch(&mut raw, BY_NAME, t, (1, 1), &[], &[]);
    assert_eq!(r.error_code, ResponseError::FetchSessionIdNotFound.code());
}

/// Partitions that returned records are read last by the next incremental
/// fetch (Kafka's session reordering), so that with a response byte limit
/// a partition with records cannot starve the others.
#[test]
fn partitions_that_returned_records_are_read_last() {
    let broker = Broker::start(BrokerOpts::default().cores(1));
    create_topic(&broker.bootstrap(), TOPIC, 2, &[]);
    let mut raw = RawClient::connect(broker.port_of(0));
    produce_values(&mut raw, TOPIC, 0, 3);
    produce_values(&mut raw, TOPIC, 1, 3);
    let t = (TOPIC, uuid::Uuid::nil());
    // `max_bytes` 1: only the first partition read with records returns
    // any (it may exceed the limit by a batch, KIP-74).
    let mut limited = |session: (i32, i32), partitions: &[(i32, i64)]| {
        let req = fetch_request(BY_NAME, t, session, partitions, &[]).with_max_bytes(1);
        let r: FetchResponse = raw.request(BY_NAME, &req);
        assert_eq!(r.error_code, 0);
        let with_records: Vec<i32> = answered(&r)
            .into_iter()
            .filter(|&(_, bytes, _)| bytes > 0)
            .map(|(p, _, _)| p)
            .collect();
        (r.session_id, with_records)
    };
    let (session, got) = limited((0, 0), &[(0, 0), (1, 0)]);
    assert_ne!(session, 0);
    assert_eq!(got, vec![0], "the full fetch reads in request order");
    // Positions unchanged: p0 still comes first and returns records
    // again; then it is read after p1.
    assert_eq!(limited((session, 1), &[]), (session, vec![0]));
    assert_eq!(limited((session, 2), &[]), (session, vec![1]));
    assert_eq!(limited((session, 3), &[]), (session, vec![0]));
}

/// A session outlives its topic: once the topic is deleted its partition
/// is answered with UNKNOWN_TOPIC_OR_PARTITION, and once a topic of the
/// same name is created again, the session (by name) reads the new one.
#[test]
fn a_session_follows_its_topic_through_delete_and_recreate() {
    let broker = Broker::start(BrokerOpts::default().cores(1));
    let topic = "sessions-recreated";
    create_topic(&broker.bootstrap(), topic, 1, &[]);
    let mut raw = RawClient::connect(broker.port_of(0));
    produce_values(&mut raw, topic, 0, 2);
    let t = (topic, uuid::Uuid::nil());
    let full = fetch(&mut raw, BY_NAME, t, (0, 0), &[(0, 0)], &[]);
    let session = full.session_id;
    assert_ne!(session, 0);
    let mut epoch = 1;
    let r = fetch(&mut raw, BY_NAME, t, (session, epoch), &[(0, 2)], &[]);
    assert_eq!(answered(&r), vec![], "at its end, nothing new");

    let deleted = block_on(admin(&broker.bootstrap()).delete_topics(&[topic], &admin_opts()))
        .expect("delete_topics");
    assert!(deleted.iter().all(|r| r.is_ok()), "{deleted:?}");
    let unknown = ResponseError::UnknownTopicOrPartition.code();
    wait_for(
        Duration::from_secs(10),
        "the deletion to be answered",
        || {
            epoch += 1;
            let r = fetch(&mut raw, BY_NAME, t, (session, epoch), &[], &[]);
            assert_eq!((r.error_code, r.session_id), (0, session));
            let p = r.responses.first()?.partitions.first()?;
            (p.error_code == unknown).then_some(())
        },
    );

    create_topic(&broker.bootstrap(), topic, 1, &[]);
    wait_for(
        Duration::from_secs(10),
        "the new topic to be served",
        || {
            epoch += 1;
            // Position 0: the new partition is read from its start.
            let r = fetch(&mut raw, BY_NAME, t, (session, epoch), &[(0, 0)], &[]);
            assert_eq!((r.error_code, r.session_id), (0, session));
            let p = r.responses.first()?.partitions.first()?;
            (p.error_code == 0).then_some(())
        },
    );
    produce_values(&mut raw, topic, 0, 1);
    epoch += 1;
    let r = fetch(&mut raw, BY_NAME, t, (session, epoch), &[], &[]);
    let got = answered(&r);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0].0 == 0 && got[0].1 > 0 && got[0].2 == 1, "{got:?}");
}

/// (partition, records bytes, high watermark, last stable offset, log
/// start) of each partition answered.
fn offsets_answered(resp: &FetchResponse) -> Vec<(i32, usize, i64, i64, i64)> {
    resp.responses
        .iter()
        .flat_map(|t| &t.partitions)
        .map(|p| {
            (
                p.partition_index,
                p.records.as_ref().map_or(0, |r| r.len()),
                p.high_watermark,
                p.last_stable_offset,
                p.log_start_offset,
            )
        })
        .collect()
}

/// [`fetch`] by name under read_committed.
fn fetch_committed(
    raw: &mut RawClient,
    topic: &str,
    session: (i32, i32),
    partitions: &[(i32, i64)],
) -> FetchResponse {
    let req = fetch_request(
        BY_NAME,
        (topic, uuid::Uuid::nil()),
        session,
        partitions,
        &[],
    )
    .with_isolation_level(1);
    raw.request(BY_NAME, &req)
}

/// An incremental fetch reads only the partitions that can have news (the
/// ones whose logs flagged a change since the last response: `log::changes`),
/// so every change a response must report has to flag the partition: a
/// high watermark that moves without records in the range read (an open
/// transaction under read_committed), the last stable offset that a
/// COMMIT marker moves, and the log start that DeleteRecords moves. Each
/// is answered once, and not again by the next fetch.
#[test]
fn hw_lso_and_log_start_moves_are_answered_once() {
    use common::raw::{
        add_partition_to_txn_retrying, end_txn_v5, init_transactional, only_partition,
        produce_request,
    };
    use fjord::record::{BatchBuilder, Compression};
    use kafka_protocol::messages::delete_records_request::{
        DeleteRecordsPartition, DeleteRecordsTopic,
    };
    use kafka_protocol::messages::{DeleteRecordsRequest, TransactionalId};

    let broker = Broker::start(BrokerOpts::default().cores(1));
    let mut raw = RawClient::connect(broker.port_of(0));
    let topic = "sessions-news";
    create_topic(&broker.bootstrap(), topic, 2, &[]);
    let full = fetch_committed(&mut raw, topic, (0, 0), &[(0, 0), (1, 0)]);
    let session = full.session_id;
    assert_ne!(session, 0);
    assert_eq!(
        offsets_answered(&full),
        vec![(0, 0, 0, 0, 0), (1, 0, 0, 0, 0)]
    );
    let mut epoch = 1;
    let mut incremental = |raw: &mut RawClient, partitions: &[(i32, i64)]| {
        let r = fetch_committed(raw, topic, (session, epoch), partitions);
        epoch += 1;
        assert_eq!((r.error_code, r.session_id), (0, session));
        offsets_answered(&r)
    };
    assert_eq!(incremental(&mut raw, &[]), vec![]);

    // A transaction writes 3 records to p0: the HW moves to 3, the LSO
    // stays at 0, so a read_committed fetch at 0 has no records to return,
    // only the new HW.
    let id = "sessions-news-txn";
    let (pid, producer_epoch) = init_transactional(&mut raw, id).expect("InitProducerId");
    assert_eq!(
        add_partition_to_txn_retrying(&mut raw, id, pid, producer_epoch, topic, 0),
        0
    );
    let mut batch = BatchBuilder::new(Compression::None)
        .producer(pid, producer_epoch, 0)
        .transactional(true);
    for v in ["a", "b", "c"] {
        batch = batch.record(None, Some(v.as_bytes()), &[], 1_700_000_000_000);
    }
    let req = produce_request(topic, 0, -1, batch.build().freeze())
        .with_transactional_id(Some(TransactionalId(StrBytes::from_string(id.into()))));
    assert_eq!(only_partition(&raw.request(9, &req)).error_code, 0);
    assert_eq!(incremental(&mut raw, &[]), vec![(0, 0, 3, 0, 0)]);
    assert_eq!(incremental(&mut raw, &[]), vec![], "reported once");

    // The commit: the marker moves the HW and the LSO to 4, and the
    // committed records are readable.
    assert_eq!(end_txn_v5(&mut raw, id, pid, producer_epoch, true).0, 0);
    wait_for(Duration::from_secs(20), "the COMMIT marker", || {
        let r = fetch_committed(&mut raw, topic, (0, -1), &[(0, 0)]);
        (r.responses[0].partitions[0].last_stable_offset == 4).then_some(())
    });
    let got = incremental(&mut raw, &[]);
    assert_eq!(got.len(), 1, "{got:?}");
    let (p, bytes, hw, lso, log_start) = got[0];
    assert!(bytes > 0, "{got:?}");
    assert_eq!((p, hw, lso, log_start), (0, 4, 4, 0));
    // The client moves past them: nothing more to say.
    assert_eq!(incremental(&mut raw, &[(0, 4)]), vec![]);
    assert_eq!(incremental(&mut raw, &[]), vec![]);

    // DeleteRecords moves p0's log start to 2 (below the client's
    // position): answered once, with no records.
    let req = DeleteRecordsRequest::default()
        .with_timeout_ms(30_000)
        .with_topics(vec![DeleteRecordsTopic::default()
            .with_name(name(topic))
            .with_partitions(vec![DeleteRecordsPartition::default()
                .with_partition_index(0)
                .with_offset(2)])]);
    let resp = raw.request(2, &req);
    assert_eq!(resp.topics[0].partitions[0].error_code, 0);
    assert_eq!(incremental(&mut raw, &[]), vec![(0, 0, 4, 4, 2)]);
    assert_eq!(incremental(&mut raw, &[]), vec![], "reported once");

    // Plain records on the idle p1: it is answered (never named since the
    // session opened), then quiet again once the client has them.
    produce_values(&mut raw, topic, 1, 2);
    let got = incremental(&mut raw, &[]);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!((got[0].0, got[0].2, got[0].3), (1, 2, 2));
    assert_eq!(incremental(&mut raw, &[(1, 2)]), vec![]);
}

/// A parked incremental fetch waits on its session's one change signal:
/// records arriving on a partition it did not name (and that was quiet)
/// end the wait with that partition's records, and `fetch.min.bytes` is
/// still counted over the whole response.
#[test]
fn a_parked_incremental_fetch_wakes_for_any_session_partition() {
    let broker = Broker::start(BrokerOpts::default().cores(1));
    let port = broker.port_of(0);
    let mut raw = RawClient::connect(port);
    let topic = "sessions-park";
    create_topic(&broker.bootstrap(), topic, 3, &[]);
    let t = (topic, uuid::Uuid::nil());
    let full = fetch(&mut raw, BY_NAME, t, (0, 0), &[(0, 0), (1, 0), (2, 0)], &[]);
    let session = full.session_id;
    assert_ne!(session, 0);
    // Parks (min_bytes 1, up to 10 s) until p2 gets records from another
    // connection.
    let req = fetch_request(BY_NAME, t, (session, 1), &[], &[])
        .with_max_wait_ms(10_000)
        .with_min_bytes(1);
    let correlation = raw.send(BY_NAME, &req);
    std::thread::sleep(Duration::from_millis(300));
    let mut producer = RawClient::connect(port);
    produce_values(&mut producer, topic, 2, 1);
    let r: FetchResponse = raw.receive::<FetchRequest>(BY_NAME, correlation);
    assert_eq!((r.error_code, r.session_id), (0, session));
    let got = answered(&r);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0].0 == 2 && got[0].1 > 0 && got[0].2 == 1, "{got:?}");
}
