package fjord.interop;

import java.util.LinkedHashMap;
import java.util.Map;

/**
 * Runs one conformance scenario against a Kafka-compatible broker with Apache
 * Kafka's own Java client (and Kafka Streams).
 *
 * <p>Usage (from the repository root, after {@code mvn -q -B -f interop/java/pom.xml package}):
 * {@code java -cp 'target/interop-java/classes:target/interop-java/lib/*' fjord.interop.Main SCENARIO
 * --bootstrap HOST:PORT [--records N]}. Every check the scenario makes is printed as
 * {@code check: ... ok}; the first failed check prints {@code FAILED: ...} and ends the
 * process with {@link #EXIT_CHECK_FAILED}. A watchdog ends a scenario that runs longer
 * than {@link #SCENARIO_TIMEOUT_MS} with {@link #EXIT_TIMEOUT} and a thread dump, so that
 * no wait is unbounded even if a client call blocks forever.
 */
public final class Main {
    /** Exit code of a scenario whose checks all passed. */
    static final int EXIT_OK = 0;
    /** Exit code of a scenario with a failed check. */
    static final int EXIT_CHECK_FAILED = 1;
    /** Exit code of a scenario that threw something other than a failed check. */
    static final int EXIT_ERROR = 2;
    /** Exit code of a scenario stopped by the watchdog. */
    static final int EXIT_TIMEOUT = 3;
    /** Exit code of a bad command line. */
    static final int EXIT_USAGE = 64;
    /** Longest any one scenario may run (the Rust test allows a little more). */
    static final long SCENARIO_TIMEOUT_MS = 420_000;

    /** A scenario body: gets the parsed arguments, throws on failure. */
    interface Scenario {
        void run(Args args) throws Exception;
    }

    /** The command line after the scenario name. */
    static final class Args {
        final String scenario;
        final String bootstrap;
        /** Records per run, or -1 for the scenario's default. */
        final int records;
        /** Every {@code --key value} pair, for the scenarios' own options. */
        final Map<String, String> options;

        Args(String scenario, Map<String, String> options) {
            this.scenario = scenario;
            this.options = options;
            this.bootstrap = options.get("bootstrap");
            this.records = options.containsKey("records") ? Integer.parseInt(options.get("records")) : -1;
        }

        int recordsOr(int fallback) {
            return records > 0 ? records : fallback;
        }

        String require(String key) {
            String v = options.get(key);
            if (v == null) {
                throw new IllegalArgumentException("missing --" + key);
            }
            return v;
        }
    }

    private static Map<String, Scenario> scenarios() {
        Map<String, Scenario> s = new LinkedHashMap<>();
        s.put("producer-codecs", ProducerCodecs::run);
        s.put("txn-layout", TxnLayout::run);
        s.put("txn-fencing", TxnFencing::run);
        s.put("txn-consume-transform-produce", TxnConsumeTransformProduce::run);
        s.put("group-classic", GroupClassic::run);
        s.put("group-consumer", GroupClassic::runConsumer);
        s.put("group-upgrade", GroupUpgrade::run);
        s.put("admin", AdminScenario::run);
        // Needs --sasl-bootstrap HOST:PORT (a SASL_PLAINTEXT listener, or SASL_SSL with
        // --security-protocol SASL_SSL --truststore CA.pem) and --mechanism.
        s.put("sasl", SaslScenario::run);
        // Needs --ssl-bootstrap HOST:PORT (an SSL listener) and --truststore CA.pem; mTLS
        // with --client-cert, --client-key, --principal and --wrong-principal.
        s.put("tls", TlsScenario::run);
        // Needs --topic, --hidden-topic, --group, --txn-prefix and the ACLs set up by tests/interop_java.rs.
        s.put("acls", AclsScenario::run);
        s.put("streams-eos", StreamsEos::run);
        // The Kafka Streams application itself, started by streams-eos in a child JVM.
        s.put(StreamsEos.APP_SCENARIO, StreamsEos::runApp);
        // Needs --connect-lib DIR: the jars of interop/connect (the Connect worker).
        s.put("connect-distributed", ConnectFileStream::run);
        // Needs --bootstrap naming three nodes and --leader-file PATH; the test kills the
        // node of the broker id written there (tests/interop_java.rs).
        s.put("replicated-failover", ReplicatedFailover::run);
        // A measurement (scripts/measure-replication.sh): needs --topic, --out and
        // --leader-file; the caller kills the node of the broker id written there.
        s.put("failover-probe", FailoverProbe::run);
        return s;
    }

    private Main() {}

    public static void main(String[] argv) {
        Map<String, Scenario> all = scenarios();
        if (argv.length < 1 || !all.containsKey(argv[0])) {
            System.err.println("usage: Main SCENARIO --bootstrap HOST:PORT [--records N]");
            System.err.println("scenarios: " + String.join(" ", all.keySet()));
            System.exit(EXIT_USAGE);
        }
        Map<String, String> options = new LinkedHashMap<>();
        for (int i = 1; i < argv.length; i++) {
            if (!argv[i].startsWith("--") || i + 1 >= argv.length) {
                System.err.println("bad argument: " + argv[i]);
                System.exit(EXIT_USAGE);
            }
            options.put(argv[i].substring(2), argv[i + 1]);
            i++;
        }
        Args args = new Args(argv[0], options);
        if (args.bootstrap == null) {
            System.err.println("missing --bootstrap HOST:PORT");
            System.exit(EXIT_USAGE);
        }
        if (!argv[0].equals(StreamsEos.APP_SCENARIO)) {
            startWatchdog(argv[0]);
        }
        long started = System.nanoTime();
        int code;
        try {
            System.out.println("scenario: " + args.scenario + " against " + args.bootstrap);
            all.get(argv[0]).run(args);
            System.out.printf("PASSED: %s in %d ms%n", args.scenario, (System.nanoTime() - started) / 1_000_000);
            code = EXIT_OK;
        } catch (Check.Failed e) {
            System.out.println("FAILED: " + args.scenario + ": " + e.getMessage());
            code = EXIT_CHECK_FAILED;
        } catch (Throwable e) {
            System.out.println("FAILED: " + args.scenario + ": unexpected " + Check.describe(e));
            e.printStackTrace(System.out);
            code = EXIT_ERROR;
        }
        System.out.flush();
        // halt, not exit: a client thread stuck in a close must not keep the JVM alive.
        Runtime.getRuntime().halt(code);
    }

    private static void startWatchdog(String scenario) {
        Thread t = new Thread(() -> {
            try {
                Thread.sleep(SCENARIO_TIMEOUT_MS);
            } catch (InterruptedException e) {
                return;
            }
            System.out.println("FAILED: " + scenario + ": watchdog: still running after " + SCENARIO_TIMEOUT_MS + " ms");
            for (Map.Entry<Thread, StackTraceElement[]> e : Thread.getAllStackTraces().entrySet()) {
                System.out.println("thread " + e.getKey().getName());
                for (StackTraceElement f : e.getValue()) {
                    System.out.println("    at " + f);
                }
            }
            System.out.flush();
            StreamsEos.killChildren();
            ConnectFileStream.killChildren();
            Runtime.getRuntime().halt(EXIT_TIMEOUT);
        }, "watchdog");
        t.setDaemon(true);
        t.start();
    }
}
