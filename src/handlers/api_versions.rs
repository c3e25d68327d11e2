//! ApiVersions: what this broker implements, exactly.
//!
//! An ApiVersions request of a version the broker does not know is still
//! answered — with UNSUPPORTED_VERSION in the v0 format, listing the
//! ApiVersions range, so the client can retry with a version both support.
//!
//! v5 (KIP-1242) carries the cluster id and node id the client means to
//! reach. As Kafka's `KafkaApis.handleApiVersionsRequest`: a request that
//! gives one of them without the other, or a client software name or
//! version outside Kafka's pattern, is INVALID_REQUEST; a cluster id that
//! is not this cluster's, or a node id that is not this node's, is
//! REBOOTSTRAP_REQUIRED (the client's metadata is stale: it bootstraps
//! again). Each shard is its own node (`node_id × 1000 + shard`), so the
//! node a client names is the shard it believes it reached; a connection
//! lands on the shard whose port it dialled, so a mismatch means the
//! client's metadata is older than the broker's. Both errors come with no
//! api keys, in the request's version. Earlier versions' bodies are not
//! read (Kafka checks the software name and version from v3; fjord does
//! not, as before v5 it never did).

use super::{errors, Outcome};
use crate::protocol::apis::{api_versions_body, api_versions_error_body, Features};
use crate::protocol::hand_versions_more::{ApiVersionsRequestV5, API_VERSIONS_REBOOTSTRAP_VERSION};
use crate::protocol::{supported, RequestHeader};
use crate::record::RecordsChunk;
use crate::shard::ShardCtx;
use bytes::BytesMut;
use kafka_protocol::protocol::Decodable;
use kafka_protocol::ResponseError;

/// The finalized features this broker advertises: `transaction.version` 2
/// (KIP-890: Produce v12 adds partitions to the transaction, EndTxn v5
/// bumps the epoch per transaction). Clients of version 1 keep working.
pub const FEATURES: Features = Features {
    transaction_version: 2,
    finalized_epoch: 1,
};

pub fn handle(ctx: &ShardCtx, header: &RequestHeader, body: &mut BytesMut) -> Outcome {
    let v5_error = if header.api_version == API_VERSIONS_REBOOTSTRAP_VERSION {
        match ApiVersionsRequestV5::decode(body, header.api_version) {
            // Kafka cannot parse it either: it closes the connection.
            Err(e) => {
                tracing::debug!(error = %e, "malformed ApiVersions v5 request; closing");
                return Outcome::Close;
            }
            Ok(req) => v5_check(
                &req,
                ctx.image().cluster_id_or(&ctx.config.cluster_id),
                ctx.config.node_id_of(ctx.shard),
            ),
        }
    } else {
        None
    };
    let body = match v5_error {
        Some(code) => api_versions_error_body(header.api_version, code),
        None => api_versions_body(header.api_version, FEATURES).0,
    };
    // Kafka's ApiVersionsResponse.errorCounts(): its one top-level code.
    let code = match v5_error {
        Some(code) => code,
        None if supported(header.api_key, header.api_version) => errors::NONE,
        None => ResponseError::UnsupportedVersion.code(),
    };
    crate::metrics::record_errors(header.api_key, |counts| counts.count(code));
    let mut out = BytesMut::with_capacity(8 + body.len());
    out.extend_from_slice(&((4 + body.len()) as i32).to_be_bytes());
    // ApiVersions responses always use response header v0.
    out.extend_from_slice(&header.correlation_id.to_be_bytes());
    out.extend_from_slice(&body);
    Outcome::Reply(vec![RecordsChunk::Memory(out.freeze())])
}

/// The error a v5 request gets from the node `node_id` of cluster
/// `cluster_id` (None: none, the full answer). Kafka's order: the request's
/// validity (`ApiVersionsRequest.isValid`), then the cluster and node.
pub fn v5_check(req: &ApiVersionsRequestV5, cluster_id: &str, node_id: i32) -> Option<i16> {
    let one_without_other = req.cluster_id.is_none() != (req.node_id == -1);
    if one_without_other
        || !software_name_or_version(&req.client_software_name)
        || !software_name_or_version(&req.client_software_version)
    {
        return Some(ResponseError::InvalidRequest.code());
    }
    match &req.cluster_id {
        Some(c) if c != cluster_id || req.node_id != node_id => {
            Some(ResponseError::RebootstrapRequired.code())
        }
        _ => None,
    }
}

/// Kafka's `SOFTWARE_NAME_VERSION_PATTERN`, `[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?`:
/// letters and digits at both ends, dashes and dots allowed between.
fn software_name_or_version(s: &str) -> bool {
    let b = s.as_bytes();
    let end = |c: &u8| c.is_ascii_alphanumeric();
    match (b.first(), b.last()) {
        (Some(first), Some(last)) => {
            end(first)
                && end(last)
                && b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'.')
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(cluster: Option<&str>, node: i32) -> ApiVersionsRequestV5 {
        ApiVersionsRequestV5 {
            client_software_name: "apache-kafka-java".into(),
            client_software_version: "4.4.0".into(),
            cluster_id: cluster.map(String::from),
            node_id: node,
        }
    }

    #[test]
    fn v5_checks_as_kafka() {
        const INVALID: Option<i16> = Some(42);
        const REBOOTSTRAP: Option<i16> = Some(129);
        assert_eq!(v5_check(&req(None, -1), "c", 1000), None);
        assert_eq!(v5_check(&req(Some("c"), 1000), "c", 1000), None);
        assert_eq!(v5_check(&req(Some("c"), 1001), "c", 1000), REBOOTSTRAP);
        assert_eq!(v5_check(&req(Some("d"), 1000), "c", 1000), REBOOTSTRAP);
        assert_eq!(v5_check(&req(Some("c"), -1), "c", 1000), INVALID);
        assert_eq!(v5_check(&req(None, 1000), "c", 1000), INVALID);
        let mut bad = req(None, -1);
        bad.client_software_version = "4.4.0-".into();
        assert_eq!(v5_check(&bad, "c", 1000), INVALID);
        bad.client_software_version = String::new();
        assert_eq!(v5_check(&bad, "c", 1000), INVALID);
    }

    #[test]
    fn software_pattern() {
        for ok in ["a", "librdkafka", "2.3.0", "apache-kafka-java", "A-b.9"] {
            assert!(software_name_or_version(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", ".a", "a b", "a_b", "é"] {
            assert!(!software_name_or_version(bad), "{bad}");
        }
    }
}
