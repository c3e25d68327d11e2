# kafka-python (an independent, pure-Python client) against a broker.
# Part 1: admin, produce (plain, gzip, idempotent), group consume + commit, resume,
# transactions (commit + abort, read_committed). Part 2: snappy/lz4/zstd, a
# two-member group, and the admin calls kafka-python 3 offers.
# usage: python kafka_python_probe.py HOST:PORT   (scripts/compat.sh runs it)
import sys, time, uuid
from kafka import KafkaProducer, KafkaConsumer, KafkaAdminClient
from kafka import TopicPartition
from kafka.admin import NewTopic, ConfigResource, ConfigResourceType, NewPartitions
import threading
bs = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:19092"
t = "kp-" + uuid.uuid4().hex[:6]
adm = KafkaAdminClient(bootstrap_servers=bs)
adm.create_topics([NewTopic(t, num_partitions=3, replication_factor=1)])
print("created", t, adm.describe_topics([t])[0]["partitions"].__len__(), "partitions")
def produce(**kw):
    p = KafkaProducer(bootstrap_servers=bs, acks="all", **kw)
    fs = [p.send(t, key=b"k%d" % i, value=b"v%d" % i) for i in range(300)]
    p.flush(); md = [f.get(timeout=10) for f in fs]; p.close()
    return md
md = produce(); print("plain ok", sorted({m.partition for m in md}))
md = produce(compression_type="gzip"); print("gzip ok")
md = produce(enable_idempotence=True); print("idempotent ok")
c = KafkaConsumer(t, bootstrap_servers=bs, group_id="g-" + t, auto_offset_reset="earliest", enable_auto_commit=False, consumer_timeout_ms=8000)
n = 0
for m in c:
    n += 1
    if n == 900: break
c.commit(); c.close()
print("consumed", n)
c = KafkaConsumer(t, bootstrap_servers=bs, group_id="g-" + t, auto_offset_reset="earliest", consumer_timeout_ms=5000)
rest = sum(1 for _ in c); c.close(); print("after resume, new:", rest)
# transactions
tt = t + "-tx"
adm.create_topics([NewTopic(tt, num_partitions=1, replication_factor=1)])
p = KafkaProducer(bootstrap_servers=bs, transactional_id="tx-" + tt, enable_idempotence=True, acks="all")
p.init_transactions()
p.begin_transaction(); [p.send(tt, value=b"c%d" % i) for i in range(3)]; p.commit_transaction()
p.begin_transaction(); [p.send(tt, value=b"a%d" % i) for i in range(3)]; p.abort_transaction()
p.begin_transaction(); [p.send(tt, value=b"d%d" % i) for i in range(2)]; p.commit_transaction()
p.close()
for iso in ("read_uncommitted", "read_committed"):
    c = KafkaConsumer(tt, bootstrap_servers=bs, auto_offset_reset="earliest", isolation_level=iso, consumer_timeout_ms=5000)
    print(iso, [(m.value.decode(), m.offset) for m in c]); c.close()

# Part 2
t = "kp2-" + uuid.uuid4().hex[:6]
adm = KafkaAdminClient(bootstrap_servers=bs)
adm.create_topics([NewTopic(t, num_partitions=4, replication_factor=1, topic_configs={"retention.ms": "3600000"})])
for codec in ("snappy", "lz4", "zstd"):
    p = KafkaProducer(bootstrap_servers=bs, acks="all", compression_type=codec)
    fs = [p.send(t, key=b"k%d" % i, value=b"x" * 200) for i in range(200)]
    p.flush(); [f.get(timeout=10) for f in fs]; p.close(); print(codec, "ok")
cfg = adm.describe_configs([ConfigResource(ConfigResourceType.TOPIC, t)])
print("describe_configs:", cfg["topic"][t]["retention.ms"]["value"], cfg["topic"][t]["retention.ms"]["config_source"])
adm.create_partitions({t: NewPartitions(total_count=6)})
print("partitions now", len(adm.describe_topics([t])[0]["partitions"]))
# two consumers in one group: each gets a share, together everything
g = "g2-" + t
seen = {}
def run(name):
    c = KafkaConsumer(t, bootstrap_servers=bs, group_id=g, auto_offset_reset="earliest", consumer_timeout_ms=10000)
    n = 0
    for m in c: n += 1
    seen[name] = (n, sorted(tp.partition for tp in c.assignment())); c.close()
th = [threading.Thread(target=run, args=(x,)) for x in "ab"]
[x.start() for x in th]; [x.join() for x in th]
print("group members:", seen, "total", sum(v[0] for v in seen.values()))
def tryit(name, f):
    try:
        r = f(); print(name, "->", repr(r)[:300])
    except Exception as e:
        print(name, "FAILED:", type(e).__name__, str(e)[:300])
tryit("list_groups", lambda: [x for x in adm.list_groups() if g in str(x)])
tryit("describe_groups", lambda: adm.describe_groups([g]))
tryit("list_group_offsets", lambda: adm.list_group_offsets(g))
tryit("describe_cluster", lambda: adm.describe_cluster())
tryit("describe_log_dirs", lambda: adm.describe_log_dirs())
tryit("describe_features", lambda: adm.describe_features())
tryit("describe_producers", lambda: adm.describe_producers([TopicPartition(t, 0)]))
tryit("list_transactions", lambda: adm.list_transactions())
tryit("list_partition_offsets", lambda: adm.list_partition_offsets({TopicPartition(t, 0): -1}))
tryit("delete_records", lambda: adm.delete_records({TopicPartition(t, 0): 10}))
tryit("list_partition_offsets earliest after delete_records", lambda: adm.list_partition_offsets({TopicPartition(t, 0): -2}))
tryit("alter_configs", lambda: adm.alter_configs([ConfigResource(ConfigResourceType.TOPIC, t, configs={"retention.ms": "7200000"})]))
tryit("describe_configs after alter", lambda: adm.describe_configs([ConfigResource(ConfigResourceType.TOPIC, t)])["topic"][t]["retention.ms"]["value"])
tryit("describe_topic_partitions", lambda: adm.describe_topic_partitions([t]))
c = KafkaConsumer(bootstrap_servers=bs)
tps = [TopicPartition(t, i) for i in range(6)]
print("end offsets:", sorted((tp.partition, o) for tp, o in c.end_offsets(tps).items()))
print("beginning offsets:", sorted((tp.partition, o) for tp, o in c.beginning_offsets(tps).items()))
print("offsets_for_times:", sorted((tp.partition, None if o is None else o.offset) for tp, o in c.offsets_for_times({tp: 0 for tp in tps}).items()))
c.close()
tryit("delete_groups", lambda: adm.delete_groups([g]))
tryit("delete_topics", lambda: adm.delete_topics([t]))
time.sleep(1); print("topic deleted:", t not in adm.list_topics())
print("DONE")
