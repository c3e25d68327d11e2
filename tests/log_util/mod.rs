//! Helpers shared by the `log_*` integration tests: a hand-written v2 batch
//! builder and an executor runner.
#![allow(dead_code)]

use bytes::BytesMut;
use std::future::Future;

/// Appends a zigzag varint.
pub fn varint(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    loop {
        if z < 0x80 {
            out.push(z as u8);
            return;
        }
        out.push((z as u8 & 0x7f) | 0x80);
        z >>= 7;
    }
}

/// An uncompressed batch of `values.len()` records, key "k<i>", timestamps
/// `base_ts + i`.
pub fn batch(values: &[Vec<u8>], base_ts: i64) -> BytesMut {
    let mut recs = Vec::new();
    for (i, v) in values.iter().enumerate() {
        let mut r = Vec::new();
        r.push(0u8);
        varint(&mut r, i as i64);
        varint(&mut r, i as i64);
        let key = format!("k{i}");
        varint(&mut r, key.len() as i64);
        r.extend_from_slice(key.as_bytes());
        varint(&mut r, v.len() as i64);
        r.extend_from_slice(v);
        varint(&mut r, 0);
        varint(&mut recs, r.len() as i64);
        recs.extend_from_slice(&r);
    }
    let n = values.len() as i32;
    let mut b = Vec::new();
    b.extend_from_slice(&0i64.to_be_bytes());
    b.extend_from_slice(&0i32.to_be_bytes());
    b.extend_from_slice(&(-1i32).to_be_bytes());
    b.push(2);
    b.extend_from_slice(&0u32.to_be_bytes());
    b.extend_from_slice(&0i16.to_be_bytes());
    b.extend_from_slice(&(n - 1).to_be_bytes());
    b.extend_from_slice(&base_ts.to_be_bytes());
    b.extend_from_slice(&(base_ts + n as i64 - 1).to_be_bytes());
    b.extend_from_slice(&(-1i64).to_be_bytes());
    b.extend_from_slice(&(-1i16).to_be_bytes());
    b.extend_from_slice(&(-1i32).to_be_bytes());
    b.extend_from_slice(&n.to_be_bytes());
    b.extend_from_slice(&recs);
    let len = (b.len() - 12) as i32;
    b[8..12].copy_from_slice(&len.to_be_bytes());
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    BytesMut::from(&b[..])
}

/// A batch of `records` records with `value_bytes`-byte values.
pub fn sized_batch(records: usize, value_bytes: usize, base_ts: i64) -> BytesMut {
    let values: Vec<Vec<u8>> = (0..records)
        .map(|i| vec![(i % 251) as u8; value_bytes])
        .collect();
    batch(&values, base_ts)
}

/// Runs `f` on a fresh unpinned executor with 1 MiB io_memory, after the DMA probe.
pub fn run<F, Fut>(dir: std::path::PathBuf, f: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + 'static,
{
    // At most one executor per test binary at a time: each locks 3 MiB and
    // RLIMIT_MEMLOCK is 8 MiB.
    static ONE_EXECUTOR: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = ONE_EXECUTOR.lock().unwrap_or_else(|e| e.into_inner());
    let ex = fjord::runtime::executor_builder(0, None, fjord::runtime::IO_MEMORY_TEST_BYTES)
        .spawn(move || async move {
            fjord::runtime::probe_dma(&dir).await.unwrap();
            f().await
        })
        .unwrap();
    ex.join().unwrap();
}

/// Reads all bytes of a read result (memory or file chunks).
pub fn chunk_bytes(r: &fjord::log::ReadResult) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let mut out = Vec::new();
    for c in &r.chunks {
        match c {
            fjord::record::RecordsChunk::Memory(b) => out.extend_from_slice(b),
            fjord::record::RecordsChunk::Loaded(r) => out.extend_from_slice(r),
            fjord::record::RecordsChunk::File(fr) => {
                let path = fr
                    .file
                    .path()
                    .expect("a segment file has a path")
                    .to_path_buf();
                let mut v = vec![0u8; fr.len];
                std::fs::File::open(path)
                    .unwrap()
                    .read_exact_at(&mut v, fr.position)
                    .unwrap();
                out.extend_from_slice(&v);
            }
        }
    }
    out
}

/// (base offset, last offset) of every batch in `bytes`.
pub fn batch_offsets(bytes: &[u8]) -> Vec<(i64, i64)> {
    let mut it = fjord::record::BatchIter::new(bytes);
    let v: Vec<(i64, i64)> = it
        .by_ref()
        .map(|(_, h)| (h.base_offset, h.last_offset()))
        .collect();
    assert!(it.error().is_none(), "torn batch in read result");
    v
}
