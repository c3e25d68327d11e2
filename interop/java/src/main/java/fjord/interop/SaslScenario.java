package fjord.interop;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.CommonClientConfigs;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ScramCredentialInfo;
import org.apache.kafka.clients.admin.ScramMechanism;
import org.apache.kafka.clients.admin.UserScramCredentialUpsertion;
import org.apache.kafka.clients.admin.UserScramCredentialsDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.SaslConfigs;
import org.apache.kafka.common.errors.SaslAuthenticationException;

/**
 * sasl: the Java client on a SASL listener, with the mechanism given by
 * {@code --mechanism} (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512), SASL_PLAINTEXT or, with
 * {@code --security-protocol SASL_SSL} and {@code --truststore CA.pem}, SASL_SSL.
 *
 * <p>The user is created with AlterUserScramCredentials over the PLAINTEXT listener
 * ({@code --bootstrap}; the admin client salts the password) and described. Then, on
 * the SASL listener ({@code --sasl-bootstrap}), authenticated as that user (or as
 * {@code --login-user}/{@code --login-password}, a user the broker already knows, e.g.
 * a PLAIN user of stock Kafka's JAAS configuration), {@link #workload}: the cluster is
 * described and every node must be advertised on the listener's ports; a topic is
 * created, an idempotent producer writes, a consumer group reads and commits; after
 * {@code --reauth-wait-ms} (longer than the broker's {@code --connections-max-reauth-ms})
 * the same producer and consumer go on, which needs a re-authentication (KIP-368) on
 * their open connections; a transaction is committed and one aborted, and a
 * read_committed consumer sees exactly the committed records. Finally a wrong password
 * and an unknown user fail with SaslAuthenticationException.
 */
final class SaslScenario {
    static final int PARTITIONS = 2;
    static final int RECORDS = 100;
    static final long CONSUME_TIMEOUT_MS = 60_000;

    private SaslScenario() {}

    static String jaas(String mechanism, String user, String password) {
        String module = mechanism.equals("PLAIN")
                ? "org.apache.kafka.common.security.plain.PlainLoginModule"
                : "org.apache.kafka.common.security.scram.ScramLoginModule";
        return module + " required username=\"" + user + "\" password=\"" + password + "\";";
    }

    /**
     * The client settings for SASL {@code mechanism} as {@code user} over
     * {@code protocol} (SASL_PLAINTEXT or SASL_SSL; with SASL_SSL the CA in
     * {@code truststore}, a PEM file, is trusted).
     */
    static Properties security(String protocol, String truststore, String mechanism, String user,
            String password) {
        Properties p = new Properties();
        p.put(CommonClientConfigs.SECURITY_PROTOCOL_CONFIG, protocol);
        p.put(SaslConfigs.SASL_MECHANISM, mechanism);
        p.put(SaslConfigs.SASL_JAAS_CONFIG, jaas(mechanism, user, password));
        if (protocol.endsWith("SSL")) {
            p.putAll(TlsScenario.trust(truststore));
        }
        return p;
    }

    /** {@code p} with every setting of {@code security} added. */
    static Properties with(Properties p, Properties security) {
        p.putAll(security);
        return p;
    }

    static Admin secureAdmin(String bootstrap, Properties security) {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(AdminClientConfig.CLIENT_ID_CONFIG, "fjord-interop-secure-admin");
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "20000");
        p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
        return Admin.create(with(p, security));
    }

    static void run(Main.Args args) throws Exception {
        String mechanism = args.require("mechanism");
        String saslBootstrap = args.require("sasl-bootstrap");
        long reauthWaitMs = Long.parseLong(args.options.getOrDefault("reauth-wait-ms", "0"));
        String protocol = args.options.getOrDefault("security-protocol", "SASL_PLAINTEXT");
        String truststore = args.options.get("truststore");
        String user = Kit.unique("user");
        String password = "pw-" + Kit.unique("secret");

        // The SCRAM store holds PLAIN users too (salted): one upsert per mechanism.
        try (Admin admin = Kit.admin(args.bootstrap)) {
            // One alteration per user and request (Kafka answers DUPLICATE_RESOURCE
            // to a second one in the same request, whatever its mechanism).
            Throwable twice = Kit.failureOf(admin.alterUserScramCredentials(List.of(
                    new UserScramCredentialUpsertion(user,
                            new ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192), password),
                    new UserScramCredentialUpsertion(user,
                            new ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), password)))
                    .all(), "alterUserScramCredentials of one user twice");
            Check.that(twice instanceof org.apache.kafka.common.errors.DuplicateResourceException,
                    "altering a user twice in one request is DUPLICATE_RESOURCE", Check.describe(twice));
            Kit.get(admin.alterUserScramCredentials(List.of(new UserScramCredentialUpsertion(user,
                    new ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192), password))).all(),
                    "alterUserScramCredentials SCRAM-SHA-256");
            Kit.get(admin.alterUserScramCredentials(List.of(new UserScramCredentialUpsertion(user,
                    new ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), password))).all(),
                    "alterUserScramCredentials SCRAM-SHA-512");
            Check.ok("created SCRAM credentials of " + user);
            Map<String, UserScramCredentialsDescription> described =
                    Kit.get(admin.describeUserScramCredentials(List.of(user)).all(),
                            "describeUserScramCredentials");
            List<ScramCredentialInfo> infos = described.get(user).credentialInfos();
            Check.equal(2, infos.size(), "credentials described for " + user);
            for (ScramCredentialInfo info : infos) {
                int expected = info.mechanism() == ScramMechanism.SCRAM_SHA_256 ? 8192 : 4096;
                Check.equal(expected, info.iterations(), "iterations of " + info.mechanism());
            }
            Check.ok("described " + infos);
        }

        String loginUser = args.options.getOrDefault("login-user", user);
        String loginPassword = args.options.getOrDefault("login-password", password);
        workload(saslBootstrap, security(protocol, truststore, mechanism, loginUser, loginPassword),
                "sasl-" + mechanism.toLowerCase(), protocol + " " + mechanism, reauthWaitMs);

        for (String[] bad : new String[][] {{loginUser, "wrong-" + loginPassword}, {Kit.unique("nobody"), loginPassword}}) {
            try (Admin admin = secureAdmin(saslBootstrap,
                    security(protocol, truststore, mechanism, bad[0], bad[1]))) {
                Throwable e = Kit.failureOf(admin.describeCluster().nodes(), "describeCluster as " + bad[0]);
                Check.that(e instanceof SaslAuthenticationException,
                        "a bad login fails with SaslAuthenticationException", Check.describe(e));
                Check.ok("bad login as " + bad[0] + " refused: " + e.getMessage());
            }
        }
    }

    /**
     * The workload every secured scenario runs on {@code bootstrap} with the client
     * settings {@code security}: every node advertised on that listener's ports, a topic
     * (named {@code prefix-...}), an idempotent producer and a consumer group (group and
     * transactional id named {@code prefix-...} too), a wait of {@code reauthWaitMs}
     * between two phases, a committed and an aborted transaction, read_committed.
     */
    static void workload(String bootstrap, Properties security, String prefix, String what,
            long reauthWaitMs) throws Exception {
        String topic = Kit.unique(prefix);
        int port = Integer.parseInt(bootstrap.substring(bootstrap.lastIndexOf(':') + 1));
        try (Admin admin = secureAdmin(bootstrap, security)) {
            Collection<Node> nodes = Kit.get(admin.describeCluster().nodes(), "describeCluster over " + what);
            for (Node n : nodes) {
                Check.that(n.port() >= port && n.port() < port + nodes.size(),
                        "node " + n.id() + " is advertised on the listener's ports", n);
            }
            Check.ok("connected with " + what + "; nodes " + nodes);
            Kit.createTopic(admin, topic, PARTITIONS);
        }

        List<TopicPartition> tps = Kit.partitions(topic, PARTITIONS);
        String group = Kit.unique(prefix + "-group");
        Properties pp = with(Kit.stringProducerProps(bootstrap), security);
        Properties cp = with(Kit.stringConsumerProps(bootstrap, "read_uncommitted"), security);
        cp.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        int expected = 0;
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(pp);
                KafkaConsumer<String, String> consumer = new KafkaConsumer<>(cp)) {
            consumer.subscribe(List.of(topic));
            for (int phase = 0; phase < 2; phase++) {
                for (int i = 0; i < RECORDS; i++) {
                    producer.send(new ProducerRecord<>(topic, "k" + i, "v" + phase + "-" + i)).get();
                }
                expected += RECORDS;
                int read = 0;
                long deadline = System.currentTimeMillis() + CONSUME_TIMEOUT_MS;
                while (read < RECORDS) {
                    for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(Kit.POLL_MS))) {
                        if (!r.value().startsWith("v" + phase + "-")) {
                            throw Check.fail("phase " + phase + " read " + r.value());
                        }
                        read++;
                    }
                    if (System.currentTimeMillis() > deadline) {
                        throw Check.fail("group read " + read + " of " + RECORDS + " records in phase " + phase);
                    }
                }
                consumer.commitSync(Duration.ofSeconds(15));
                Check.ok("phase " + phase + ": produced, consumed in group " + group + " and committed " + RECORDS);
                if (phase == 0 && reauthWaitMs > 0) {
                    // Past the session lifetime: the next requests on these connections
                    // need a re-authentication first (the client does it on its own).
                    long until = System.currentTimeMillis() + reauthWaitMs;
                    while (System.currentTimeMillis() < until) {
                        consumer.poll(Duration.ofMillis(Kit.POLL_MS));
                    }
                    Check.ok("waited " + reauthWaitMs + " ms (longer than the session lifetime)");
                }
            }
        }
        try (Admin admin = secureAdmin(bootstrap, security)) {
            Map<TopicPartition, OffsetAndMetadata> committed =
                    Kit.get(admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata(),
                            "listConsumerGroupOffsets");
            long sum = committed.values().stream().mapToLong(OffsetAndMetadata::offset).sum();
            Check.equal((long) expected, sum, "committed offsets of " + group);
        }

        Properties tp = with(Kit.stringProducerProps(bootstrap), security);
        tp.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, Kit.unique(prefix + "-txn"));
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(tp)) {
            producer.initTransactions();
            producer.beginTransaction();
            for (int i = 0; i < 10; i++) {
                producer.send(new ProducerRecord<>(topic, "t" + i, "committed-" + i));
            }
            producer.commitTransaction();
            producer.beginTransaction();
            for (int i = 0; i < 5; i++) {
                producer.send(new ProducerRecord<>(topic, "a" + i, "aborted-" + i));
            }
            producer.abortTransaction();
        }
        Check.ok("committed one transaction and aborted one");
        Properties rc = with(Kit.stringConsumerProps(bootstrap, "read_committed"), security);
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(rc)) {
            Map<TopicPartition, Long> end = new HashMap<>(Kit.endOffsets(consumer, tps));
            List<ConsumerRecord<String, String>> all = Kit.readToEnd(consumer, tps, end, CONSUME_TIMEOUT_MS);
            List<String> txn = new ArrayList<>();
            for (ConsumerRecord<String, String> r : all) {
                if (r.value().startsWith("aborted-")) {
                    throw Check.fail("read_committed read an aborted record: " + r.value());
                }
                if (r.value().startsWith("committed-")) {
                    txn.add(r.value());
                }
            }
            Check.equal(10, txn.size(), "committed transactional records read");
            Check.equal(expected + 10, all.size(), "records read_committed");
        }
        Check.ok("read_committed sees the committed transaction only");
    }
}
