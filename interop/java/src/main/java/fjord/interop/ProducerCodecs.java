package fjord.interop;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.BitSet;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ProducerState;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;

/**
 * producer-codecs: for each codec, a KafkaProducer with Kafka 4.x's defaults
 * (idempotence on, acks=all, max.in.flight 5) writes keyed records with headers over a
 * 6-partition topic; a KafkaConsumer reads them back and every record must come back
 * exactly once, unchanged, in order per partition, at the offset the producer was told.
 */
final class ProducerCodecs {
    static final String[] CODECS = {"none", "gzip", "snappy", "lz4", "zstd"};
    static final int PARTITIONS = 6;
    /** Records per codec unless {@code --records} says otherwise. */
    static final int RECORDS_DEFAULT = 100_000;
    /** Distinct keys (a prime, so keys and partitions do not line up). */
    static final int KEYS = 10_007;
    /** Longest the producer may take to have every send acknowledged, per codec. */
    static final long PRODUCE_TIMEOUT_MS = 120_000;
    /** Longest the consumer may take to read everything back, per codec. */
    static final long READ_TIMEOUT_MS = 120_000;

    private ProducerCodecs() {}

    static String key(int i) {
        return "key-" + (i % KEYS);
    }

    /** A value of 20..219 bytes that compresses like real text; every 97th is null. */
    static byte[] value(String codec, int i) {
        if (i % 97 == 0) {
            return null;
        }
        StringBuilder sb = new StringBuilder("codec=").append(codec).append(" i=").append(i).append(' ');
        int len = 20 + (i * 7919) % 200;
        while (sb.length() < len) {
            sb.append("fjord-").append(i % 13).append(' ');
        }
        sb.setLength(len);
        return sb.toString().getBytes(StandardCharsets.UTF_8);
    }

    static List<Header> headers(String codec, int i) {
        List<Header> h = new ArrayList<>();
        h.add(new RecordHeader("idx", ByteBuffer.allocate(4).putInt(i).array()));
        h.add(new RecordHeader("codec", codec.getBytes(StandardCharsets.UTF_8)));
        if (i % 5 == 0) {
            h.add(new RecordHeader("nullable", (byte[]) null));
        }
        if (i % 3 == 0) {
            // A repeated header name: order and duplicates must survive.
            h.add(new RecordHeader("idx", new byte[] {(byte) (i % 256)}));
        }
        return h;
    }

    static void run(Main.Args args) throws Exception {
        int n = args.recordsOr(RECORDS_DEFAULT);
        try (Admin admin = Kit.admin(args.bootstrap)) {
            for (String codec : CODECS) {
                runCodec(args.bootstrap, admin, codec, n);
            }
        }
    }

    private static void runCodec(String bootstrap, Admin admin, String codec, int n) throws Exception {
        String topic = Kit.unique("codecs-" + codec);
        Kit.createTopic(admin, topic, PARTITIONS);
        int[] partOf = new int[n];
        long[] offsetOf = new long[n];
        Arrays.fill(offsetOf, -1);
        AtomicInteger acked = new AtomicInteger();
        ConcurrentLinkedQueue<String> errors = new ConcurrentLinkedQueue<>();

        Properties pp = Kit.producerProps(bootstrap);
        pp.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, codec);
        long t0 = System.nanoTime();
        try (KafkaProducer<String, byte[]> producer = new KafkaProducer<>(pp)) {
            for (int i = 0; i < n; i++) {
                final int idx = i;
                ProducerRecord<String, byte[]> r =
                        new ProducerRecord<>(topic, null, null, key(i), value(codec, i), headers(codec, i));
                producer.send(r, (md, e) -> {
                    if (e != null) {
                        if (errors.size() < 10) {
                            errors.add("record " + idx + ": " + Check.describe(e));
                        }
                    } else {
                        partOf[idx] = md.partition();
                        offsetOf[idx] = md.offset();
                    }
                    acked.incrementAndGet();
                });
            }
            producer.flush();
            Check.waitFor(codec + ": every send completed", PRODUCE_TIMEOUT_MS,
                    () -> acked.get() == n ? Boolean.TRUE : null, acked::get);
        }
        long produceMs = (System.nanoTime() - t0) / 1_000_000;
        Check.that(errors.isEmpty(), codec + ": no send failed", errors);
        Check.info(codec + ": produced " + n + " records in " + produceMs + " ms");

        // Offsets the producer was told: per partition exactly 0..count-1, each once.
        long[] count = new long[PARTITIONS];
        Map<Long, Integer> byPosition = new HashMap<>(n * 2);
        for (int i = 0; i < n; i++) {
            count[partOf[i]]++;
            Integer prev = byPosition.put(((long) partOf[i] << 40) | offsetOf[i], i);
            if (prev != null) {
                throw Check.fail(codec + ": records " + prev + " and " + i + " were both acknowledged at "
                        + partOf[i] + "@" + offsetOf[i]);
            }
        }
        for (int p = 0; p < PARTITIONS; p++) {
            if (count[p] == 0) {
                throw Check.fail(codec + ": partition " + p + " got no record (keys should spread)");
            }
        }
        Check.ok(codec + ": acknowledged offsets are unique, per-partition counts " + Arrays.toString(count));

        List<TopicPartition> tps = Kit.partitions(topic, PARTITIONS);
        Map<TopicPartition, ProducerState> producers = new HashMap<>();
        for (var e : Kit.get(admin.describeProducers(tps).all(), "describeProducers").entrySet()) {
            List<ProducerState> states = e.getValue().activeProducers();
            if (states.size() != 1) {
                throw Check.fail(codec + ": describeProducers " + e.getKey() + ": expected one producer, got " + states);
            }
            producers.put(e.getKey(), states.get(0));
        }
        for (TopicPartition tp : tps) {
            ProducerState s = producers.get(tp);
            if (s.lastSequence() != count[tp.partition()] - 1 || s.producerEpoch() != 0) {
                throw Check.fail(codec + ": describeProducers " + tp + ": expected epoch 0 and lastSequence "
                        + (count[tp.partition()] - 1) + ", got " + s);
            }
        }
        Check.ok(codec + ": describeProducers shows one idempotent producer per partition, lastSequence = count - 1");

        Properties cp = Kit.consumerProps(bootstrap, "read_uncommitted");
        cp.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "5000");
        long t1 = System.nanoTime();
        try (KafkaConsumer<String, byte[]> consumer = new KafkaConsumer<>(cp)) {
            Map<TopicPartition, Long> end = Kit.endOffsets(consumer, tps);
            for (TopicPartition tp : tps) {
                if (end.get(tp) != count[tp.partition()]) {
                    throw Check.fail(codec + ": end offset of " + tp + ": expected " + count[tp.partition()]
                            + ", got " + end.get(tp));
                }
            }
            Check.ok(codec + ": end offsets equal the acknowledged counts");
            BitSet seen = new BitSet(n);
            long[] nextOffset = new long[PARTITIONS];
            int[] lastIdx = new int[PARTITIONS];
            Arrays.fill(lastIdx, -1);
            long[] records = {0};
            // Verified record by record as it arrives, so 100k records are never held at once.
            verifyAll(consumer, tps, end, codec, n, seen, nextOffset, lastIdx, byPosition, records);
            Check.equal(n, seen.cardinality(), codec + ": distinct records read back");
            Check.equal((long) n, records[0], codec + ": records read back (no duplicates)");
        }
        Check.info(codec + ": consumed and verified " + n + " records in " + (System.nanoTime() - t1) / 1_000_000 + " ms");
    }

    private static void verifyAll(KafkaConsumer<String, byte[]> consumer, List<TopicPartition> tps,
            Map<TopicPartition, Long> end, String codec, int n, BitSet seen, long[] nextOffset, int[] lastIdx,
            Map<Long, Integer> byPosition, long[] records) {
        consumer.assign(tps);
        consumer.seekToBeginning(tps);
        long deadline = System.nanoTime() + READ_TIMEOUT_MS * 1_000_000L;
        while (true) {
            for (ConsumerRecord<String, byte[]> r : consumer.poll(Duration.ofMillis(Kit.POLL_MS))) {
                records[0]++;
                int p = r.partition();
                if (r.offset() != nextOffset[p]) {
                    throw Check.fail(codec + ": partition " + p + ": expected offset " + nextOffset[p] + ", got "
                            + r.offset() + " (a gap or a repeat)");
                }
                nextOffset[p] = r.offset() + 1;
                Integer idx = byPosition.get(((long) p << 40) | r.offset());
                if (idx == null) {
                    throw Check.fail(codec + ": " + p + "@" + r.offset() + " was never acknowledged to the producer");
                }
                int i = idx;
                if (seen.get(i)) {
                    throw Check.fail(codec + ": record " + i + " read twice");
                }
                seen.set(i);
                if (i <= lastIdx[p]) {
                    throw Check.fail(codec + ": partition " + p + ": record " + i + " after record " + lastIdx[p]
                            + " (out of send order)");
                }
                lastIdx[p] = i;
                if (!key(i).equals(r.key())) {
                    throw Check.fail(codec + ": record " + i + ": key " + r.key() + ", expected " + key(i));
                }
                if (!Arrays.equals(value(codec, i), r.value())) {
                    throw Check.fail(codec + ": record " + i + ": value differs: "
                            + (r.value() == null ? "null" : new String(r.value(), StandardCharsets.UTF_8)));
                }
                Header[] got = r.headers().toArray();
                List<Header> want = headers(codec, i);
                boolean same = got.length == want.size();
                for (int h = 0; same && h < got.length; h++) {
                    same = got[h].key().equals(want.get(h).key())
                            && Arrays.equals(got[h].value(), want.get(h).value());
                }
                if (!same) {
                    throw Check.fail(codec + ": record " + i + ": headers " + Arrays.toString(got) + ", expected " + want);
                }
            }
            boolean done = true;
            for (TopicPartition tp : tps) {
                if (consumer.position(tp, Duration.ofMillis(Kit.ADMIN_TIMEOUT_MS)) < end.get(tp)) {
                    done = false;
                }
            }
            if (done) {
                Check.ok(codec + ": every record came back with its key, value and headers, in order per partition");
                return;
            }
            if (System.nanoTime() > deadline) {
                throw Check.fail(codec + ": timed out after " + READ_TIMEOUT_MS + " ms reading back; "
                        + seen.cardinality() + " of " + n + " records read");
            }
        }
    }
}
