//! A monotonically increasing offset that tasks of one shard can wait on.
//!
//! Used for the written and durable offsets of a partition log: appenders
//! wait for their batch to be written or synced, long-polling fetches wait
//! for the high watermark to move. Shard-local (`Cell`/`RefCell`), !Send.

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::task::{Poll, Waker};

#[derive(Debug)]
pub(crate) struct OffsetWatch {
    value: Cell<i64>,
    closed: Cell<bool>,
    wakers: RefCell<Vec<Waker>>,
}

impl OffsetWatch {
    pub fn new(v: i64) -> Self {
        OffsetWatch {
            value: Cell::new(v),
            closed: Cell::new(false),
            wakers: RefCell::new(Vec::new()),
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

    /// Wakes every waiter; they resolve `false` from now on.
    pub fn close(&self) {
        self.closed.set(true);
        self.wake_all();
    }

    /// Wakes every waiter so it re-checks its condition (e.g. a failure).
    pub fn wake_all(&self) {
        let w = std::mem::take(&mut *self.wakers.borrow_mut());
        for w in w {
            w.wake();
        }
    }

    /// Resolves `true` once the value is > `x`, `false` if closed first or
    /// when `stop()` returns true.
    pub async fn wait_above(&self, x: i64, stop: impl Fn() -> bool) -> bool {
        poll_fn(|cx| {
            if self.value.get() > x {
                Poll::Ready(true)
            } else if self.closed.get() || stop() {
                Poll::Ready(false)
            } else {
                self.wakers.borrow_mut().push(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }
}
