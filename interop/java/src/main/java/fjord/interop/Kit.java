package fjord.interop;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.KafkaFuture;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/** Client set-up and bounded helpers shared by the scenarios. */
final class Kit {
    /** Longest an admin call may take. */
    static final long ADMIN_TIMEOUT_MS = 30_000;
    /** Longest a freshly created topic may take to show every partition with a leader. */
    static final long TOPIC_READY_TIMEOUT_MS = 30_000;
    /** Longest one consumer poll blocks. */
    static final long POLL_MS = 200;
    /** Longest a client's close may take. */
    static final Duration CLOSE_TIMEOUT = Duration.ofSeconds(10);

    private Kit() {}

    /**
     * A name no earlier run used, so that scenarios can share one broker and be run
     * again against it.
     */
    static String unique(String base) {
        return base + "-" + Long.toString(System.currentTimeMillis(), 36) + "-"
                + Integer.toHexString(ThreadLocalRandom.current().nextInt(0x10000));
    }

    static Admin admin(String bootstrap) {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(AdminClientConfig.CLIENT_ID_CONFIG, "fjord-interop-admin");
        return Admin.create(p);
    }

    /** Producer properties: Kafka 4.x defaults (idempotence on, acks=all), string keys, byte values. */
    static Properties producerProps(String bootstrap) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        return p;
    }

    /** Producer properties with string values. */
    static Properties stringProducerProps(String bootstrap) {
        Properties p = producerProps(bootstrap);
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        return p;
    }

    /** Consumer properties without a group (for assign), string keys, byte values. */
    static Properties consumerProps(String bootstrap, String isolation) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation);
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        return p;
    }

    static Properties stringConsumerProps(String bootstrap, String isolation) {
        Properties p = consumerProps(bootstrap, isolation);
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        return p;
    }

    static <T> T get(KafkaFuture<T> f, String what) {
        try {
            return f.get(ADMIN_TIMEOUT_MS, TimeUnit.MILLISECONDS);
        } catch (ExecutionException e) {
            throw new Check.Failed(what + " failed: " + Check.describe(e.getCause()), e.getCause());
        } catch (TimeoutException e) {
            throw new Check.Failed(what + " did not complete in " + ADMIN_TIMEOUT_MS + " ms");
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new Check.Failed(what + " interrupted");
        }
    }

    /** The exception a future failed with, or a failed check if it succeeded. */
    static Throwable failureOf(KafkaFuture<?> f, String what) {
        try {
            Object v = f.get(ADMIN_TIMEOUT_MS, TimeUnit.MILLISECONDS);
            throw new Check.Failed(what + ": expected an error, got " + v);
        } catch (ExecutionException e) {
            return e.getCause();
        } catch (TimeoutException e) {
            throw new Check.Failed(what + " did not complete in " + ADMIN_TIMEOUT_MS + " ms");
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new Check.Failed(what + " interrupted");
        }
    }

    /** Creates a topic (replication factor 1) and waits until every partition has a leader. */
    static void createTopic(Admin admin, String name, int partitions, Map<String, String> configs) {
        NewTopic t = new NewTopic(name, partitions, (short) 1).configs(configs);
        get(admin.createTopics(List.of(t)).all(), "createTopics " + name);
        awaitPartitions(admin, name, partitions);
        awaitLeadersServe(admin, name, partitions);
        Check.ok("created topic " + name + " with " + partitions + " partitions");
    }

    static void createTopic(Admin admin, String name, int partitions) {
        createTopic(admin, name, partitions, Map.of());
    }

    /** Waits until describeTopics shows {@code partitions} partitions, each with a leader. */
    static TopicDescription awaitPartitions(Admin admin, String name, int partitions) {
        final Object[] last = {null};
        return Check.waitFor("topic " + name + " has " + partitions + " partitions with leaders",
                TOPIC_READY_TIMEOUT_MS, () -> {
                    try {
                        TopicDescription d = admin.describeTopics(List.of(name)).allTopicNames()
                                .get(ADMIN_TIMEOUT_MS, TimeUnit.MILLISECONDS).get(name);
                        last[0] = d;
                        if (d.partitions().size() == partitions
                                && d.partitions().stream().allMatch(p -> p.leader() != null && !p.leader().isEmpty())) {
                            return d;
                        }
                        return null;
                    } catch (Exception e) {
                        last[0] = Check.describe(e);
                        return null;
                    }
                }, () -> last[0]);
    }

    /**
     * Waits until every partition's leader answers ListOffsets for it. Stock Kafka
     * publishes a new topic's metadata slightly before each leader has created the
     * partition; a producer that starts in that window gets NOT_LEADER_OR_FOLLOWER
     * and, seen under heavy load with Kafka 4.4, its idempotent retries can end in
     * OUT_OF_ORDER_SEQUENCE_NUMBER and expired batches. The scenarios test the broker's
     * steady state, so they start producing only once every leader serves.
     */
    static void awaitLeadersServe(Admin admin, String topic, int partitions) {
        Map<TopicPartition, org.apache.kafka.clients.admin.OffsetSpec> specs = new HashMap<>();
        for (TopicPartition tp : partitions(topic, partitions)) {
            specs.put(tp, org.apache.kafka.clients.admin.OffsetSpec.latest());
        }
        final Object[] last = {null};
        Check.waitFor("every leader of " + topic + " answers ListOffsets", TOPIC_READY_TIMEOUT_MS, () -> {
            try {
                admin.listOffsets(specs).all().get(ADMIN_TIMEOUT_MS, TimeUnit.MILLISECONDS);
                return Boolean.TRUE;
            } catch (Exception e) {
                last[0] = Check.describe(e);
                return null;
            }
        }, () -> last[0]);
    }

    static List<TopicPartition> partitions(String topic, int count) {
        List<TopicPartition> l = new ArrayList<>();
        for (int p = 0; p < count; p++) {
            l.add(new TopicPartition(topic, p));
        }
        return l;
    }

    /**
     * Reads the assigned partitions from the beginning until the consumer's position
     * reaches {@code end} on every one of them, failing after {@code timeoutMs}.
     */
    static <K, V> List<ConsumerRecord<K, V>> readToEnd(KafkaConsumer<K, V> consumer,
            Collection<TopicPartition> tps, Map<TopicPartition, Long> end, long timeoutMs) {
        consumer.assign(tps);
        consumer.seekToBeginning(tps);
        List<ConsumerRecord<K, V>> out = new ArrayList<>();
        long deadline = System.nanoTime() + timeoutMs * 1_000_000L;
        while (true) {
            for (ConsumerRecord<K, V> r : consumer.poll(Duration.ofMillis(POLL_MS))) {
                out.add(r);
            }
            boolean done = true;
            Map<TopicPartition, Long> positions = new HashMap<>();
            for (TopicPartition tp : tps) {
                long pos = consumer.position(tp, Duration.ofMillis(ADMIN_TIMEOUT_MS));
                positions.put(tp, pos);
                if (pos < end.get(tp)) {
                    done = false;
                }
            }
            if (done) {
                return out;
            }
            if (System.nanoTime() > deadline) {
                throw new Check.Failed("timed out after " + timeoutMs + " ms reading to " + end
                        + "; positions " + positions + ", " + out.size() + " records read");
            }
        }
    }

    /** Longest the transaction markers of committed or aborted transactions may take to be written. */
    static final long STABLE_TIMEOUT_MS = 30_000;

    /**
     * Waits until no transaction is open on {@code tps}: the last stable offset equals
     * the high watermark (markers are written after EndTxn is answered), and returns
     * those end offsets.
     */
    static Map<TopicPartition, Long> awaitStable(String bootstrap, Collection<TopicPartition> tps) {
        try (KafkaConsumer<String, byte[]> hw = new KafkaConsumer<>(consumerProps(bootstrap, "read_uncommitted"));
                KafkaConsumer<String, byte[]> lso = new KafkaConsumer<>(consumerProps(bootstrap, "read_committed"))) {
            final Object[] last = {null};
            return Check.waitFor("last stable offset = high watermark on " + tps.size() + " partitions",
                    STABLE_TIMEOUT_MS, () -> {
                        Map<TopicPartition, Long> h = endOffsets(hw, tps);
                        Map<TopicPartition, Long> l = endOffsets(lso, tps);
                        last[0] = "HW " + h + ", LSO " + l;
                        return h.equals(l) ? h : null;
                    }, () -> last[0]);
        }
    }

    /** The end offsets the consumer's isolation level gives (HW or LSO). */
    static Map<TopicPartition, Long> endOffsets(KafkaConsumer<?, ?> consumer, Collection<TopicPartition> tps) {
        return consumer.endOffsets(tps, Duration.ofMillis(ADMIN_TIMEOUT_MS));
    }
}
