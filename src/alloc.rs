//! The broker's global allocator: the system allocator, except that an
//! allocation of `LARGE_ALLOC_BYTES` or more is an anonymous mapping with
//! `MAP_NORESERVE`.
//!
//! Why: the `kafka-protocol` crate, which decodes the control-plane requests
//! (Metadata, groups, transactions, admin), sizes a `Vec` from an array
//! count read off the wire before it decodes a single element. A 14-byte
//! Metadata v0 request (header and count) can declare 2^31-1 topics and so
//! ask for 154 GB. Under the kernel's default overcommit mode (0), the
//! system allocator's mapping of more than memory plus swap is refused, and
//! Rust aborts the process on a refused allocation: one malformed request
//! took the whole broker down. Kafka checks each array count against the
//! bytes left in the request; the crate does not (0.18; upstream PRs #152,
//! #161 and #200 propose it), and adding the check would mean carrying a
//! patched copy of the crate's code in fjord.
//!
//! A `MAP_NORESERVE` mapping reserves address space only. The decoder then
//! touches a page or two, runs out of input, returns an error (the
//! connection is closed), and the mapping is unmapped. The threshold is low
//! (64 MiB) so that it also covers a small machine, where a few hundred MiB
//! can already be more than memory and swap together. Few legitimate
//! allocations reach it (a produce frame near `socket.request.max.bytes`,
//! 100 MiB); for them the mapping is what glibc would have made anyway (it
//! maps every allocation above 32 MiB), without the commit-charge check.
//! What this does not cover: `vm.overcommit_memory=2` (the kernel ignores
//! `MAP_NORESERVE`) and an address-space limit (`ulimit -v`) below the
//! request; there an impossible request still fails, and aborts. A count that does fit the
//! frame (a 100 MiB frame of 2-byte elements) can still make the decoder
//! commit memory in proportion, as for any request that large.
//!
//! Only the `fjord` binary installs it (`main.rs`); tests that run the
//! broker in-process use the system allocator.

use std::alloc::{GlobalAlloc, Layout, System};

/// Allocations of this size or more are `MAP_NORESERVE` mappings: 64 MiB.
pub const LARGE_ALLOC_BYTES: usize = 64 << 20;

/// See the module doc.
pub struct BrokerAlloc;

fn mapped(layout: &Layout) -> bool {
    layout.size() >= LARGE_ALLOC_BYTES && layout.align() <= 4096
}

/// The mapping `mmap` or `mremap` returned, or null (an allocator's
/// failure) for `MAP_FAILED`.
fn mapping_or_null(p: *mut libc::c_void) -> *mut u8 {
    if p == libc::MAP_FAILED {
        std::ptr::null_mut()
    } else {
        p.cast()
    }
}

// SAFETY: small requests go to `System` unchanged; large ones are fresh
// page-aligned anonymous mappings of at least `layout.size()` bytes (zeroed,
// so `alloc_zeroed` needs no more), unmapped with the same size, which
// `dealloc` gets from the same layout.
unsafe impl GlobalAlloc for BrokerAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !mapped(&layout) {
            // SAFETY: the caller's contract, passed on.
            return unsafe { System.alloc(layout) };
        }
        // SAFETY: a new private anonymous mapping at an address the kernel
        // picks; nothing else is touched.
        mapping_or_null(unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                layout.size(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        })
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if mapped(&layout) {
            // SAFETY: as `alloc`; anonymous mappings start zeroed.
            unsafe { self.alloc(layout) }
        } else {
            // SAFETY: the caller's contract, passed on.
            unsafe { System.alloc_zeroed(layout) }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if mapped(&layout) {
            // SAFETY: `ptr` is a mapping of `layout.size()` bytes made by
            // `alloc` for this same layout.
            unsafe { libc::munmap(ptr.cast(), layout.size()) };
        } else {
            // SAFETY: the caller's contract, passed on.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees `new_size` with `layout.align()` is
        // a valid layout.
        let new = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (mapped(&layout), mapped(&new)) {
            // SAFETY: the caller's contract, passed on.
            (false, false) => return unsafe { System.realloc(ptr, layout, new_size) },
            (true, true) => {
                // Move the mapping (no copy, and untouched pages stay
                // uncommitted); it keeps MAP_NORESERVE.
                // SAFETY: `ptr` is a mapping of `layout.size()` bytes made
                // by `alloc`; on success it is replaced by the returned one.
                return mapping_or_null(unsafe {
                    libc::mremap(ptr.cast(), layout.size(), new_size, libc::MREMAP_MAYMOVE)
                });
            }
            _ => {}
        }
        // Across the threshold: allocate, copy the bytes both hold, free the
        // old block.
        // SAFETY: each call on memory this allocator handed out for that
        // layout.
        unsafe {
            let out = self.alloc(new);
            if !out.is_null() {
                std::ptr::copy_nonoverlapping(ptr, out, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allocation_larger_than_memory_is_only_address_space() {
        let a = BrokerAlloc;
        // 1 TiB: more than any machine here has, memory and swap together.
        let layout = Layout::from_size_align(1 << 40, 8).unwrap();
        // SAFETY: a non-zero layout; the pointer is freed with it below.
        unsafe {
            let p = a.alloc(layout);
            assert!(!p.is_null());
            *p = 1;
            *p.add(layout.size() - 1) = 2;
            assert_eq!(*p.add(4096), 0, "zeroed");
            a.dealloc(p, layout);
        }
    }

    #[test]
    fn realloc_keeps_the_bytes_across_and_above_the_threshold() {
        let a = BrokerAlloc;
        let small = Layout::from_size_align(4096, 8).unwrap();
        // SAFETY: each pointer is used within its layout and freed with it.
        unsafe {
            let p = a.alloc(small);
            assert!(!p.is_null());
            p.write_bytes(7, 4096);
            let big = a.realloc(p, small, LARGE_ALLOC_BYTES);
            assert!(!big.is_null());
            assert!((0..4096).all(|i| *big.add(i) == 7));
            let large = Layout::from_size_align(LARGE_ALLOC_BYTES, 8).unwrap();
            *big.add(LARGE_ALLOC_BYTES - 1) = 9;
            let bigger = a.realloc(big, large, 4 * LARGE_ALLOC_BYTES);
            assert!(!bigger.is_null());
            assert!((0..4096).all(|i| *bigger.add(i) == 7));
            assert_eq!(*bigger.add(LARGE_ALLOC_BYTES - 1), 9);
            assert_eq!(
                *bigger.add(4 * LARGE_ALLOC_BYTES - 1),
                0,
                "grown part is zeroed"
            );
            let larger = Layout::from_size_align(4 * LARGE_ALLOC_BYTES, 8).unwrap();
            let back = a.realloc(bigger, larger, 100);
            assert!(!back.is_null());
            assert!((0..100).all(|i| *back.add(i) == 7));
            a.dealloc(back, Layout::from_size_align(100, 8).unwrap());
        }
    }
}
