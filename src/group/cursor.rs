//! A bounds-checked big-endian cursor over the bytes of a group record or
//! an embedded consumer-protocol message, shared by the three decoders in
//! this module (`records`, `consumer_records`, `consumer_protocol`). They
//! read the same primitives (Kafka's classic and flexible encodings) and
//! differ only in their error type, so the cursor is generic over it: any
//! error built from a `&'static str` naming what was wrong.
//!
//! Every read checks the bytes left first, so truncated or hostile input is
//! an error, never a panic; lengths are never trusted beyond the bytes that
//! remain.

use std::marker::PhantomData;

/// The cursor; `E` is the caller's error type.
pub(crate) struct Cursor<'a, E> {
    buf: &'a [u8],
    error: PhantomData<E>,
}

impl<'a, E: From<&'static str>> Cursor<'a, E> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self {
            buf,
            error: PhantomData,
        }
    }

    /// Bytes not read yet.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len()
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], E> {
        if self.buf.len() < n {
            return Err(E::from("truncated"));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], E> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    pub(crate) fn i8(&mut self) -> Result<i8, E> {
        Ok(i8::from_be_bytes(self.array()?))
    }

    pub(crate) fn i16(&mut self) -> Result<i16, E> {
        Ok(i16::from_be_bytes(self.array()?))
    }

    pub(crate) fn i32(&mut self) -> Result<i32, E> {
        Ok(i32::from_be_bytes(self.array()?))
    }

    pub(crate) fn i64(&mut self) -> Result<i64, E> {
        Ok(i64::from_be_bytes(self.array()?))
    }

    /// An unsigned varint (flexible versions' lengths and tags).
    pub(crate) fn uvarint(&mut self) -> Result<u64, E> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.take(1)?[0];
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(E::from("varint too long"))
    }

    fn utf8(&mut self, len: usize) -> Result<String, E> {
        String::from_utf8(self.take(len)?.to_vec()).map_err(|_| E::from("string is not UTF-8"))
    }

    /// An i16-length string; a negative length is null.
    pub(crate) fn nullable_string(&mut self) -> Result<Option<String>, E> {
        match usize::try_from(self.i16()?) {
            Ok(len) => self.utf8(len).map(Some),
            Err(_) => Ok(None),
        }
    }

    /// An i16-length string that must not be null.
    pub(crate) fn string(&mut self) -> Result<String, E> {
        self.nullable_string()?
            .ok_or(E::from("null where a string is required"))
    }

    /// A compact (varint length + 1) string; 0 is null.
    pub(crate) fn compact_nullable_string(&mut self) -> Result<Option<String>, E> {
        match self.uvarint()? {
            0 => Ok(None),
            n => {
                let len = usize::try_from(n - 1).map_err(|_| E::from("length"))?;
                self.utf8(len).map(Some)
            }
        }
    }

    /// A compact string that must not be null.
    pub(crate) fn compact_string(&mut self) -> Result<String, E> {
        self.compact_nullable_string()?
            .ok_or(E::from("null where a string is required"))
    }

    /// An i32 array length (0 for a null array), bounded by the bytes left:
    /// every element takes at least `min_element_bytes`.
    pub(crate) fn array_len(&mut self, min_element_bytes: usize) -> Result<usize, E> {
        let Ok(n) = usize::try_from(self.i32()?) else {
            return Ok(0);
        };
        if n.saturating_mul(min_element_bytes) > self.remaining() {
            return Err(E::from("array longer than its bytes"));
        }
        Ok(n)
    }

    /// A compact array's length (None for a null array), at most `max` and
    /// never more than the bytes left.
    pub(crate) fn compact_array_len(&mut self, max: usize) -> Result<Option<usize>, E> {
        match self.uvarint()? {
            0 => Ok(None),
            n => {
                let len = usize::try_from(n - 1).map_err(|_| E::from("length"))?;
                if len > max || len > self.remaining() {
                    return Err(E::from("array longer than its bytes"));
                }
                Ok(Some(len))
            }
        }
    }

    /// A tagged-field section: calls `f(tag, bytes)` for each field.
    pub(crate) fn tags(&mut self, mut f: impl FnMut(u64, &[u8])) -> Result<(), E> {
        let n = self.uvarint()?;
        for _ in 0..n {
            let tag = self.uvarint()?;
            let size = usize::try_from(self.uvarint()?).map_err(|_| E::from("size"))?;
            f(tag, self.take(size)?);
        }
        Ok(())
    }

    pub(crate) fn skip_tags(&mut self) -> Result<(), E> {
        self.tags(|_, _| {})
    }

    /// i32-length bytes, or None for a negative (null) length.
    pub(crate) fn nullable_bytes(&mut self) -> Result<Option<&'a [u8]>, E> {
        match usize::try_from(self.i32()?) {
            Ok(len) => self.take(len).map(Some),
            Err(_) => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct Bad(&'static str);
    impl From<&'static str> for Bad {
        fn from(s: &'static str) -> Self {
            Bad(s)
        }
    }

    #[test]
    fn every_read_past_the_end_is_an_error_and_values_are_big_endian() {
        let bytes = [0x01, 0x02, 0x00, 0x03, b'a', b'b', b'c', 0xff, 0xff];
        let mut c = Cursor::<Bad>::new(&bytes);
        assert_eq!(c.i16(), Ok(0x0102));
        assert_eq!(c.string().as_deref(), Ok("abc"));
        assert_eq!(c.nullable_string(), Ok(None));
        assert_eq!(c.remaining(), 0);
        assert_eq!(c.i8(), Err(Bad("truncated")));
        let mut c = Cursor::<Bad>::new(&[0x00, 0x05, b'a']);
        assert_eq!(c.string(), Err(Bad("truncated")));
        let mut c = Cursor::<Bad>::new(&[0xff; 11]);
        assert_eq!(c.uvarint(), Err(Bad("varint too long")));
    }
}
