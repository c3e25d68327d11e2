//! Page-aligned buffers for staging and writing the logs, carved from 2 MiB
//! huge pages.
//!
//! Every byte a log writes passes through one of these: `append` stages
//! batches into them and the writer hands them to `pwritev` (direct) or
//! `pwrite` (buffered). Why huge pages: an O_DIRECT write pins the user
//! pages it reads (`get_user_pages`) and builds a bio with one segment per
//! physically contiguous piece. From 4 KiB pages a 1 MiB write is 256 page
//! pins and 256 segments, more than virtio-blk takes in one request
//! (`max_segments` 254 on the 2-core VM), so the block layer splits it too.
//! From one huge page it is one folio pin and one segment. On the VM a
//! loop of 1 MiB O_DIRECT `pwrite`s from a huge page cost 0.04 s of CPU per
//! GB against 0.15 from 4 KiB pages, and ran 4x faster; at 64 KiB, 0.37
//! against 0.56 (tuning/results/huge-page-staging.md, with the broker's
//! figures).
//!
//! [`IoArena`] (one per shard, !Send) is a buddy allocator over 2 MiB
//! blocks: each block is its own anonymous mapping, 2 MiB aligned, with
//! `MADV_HUGEPAGE` (the kernel backs it with a huge page when it has one,
//! else with small pages: still correct, only slower). Buffers are powers of
//! two from one page to 2 MiB (a buffer is aligned to its own size); a
//! freed buffer merges with its free buddy. Blocks are mapped on demand up to
//! `IO_ARENA_BYTES_MAX` and kept for the shard's life: reuse, not page
//! faults, is the common case, and only a block's first touch pays for its
//! huge page (with the kernel's default THP `defrag` setting, possibly a
//! compaction, once). A request larger than 2 MiB, or one the full arena
//! cannot serve, gets zeroed heap memory instead (4 KiB aligned, freed on
//! drop): slower to write, never wrong. The cap holds the writes in flight
//! of one busy producer many times over (librdkafka keeps up to 5 requests
//! of at most 1 MiB per connection).
//!
//! The arena also counts, for its shard, the bytes of batches that logs
//! have staged and not yet written to their files (`unwritten_bytes`; each
//! log's writer adds a batch at append and removes it once written, or when
//! the writer is dropped). The produce path holds requests back while it is
//! at the shard's `staged_bytes_max`, so producers faster than the disk
//! (acks=0 ones get no answer to wait for) are slowed instead of staged
//! until memory runs out. It counts batches, not buffers: every log keeps
//! its open chunk's buffer between appends, and with many partitions those
//! alone would fill any limit.
//!
//! Memory from `mmap` starts zeroed and arena memory is only ever written
//! through `&mut [u8]`, so a buffer's bytes are always initialized (old
//! bytes of an earlier buffer, not garbage): callers write what they use.

use super::watch::OffsetWatch;
use super::{IO_ARENA_BYTES_MAX, PAGE_BYTES};
use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::ptr::NonNull;
use std::rc::Rc;

/// A huge page, and the arena's largest buffer.
const BLOCK_BYTES: usize = 2 << 20;
/// Buffer sizes are `PAGE_BYTES << order`, order 0 to `MAX_ORDER`.
const MAX_ORDER: usize = (BLOCK_BYTES / PAGE_BYTES as usize).trailing_zeros() as usize;

/// Free buffers of each order, by address; mapped blocks.
#[derive(Default)]
struct Buddy {
    free: [BTreeSet<usize>; MAX_ORDER + 1],
    blocks: Vec<usize>,
    /// An `mmap` failed: use the heap from now on rather than retry.
    map_failed: bool,
}

/// One shard's buffer arena; see the module doc.
pub(crate) struct IoArena {
    buddy: RefCell<Buddy>,
    max_blocks: usize,
    /// Bytes of batches the shard's logs have staged and not yet written to
    /// their files (`add_unwritten`, `remove_unwritten`).
    unwritten_bytes: Cell<u64>,
    /// Counts decreases of `unwritten_bytes`, so a producer held back by
    /// `staged_bytes_max` can wait for room (`wait_unwritten_below`).
    released: OffsetWatch,
}

/// A page-aligned buffer from an [`IoArena`] (or the heap); returns to it
/// when dropped.
pub(crate) struct IoBuf {
    ptr: NonNull<u8>,
    len: usize,
    /// The arena that counts it.
    arena: Rc<IoArena>,
    /// `Some(order)` for arena memory, `None` for heap memory.
    order: Option<usize>,
}

impl IoArena {
    pub fn new() -> Rc<IoArena> {
        Self::with_limit(IO_ARENA_BYTES_MAX)
    }

    /// An arena that maps at most `max_bytes` (rounded down to blocks).
    pub fn with_limit(max_bytes: usize) -> Rc<IoArena> {
        Rc::new(IoArena {
            buddy: RefCell::new(Buddy::default()),
            max_blocks: max_bytes / BLOCK_BYTES,
            unwritten_bytes: Cell::new(0),
            released: OffsetWatch::new(0),
        })
    }

    /// Bytes the shard's logs have staged and not yet written.
    pub fn unwritten_bytes(&self) -> u64 {
        self.unwritten_bytes.get()
    }

    pub fn add_unwritten(&self, len: u64) {
        self.unwritten_bytes.set(self.unwritten_bytes.get() + len);
    }

    pub fn remove_unwritten(&self, len: u64) {
        if len == 0 {
            return;
        }
        debug_assert!(
            len <= self.unwritten_bytes.get(),
            "more written than staged"
        );
        self.unwritten_bytes
            .set(self.unwritten_bytes.get().saturating_sub(len));
        self.released.advance(self.released.get() + 1);
    }

    /// Resolves once the shard's logs hold fewer than `max_bytes` staged and
    /// unwritten.
    pub async fn wait_unwritten_below(&self, max_bytes: u64) {
        while self.unwritten_bytes.get() >= max_bytes {
            let seen = self.released.get();
            self.released.wait_above(seen, || false).await;
        }
    }

    /// A buffer of `len` bytes, page aligned.
    pub fn alloc(self: &Rc<Self>, len: usize) -> IoBuf {
        if len <= BLOCK_BYTES {
            let order = order_of(len);
            if let Some(ptr) = self.take(order) {
                return IoBuf {
                    ptr,
                    len,
                    arena: self.clone(),
                    order: Some(order),
                };
            }
        }
        IoBuf::heap(len, self.clone())
    }

    /// Bytes mapped so far.
    #[cfg(test)]
    fn mapped_bytes(&self) -> usize {
        self.buddy.borrow().blocks.len() * BLOCK_BYTES
    }

    /// A free buffer of `order`, splitting a larger one or mapping a block
    /// if needed.
    fn take(&self, order: usize) -> Option<NonNull<u8>> {
        let mut b = self.buddy.borrow_mut();
        let from = match (order..=MAX_ORDER).find(|&o| !b.free[o].is_empty()) {
            Some(o) => o,
            None => {
                if b.map_failed || b.blocks.len() >= self.max_blocks {
                    return None;
                }
                let Some(block) = map_block() else {
                    b.map_failed = true;
                    return None;
                };
                b.blocks.push(block);
                b.free[MAX_ORDER].insert(block);
                MAX_ORDER
            }
        };
        let addr = b.free[from].pop_first()?;
        // Split down: the upper half of each split stays free.
        for o in (order..from).rev() {
            b.free[o].insert(addr + ((PAGE_BYTES as usize) << o));
        }
        NonNull::new(addr as *mut u8)
    }

    fn give_back(&self, mut addr: usize, mut order: usize) {
        let mut b = self.buddy.borrow_mut();
        debug_assert!(!b.free[order].contains(&addr), "double free of {addr:#x}");
        while order < MAX_ORDER {
            let buddy = addr ^ ((PAGE_BYTES as usize) << order);
            if !b.free[order].remove(&buddy) {
                break;
            }
            addr = addr.min(buddy);
            order += 1;
        }
        b.free[order].insert(addr);
    }
}

impl Drop for IoArena {
    fn drop(&mut self) {
        // Every buffer holds an `Rc` of its arena, so none is alive here.
        for &block in &self.buddy.get_mut().blocks {
            // SAFETY: `block` is a mapping of BLOCK_BYTES made by
            // `map_block`, and no buffer points into it any more.
            unsafe { libc::munmap(block as *mut libc::c_void, BLOCK_BYTES) };
        }
    }
}

/// The order of the smallest buffer holding `len` bytes (`len` ≤ a block).
fn order_of(len: usize) -> usize {
    let pages = len.div_ceil(PAGE_BYTES as usize).max(1);
    pages.next_power_of_two().trailing_zeros() as usize
}

/// Maps one 2 MiB-aligned block of BLOCK_BYTES and asks for a huge page.
fn map_block() -> Option<usize> {
    let span = 2 * BLOCK_BYTES;
    // SAFETY: an anonymous private mapping at an address the kernel picks;
    // the parts outside the aligned block are unmapped right away.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return None;
        }
        let start = p as usize;
        let block = start.next_multiple_of(BLOCK_BYTES);
        if block > start {
            libc::munmap(p, block - start);
        }
        let end = block + BLOCK_BYTES;
        if start + span > end {
            libc::munmap(end as *mut libc::c_void, start + span - end);
        }
        // Best effort: without transparent huge pages the block still works.
        libc::madvise(block as *mut libc::c_void, BLOCK_BYTES, libc::MADV_HUGEPAGE);
        Some(block)
    }
}

impl IoBuf {
    /// Zeroed, page-aligned heap memory (at least one page is allocated).
    fn heap(len: usize, arena: Rc<IoArena>) -> IoBuf {
        let layout = heap_layout(len);
        // SAFETY: the layout's size is at least one page.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(p) else {
            std::alloc::handle_alloc_error(layout)
        };
        IoBuf {
            ptr,
            len,
            arena,
            order: None,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: `ptr` owns `len` initialized bytes (module doc) for as
        // long as `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_bytes`, and `&mut self` makes this the only
        // reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// Whole pages, page aligned. Panics, as `Vec` does, for a size no
/// allocation can have (beyond `isize::MAX`).
fn heap_layout(len: usize) -> std::alloc::Layout {
    let page = PAGE_BYTES as usize;
    len.max(1)
        .checked_next_multiple_of(page)
        .and_then(|size| std::alloc::Layout::from_size_align(size, page).ok())
        .unwrap_or_else(|| panic!("an I/O buffer of {len} bytes: capacity overflow"))
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        match self.order {
            Some(order) => self.arena.give_back(self.ptr.as_ptr() as usize, order),
            // SAFETY: heap memory allocated by `IoBuf::heap` with this layout.
            None => unsafe { std::alloc::dealloc(self.ptr.as_ptr(), heap_layout(self.len)) },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: usize = PAGE_BYTES as usize;

    #[test]
    fn buffers_are_aligned_disjoint_and_merge_back() {
        let arena = IoArena::with_limit(BLOCK_BYTES);
        let sizes = [PAGE, 3 * PAGE, 16 << 10, 256 << 10, 1 << 20, 100];
        let mut bufs: Vec<IoBuf> = sizes.iter().map(|&n| arena.alloc(n)).collect();
        for (i, b) in bufs.iter_mut().enumerate() {
            assert_eq!(b.len(), sizes[i]);
            let Some(order) = &b.order else {
                panic!("buffer {i} not from the arena");
            };
            assert_eq!(
                b.as_ptr() as usize % (PAGE << order),
                0,
                "buffer {i} aligned to its size"
            );
            b.as_bytes_mut().fill(i as u8 + 1);
        }
        for (i, b) in bufs.iter().enumerate() {
            assert!(
                b.as_bytes().iter().all(|&x| x == i as u8 + 1),
                "buffer {i} kept its bytes"
            );
        }
        assert_eq!(arena.mapped_bytes(), BLOCK_BYTES);
        // The block is used up by a further 1 MiB: that one comes from the heap.
        let more = arena.alloc(1 << 20);
        assert!(more.order.is_none());
        drop(more);
        drop(bufs);
        // Everything merged back into one free block.
        let b = arena.buddy.borrow();
        assert_eq!(b.free[MAX_ORDER].len(), 1);
        assert!(b.free[..MAX_ORDER].iter().all(|s| s.is_empty()));
    }

    #[test]
    fn freed_buffers_are_reused_before_a_block_is_mapped() {
        let arena = IoArena::with_limit(4 * BLOCK_BYTES);
        let whole = arena.alloc(BLOCK_BYTES);
        assert!(whole.order.is_some());
        assert_eq!(whole.as_ptr() as usize % BLOCK_BYTES, 0);
        let at = whole.as_ptr();
        drop(whole);
        for _ in 0..3 {
            let halves = [arena.alloc(1 << 20), arena.alloc(1 << 20)];
            assert!(halves.iter().any(|h| h.as_ptr() == at));
            drop(halves);
            assert_eq!(arena.alloc(BLOCK_BYTES).as_ptr(), at);
        }
        assert_eq!(arena.mapped_bytes(), BLOCK_BYTES);
        // Two blocks in use at once: each buffer's buddy is in its own block.
        let two = [arena.alloc(BLOCK_BYTES), arena.alloc(BLOCK_BYTES)];
        assert_eq!(arena.mapped_bytes(), 2 * BLOCK_BYTES);
        drop(two);
        assert_eq!(arena.buddy.borrow().free[MAX_ORDER].len(), 2);
    }

    #[test]
    fn large_and_over_limit_requests_use_the_heap() {
        let arena = IoArena::with_limit(BLOCK_BYTES - 1);
        let b = arena.alloc(8 << 10);
        assert!(b.order.is_none(), "a limit below one block maps nothing");
        assert_eq!(b.as_ptr() as usize % PAGE, 0);
        assert!(
            b.as_bytes().iter().all(|&x| x == 0),
            "heap memory is zeroed"
        );
        let arena = IoArena::new();
        let big = arena.alloc(3 << 20);
        assert!(big.order.is_none());
        assert_eq!(big.as_ptr() as usize % PAGE, 0);
        assert_eq!(arena.mapped_bytes(), 0);
    }

    #[test]
    fn orders() {
        assert_eq!(order_of(0), 0);
        assert_eq!(order_of(1), 0);
        assert_eq!(order_of(PAGE), 0);
        assert_eq!(order_of(PAGE + 1), 1);
        assert_eq!(order_of(16 << 10), 2);
        assert_eq!(order_of(BLOCK_BYTES), MAX_ORDER);
    }
}
