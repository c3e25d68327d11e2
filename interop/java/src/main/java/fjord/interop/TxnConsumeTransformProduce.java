package fjord.interop;

import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;

/**
 * txn-consume-transform-produce: a consumer in a group reads an input topic and a
 * transactional producer writes a transformed copy to an output topic, committing the
 * consumer's offsets in the same transaction (sendOffsetsToTransaction with the
 * consumer's group metadata). One transaction is aborted (and the consumer rewound to
 * the committed offsets). The pipeline is stopped half-way and started again: it must
 * resume from the offsets committed by its transactions, and read_committed output
 * must hold each input record exactly once.
 */
final class TxnConsumeTransformProduce {
    static final int PARTITIONS = 3;
    static final int RECORDS_DEFAULT = 3_000;
    /** Records per poll, so the run takes many transactions. */
    static final int MAX_POLL_RECORDS = 100;
    /** The transaction of the first run (counted from 1) that is aborted instead of committed. */
    static final int ABORTED_TRANSACTION = 3;
    /** Longest one run of the pipeline may take. */
    static final long RUN_TIMEOUT_MS = 120_000;
    static final long READ_TIMEOUT_MS = 60_000;

    private TxnConsumeTransformProduce() {}

    /** What a run of the pipeline did. */
    static final class RunResult {
        long committedRecords;
        long abortedRecords;
        int transactions;
        Map<TopicPartition, Long> firstOffsets = new TreeMap<>((a, b) -> Integer.compare(a.partition(), b.partition()));
        Map<TopicPartition, Long> positions = new HashMap<>();
        /** The offsets the run's committed transactions carried, per partition (the last one). */
        Map<TopicPartition, Long> sentOffsets = new TreeMap<>((a, b) -> Integer.compare(a.partition(), b.partition()));
    }

    /**
     * The consumer's committed offsets. A read_committed consumer asks with
     * requireStable=true (KIP-447), so the broker answers UNSTABLE_OFFSET_COMMIT while
     * a transactional offset commit of the group is pending and the consumer retries
     * until its timeout. If that happens, the failure says what the group's offsets
     * look like without requireStable, next to what the committed transactions carried.
     */
    private static Map<TopicPartition, OffsetAndMetadata> committedOrExplain(KafkaConsumer<String, String> consumer,
            String bootstrap, String group, Map<TopicPartition, Long> sent) {
        try {
            return consumer.committed(consumer.assignment(), Duration.ofMillis(Kit.ADMIN_TIMEOUT_MS));
        } catch (org.apache.kafka.common.errors.TimeoutException e) {
            Map<TopicPartition, Long> visible = new TreeMap<>((a, b) -> Integer.compare(a.partition(), b.partition()));
            try (Admin admin = Kit.admin(bootstrap)) {
                for (var o : Kit.get(admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata(),
                        "listConsumerGroupOffsets").entrySet()) {
                    visible.put(o.getKey(), o.getValue().offset());
                }
            }
            throw Check.fail("consumer.committed() (OffsetFetch with requireStable=true) timed out after "
                    + Kit.ADMIN_TIMEOUT_MS + " ms: the broker kept answering UNSTABLE_OFFSET_COMMIT, i.e. the offsets "
                    + "committed by the already committed transactions never became stable. Offsets those "
                    + "transactions carried: " + sent + "; offsets the group shows without requireStable: " + visible
                    + " (" + Check.describe(e) + ")");
        }
    }

    static void run(Main.Args args) throws Exception {
        int n = args.recordsOr(RECORDS_DEFAULT);
        String input = Kit.unique("ctp-in");
        String output = Kit.unique("ctp-out");
        String group = Kit.unique("ctp-group");
        String txnId = Kit.unique("ctp-tx");
        List<TopicPartition> inTps = Kit.partitions(input, PARTITIONS);
        List<TopicPartition> outTps = Kit.partitions(output, PARTITIONS);
        try (Admin admin = Kit.admin(args.bootstrap)) {
            Kit.createTopic(admin, input, PARTITIONS);
            Kit.createTopic(admin, output, PARTITIONS);
            try (KafkaProducer<String, String> p = new KafkaProducer<>(Kit.stringProducerProps(args.bootstrap))) {
                for (int i = 0; i < n; i++) {
                    p.send(new ProducerRecord<>(input, i % PARTITIONS, "k-" + i, "in-" + i));
                }
                p.flush();
            }
            Check.ok("produced " + n + " input records");

            RunResult first = runPipeline(args.bootstrap, input, group, txnId, output, n / 2, true);
            Check.info("first run: " + first.transactions + " transactions, " + first.committedRecords
                    + " records committed, " + first.abortedRecords + " aborted");
            Check.that(first.abortedRecords > 0, "the first run aborted one transaction", first.abortedRecords);
            Map<TopicPartition, OffsetAndMetadata> committed =
                    Kit.get(admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata(), "listConsumerGroupOffsets");
            Map<TopicPartition, Long> committedOffsets = new TreeMap<>((a, b) -> Integer.compare(a.partition(), b.partition()));
            long committedSum = 0;
            for (var e : committed.entrySet()) {
                committedOffsets.put(e.getKey(), e.getValue().offset());
                committedSum += e.getValue().offset();
            }
            Check.equal(first.committedRecords, committedSum,
                    "offsets committed by the transactions add up to the records the first run committed");
            for (var e : first.positions.entrySet()) {
                Long c = committedOffsets.get(e.getKey());
                Check.equal(e.getValue(), c == null ? 0L : c,
                        "committed offset of " + e.getKey() + " equals the first run's position");
            }

            RunResult second = runPipeline(args.bootstrap, input, group, txnId, output, Long.MAX_VALUE, false);
            Check.info("second run: " + second.transactions + " transactions, " + second.committedRecords + " records");
            for (var e : second.firstOffsets.entrySet()) {
                Long c = committedOffsets.get(e.getKey());
                Check.equal(c == null ? 0L : c, e.getValue(),
                        "the restarted pipeline's first offset on " + e.getKey() + " (resumes from the committed offset)");
            }
            Check.equal((long) n, first.committedRecords + second.committedRecords, "records committed over both runs");
            Map<TopicPartition, OffsetAndMetadata> finalCommitted =
                    Kit.get(admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata(), "listConsumerGroupOffsets");
            for (TopicPartition tp : inTps) {
                OffsetAndMetadata o = finalCommitted.get(tp);
                Check.equal(second.positions.get(tp), o == null ? null : o.offset(), "final committed offset of " + tp);
            }

            Kit.awaitStable(args.bootstrap, outTps);
            long[] counts = new long[n];
            long total = readOutput(args.bootstrap, outTps, "read_committed", counts);
            for (int i = 0; i < n; i++) {
                if (counts[i] != 1) {
                    throw Check.fail("read_committed output has input record " + i + " " + counts[i] + " times");
                }
            }
            Check.equal((long) n, total, "read_committed output: every input record exactly once");
            long uncommittedTotal = readOutput(args.bootstrap, outTps, "read_uncommitted", new long[n]);
            Check.equal(n + first.abortedRecords, uncommittedTotal,
                    "read_uncommitted output also shows the aborted transaction's records");
        }
    }

    private static RunResult runPipeline(String bootstrap, String input, String group, String txnId, String output,
            long stopAfter, boolean abortOne) throws Exception {
        Properties cp = Kit.stringConsumerProps(bootstrap, "read_committed");
        cp.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        cp.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, "classic");
        cp.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, Integer.toString(MAX_POLL_RECORDS));
        Properties pp = Kit.stringProducerProps(bootstrap);
        pp.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, txnId);
        RunResult res = new RunResult();
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(cp);
                KafkaProducer<String, String> producer = new KafkaProducer<>(pp)) {
            producer.initTransactions();
            consumer.subscribe(List.of(input));
            List<TopicPartition> tps = Kit.partitions(input, PARTITIONS);
            Map<TopicPartition, Long> end = Kit.endOffsets(consumer, tps);
            long deadline = System.nanoTime() + RUN_TIMEOUT_MS * 1_000_000L;
            boolean aborted = false;
            while (res.committedRecords < stopAfter) {
                if (System.nanoTime() > deadline) {
                    throw Check.fail("pipeline run timed out after " + RUN_TIMEOUT_MS + " ms; committed "
                            + res.committedRecords + " records, assignment " + consumer.assignment());
                }
                ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(Kit.POLL_MS));
                if (records.isEmpty()) {
                    Set<TopicPartition> assigned = consumer.assignment();
                    if (assigned.size() == PARTITIONS && tps.stream().allMatch(tp -> consumer.position(tp) >= end.get(tp))) {
                        break;
                    }
                    continue;
                }
                producer.beginTransaction();
                Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
                for (ConsumerRecord<String, String> r : records) {
                    TopicPartition tp = new TopicPartition(r.topic(), r.partition());
                    res.firstOffsets.putIfAbsent(tp, r.offset());
                    producer.send(new ProducerRecord<>(output, r.partition(), r.key(), r.value().replace("in-", "out-")));
                    offsets.put(tp, new OffsetAndMetadata(r.offset() + 1));
                }
                res.transactions++;
                if (abortOne && !aborted && res.transactions == ABORTED_TRANSACTION) {
                    producer.flush();
                    producer.abortTransaction();
                    aborted = true;
                    res.abortedRecords += records.count();
                    // Rewind to what the transactions committed, as an application must after an abort.
                    Map<TopicPartition, OffsetAndMetadata> committed =
                            committedOrExplain(consumer, bootstrap, group, res.sentOffsets);
                    for (TopicPartition tp : consumer.assignment()) {
                        OffsetAndMetadata c = committed.get(tp);
                        if (c == null) {
                            consumer.seekToBeginning(List.of(tp));
                        } else {
                            consumer.seek(tp, c.offset());
                        }
                    }
                    Check.ok("transaction " + res.transactions + " (" + records.count()
                            + " records) aborted and the consumer rewound to the committed offsets");
                    continue;
                }
                producer.sendOffsetsToTransaction(offsets, consumer.groupMetadata());
                producer.commitTransaction();
                res.committedRecords += records.count();
                for (var e : offsets.entrySet()) {
                    res.sentOffsets.put(e.getKey(), e.getValue().offset());
                }
            }
            for (TopicPartition tp : consumer.assignment()) {
                res.positions.put(tp, consumer.position(tp));
            }
        }
        return res;
    }

    /** Reads the whole output with {@code isolation}; counts[i] is how often input i was seen. */
    private static long readOutput(String bootstrap, List<TopicPartition> tps, String isolation, long[] counts) {
        try (KafkaConsumer<String, String> c = new KafkaConsumer<>(Kit.stringConsumerProps(bootstrap, isolation))) {
            Map<TopicPartition, Long> end = Kit.endOffsets(c, tps);
            long total = 0;
            for (ConsumerRecord<String, String> r : Kit.readToEnd(c, tps, end, READ_TIMEOUT_MS)) {
                int i = Integer.parseInt(r.value().substring("out-".length()));
                counts[i]++;
                total++;
            }
            return total;
        }
    }
}
