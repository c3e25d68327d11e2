//! Request and response headers.
//!
//! Request header v1: api key, api version, correlation id, client id
//! (nullable i16 string). v2 adds a tagged-field section (the client id
//! stays a classic string even then). Which version an api/version pair uses
//! comes from `kafka-protocol`'s generated tables, which follow Kafka's
//! schemas; for a version above the newest known one, the pair is treated
//! as flexible when the api has any flexible version, as Kafka's
//! `ApiMessageType.requestHeaderVersion` does, so the broker can still read
//! the correlation id and answer UNSUPPORTED_VERSION.
//!
//! Response header v0 is the correlation id; v1 adds empty tagged fields.
//! ApiVersions responses always use v0 so that a client that does not yet
//! know the broker's versions can read them.

use super::wire::{put_empty_tagged_fields, Reader};
use super::ProtocolError;
use bytes::{Buf, BufMut, BytesMut};
use kafka_protocol::messages::ApiKey;

/// Bytes of api key, api version and correlation id.
const HEADER_FIXED_BYTES: usize = 8;

/// A parsed request header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHeader {
    pub api_key: i16,
    pub api_version: i16,
    pub correlation_id: i32,
    pub client_id: Option<String>,
    /// Header v2 (tagged fields) and, therefore, a flexible body.
    pub flexible: bool,
}

/// Parses the request header at the front of `buf` and advances `buf` past
/// it, leaving the request body.
///
/// An api key Kafka does not define yields
/// [`ProtocolError::UnknownApiKey`] carrying the version and correlation id;
/// any version of a known api parses (the caller checks
/// [`super::apis::supported`]).
pub fn parse_request_header(buf: &mut BytesMut) -> Result<RequestHeader, ProtocolError> {
    let mut r = Reader::new(buf);
    let api_key = r.i16("request_api_key")?;
    let api_version = r.i16("request_api_version")?;
    let correlation_id = r.i32("correlation_id")?;
    debug_assert_eq!(r.position(), HEADER_FIXED_BYTES);
    let key = ApiKey::try_from(api_key).map_err(|()| ProtocolError::UnknownApiKey {
        api_key,
        api_version,
        correlation_id,
    })?;
    let header_version = key.request_header_version(api_version);
    let client_id = if header_version >= 1 {
        r.nullable_string(false, "client_id")?.map(str::to_owned)
    } else {
        None
    };
    let flexible = header_version >= 2;
    if flexible {
        r.skip_tagged_fields("request_header_tagged_fields")?;
    }
    let consumed = r.position();
    buf.advance(consumed);
    Ok(RequestHeader {
        api_key,
        api_version,
        correlation_id,
        client_id,
        flexible,
    })
}

/// Whether the response to `api_key`/`api_version` uses header v1 (tagged
/// fields). Always false for ApiVersions and for unknown keys.
pub fn response_header_flexible(api_key: i16, api_version: i16) -> bool {
    match ApiKey::try_from(api_key) {
        Ok(key) => key.response_header_version(api_version) >= 1,
        Err(()) => false,
    }
}

/// Writes the response header: the correlation id, plus an empty tagged
/// field section when the response is flexible (never for ApiVersions).
pub fn write_response_header(
    out: &mut BytesMut,
    api_key: i16,
    api_version: i16,
    correlation_id: i32,
) {
    out.put_i32(correlation_id);
    if response_header_flexible(api_key, api_version) {
        put_empty_tagged_fields(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::RequestHeader as KpHeader;
    use kafka_protocol::protocol::{Encodable, StrBytes};

    fn encoded(api_key: ApiKey, version: i16, client_id: Option<&str>) -> BytesMut {
        let h = KpHeader::default()
            .with_request_api_key(api_key as i16)
            .with_request_api_version(version)
            .with_correlation_id(77)
            .with_client_id(client_id.map(|s| StrBytes::from_string(s.to_owned())));
        let mut out = BytesMut::new();
        h.encode(&mut out, api_key.request_header_version(version))
            .unwrap();
        out.put_slice(b"BODY");
        out
    }

    #[test]
    fn parses_v1_and_v2_headers_and_leaves_the_body() {
        for (key, version, flexible) in [
            (ApiKey::Produce, 8, false),
            (ApiKey::Produce, 9, true),
            (ApiKey::Fetch, 11, false),
            (ApiKey::Fetch, 12, true),
            (ApiKey::ApiVersions, 2, false),
            (ApiKey::ApiVersions, 3, true),
            (ApiKey::Metadata, 12, true),
        ] {
            for client in [None, Some("rdkafka")] {
                let mut buf = encoded(key, version, client);
                let h = parse_request_header(&mut buf).unwrap();
                assert_eq!(h.api_key, key as i16);
                assert_eq!(h.api_version, version);
                assert_eq!(h.correlation_id, 77);
                assert_eq!(h.client_id.as_deref(), client);
                assert_eq!(h.flexible, flexible, "{key:?} v{version}");
                assert_eq!(&buf[..], b"BODY");
            }
        }
    }

    #[test]
    fn future_version_of_a_known_api_still_parses() {
        // ApiVersions v127 from a client newer than us: header v2.
        let mut buf = BytesMut::new();
        buf.put_i16(18);
        buf.put_i16(127);
        buf.put_i32(5);
        buf.put_i16(1);
        buf.put_u8(b'c');
        buf.put_u8(0); // no tagged fields
        let h = parse_request_header(&mut buf).unwrap();
        assert_eq!(
            (h.api_version, h.correlation_id, h.flexible),
            (127, 5, true)
        );
        assert!(buf.is_empty());
    }

    #[test]
    fn unknown_api_key_reports_correlation_id() {
        let mut buf = BytesMut::new();
        buf.put_i16(9999);
        buf.put_i16(3);
        buf.put_i32(42);
        assert_eq!(
            parse_request_header(&mut buf),
            Err(ProtocolError::UnknownApiKey {
                api_key: 9999,
                api_version: 3,
                correlation_id: 42
            })
        );
    }

    #[test]
    fn truncated_header_is_an_error() {
        let mut buf = BytesMut::from(&[0u8, 0, 0, 3, 0][..]);
        assert!(parse_request_header(&mut buf).is_err());
        let mut buf = BytesMut::from(&[0u8, 0, 0, 3, 0, 0, 0, 1, 0, 5, b'a'][..]);
        assert!(parse_request_header(&mut buf).is_err());
    }

    #[test]
    fn response_headers() {
        let mut out = BytesMut::new();
        write_response_header(&mut out, ApiKey::ApiVersions as i16, 4, 9);
        assert_eq!(&out[..], &[0, 0, 0, 9]);
        let mut out = BytesMut::new();
        write_response_header(&mut out, ApiKey::Fetch as i16, 12, 9);
        assert_eq!(&out[..], &[0, 0, 0, 9, 0]);
        let mut out = BytesMut::new();
        write_response_header(&mut out, ApiKey::Produce as i16, 8, 9);
        assert_eq!(&out[..], &[0, 0, 0, 9]);
    }

    proptest::proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
            let mut buf = BytesMut::from(&bytes[..]);
            let before = buf.len();
            if parse_request_header(&mut buf).is_ok() {
                proptest::prop_assert!(buf.len() <= before - 8);
            }
        }
    }
}
