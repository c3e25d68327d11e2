//! Which error codes a response carries, counted as Kafka counts them for
//! its `kafka.network:type=RequestMetrics,name=ErrorsPerSec,request=X,error=Y`
//! meters: Kafka's `RequestChannel` marks, for every response it sends, the
//! map its `AbstractResponse.errorCounts()` returns — one count per
//! top-level, topic-level or partition-level error code as each response
//! type defines it, `NONE` included. [`ResponseErrors`] is that method, one
//! implementation per response type fjord sends, each a transcription of
//! the Java class of the same name (`clients/.../requests/*Response.java`).
//!
//! Why here and not in the connection: handlers encode their own responses
//! (the hot paths by hand), so the connection sees only bytes. The codes
//! are walked in the response structs just before encoding
//! ([`super::respond`]; ApiVersions, Fetch and acks=0 Produce in their
//! handlers), with
//! one thread-local access per response and no allocation
//! (`metrics::record_errors`).

use kafka_protocol::messages::*;

/// A response's error codes in the sense of Kafka's `errorCounts()`.
pub trait ResponseErrors {
    /// Calls `count` once per error code Kafka counts for this response
    /// at `version`.
    fn error_codes(&self, version: i16, count: &mut impl FnMut(i16));
}

/// Responses whose `errorCounts()` is their one top-level `error_code`.
macro_rules! top_level {
    ($($t:ty),* $(,)?) => {$(
        impl ResponseErrors for $t {
            fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
                count(self.error_code);
            }
        }
    )*};
}

top_level!(
    DescribeClusterResponse,
    JoinGroupResponse,
    SyncGroupResponse,
    HeartbeatResponse,
    ListGroupsResponse,
    AddOffsetsToTxnResponse,
    EndTxnResponse,
    InitProducerIdResponse,
    ListTransactionsResponse,
    kafka_protocol::messages::ConsumerGroupHeartbeatResponse,
    SaslHandshakeResponse,
    SaslAuthenticateResponse,
    DescribeClientQuotasResponse,
    kafka_protocol::messages::UnregisterBrokerResponse,
);

impl ResponseErrors for DescribeUserScramCredentialsResponse {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        count(self.error_code);
        for r in &self.results {
            count(r.error_code);
        }
    }
}

impl ResponseErrors for AlterUserScramCredentialsResponse {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        for r in &self.results {
            count(r.error_code);
        }
    }
}

impl ResponseErrors for kafka_protocol::messages::ConsumerGroupDescribeResponse {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        for g in &self.groups {
            count(g.error_code);
        }
    }
}

impl ResponseErrors for ProduceResponse {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        for t in &self.responses {
            for p in &t.partition_responses {
                count(p.error_code);
            }
        }
    }
}

impl ResponseErrors for MetadataResponse {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        for t in &self.topics {
            for p in &t.partitions {
                count(p.error_code);
            }
            count(t.error_code);
        }
    }
}

impl ResponseErrors for DescribeLogDirsResponse {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        count(self.error_code);
        for r in &self.results {
            count(r.error_code);
        }
    }
}

impl ResponseErrors for LeaveGroupResponse {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        count(self.error_code);
        for m in &self.members {
            count(m.error_code);
        }
    }
}

impl ResponseErrors for FindCoordinatorResponse {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        if self.coordinators.is_empty() {
            count(self.error_code);
        }
        for c in &self.coordinators {
            count(c.error_code);
        }
    }
}

impl ResponseErrors for OffsetCommitResponse {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        for t in &self.topics {
            for p in &t.partitions {
                count(p.error_code);
            }
        }
    }
}

impl ResponseErrors for TxnOffsetCommitResponse {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        for t in &self.topics {
            for p in &t.partitions {
                count(p.error_code);
            }
        }
    }
}

impl ResponseErrors for OffsetFetchResponse {
    fn error_codes(&self, version: i16, count: &mut impl FnMut(i16)) {
        if version >= 8 {
            // One group-level error per group, then the partitions.
            for g in &self.groups {
                count(g.error_code);
            }
            for g in &self.groups {
                for t in &g.topics {
                    for p in &t.partitions {
                        count(p.error_code);
                    }
                }
            }
        } else {
            count(self.error_code);
            for t in &self.topics {
                for p in &t.partitions {
                    count(p.error_code);
                }
            }
        }
    }
}

impl ResponseErrors for OffsetDeleteResponse {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        count(self.error_code);
        for t in &self.topics {
            for p in &t.partitions {
                count(p.error_code);
            }
        }
    }
}

impl ResponseErrors for DescribeGroupsResponse {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        for g in &self.groups {
            count(g.error_code);
        }
    }
}

impl ResponseErrors for DeleteGroupsResponse {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        for r in &self.results {
            count(r.error_code);
        }
    }
}

impl ResponseErrors for AddPartitionsToTxnResponse {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        // v4+ (no v3-style results): the top-level code counts too.
        if self.results_by_topic_v3_and_below.is_empty() {
            count(self.error_code);
        }
        for t in &self.results_by_topic_v3_and_below {
            for p in &t.results_by_partition {
                count(p.partition_error_code);
            }
        }
        for r in &self.results_by_transaction {
            for t in &r.topic_results {
                for p in &t.results_by_partition {
                    count(p.partition_error_code);
                }
            }
        }
    }
}

impl ResponseErrors for OffsetForLeaderEpochResponse {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        for t in &self.topics {
            for p in &t.partitions {
                count(p.error_code);
            }
        }
    }
}

impl ResponseErrors for ListOffsetsResponse {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        for t in &self.topics {
            for p in &t.partitions {
                count(p.error_code);
            }
        }
    }
}

impl ResponseErrors for CreateTopicsResponse {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        for t in &self.topics {
            count(t.error_code);
        }
    }
}

impl ResponseErrors for DeleteTopicsResponse {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        for t in &self.responses {
            count(t.error_code);
        }
    }
}

impl ResponseErrors for ElectLeadersResponse {
    fn error_codes(&self, version: i16, count: &mut impl FnMut(i16)) {
        if version >= 1 {
            count(self.error_code);
        }
        for t in &self.replica_election_results {
            for p in &t.partition_result {
                count(p.error_code);
            }
        }
    }
}

impl ResponseErrors for AlterPartitionReassignmentsResponse {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        count(self.error_code);
        for t in &self.responses {
            for p in &t.partitions {
                count(p.error_code);
            }
        }
    }
}

impl ResponseErrors for ListPartitionReassignmentsResponse {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        count(self.error_code);
    }
}

impl ResponseErrors for CreatePartitionsResponse {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        for r in &self.results {
            count(r.error_code);
        }
    }
}

impl ResponseErrors for WriteTxnMarkersResponse {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        for m in &self.markers {
            for t in &m.topics {
                for p in &t.partitions {
                    count(p.error_code);
                }
            }
        }
    }
}

/// The hand-coded versions (`protocol::hand_versions`) count as the
/// crate's previous version of the same response does.
impl ResponseErrors for crate::protocol::hand_versions::OffsetCommitResponseV10 {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        for (_, partitions) in &self.topics {
            for p in partitions {
                count(p.error_code);
            }
        }
    }
}

impl ResponseErrors for crate::protocol::hand_versions::OffsetFetchResponseV10 {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        for g in &self.groups {
            count(g.error_code);
        }
        for g in &self.groups {
            for (_, partitions) in &g.topics {
                for p in partitions {
                    count(p.error_code);
                }
            }
        }
    }
}

impl ResponseErrors for crate::protocol::hand_versions::WriteTxnMarkersResponseV2 {
    fn error_codes(&self, version: i16, count: &mut impl FnMut(i16)) {
        self.0.error_codes(version, count);
    }
}

impl ResponseErrors for crate::protocol::hand_versions::DescribeLogDirsResponseV5 {
    fn error_codes(&self, version: i16, count: &mut impl FnMut(i16)) {
        self.response.error_codes(version, count);
    }
}

impl ResponseErrors for crate::protocol::hand_versions_more::TxnOffsetCommitResponseV6 {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        for (_, partitions) in &self.topics {
            for p in partitions {
                count(p.error_code);
            }
        }
    }
}

impl ResponseErrors for crate::protocol::hand_versions_more::ListOffsetsResponseV11 {
    fn error_codes(&self, version: i16, count: &mut impl FnMut(i16)) {
        self.0.error_codes(version, count);
    }
}

impl ResponseErrors for crate::protocol::hand_versions_more::DeleteGroupsResponseV3 {
    fn error_codes(&self, version: i16, count: &mut impl FnMut(i16)) {
        self.response.error_codes(version, count);
    }
}

impl ResponseErrors for DescribeTransactionsResponse {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        for s in &self.transaction_states {
            count(s.error_code);
        }
    }
}

impl ResponseErrors for DescribeProducersResponse {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        for t in &self.topics {
            for p in &t.partitions {
                count(p.error_code);
            }
        }
    }
}

impl ResponseErrors for DeleteRecordsResponse {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        for t in &self.topics {
            for p in &t.partitions {
                count(p.error_code);
            }
        }
    }
}

impl ResponseErrors for DescribeConfigsResponse {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        for r in &self.results {
            count(r.error_code);
        }
    }
}

impl ResponseErrors for AlterConfigsResponse {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        for r in &self.responses {
            count(r.error_code);
        }
    }
}

impl ResponseErrors for IncrementalAlterConfigsResponse {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        for r in &self.responses {
            count(r.error_code);
        }
    }
}

impl ResponseErrors for crate::protocol::fetch::FetchResponse {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        count(self.error_code);
        for t in &self.topics {
            for p in &t.partitions {
                count(p.error_code);
            }
        }
    }
}

impl ResponseErrors for DescribeTopicPartitionsResponse {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        for t in &self.topics {
            for p in &t.partitions {
                count(p.error_code);
            }
            count(t.error_code);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codes<T: ResponseErrors>(r: &T, version: i16) -> Vec<i16> {
        let mut out = Vec::new();
        r.error_codes(version, &mut |c| out.push(c));
        out
    }

    #[test]
    fn metadata_counts_every_partition_and_every_topic() {
        use kafka_protocol::messages::metadata_response::*;
        let topic = |code, parts: &[i16]| {
            MetadataResponseTopic::default()
                .with_error_code(code)
                .with_partitions(
                    parts
                        .iter()
                        .map(|&c| MetadataResponsePartition::default().with_error_code(c))
                        .collect(),
                )
        };
        let r = MetadataResponse::default().with_topics(vec![topic(0, &[0, 0]), topic(3, &[])]);
        assert_eq!(codes(&r, 12), vec![0, 0, 0, 3]);
    }

    #[test]
    fn offset_fetch_counts_group_errors_from_v8_and_the_top_level_before() {
        use kafka_protocol::messages::offset_fetch_response::*;
        let r = OffsetFetchResponse::default()
            .with_error_code(16)
            .with_groups(vec![OffsetFetchResponseGroup::default().with_error_code(15)]);
        assert_eq!(codes(&r, 8), vec![15]);
        assert_eq!(codes(&r, 7), vec![16]);
    }

    #[test]
    fn add_partitions_to_txn_counts_the_top_level_code_only_from_v4() {
        use kafka_protocol::messages::add_partitions_to_txn_response::*;
        let part = AddPartitionsToTxnPartitionResult::default().with_partition_error_code(48);
        let topic = AddPartitionsToTxnTopicResult::default().with_results_by_partition(vec![part]);
        let v3 = AddPartitionsToTxnResponse::default()
            .with_results_by_topic_v3_and_below(vec![topic.clone()]);
        assert_eq!(codes(&v3, 3), vec![48]);
        let v4 = AddPartitionsToTxnResponse::default().with_results_by_transaction(vec![
            AddPartitionsToTxnResult::default().with_topic_results(vec![topic]),
        ]);
        assert_eq!(codes(&v4, 4), vec![0, 48]);
    }
}

top_level!(DescribeAclsResponse);

impl ResponseErrors for CreateAclsResponse {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        for r in &self.results {
            count(r.error_code);
        }
    }
}

impl ResponseErrors for DeleteAclsResponse {
    fn error_codes(&self, _version: i16, count: &mut impl FnMut(i16)) {
        for f in &self.filter_results {
            count(f.error_code);
            for m in &f.matching_acls {
                count(m.error_code);
            }
        }
    }
}
