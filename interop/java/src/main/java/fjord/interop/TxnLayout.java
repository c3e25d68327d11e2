package fjord.interop;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.stream.Collectors;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;

/**
 * txn-layout: transactions A (c1..c3) committed, B (a1..a3) aborted, C (c4, c5)
 * committed on a 1-partition topic; the offsets each isolation level sees, and the
 * end offsets while B is open (KAFKA_BEHAVIOUR.md section 5).
 */
final class TxnLayout {
    /** Longest the markers of the last transaction may take to be written. */
    static final long MARKERS_TIMEOUT_MS = 30_000;
    /** Longest a read to the end may take. */
    static final long READ_TIMEOUT_MS = 30_000;

    private TxnLayout() {}

    static void run(Main.Args args) throws Exception {
        String topic = Kit.unique("txn-layout");
        TopicPartition tp = new TopicPartition(topic, 0);
        try (Admin admin = Kit.admin(args.bootstrap)) {
            Kit.createTopic(admin, topic, 1);
        }
        Properties pp = Kit.stringProducerProps(args.bootstrap);
        pp.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, Kit.unique("txn-layout-tx"));
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(pp);
                KafkaConsumer<String, String> uncommitted =
                        new KafkaConsumer<>(Kit.stringConsumerProps(args.bootstrap, "read_uncommitted"));
                KafkaConsumer<String, String> committed =
                        new KafkaConsumer<>(Kit.stringConsumerProps(args.bootstrap, "read_committed"))) {
            producer.initTransactions();
            Check.ok("initTransactions");
            transaction(producer, topic, List.of("c1", "c2", "c3"));
            producer.commitTransaction();
            Check.ok("transaction A (c1..c3) committed");

            transaction(producer, topic, List.of("a1", "a2", "a3"));
            producer.flush();
            Check.equal(7L, Kit.endOffsets(uncommitted, List.of(tp)).get(tp),
                    "while B is open: read_uncommitted end offset (high watermark)");
            Check.equal(4L, Kit.endOffsets(committed, List.of(tp)).get(tp),
                    "while B is open: read_committed end offset (last stable offset)");
            producer.abortTransaction();
            Check.ok("transaction B (a1..a3) aborted");

            transaction(producer, topic, List.of("c4", "c5"));
            producer.commitTransaction();
            Check.ok("transaction C (c4, c5) committed");

            awaitEnd(uncommitted, tp, "read_uncommitted");
            awaitEnd(committed, tp, "read_committed");
            readAndCheck(uncommitted, tp, "read_uncommitted", "c1@0 c2@1 c3@2 a1@4 a2@5 a3@6 c4@8 c5@9");
            readAndCheck(committed, tp, "read_committed", "c1@0 c2@1 c3@2 c4@8 c5@9");
        }
    }

    private static void transaction(KafkaProducer<String, String> producer, String topic, List<String> values)
            throws Exception {
        producer.beginTransaction();
        for (String v : values) {
            producer.send(new ProducerRecord<>(topic, 0, null, v)).get();
        }
    }

    private static void awaitEnd(KafkaConsumer<String, String> c, TopicPartition tp, String isolation) {
        final Object[] last = {null};
        Check.waitFor(isolation + " end offset reaches 11 (after the last COMMIT marker)", MARKERS_TIMEOUT_MS, () -> {
            long end = Kit.endOffsets(c, List.of(tp)).get(tp);
            last[0] = end;
            return end == 11 ? Boolean.TRUE : null;
        }, () -> last[0]);
    }

    private static void readAndCheck(KafkaConsumer<String, String> c, TopicPartition tp, String isolation,
            String expected) {
        List<ConsumerRecord<String, String>> records =
                Kit.readToEnd(c, List.of(tp), Map.of(tp, 11L), READ_TIMEOUT_MS);
        List<String> seen = new ArrayList<>();
        for (ConsumerRecord<String, String> r : records) {
            seen.add(r.value() + "@" + r.offset());
        }
        Check.equal(expected, seen.stream().collect(Collectors.joining(" ")), isolation + " consumer sees");
        Check.equal(11L, c.position(tp), isolation + " consumer position");
    }
}
