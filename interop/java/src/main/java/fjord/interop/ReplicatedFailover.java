package fjord.interop;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;

/**
 * replicated-failover: Kafka's Java clients across the loss of a partition leader on a
 * cluster of three nodes (docs/replication.md section 6). The admin client creates a
 * topic of one partition with replication factor 3 and {@code min.insync.replicas=2}
 * and sees three replicas in sync. An idempotent producer (acks=all, Kafka 4's default)
 * sends the first half of {@code --records} records, then the scenario writes the
 * leader's broker id to {@code --leader-file} and goes on sending while the test kills
 * that broker's node. Every send must succeed (the producer retries through the
 * failover), the admin client must see a new leader, and a consumer reading from the
 * beginning must see every record exactly once, in the order sent.
 */
final class ReplicatedFailover {
    /** Records sent when {@code --records} is not given. */
    static final int DEFAULT_RECORDS = 2000;
    /** Pause between sends, so the failover falls in the middle of the run. */
    static final long SEND_PAUSE_MS = 5;
    /** Longest the sends (through the failover) may take to be acknowledged. */
    static final long SEND_TIMEOUT_MS = 120_000;
    /** Longest the new leader may take to appear. */
    static final long FAILOVER_TIMEOUT_MS = 60_000;
    /** Longest the read back may take. */
    static final long READ_TIMEOUT_MS = 60_000;

    private ReplicatedFailover() {}

    static void run(Main.Args args) throws Exception {
        int records = args.recordsOr(DEFAULT_RECORDS);
        Path leaderFile = Path.of(args.require("leader-file"));
        String topic = Kit.unique("replicated-failover");
        TopicPartition tp = new TopicPartition(topic, 0);
        int oldLeader;
        try (Admin admin = Kit.admin(args.bootstrap)) {
            NewTopic t = new NewTopic(topic, 1, (short) 3).configs(Map.of("min.insync.replicas", "2"));
            Kit.get(admin.createTopics(List.of(t)).all(), "createTopics " + topic + " (replication factor 3)");
            TopicPartitionInfo p = Check.waitFor("three replicas in sync", Kit.TOPIC_READY_TIMEOUT_MS,
                    () -> inSync(admin, topic, 3), () -> describe(admin, topic));
            Check.equal(3, p.replicas().size(), "replicas of " + tp);
            Kit.awaitLeadersServe(admin, topic, 1);
            oldLeader = p.leader().id();
        }
        Properties pp = Kit.stringProducerProps(args.bootstrap);
        pp.put(ProducerConfig.ACKS_CONFIG, "all");
        pp.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        pp.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, (int) SEND_TIMEOUT_MS);
        List<Future<RecordMetadata>> sent = new ArrayList<>();
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(pp)) {
            for (int i = 0; i < records; i++) {
                sent.add(producer.send(new ProducerRecord<>(topic, 0, "k" + i, "v" + i)));
                if (i == records / 2) {
                    producer.flush();
                    for (int j = 0; j < sent.size(); j++) {
                        try {
                            sent.get(j).get(SEND_TIMEOUT_MS, TimeUnit.MILLISECONDS);
                        } catch (Exception e) {
                            throw Check.fail("send " + j + " (before the failover) failed: " + Check.describe(e));
                        }
                    }
                    Check.ok("first half acknowledged by leader " + oldLeader);
                    Files.writeString(leaderFile, Integer.toString(oldLeader), StandardCharsets.UTF_8);
                }
                Check.sleep(SEND_PAUSE_MS);
            }
            producer.flush();
            long lastOffset = -1;
            for (int i = 0; i < sent.size(); i++) {
                RecordMetadata m;
                try {
                    m = sent.get(i).get(SEND_TIMEOUT_MS, TimeUnit.MILLISECONDS);
                } catch (Exception e) {
                    throw Check.fail("send " + i + " failed: " + Check.describe(e));
                }
                if (m.offset() <= lastOffset) {
                    throw Check.fail("send " + i + " got offset " + m.offset() + ", not above " + lastOffset);
                }
                lastOffset = m.offset();
            }
            Check.ok("all " + records + " sends acknowledged across the failover");
        }
        try (Admin admin = Kit.admin(args.bootstrap)) {
            TopicPartitionInfo p = Check.waitFor("a new leader in the ISR", FAILOVER_TIMEOUT_MS, () -> {
                TopicPartitionInfo i = partition(admin, topic);
                return i != null && i.leader() != null && !i.leader().isEmpty() && i.leader().id() != oldLeader
                        ? i : null;
            }, () -> describe(admin, topic));
            Check.that(p.isr().stream().anyMatch(n -> n.id() == p.leader().id()), "the new leader is in the ISR", p);
        }
        try (KafkaConsumer<String, String> consumer =
                new KafkaConsumer<>(Kit.stringConsumerProps(args.bootstrap, "read_committed"))) {
            Map<TopicPartition, Long> end = Kit.endOffsets(consumer, List.of(tp));
            List<ConsumerRecord<String, String>> got = Kit.readToEnd(consumer, List.of(tp), end, READ_TIMEOUT_MS);
            Check.equal(records, got.size(), "records read back");
            for (int i = 0; i < got.size(); i++) {
                if (!got.get(i).value().equals("v" + i)) {
                    throw Check.fail("record " + i + " is " + got.get(i).value() + ", expected v" + i);
                }
            }
            Check.ok("every record once, in the order sent");
        }
    }

    /** Partition 0 of {@code topic} once it has a leader and {@code n} replicas in sync. */
    private static TopicPartitionInfo inSync(Admin admin, String topic, int n) {
        TopicPartitionInfo p = partition(admin, topic);
        return p != null && p.leader() != null && !p.leader().isEmpty() && p.isr().size() == n ? p : null;
    }

    private static TopicPartitionInfo partition(Admin admin, String topic) {
        try {
            TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames()
                    .get(Kit.ADMIN_TIMEOUT_MS, TimeUnit.MILLISECONDS).get(topic);
            return d.partitions().get(0);
        } catch (Exception e) {
            return null;
        }
    }

    private static Object describe(Admin admin, String topic) {
        TopicPartitionInfo p = partition(admin, topic);
        return p == null ? "(no description)" : p.toString();
    }
}
