//! A monotonically increasing offset that tasks of one shard can wait on
//! (lowered only by a truncation of the log, [`OffsetWatch::lower_to`]).
//!
//! Used for the written and durable offsets of a partition log: appenders
//! wait for their batch to be written or synced, long-polling fetches wait
//! for the high watermark to move. Shard-local (`Cell`/`RefCell`), !Send.
//!
//! Invariant: the watch holds at most one waker per live [`WaitAbove`]
//! future, and none for a future that was dropped. A waiter registers under
//! an id of its own, replaces its waker in place when polled again, and
//! removes it when dropped — resolved or not. A long-poll fetch that times
//! out on an idle partition therefore leaves nothing behind; before this,
//! every expired poll left one waker clone in the partition's list until the
//! next append, and glommio counts a task's wakers in an `i16` and panics the
//! shard past `i16::MAX` (a consumer long-polling an idle partition would
//! have crashed its shard after ~32k polls, and one Fetch naming a partition
//! 40,000 times did so at once).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

#[derive(Debug)]
pub(crate) struct OffsetWatch {
    value: Cell<i64>,
    closed: Cell<bool>,
    waiters: RefCell<Waiters>,
}

/// The registered wakers, by waiter id, oldest first.
#[derive(Debug, Default)]
struct Waiters {
    next_id: u64,
    by_id: BTreeMap<u64, Waker>,
}

impl Default for OffsetWatch {
    fn default() -> Self {
        OffsetWatch::new(0)
    }
}

impl OffsetWatch {
    pub fn new(v: i64) -> Self {
        OffsetWatch {
            value: Cell::new(v),
            closed: Cell::new(false),
            waiters: RefCell::new(Waiters::default()),
        }
    }

    pub fn get(&self) -> i64 {
        self.value.get()
    }

    /// Raises the value (never lowers it) and wakes every waiter.
    pub fn advance(&self, v: i64) {
        if v > self.value.get() {
            self.value.set(v);
            self.wake_all();
        }
    }

    /// Lowers the value to `v` if it is above (a truncation of the log,
    /// the only thing that moves these offsets back) and wakes every
    /// waiter so it re-checks what it waits for.
    pub fn lower_to(&self, v: i64) {
        if v < self.value.get() {
            self.value.set(v);
        }
        self.wake_all();
    }

    /// Wakes every waiter; they resolve `false` from now on.
    pub fn close(&self) {
        self.closed.set(true);
        self.wake_all();
    }

    /// Wakes every waiter so it re-checks its condition (e.g. a failure).
    /// A woken waiter that must wait on registers again when polled.
    pub fn wake_all(&self) {
        let woken = std::mem::take(&mut self.waiters.borrow_mut().by_id);
        for (_, w) in woken {
            w.wake();
        }
    }

    /// Wakers registered now (one per pending waiter, at most).
    #[cfg(test)]
    pub fn waiters_len(&self) -> usize {
        self.waiters.borrow().by_id.len()
    }

    /// Resolves `true` once the value is > `x`, `false` if closed first or
    /// when `stop()` returns true.
    pub fn wait_above<F: Fn() -> bool>(&self, x: i64, stop: F) -> WaitAbove<'_, F> {
        WaitAbove {
            watch: self,
            above: x,
            stop,
            id: None,
        }
    }

    fn register(&self, id: &mut Option<u64>, waker: &Waker) {
        let mut waiters = self.waiters.borrow_mut();
        if let Some(known) = *id {
            if let Some(w) = waiters.by_id.get_mut(&known) {
                if !w.will_wake(waker) {
                    w.clone_from(waker);
                }
                return;
            }
        }
        let new_id = waiters.next_id;
        waiters.next_id += 1;
        waiters.by_id.insert(new_id, waker.clone());
        *id = Some(new_id);
    }

    fn deregister(&self, id: &mut Option<u64>) {
        if let Some(known) = id.take() {
            self.waiters.borrow_mut().by_id.remove(&known);
        }
    }
}

/// The future of [`OffsetWatch::wait_above`]; it removes its waker when it
/// resolves or is dropped.
pub(crate) struct WaitAbove<'a, F: Fn() -> bool> {
    watch: &'a OffsetWatch,
    above: i64,
    stop: F,
    /// Its id in the watch's waiters, while a waker is registered.
    id: Option<u64>,
}

impl<F: Fn() -> bool + Unpin> Future for WaitAbove<'_, F> {
    type Output = bool;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<bool> {
        let this = self.get_mut();
        let watch = this.watch;
        let outcome = if watch.value.get() > this.above {
            Some(true)
        } else if watch.closed.get() || (this.stop)() {
            Some(false)
        } else {
            None
        };
        match outcome {
            Some(ready) => {
                watch.deregister(&mut this.id);
                Poll::Ready(ready)
            }
            None => {
                watch.register(&mut this.id, cx.waker());
                Poll::Pending
            }
        }
    }
}

impl<F: Fn() -> bool> Drop for WaitAbove<'_, F> {
    fn drop(&mut self) {
        self.watch.deregister(&mut self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[test]
    fn a_dropped_waiter_leaves_no_waker() {
        let w = OffsetWatch::new(0);
        for _ in 0..100_000 {
            let mut f = Box::pin(w.wait_above(5, || false));
            assert!((&mut f).now_or_never().is_none());
            assert_eq!(w.waiters_len(), 1);
            drop(f);
        }
        assert_eq!(w.waiters_len(), 0);
    }

    #[test]
    fn polling_again_replaces_the_waker_in_place() {
        let w = OffsetWatch::new(0);
        let mut f = Box::pin(w.wait_above(5, || false));
        for _ in 0..1000 {
            assert!((&mut f).now_or_never().is_none());
        }
        assert_eq!(w.waiters_len(), 1);
        w.advance(6);
        assert_eq!(w.waiters_len(), 0);
        assert_eq!((&mut f).now_or_never(), Some(true));
        assert_eq!(w.waiters_len(), 0);
    }

    #[test]
    fn woken_waiters_register_again_and_resolve_on_close() {
        let w = OffsetWatch::new(0);
        let mut a = Box::pin(w.wait_above(10, || false));
        let mut b = Box::pin(w.wait_above(3, || false));
        assert!((&mut a).now_or_never().is_none());
        assert!((&mut b).now_or_never().is_none());
        assert_eq!(w.waiters_len(), 2);
        w.advance(5);
        assert_eq!((&mut b).now_or_never(), Some(true));
        assert!((&mut a).now_or_never().is_none());
        assert_eq!(w.waiters_len(), 1);
        w.close();
        assert_eq!((&mut a).now_or_never(), Some(false));
        assert_eq!(w.waiters_len(), 0);
    }
}
