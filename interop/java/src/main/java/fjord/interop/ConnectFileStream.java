package fjord.interop;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Deque;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.GroupState;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;

/**
 * connect-distributed: stock Kafka Connect in distributed mode (the
 * {@code ConnectDistributed} worker of connect-runtime, in a child JVM whose class path
 * is the jars of interop/connect) with the FileStream connectors, against the broker.
 *
 * <p>The worker gets a group, three storage topic names and a REST listener on a free
 * 127.0.0.1 port; Connect creates its config, offset and status topics itself with its
 * defaults (compacted; 1, 25 and 5 partitions). The only defaults changed are the
 * replication factor of those topics (-1, the broker's default, because Connect's 3
 * needs three brokers), String converters (so that the topic holds the lines as they
 * are), a 1 s offset flush interval (instead of 60 s, to keep the run short), a 30 s
 * graceful task shutdown (instead of 5 s, so that a loaded machine still stops the tasks
 * gracefully; see below) and plugin discovery by ServiceLoader manifests only (what the
 * worker itself recommends when every plugin has them; the default reflective scan of
 * the class path costs 15-20 s per start).
 *
 * <p>Through the REST API it creates a FileStreamSource (a temp file → a 1-partition
 * topic) and a FileStreamSink (that topic → another temp file), appends lines and waits
 * until the sink file has them. It then stops the worker with SIGTERM, appends more
 * lines while it is down, starts it again, and appends more. Checks:
 * <ul>
 *   <li>the source's file position is in the offsets topic (read there directly), the
 *       sink's position is its consumer group's committed offset, and after the restart
 *       the source resumes from that position: the topic holds every line exactly once,
 *       in file order (a source that re-read its file from the start would write the
 *       first lines twice);
 *   <li>both connectors come back RUNNING after the restart from the config topic
 *       alone (nothing is posted again), with the config that was posted;
 *   <li>the sink file holds every line exactly once, in order.
 * </ul>
 *
 * <p>Why exactly once: Connect itself promises at least once for these connectors. A
 * source's offsets are committed after its records are acknowledged, and a sink's
 * consumer offsets after the sink flushed; only a crash between the two can repeat
 * records. A SIGTERM stops the worker gracefully: each source task commits its final
 * offsets and each sink task flushes and commits its final consumer offsets before the
 * worker leaves the group, so after a graceful restart a repeated line can only come
 * from an offset the broker lost or returned stale.
 */
final class ConnectFileStream {
    static final String WORKER_MAIN = "org.apache.kafka.connect.cli.ConnectDistributed";
    /** Lines appended while the worker runs the first time, while it is down, and after the restart. */
    static final int LINES_BEFORE = 300;
    static final int LINES_WHILE_DOWN = 200;
    static final int LINES_AFTER = 300;
    /** Longest a worker may take from its start to a REST API that lists connectors. */
    static final long WORKER_READY_TIMEOUT_MS = 120_000;
    /** Longest creating a connector may be retried (the worker answers 409 while it rebalances). */
    static final long CREATE_TIMEOUT_MS = 60_000;
    /** Longest the connectors may take to be RUNNING, and the sink to have the lines. */
    static final long PIPELINE_TIMEOUT_MS = 90_000;
    /** Longest the worker may take to exit after SIGTERM. */
    static final long STOP_TIMEOUT_MS = 60_000;
    /** Poll period of the REST and file waits. */
    static final long POLL_MS = 200;
    /** Timeout of one REST request (Connect's own request timeout is 90 s). */
    static final Duration REST_TIMEOUT = Duration.ofSeconds(30);
    /** Lines of worker output kept for a failure report: the last ones, and warnings and errors. */
    static final int TAIL_LINES = 200;
    static final int PROBLEM_LINES = 200;
    /** Heap of the worker JVM. */
    static final String WORKER_HEAP = "-Xmx512m";
    /** What ConnectDistributed logs once its shutdown hook stopped the herder and the worker. */
    static final String STOPPED_LINE = "Kafka Connect stopped";

    private static final List<Process> CHILDREN = Collections.synchronizedList(new ArrayList<>());
    private static final ObjectMapper JSON = new ObjectMapper();

    private ConnectFileStream() {}

    private static long startedNanos = System.nanoTime();

    /** An info line with the time since the scenario started (where a slow run spent it). */
    private static void phase(String what) {
        Check.info(String.format("[+%.1f s] %s", (System.nanoTime() - startedNanos) / 1e9, what));
    }

    /** Kills every worker JVM still running (the watchdog calls this before it halts). */
    static void killChildren() {
        synchronized (CHILDREN) {
            for (Process p : CHILDREN) {
                p.destroyForcibly();
            }
        }
    }

    static String line(int i) {
        return String.format("line-%05d the quick brown fox %d", i, i * 7919L % 1000);
    }

    /** A Connect worker JVM, with its output kept (bounded) for failure reports. */
    static final class Worker {
        final String name;
        final Process process;
        final Thread reader;
        private final Deque<String> tail = new ArrayDeque<>();
        private final List<String> problems = new ArrayList<>();
        private boolean stoppedLine;

        Worker(String name, List<String> command) throws IOException {
            this.name = name;
            this.process = new ProcessBuilder(command).redirectErrorStream(true).start();
            CHILDREN.add(process);
            this.reader = new Thread(() -> {
                try (BufferedReader r = new BufferedReader(
                        new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8))) {
                    String l;
                    while ((l = r.readLine()) != null) {
                        keep(l);
                    }
                } catch (IOException e) {
                    keep("(reading the worker's output failed: " + e + ")");
                }
            }, name + "-output");
            reader.setDaemon(true);
            reader.start();
        }

        private synchronized void keep(String l) {
            tail.addLast(l);
            if (tail.size() > TAIL_LINES) {
                tail.removeFirst();
            }
            if ((l.contains(" WARN ") || l.contains(" ERROR ") || l.startsWith("Exception"))
                    && problems.size() < PROBLEM_LINES) {
                problems.add(l);
            }
            if (l.contains(STOPPED_LINE)) {
                stoppedLine = true;
            }
        }

        /** The worker's warnings and errors so far (bounded), for a passing run's output. */
        synchronized List<String> problems() {
            return new ArrayList<>(problems);
        }

        synchronized boolean loggedStopped() {
            return stoppedLine;
        }

        synchronized String report() {
            return "--- " + name + ": warnings and errors ---\n" + String.join("\n", problems)
                    + "\n--- " + name + ": last " + tail.size() + " lines ---\n" + String.join("\n", tail)
                    + "\n--- end of " + name + " ---";
        }

        /** Fails the scenario, with the worker's output, if the worker has exited. */
        void assertAlive() {
            if (!process.isAlive()) {
                joinReader();
                throw Check.fail(name + " exited with code " + process.exitValue() + "\n" + report());
            }
        }

        void joinReader() {
            try {
                reader.join(10_000);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }

        /**
         * SIGTERM and a bounded wait; returns the exit code. Sent through the process
         * handle: Process.destroy would also close our end of the worker's output, and the
         * worker's shutdown log (and the line that says it stopped) would be lost.
         */
        int terminate() throws InterruptedException {
            process.toHandle().destroy();
            if (!process.waitFor(STOP_TIMEOUT_MS, TimeUnit.MILLISECONDS)) {
                process.destroyForcibly();
                throw Check.fail(name + " did not exit within " + STOP_TIMEOUT_MS + " ms of SIGTERM\n" + report());
            }
            joinReader();
            CHILDREN.remove(process);
            return process.exitValue();
        }

        void kill() {
            process.destroyForcibly();
            CHILDREN.remove(process);
        }
    }

    /** A status code and body of one REST call. */
    record Reply(int status, String body) {
        JsonNode json() {
            try {
                return JSON.readTree(body);
            } catch (IOException e) {
                throw Check.fail("the worker's answer is not JSON: " + body);
            }
        }
    }

    /** Connect's REST API on one worker. */
    static final class Rest {
        final String base;
        final HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(5)).build();

        Rest(int port) {
            this.base = "http://127.0.0.1:" + port;
        }

        /** The reply, or null when nothing listens yet (or the connection broke). */
        Reply call(String method, String path, String body) {
            HttpRequest.Builder b = HttpRequest.newBuilder(URI.create(base + path)).timeout(REST_TIMEOUT)
                    .header("Accept", "application/json");
            if (body != null) {
                b.header("Content-Type", "application/json");
                b.method(method, HttpRequest.BodyPublishers.ofString(body));
            } else {
                b.method(method, HttpRequest.BodyPublishers.noBody());
            }
            try {
                HttpResponse<String> r = http.send(b.build(), HttpResponse.BodyHandlers.ofString());
                return new Reply(r.statusCode(), r.body());
            } catch (IOException e) {
                return null;
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw Check.fail("interrupted");
            }
        }

        Reply get(String path) {
            return call("GET", path, null);
        }
    }

    static void run(Main.Args args) throws Exception {
        startedNanos = System.nanoTime();
        String connectLib = args.require("connect-lib");
        Path dir = Files.createTempDirectory("fjord-connect-");
        Path source = dir.resolve("source.txt");
        Path sink = dir.resolve("sink.txt");
        Files.createFile(source);
        String cluster = Kit.unique("connect");
        String configTopic = cluster + "-configs";
        String offsetTopic = cluster + "-offsets";
        String statusTopic = cluster + "-status";
        String topic = Kit.unique("connect-lines");
        String sourceName = Kit.unique("file-source");
        String sinkName = Kit.unique("file-sink");
        int port = freePort();
        Rest rest = new Rest(port);
        Path props = dir.resolve("worker.properties");
        // -1 unless --storage-replication-factor says otherwise; "connect-default" leaves
        // Connect's own default (3), for a broker that advertises three brokers or more.
        String replication = args.options.getOrDefault("storage-replication-factor", "-1");
        writeWorkerProps(props, args.bootstrap, cluster, configTopic, offsetTopic, statusTopic, port, replication);
        String eos = args.options.get("exactly-once-source");
        if (eos != null) {
            // --exactly-once-source enabled: KIP-618, the worker writes its config topic and
            // each source task its records and offsets in transactions (a by-hand variant;
            // the test runs Connect's default, disabled).
            Files.writeString(props, "exactly.once.source.support=" + eos + "\n", StandardOpenOption.APPEND);
        }
        Path log4j = dir.resolve("log4j2.properties");
        Files.writeString(log4j, String.join("\n",
                "status = warn",
                "appender.out.type = Console",
                "appender.out.name = out",
                "appender.out.layout.type = PatternLayout",
                "appender.out.layout.pattern = [%d] %p %m (%c)%n",
                "rootLogger.level = INFO",
                "rootLogger.appenderRef.out.ref = out",
                // Every client logs its full config at INFO: hundreds of lines per client.
                "logger.config.name = org.apache.kafka.common.config.AbstractConfig",
                "logger.config.level = WARN",
                ""));
        List<String> command = List.of(Path.of(System.getProperty("java.home"), "bin", "java").toString(),
                WORKER_HEAP, "-XX:+UseSerialGC", "-Dlog4j2.configurationFile=" + log4j,
                // log4j2's own shutdown hook would stop logging while Connect's hook still
                // stops the worker; its last line is what tells a graceful stop.
                "-Dlog4j2.shutdownHookEnabled=false",
                "-cp", connectLib + File.separator + "*", WORKER_MAIN, props.toString());
        Check.info("worker: REST on " + rest.base + ", group " + cluster + ", files in " + dir);

        List<String> expected = new ArrayList<>();
        Worker first = null;
        Worker second = null;
        try (Admin admin = Kit.admin(args.bootstrap)) {
            Kit.get(admin.createTopics(List.of(new NewTopic(topic, 1, (short) 1))).all(), "createTopics " + topic);
            Kit.awaitPartitions(admin, topic, 1);
            Kit.awaitLeadersServe(admin, topic, 1);

            // --- First run: the worker creates its topics; the connectors are created over REST.
            first = new Worker("worker-1", command);
            phase("worker-1 started");
            awaitReady(first, rest);
            phase("worker-1 ready");
            checkInternalTopics(admin, configTopic, offsetTopic, statusTopic);

            Map<String, String> sourceConfig = new LinkedHashMap<>();
            sourceConfig.put("connector.class", "org.apache.kafka.connect.file.FileStreamSourceConnector");
            sourceConfig.put("tasks.max", "1");
            sourceConfig.put("file", source.toString());
            sourceConfig.put("topic", topic);
            Map<String, String> sinkConfig = new LinkedHashMap<>();
            sinkConfig.put("connector.class", "org.apache.kafka.connect.file.FileStreamSinkConnector");
            sinkConfig.put("tasks.max", "1");
            sinkConfig.put("file", sink.toString());
            sinkConfig.put("topics", topic);
            createConnector(first, rest, sourceName, sourceConfig);
            createConnector(first, rest, sinkName, sinkConfig);
            awaitRunning(first, rest, sourceName, "source");
            awaitRunning(first, rest, sinkName, "sink");

            phase("both connectors RUNNING");
            append(source, expected, LINES_BEFORE);
            awaitSinkHas(first, sink, expected);
            awaitSourceOffsetRest(first, rest, sourceName, Files.size(source));

            // --- Graceful stop.
            Worker stopping = first;
            phase("the sink has the lines; SIGTERM to worker-1");
            int code = stopping.terminate();
            phase("worker-1 exited");
            Check.that(stopping.loggedStopped(), "worker-1 stopped gracefully on SIGTERM (exit code " + code + ")",
                    "no \"" + STOPPED_LINE + "\" line\n" + stopping.report());
            long position = storedSourcePosition(args.bootstrap, offsetTopic, sourceName, source);
            Check.equal(Files.size(source), position,
                    "the source's file position stored in the offsets topic " + offsetTopic);
            String sinkGroup = "connect-" + sinkName;
            Check.equal((long) expected.size(), committedOffset(admin, sinkGroup, new TopicPartition(topic, 0)),
                    "the sink's committed offset (group " + sinkGroup + ")");
            ConsumerGroupDescription g = Kit.get(admin.describeConsumerGroups(List.of(sinkGroup)).all(),
                    "describeConsumerGroups").get(sinkGroup);
            Check.equal(GroupState.EMPTY, g.groupState(), "the sink's group after the worker left");

            // --- Lines written while no worker runs, then the second run.
            append(source, expected, LINES_WHILE_DOWN);
            second = new Worker("worker-2", command);
            phase("worker-2 started");
            awaitReady(second, rest);
            phase("worker-2 ready");
            Reply list = rest.get("/connectors");
            Check.that(list != null && list.status() == 200, "GET /connectors after the restart", list);
            Set<String> names = new TreeSet<>();
            list.json().forEach(n -> names.add(n.asText()));
            Check.equal(new TreeSet<>(List.of(sourceName, sinkName)), names,
                    "connectors listed after the restart (from the config topic, none posted again)");
            checkConfig(rest, sourceName, sourceConfig);
            checkConfig(rest, sinkName, sinkConfig);
            awaitRunning(second, rest, sourceName, "source");
            awaitRunning(second, rest, sinkName, "sink");
            phase("both connectors RUNNING again");
            append(source, expected, LINES_AFTER);
            awaitSinkHas(second, sink, expected);
            awaitSourceOffsetRest(second, rest, sourceName, Files.size(source));

            // --- Exactly once: in the topic (the source resumed at its stored position) and in the sink file.
            phase("the sink has every line");
            List<String> inTopic = readTopic(args.bootstrap, topic);
            checkExactlyOnce(expected, inTopic, "the topic " + topic);
            checkExactlyOnce(expected, sinkLines(sink), "the sink file");
            Check.ok("every line reached the sink file once, across the worker restart ("
                    + LINES_BEFORE + " before, " + LINES_WHILE_DOWN + " while down, " + LINES_AFTER + " after)");
            second.terminate();
            // What the workers warned about, even on a pass: a difference from Kafka that
            // Connect tolerates shows up here first.
            for (Worker w : new Worker[] {first, second}) {
                List<String> problems = w.problems();
                Check.info(w.name + " logged " + problems.size() + " warnings and errors");
                problems.forEach(l -> Check.info(w.name + ": " + l));
            }
            second = null;
        } catch (Check.Failed e) {
            // The worker's own account of what went wrong (a REST 500 says only "Request failed").
            StringBuilder sb = new StringBuilder(e.getMessage());
            for (Worker w : new Worker[] {first, second}) {
                if (w != null && !e.getMessage().contains("--- " + w.name)) {
                    sb.append('\n').append(w.report());
                }
            }
            throw new Check.Failed(sb.toString(), e);
        } finally {
            if (first != null) {
                first.kill();
            }
            if (second != null) {
                second.kill();
            }
            deleteTree(dir.toFile());
        }
    }

    private static int freePort() throws IOException {
        try (ServerSocket s = new ServerSocket(0, 1, InetAddress.getLoopbackAddress())) {
            return s.getLocalPort();
        }
    }

    private static void writeWorkerProps(Path file, String bootstrap, String cluster, String configTopic,
            String offsetTopic, String statusTopic, int port, String replication) throws IOException {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("group.id", cluster);
        p.put("config.storage.topic", configTopic);
        p.put("offset.storage.topic", offsetTopic);
        p.put("status.storage.topic", statusTopic);
        // Connect's default is 3, which needs three brokers; -1 asks for the broker's default.
        if (!replication.equals("connect-default")) {
            p.put("config.storage.replication.factor", replication);
            p.put("offset.storage.replication.factor", replication);
            p.put("status.storage.replication.factor", replication);
        }
        p.put("key.converter", "org.apache.kafka.connect.storage.StringConverter");
        p.put("value.converter", "org.apache.kafka.connect.storage.StringConverter");
        p.put("listeners", "http://127.0.0.1:" + port);
        p.put("rest.advertised.host.name", "127.0.0.1");
        p.put("rest.advertised.port", Integer.toString(port));
        p.put("offset.flush.interval.ms", "1000");
        p.put("task.shutdown.graceful.timeout.ms", "30000");
        // The default (hybrid_warn) also scans every class of the class path by
        // reflection, 15-20 s of a loaded 2-core machine per start, then warns that all
        // plugins have ServiceLoader manifests and recommends this setting.
        p.put("plugin.discovery", "service_load");
        try (var w = Files.newBufferedWriter(file, StandardCharsets.UTF_8)) {
            p.store(w, "Kafka Connect distributed worker for the connect-distributed scenario");
        }
    }

    /** Waits until the worker's REST API answers GET /connectors with 200. */
    private static void awaitReady(Worker w, Rest rest) {
        Check.waitFor(w.name + " answers GET /connectors", WORKER_READY_TIMEOUT_MS, () -> {
            w.assertAlive();
            Reply r = rest.get("/connectors");
            return r != null && r.status() == 200 ? Boolean.TRUE : null;
        }, () -> {
            Reply r = rest.get("/connectors");
            return r == null ? "no answer" : r.status() + " " + r.body();
        });
        Reply root = rest.get("/");
        Check.info(w.name + ": " + (root == null ? "(no answer on /)" : root.body()));
    }

    /** Connect's internal topics, as it created them: compacted, with its default partition counts. */
    private static void checkInternalTopics(Admin admin, String configTopic, String offsetTopic, String statusTopic) {
        Map<String, Integer> partitions = new LinkedHashMap<>();
        partitions.put(configTopic, 1);
        partitions.put(offsetTopic, 25);
        partitions.put(statusTopic, 5);
        Map<String, TopicDescription> described = Kit.get(admin.describeTopics(partitions.keySet()).allTopicNames(),
                "describeTopics of Connect's topics");
        List<ConfigResource> resources = new ArrayList<>();
        for (String t : partitions.keySet()) {
            resources.add(new ConfigResource(ConfigResource.Type.TOPIC, t));
        }
        Map<ConfigResource, Config> configs = Kit.get(admin.describeConfigs(resources).all(),
                "describeConfigs of Connect's topics");
        for (var e : partitions.entrySet()) {
            Check.equal(e.getValue(), described.get(e.getKey()).partitions().size(),
                    "partitions of " + e.getKey() + " (Connect's default)");
            Config c = configs.get(new ConfigResource(ConfigResource.Type.TOPIC, e.getKey()));
            Check.equal("compact", c.get("cleanup.policy").value(), "cleanup.policy of " + e.getKey());
        }
    }

    /** POSTs a connector, retrying while the worker is not ready for it (409 during a rebalance, 5xx). */
    private static void createConnector(Worker w, Rest rest, String name, Map<String, String> config) {
        ObjectNode body = JSON.createObjectNode();
        body.put("name", name);
        ObjectNode c = body.putObject("config");
        config.forEach(c::put);
        String json = body.toString();
        Reply[] last = new Reply[1];
        Check.waitFor("POST /connectors " + name + " created it", CREATE_TIMEOUT_MS, () -> {
            w.assertAlive();
            Reply r = rest.call("POST", "/connectors", json);
            last[0] = r;
            if (r == null) {
                return null;
            }
            if (r.status() == 201) {
                return Boolean.TRUE;
            }
            if (r.status() == 409 && r.body().contains("already exists")) {
                // An earlier attempt that timed out on our side went through.
                return Boolean.TRUE;
            }
            if (r.status() == 409 || r.status() >= 500) {
                return null;
            }
            throw Check.fail("POST /connectors " + name + ": " + r.status() + " " + r.body());
        }, () -> last[0] == null ? "no answer" : last[0].status() + " " + last[0].body());
    }

    /** Waits until the connector and its one task are RUNNING on this worker. */
    private static void awaitRunning(Worker w, Rest rest, String name, String type) {
        Reply[] last = new Reply[1];
        Check.waitFor(name + " (" + type + ") and its task RUNNING on " + w.name, PIPELINE_TIMEOUT_MS, () -> {
            w.assertAlive();
            Reply r = rest.get("/connectors/" + name + "/status");
            last[0] = r;
            if (r == null || r.status() != 200) {
                return null;
            }
            JsonNode s = r.json();
            for (JsonNode t : s.path("tasks")) {
                if ("FAILED".equals(t.path("state").asText())) {
                    throw Check.fail(name + "'s task failed: " + t.path("trace").asText() + "\n" + w.report());
                }
            }
            boolean running = "RUNNING".equals(s.path("connector").path("state").asText())
                    && s.path("tasks").size() == 1
                    && "RUNNING".equals(s.path("tasks").get(0).path("state").asText())
                    && type.equals(s.path("type").asText());
            return running ? Boolean.TRUE : null;
        }, () -> last[0] == null ? "no answer" : last[0].status() + " " + last[0].body());
    }

    /** The connector's config as the worker reads it back has every posted entry. */
    private static void checkConfig(Rest rest, String name, Map<String, String> posted) {
        Reply r = rest.get("/connectors/" + name + "/config");
        Check.that(r != null && r.status() == 200, "GET /connectors/" + name + "/config", r);
        JsonNode c = r.json();
        Map<String, String> seen = new LinkedHashMap<>();
        for (String k : posted.keySet()) {
            seen.put(k, c.path(k).asText(null));
        }
        Check.equal(posted, seen, name + "'s config after the restart");
    }

    /** Appends lines expected.size() .. expected.size() + n - 1 to the source file in one write. */
    private static void append(Path source, List<String> expected, int n) throws IOException {
        StringBuilder sb = new StringBuilder();
        for (int i = 0; i < n; i++) {
            String l = line(expected.size());
            expected.add(l);
            sb.append(l).append('\n');
        }
        Files.writeString(source, sb, StandardCharsets.UTF_8, StandardOpenOption.APPEND);
        Check.info("appended " + n + " lines to the source file (" + expected.size() + " in all)");
    }

    /** The complete lines of the sink file (a line still being written is left out). */
    private static List<String> sinkLines(Path sink) throws IOException {
        if (!Files.exists(sink)) {
            return List.of();
        }
        String all = Files.readString(sink, StandardCharsets.UTF_8);
        int end = all.lastIndexOf('\n');
        if (end < 0) {
            return List.of();
        }
        return List.of(all.substring(0, end).split("\n", -1));
    }

    private static void awaitSinkHas(Worker w, Path sink, List<String> expected) {
        Check.waitFor("the sink file has all " + expected.size() + " lines", PIPELINE_TIMEOUT_MS, () -> {
            w.assertAlive();
            try {
                return sinkLines(sink).containsAll(expected) ? Boolean.TRUE : null;
            } catch (IOException e) {
                return null;
            }
        }, () -> {
            try {
                return sinkLines(sink).size() + " lines";
            } catch (IOException e) {
                return e.toString();
            }
        });
    }

    /**
     * Waits until GET /connectors/NAME/offsets (KIP-875; the worker reads it from the
     * offsets topic) shows the source at {@code size}, the end of the file.
     */
    private static void awaitSourceOffsetRest(Worker w, Rest rest, String name, long size) {
        Reply[] last = new Reply[1];
        Check.waitFor("GET /connectors/" + name + "/offsets shows position " + size, PIPELINE_TIMEOUT_MS, () -> {
            w.assertAlive();
            Reply r = rest.get("/connectors/" + name + "/offsets");
            last[0] = r;
            if (r == null || r.status() != 200) {
                return null;
            }
            for (JsonNode o : r.json().path("offsets")) {
                if (o.path("offset").path("position").asLong(-1) == size) {
                    return Boolean.TRUE;
                }
            }
            return null;
        }, () -> last[0] == null ? "no answer" : last[0].status() + " " + last[0].body());
    }

    /**
     * The source's last stored file position, read from the offsets topic itself: Connect
     * writes key {@code ["NAME",{"filename":FILE}]}, value {@code {"position":N}} (JSON).
     */
    private static long storedSourcePosition(String bootstrap, String offsetTopic, String name, Path file)
            throws IOException {
        long position = -1;
        int found = 0;
        try (KafkaConsumer<String, String> c = new KafkaConsumer<>(Kit.stringConsumerProps(bootstrap,
                "read_committed"))) {
            List<TopicPartition> tps = new ArrayList<>();
            c.partitionsFor(offsetTopic, Duration.ofMillis(Kit.ADMIN_TIMEOUT_MS))
                    .forEach(pi -> tps.add(new TopicPartition(offsetTopic, pi.partition())));
            c.assign(tps);
            c.seekToBeginning(tps);
            Map<TopicPartition, Long> end = c.endOffsets(tps);
            long deadline = System.nanoTime() + PIPELINE_TIMEOUT_MS * 1_000_000L;
            while (tps.stream().anyMatch(tp -> c.position(tp) < end.get(tp))) {
                if (System.nanoTime() > deadline) {
                    throw Check.fail("reading " + offsetTopic + " to its end timed out");
                }
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(Kit.POLL_MS))) {
                    if (r.key() == null || r.value() == null) {
                        continue;
                    }
                    JsonNode k = JSON.readTree(r.key());
                    if (k.size() == 2 && name.equals(k.get(0).asText())
                            && file.toString().equals(k.get(1).path("filename").asText())) {
                        position = JSON.readTree(r.value()).path("position").asLong(-1);
                        found++;
                    }
                }
            }
        }
        Check.info(found + " offset records of " + name + " in " + offsetTopic);
        return position;
    }

    private static long committedOffset(Admin admin, String group, TopicPartition tp) {
        Map<TopicPartition, OffsetAndMetadata> m = Kit.get(
                admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata(), "listConsumerGroupOffsets");
        OffsetAndMetadata o = m.get(tp);
        return o == null ? -1 : o.offset();
    }

    /** Every record value of the 1-partition topic, from the beginning to its end offset. */
    private static List<String> readTopic(String bootstrap, String topic) {
        List<String> values = new ArrayList<>();
        TopicPartition tp = new TopicPartition(topic, 0);
        try (KafkaConsumer<String, String> c = new KafkaConsumer<>(Kit.stringConsumerProps(bootstrap,
                "read_committed"))) {
            c.assign(List.of(tp));
            c.seekToBeginning(List.of(tp));
            long end = c.endOffsets(List.of(tp)).get(tp);
            Check.info(topic + " ends at offset " + end);
            long deadline = System.nanoTime() + PIPELINE_TIMEOUT_MS * 1_000_000L;
            while (c.position(tp) < end) {
                if (System.nanoTime() > deadline) {
                    throw Check.fail("reading " + topic + " to its end (" + end + ") timed out at " + c.position(tp));
                }
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(Kit.POLL_MS))) {
                    values.add(r.value());
                }
            }
        }
        return values;
    }

    /** {@code seen} is exactly {@code expected}; otherwise names the first difference and the duplicates. */
    private static void checkExactlyOnce(List<String> expected, List<String> seen, String where) {
        if (seen.equals(expected)) {
            Check.ok(where + " holds every line exactly once, in order (" + seen.size() + " lines)");
            return;
        }
        Set<String> distinct = new TreeSet<>();
        List<String> repeated = new ArrayList<>();
        for (String l : seen) {
            if (!distinct.add(l) && repeated.size() < 5) {
                repeated.add(l);
            }
        }
        int i = 0;
        while (i < Math.min(expected.size(), seen.size()) && expected.get(i).equals(seen.get(i))) {
            i++;
        }
        throw Check.fail(where + ": expected the " + expected.size() + " lines once each, in order; got "
                + seen.size() + " lines (" + distinct.size() + " distinct); first difference at line " + i
                + " (expected " + (i < expected.size() ? expected.get(i) : "the end") + ", got "
                + (i < seen.size() ? seen.get(i) : "the end") + "); repeated: " + repeated);
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
}
