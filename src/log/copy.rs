//! The staging copy of large batches, with stores that bypass the cache.
//!
//! A large batch is copied once, from the request frame into the staging
//! chunks that go to the device (`appender`'s module doc). The chunks it
//! fills whole are written directly and never read by the CPU again
//! (fetches read the tail cache, which holds the frame), so there is no
//! point in pulling their lines into the cache: a plain `memcpy` first reads
//! every destination line (read for ownership), then writes it, and evicts
//! lines the shard still uses. Non-temporal stores write whole lines to
//! memory without reading them. The batch's first and last pieces, which
//! land in the open chunk that tail writes read, are copied normally.
//!
//! Only for large batches (`STREAM_COPY_MIN_BYTES`): a small batch's source
//! is still in the cache from the socket receive, and its chunk is the open
//! chunk that tail writes copy from, so a plain copy is faster there. On a
//! throwaway micro-benchmark of the 2-core VM (1 MiB copies, 16 rotating
//! buffer pairs) `memcpy` took 0.17–0.19 s/GiB and streaming stores
//! 0.10 s/GiB; with 128 KiB copies (working set in the cache) `memcpy` took
//! 0.035 s/GiB against 0.055–0.058. In the broker (`saturate-1kb`, 1 MiB
//! batches) the staging copy fell from 19 % to 10 % of the shard's samples
//! and broker CPU per GB was lower in 10 of 10 alternating pairs (median
//! ratio 0.955; tuning/results/cpu-per-gb.md).

/// Batches at least this large are staged with non-temporal stores.
pub const STREAM_COPY_MIN_BYTES: usize = 256 << 10;

/// Copies `src` into `dst` (equal lengths); with `stream`, the bulk of it
/// with non-temporal stores where the target has them.
pub fn copy(dst: &mut [u8], src: &[u8], stream: bool) {
    #[cfg(target_arch = "x86_64")]
    if stream && dst.len() == src.len() {
        stream_copy(dst, src);
        return;
    }
    let _ = stream;
    dst.copy_from_slice(src);
}

/// Lines of 64 bytes go out with `movntdq` (SSE2, part of every x86_64);
/// the unaligned head and the tail are copied normally.
#[cfg(target_arch = "x86_64")]
fn stream_copy(dst: &mut [u8], src: &[u8]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    const LINE: usize = 64;
    let head = dst.as_ptr().align_offset(LINE).min(dst.len());
    dst[..head].copy_from_slice(&src[..head]);
    let lines = (dst.len() - head) / LINE;
    let body = lines * LINE;
    {
        let d = &mut dst[head..head + body];
        let s = &src[head..head + body];
        for (dl, sl) in d.chunks_exact_mut(LINE).zip(s.chunks_exact(LINE)) {
            // SAFETY: `dl` and `sl` are 64 bytes each (chunks_exact), so the
            // four 16-byte loads and stores stay inside them; `dl` starts at
            // a 64-byte boundary (`head` aligned it, lines are 64 bytes), as
            // `_mm_stream_si128` requires 16-byte alignment; loads are
            // unaligned (`loadu`). SSE2 is part of the x86_64 baseline.
            unsafe {
                let sp = sl.as_ptr() as *const __m128i;
                let dp = dl.as_mut_ptr() as *mut __m128i;
                let a = _mm_loadu_si128(sp);
                let b = _mm_loadu_si128(sp.add(1));
                let c = _mm_loadu_si128(sp.add(2));
                let e = _mm_loadu_si128(sp.add(3));
                _mm_stream_si128(dp, a);
                _mm_stream_si128(dp.add(1), b);
                _mm_stream_si128(dp.add(2), c);
                _mm_stream_si128(dp.add(3), e);
            }
        }
    }
    // Non-temporal stores are weakly ordered: fence them before anything
    // that hands the buffer on (the write's submission).
    // SAFETY: `sfence` has no preconditions; SSE is part of x86_64.
    unsafe { _mm_sfence() };
    dst[head + body..].copy_from_slice(&src[head + body..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_offset_and_length_copies_exactly() {
        let src: Vec<u8> = (0..5000u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut buf = vec![0u8; 5200];
        for dst_off in [0usize, 1, 15, 16, 63, 64, 65, 100] {
            for src_off in [0usize, 1, 7, 64] {
                for len in [0usize, 1, 63, 64, 65, 127, 128, 1000, 4096] {
                    for stream in [false, true] {
                        buf.fill(0xAA);
                        let s = &src[src_off..src_off + len];
                        copy(&mut buf[dst_off..dst_off + len], s, stream);
                        assert_eq!(&buf[dst_off..dst_off + len], s);
                        assert!(buf[..dst_off].iter().all(|&b| b == 0xAA));
                        assert!(buf[dst_off + len..].iter().all(|&b| b == 0xAA));
                    }
                }
            }
        }
    }
}
