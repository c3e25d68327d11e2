//! The APIs and versions fjord implements, and the ApiVersions answer.
//!
//! [`SUPPORTED`] is the single source of truth: the broker dispatches only
//! what it lists, and ApiVersions advertises exactly it, so a client never
//! picks a version the broker would reject. It is a constant, identical on
//! every shard.
//!
//! An ApiVersions request whose version fjord does not support is answered
//! as Kafka does (`ApiVersionsRequest.getErrorResponse`, KIP-511): error
//! UNSUPPORTED_VERSION (35), `api_keys` holding only ApiVersions' own
//! range, encoded in ApiVersions v0 format (so any client can read it)
//! and with response header v0. A v0 body has no throttle time and no
//! feature fields.

use super::wire::put_array_len;
use bytes::{BufMut, BytesMut};
use kafka_protocol::messages::api_versions_response::{
    ApiVersion, ApiVersionsResponse, FinalizedFeatureKey, SupportedFeatureKey,
};
use kafka_protocol::messages::ApiKey;
use kafka_protocol::protocol::{Encodable, StrBytes};

/// Kafka's UNSUPPORTED_VERSION error code.
pub const UNSUPPORTED_VERSION: i16 = 35;

/// The minimum Produce version ApiVersions advertises, below the minimum
/// served (3). Kafka 4.0 removed Produce v0-2 (KIP-896), but librdkafka
/// before 2.11.1 reads a minimum of 3 as "no Produce v2", concludes the
/// broker lacks the message-format features those versions imply, and
/// then sends every compressed batch uncompressed (librdkafka #4956).
/// Kafka's fix (KAFKA-18659, `ApiKeys.PRODUCE_API_VERSIONS_RESPONSE_MIN_VERSION`)
/// advertises 0 and still refuses v0-2 as unsupported: its socket server
/// throws UnsupportedVersionException while parsing the request header and
/// closes the connection, which is what [`supported`] (the dispatch check,
/// still 3-12) makes fjord do.
pub const PRODUCE_ADVERTISED_MIN_VERSION: i16 = 0;

/// Every API fjord serves, with the inclusive version range it implements.
pub const SUPPORTED: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 13),
    (ApiKey::Fetch, 4, 18),
    (ApiKey::ListOffsets, 1, 11),
    (ApiKey::OffsetForLeaderEpoch, 2, 4),
    (ApiKey::Metadata, 0, 13),
    (ApiKey::ApiVersions, 0, 5),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 6),
    (ApiKey::InitProducerId, 0, 5),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::AlterConfigs, 0, 2),
    (ApiKey::DescribeLogDirs, 1, 5),
    (ApiKey::DeleteRecords, 0, 2),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::DescribeCluster, 0, 2),
    (ApiKey::AddPartitionsToTxn, 0, 5),
    (ApiKey::AddOffsetsToTxn, 0, 4),
    (ApiKey::EndTxn, 0, 5),
    (ApiKey::WriteTxnMarkers, 1, 2),
    (ApiKey::DescribeTransactions, 0, 0),
    (ApiKey::ListTransactions, 0, 2),
    (ApiKey::DescribeProducers, 0, 0),
    (ApiKey::FindCoordinator, 0, 6),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    // v0-1 of OffsetCommit and v0 of OffsetFetch are not in kafka-protocol
    // 0.18's schemas (Kafka 4 removed them, KIP-896).
    (ApiKey::OffsetCommit, 2, 10),
    (ApiKey::OffsetFetch, 1, 10),
    (ApiKey::ListGroups, 0, 5),
    (ApiKey::DescribeGroups, 0, 6),
    (ApiKey::DeleteGroups, 0, 3),
    (ApiKey::OffsetDelete, 0, 0),
    (ApiKey::TxnOffsetCommit, 0, 6),
    (ApiKey::ConsumerGroupHeartbeat, 0, 1),
    (ApiKey::ConsumerGroupDescribe, 0, 1),
    (ApiKey::DescribeTopicPartitions, 0, 0),
    (ApiKey::ElectLeaders, 0, 2),
    // KIP-455; v1 adds allowReplicationFactorChange (KIP-860).
    (ApiKey::AlterPartitionReassignments, 0, 1),
    (ApiKey::ListPartitionReassignments, 0, 0),
    // KIP-500's `kafka-cluster unregister`; advertised on every node, as
    // Kafka's brokers do (a single node has no registrations to remove).
    (ApiKey::UnregisterBroker, 0, 0),
    // SASL (Kafka 4.4's ranges); on a PLAINTEXT listener they are answered
    // ILLEGAL_SASL_STATE, as Kafka does.
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::SaslAuthenticate, 0, 2),
    (ApiKey::DescribeUserScramCredentials, 0, 0),
    (ApiKey::AlterUserScramCredentials, 0, 0),
    // No client quotas exist: answered with none (`kafka-configs
    // --describe --entity-type users` asks for them).
    (ApiKey::DescribeClientQuotas, 0, 1),
    // v0 went in Kafka 4.0 (KIP-896); 4.4 serves 1-3.
    (ApiKey::DescribeAcls, 1, 3),
    (ApiKey::CreateAcls, 1, 3),
    (ApiKey::DeleteAcls, 1, 3),
];

/// The supported version range of `api_key`, if fjord serves it at all.
pub fn version_range(api_key: i16) -> Option<(i16, i16)> {
    SUPPORTED
        .iter()
        .find(|(k, _, _)| *k as i16 == api_key)
        .map(|&(_, min, max)| (min, max))
}

/// Whether fjord serves `version` of `api_key`.
pub fn supported(api_key: i16, version: i16) -> bool {
    matches!(version_range(api_key), Some((min, max)) if (min..=max).contains(&version))
}

/// Feature levels to advertise. Only what is implemented goes here: a
/// level of 0 means "not advertised" (Kafka omits features whose supported
/// maximum or finalized level is 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    /// `transaction.version`: 0 until transactions exist, 2 with KIP-890.
    pub transaction_version: i16,
    /// Epoch of the finalized features (the metadata offset that set
    /// them); -1 when nothing is finalized.
    pub finalized_epoch: i64,
}

impl Features {
    /// Nothing advertised.
    pub const NONE: Features = Features {
        transaction_version: 0,
        finalized_epoch: -1,
    };
}

const TRANSACTION_VERSION_FEATURE: &str = "transaction.version";

/// The version range ApiVersions advertises for `key`, served as
/// `min..=max`: the served range, except Produce's minimum (see
/// [`PRODUCE_ADVERTISED_MIN_VERSION`]).
pub fn advertised_range(key: ApiKey, min: i16, max: i16) -> (i16, i16) {
    match key {
        ApiKey::Produce => (PRODUCE_ADVERTISED_MIN_VERSION, max),
        _ => (min, max),
    }
}

/// The ApiVersions response for a supported request version: every entry
/// of [`SUPPORTED`] (ranges as [`advertised_range`] gives them) plus the
/// given features (fields the request version lacks are dropped by the
/// encoder).
pub fn api_versions_response(features: Features) -> ApiVersionsResponse {
    let api_keys = SUPPORTED
        .iter()
        .map(|&(key, min, max)| {
            let (min, max) = advertised_range(key, min, max);
            ApiVersion::default()
                .with_api_key(key as i16)
                .with_min_version(min)
                .with_max_version(max)
        })
        .collect();
    let mut supported_features = Vec::new();
    let mut finalized_features = Vec::new();
    if features.transaction_version > 0 {
        supported_features.push(
            SupportedFeatureKey::default()
                .with_name(StrBytes::from_static_str(TRANSACTION_VERSION_FEATURE))
                .with_min_version(0)
                .with_max_version(features.transaction_version),
        );
        finalized_features.push(
            FinalizedFeatureKey::default()
                .with_name(StrBytes::from_static_str(TRANSACTION_VERSION_FEATURE))
                .with_min_version_level(features.transaction_version)
                .with_max_version_level(features.transaction_version),
        );
    }
    ApiVersionsResponse::default()
        .with_error_code(0)
        .with_api_keys(api_keys)
        .with_throttle_time_ms(0)
        .with_supported_features(supported_features)
        .with_finalized_features_epoch(features.finalized_epoch)
        .with_finalized_features(finalized_features)
}

/// The v0-format body answering an ApiVersions request of an unsupported
/// version: error 35 and ApiVersions' own range only.
pub fn unsupported_version_body() -> BytesMut {
    let (min, max) = version_range(ApiKey::ApiVersions as i16).unwrap_or((0, 0));
    let mut out = BytesMut::with_capacity(2 + 4 + 6);
    out.put_i16(UNSUPPORTED_VERSION);
    put_array_len(&mut out, 1, false);
    out.put_i16(ApiKey::ApiVersions as i16);
    out.put_i16(min);
    out.put_i16(max);
    out
}

/// The version an ApiVersions response body of `request_version` is
/// encoded at with the crate's schema: v5's body is v4's field for field
/// (KIP-1242 changed only the request), and the crate stops at v4.
fn crate_encoding_version(request_version: i16) -> i16 {
    request_version.min(API_VERSIONS_CRATE_MAX_VERSION)
}

/// The crate's newest ApiVersions schema.
const API_VERSIONS_CRATE_MAX_VERSION: i16 = 4;

/// The body (no length, no header) answering an ApiVersions request of
/// `request_version`, and the version its header and body are encoded at:
/// the request's own version if supported, else 0 with UNSUPPORTED_VERSION.
pub fn api_versions_body(request_version: i16, features: Features) -> (BytesMut, i16) {
    if !supported(ApiKey::ApiVersions as i16, request_version) {
        return (unsupported_version_body(), 0);
    }
    let resp = api_versions_response(features);
    let mut out = BytesMut::new();
    // The response is built from constants within the version's schema;
    // encoding can only fail on a programmer error.
    resp.encode(&mut out, crate_encoding_version(request_version))
        .expect("ApiVersions response within schema limits");
    (out, request_version)
}

/// The body answering a supported ApiVersions request of
/// `request_version` with `error_code` (INVALID_REQUEST, or
/// REBOOTSTRAP_REQUIRED at v5): Kafka's `ApiVersionsRequest.getErrorResponse`,
/// the error, no api keys, throttle time 0, in the request's version.
pub fn api_versions_error_body(request_version: i16, error_code: i16) -> BytesMut {
    let resp = ApiVersionsResponse::default()
        .with_error_code(error_code)
        .with_throttle_time_ms(0);
    let mut out = BytesMut::new();
    resp.encode(&mut out, crate_encoding_version(request_version))
        .expect("ApiVersions error response within schema limits");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::protocol::Decodable;

    #[test]
    fn table_matches_the_issue() {
        assert!(supported(ApiKey::Produce as i16, 3));
        assert!(supported(ApiKey::Produce as i16, 13));
        assert!(!supported(ApiKey::Produce as i16, 14));
        assert!(!supported(ApiKey::Produce as i16, 2));
        assert!(supported(ApiKey::Fetch as i16, 18));
        assert!(!supported(ApiKey::Fetch as i16, 19));
        assert!(supported(ApiKey::JoinGroup as i16, 9));
        assert!(!supported(ApiKey::JoinGroup as i16, 10));
        assert!(supported(ApiKey::FindCoordinator as i16, 6));
        assert!(!supported(ApiKey::OffsetCommit as i16, 1));
        assert!(supported(ApiKey::EndTxn as i16, 5));
        assert!(supported(ApiKey::AddPartitionsToTxn as i16, 5));
        assert!(supported(ApiKey::DeleteRecords as i16, 0));
        assert!(supported(ApiKey::DeleteRecords as i16, 2));
        assert!(!supported(ApiKey::DeleteRecords as i16, 3));
        assert!(supported(ApiKey::OffsetForLeaderEpoch as i16, 2));
        assert!(supported(ApiKey::OffsetForLeaderEpoch as i16, 4));
        assert!(!supported(ApiKey::OffsetForLeaderEpoch as i16, 1));
        assert!(supported(ApiKey::ListOffsets as i16, 11));
        assert!(supported(ApiKey::ApiVersions as i16, 5));
        assert!(supported(ApiKey::TxnOffsetCommit as i16, 6));
        assert!(supported(ApiKey::DeleteGroups as i16, 3));
        assert!(supported(ApiKey::Metadata as i16, 13));
        assert!(supported(ApiKey::DescribeCluster as i16, 2));
        assert!(supported(ApiKey::DescribeTopicPartitions as i16, 0));
        assert!(!supported(ApiKey::DescribeTopicPartitions as i16, 1));
        // Not advertised, as stock Kafka 4.4 without a metrics plugin.
        assert!(!supported(ApiKey::GetTelemetrySubscriptions as i16, 0));
        assert!(!supported(ApiKey::PushTelemetry as i16, 0));
        // The ACL APIs, at the versions Kafka 4.4 advertises.
        for key in [ApiKey::DescribeAcls, ApiKey::CreateAcls, ApiKey::DeleteAcls] {
            assert!(!supported(key as i16, 0));
            assert!(supported(key as i16, 1) && supported(key as i16, 3));
            assert!(!supported(key as i16, 4));
        }
        assert!(
            supported(ApiKey::ElectLeaders as i16, 0) && supported(ApiKey::ElectLeaders as i16, 2)
        );
        assert!(!supported(ApiKey::ElectLeaders as i16, 3));
        assert!(
            supported(ApiKey::AlterPartitionReassignments as i16, 0)
                && supported(ApiKey::AlterPartitionReassignments as i16, 1)
        );
        assert!(!supported(ApiKey::AlterPartitionReassignments as i16, 2));
        assert!(supported(ApiKey::ListPartitionReassignments as i16, 0));
        assert!(!supported(ApiKey::ListPartitionReassignments as i16, 1));
        assert!(supported(ApiKey::UnregisterBroker as i16, 0));
        assert!(!supported(ApiKey::UnregisterBroker as i16, 1));
        assert_eq!(SUPPORTED.len(), 50);
        for (key, version) in super::super::hand_versions::HAND_CODED {
            assert!(supported(*key as i16, *version), "{key:?} v{version}");
            assert!(
                !supported(*key as i16, version + 1),
                "{key:?} v{}",
                version + 1
            );
        }
        // Every advertised range lies within what kafka-protocol's schemas
        // define, but for the one version above them of the hand-coded APIs.
        for &(key, min, max) in SUPPORTED {
            let v = key.valid_versions();
            let hand = super::super::hand_versions::HAND_CODED
                .iter()
                .any(|&(k, version)| k == key && version == max && max == v.max + 1);
            assert!(
                min <= max && v.min <= min && (max <= v.max || hand),
                "{key:?}"
            );
        }
    }

    #[test]
    fn supported_request_gets_full_list_and_features() {
        let (mut body, v) = api_versions_body(
            3,
            Features {
                transaction_version: 2,
                finalized_epoch: 7,
            },
        );
        assert_eq!(v, 3);
        let resp = ApiVersionsResponse::decode(&mut body, 3).unwrap();
        assert_eq!(resp.error_code, 0);
        assert_eq!(resp.api_keys.len(), SUPPORTED.len());
        // Produce is advertised from v0 (KAFKA-18659) but served from v3.
        let produce = resp
            .api_keys
            .iter()
            .find(|k| k.api_key == ApiKey::Produce as i16)
            .unwrap();
        assert_eq!((produce.min_version, produce.max_version), (0, 13));
        assert!(!supported(ApiKey::Produce as i16, 0));
        let fetch = resp
            .api_keys
            .iter()
            .find(|k| k.api_key == ApiKey::Fetch as i16)
            .unwrap();
        assert_eq!((fetch.min_version, fetch.max_version), (4, 18));
        assert_eq!(resp.finalized_features_epoch, 7);
        assert_eq!(resp.finalized_features.len(), 1);
        assert_eq!(resp.finalized_features[0].max_version_level, 2);
        assert_eq!(&*resp.supported_features[0].name, "transaction.version");
    }

    #[test]
    fn no_features_advertised_when_none_implemented() {
        let (mut body, _) = api_versions_body(4, Features::NONE);
        let resp = ApiVersionsResponse::decode(&mut body, 4).unwrap();
        assert!(resp.supported_features.is_empty() && resp.finalized_features.is_empty());
    }

    /// What Kafka 4.4's `kafka-clients` serializes for an ApiVersions
    /// response with ApiVersions 0-5, `transaction.version` 0-2 supported
    /// and finalized at 2, epoch 1: the same bytes at v4 and v5.
    const KAFKA_V5_RESPONSE: &str = "000002001200000005000000000003001a02147472616e73616374696f6e2e76657273696f6e000000020001080000000000000001021a02147472616e73616374696f6e2e76657273696f6e0002000200";

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn v5_body_is_v4s_and_matches_kafka_bytes() {
        let resp = ApiVersionsResponse::default()
            .with_api_keys(vec![ApiVersion::default()
                .with_api_key(ApiKey::ApiVersions as i16)
                .with_min_version(0)
                .with_max_version(5)])
            .with_supported_features(vec![SupportedFeatureKey::default()
                .with_name(StrBytes::from_static_str(TRANSACTION_VERSION_FEATURE))
                .with_min_version(0)
                .with_max_version(2)])
            .with_finalized_features_epoch(1)
            .with_finalized_features(vec![FinalizedFeatureKey::default()
                .with_name(StrBytes::from_static_str(TRANSACTION_VERSION_FEATURE))
                .with_min_version_level(2)
                .with_max_version_level(2)]);
        let mut out = BytesMut::new();
        resp.encode(&mut out, crate_encoding_version(5)).unwrap();
        assert_eq!(&out[..], &hex(KAFKA_V5_RESPONSE)[..]);
        // Kafka's REBOOTSTRAP_REQUIRED answer at v5.
        assert_eq!(
            &api_versions_error_body(5, 129)[..],
            &hex("0081010000000000")[..]
        );
        let (full, v) = api_versions_body(5, Features::NONE);
        assert_eq!(v, 5);
        assert_eq!(full, api_versions_body(4, Features::NONE).0);
    }

    #[test]
    fn unsupported_version_answers_in_v0() {
        let (body, v) = api_versions_body(6, Features::NONE);
        assert_eq!(v, 0);
        // error 35, one entry: ApiVersions 0..5.
        assert_eq!(&body[..], &[0, 35, 0, 0, 0, 1, 0, 18, 0, 0, 0, 5]);
        let resp = ApiVersionsResponse::decode(&mut body.freeze(), 0).unwrap();
        assert_eq!(resp.error_code, UNSUPPORTED_VERSION);
        assert_eq!(resp.api_keys.len(), 1);
    }
}
