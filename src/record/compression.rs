//! The four codecs of record batches, in the byte formats Kafka uses.
//!
//! Only a batch's records section (after the 61-byte header) is compressed.
//! - gzip: a gzip stream (`GZIPOutputStream`); concatenated members are read.
//! - snappy: written with the xerial framing the Java client uses
//!   (`SnappyOutputStream`: 16-byte header `\x82SNAPPY\0`, version 1,
//!   compatible version 1, then blocks of 32 KiB input as
//!   `i32 length + raw snappy block`). Read: xerial-framed, or one raw
//!   snappy block, since librdkafka writes raw snappy and Kafka's reader
//!   (xerial's `SnappyInputStream`) accepts both.
//! - lz4: the LZ4 frame format with 64 KiB independent blocks and no
//!   checksums, as `Lz4BlockOutputStream` writes.
//! - zstd: a zstd frame.
//!
//! Decompression is bounded by a caller-given limit so that a small
//! hostile batch cannot expand without bound. Pure functions, no state.

use super::{Compression, RecordsError};
use std::io::{Read, Write};

/// xerial snappy stream header: magic, version 1, compatible version 1.
const XERIAL_HEADER: [u8; 16] = [
    0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0, 0, 0, 0, 1, 0, 0, 0, 1,
];
/// The magic part of [`XERIAL_HEADER`] that identifies the framing.
const XERIAL_MAGIC_BYTES: usize = 8;
/// Uncompressed bytes per xerial block (xerial's default block size).
const XERIAL_BLOCK_BYTES: usize = 32 * 1024;
/// zstd level Kafka uses by default (`compression.zstd.level` = 3).
pub const ZSTD_LEVEL_DEFAULT: i32 = 3;
/// gzip level Kafka uses by default (`compression.gzip.level` = -1, zlib's 6).
const GZIP_LEVEL_DEFAULT: u32 = 6;
/// Default bound on decompressed records: the largest a fetch or produce
/// could legitimately hold (`socket.request.max.bytes`, 100 MiB).
pub const DECOMPRESSED_RECORDS_MAX_BYTES: usize = 100 * 1024 * 1024;

fn fail(codec: Compression, e: impl std::fmt::Display) -> RecordsError {
    RecordsError::Decompress {
        codec: codec.name(),
        reason: e.to_string(),
    }
}

/// Compresses `raw` with `codec`, appending to `out`. `None` copies.
pub fn compress(codec: Compression, raw: &[u8], out: &mut Vec<u8>) {
    // Writing into a Vec cannot fail; the codecs' own errors can only come
    // from the sink, so an error here is a programmer error.
    match codec {
        Compression::None => out.extend_from_slice(raw),
        Compression::Gzip => {
            let mut enc = flate2::write::GzEncoder::new(
                std::mem::take(out),
                flate2::Compression::new(GZIP_LEVEL_DEFAULT),
            );
            enc.write_all(raw).expect("gzip into memory");
            *out = enc.finish().expect("gzip into memory");
        }
        Compression::Snappy => {
            out.extend_from_slice(&XERIAL_HEADER);
            let mut enc = snap::raw::Encoder::new();
            for block in raw.chunks(XERIAL_BLOCK_BYTES) {
                let compressed = enc.compress_vec(block).expect("snappy block within limits");
                out.extend_from_slice(&(compressed.len() as i32).to_be_bytes());
                out.extend_from_slice(&compressed);
            }
        }
        Compression::Lz4 => {
            let mut enc = lz4_flex::frame::FrameEncoder::with_frame_info(
                lz4_flex::frame::FrameInfo::new()
                    .block_size(lz4_flex::frame::BlockSize::Max64KB)
                    .block_mode(lz4_flex::frame::BlockMode::Independent),
                std::mem::take(out),
            );
            enc.write_all(raw).expect("lz4 into memory");
            *out = enc.finish().expect("lz4 into memory");
        }
        Compression::Zstd => {
            let mut enc =
                zstd::stream::write::Encoder::new(std::mem::take(out), ZSTD_LEVEL_DEFAULT)
                    .expect("zstd encoder with a valid level");
            enc.write_all(raw).expect("zstd into memory");
            *out = enc.finish().expect("zstd into memory");
        }
    }
}

/// Decompresses `data` written with `codec`, failing if the result would
/// exceed `limit_bytes`.
pub fn decompress(
    codec: Compression,
    data: &[u8],
    limit_bytes: usize,
) -> Result<Vec<u8>, RecordsError> {
    match codec {
        Compression::None => {
            if data.len() > limit_bytes {
                return Err(RecordsError::DecompressedTooLarge { limit_bytes });
            }
            Ok(data.to_vec())
        }
        Compression::Gzip => {
            read_bounded(codec, flate2::read::MultiGzDecoder::new(data), limit_bytes)
        }
        Compression::Snappy => snappy_decompress(data, limit_bytes),
        Compression::Lz4 => {
            read_bounded(codec, lz4_flex::frame::FrameDecoder::new(data), limit_bytes)
        }
        Compression::Zstd => {
            let dec = zstd::stream::read::Decoder::new(data).map_err(|e| fail(codec, e))?;
            read_bounded(codec, dec, limit_bytes)
        }
    }
}

fn read_bounded(
    codec: Compression,
    reader: impl Read,
    limit_bytes: usize,
) -> Result<Vec<u8>, RecordsError> {
    let mut out = Vec::new();
    reader
        .take((limit_bytes as u64).saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|e| fail(codec, e))?;
    if out.len() > limit_bytes {
        return Err(RecordsError::DecompressedTooLarge { limit_bytes });
    }
    Ok(out)
}

fn snappy_decompress(data: &[u8], limit_bytes: usize) -> Result<Vec<u8>, RecordsError> {
    let codec = Compression::Snappy;
    let mut dec = snap::raw::Decoder::new();
    let mut raw_block = |block: &[u8], out: &mut Vec<u8>| -> Result<(), RecordsError> {
        let len = snap::raw::decompress_len(block).map_err(|e| fail(codec, e))?;
        if len > limit_bytes - out.len() {
            return Err(RecordsError::DecompressedTooLarge { limit_bytes });
        }
        let at = out.len();
        out.resize(at + len, 0);
        let n = dec
            .decompress(block, &mut out[at..])
            .map_err(|e| fail(codec, e))?;
        out.truncate(at + n);
        Ok(())
    };
    let mut out = Vec::new();
    if !data.starts_with(&XERIAL_HEADER[..XERIAL_MAGIC_BYTES]) {
        raw_block(data, &mut out)?;
        return Ok(out);
    }
    let mut rest = data;
    while !rest.is_empty() {
        // A concatenated stream repeats the header; xerial skips it.
        if rest.starts_with(&XERIAL_HEADER[..XERIAL_MAGIC_BYTES]) {
            if rest.len() < XERIAL_HEADER.len() {
                return Err(fail(codec, "truncated xerial header"));
            }
            rest = &rest[XERIAL_HEADER.len()..];
            continue;
        }
        if rest.len() < 4 {
            return Err(fail(codec, "truncated xerial block length"));
        }
        let len = i32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]);
        let Ok(len) = usize::try_from(len) else {
            return Err(fail(codec, "negative xerial block length"));
        };
        let Some(block) = rest.get(4..4 + len) else {
            return Err(fail(codec, "truncated xerial block"));
        };
        raw_block(block, &mut out)?;
        rest = &rest[4 + len..];
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Compression; 5] = [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ];

    fn sample(len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i % 251) as u8 ^ (i / 1000) as u8)
            .collect()
    }

    #[test]
    fn every_codec_round_trips() {
        for codec in ALL {
            for len in [
                0usize,
                1,
                100,
                XERIAL_BLOCK_BYTES,
                3 * XERIAL_BLOCK_BYTES + 17,
                200_000,
            ] {
                let raw = sample(len);
                let mut c = Vec::new();
                compress(codec, &raw, &mut c);
                let back = decompress(codec, &c, DECOMPRESSED_RECORDS_MAX_BYTES).unwrap();
                assert_eq!(back, raw, "{codec:?} {len}");
            }
        }
    }

    #[test]
    fn snappy_writes_xerial_and_reads_raw_too() {
        let raw = sample(70_000);
        let mut c = Vec::new();
        compress(Compression::Snappy, &raw, &mut c);
        assert_eq!(&c[..16], &XERIAL_HEADER);
        // Three blocks of at most 32 KiB input.
        let first = i32::from_be_bytes([c[16], c[17], c[18], c[19]]) as usize;
        assert!(first < c.len());
        // librdkafka-style raw snappy.
        let plain = snap::raw::Encoder::new().compress_vec(&raw).unwrap();
        assert_eq!(
            decompress(Compression::Snappy, &plain, usize::MAX).unwrap(),
            raw
        );
    }

    #[test]
    fn interoperates_with_kafka_protocol_codecs() {
        use bytes::{Bytes, BytesMut};
        use kafka_protocol::compression::{Compressor, Decompressor, Gzip, Lz4, Snappy, Zstd};
        let raw = sample(50_000);
        let mut theirs = BytesMut::new();
        Lz4::compress(&mut theirs, |b: &mut BytesMut| {
            b.extend_from_slice(&raw);
            Ok::<_, anyhow::Error>(())
        })
        .unwrap();
        assert_eq!(
            decompress(Compression::Lz4, &theirs, usize::MAX).unwrap(),
            raw
        );
        for codec in [
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let mut ours = Vec::new();
            compress(codec, &raw, &mut ours);
            let mut input = Bytes::from(ours);
            let check = |b: &mut Bytes| {
                assert_eq!(&b[..], &raw[..]);
                Ok::<_, anyhow::Error>(())
            };
            match codec {
                Compression::Gzip => Gzip::decompress(&mut input, check).unwrap(),
                Compression::Snappy => Snappy::decompress(&mut input, check).unwrap(),
                Compression::Lz4 => Lz4::decompress(&mut input, check).unwrap(),
                Compression::Zstd => Zstd::decompress(&mut input, check).unwrap(),
                Compression::None => unreachable!(),
            }
        }
    }

    #[test]
    fn decompression_is_bounded() {
        let raw = vec![0u8; 1 << 20];
        for codec in ALL {
            let mut c = Vec::new();
            compress(codec, &raw, &mut c);
            assert_eq!(
                decompress(codec, &c, 1000),
                Err(RecordsError::DecompressedTooLarge { limit_bytes: 1000 }),
                "{codec:?}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..256), codec in 0i16..5) {
            let codec = Compression::from_id(codec).unwrap();
            let _ = decompress(codec, &bytes, 1 << 16);
            let mut framed = XERIAL_HEADER.to_vec();
            framed.extend_from_slice(&bytes);
            let _ = decompress(Compression::Snappy, &framed, 1 << 16);
        }
    }
}
