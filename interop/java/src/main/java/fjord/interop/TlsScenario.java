package fjord.interop;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Collection;
import java.util.List;
import java.util.Properties;
import org.apache.kafka.clients.CommonClientConfigs;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.acl.AccessControlEntry;
import org.apache.kafka.common.acl.AccessControlEntryFilter;
import org.apache.kafka.common.acl.AclBinding;
import org.apache.kafka.common.acl.AclBindingFilter;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.acl.AclPermissionType;
import org.apache.kafka.common.config.SslConfigs;
import org.apache.kafka.common.errors.SslAuthenticationException;
import org.apache.kafka.common.errors.TopicAuthorizationException;
import org.apache.kafka.common.resource.PatternType;
import org.apache.kafka.common.resource.ResourcePattern;
import org.apache.kafka.common.resource.ResourcePatternFilter;
import org.apache.kafka.common.resource.ResourceType;

/**
 * tls: the Java client on an SSL listener ({@code --ssl-bootstrap}), trusting the CA of
 * {@code --truststore} (a PEM file; Kafka's {@code ssl.truststore.type=PEM}), with host
 * name verification on (the server certificate names 127.0.0.1 and localhost).
 *
 * <p>Without {@code --client-cert}: the client presents no certificate (principal
 * ANONYMOUS) and runs {@link SaslScenario#workload} (advertised ports, a topic, an
 * idempotent producer, a consumer group, a committed and an aborted transaction,
 * read_committed); a client that does not trust the CA fails with
 * SslAuthenticationException.
 *
 * <p>With {@code --client-cert CERT.pem --client-key KEY.pem --principal P
 * --wrong-principal Q} (mTLS, Kafka's {@code ssl.keystore.type=PEM} with the PEM text in
 * {@code ssl.keystore.certificate.chain} / {@code ssl.keystore.key}): the broker must
 * run an authorizer with {@code allow.everyone.if.no.acl.found=true} and ANONYMOUS on
 * the PLAINTEXT listener ({@code --bootstrap}) as a super user. Over PLAINTEXT, ACLs
 * allow P everything on the PREFIXED topic, group and transactional id of a fresh
 * prefix, and Q (the same subject spelt another way) everything on a second topic. The
 * workload then runs over mTLS within the prefix, which works only if the broker took
 * the certificate's principal to be exactly P; writing to the second topic fails with
 * TopicAuthorizationException, so the principal is not Q; and a client without a
 * certificate is refused (SslAuthenticationException: the listener requires client
 * authentication).
 */
final class TlsScenario {
    private TlsScenario() {}

    /** Client settings that trust the CA in the PEM file {@code truststore}. */
    static Properties trust(String truststore) {
        if (truststore == null) {
            throw new IllegalArgumentException("missing --truststore CA.pem");
        }
        Properties p = new Properties();
        p.put(SslConfigs.SSL_TRUSTSTORE_TYPE_CONFIG, "PEM");
        p.put(SslConfigs.SSL_TRUSTSTORE_LOCATION_CONFIG, truststore);
        return p;
    }

    static Properties ssl(String truststore) {
        Properties p = trust(truststore);
        p.put(CommonClientConfigs.SECURITY_PROTOCOL_CONFIG, "SSL");
        return p;
    }

    static void run(Main.Args args) throws Exception {
        String sslBootstrap = args.require("ssl-bootstrap");
        String truststore = args.require("truststore");
        String cert = args.options.get("client-cert");
        if (cert == null) {
            SaslScenario.workload(sslBootstrap, ssl(truststore), "ssl", "SSL", 0);
            Properties untrusting = new Properties();
            untrusting.put(CommonClientConfigs.SECURITY_PROTOCOL_CONFIG, "SSL");
            expectSslRefused(sslBootstrap, untrusting, "a client that does not trust the CA");
            return;
        }
        String principal = args.require("principal");
        String wrongPrincipal = args.require("wrong-principal");
        Properties mtls = ssl(truststore);
        mtls.put(SslConfigs.SSL_KEYSTORE_TYPE_CONFIG, "PEM");
        mtls.put(SslConfigs.SSL_KEYSTORE_CERTIFICATE_CHAIN_CONFIG, Files.readString(Path.of(cert)));
        mtls.put(SslConfigs.SSL_KEYSTORE_KEY_CONFIG, Files.readString(Path.of(args.require("client-key"))));

        String prefix = Kit.unique("mtls");
        String other = Kit.unique("mtls-other");
        try (Admin admin = Kit.admin(args.bootstrap)) {
            List<AclBinding> acls = List.of(
                    allowAll(ResourceType.TOPIC, prefix, principal),
                    allowAll(ResourceType.GROUP, prefix, principal),
                    allowAll(ResourceType.TRANSACTIONAL_ID, prefix, principal),
                    allowAll(ResourceType.TOPIC, other, wrongPrincipal));
            Kit.get(admin.createAcls(acls).all(), "createAcls");
            AclBindingFilter mine = new AclBindingFilter(ResourcePatternFilter.ANY,
                    new AccessControlEntryFilter(principal, null, AclOperation.ANY, AclPermissionType.ANY));
            Collection<AclBinding> described = Kit.get(admin.describeAcls(mine).values(), "describeAcls");
            Check.equal(3, described.size(), "ACLs of " + principal + " described");
            Check.ok("ACLs for " + principal + " on prefix " + prefix + " and for " + wrongPrincipal + " on " + other);
            Kit.createTopic(admin, other, 1);
        }

        SaslScenario.workload(sslBootstrap, mtls, prefix, "mTLS as " + principal, 0);
        Check.ok("the broker's principal for the client certificate is " + principal);

        Properties pp = SaslScenario.with(Kit.stringProducerProps(sslBootstrap), mtls);
        pp.put("max.block.ms", "20000");
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(pp)) {
            Throwable e = null;
            try {
                producer.send(new ProducerRecord<>(other, "k", "v")).get();
            } catch (java.util.concurrent.ExecutionException x) {
                e = x.getCause();
            } catch (org.apache.kafka.common.KafkaException x) {
                e = x;
            }
            Check.that(e instanceof TopicAuthorizationException,
                    "writing to a topic only " + wrongPrincipal + " may write is TOPIC_AUTHORIZATION_FAILED",
                    Check.describe(e));
            Check.ok("the principal is not " + wrongPrincipal + ": " + e.getMessage());
        }
        expectSslRefused(sslBootstrap, ssl(truststore), "a client without a certificate");
    }

    private static AclBinding allowAll(ResourceType type, String prefix, String principal) {
        return new AclBinding(new ResourcePattern(type, prefix, PatternType.PREFIXED),
                new AccessControlEntry(principal, "*", AclOperation.ALL, AclPermissionType.ALLOW));
    }

    private static void expectSslRefused(String bootstrap, Properties security, String who) {
        try (Admin admin = SaslScenario.secureAdmin(bootstrap, security)) {
            Throwable e = Kit.failureOf(admin.describeCluster().nodes(), "describeCluster as " + who);
            Check.that(e instanceof SslAuthenticationException,
                    who + " fails with SslAuthenticationException", Check.describe(e));
            Check.ok(who + " refused: " + e.getMessage());
        }
    }
}
