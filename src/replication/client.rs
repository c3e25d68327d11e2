//! A broker's own Kafka client connection: what a replica fetcher uses to
//! talk to the leader's broker (`docs/replication.md` §4.1), with the same
//! wire protocol any client speaks, so a follower needs nothing from the
//! leader that Kafka's own followers would not send.
//!
//! Requests are encoded with `kafka-protocol` (header and body); responses
//! are read frame by frame into one `Bytes` and decoded from it, so a
//! Fetch response's records are slices of the frame, never copied. Bounded
//! everywhere a leader could make it grow or stall: a frame over
//! [`RESPONSE_FRAME_MAX_BYTES`] closes the connection, and every request
//! waits at most its timeout. One request is in flight at a time, which is
//! all a fetcher needs (Kafka's fetcher threads send one Fetch at a time).

use bytes::{Bytes, BytesMut};
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, RequestHeader, ResponseHeader,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use std::time::Duration;

/// Largest response frame accepted: a fetch asks for at most
/// `fetcher::FETCH_MAX_BYTES` of records, plus its framing.
pub const RESPONSE_FRAME_MAX_BYTES: usize = 128 << 20;
/// The most a frame's buffer grows by before the bytes for it arrived.
const READ_CHUNK_BYTES: usize = 1 << 20;
/// How long a connect may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a request failed. Every one of them ends the connection: the
/// caller reconnects.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
    #[error("response frame of {0} bytes is over the limit")]
    FrameTooLarge(usize),
    #[error("response does not decode: {0}")]
    Decode(String),
    #[error("response to correlation id {got}, expected {expected}")]
    Correlation { got: i32, expected: i32 },
    #[error("the leader serves {api:?} at versions {min}..={max}, fjord needs {need}")]
    Version {
        api: ApiKey,
        min: i16,
        max: i16,
        need: i16,
    },
}

/// One connection to a broker.
pub struct Connection {
    stream: TcpStream,
    client_id: StrBytes,
    next_correlation_id: i32,
    /// The broker's `ApiVersions` answer: (api key, min, max).
    versions: Vec<(i16, i16, i16)>,
}

impl Connection {
    /// Connects to `addr` and asks which versions the broker serves.
    pub async fn open(addr: &str, client_id: &str, timeout: Duration) -> Result<Self, ClientError> {
        let stream = TcpStream::connect_timeout(addr, CONNECT_TIMEOUT)
            .await
            .map_err(|e| ClientError::Io(std::io::Error::other(e.to_string())))?;
        stream
            .set_nodelay(true)
            .map_err(|e| ClientError::Io(std::io::Error::other(e.to_string())))?;
        let mut conn = Connection {
            stream,
            client_id: StrBytes::from_string(client_id.to_string()),
            next_correlation_id: 1,
            versions: Vec::new(),
        };
        let av: ApiVersionsResponse = conn
            .request(3, &ApiVersionsRequest::default(), timeout)
            .await?;
        conn.versions = av
            .api_keys
            .iter()
            .map(|k| (k.api_key, k.min_version, k.max_version))
            .collect();
        Ok(conn)
    }

    /// The newest version of `api` both sides speak, at most `ours` and at
    /// least `need`.
    pub fn version(&self, api: ApiKey, need: i16, ours: i16) -> Result<i16, ClientError> {
        let (min, max) = self
            .versions
            .iter()
            .find(|(k, _, _)| *k == api as i16)
            .map_or((-1, -1), |&(_, min, max)| (min, max));
        let v = max.min(ours);
        if v < need || v < min {
            return Err(ClientError::Version {
                api,
                min,
                max,
                need,
            });
        }
        Ok(v)
    }

    /// Sends `req` at `version` and reads its response, within `timeout`.
    pub async fn request<R: Request>(
        &mut self,
        version: i16,
        req: &R,
        timeout: Duration,
    ) -> Result<R::Response, ClientError> {
        let deadline = crate::clock::monotonic() + timeout;
        match crate::runtime::within(deadline, self.exchange(version, req)).await {
            Some(r) => r,
            None => Err(ClientError::TimedOut(timeout)),
        }
    }

    async fn exchange<R: Request>(
        &mut self,
        version: i16,
        req: &R,
    ) -> Result<R::Response, ClientError> {
        let correlation_id = self.next_correlation_id;
        self.next_correlation_id = self.next_correlation_id.wrapping_add(1);
        let frame = encode(
            R::KEY,
            version,
            correlation_id,
            &self.client_id,
            req,
            R::header_version(version),
        )?;
        self.stream.write_all(&frame).await?;
        let mut body = read_frame(&mut self.stream).await?;
        let header = ResponseHeader::decode(&mut body, R::Response::header_version(version))
            .map_err(|e| ClientError::Decode(e.to_string()))?;
        if header.correlation_id != correlation_id {
            return Err(ClientError::Correlation {
                got: header.correlation_id,
                expected: correlation_id,
            });
        }
        R::Response::decode(&mut body, version).map_err(|e| ClientError::Decode(e.to_string()))
    }
}

/// A whole request frame: length, header, body.
fn encode<R: Encodable>(
    key: i16,
    version: i16,
    correlation_id: i32,
    client_id: &StrBytes,
    req: &R,
    header_version: i16,
) -> Result<BytesMut, ClientError> {
    let header = RequestHeader::default()
        .with_request_api_key(key)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(client_id.clone()));
    let mut buf = BytesMut::with_capacity(256);
    buf.extend_from_slice(&[0; 4]);
    header
        .encode(&mut buf, header_version)
        .map_err(|e| ClientError::Decode(format!("request header: {e}")))?;
    req.encode(&mut buf, version)
        .map_err(|e| ClientError::Decode(format!("request: {e}")))?;
    let len = (buf.len() - 4) as u32;
    buf[..4].copy_from_slice(&len.to_be_bytes());
    Ok(buf)
}

/// One response frame (without its length), bounded. The buffer grows as
/// bytes arrive ([`READ_CHUNK_BYTES`] at a time), so a length that
/// promises more than is sent costs no more than what was sent.
async fn read_frame(stream: &mut TcpStream) -> Result<Bytes, ClientError> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).await?;
    let len = u32::from_be_bytes(len) as usize;
    if len > RESPONSE_FRAME_MAX_BYTES {
        return Err(ClientError::FrameTooLarge(len));
    }
    let mut buf = Vec::with_capacity(len.min(READ_CHUNK_BYTES));
    while buf.len() < len {
        let at = buf.len();
        let chunk = (len - at).min(READ_CHUNK_BYTES);
        buf.resize(at + chunk, 0);
        stream.read_exact(&mut buf[at..]).await?;
    }
    Ok(Bytes::from(buf))
}
