package fjord.interop;

import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeSet;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.serialization.LongDeserializer;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;

/**
 * streams-eos: a Kafka Streams word count with processing.guarantee=exactly_once_v2 and
 * otherwise default configs (Streams creates its own repartition and changelog topics)
 * runs in a child JVM over 100,000 input lines; the child is SIGKILLed part-way through
 * and started again; the output read with read_committed must end with exactly the
 * right count for every word, and no count may ever exceed it (a double count after
 * the crash would).
 */
final class StreamsEos {
    /** The scenario name of the Streams application itself (run in the child JVM). */
    static final String APP_SCENARIO = "streams-eos-app";
    static final int RECORDS_DEFAULT = 100_000;
    static final int WORDS = 50;
    static final int WORDS_PER_LINE = 5;
    static final int PARTITIONS = 2;
    /** The child is killed once its committed input offsets pass this fraction of the input. */
    static final double KILL_AT_FRACTION = 0.3;
    /** Longest the first child may take to commit that much (start-up and rebalance included). */
    static final long FIRST_PROGRESS_TIMEOUT_MS = 90_000;
    /**
     * Longest the second child may take to count everything: its first rebalance waits
     * for the killed member's session to expire (Kafka's default 45 s, kept), then it
     * restores its store from the changelog and counts the remaining 70 %.
     */
    static final long FINISH_TIMEOUT_MS = 240_000;
    /** Longest the parent waits for a child to exit after a kill. */
    static final long CHILD_EXIT_TIMEOUT_MS = 20_000;
    /** Lines of child output kept for a failure message. */
    static final int CHILD_OUTPUT_LINES_MAX = 4000;
    static final String STATE_PREFIX = "streams-state: ";
    static final String ERROR_PREFIX = "streams-error: ";

    private static final List<Process> CHILDREN = Collections.synchronizedList(new ArrayList<>());

    private StreamsEos() {}

    /** Kills every child JVM still running (the watchdog calls this before it halts). */
    static void killChildren() {
        synchronized (CHILDREN) {
            for (Process p : CHILDREN) {
                p.destroyForcibly();
            }
        }
    }

    static String word(int w) {
        return String.format("w%02d", w);
    }

    /** Line i of the input: WORDS_PER_LINE words picked by a fixed-seed LCG. */
    static String line(int i) {
        long x = i * 6364136223846793005L + 1442695040888963407L;
        StringBuilder sb = new StringBuilder();
        for (int k = 0; k < WORDS_PER_LINE; k++) {
            x = x * 6364136223846793005L + 1442695040888963407L;
            if (k > 0) {
                sb.append(' ');
            }
            sb.append(word((int) ((x >>> 33) % WORDS)));
        }
        return sb.toString();
    }

    /** A child JVM running the app, with its output collected line by line. */
    static final class Child {
        final Process process;
        final ConcurrentLinkedQueue<String> lines = new ConcurrentLinkedQueue<>();
        final Thread reader;
        final String name;

        Child(String name, List<String> command) throws IOException {
            this.name = name;
            ProcessBuilder pb = new ProcessBuilder(command).redirectErrorStream(true);
            this.process = pb.start();
            CHILDREN.add(process);
            this.reader = new Thread(() -> {
                try (BufferedReader r = new BufferedReader(
                        new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8))) {
                    String l;
                    while ((l = r.readLine()) != null) {
                        if (lines.size() < CHILD_OUTPUT_LINES_MAX) {
                            lines.add(l);
                        }
                        if (l.startsWith(STATE_PREFIX) || l.startsWith(ERROR_PREFIX)) {
                            System.out.println(name + ": " + l);
                        }
                    }
                } catch (IOException e) {
                    lines.add("(reading the child's output failed: " + e + ")");
                }
            }, name + "-output");
            reader.setDaemon(true);
            reader.start();
        }

        /** SIGKILL (Process.destroyForcibly on Linux), then waits for the exit. */
        void kill() throws InterruptedException {
            process.destroyForcibly();
            if (!process.waitFor(CHILD_EXIT_TIMEOUT_MS, TimeUnit.MILLISECONDS)) {
                throw Check.fail(name + " did not exit within " + CHILD_EXIT_TIMEOUT_MS + " ms of SIGKILL");
            }
            reader.join(CHILD_EXIT_TIMEOUT_MS);
            CHILDREN.remove(process);
        }

        /** Fails the scenario, with the child's errors, if the child has exited. */
        void assertAlive() {
            if (process.isAlive()) {
                return;
            }
            try {
                reader.join(CHILD_EXIT_TIMEOUT_MS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            throw Check.fail(name + " (the Kafka Streams app) exited with code " + process.exitValue() + ". "
                    + diagnose() + "\n--- " + name + " output (errors and states) ---\n" + interesting()
                    + "--- end ---");
        }

        /** The child's state changes, errors and exception lines. */
        String interesting() {
            StringBuilder sb = new StringBuilder();
            int n = 0;
            for (String l : lines) {
                if ((l.startsWith(STATE_PREFIX) || l.startsWith(ERROR_PREFIX) || l.contains("Exception")
                        || l.contains(" ERROR ")) && n++ < 60) {
                    sb.append(l).append('\n');
                }
            }
            return sb.toString();
        }

        /** One sentence naming the broker refusal that stopped Streams, if there was one. */
        String diagnose() {
            for (String l : lines) {
                int at = l.indexOf("InvalidConfigurationException");
                if (l.startsWith(ERROR_PREFIX) && at >= 0) {
                    return "The broker refused a config of a topic Kafka Streams creates for itself: "
                            + l.substring(at) + ".";
                }
            }
            for (String l : lines) {
                if (l.startsWith(ERROR_PREFIX)) {
                    return "Kafka Streams failed: " + l.substring(ERROR_PREFIX.length()) + ".";
                }
            }
            return "It printed no error of its own.";
        }
    }

    static void run(Main.Args args) throws Exception {
        int n = args.recordsOr(RECORDS_DEFAULT);
        String appId = Kit.unique("wordcount");
        String input = Kit.unique("wordcount-in");
        String output = Kit.unique("wordcount-out");
        Path stateDir = Files.createTempDirectory("fjord-streams-");
        long[] expected = new long[WORDS];
        for (int i = 0; i < n; i++) {
            for (String w : line(i).split(" ")) {
                expected[Integer.parseInt(w.substring(1))]++;
            }
        }
        try (Admin admin = Kit.admin(args.bootstrap)) {
            Kit.get(admin.createTopics(List.of(new NewTopic(input, PARTITIONS, (short) 1),
                    new NewTopic(output, PARTITIONS, (short) 1))).all(), "createTopics");
            Kit.awaitPartitions(admin, input, PARTITIONS);
            Kit.awaitPartitions(admin, output, PARTITIONS);
            Kit.awaitLeadersServe(admin, input, PARTITIONS);
            Kit.awaitLeadersServe(admin, output, PARTITIONS);
            try (KafkaProducer<String, String> p = new KafkaProducer<>(Kit.stringProducerProps(args.bootstrap))) {
                for (int i = 0; i < n; i++) {
                    p.send(new ProducerRecord<>(input, i % PARTITIONS, null, line(i)));
                }
                p.flush();
            }
            Check.ok("produced " + n + " input lines (" + n * WORDS_PER_LINE + " words)");

            List<String> command = childCommand(args.bootstrap, appId, input, output, stateDir);
            Child first = new Child("streams-1", command);
            try {
                long killAt = (long) (n * KILL_AT_FRACTION);
                Check.waitFor("the first Streams app committed input offsets past " + killAt, FIRST_PROGRESS_TIMEOUT_MS,
                        () -> {
                            first.assertAlive();
                            return committedInput(admin, appId, input) >= killAt ? Boolean.TRUE : null;
                        }, () -> committedInput(admin, appId, input) + " input records committed");
                first.kill();
                long atKill = committedInput(admin, appId, input);
                Check.that(atKill < n, "the first app was SIGKILLed part-way through", atKill + " of " + n);
            } finally {
                first.process.destroyForcibly();
            }

            Child second = new Child("streams-2", command);
            try {
                TopicPartition[] outTps = {new TopicPartition(output, 0), new TopicPartition(output, 1)};
                Map<String, Long> latest = new TreeMap<>();
                List<String> overcounts = new ArrayList<>();
                Properties cp = Kit.stringConsumerProps(args.bootstrap, "read_committed");
                cp.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, LongDeserializer.class.getName());
                try (KafkaConsumer<String, Long> c = new KafkaConsumer<>(cp)) {
                    c.assign(Arrays.asList(outTps));
                    c.seekToBeginning(Arrays.asList(outTps));
                    Check.waitFor("read_committed output reaches the exact count of every word", FINISH_TIMEOUT_MS, () -> {
                        second.assertAlive();
                        for (ConsumerRecord<String, Long> r : c.poll(Duration.ofMillis(Kit.POLL_MS))) {
                            int w = Integer.parseInt(r.key().substring(1));
                            if (r.value() > expected[w] && overcounts.size() < 10) {
                                overcounts.add(r.key() + "=" + r.value() + " at " + r.partition() + "@" + r.offset()
                                        + " (expected at most " + expected[w] + ")");
                            }
                            latest.put(r.key(), r.value());
                        }
                        if (!overcounts.isEmpty()) {
                            throw Check.fail("a count exceeded the true count (double counting): " + overcounts);
                        }
                        for (int w = 0; w < WORDS; w++) {
                            Long v = latest.get(word(w));
                            if (v == null || v != expected[w]) {
                                return null;
                            }
                        }
                        return Boolean.TRUE;
                    }, () -> "latest counts " + latest + ", expected " + Arrays.toString(expected));
                }
                Check.equal((long) n, committedInput(admin, appId, input), "the app's committed input offsets cover the input");
                checkInternalTopics(admin, appId);
            } finally {
                second.kill();
            }
        } finally {
            deleteTree(stateDir.toFile());
        }
    }

    /**
     * The topics Streams created for itself, with its defaults: the changelog of the
     * "counts" store compacted, the repartition topic of the groupBy with delete, both
     * with the input's partition count, replication factor left to the broker (-1).
     */
    private static void checkInternalTopics(Admin admin, String appId) {
        String changelog = appId + "-counts-changelog";
        String repartition = appId + "-counts-repartition";
        Set<String> own = new TreeSet<>();
        for (String t : Kit.get(admin.listTopics().names(), "listTopics")) {
            if (t.startsWith(appId + "-")) {
                own.add(t);
            }
        }
        Check.equal(new TreeSet<>(List.of(changelog, repartition)), own, "the topics Kafka Streams created");
        Map<String, TopicDescription> described = Kit.get(admin.describeTopics(own).allTopicNames(), "describeTopics");
        Map<ConfigResource, Config> configs = Kit.get(admin.describeConfigs(List.of(
                new ConfigResource(ConfigResource.Type.TOPIC, changelog),
                new ConfigResource(ConfigResource.Type.TOPIC, repartition))).all(), "describeConfigs");
        for (String t : own) {
            Check.equal(PARTITIONS, described.get(t).partitions().size(), "partitions of " + t);
        }
        Check.equal("compact", configs.get(new ConfigResource(ConfigResource.Type.TOPIC, changelog))
                .get("cleanup.policy").value(), "cleanup.policy of " + changelog);
        Check.equal("delete", configs.get(new ConfigResource(ConfigResource.Type.TOPIC, repartition))
                .get("cleanup.policy").value(), "cleanup.policy of " + repartition);
    }

    /** The sum of the app's committed offsets on the input topic. */
    private static long committedInput(Admin admin, String appId, String input) {
        try {
            Map<TopicPartition, OffsetAndMetadata> m = admin.listConsumerGroupOffsets(appId).partitionsToOffsetAndMetadata()
                    .get(Kit.ADMIN_TIMEOUT_MS, TimeUnit.MILLISECONDS);
            long sum = 0;
            for (var e : m.entrySet()) {
                if (e.getKey().topic().equals(input) && e.getValue() != null) {
                    sum += e.getValue().offset();
                }
            }
            return sum;
        } catch (Exception e) {
            return -1;
        }
    }

    private static List<String> childCommand(String bootstrap, String appId, String input, String output, Path stateDir) {
        String java = Path.of(System.getProperty("java.home"), "bin", "java").toString();
        return List.of(java, "-XX:+UseSerialGC", "-cp", System.getProperty("java.class.path"), Main.class.getName(),
                APP_SCENARIO, "--bootstrap", bootstrap, "--app-id", appId, "--input", input, "--output", output,
                "--state-dir", stateDir.toString());
    }

    private static void deleteTree(File f) {
        File[] children = f.listFiles();
        if (children != null) {
            for (File c : children) {
                deleteTree(c);
            }
        }
        f.delete();
    }

    /**
     * The Streams application (child JVM): word count, exactly_once_v2, every other
     * config at its default. Prints its state changes and any uncaught error, exits
     * when Streams stops, and halts when its parent goes away (stdin closes).
     */
    static void runApp(Main.Args args) throws Exception {
        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, args.require("app-id"));
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args.bootstrap);
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        p.put(StreamsConfig.STATE_DIR_CONFIG, args.require("state-dir"));
        p.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class.getName());
        p.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class.getName());
        // Nothing else is set: the state directory is the scenario's temp dir and the
        // serdes are what the topology needs. The consumer session timeout stays at its
        // default 45 s, so the restarted app's first rebalance waits that long for the
        // SIGKILLed member (which sent no LeaveGroup) to expire.
        StreamsBuilder b = new StreamsBuilder();
        b.<String, String>stream(args.require("input"))
                .flatMapValues(v -> Arrays.asList(v.split(" ")))
                .groupBy((k, w) -> w)
                .count(Materialized.as("counts"))
                .toStream()
                .to(args.require("output"), Produced.with(Serdes.String(), Serdes.Long()));
        KafkaStreams streams = new KafkaStreams(b.build(), p);
        Object done = new Object();
        streams.setStateListener((now, before) -> {
            System.out.println(STATE_PREFIX + before + " -> " + now);
            if (now == KafkaStreams.State.ERROR || now == KafkaStreams.State.NOT_RUNNING) {
                synchronized (done) {
                    done.notifyAll();
                }
            }
        });
        streams.setUncaughtExceptionHandler(e -> {
            System.out.println(ERROR_PREFIX + Check.describe(e));
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        Thread parentWatch = new Thread(() -> {
            try {
                while (System.in.read() >= 0) {
                    // The parent never writes; reading only detects that it went away.
                }
            } catch (IOException e) {
                // Treated like end of input.
            }
            System.out.println(STATE_PREFIX + "parent gone, halting");
            Runtime.getRuntime().halt(Main.EXIT_ERROR);
        }, "parent-watch");
        parentWatch.setDaemon(true);
        parentWatch.start();
        streams.start();
        synchronized (done) {
            while (streams.state() != KafkaStreams.State.ERROR && streams.state() != KafkaStreams.State.NOT_RUNNING) {
                done.wait(1000);
            }
        }
        streams.close(Duration.ofSeconds(10));
        throw Check.fail("Kafka Streams stopped in state " + streams.state());
    }
}
