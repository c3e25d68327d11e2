//! Self-describing message values: every value the chaos workload writes
//! names its producer, the producer's client session, its transaction and
//! its sequence number, and ends with a CRC-32C of everything before it, so
//! that a value read back identifies itself and proves its bytes intact
//! without any other state.
//!
//! Layout (all integers big-endian):
//!
//! | bytes | field |
//! |---|---|
//! | 0-3 | magic `FJC1` |
//! | 4 | kind: 0 idempotent, 1 transactional |
//! | 5-6 | producer index (unique over both kinds) |
//! | 7-10 | session: which client instance of that producer sent it (1, 2, ...) |
//! | 11-18 | transaction number of that producer (0 for idempotent values) |
//! | 19-26 | sequence number, unique per producer over all its sessions |
//! | 27-30 | total length of the value |
//! | 31..len-4 | filler: pseudo-random bytes derived from producer and sequence |
//! | len-4..len | CRC-32C of bytes 0..len-4 |
//!
//! Pure functions; no state.

/// First four bytes of every chaos value.
pub const VALUE_MAGIC: [u8; 4] = *b"FJC1";
/// Bytes before the filler.
pub const VALUE_HEADER_BYTES: usize = 31;
/// The trailing checksum.
pub const VALUE_CRC_BYTES: usize = 4;
/// The smallest encodable value: header and checksum, no filler.
pub const VALUE_MIN_BYTES: usize = VALUE_HEADER_BYTES + VALUE_CRC_BYTES;

/// One message of the workload: producer index and its sequence number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct MsgId {
    pub producer: u16,
    pub seq: u64,
}

/// Everything a value says about itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValueMeta {
    pub id: MsgId,
    pub transactional: bool,
    pub session: u32,
    /// The producer's transaction number (0 for idempotent values).
    pub txn: u64,
    /// Total length of the value in bytes.
    pub len: u32,
}

/// Why bytes read back are not an intact chaos value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("value of {0} bytes is shorter than a chaos value")]
    TooShort(usize),
    #[error("value does not start with the chaos magic")]
    BadMagic,
    #[error("unknown value kind {0}")]
    BadKind(u8),
    #[error("value says it is {declared} bytes long but is {actual}")]
    LengthMismatch { declared: u32, actual: usize },
    #[error("checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    BadChecksum { stored: u32, computed: u32 },
    #[error("message has no value")]
    Missing,
}

/// Builds the value `meta` describes (`meta.len` bytes, at least
/// [`VALUE_MIN_BYTES`]).
pub fn encode(meta: &ValueMeta) -> Vec<u8> {
    let len = meta.len as usize;
    assert!(
        len >= VALUE_MIN_BYTES,
        "a chaos value needs {VALUE_MIN_BYTES} bytes"
    );
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(&VALUE_MAGIC);
    v.push(u8::from(meta.transactional));
    v.extend_from_slice(&meta.id.producer.to_be_bytes());
    v.extend_from_slice(&meta.session.to_be_bytes());
    v.extend_from_slice(&meta.txn.to_be_bytes());
    v.extend_from_slice(&meta.id.seq.to_be_bytes());
    v.extend_from_slice(&meta.len.to_be_bytes());
    debug_assert_eq!(v.len(), VALUE_HEADER_BYTES);
    // xorshift64 seeded by the id: cheap, and different for every value, so
    // that a value misplaced by whole pages or copied from another message
    // fails its checksum rather than matching by accident.
    let mut x = (u64::from(meta.id.producer) << 48) ^ meta.id.seq ^ 0x9E37_79B9_7F4A_7C15;
    let filler = len - VALUE_MIN_BYTES;
    while v.len() < VALUE_HEADER_BYTES + filler {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let take = (VALUE_HEADER_BYTES + filler - v.len()).min(8);
        v.extend_from_slice(&x.to_le_bytes()[..take]);
    }
    let crc = crc32c::crc32c(&v);
    v.extend_from_slice(&crc.to_be_bytes());
    debug_assert_eq!(v.len(), len);
    v
}

/// Reads and verifies a value written by [`encode`].
pub fn decode(bytes: &[u8]) -> Result<ValueMeta, DecodeError> {
    if bytes.len() < VALUE_MIN_BYTES {
        return Err(DecodeError::TooShort(bytes.len()));
    }
    if bytes[..4] != VALUE_MAGIC {
        return Err(DecodeError::BadMagic);
    }
    let u16_at = |i: usize| u16::from_be_bytes([bytes[i], bytes[i + 1]]);
    let u32_at = |i: usize| u32::from_be_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
    let u64_at = |i: usize| u64::from_be_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
    let transactional = match bytes[4] {
        0 => false,
        1 => true,
        k => return Err(DecodeError::BadKind(k)),
    };
    let declared = u32_at(27);
    if declared as usize != bytes.len() {
        return Err(DecodeError::LengthMismatch {
            declared,
            actual: bytes.len(),
        });
    }
    let body = bytes.len() - VALUE_CRC_BYTES;
    let stored = u32_at(body);
    let computed = crc32c::crc32c(&bytes[..body]);
    if stored != computed {
        return Err(DecodeError::BadChecksum { stored, computed });
    }
    Ok(ValueMeta {
        id: MsgId {
            producer: u16_at(5),
            seq: u64_at(19),
        },
        transactional,
        session: u32_at(7),
        txn: u64_at(11),
        len: declared,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(len: u32) -> ValueMeta {
        ValueMeta {
            id: MsgId {
                producer: 3,
                seq: 77_001,
            },
            transactional: true,
            session: 4,
            txn: 912,
            len,
        }
    }

    #[test]
    fn round_trips_at_every_size_class() {
        for len in [VALUE_MIN_BYTES as u32, 36, 100, 4_097, 1_000_000] {
            let v = encode(&meta(len));
            assert_eq!(v.len(), len as usize);
            assert_eq!(decode(&v), Ok(meta(len)));
        }
    }

    #[test]
    fn detects_damage() {
        let mut v = encode(&meta(500));
        v[300] ^= 1;
        assert!(matches!(decode(&v), Err(DecodeError::BadChecksum { .. })));
        let v = encode(&meta(500));
        assert!(matches!(
            decode(&v[..499]),
            Err(DecodeError::LengthMismatch { .. })
        ));
        assert_eq!(decode(&v[..10]), Err(DecodeError::TooShort(10)));
        let mut v = encode(&meta(500));
        v[0] = b'X';
        assert_eq!(decode(&v), Err(DecodeError::BadMagic));
    }

    #[test]
    fn different_ids_have_different_filler() {
        let a = encode(&meta(200));
        let mut m = meta(200);
        m.id.seq += 1;
        let b = encode(&m);
        assert_ne!(a[VALUE_HEADER_BYTES..190], b[VALUE_HEADER_BYTES..190]);
    }
}
