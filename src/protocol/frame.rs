//! Request framing: a 4-byte big-endian length, then that many bytes.
//!
//! Kafka (`NetworkReceive`) rejects a negative length and one above
//! `socket.request.max.bytes` by closing the connection; a zero length is
//! accepted at this level and fails later, when the header is parsed. This
//! module only reads the prefix; it keeps no state and does no I/O.

/// Kafka's default `socket.request.max.bytes`: 100 MiB.
pub const SOCKET_REQUEST_MAX_BYTES: usize = 100 * 1024 * 1024;

/// Bytes of the length prefix in front of every request and response.
pub const FRAME_PREFIX_BYTES: usize = 4;

/// A length prefix that closes the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("negative frame length {0}")]
    NegativeLength(i32),
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge { len: usize, max: usize },
}

/// The body length a complete prefix declares, checked against `max`,
/// whether or not the body has arrived yet (`Ok(None)`: fewer than 4 bytes).
/// Lets the reader reserve buffer space for the whole frame at once.
pub fn declared_frame_len(buf: &[u8], max: usize) -> Result<Option<usize>, FrameError> {
    let Some(prefix) = buf.get(..FRAME_PREFIX_BYTES) else {
        return Ok(None);
    };
    let len = i32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
    if len < 0 {
        return Err(FrameError::NegativeLength(len));
    }
    let len = len as usize;
    if len > max {
        return Err(FrameError::TooLarge { len, max });
    }
    Ok(Some(len))
}

/// `Ok(None)` = need more bytes; `Ok(Some(n))` = a full frame of `n` body
/// bytes follows the 4-byte length in `buf`.
pub fn frame_len(buf: &[u8], max: usize) -> Result<Option<usize>, FrameError> {
    match declared_frame_len(buf, max)? {
        Some(n) if buf.len() - FRAME_PREFIX_BYTES >= n => Ok(Some(n)),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(len: i32, body: usize) -> Vec<u8> {
        let mut v = len.to_be_bytes().to_vec();
        v.resize(4 + body, 7);
        v
    }

    #[test]
    fn needs_the_whole_prefix_and_body() {
        assert_eq!(frame_len(&[0, 0, 0], 100), Ok(None));
        assert_eq!(frame_len(&framed(10, 9), 100), Ok(None));
        assert_eq!(frame_len(&framed(10, 10), 100), Ok(Some(10)));
        assert_eq!(frame_len(&framed(10, 25), 100), Ok(Some(10)));
        assert_eq!(frame_len(&framed(0, 0), 100), Ok(Some(0)));
        assert_eq!(declared_frame_len(&framed(10, 0), 100), Ok(Some(10)));
    }

    #[test]
    fn negative_and_oversized_lengths_close_the_connection() {
        assert_eq!(
            frame_len(&framed(-1, 0), 100),
            Err(FrameError::NegativeLength(-1))
        );
        assert_eq!(
            frame_len(&framed(101, 0), 100),
            Err(FrameError::TooLarge { len: 101, max: 100 })
        );
        // The limit itself is allowed, as in Kafka (`receiveSize > maxSize`).
        assert_eq!(frame_len(&framed(100, 100), 100), Ok(Some(100)));
    }

    proptest::proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..64), max in 0usize..1000) {
            if let Ok(Some(n)) = frame_len(&bytes, max) {
                proptest::prop_assert!(n <= max && bytes.len() >= 4 + n);
            }
        }
    }
}
