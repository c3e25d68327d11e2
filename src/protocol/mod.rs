//! The sans-io Kafka wire protocol: framing, request/response headers, the
//! table of supported APIs, and the two hand-written hot paths (Produce
//! request decoding and Fetch response encoding).
//!
//! Nothing here performs I/O or touches shard state: every function takes
//! bytes and returns values (or bytes), so the same code runs on any shard
//! and is tested without sockets. The control plane (ApiVersions bodies,
//! Metadata, CreateTopics, ...) uses `kafka-protocol`'s generated types; only
//! Produce and Fetch are hand-written, because they must keep record bytes
//! as zero-copy slices of the received frame or of the log; so are the few
//! control-plane versions newer than the crate's schemas
//! ([`hand_versions`], [`hand_versions_more`]).
//!
//! Invariant: bytes from the network never cause a panic here. Malformed
//! input is a [`ProtocolError`]; the caller answers with an error code or
//! closes the connection.

pub mod apis;
pub mod fetch;
pub mod frame;
pub mod hand_versions;
pub mod hand_versions_more;
pub mod header;
pub mod produce;
pub mod wire;

pub use apis::{api_versions_body, supported, Features, SUPPORTED};
pub use fetch::{
    encode_fetch_response, FetchPartitionResponse, FetchResponse, FetchTopicResponse, NodeEndpoint,
};
pub use frame::{frame_len, FrameError, SOCKET_REQUEST_MAX_BYTES};
pub use header::{parse_request_header, write_response_header, RequestHeader};
pub use produce::{
    decode_produce_request, single_batch, validate_for_append, ProducePartition, ProduceRequest,
    ProduceTopic,
};

/// Why a request (header or body) could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// The buffer ended before the named field was complete.
    #[error("truncated request: {field} needs {needed} bytes, {available} left")]
    Truncated {
        field: &'static str,
        needed: usize,
        available: usize,
    },
    /// A length or count prefix is negative where that is not allowed.
    #[error("invalid length {len} for {field}")]
    InvalidLength { field: &'static str, len: i64 },
    /// A string is not valid UTF-8.
    #[error("{field} is not valid UTF-8")]
    InvalidUtf8 { field: &'static str },
    /// A varint is longer than its type allows.
    #[error("malformed varint in {field}")]
    InvalidVarint { field: &'static str },
    /// A non-nullable field was null.
    #[error("{field} must not be null")]
    UnexpectedNull { field: &'static str },
    /// The api key is not one Kafka defines. The fields that precede the
    /// client id are returned so the broker can log and close.
    #[error("unknown api key {api_key} (version {api_version}, correlation id {correlation_id})")]
    UnknownApiKey {
        api_key: i16,
        api_version: i16,
        correlation_id: i32,
    },
    /// This decoder does not handle the requested version.
    #[error("unsupported version {version} of api key {api_key}")]
    UnsupportedVersion { api_key: i16, version: i16 },
    /// Bytes were left over after a complete request body.
    #[error("{0} unexpected bytes after the request body")]
    TrailingBytes(usize),
}
