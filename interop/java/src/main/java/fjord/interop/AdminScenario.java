package fjord.interop;

import java.time.Duration;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.stream.Collectors;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.CreateTopicsResult;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.admin.DescribeConfigsOptions;
import org.apache.kafka.clients.admin.GroupListing;
import org.apache.kafka.clients.admin.ListGroupsOptions;
import org.apache.kafka.clients.admin.ListOffsetsOptions;
import org.apache.kafka.clients.admin.ListOffsetsResult.ListOffsetsResultInfo;
import org.apache.kafka.clients.admin.NewPartitions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.ProducerState;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.admin.TransactionDescription;
import org.apache.kafka.clients.admin.TransactionListing;
import org.apache.kafka.clients.admin.TransactionState;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.GroupState;
import org.apache.kafka.common.GroupType;
import org.apache.kafka.common.IsolationLevel;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.errors.InvalidConfigurationException;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.errors.UnknownTopicOrPartitionException;

/**
 * admin: the Admin client's topic, config, offset, group, producer and transaction
 * calls, each checked against the values the broker must hold afterwards.
 */
final class AdminScenario {
    static final String RETENTION_MS = "3600000";
    static final String RETENTION_MS_ALTERED = "7200000";
    static final String SEGMENT_BYTES = "1048576";
    /** Kafka's default message.max.bytes, which max.message.bytes inherits. */
    static final String MESSAGE_MAX_BYTES_DEFAULT = "1048588";
    /** Kafka's default transaction.timeout.ms of a producer. */
    static final long TRANSACTION_TIMEOUT_MS_DEFAULT = 60_000;
    /** Records written to partition 0, one batch each. */
    static final int RECORDS = 10;
    /** Record 6 carries the highest timestamp (it is not the last one). */
    static final int MAX_TIMESTAMP_RECORD = 6;
    /** How far in the past the records' timestamps start. */
    static final long TIMESTAMP_AGE_MS = 600_000;
    /** Longest a change (group membership, topic deletion, markers) may take to show. */
    static final long SETTLE_TIMEOUT_MS = 30_000;

    private AdminScenario() {}

    static void run(Main.Args args) throws Exception {
        try (Admin admin = Kit.admin(args.bootstrap)) {
            Node node = cluster(admin);
            String topic = Kit.unique("admin");
            Uuid topicId = create(admin, topic);
            describe(admin, topic, topicId);
            long base = System.currentTimeMillis() - TIMESTAMP_AGE_MS;
            produceWithTimestamps(args.bootstrap, topic, base);
            listOffsets(admin, topic, base);
            describeProducersIdempotent(admin, topic);
            String segmentBytesDefault = configs(admin, topic, node);
            alterConfigs(admin, topic, segmentBytesDefault);
            createPartitions(admin, topic);
            deleteRecords(admin, args.bootstrap, topic);
            groups(admin, args.bootstrap, topic);
            transactions(admin, args.bootstrap, topic);
            configSynonyms(admin, topic, node, segmentBytesDefault);
            deleteTopic(admin, topic);
        }
    }

    private static Node cluster(Admin admin) {
        DescribeClusterResult dc = admin.describeCluster();
        Collection<Node> nodes = Kit.get(dc.nodes(), "describeCluster nodes");
        String clusterId = Kit.get(dc.clusterId(), "describeCluster clusterId");
        Node controller = Kit.get(dc.controller(), "describeCluster controller");
        Check.that(!nodes.isEmpty(), "describeCluster lists at least one node", nodes);
        Check.that(clusterId != null && !clusterId.isEmpty(), "describeCluster gives a cluster id", clusterId);
        Check.that(controller != null && nodes.stream().anyMatch(n -> n.id() == controller.id()),
                "describeCluster's controller is one of the nodes", controller);
        Check.info("nodes " + nodes + ", cluster id " + clusterId);
        return nodes.stream().min((a, b) -> Integer.compare(a.id(), b.id())).get();
    }

    private static Uuid create(Admin admin, String topic) {
        NewTopic nt = new NewTopic(topic, 3, (short) 1)
                .configs(Map.of("retention.ms", RETENTION_MS, "segment.bytes", SEGMENT_BYTES));
        CreateTopicsResult r = admin.createTopics(List.of(nt));
        Kit.get(r.all(), "createTopics");
        Check.equal(3, Kit.get(r.numPartitions(topic), "numPartitions"), "createTopics: numPartitions");
        Check.equal(1, Kit.get(r.replicationFactor(topic), "replicationFactor"), "createTopics: replicationFactor");
        Config c = Kit.get(r.config(topic), "createTopics config");
        Check.equal(RETENTION_MS, c.get("retention.ms").value(), "createTopics returns the topic's retention.ms");
        Check.equal(SEGMENT_BYTES, c.get("segment.bytes").value(), "createTopics returns the topic's segment.bytes");
        Uuid id = Kit.get(r.topicId(topic), "topicId");
        Check.that(id != null && !id.equals(Uuid.ZERO_UUID), "createTopics returns a topic id", id);
        Throwable again = Kit.failureOf(admin.createTopics(List.of(new NewTopic(topic, 3, (short) 1))).all(),
                "createTopics of an existing topic");
        Check.that(again instanceof TopicExistsException, "creating it again fails with TopicExistsException",
                Check.describe(again));
        Throwable bad = Kit.failureOf(admin.createTopics(List.of(
                new NewTopic(Kit.unique("admin-bad"), 1, (short) 1).configs(Map.of("retention.ms", "soon")))).all(),
                "createTopics with retention.ms=soon");
        Check.that(bad instanceof InvalidConfigurationException,
                "createTopics with retention.ms=soon fails with InvalidConfigurationException", Check.describe(bad));
        return id;
    }

    private static void describe(Admin admin, String topic, Uuid topicId) {
        TopicDescription d = Kit.awaitPartitions(admin, topic, 3);
        Kit.awaitLeadersServe(admin, topic, 3);
        Check.equal(topicId, d.topicId(), "describeTopics: topic id");
        Check.that(!d.isInternal(), "describeTopics: not internal", d);
        for (TopicPartitionInfo p : d.partitions()) {
            Check.that(p.replicas().equals(List.of(p.leader())) && p.isr().equals(List.of(p.leader())),
                    "describeTopics: partition " + p.partition() + " has replicas = isr = [leader]", p);
        }
        Set<String> names = Kit.get(admin.listTopics().names(), "listTopics");
        Check.that(names.contains(topic), "listTopics includes the topic", names.size() + " topics");
        Check.that(names.stream().noneMatch(n -> n.startsWith("__")), "listTopics hides internal topics by default", names);
    }

    private static long timestampOf(long base, int i) {
        return i == MAX_TIMESTAMP_RECORD ? base + 100_000 : base + i * 1000L;
    }

    private static void produceWithTimestamps(String bootstrap, String topic, long base) throws Exception {
        try (KafkaProducer<String, String> p = new KafkaProducer<>(Kit.stringProducerProps(bootstrap))) {
            for (int i = 0; i < RECORDS; i++) {
                // One batch per record (each send awaited), so timestamps are per batch as well.
                p.send(new ProducerRecord<>(topic, 0, timestampOf(base, i), "k" + i, "v" + i)).get();
            }
        }
        Check.ok("produced " + RECORDS + " records with chosen timestamps to partition 0");
    }

    private static void listOffsets(Admin admin, String topic, long base) {
        TopicPartition tp = new TopicPartition(topic, 0);
        Check.equal(0L, offset(admin, tp, OffsetSpec.earliest(), null).offset(), "listOffsets earliest");
        Check.equal((long) RECORDS, offset(admin, tp, OffsetSpec.latest(), null).offset(), "listOffsets latest");
        Check.equal((long) RECORDS, offset(admin, tp, OffsetSpec.latest(), IsolationLevel.READ_COMMITTED).offset(),
                "listOffsets latest (read_committed)");
        ListOffsetsResultInfo max = offset(admin, tp, OffsetSpec.maxTimestamp(), null);
        Check.equal(MAX_TIMESTAMP_RECORD + "@" + (base + 100_000), max.offset() + "@" + max.timestamp(),
                "listOffsets maxTimestamp (offset@timestamp)");
        ListOffsetsResultInfo t1 = offset(admin, tp, OffsetSpec.forTimestamp(base + 3500), null);
        Check.equal("4@" + (base + 4000), t1.offset() + "@" + t1.timestamp(), "listOffsets forTimestamp(base + 3.5 s)");
        ListOffsetsResultInfo t2 = offset(admin, tp, OffsetSpec.forTimestamp(base + 6500), null);
        Check.equal("6@" + (base + 100_000), t2.offset() + "@" + t2.timestamp(), "listOffsets forTimestamp(base + 6.5 s)");
        ListOffsetsResultInfo t3 = offset(admin, tp, OffsetSpec.forTimestamp(base + 200_000), null);
        Check.equal(-1L, t3.offset(), "listOffsets forTimestamp after every record: offset");
        ListOffsetsResultInfo empty = offset(admin, new TopicPartition(topic, 1), OffsetSpec.maxTimestamp(), null);
        Check.equal("-1@-1", empty.offset() + "@" + empty.timestamp(), "listOffsets maxTimestamp of an empty partition");
    }

    private static ListOffsetsResultInfo offset(Admin admin, TopicPartition tp, OffsetSpec spec, IsolationLevel iso) {
        ListOffsetsOptions o = iso == null ? new ListOffsetsOptions() : new ListOffsetsOptions(iso);
        return Kit.get(admin.listOffsets(Map.of(tp, spec), o).partitionResult(tp), "listOffsets " + spec.getClass().getSimpleName());
    }

    private static void describeProducersIdempotent(Admin admin, String topic) {
        TopicPartition tp = new TopicPartition(topic, 0);
        List<ProducerState> states = Kit.get(admin.describeProducers(List.of(tp)).partitionResult(tp),
                "describeProducers").activeProducers();
        Check.equal(1, states.size(), "describeProducers: producers on partition 0");
        ProducerState s = states.get(0);
        Check.equal(RECORDS - 1, s.lastSequence(), "describeProducers: lastSequence");
        Check.equal(0, s.producerEpoch(), "describeProducers: epoch");
        Check.that(s.producerId() >= 0 && s.currentTransactionStartOffset().isEmpty() && s.coordinatorEpoch().isEmpty(),
                "describeProducers: a plain idempotent producer (no transaction, no coordinator epoch)", s);
    }

    private static Map<String, ConfigEntry> describeConfigs(Admin admin, ConfigResource r) {
        Map<ConfigResource, Config> m = Kit.get(
                admin.describeConfigs(List.of(r), new DescribeConfigsOptions().includeSynonyms(true)).all(),
                "describeConfigs " + r);
        Map<String, ConfigEntry> out = new HashMap<>();
        for (ConfigEntry e : m.get(r).entries()) {
            out.put(e.name(), e);
        }
        return out;
    }

    /** Returns the broker's log.segment.bytes (what a topic without segment.bytes gets). */
    private static String configs(Admin admin, String topic, Node node) {
        Map<String, ConfigEntry> broker = describeConfigs(admin, brokerResource(node));
        Check.info("describeConfigs broker " + node.id() + ": " + broker.size() + " entries");
        for (String name : List.of("log.segment.bytes", "message.max.bytes", "num.partitions")) {
            ConfigEntry e = broker.get(name);
            Check.that(e != null && e.value() != null && e.value().matches("-?[0-9]+"),
                    "describeConfigs broker: " + name + " has a number", e);
        }
        ConfigEntry hours = broker.get("log.retention.hours");
        ConfigEntry ms = broker.get("log.retention.ms");
        Check.that((ms != null && "604800000".equals(ms.value())) || (hours != null && "168".equals(hours.value())),
                "describeConfigs broker: retention is 7 days (log.retention.ms or log.retention.hours)", ms + " / " + hours);
        Map<String, ConfigEntry> t = describeConfigs(admin, new ConfigResource(ConfigResource.Type.TOPIC, topic));
        ConfigEntry retention = t.get("retention.ms");
        Check.equal(RETENTION_MS + " " + ConfigEntry.ConfigSource.DYNAMIC_TOPIC_CONFIG,
                retention.value() + " " + retention.source(), "describeConfigs topic: retention.ms value and source");
        Check.that(!retention.isDefault(), "describeConfigs topic: retention.ms is not a default", retention);
        ConfigEntry segment = t.get("segment.bytes");
        Check.equal(SEGMENT_BYTES + " " + ConfigEntry.ConfigSource.DYNAMIC_TOPIC_CONFIG,
                segment.value() + " " + segment.source(), "describeConfigs topic: segment.bytes value and source");
        ConfigEntry cleanup = t.get("cleanup.policy");
        Check.that(cleanup != null && "delete".equals(cleanup.value())
                        && cleanup.source() == ConfigEntry.ConfigSource.DEFAULT_CONFIG && cleanup.isDefault(),
                "describeConfigs topic: cleanup.policy is the default delete", cleanup);
        ConfigEntry maxMessage = t.get("max.message.bytes");
        Check.that(maxMessage != null && MESSAGE_MAX_BYTES_DEFAULT.equals(maxMessage.value())
                        && (maxMessage.source() == ConfigEntry.ConfigSource.DEFAULT_CONFIG
                                || maxMessage.source() == ConfigEntry.ConfigSource.STATIC_BROKER_CONFIG),
                "describeConfigs topic: max.message.bytes inherits message.max.bytes (" + MESSAGE_MAX_BYTES_DEFAULT + ")",
                maxMessage);
        return broker.get("log.segment.bytes").value();
    }

    private static ConfigResource brokerResource(Node node) {
        return new ConfigResource(ConfigResource.Type.BROKER, Integer.toString(node.id()));
    }

    /**
     * The synonyms DescribeConfigs gives with includeSynonyms (KIP-226): each entry's
     * chain of sources, most specific first. Checked last, after the topic's configs
     * were altered: retention.ms is a topic override, segment.bytes was deleted (so the
     * broker's log.segment.bytes applies), max.message.bytes was never set.
     */
    private static void configSynonyms(Admin admin, String topic, Node node, String segmentBytesDefault) {
        Map<String, ConfigEntry> t = describeConfigs(admin, new ConfigResource(ConfigResource.Type.TOPIC, topic));
        List<ConfigEntry.ConfigSynonym> retention = t.get("retention.ms").synonyms();
        Check.that(!retention.isEmpty() && retention.get(0).name().equals("retention.ms")
                        && RETENTION_MS_ALTERED.equals(retention.get(0).value())
                        && retention.get(0).source() == ConfigEntry.ConfigSource.DYNAMIC_TOPIC_CONFIG,
                "describeConfigs topic synonyms: retention.ms starts with the topic override", retention);
        List<ConfigEntry.ConfigSynonym> segment = t.get("segment.bytes").synonyms();
        Check.that(!segment.isEmpty() && segment.get(0).name().equals("log.segment.bytes")
                        && segmentBytesDefault.equals(segment.get(0).value()),
                "describeConfigs topic synonyms: segment.bytes (override deleted) comes from log.segment.bytes", segment);
        List<ConfigEntry.ConfigSynonym> maxMessage = t.get("max.message.bytes").synonyms();
        Check.that(maxMessage.stream().anyMatch(s -> s.name().equals("message.max.bytes")
                        && MESSAGE_MAX_BYTES_DEFAULT.equals(s.value())),
                "describeConfigs topic synonyms: max.message.bytes names message.max.bytes", maxMessage);
        ConfigEntry brokerMax = describeConfigs(admin, brokerResource(node)).get("message.max.bytes");
        Check.that(!brokerMax.synonyms().isEmpty() && brokerMax.synonyms().get(0).name().equals("message.max.bytes")
                        && brokerMax.synonyms().get(0).source() == brokerMax.source(),
                "describeConfigs broker synonyms: message.max.bytes lists its own source first", brokerMax);
    }

    private static void alterConfigs(Admin admin, String topic, String segmentBytesDefault) {
        ConfigResource r = new ConfigResource(ConfigResource.Type.TOPIC, topic);
        Kit.get(admin.incrementalAlterConfigs(Map.of(r, List.of(
                new AlterConfigOp(new ConfigEntry("retention.ms", RETENTION_MS_ALTERED), AlterConfigOp.OpType.SET),
                new AlterConfigOp(new ConfigEntry("segment.bytes", null), AlterConfigOp.OpType.DELETE)))).all(),
                "incrementalAlterConfigs");
        Check.ok("incrementalAlterConfigs: SET retention.ms, DELETE segment.bytes");
        final Object[] last = {null};
        Check.waitFor("describeConfigs shows retention.ms=" + RETENTION_MS_ALTERED + " and segment.bytes back to "
                + segmentBytesDefault, SETTLE_TIMEOUT_MS, () -> {
                    Map<String, ConfigEntry> t = describeConfigs(admin, r);
                    ConfigEntry ret = t.get("retention.ms");
                    ConfigEntry seg = t.get("segment.bytes");
                    last[0] = ret + " / " + seg;
                    return RETENTION_MS_ALTERED.equals(ret.value())
                            && ret.source() == ConfigEntry.ConfigSource.DYNAMIC_TOPIC_CONFIG
                            && segmentBytesDefault.equals(seg.value())
                            && seg.source() != ConfigEntry.ConfigSource.DYNAMIC_TOPIC_CONFIG ? Boolean.TRUE : null;
                }, () -> last[0]);
        Throwable bad = Kit.failureOf(admin.incrementalAlterConfigs(Map.of(r, List.of(
                new AlterConfigOp(new ConfigEntry("retention.ms", "soon"), AlterConfigOp.OpType.SET)))).all(),
                "incrementalAlterConfigs retention.ms=soon");
        Check.that(bad instanceof InvalidConfigurationException,
                "incrementalAlterConfigs retention.ms=soon fails with InvalidConfigurationException", Check.describe(bad));
        Check.equal(RETENTION_MS_ALTERED, describeConfigs(admin, r).get("retention.ms").value(),
                "the refused change left retention.ms unchanged");
    }

    private static void createPartitions(Admin admin, String topic) {
        Kit.get(admin.createPartitions(Map.of(topic, NewPartitions.increaseTo(5))).all(), "createPartitions");
        Check.ok("createPartitions to 5");
        Kit.awaitPartitions(admin, topic, 5);
    }

    private static void deleteRecords(Admin admin, String bootstrap, String topic) {
        TopicPartition tp = new TopicPartition(topic, 0);
        long low = Kit.get(admin.deleteRecords(Map.of(tp, RecordsToDelete.beforeOffset(5))).lowWatermarks().get(tp),
                "deleteRecords").lowWatermark();
        Check.equal(5L, low, "deleteRecords: low watermark");
        Check.equal(5L, offset(admin, tp, OffsetSpec.earliest(), null).offset(), "listOffsets earliest after deleteRecords");
        try (KafkaConsumer<String, String> c = new KafkaConsumer<>(Kit.stringConsumerProps(bootstrap, "read_uncommitted"))) {
            List<ConsumerRecord<String, String>> rs = Kit.readToEnd(c, List.of(tp), Map.of(tp, (long) RECORDS), SETTLE_TIMEOUT_MS);
            Check.equal("5 6 7 8 9", rs.stream().map(r -> Long.toString(r.offset())).collect(Collectors.joining(" ")),
                    "a consumer from the beginning reads offsets");
        }
    }

    private static void groups(Admin admin, String bootstrap, String topic) {
        String group = Kit.unique("admin-group");
        Properties cp = Kit.stringConsumerProps(bootstrap, "read_uncommitted");
        cp.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        cp.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, "classic");
        TopicPartition p0 = new TopicPartition(topic, 0);
        TopicPartition p1 = new TopicPartition(topic, 1);
        try (KafkaConsumer<String, String> c = new KafkaConsumer<>(cp)) {
            c.subscribe(List.of(topic));
            long deadline = System.nanoTime() + SETTLE_TIMEOUT_MS * 1_000_000L;
            int read = 0;
            while (read < RECORDS - 5 || c.assignment().size() < 5) {
                read += c.poll(Duration.ofMillis(Kit.POLL_MS)).count();
                if (System.nanoTime() > deadline) {
                    throw Check.fail("group consumer read " + read + " records, assignment " + c.assignment());
                }
            }
            // commitSync() commits the positions the consumer knows; an empty partition's position is only
            // known once its offset reset finished, which poll() may not have waited for. position() waits.
            for (TopicPartition tp : c.assignment()) {
                c.position(tp, Duration.ofMillis(Kit.ADMIN_TIMEOUT_MS));
            }
            c.commitSync(Duration.ofMillis(Kit.ADMIN_TIMEOUT_MS));
            Check.ok("a group consumer read partition 0 from the log start and committed");
            ConsumerGroupDescription d = Kit.get(admin.describeConsumerGroups(List.of(group)).describedGroups().get(group),
                    "describeConsumerGroups");
            Check.equal(GroupState.STABLE, d.groupState(), "describeConsumerGroups: state");
            Check.equal(GroupType.CLASSIC, d.type(), "describeConsumerGroups: type");
            Check.equal(1, d.members().size(), "describeConsumerGroups: members");
            Check.equal(5, d.members().iterator().next().assignment().topicPartitions().size(),
                    "describeConsumerGroups: the member's assigned partitions");
            Check.equal("range", d.partitionAssignor(), "describeConsumerGroups: assignor (the client's first choice)");
            Check.that(!d.isSimpleConsumerGroup(), "describeConsumerGroups: not a simple group", d);
            Collection<GroupListing> stable = Kit.get(admin.listGroups(ListGroupsOptions.forConsumerGroups()
                    .inGroupStates(Set.of(GroupState.STABLE))).all(), "listGroups");
            Check.that(stable.stream().anyMatch(g -> g.groupId().equals(group)),
                    "listGroups (consumer groups, state Stable) includes the group", stable);
            checkListConsumerGroups(admin, group);
        }
        final Object[] last = {null};
        Check.waitFor("after the consumer closed: describeConsumerGroups says Empty with no members", SETTLE_TIMEOUT_MS, () -> {
            ConsumerGroupDescription d = Kit.get(admin.describeConsumerGroups(List.of(group)).describedGroups().get(group),
                    "describeConsumerGroups");
            last[0] = d;
            return d.groupState() == GroupState.EMPTY && d.members().isEmpty() ? Boolean.TRUE : null;
        }, () -> last[0]);
        Map<TopicPartition, OffsetAndMetadata> offsets =
                Kit.get(admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata(), "listConsumerGroupOffsets");
        Check.equal((long) RECORDS, offsets.get(p0) == null ? null : offsets.get(p0).offset(),
                "listConsumerGroupOffsets: partition 0");
        Check.equal(0L, offsets.get(p1) == null ? null : offsets.get(p1).offset(), "listConsumerGroupOffsets: partition 1");
        Check.equal(5, offsets.size(), "listConsumerGroupOffsets: partitions with a committed offset");
        Kit.get(admin.deleteConsumerGroupOffsets(group, Set.of(p0)).all(), "deleteConsumerGroupOffsets");
        Map<TopicPartition, OffsetAndMetadata> after =
                Kit.get(admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata(), "listConsumerGroupOffsets");
        Check.that(!after.containsKey(p0) && after.containsKey(p1),
                "deleteConsumerGroupOffsets removed partition 0's offset only", after);
        Kit.get(admin.deleteConsumerGroups(List.of(group)).all(), "deleteConsumerGroups");
        Collection<GroupListing> groups = Kit.get(admin.listGroups(ListGroupsOptions.forConsumerGroups()).all(), "listGroups");
        Check.that(groups.stream().noneMatch(g -> g.groupId().equals(group)), "deleteConsumerGroups: the group is gone",
                groups);
    }

    /** The older listConsumerGroups call (deprecated in 4.x for listGroups, still used by tools). */
    @SuppressWarnings("deprecation")
    private static void checkListConsumerGroups(Admin admin, String group) {
        Collection<org.apache.kafka.clients.admin.ConsumerGroupListing> all =
                Kit.get(admin.listConsumerGroups().all(), "listConsumerGroups");
        org.apache.kafka.clients.admin.ConsumerGroupListing mine =
                all.stream().filter(g -> g.groupId().equals(group)).findFirst().orElse(null);
        Check.that(mine != null && !mine.isSimpleConsumerGroup()
                        && mine.groupState().orElse(null) == GroupState.STABLE
                        && mine.type().orElse(null) == GroupType.CLASSIC,
                "listConsumerGroups lists the group as a Stable classic consumer group", mine);
    }

    private static void transactions(Admin admin, String bootstrap, String topic) throws Exception {
        String txnId = Kit.unique("admin-tx");
        TopicPartition p1 = new TopicPartition(topic, 1);
        Properties pp = Kit.stringProducerProps(bootstrap);
        pp.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, txnId);
        try (KafkaProducer<String, String> p = new KafkaProducer<>(pp)) {
            p.initTransactions();
            p.beginTransaction();
            p.send(new ProducerRecord<>(topic, 1, "t", "t1")).get();
            Collection<TransactionListing> listed = Kit.get(admin.listTransactions().all(), "listTransactions");
            TransactionListing mine = listed.stream().filter(l -> l.transactionalId().equals(txnId)).findFirst().orElse(null);
            Check.that(mine != null && mine.state() == TransactionState.ONGOING,
                    "listTransactions shows the open transaction as Ongoing", listed);
            TransactionDescription d = Kit.get(admin.describeTransactions(List.of(txnId)).description(txnId),
                    "describeTransactions");
            Check.equal(TransactionState.ONGOING, d.state(), "describeTransactions: state");
            Check.equal(Set.of(p1), d.topicPartitions(), "describeTransactions: partitions");
            Check.equal(TRANSACTION_TIMEOUT_MS_DEFAULT, d.transactionTimeoutMs(), "describeTransactions: timeout");
            Check.equal(mine.producerId(), d.producerId(), "describeTransactions: producer id matches listTransactions");
            Check.that(d.transactionStartTimeMs().isPresent(), "describeTransactions: start time present", d);
            List<ProducerState> states = Kit.get(admin.describeProducers(List.of(p1)).partitionResult(p1),
                    "describeProducers").activeProducers();
            Check.that(states.size() == 1 && states.get(0).producerId() == d.producerId()
                            && states.get(0).currentTransactionStartOffset().orElse(-1) == 0,
                    "describeProducers: the transactional producer, its transaction starting at offset 0", states);
            Collection<TransactionListing> ongoing = Kit.get(admin.listTransactions(
                    new org.apache.kafka.clients.admin.ListTransactionsOptions().filterStates(List.of(TransactionState.ONGOING)))
                    .all(), "listTransactions(Ongoing)");
            Check.that(ongoing.stream().anyMatch(l -> l.transactionalId().equals(txnId)),
                    "listTransactions filtered by state Ongoing includes it", ongoing);
            p.commitTransaction();
        }
        final Object[] last = {null};
        Check.waitFor("describeTransactions says CompleteCommit after the commit", SETTLE_TIMEOUT_MS, () -> {
            TransactionDescription d = Kit.get(admin.describeTransactions(List.of(txnId)).description(txnId),
                    "describeTransactions");
            last[0] = d;
            return d.state() == TransactionState.COMPLETE_COMMIT && d.topicPartitions().isEmpty() ? Boolean.TRUE : null;
        }, () -> last[0]);
        Check.waitFor("describeProducers: no transaction open on partition 1 after the marker", SETTLE_TIMEOUT_MS, () -> {
            List<ProducerState> states = Kit.get(admin.describeProducers(List.of(p1)).partitionResult(p1),
                    "describeProducers").activeProducers();
            last[0] = states;
            return states.size() == 1 && states.get(0).currentTransactionStartOffset().isEmpty() ? Boolean.TRUE : null;
        }, () -> last[0]);
    }

    private static void deleteTopic(Admin admin, String topic) {
        Kit.get(admin.deleteTopics(List.of(topic)).all(), "deleteTopics");
        Check.ok("deleteTopics");
        final Object[] last = {null};
        Check.waitFor("the deleted topic is gone from listTopics and describeTopics", SETTLE_TIMEOUT_MS, () -> {
            Set<String> names = Kit.get(admin.listTopics().names(), "listTopics");
            if (names.contains(topic)) {
                last[0] = "still listed";
                return null;
            }
            try {
                admin.describeTopics(List.of(topic)).allTopicNames().get(Kit.ADMIN_TIMEOUT_MS,
                        java.util.concurrent.TimeUnit.MILLISECONDS);
                last[0] = "describeTopics still succeeds";
                return null;
            } catch (java.util.concurrent.ExecutionException e) {
                last[0] = Check.describe(e.getCause());
                return e.getCause() instanceof UnknownTopicOrPartitionException ? Boolean.TRUE : null;
            } catch (Exception e) {
                last[0] = Check.describe(e);
                return null;
            }
        }, () -> last[0]);
    }
}
