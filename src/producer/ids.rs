//! Producer ids for InitProducerId, handed out from blocks.
//!
//! The controller (shard 0) allocates blocks of
//! [`crate::metadata::PRODUCER_ID_BLOCK_SIZE`] ids and persists the high-water
//! mark in the metadata log before handing a block out, so an id is never
//! given twice, across restarts too (ids of a block cut short by a restart
//! are skipped, as in Kafka). Each shard holds its current block and asks for
//! the next one when the current is mostly used; a shard with no ids left
//! answers COORDINATOR_LOAD_IN_PROGRESS (retriable), as Kafka does right after
//! start-up.

use std::cell::Cell;
use std::ops::Range;

/// Ask for the next block when fewer than this many ids are left.
pub const PREFETCH_REMAINING_IDS: i64 = 100;

/// The producer-id blocks of one shard.
#[derive(Debug, Default)]
pub struct ProducerIdBlocks {
    current: Cell<(i64, i64)>,
    next: Cell<Option<(i64, i64)>>,
    requested: Cell<bool>,
}

impl ProducerIdBlocks {
    /// Takes the next id, if one is available.
    pub fn take(&self) -> Option<i64> {
        let (start, end) = self.current.get();
        if start < end {
            self.current.set((start + 1, end));
            return Some(start);
        }
        let (start, end) = self.next.take()?;
        self.current.set((start, end));
        self.take()
    }

    /// Whether a new block should be requested now (and marks it requested).
    pub fn should_request(&self) -> bool {
        let (start, end) = self.current.get();
        let low = end - start < PREFETCH_REMAINING_IDS;
        if low && self.next.get().is_none() && !self.requested.get() {
            self.requested.set(true);
            return true;
        }
        false
    }

    /// Ids left in the current and the next block (for metrics).
    pub fn remaining(&self) -> i64 {
        let (start, end) = self.current.get();
        let next = self.next.get().map_or(0, |(s, e)| e - s);
        (end - start).max(0) + next.max(0)
    }

    /// A block arrived from the controller (or the request failed: `None`).
    pub fn add(&self, block: Option<Range<i64>>) {
        self.requested.set(false);
        if let Some(r) = block {
            let (start, end) = self.current.get();
            if start >= end {
                self.current.set((r.start, r.end));
            } else {
                self.next.set(Some((r.start, r.end)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_used_in_order_and_prefetched() {
        let b = ProducerIdBlocks::default();
        assert_eq!(b.take(), None);
        assert!(b.should_request());
        assert!(!b.should_request()); // already asked
        b.add(Some(0..150));
        assert_eq!(b.take(), Some(0));
        assert!(!b.should_request()); // 149 left
        for _ in 0..50 {
            b.take();
        }
        assert!(b.should_request()); // 99 left
        b.add(Some(1000..2000));
        for want in 51..150 {
            assert_eq!(b.take(), Some(want));
        }
        assert_eq!(b.take(), Some(1000));
    }
}
