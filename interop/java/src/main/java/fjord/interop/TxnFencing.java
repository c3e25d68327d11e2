package fjord.interop;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.stream.Collectors;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.TransactionDescription;
import org.apache.kafka.clients.admin.TransactionState;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;

/**
 * txn-fencing: two producers with one transactional.id. Producer 1 opens a
 * transaction (z1); producer 2's initTransactions fences it (the coordinator aborts
 * z1 and bumps the epoch twice); producer 1's commit fails (ProducerFencedException, or
 * InvalidProducerEpochException if it sent again after the fence: both variants run);
 * producer 2 commits y1.
 * Expected (KAFKA_BEHAVIOUR.md section 5): epochs 0, 2, 3; read_uncommitted
 * [z1@0, y1@2], read_committed [y1@2].
 */
final class TxnFencing {
    /**
     * What stock Kafka 4.4 gives producer 1's commitTransaction right after the fence
     * (EndTxn answered PRODUCER_FENCED).
     */
    static final String FENCED_COMMIT_EXCEPTION = "org.apache.kafka.common.errors.ProducerFencedException";
    /**
     * What stock Kafka 4.4 gives producer 1's send after the fence (Produce answered
     * INVALID_PRODUCER_EPOCH), and then its commitTransaction too.
     */
    static final String FENCED_SEND_EXCEPTION = "org.apache.kafka.common.errors.InvalidProducerEpochException";
    /** Longest the coordinator may take to reach a state after a request. */
    static final long STATE_TIMEOUT_MS = 30_000;
    static final long READ_TIMEOUT_MS = 30_000;

    private TxnFencing() {}

    static void run(Main.Args args) throws Exception {
        // Producer 1 commits at once: EndTxn with the old epoch is answered PRODUCER_FENCED.
        runVariant(args, false);
        // Producer 1 sends again first: the partition leader answers INVALID_PRODUCER_EPOCH,
        // and the commit then fails with that (abortable) error of the send.
        runVariant(args, true);
    }

    private static void runVariant(Main.Args args, boolean sendAfterFence) throws Exception {
        Check.info(sendAfterFence ? "variant: producer 1 sends z2 after the fence, then commits"
                : "variant: producer 1 commits right after the fence");
        String topic = Kit.unique("txn-fencing");
        String txnId = Kit.unique("txn-fencing-tx");
        TopicPartition tp = new TopicPartition(topic, 0);
        try (Admin admin = Kit.admin(args.bootstrap)) {
            Kit.createTopic(admin, topic, 1);
            Properties pp = Kit.stringProducerProps(args.bootstrap);
            pp.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, txnId);

            KafkaProducer<String, String> p1 = new KafkaProducer<>(pp);
            long producerId;
            try {
                p1.initTransactions();
                TransactionDescription d1 = awaitState(admin, txnId, TransactionState.EMPTY, "after producer 1's initTransactions");
                Check.equal(0, d1.producerEpoch(), "producer 1 epoch");
                producerId = d1.producerId();
                p1.beginTransaction();
                p1.send(new ProducerRecord<>(topic, 0, null, "z1")).get();
                TransactionDescription open = awaitState(admin, txnId, TransactionState.ONGOING, "while z1 is open");
                Check.equal(List.of(tp), new ArrayList<>(open.topicPartitions()), "the open transaction's partitions");

                try (KafkaProducer<String, String> p2 = new KafkaProducer<>(pp)) {
                    p2.initTransactions();
                    TransactionDescription d2 = awaitState(admin, txnId, TransactionState.EMPTY,
                            "after producer 2's initTransactions");
                    Check.equal(producerId, d2.producerId(), "producer 2 keeps the producer id");
                    Check.equal(2, d2.producerEpoch(), "producer 2 epoch (fence bumps once, init once more)");

                    if (sendAfterFence) {
                        String sendFailure = null;
                        try {
                            p1.send(new ProducerRecord<>(topic, 0, null, "z2")).get();
                        } catch (java.util.concurrent.ExecutionException e) {
                            sendFailure = e.getCause().getClass().getName();
                            Check.info("producer 1 send after the fence failed: " + Check.describe(e.getCause()));
                        }
                        Check.equal(FENCED_SEND_EXCEPTION, sendFailure, "producer 1's send after the fence fails with");
                    }
                    String failure = null;
                    try {
                        p1.commitTransaction();
                    } catch (KafkaException e) {
                        failure = e.getClass().getName();
                        Check.info("producer 1 commit failed: " + Check.describe(e));
                    }
                    Check.equal(sendAfterFence ? FENCED_SEND_EXCEPTION : FENCED_COMMIT_EXCEPTION, failure,
                            "producer 1's commitTransaction fails with");

                    p2.beginTransaction();
                    p2.send(new ProducerRecord<>(topic, 0, null, "y1")).get();
                    p2.commitTransaction();
                    Check.ok("producer 2 committed y1");
                    TransactionDescription d3 = awaitState(admin, txnId, TransactionState.COMPLETE_COMMIT,
                            "after producer 2's commit");
                    Check.equal(3, d3.producerEpoch(), "epoch after producer 2's commit (TV2 bumps per transaction)");
                }
            } finally {
                p1.close(Kit.CLOSE_TIMEOUT);
            }
        }
        read(args.bootstrap, tp, "read_uncommitted", "z1@0 y1@2");
        read(args.bootstrap, tp, "read_committed", "y1@2");
    }

    private static TransactionDescription awaitState(Admin admin, String txnId, TransactionState state, String when) {
        final Object[] last = {null};
        return Check.waitFor("describeTransactions " + when + ": state " + state, STATE_TIMEOUT_MS, () -> {
            TransactionDescription d =
                    Kit.get(admin.describeTransactions(List.of(txnId)).description(txnId), "describeTransactions");
            last[0] = d;
            return d.state() == state ? d : null;
        }, () -> last[0]);
    }

    private static void read(String bootstrap, TopicPartition tp, String isolation, String expected) {
        try (KafkaConsumer<String, String> c = new KafkaConsumer<>(Kit.stringConsumerProps(bootstrap, isolation))) {
            final Object[] last = {null};
            Check.waitFor(isolation + " end offset reaches 4", READ_TIMEOUT_MS, () -> {
                long end = Kit.endOffsets(c, List.of(tp)).get(tp);
                last[0] = end;
                return end == 4 ? Boolean.TRUE : null;
            }, () -> last[0]);
            List<ConsumerRecord<String, String>> records = Kit.readToEnd(c, List.of(tp), Map.of(tp, 4L), READ_TIMEOUT_MS);
            Check.equal(expected, records.stream().map(r -> r.value() + "@" + r.offset()).collect(Collectors.joining(" ")),
                    isolation + " consumer sees");
        }
    }
}
