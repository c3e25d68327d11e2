//! The per-shard tail cache: recently appended batches kept in memory.
//!
//! O_DIRECT writes leave nothing in the page cache (and the page-cache
//! writes of small appends are not to be relied on: the kernel may drop
//! them once written back), so without this every tail read (a consumer
//! keeping up with producers) would hit the device.
//! The cache is bounded by `capacity_bytes` (`--tail-cache-bytes`) for the
//! whole shard: when full, the oldest batch of the shard, whatever its log,
//! is evicted first (global FIFO). Per log, cached batches are contiguous and
//! always end at the log end, so a read either starts inside the cache or
//! goes to the file.
//!
//! Memory: what a batch costs is the allocation it keeps alive, not its
//! length. A produce batch arrives as a slice of the connection's receive
//! buffer (zero-copy, see `net`), and a `Bytes` slice keeps the whole
//! allocation alive: a 100-byte batch cut from a 100 MiB frame (whose other
//! partitions were refused, say) would pin 100 MiB while counting 100
//! bytes. So `TailCache::insert` is told the size of the allocation the
//! batch is a slice of, and
//! - keeps the batch zero-copy only if it fills at least
//!   1/[`SHARED_ALLOCATION_RATIO_MAX`] of that allocation; a smaller batch
//!   is copied into an allocation of its own (one copy of a small part of a
//!   frame; the frame is then freed once its request is answered);
//! - charges each batch for the allocation it keeps alive (the whole shared
//!   allocation, or its own copy), and evicts by that charge.
//!
//! The memory the cache keeps alive is therefore at most `capacity_bytes`
//! ([`TailCache::pinned_bytes`]; two batches of one frame are each charged
//! the whole frame, an overestimate), and at least half of what it is
//! charged is cached batch data. The cost: a batch shares its frame only
//! when it is most of it, so of a Produce frame for many partitions, each
//! a small part of the frame, every batch is copied once more (small next
//! to the copy into the staging chunks that every append makes).
//!
//! Owned by one shard and shared by all its logs through `Rc`; !Send.

use bytes::Bytes;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;

/// Default `--tail-cache-bytes`: 64 MiB per shard.
pub const TAIL_CACHE_DEFAULT_BYTES: usize = 64 << 20;

/// A cached batch may keep alive an allocation at most this many times its
/// own length; a batch that is a smaller part of its allocation is copied.
pub const SHARED_ALLOCATION_RATIO_MAX: usize = 2;

#[derive(Clone, Debug)]
pub(crate) struct CachedBatch {
    pub base_offset: i64,
    pub last_offset: i64,
    pub bytes: Bytes,
    /// The memory `bytes` keeps alive (what the cache is charged for it).
    pub pinned: usize,
}

impl CachedBatch {
    /// `batch`, a slice of an allocation of `allocation_bytes` (a request
    /// frame's receive buffer, or its own), as the cache keeps it: shared
    /// if it fills at least 1/[`SHARED_ALLOCATION_RATIO_MAX`] of the
    /// allocation, else copied into an allocation of its own.
    pub fn new(
        base_offset: i64,
        last_offset: i64,
        batch: Bytes,
        allocation_bytes: usize,
    ) -> CachedBatch {
        let len = batch.len();
        let (bytes, pinned) = if len.saturating_mul(SHARED_ALLOCATION_RATIO_MAX) >= allocation_bytes
        {
            (batch, allocation_bytes.max(len))
        } else {
            (Bytes::copy_from_slice(&batch), len)
        };
        CachedBatch {
            base_offset,
            last_offset,
            bytes,
            pinned,
        }
    }
}

#[derive(Default)]
struct Inner {
    /// Sum of `pinned` over the cached batches (what `capacity_bytes` bounds).
    pinned_bytes: usize,
    /// Sum of the cached batches' lengths.
    batch_bytes: usize,
    /// (log id, base offset) in insertion order; entries of removed logs
    /// are skipped when they reach the front.
    fifo: VecDeque<(u64, i64)>,
    logs: HashMap<u64, VecDeque<CachedBatch>>,
}

impl Inner {
    fn forget(&mut self, b: &CachedBatch) {
        self.pinned_bytes -= b.pinned;
        self.batch_bytes -= b.bytes.len();
    }

    fn remove_log(&mut self, log: u64) {
        if let Some(q) = self.logs.remove(&log) {
            for b in &q {
                self.forget(b);
            }
        }
    }
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

    /// Bytes of cached batches.
    pub fn used_bytes(&self) -> usize {
        self.inner.borrow().batch_bytes
    }

    /// Memory the cached batches keep alive (at most `capacity_bytes`).
    pub fn pinned_bytes(&self) -> usize {
        self.inner.borrow().pinned_bytes
    }

    pub(crate) fn register(&self) -> u64 {
        let id = self.next_log_id.get();
        self.next_log_id.set(id + 1);
        id
    }

    /// Caches `batch` (offsets `base_offset..=last_offset` of `log`), a
    /// slice of an allocation of `allocation_bytes`: see the module doc.
    pub(crate) fn insert(
        &self,
        log: u64,
        base_offset: i64,
        last_offset: i64,
        batch: impl Into<Bytes>,
        allocation_bytes: usize,
    ) {
        let batch: Bytes = batch.into();
        let mut inner = self.inner.borrow_mut();
        if batch.len() > self.capacity_bytes {
            // A batch larger than the whole cache would only evict everything;
            // keep it out and drop this log's (now non-contiguous) entries.
            inner.remove_log(log);
            return;
        }
        let mut batch = CachedBatch::new(base_offset, last_offset, batch, allocation_bytes);
        if batch.pinned > self.capacity_bytes {
            // Sharing would cost more than the whole cache: a copy fits.
            batch.pinned = batch.bytes.len();
            batch.bytes = Bytes::copy_from_slice(&batch.bytes);
        }
        inner.fifo.push_back((log, batch.base_offset));
        inner.pinned_bytes += batch.pinned;
        inner.batch_bytes += batch.bytes.len();
        inner.logs.entry(log).or_default().push_back(batch);
        while inner.pinned_bytes > self.capacity_bytes {
            let Some((l, base)) = inner.fifo.pop_front() else {
                break;
            };
            let Some(q) = inner.logs.get_mut(&l) else {
                continue;
            };
            let evicted = if q.front().map(|b| b.base_offset) == Some(base) {
                q.pop_front()
            } else {
                None
            };
            if q.is_empty() {
                inner.logs.remove(&l);
            }
            if let Some(b) = evicted {
                inner.forget(&b);
            }
        }
    }

    /// Drops every cached batch of `log`.
    pub(crate) fn remove_log(&self, log: u64) {
        let mut inner = self.inner.borrow_mut();
        inner.remove_log(log);
        if inner.logs.is_empty() {
            inner.fifo.clear();
        }
    }

    /// Batches of `log` starting with the one containing (or first after)
    /// `from`, all with `last_offset < upper`, up to `max_bytes` but at least
    /// one. `None` if `from` is before the first cached batch of `log`.
    /// Drops the cached batches of `log` that end below `offset` (the
    /// cleaner rewrote them on disk: a fetch must read the cleaned ones).
    pub(crate) fn remove_below(&self, log: u64, offset: i64) {
        let mut inner = self.inner.borrow_mut();
        let Some(q) = inner.logs.get_mut(&log) else {
            return;
        };
        let mut dropped = Vec::new();
        while q.front().is_some_and(|b| b.last_offset < offset) {
            dropped.extend(q.pop_front());
        }
        if q.is_empty() {
            inner.logs.remove(&log);
        }
        for b in &dropped {
            inner.forget(b);
        }
    }

    /// Drops the cached batches of `log` that end at or after `offset`
    /// (the log was truncated to end there: a fetch must not see them).
    /// Their FIFO entries stay until they reach the front, as a removed
    /// log's do; one that names the base offset of a batch appended again
    /// later can only evict that batch early (a read then goes to the file).
    pub(crate) fn remove_from(&self, log: u64, offset: i64) {
        let mut inner = self.inner.borrow_mut();
        let Some(q) = inner.logs.get_mut(&log) else {
            return;
        };
        let mut dropped = Vec::new();
        while q.back().is_some_and(|b| b.last_offset >= offset) {
            dropped.extend(q.pop_back());
        }
        if q.is_empty() {
            inner.logs.remove(&log);
        }
        for b in &dropped {
            inner.forget(b);
        }
    }

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
    use bytes::BytesMut;

    /// Caches an `n`-byte batch of its own at `base` of `log`.
    fn ins(c: &TailCache, log: u64, base: i64, n: usize) {
        c.insert(log, base, base, BytesMut::from(&vec![0u8; n][..]), n);
    }

    #[test]
    fn evicts_oldest_across_logs_within_capacity() {
        let c = TailCache::new(250);
        let (a, z) = (c.register(), c.register());
        ins(&c, a, 0, 100);
        ins(&c, z, 0, 100);
        ins(&c, a, 1, 100);
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
            ins(&c, a, i, 100);
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

    /// A receive buffer of `alloc` bytes holding one frame whose first
    /// `batch` bytes are a batch: the batch as the produce path cuts it
    /// (a slice sharing the buffer) and the buffer's address.
    fn frame_slice(alloc: usize, batch: usize) -> (BytesMut, usize) {
        let mut buf = BytesMut::with_capacity(alloc);
        buf.resize(alloc, 7);
        let base = buf.as_ptr() as usize;
        let slice = buf.split_to(batch);
        drop(buf); // the rest of the frame: refused, answered, gone
        (slice, base)
    }

    /// Whether `b` points into the allocation at `base` of `alloc` bytes.
    fn inside(b: &Bytes, base: usize, alloc: usize) -> bool {
        (base..base + alloc).contains(&(b.as_ptr() as usize))
    }

    #[test]
    fn a_small_batch_of_a_large_frame_is_copied_and_pins_only_itself() {
        const FRAME: usize = 1 << 20;
        let c = TailCache::new(4 << 20);
        let a = c.register();
        let (tiny, base) = frame_slice(FRAME, 100);
        c.insert(a, 0, 0, tiny, FRAME);
        let (chunks, _) = c.read(a, 0, FRAME, 1).unwrap();
        assert!(
            !inside(&chunks[0], base, FRAME),
            "the cached batch is a copy: the frame is freed"
        );
        assert_eq!((c.used_bytes(), c.pinned_bytes()), (100, 100));
        // 64 such frames pin 64 x 100 bytes, not 64 MiB.
        for i in 1..64 {
            let (tiny, _) = frame_slice(FRAME, 100);
            c.insert(a, i, i, tiny, FRAME);
        }
        assert_eq!(c.pinned_bytes(), 64 * 100);
    }

    #[test]
    fn a_batch_that_is_most_of_its_frame_stays_zero_copy_and_is_charged_the_frame() {
        const FRAME: usize = 1 << 20;
        let big = FRAME / SHARED_ALLOCATION_RATIO_MAX;
        let c = TailCache::new(3 * FRAME / 2);
        let a = c.register();
        let (batch, base) = frame_slice(FRAME, big);
        c.insert(a, 0, 0, batch, FRAME);
        let (chunks, _) = c.read(a, 0, FRAME, 1).unwrap();
        assert!(inside(&chunks[0], base, FRAME), "zero-copy");
        assert_eq!((c.used_bytes(), c.pinned_bytes()), (big, FRAME));
        drop(chunks);
        // A second one would make 2 MiB pinned, over the 1.5 MiB capacity:
        // the first is evicted, though the batches alone would fit.
        let (batch, _) = frame_slice(FRAME, big);
        c.insert(a, 1, 1, batch, FRAME);
        assert!(c.read(a, 0, FRAME, 2).is_none(), "offset 0 was evicted");
        assert_eq!(c.pinned_bytes(), FRAME);
        assert!(c.pinned_bytes() <= c.capacity_bytes());
        c.remove_log(a);
        assert_eq!((c.used_bytes(), c.pinned_bytes()), (0, 0));
    }
}
