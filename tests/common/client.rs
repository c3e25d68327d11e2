//! librdkafka (the `rdkafka` crate) helpers: producers that record every
//! delivery report, assign-mode consumers (they read chosen partitions and
//! never commit; group tests build their own subscribing consumers), and the
//! admin client.
//!
//! Every client points `bootstrap.servers` at one broker and has bounded
//! timeouts; every helper that waits takes a deadline.

use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// librdkafka's `message.timeout.ms` for test producers.
pub const MESSAGE_TIMEOUT_MS: u32 = 60_000;
/// `socket.timeout.ms` / admin request timeout for test clients.
pub const CLIENT_REQUEST_TIMEOUT_MS: u64 = 30_000;

/// The configuration every test client starts from.
pub fn base_config(bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("socket.timeout.ms", CLIENT_REQUEST_TIMEOUT_MS.to_string())
        .set("topic.metadata.refresh.interval.ms", "5000")
        .set("log_level", "4");
    // FJORD_TEST_RDKAFKA_DEBUG=eos,msg,... turns on librdkafka's debug log.
    if let Ok(contexts) = std::env::var("FJORD_TEST_RDKAFKA_DEBUG") {
        let _ = env_logger::builder()
            .is_test(true)
            .filter_level(log::LevelFilter::Debug)
            .try_init();
        c.set("debug", contexts).set("log_level", "7");
    }
    c
}

/// One delivery report.
#[derive(Clone, Debug)]
pub struct Delivery {
    /// The opaque given to `send` (the test's message id).
    pub id: usize,
    pub partition: i32,
    pub offset: i64,
    pub error: Option<String>,
}

/// Collects delivery reports.
#[derive(Clone, Default)]
pub struct CollectingContext {
    pub deliveries: Arc<Mutex<Vec<Delivery>>>,
}

impl ClientContext for CollectingContext {}

impl ProducerContext for CollectingContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, id: usize) {
        let d = match result {
            Ok(m) => Delivery {
                id,
                partition: m.partition(),
                offset: m.offset(),
                error: None,
            },
            Err((e, m)) => Delivery {
                id,
                partition: m.partition(),
                offset: m.offset(),
                error: Some(e.to_string()),
            },
        };
        self.deliveries.lock().expect("deliveries lock").push(d);
    }
}

pub type TestProducer = BaseProducer<CollectingContext>;

/// A producer with `extra` settings on top of [`base_config`].
pub fn producer(bootstrap: &str, extra: &[(&str, &str)]) -> TestProducer {
    let mut c = base_config(bootstrap);
    c.set("message.timeout.ms", MESSAGE_TIMEOUT_MS.to_string())
        .set("queue.buffering.max.messages", "1000000")
        .set("queue.buffering.max.kbytes", "1048576");
    for (k, v) in extra {
        c.set(*k, *v);
    }
    c.create_with_context(CollectingContext::default())
        .expect("create producer")
}

/// A message to produce.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestMessage {
    pub id: usize,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub headers: Vec<(String, Vec<u8>)>,
}

/// Enqueues `msg` (retrying while librdkafka's queue is full).
pub fn send(producer: &TestProducer, topic: &str, msg: &TestMessage) {
    let mut headers = OwnedHeaders::new_with_capacity(msg.headers.len());
    for (k, v) in &msg.headers {
        headers = headers.insert(rdkafka::message::Header {
            key: k,
            value: Some(v),
        });
    }
    let mut record = BaseRecord::with_opaque_to(topic, msg.id)
        .key(&msg.key)
        .payload(&msg.value)
        .headers(headers);
    let deadline = Instant::now() + Duration::from_millis(MESSAGE_TIMEOUT_MS as u64);
    loop {
        match producer.send(record) {
            Ok(()) => return,
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                assert!(Instant::now() < deadline, "producer queue stayed full");
                record = r;
                producer.poll(Duration::from_millis(10));
            }
            Err((e, _)) => panic!("send failed: {e}"),
        }
    }
}

/// Polls until `expected` delivery reports arrived (or panics at `timeout`)
/// and returns them all.
pub fn await_deliveries(
    producer: &TestProducer,
    expected: usize,
    timeout: Duration,
) -> Vec<Delivery> {
    let deadline = Instant::now() + timeout;
    loop {
        producer.poll(Duration::from_millis(50));
        let n = producer.context().deliveries.lock().expect("lock").len();
        if n >= expected {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {n} of {expected} delivery reports after {timeout:?}"
        );
    }
    let _ = producer.flush(Duration::from_secs(5));
    producer.context().deliveries.lock().expect("lock").clone()
}

/// Produces one message per id of `ids` to `topic` (key `k{id}`, the id
/// in decimal as the value, acks=all) and asserts that every one is
/// delivered within `timeout`.
pub fn produce_numbered(
    bootstrap: &str,
    topic: &str,
    ids: std::ops::Range<usize>,
    timeout: Duration,
) {
    let producer = producer(bootstrap, &[("acks", "all"), ("linger.ms", "2")]);
    let n = ids.len();
    for id in ids {
        send(
            &producer,
            topic,
            &TestMessage {
                id,
                key: format!("k{id}").into_bytes(),
                value: id.to_string().into_bytes(),
                headers: vec![],
            },
        );
    }
    for d in await_deliveries(&producer, n, timeout) {
        assert!(d.error.is_none(), "delivery failed: {:?}", d.error);
    }
}

/// The id a message of [`produce_numbered`] carries (its value).
pub fn numbered_id(m: &impl Message) -> usize {
    std::str::from_utf8(m.payload().unwrap_or_default())
        .ok()
        .and_then(|s| s.parse().ok())
        .expect("numeric payload")
}

/// An assign-mode consumer: librdkafka's `assign` needs a `group.id`, but
/// the consumer never joins the group nor commits.
pub fn consumer(bootstrap: &str, extra: &[(&str, &str)]) -> BaseConsumer {
    let mut c = base_config(bootstrap);
    c.set("group.id", "fjord-itest-assign-only")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("fetch.wait.max.ms", "100")
        .set("enable.partition.eof", "false");
    for (k, v) in extra {
        c.set(*k, *v);
    }
    c.create().expect("create consumer")
}

/// A consumed message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Consumed {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Vec<u8>)>,
}

/// Reads partitions `0..partitions` of `topic` from the beginning until
/// `expected` messages arrived; then keeps polling for `settle` to catch
/// any extra (duplicate) messages. Panics if fewer arrive by `timeout`.
pub fn consume(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    expected: usize,
    settle: Duration,
    timeout: Duration,
) -> Vec<Consumed> {
    let consumer = consumer(bootstrap, &[]);
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("add partition");
    }
    consumer.assign(&tpl).expect("assign");
    let deadline = Instant::now() + timeout;
    let mut out = Vec::with_capacity(expected);
    let mut settle_until: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if let Some(t) = settle_until {
            if now >= t {
                break;
            }
        } else if out.len() >= expected {
            settle_until = Some(now + settle);
        }
        assert!(
            now < deadline || settle_until.is_some(),
            "consumed only {} of {expected} messages from {topic} in {timeout:?}",
            out.len()
        );
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Err(e)) => panic!("consumer error: {e}"),
            Some(Ok(m)) => out.push(Consumed {
                partition: m.partition(),
                offset: m.offset(),
                key: m.key().map(<[u8]>::to_vec),
                value: m.payload().map(<[u8]>::to_vec),
                headers: m
                    .headers()
                    .map(|hs| {
                        hs.iter()
                            .map(|h| {
                                (
                                    h.key.to_string(),
                                    h.value.map(<[u8]>::to_vec).unwrap_or_default(),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            }),
        }
    }
    out
}

/// An admin client.
pub fn admin(bootstrap: &str) -> AdminClient<DefaultClientContext> {
    base_config(bootstrap)
        .create()
        .expect("create admin client")
}

/// Admin options with bounded timeouts.
pub fn admin_opts() -> AdminOptions {
    AdminOptions::new()
        .request_timeout(Some(Duration::from_millis(CLIENT_REQUEST_TIMEOUT_MS)))
        .operation_timeout(Some(Duration::from_millis(CLIENT_REQUEST_TIMEOUT_MS)))
}

/// Runs an admin future to completion on this thread.
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    futures::executor::block_on(f)
}

/// Leader node of each partition of `topic`, from librdkafka's metadata.
pub fn partition_leaders(bootstrap: &str, topic: &str) -> HashMap<i32, i32> {
    let c = consumer(bootstrap, &[]);
    let md = c
        .fetch_metadata(
            Some(topic),
            Duration::from_millis(CLIENT_REQUEST_TIMEOUT_MS),
        )
        .expect("metadata");
    let t = md
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .expect("topic in metadata");
    assert!(
        t.error().is_none(),
        "metadata error for {topic}: {:?}",
        t.error()
    );
    t.partitions()
        .iter()
        .map(|p| (p.id(), p.leader()))
        .collect()
}

/// Creates `topic` with `partitions` partitions (RF 1) and `config` and
/// asserts it succeeded.
pub fn create_topic(bootstrap: &str, topic: &str, partitions: i32, config: &[(&str, &str)]) {
    use rdkafka::admin::{NewTopic, TopicReplication};
    let admin = admin(bootstrap);
    let mut nt = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    for (k, v) in config {
        nt = nt.set(k, v);
    }
    let results = block_on(admin.create_topics([&nt], &admin_opts())).expect("create_topics");
    assert_eq!(results.len(), 1);
    if let Err((name, code)) = &results[0] {
        panic!("creating {name} failed: {code:?}");
    }
}

/// The port of the shard leading `topic`-`partition`.
pub fn leader_port(broker: &crate::common::Broker, topic: &str, partition: i32) -> u16 {
    let leaders = partition_leaders(&broker.bootstrap(), topic);
    let node = leaders[&partition];
    assert!(node >= 0, "{topic}-{partition} has a leader");
    broker.port_of(node as usize)
}
