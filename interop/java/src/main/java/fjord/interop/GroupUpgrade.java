package fjord.interop;

import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Properties;
import java.util.Set;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.MemberDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.CooperativeStickyAssignor;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.GroupState;
import org.apache.kafka.common.GroupType;
import org.apache.kafka.common.TopicPartition;

/**
 * group-upgrade: the online upgrade of a classic group to the consumer protocol
 * (KIP-848's mixed groups). Two classic members with the CooperativeStickyAssignor share
 * a 12-partition topic; they are replaced one by one by {@code group.protocol=consumer}
 * members while records flow. The first consumer-protocol member converts the group;
 * the classic members stay in it (the broker assigns them, and they revoke through
 * their cooperative rejoins). At every step the members' assignments must be disjoint
 * and complete; every member commits what it processed (also in onPartitionsRevoked),
 * so every record must be processed exactly once and no member may lose its partitions.
 * At the end describeConsumerGroups reports type CONSUMER, Stable, 6 partitions each.
 */
final class GroupUpgrade {
    static final int PARTITIONS = 12;
    static final int RECORDS_PER_PARTITION_PER_PHASE = 50;
    /** Longest the group may take to settle on an assignment after a member joins or leaves. */
    static final long BALANCE_TIMEOUT_MS = 90_000;
    static final long CONSUME_TIMEOUT_MS = 60_000;

    private GroupUpgrade() {}

    static void run(Main.Args args) throws Exception {
        String bootstrap = args.bootstrap;
        String topic = Kit.unique("group-upgrade");
        String group = Kit.unique("group-upgrade-g");
        Check.info("topic " + topic + ", group " + group);
        Properties classic = Kit.stringConsumerProps(bootstrap, "read_uncommitted");
        classic.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        classic.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "50");
        Properties consumer = new Properties();
        consumer.putAll(classic);
        classic.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, "classic");
        classic.put(ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG, CooperativeStickyAssignor.class.getName());
        classic.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, GroupClassic.HEARTBEAT_INTERVAL_MS);
        consumer.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, "consumer");
        GroupClassic.Ledger ledger = new GroupClassic.Ledger();
        long[] produced = {0};
        List<GroupClassic.Member> everyone = new ArrayList<>();
        try (Admin admin = Kit.admin(bootstrap);
                KafkaProducer<String, String> producer = new KafkaProducer<>(Kit.stringProducerProps(bootstrap))) {
            Kit.createTopic(admin, topic, PARTITIONS);
            try {
                produce(producer, topic, 1, produced);
                GroupClassic.Member c1 = new GroupClassic.Member("classic-1", classic, topic, ledger).start();
                GroupClassic.Member c2 = new GroupClassic.Member("classic-2", classic, topic, ledger).start();
                everyone.add(c1);
                everyone.add(c2);
                awaitSplit(List.of(c1, c2), ledger, "two classic members");
                awaitProcessed(ledger, produced[0], everyone);
                Check.equal(GroupType.CLASSIC, describe(admin, group).type(), "the group's type before the upgrade");

                GroupClassic.Member k1 = new GroupClassic.Member("consumer-1", consumer, topic, ledger).start();
                everyone.add(k1);
                produce(producer, topic, 2, produced);
                awaitSplit(List.of(c1, c2, k1), ledger, "upgraded: two classic members and a consumer member");
                awaitProcessed(ledger, produced[0], everyone);
                Check.equal(GroupType.CONSUMER, describe(admin, group).type(), "the group's type after the upgrade");

                c1.stopAndJoin();
                produce(producer, topic, 3, produced);
                awaitSplit(List.of(c2, k1), ledger, "classic-1 replaced");
                awaitProcessed(ledger, produced[0], everyone);

                GroupClassic.Member k2 = new GroupClassic.Member("consumer-2", consumer, topic, ledger).start();
                everyone.add(k2);
                produce(producer, topic, 4, produced);
                awaitSplit(List.of(c2, k1, k2), ledger, "classic-2, consumer-1, consumer-2");
                awaitProcessed(ledger, produced[0], everyone);
                c2.stopAndJoin();
                produce(producer, topic, 5, produced);
                awaitSplit(List.of(k1, k2), ledger, "two consumer members");
                awaitProcessed(ledger, produced[0], everyone);

                Check.waitFor("the coordinator describes a Stable CONSUMER group, 6 partitions each",
                        BALANCE_TIMEOUT_MS, () -> {
                            ConsumerGroupDescription d = describe(admin, group);
                            List<Integer> sizes = new ArrayList<>();
                            for (MemberDescription md : d.members()) {
                                sizes.add(md.assignment().topicPartitions().size());
                            }
                            return d.type() == GroupType.CONSUMER && d.groupState() == GroupState.STABLE
                                    && sizes.equals(List.of(6, 6)) ? Boolean.TRUE : null;
                        }, () -> describe(admin, group).toString());
                k1.stopAndJoin();
                k2.stopAndJoin();
            } finally {
                for (GroupClassic.Member m : everyone) {
                    m.stop = true;
                }
                for (GroupClassic.Member m : everyone) {
                    m.thread.join(GroupClassic.STOP_TIMEOUT_MS);
                }
            }
            Check.that(ledger.problems.isEmpty(), "no commit failed, no partition lost, no record processed twice",
                    ledger.problems);
            Check.equal(produced[0], (long) ledger.counts.size(), "distinct records processed");
            Check.equal(produced[0], ledger.processed.get(), "records processed (exactly once each)");
        }
    }

    private static ConsumerGroupDescription describe(Admin admin, String group) {
        return Kit.get(admin.describeConsumerGroups(List.of(group)).describedGroups().get(group),
                "describeConsumerGroups");
    }

    private static void produce(KafkaProducer<String, String> producer, String topic, int phase, long[] produced) {
        for (int i = 0; i < RECORDS_PER_PARTITION_PER_PHASE; i++) {
            for (int p = 0; p < PARTITIONS; p++) {
                producer.send(new ProducerRecord<>(topic, p, "k" + i, "phase" + phase + "-" + p + "-" + i));
            }
        }
        producer.flush();
        produced[0] += (long) RECORDS_PER_PARTITION_PER_PHASE * PARTITIONS;
        Check.ok("phase " + phase + ": produced " + RECORDS_PER_PARTITION_PER_PHASE * PARTITIONS + " records");
    }

    /** Waits until every member holds partitions, the members' sets are disjoint and cover the topic. */
    private static void awaitSplit(List<GroupClassic.Member> members, GroupClassic.Ledger ledger, String what) {
        final Object[] last = {null};
        Check.waitFor(what + ": disjoint, complete assignments", BALANCE_TIMEOUT_MS, () -> {
            Set<TopicPartition> union = new HashSet<>();
            List<Set<TopicPartition>> sets = new ArrayList<>();
            int sum = 0;
            for (GroupClassic.Member m : members) {
                if (m.failure != null) {
                    throw new Check.Failed(m.name + " failed: " + Check.describe(m.failure), m.failure);
                }
                Set<TopicPartition> a = m.assignment;
                sets.add(a);
                sum += a.size();
                union.addAll(a);
            }
            last[0] = "assignments " + sets + "; problems " + ledger.problems;
            boolean done = union.size() == PARTITIONS && sum == PARTITIONS
                    && sets.stream().noneMatch(Set::isEmpty);
            return done ? Boolean.TRUE : null;
        }, () -> last[0]);
    }

    private static void awaitProcessed(GroupClassic.Ledger ledger, long produced, List<GroupClassic.Member> members) {
        Check.waitFor("every one of " + produced + " records produced so far was processed", CONSUME_TIMEOUT_MS, () -> {
            for (GroupClassic.Member m : members) {
                if (m.failure != null) {
                    throw new Check.Failed(m.name + " failed: " + Check.describe(m.failure), m.failure);
                }
            }
            return ledger.counts.size() >= produced ? Boolean.TRUE : null;
        }, () -> ledger.counts.size() + " distinct records processed; problems " + ledger.problems);
    }
}
