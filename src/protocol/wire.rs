//! Primitive Kafka wire types: big-endian integers, (compact) strings and
//! bytes, unsigned varints and tagged-field sections.
//!
//! [`Reader`] is a bounds-checked cursor over a byte slice: every read
//! returns `Result`, so a short or hostile buffer yields a
//! [`ProtocolError`], never a panic. Writers append to a `BytesMut` and
//! cannot fail. No state outlives a call; any shard may use these.

use super::ProtocolError;
use bytes::{BufMut, BytesMut};

/// The most bytes an unsigned varint encoding an `u32` may take.
const UVARINT32_MAX_BYTES: usize = 5;

/// A bounds-checked read cursor over a request body.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// Bytes consumed so far.
    pub fn position(&self) -> usize {
        self.pos
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Takes the next `n` bytes.
    pub fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], ProtocolError> {
        if self.remaining() < n {
            return Err(ProtocolError::Truncated {
                field,
                needed: n,
                available: self.remaining(),
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], ProtocolError> {
        let s = self.take(N, field)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub fn i8(&mut self, field: &'static str) -> Result<i8, ProtocolError> {
        Ok(i8::from_be_bytes(self.array(field)?))
    }

    pub fn i16(&mut self, field: &'static str) -> Result<i16, ProtocolError> {
        Ok(i16::from_be_bytes(self.array(field)?))
    }

    pub fn i32(&mut self, field: &'static str) -> Result<i32, ProtocolError> {
        Ok(i32::from_be_bytes(self.array(field)?))
    }

    pub fn i64(&mut self, field: &'static str) -> Result<i64, ProtocolError> {
        Ok(i64::from_be_bytes(self.array(field)?))
    }

    /// An unsigned LEB128 varint of at most 32 bits (Kafka's `UNSIGNED_VARINT`).
    pub fn uvarint(&mut self, field: &'static str) -> Result<u32, ProtocolError> {
        let mut value: u32 = 0;
        for i in 0..UVARINT32_MAX_BYTES {
            let b = self.take(1, field)?[0];
            let bits = (b & 0x7f) as u32;
            if i == UVARINT32_MAX_BYTES - 1 && bits > 0x0f {
                return Err(ProtocolError::InvalidVarint { field });
            }
            value |= bits << (7 * i);
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(ProtocolError::InvalidVarint { field })
    }

    /// A length prefix: i16 for classic strings, or a compact `len + 1`
    /// uvarint. `None` means null.
    fn length(
        &mut self,
        compact: bool,
        wide: bool,
        field: &'static str,
    ) -> Result<Option<usize>, ProtocolError> {
        let len: i64 = if compact {
            self.uvarint(field)? as i64 - 1
        } else if wide {
            self.i32(field)? as i64
        } else {
            self.i16(field)? as i64
        };
        if len == -1 {
            return Ok(None);
        }
        if len < -1 {
            return Err(ProtocolError::InvalidLength { field, len });
        }
        Ok(Some(len as usize))
    }

    /// A nullable string, classic (i16 length) or compact.
    pub fn nullable_string(
        &mut self,
        compact: bool,
        field: &'static str,
    ) -> Result<Option<&'a str>, ProtocolError> {
        match self.length(compact, false, field)? {
            None => Ok(None),
            Some(n) => {
                let s = self.take(n, field)?;
                std::str::from_utf8(s)
                    .map(Some)
                    .map_err(|_| ProtocolError::InvalidUtf8 { field })
            }
        }
    }

    /// A non-nullable string, classic or compact.
    pub fn string(&mut self, compact: bool, field: &'static str) -> Result<&'a str, ProtocolError> {
        self.nullable_string(compact, field)?
            .ok_or(ProtocolError::UnexpectedNull { field })
    }

    /// A nullable byte field (`BYTES`/`RECORDS`): i32 length or compact.
    /// Returns the byte range within the underlying buffer, not a copy.
    pub fn nullable_bytes_range(
        &mut self,
        compact: bool,
        field: &'static str,
    ) -> Result<Option<std::ops::Range<usize>>, ProtocolError> {
        match self.length(compact, true, field)? {
            None => Ok(None),
            Some(n) => {
                let start = self.pos;
                self.take(n, field)?;
                Ok(Some(start..start + n))
            }
        }
    }

    /// An array length (i32 or compact). `None` means a null array.
    /// `min_element_bytes` bounds the count by what the buffer can hold, so a
    /// hostile count cannot make the caller allocate more than the frame.
    pub fn array_len(
        &mut self,
        compact: bool,
        min_element_bytes: usize,
        field: &'static str,
    ) -> Result<Option<usize>, ProtocolError> {
        match self.length(compact, true, field)? {
            None => Ok(None),
            Some(n) => {
                if n.saturating_mul(min_element_bytes.max(1)) > self.remaining() {
                    return Err(ProtocolError::Truncated {
                        field,
                        needed: n.saturating_mul(min_element_bytes.max(1)),
                        available: self.remaining(),
                    });
                }
                Ok(Some(n))
            }
        }
    }

    /// Skips a tagged-field section (count, then tag/size/bytes each).
    pub fn skip_tagged_fields(&mut self, field: &'static str) -> Result<(), ProtocolError> {
        let count = self.uvarint(field)?;
        for _ in 0..count {
            let _tag = self.uvarint(field)?;
            let size = self.uvarint(field)? as usize;
            self.take(size, field)?;
        }
        Ok(())
    }
}

/// Appends an unsigned varint.
pub fn put_uvarint(out: &mut BytesMut, mut v: u32) {
    while v >= 0x80 {
        out.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    out.put_u8(v as u8);
}

/// Bytes an unsigned varint takes.
pub fn uvarint_len(mut v: u32) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

/// Appends a string, classic (i16 length) or compact.
pub fn put_string(out: &mut BytesMut, s: &str, compact: bool) {
    put_nullable_string(out, Some(s), compact);
}

/// Appends a nullable string, classic (i16 length, -1 = null) or compact
/// (`len + 1` uvarint, 0 = null).
pub fn put_nullable_string(out: &mut BytesMut, s: Option<&str>, compact: bool) {
    match (s, compact) {
        (None, true) => put_uvarint(out, 0),
        (None, false) => out.put_i16(-1),
        (Some(s), true) => {
            put_uvarint(out, s.len() as u32 + 1);
            out.put_slice(s.as_bytes());
        }
        (Some(s), false) => {
            // Kafka strings are at most i16::MAX bytes; longer ones are a
            // programmer error (names are validated long before encoding).
            assert!(s.len() <= i16::MAX as usize, "string too long for the wire");
            out.put_i16(s.len() as i16);
            out.put_slice(s.as_bytes());
        }
    }
}

/// Appends an array length, classic (i32) or compact (`len + 1`).
pub fn put_array_len(out: &mut BytesMut, len: usize, compact: bool) {
    if compact {
        put_uvarint(out, len as u32 + 1);
    } else {
        out.put_i32(len as i32);
    }
}

/// Appends a null array (i32 -1 or compact 0).
pub fn put_null_array(out: &mut BytesMut, compact: bool) {
    if compact {
        put_uvarint(out, 0);
    } else {
        out.put_i32(-1);
    }
}

/// Appends an empty tagged-field section.
pub fn put_empty_tagged_fields(out: &mut BytesMut) {
    put_uvarint(out, 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uvarint_round_trips_edges() {
        for v in [0u32, 1, 127, 128, 300, 16_383, 16_384, u32::MAX] {
            let mut out = BytesMut::new();
            put_uvarint(&mut out, v);
            assert_eq!(out.len(), uvarint_len(v));
            let mut r = Reader::new(&out);
            assert_eq!(r.uvarint("v").unwrap(), v);
            assert_eq!(r.remaining(), 0);
        }
    }

    #[test]
    fn overlong_uvarint_is_an_error() {
        let bytes = [0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert!(matches!(
            Reader::new(&bytes).uvarint("v"),
            Err(ProtocolError::InvalidVarint { .. })
        ));
        // Fifth byte carrying more than 4 bits overflows u32.
        let bytes = [0xff, 0xff, 0xff, 0xff, 0x1f];
        assert!(Reader::new(&bytes).uvarint("v").is_err());
    }

    #[test]
    fn strings_classic_and_compact() {
        for compact in [false, true] {
            let mut out = BytesMut::new();
            put_nullable_string(&mut out, None, compact);
            put_string(&mut out, "héllo", compact);
            let mut r = Reader::new(&out);
            assert_eq!(r.nullable_string(compact, "a").unwrap(), None);
            assert_eq!(r.string(compact, "b").unwrap(), "héllo");
            assert_eq!(r.remaining(), 0);
        }
    }

    #[test]
    fn hostile_array_count_is_rejected_before_allocating() {
        let bytes = 1_000_000i32.to_be_bytes();
        assert!(Reader::new(&bytes).array_len(false, 4, "a").is_err());
        let bytes = (-2i32).to_be_bytes();
        assert!(matches!(
            Reader::new(&bytes).array_len(false, 4, "a"),
            Err(ProtocolError::InvalidLength { .. })
        ));
    }
}
