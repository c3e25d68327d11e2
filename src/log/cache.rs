//! The per-shard tail cache: recently appended batches kept in memory.
//!
//! O_DIRECT writes leave nothing in the page cache (and the page-cache
//! writes of small appends are not to be relied on: the kernel may drop
//! them once written back), so without this every tail read (a consumer
//! keeping up with producers) would hit the device.
//! The cache holds each appended batch as the `Bytes` it arrived in (no
//! copy) and is bounded by `capacity_bytes` (`--tail-cache-bytes`) for the
//! whole shard: when full, the oldest batch of the shard, whatever its log,
//! is evicted first (global FIFO). Per log, cached batches are contiguous and
//! always end at the log end, so a read either starts inside the cache or
//! goes to the file.
//!
//! Owned by one shard and shared by all its logs through `Rc`; !Send.

use bytes::Bytes;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;

/// Default `--tail-cache-bytes`: 64 MiB per shard.
pub const TAIL_CACHE_DEFAULT_BYTES: usize = 64 << 20;

#[derive(Clone, Debug)]
pub(crate) struct CachedBatch {
    pub base_offset: i64,
    pub last_offset: i64,
    pub bytes: Bytes,
}

#[derive(Default)]
struct Inner {
    total_bytes: usize,
    /// (log id, base offset) in insertion order; entries of removed logs
    /// are skipped when they reach the front.
    fifo: VecDeque<(u64, i64)>,
    logs: HashMap<u64, VecDeque<CachedBatch>>,
}

/// Per-shard, memory-bounded cache of recently appended batches.
pub struct TailCache {
    capacity_bytes: usize,
    next_log_id: Cell<u64>,
    inner: RefCell<Inner>,
}

impl TailCache {
    pub fn new(capacity_bytes: usize) -> Rc<TailCache> {
        Rc::new(TailCache {
            capacity_bytes,
            next_log_id: Cell::new(1),
            inner: RefCell::new(Inner::default()),
        })
    }

    pub fn capacity_bytes(&self) -> usize {
        self.capacity_bytes
    }

    pub fn used_bytes(&self) -> usize {
        self.inner.borrow().total_bytes
    }

    pub(crate) fn register(&self) -> u64 {
        let id = self.next_log_id.get();
        self.next_log_id.set(id + 1);
        id
    }

    pub(crate) fn insert(&self, log: u64, batch: CachedBatch) {
        let mut inner = self.inner.borrow_mut();
        let len = batch.bytes.len();
        if len > self.capacity_bytes {
            // A batch larger than the whole cache would only evict everything;
            // keep it out and drop this log's (now non-contiguous) entries.
            if let Some(q) = inner.logs.remove(&log) {
                let freed: usize = q.iter().map(|b| b.bytes.len()).sum();
                inner.total_bytes -= freed;
            }
            return;
        }
        inner.fifo.push_back((log, batch.base_offset));
        inner.total_bytes += len;
        inner.logs.entry(log).or_default().push_back(batch);
        while inner.total_bytes > self.capacity_bytes {
            let Some((l, base)) = inner.fifo.pop_front() else {
                break;
            };
            let Inner {
                logs, total_bytes, ..
            } = &mut *inner;
            if let Some(q) = logs.get_mut(&l) {
                if q.front().map(|b| b.base_offset) == Some(base) {
                    if let Some(b) = q.pop_front() {
                        *total_bytes -= b.bytes.len();
                    }
                }
                if q.is_empty() {
                    logs.remove(&l);
                }
            }
        }
    }

    /// Drops every cached batch of `log`.
    pub(crate) fn remove_log(&self, log: u64) {
        let mut inner = self.inner.borrow_mut();
        if let Some(q) = inner.logs.remove(&log) {
            let freed: usize = q.iter().map(|b| b.bytes.len()).sum();
            inner.total_bytes -= freed;
        }
        if inner.logs.is_empty() {
            inner.fifo.clear();
        }
    }

    /// Batches of `log` starting with the one containing (or first after)
    /// `from`, all with `last_offset < upper`, up to `max_bytes` but at least
    /// one. `None` if `from` is before the first cached batch of `log`.
    pub(crate) fn read(
        &self,
        log: u64,
        from: i64,
        max_bytes: usize,
        upper: i64,
    ) -> Option<(Vec<Bytes>, usize)> {
        let inner = self.inner.borrow();
        let q = inner.logs.get(&log)?;
        let first = q.front()?;
        if from < first.base_offset {
            return None;
        }
        let start = q.partition_point(|b| b.last_offset < from);
        let mut out = Vec::new();
        let mut bytes = 0usize;
        for b in q.iter().skip(start) {
            if b.last_offset >= upper {
                break;
            }
            if !out.is_empty() && bytes + b.bytes.len() > max_bytes {
                break;
            }
            bytes += b.bytes.len();
            out.push(b.bytes.clone());
        }
        Some((out, bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(base: i64, n: usize) -> CachedBatch {
        CachedBatch {
            base_offset: base,
            last_offset: base,
            bytes: Bytes::from(vec![0u8; n]),
        }
    }

    #[test]
    fn evicts_oldest_across_logs_within_capacity() {
        let c = TailCache::new(250);
        let (a, z) = (c.register(), c.register());
        c.insert(a, b(0, 100));
        c.insert(z, b(0, 100));
        c.insert(a, b(1, 100));
        assert_eq!(c.used_bytes(), 200);
        assert!(
            c.read(a, 0, 1000, 10).is_none(),
            "offset 0 of a was evicted"
        );
        let (chunks, n) = c.read(a, 1, 1000, 10).unwrap();
        assert_eq!((chunks.len(), n), (1, 100));
        assert!(c.read(z, 0, 1000, 10).is_some());
    }

    #[test]
    fn read_honours_upper_and_max_bytes_but_returns_one() {
        let c = TailCache::new(10_000);
        let a = c.register();
        for i in 0..5 {
            c.insert(a, b(i, 100));
        }
        let (chunks, _) = c.read(a, 1, 150, 10).unwrap();
        assert_eq!(chunks.len(), 1);
        let (chunks, _) = c.read(a, 1, 10, 10).unwrap();
        assert_eq!(chunks.len(), 1, "at least one whole batch");
        let (chunks, _) = c.read(a, 0, 10_000, 3).unwrap();
        assert_eq!(chunks.len(), 3, "offsets 0,1,2 are < 3");
        c.remove_log(a);
        assert_eq!(c.used_bytes(), 0);
    }
}
