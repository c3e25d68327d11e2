//! ApiVersions: what this broker implements, exactly.
//!
//! An ApiVersions request of a version the broker does not know is still
//! answered — with UNSUPPORTED_VERSION in the v0 format, listing the
//! ApiVersions range, so the client can retry with a version both support.

use super::{errors, Outcome};
use crate::protocol::apis::{api_versions_body, Features};
use crate::protocol::{supported, RequestHeader};
use crate::record::RecordsChunk;
use bytes::BytesMut;
use kafka_protocol::ResponseError;

/// The finalized features this broker advertises: `transaction.version` 2
/// (KIP-890: Produce v12 adds partitions to the transaction, EndTxn v5
/// bumps the epoch per transaction). Clients of version 1 keep working.
pub const FEATURES: Features = Features {
    transaction_version: 2,
    finalized_epoch: 1,
};

pub fn handle(header: &RequestHeader, _body: &BytesMut) -> Outcome {
    let (body, _version_used) = api_versions_body(header.api_version, FEATURES);
    // Kafka's ApiVersionsResponse.errorCounts(): its one top-level code.
    let code = if supported(header.api_key, header.api_version) {
        errors::NONE
    } else {
        ResponseError::UnsupportedVersion.code()
    };
    crate::metrics::record_errors(header.api_key, |counts| counts.count(code));
    let mut out = BytesMut::with_capacity(8 + body.len());
    out.extend_from_slice(&((4 + body.len()) as i32).to_be_bytes());
    // ApiVersions responses always use response header v0.
    out.extend_from_slice(&header.correlation_id.to_be_bytes());
    out.extend_from_slice(&body);
    Outcome::Reply(vec![RecordsChunk::Memory(out.freeze())])
}
