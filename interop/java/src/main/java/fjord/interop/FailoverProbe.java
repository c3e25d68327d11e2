package fjord.interop;

import java.io.BufferedWriter;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Properties;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;

/**
 * failover-probe: a measurement, not a check (tuning/results/replication.md,
 * scripts/measure-replication.sh). An idempotent producer (acks=all, linger 0, Kafka 4's
 * defaults otherwise) sends 100-byte records to partition 0 of the existing topic
 * {@code --topic}, one at a time, each waiting for its acknowledgement, and writes one line
 * per acknowledgement to {@code --out}: the wall-clock time in milliseconds and the offset.
 * After {@code --warmup-ms} it writes the partition leader's broker id to
 * {@code --leader-file}, so that the caller can SIGKILL that node and read off the output
 * when the first send after the kill was acknowledged (the failover time: kill to the first
 * successful produce on the new leader). Runs for {@code --duration-ms} in all.
 */
final class FailoverProbe {
    static final long DEFAULT_DURATION_MS = 40_000;
    static final long DEFAULT_WARMUP_MS = 5_000;
    static final int RECORD_BYTES = 100;

    private FailoverProbe() {}

    static void run(Main.Args args) throws Exception {
        String topic = args.require("topic");
        Path out = Path.of(args.require("out"));
        Path leaderFile = Path.of(args.require("leader-file"));
        long duration = Long.parseLong(args.options.getOrDefault("duration-ms", Long.toString(DEFAULT_DURATION_MS)));
        long warmup = Long.parseLong(args.options.getOrDefault("warmup-ms", Long.toString(DEFAULT_WARMUP_MS)));
        Properties p = Kit.producerProps(args.bootstrap);
        p.put(ProducerConfig.LINGER_MS_CONFIG, "0");
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "120000");
        byte[] value = new byte[RECORD_BYTES];
        long start = System.currentTimeMillis();
        long acks = 0;
        long largestGap = 0;
        long gapFrom = 0;
        long last = start;
        boolean leaderNamed = false;
        try (KafkaProducer<String, byte[]> producer = new KafkaProducer<>(p);
                Admin admin = Kit.admin(args.bootstrap);
                BufferedWriter w = Files.newBufferedWriter(out, StandardCharsets.UTF_8)) {
            while (System.currentTimeMillis() - start < duration) {
                RecordMetadata md = producer.send(new ProducerRecord<>(topic, 0, null, value)).get();
                long now = System.currentTimeMillis();
                w.write(now + " " + md.offset() + "\n");
                acks++;
                if (now - last > largestGap) {
                    largestGap = now - last;
                    gapFrom = last;
                }
                last = now;
                if (!leaderNamed && now - start >= warmup) {
                    TopicDescription d = Kit.get(admin.describeTopics(List.of(topic)).allTopicNames(),
                            "describeTopics " + topic).get(topic);
                    int leader = d.partitions().get(0).leader().id();
                    w.flush();
                    Path tmp = leaderFile.resolveSibling(leaderFile.getFileName() + ".tmp");
                    Files.writeString(tmp, Integer.toString(leader));
                    Files.move(tmp, leaderFile, java.nio.file.StandardCopyOption.ATOMIC_MOVE);
                    leaderNamed = true;
                }
            }
        }
        System.out.println("failover-probe: " + acks + " acknowledged sends; largest gap " + largestGap
                + " ms, from " + gapFrom + " to " + (gapFrom + largestGap));
    }
}
