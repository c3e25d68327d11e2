package fjord.interop;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ExecutionException;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.acl.AclBindingFilter;
import org.apache.kafka.common.errors.ClusterAuthorizationException;
import org.apache.kafka.common.errors.GroupAuthorizationException;
import org.apache.kafka.common.errors.TopicAuthorizationException;
import org.apache.kafka.common.errors.TransactionalIdAuthorizationException;

/**
 * The Java client against a broker whose principal (User:ANONYMOUS) has Kafka's
 * documented minimal ACLs and nothing more (set up by the Rust test): WRITE on
 * {@code --topic}, READ on it and on {@code --group}, WRITE on transactional ids
 * prefixed {@code --txn-prefix}. Each workload (idempotent producer, transactional
 * producer, consumer group) works; outside its ACLs each is refused with Kafka's
 * exception; the topic listing hides {@code --hidden-topic}; the ACL APIs are
 * refused.
 */
final class AclsScenario {
    private AclsScenario() {}

    static void run(Main.Args args) throws Exception {
        String bootstrap = args.bootstrap;
        String topic = args.require("topic");
        String hidden = args.require("hidden-topic");
        String group = args.require("group");
        String txnPrefix = args.require("txn-prefix");

        // Idempotent producer (Kafka 4 default): WRITE on the topic suffices (KIP-679).
        try (KafkaProducer<String, String> p = new KafkaProducer<>(Kit.stringProducerProps(bootstrap))) {
            for (int i = 0; i < 5; i++) {
                p.send(new ProducerRecord<>(topic, "k" + i, "v" + i)).get();
            }
            Check.ok("idempotent producer writes " + topic);
            Properties quick = Kit.stringProducerProps(bootstrap);
            quick.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "10000");
            try (KafkaProducer<String, String> q = new KafkaProducer<>(quick)) {
                Throwable seen = null;
                try {
                    q.send(new ProducerRecord<>(hidden, "k", "v")).get();
                } catch (ExecutionException e) {
                    seen = e.getCause();
                } catch (TopicAuthorizationException e) {
                    seen = e;
                }
                Check.that(seen instanceof TopicAuthorizationException,
                        "a write to " + hidden + " is refused with TopicAuthorizationException", seen);
            }
        }

        // Transactional producer: WRITE on its transactional id.
        Properties tx = Kit.stringProducerProps(bootstrap);
        tx.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, txnPrefix + "1");
        try (KafkaProducer<String, String> p = new KafkaProducer<>(tx)) {
            p.initTransactions();
            p.beginTransaction();
            p.send(new ProducerRecord<>(topic, "t", "committed"));
            p.commitTransaction();
            Check.ok("transactional producer " + txnPrefix + "1 commits");
        }
        Properties other = Kit.stringProducerProps(bootstrap);
        other.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, "not-" + txnPrefix);
        try (KafkaProducer<String, String> p = new KafkaProducer<>(other)) {
            Throwable seen = null;
            try {
                p.initTransactions();
            } catch (Exception e) {
                seen = e;
            }
            Check.that(seen instanceof TransactionalIdAuthorizationException,
                    "initTransactions of not-" + txnPrefix + " is refused", seen);
        }

        // Consumer group: READ on the topic and the group.
        Properties c = Kit.stringConsumerProps(bootstrap, "read_committed");
        c.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        c.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        c.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(c)) {
            consumer.subscribe(List.of(topic));
            List<ConsumerRecord<String, String>> got = new ArrayList<>();
            long deadline = System.nanoTime() + 60_000_000_000L;
            while (got.size() < 6 && System.nanoTime() < deadline) {
                consumer.poll(Duration.ofMillis(Kit.POLL_MS)).forEach(got::add);
            }
            Check.equal(6, got.size(), "records the group read (5 + 1 committed)");
            consumer.commitSync();
            Check.ok("the group commits its offsets");
        }
        Properties stranger = Kit.stringConsumerProps(bootstrap, "read_committed");
        stranger.put(ConsumerConfig.GROUP_ID_CONFIG, "not-" + group);
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(stranger)) {
            consumer.subscribe(List.of(topic));
            Throwable seen = null;
            long deadline = System.nanoTime() + 30_000_000_000L;
            while (seen == null && System.nanoTime() < deadline) {
                try {
                    consumer.poll(Duration.ofMillis(Kit.POLL_MS));
                } catch (GroupAuthorizationException e) {
                    seen = e;
                }
            }
            Check.that(seen instanceof GroupAuthorizationException,
                    "group not-" + group + " is refused with GroupAuthorizationException", seen);
        }

        // Admin: the listing hides what the principal may not describe; the ACL
        // APIs need the cluster.
        try (Admin admin = Kit.admin(bootstrap)) {
            Set<String> names = Kit.get(admin.listTopics().names(), "listTopics");
            Check.that(names.contains(topic) && !names.contains(hidden),
                    "listTopics shows " + topic + " and hides " + hidden, names);
            Throwable seen = Kit.failureOf(admin.describeAcls(AclBindingFilter.ANY).values(), "describeAcls");
            Check.that(seen instanceof ClusterAuthorizationException,
                    "describeAcls is refused with ClusterAuthorizationException", seen);
        }
    }
}
