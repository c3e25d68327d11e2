package fjord.interop;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.MemberDescription;
import org.apache.kafka.clients.consumer.CloseOptions;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.CooperativeStickyAssignor;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.consumer.RangeAssignor;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.GroupState;
import org.apache.kafka.common.GroupType;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.RebalanceInProgressException;

/**
 * group-classic: consumers of one group (classic protocol) share a 6-partition topic
 * while members join and leave, once with the eager RangeAssignor and once with the
 * CooperativeStickyAssignor. Every member commits synchronously after processing (and
 * in onPartitionsRevoked), so across the whole run — 2 members, a third joins, one
 * leaves, all stop, a new member resumes from the committed offsets — every record
 * must be processed exactly once.
 *
 * <p>group-consumer: the same run with {@code group.protocol=consumer} (KIP-848: the
 * broker assigns, with the {@code uniform} and then the {@code range} server-side
 * assignor), and describeConsumerGroups must report the group as type CONSUMER.
 */
final class GroupClassic {
    static final int PARTITIONS = 6;
    /** Records produced per partition in each phase. */
    static final int RECORDS_PER_PARTITION_PER_PHASE = 100;
    /** Longest the group may take to settle on an assignment after a member joins or leaves. */
    static final long BALANCE_TIMEOUT_MS = 60_000;
    /** Longest the members may take to process what was produced. */
    static final long CONSUME_TIMEOUT_MS = 60_000;
    /** Longest a member may take to commit, leave and close after it is told to stop. */
    static final long STOP_TIMEOUT_MS = 30_000;
    /** Heartbeat period: shorter than the default 3 s so that rebalances finish sooner. */
    static final String HEARTBEAT_INTERVAL_MS = "1000";
    static final Duration COMMIT_TIMEOUT = Duration.ofSeconds(15);
    /** Polls a stopping member may make to get its last commit through. */
    static final int STOP_DRAIN_POLLS_MAX = 50;

    private GroupClassic() {}

    static void run(Main.Args args) throws Exception {
        runWith(args.bootstrap, "range", RangeAssignor.class.getName(), GroupType.CLASSIC);
        runWith(args.bootstrap, "cooperative-sticky", CooperativeStickyAssignor.class.getName(), GroupType.CLASSIC);
    }

    /** The group-consumer scenario: KIP-848 groups with each server-side assignor. */
    static void runConsumer(Main.Args args) throws Exception {
        runWith(args.bootstrap, "uniform", null, GroupType.CONSUMER);
        runWith(args.bootstrap, "range", null, GroupType.CONSUMER);
    }

    /** Which member processed each record, and how often. */
    static final class Ledger {
        final ConcurrentHashMap<Long, Integer> counts = new ConcurrentHashMap<>();
        final AtomicLong processed = new AtomicLong();
        final ConcurrentLinkedQueue<String> problems = new ConcurrentLinkedQueue<>();

        void record(String member, ConsumerRecord<String, String> r, int generation) {
            processed.incrementAndGet();
            int c = counts.merge(((long) r.partition() << 40) | r.offset(), 1, Integer::sum);
            if (c > 1 && problems.size() < 20) {
                problems.add("record " + r.partition() + "@" + r.offset() + " processed again by " + member
                        + " in generation " + generation);
            }
        }
    }

    /** One consumer, polled by its own thread. */
    static final class Member implements Runnable {
        final String name;
        final Properties props;
        final String topic;
        final Ledger ledger;
        final Map<TopicPartition, Long> firstOffsets = new ConcurrentHashMap<>();
        final Thread thread;
        volatile boolean stop;
        volatile Set<TopicPartition> assignment = Set.of();
        volatile int generation = -1;
        volatile Throwable failure;
        final AtomicLong deferredCommits = new AtomicLong();
        /** Processed but not yet committed; touched only by the member's thread. */
        private final Map<TopicPartition, OffsetAndMetadata> pending = new HashMap<>();
        private KafkaConsumer<String, String> consumer;

        Member(String name, Properties props, String topic, Ledger ledger) {
            this.name = name;
            this.props = props;
            this.topic = topic;
            this.ledger = ledger;
            this.thread = new Thread(this, "member-" + name);
            this.thread.setDaemon(true);
        }

        Member start() {
            thread.start();
            return this;
        }

        @Override
        public void run() {
            Properties p = new Properties();
            p.putAll(props);
            p.put(ConsumerConfig.CLIENT_ID_CONFIG, name);
            try {
                consumer = new KafkaConsumer<>(p);
                consumer.subscribe(List.of(topic), new ConsumerRebalanceListener() {
                    @Override
                    public void onPartitionsRevoked(Collection<TopicPartition> revoked) {
                        // Everything processed is committed before the partitions move.
                        Map<TopicPartition, OffsetAndMetadata> mine = new HashMap<>();
                        for (TopicPartition tp : revoked) {
                            OffsetAndMetadata o = pending.remove(tp);
                            if (o != null) {
                                mine.put(tp, o);
                            }
                        }
                        if (!mine.isEmpty()) {
                            try {
                                consumer.commitSync(mine, COMMIT_TIMEOUT);
                            } catch (RuntimeException e) {
                                ledger.problems.add(name + ": commit in onPartitionsRevoked(" + revoked + ") failed: "
                                        + Check.describe(e));
                            }
                        }
                    }

                    @Override
                    public void onPartitionsAssigned(Collection<TopicPartition> assigned) {}

                    @Override
                    public void onPartitionsLost(Collection<TopicPartition> lost) {
                        ledger.problems.add(name + ": partitions lost (the member was dropped from the group): " + lost);
                        for (TopicPartition tp : lost) {
                            pending.remove(tp);
                        }
                    }
                });
                // After stop, a member still polls (a bounded number of times) until what it
                // processed is committed: a cooperative rebalance may defer the last commit.
                int drainPolls = 0;
                while (!stop || (!pending.isEmpty() && drainPolls++ < STOP_DRAIN_POLLS_MAX)) {
                    ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(Kit.POLL_MS));
                    int gen = consumer.groupMetadata().generationId();
                    for (ConsumerRecord<String, String> r : records) {
                        TopicPartition tp = new TopicPartition(r.topic(), r.partition());
                        firstOffsets.putIfAbsent(tp, r.offset());
                        ledger.record(name, r, gen);
                        pending.put(tp, new OffsetAndMetadata(r.offset() + 1));
                    }
                    commitPending();
                    assignment = new HashSet<>(consumer.assignment());
                    generation = gen;
                }
                if (!pending.isEmpty()) {
                    throw Check.fail(name + ": could not commit " + pending + " before closing");
                }
            } catch (Throwable t) {
                failure = t;
            } finally {
                if (consumer != null) {
                    consumer.close(CloseOptions.timeout(Kit.CLOSE_TIMEOUT));
                }
            }
        }

        /**
         * Commits what was processed. A cooperative member may be told that a rebalance
         * is in progress; it then commits after its next poll (or in onPartitionsRevoked).
         */
        private void commitPending() {
            if (pending.isEmpty()) {
                return;
            }
            try {
                consumer.commitSync(pending, COMMIT_TIMEOUT);
                pending.clear();
            } catch (RebalanceInProgressException e) {
                deferredCommits.incrementAndGet();
            }
        }

        void stopAndJoin() throws InterruptedException {
            stop = true;
            thread.join(STOP_TIMEOUT_MS);
            if (thread.isAlive()) {
                throw Check.fail(name + " did not stop within " + STOP_TIMEOUT_MS + " ms");
            }
            if (failure != null) {
                throw new Check.Failed(name + " failed: " + Check.describe(failure), failure);
            }
            Check.ok(name + " committed, left the group and closed");
        }
    }

    private static void runWith(String bootstrap, String assignorName, String assignorClass, GroupType type)
            throws Exception {
        String topic = Kit.unique("group-" + assignorName);
        String group = Kit.unique("group-" + assignorName + "-g");
        Check.info("assignor " + assignorName + " (" + type + "): topic " + topic + ", group " + group);
        Properties cp = Kit.stringConsumerProps(bootstrap, "read_uncommitted");
        cp.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        if (type == GroupType.CLASSIC) {
            cp.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, "classic");
            cp.put(ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG, assignorClass);
            cp.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, HEARTBEAT_INTERVAL_MS);
        } else {
            // The broker assigns and sets the heartbeat interval.
            cp.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, "consumer");
            cp.put(ConsumerConfig.GROUP_REMOTE_ASSIGNOR_CONFIG, assignorName);
        }
        cp.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "50");
        Ledger ledger = new Ledger();
        long[] produced = {0};
        List<Member> everyone = new ArrayList<>();
        try (Admin admin = Kit.admin(bootstrap);
                KafkaProducer<String, String> producer = new KafkaProducer<>(Kit.stringProducerProps(bootstrap))) {
            Kit.createTopic(admin, topic, PARTITIONS);
            try {
                produce(producer, topic, 1, produced);
                Member m1 = new Member(assignorName + "-m1", cp, topic, ledger).start();
                Member m2 = new Member(assignorName + "-m2", cp, topic, ledger).start();
                everyone.add(m1);
                everyone.add(m2);
                awaitBalanced(admin, group, assignorName, type, List.of(m1, m2), ledger);
                awaitProcessed(ledger, produced[0], everyone);
                int gen1 = m2.generation;

                Member m3 = new Member(assignorName + "-m3", cp, topic, ledger).start();
                everyone.add(m3);
                produce(producer, topic, 2, produced);
                awaitBalanced(admin, group, assignorName, type, List.of(m1, m2, m3), ledger);
                awaitProcessed(ledger, produced[0], everyone);
                int gen2 = m2.generation;
                Check.that(gen2 > gen1, "a third member joining starts a new generation", gen1 + " -> " + gen2);

                m1.stopAndJoin();
                produce(producer, topic, 3, produced);
                awaitBalanced(admin, group, assignorName, type, List.of(m2, m3), ledger);
                awaitProcessed(ledger, produced[0], everyone);
                int gen3 = m2.generation;
                Check.that(gen3 > gen2, "a member leaving starts a new generation", gen2 + " -> " + gen3);

                m2.stopAndJoin();
                m3.stopAndJoin();
                Map<TopicPartition, Long> committed = committedOffsets(admin, group);
                Map<TopicPartition, Long> expected = new TreeMap<>((a, b) -> Integer.compare(a.partition(), b.partition()));
                for (TopicPartition tp : Kit.partitions(topic, PARTITIONS)) {
                    expected.put(tp, produced[0] / PARTITIONS);
                }
                Check.equal(expected, committed, "committed offsets after every member stopped");

                produce(producer, topic, 4, produced);
                Member m4 = new Member(assignorName + "-m4", cp, topic, ledger).start();
                everyone.add(m4);
                awaitProcessed(ledger, produced[0], everyone);
                Map<TopicPartition, Long> first = new TreeMap<>((a, b) -> Integer.compare(a.partition(), b.partition()));
                first.putAll(m4.firstOffsets);
                Check.equal(committed, first, "a new member resumes from the committed offsets");
                m4.stopAndJoin();
            } finally {
                for (Member m : everyone) {
                    m.stop = true;
                }
                for (Member m : everyone) {
                    m.thread.join(STOP_TIMEOUT_MS);
                }
            }
            Check.that(ledger.problems.isEmpty(), assignorName + ": no commit failed, no partition lost, no record processed twice",
                    ledger.problems);
            Check.equal(produced[0], (long) ledger.counts.size(), assignorName + ": distinct records processed");
            Check.equal(produced[0], ledger.processed.get(), assignorName + ": records processed (exactly once each)");
            long deferred = everyone.stream().mapToLong(m -> m.deferredCommits.get()).sum();
            Check.info(assignorName + ": commits deferred by RebalanceInProgressException: " + deferred);
        }
    }

    private static void produce(KafkaProducer<String, String> producer, String topic, int phase, long[] produced)
            throws Exception {
        for (int i = 0; i < RECORDS_PER_PARTITION_PER_PHASE; i++) {
            for (int p = 0; p < PARTITIONS; p++) {
                producer.send(new ProducerRecord<>(topic, p, "k" + i, "phase" + phase + "-" + p + "-" + i));
            }
        }
        producer.flush();
        produced[0] += (long) RECORDS_PER_PARTITION_PER_PHASE * PARTITIONS;
        Check.ok("phase " + phase + ": produced " + RECORDS_PER_PARTITION_PER_PHASE * PARTITIONS + " records");
    }

    /**
     * Waits until the members' own assignments are disjoint, cover every partition and
     * are balanced, and the coordinator describes the group as Stable with exactly those
     * members and that assignor.
     */
    private static void awaitBalanced(Admin admin, String group, String assignorName, GroupType type,
            List<Member> members, Ledger ledger) {
        int each = PARTITIONS / members.size();
        final Object[] last = {null};
        Check.waitFor(members.size() + " members hold " + each + " partitions each (" + assignorName + ")",
                BALANCE_TIMEOUT_MS, () -> {
                    for (Member m : members) {
                        if (m.failure != null) {
                            throw new Check.Failed(m.name + " failed: " + Check.describe(m.failure), m.failure);
                        }
                    }
                    Set<TopicPartition> union = new HashSet<>();
                    List<Integer> sizes = new ArrayList<>();
                    for (Member m : members) {
                        Set<TopicPartition> a = m.assignment;
                        sizes.add(a.size());
                        union.addAll(a);
                    }
                    ConsumerGroupDescription d;
                    try {
                        d = Kit.get(admin.describeConsumerGroups(List.of(group)).describedGroups().get(group),
                                "describeConsumerGroups");
                    } catch (Check.Failed e) {
                        last[0] = "member sizes " + sizes + "; " + e.getMessage();
                        return null;
                    }
                    List<Integer> described = new ArrayList<>();
                    for (MemberDescription md : d.members()) {
                        described.add(md.assignment().topicPartitions().size());
                    }
                    last[0] = "member sizes " + sizes + ", union " + union.size() + "; coordinator: type " + d.type()
                            + ", state " + d.groupState() + ", assignor " + d.partitionAssignor() + ", member sizes "
                            + described + "; problems " + ledger.problems;
                    boolean mine = union.size() == PARTITIONS && sizes.stream().allMatch(s -> s == each);
                    boolean theirs = d.type() == type && d.groupState() == GroupState.STABLE
                            && described.size() == members.size()
                            && described.stream().allMatch(s -> s == each) && assignorName.equals(d.partitionAssignor());
                    return mine && theirs ? Boolean.TRUE : null;
                }, () -> last[0]);
    }

    private static void awaitProcessed(Ledger ledger, long produced, List<Member> members) {
        Check.waitFor("every one of " + produced + " records produced so far was processed", CONSUME_TIMEOUT_MS, () -> {
            for (Member m : members) {
                if (m.failure != null) {
                    throw new Check.Failed(m.name + " failed: " + Check.describe(m.failure), m.failure);
                }
            }
            return ledger.counts.size() >= produced ? Boolean.TRUE : null;
        }, () -> ledger.counts.size() + " distinct records processed; problems " + ledger.problems);
    }

    private static Map<TopicPartition, Long> committedOffsets(Admin admin, String group) {
        Map<TopicPartition, Long> out = new TreeMap<>((a, b) -> Integer.compare(a.partition(), b.partition()));
        for (var e : Kit.get(admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata(),
                "listConsumerGroupOffsets").entrySet()) {
            out.put(e.getKey(), e.getValue().offset());
        }
        return out;
    }
}
