//! Change signals: many logs tell one waiter which of them changed.
//!
//! A fetch session (KIP-227, `shard::fetch_sessions`) holds hundreds of
//! partitions and must answer, on each incremental fetch, only those with
//! news. Asking every partition "did you change?" costs O(partitions in
//! the session) per fetch, and a long poll that registers one waker per
//! partition costs as much again every time it parks
//! (`tuning/results/fetch-sessions.md` measured both). Instead the
//! partitions tell the session:
//!
//! - a [`ChangeSignal`] belongs to one waiter (a session). It holds a
//!   de-duplicated list of the *slots* (the waiter's own numbers for its
//!   partitions) flagged since the waiter last took them, and one waker;
//! - each log keeps a [`Subscribers`] list of `(signal, slot)` pairs and
//!   calls [`Subscribers::notify`] whenever something a fetch answer
//!   reports may have changed: the high watermark (`written` or `durable`
//!   advanced), the log start offset, the last stable offset (a marker, via
//!   `PartitionLog::notify_changed`), the log's health (failed, stalled,
//!   closed) or its config.
//!
//! Notifying costs, per subscriber, one bit test and, the first time since
//! the waiter took its list, one push and one wake: O(1) per append for a
//! partition one session reads, and no allocation once the list and bit
//! set have grown to the waiter's slot count. A spurious notification only
//! makes the waiter look at a partition that has nothing new; a missed one
//! would hide news, so every place that changes what a fetch reports
//! notifies.
//!
//! Bounds: a signal's list and bit set are as large as the waiter's
//! highest slot (a session's slots are bounded by its partitions); a log's
//! list holds one entry per (live signal, slot) it was subscribed under.
//! Entries of dropped signals are `Weak` and are pruned on every notify and
//! subscribe, so a signal that goes away without unsubscribing (an evicted
//! session) leaves nothing that grows.
//!
//! Shard-local (`Rc`/`RefCell`), !Send, like the logs.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::task::{Context, Poll, Waker};

/// One waiter's set of changed slots and its waker. See the module doc.
#[derive(Debug, Default)]
pub struct ChangeSignal {
    inner: RefCell<SignalInner>,
    /// The id of the newest [`Changed`] future; older ones resolve at once
    /// (a waiter superseded by another of the same signal stops waiting).
    newest_waiter: Cell<u64>,
}

#[derive(Debug, Default)]
struct SignalInner {
    /// Bit per slot: flagged and in `changed`.
    flagged: Vec<u64>,
    /// Flagged slots, in the order they were flagged.
    changed: Vec<u32>,
    /// The waker of the newest waiter, while it waits.
    waker: Option<(u64, Waker)>,
}

impl ChangeSignal {
    pub fn new() -> Rc<ChangeSignal> {
        Rc::new(ChangeSignal::default())
    }

    /// Flags `slot` as changed and wakes the waiter (once per slot until it
    /// takes the list).
    pub fn flag(&self, slot: u32) {
        let waker = {
            let mut inner = self.inner.borrow_mut();
            let (word, bit) = (slot as usize / 64, 1u64 << (slot % 64));
            if word >= inner.flagged.len() {
                inner.flagged.resize(word + 1, 0);
            }
            if inner.flagged[word] & bit != 0 {
                return;
            }
            inner.flagged[word] |= bit;
            inner.changed.push(slot);
            inner.waker.take()
        };
        if let Some((_, w)) = waker {
            w.wake();
        }
    }

    /// Whether any slot is flagged.
    pub fn any(&self) -> bool {
        !self.inner.borrow().changed.is_empty()
    }

    /// Moves the flagged slots to `out` (in flag order) and clears them.
    pub fn take_into(&self, out: &mut Vec<u32>) {
        let mut inner = self.inner.borrow_mut();
        let SignalInner {
            flagged, changed, ..
        } = &mut *inner;
        for &slot in changed.iter() {
            flagged[slot as usize / 64] &= !(1u64 << (slot % 64));
        }
        out.append(changed);
    }

    /// Resolves once a slot is flagged, or once another waiter of this
    /// signal starts waiting (at most one waits: the newest).
    pub fn changed(&self) -> Changed<'_> {
        let id = self.newest_waiter.get().wrapping_add(1);
        self.newest_waiter.set(id);
        // The waiter this one supersedes returns now.
        let displaced = self.inner.borrow_mut().waker.take();
        if let Some((_, w)) = displaced {
            w.wake();
        }
        Changed { signal: self, id }
    }

    /// Wakers held (0 or 1).
    #[cfg(test)]
    fn wakers(&self) -> usize {
        usize::from(self.inner.borrow().waker.is_some())
    }
}

/// The future of [`ChangeSignal::changed`]. It holds at most one waker in
/// its signal, replaced in place when polled again and removed when it
/// resolves or is dropped.
pub struct Changed<'a> {
    signal: &'a ChangeSignal,
    id: u64,
}

impl Future for Changed<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let mut inner = this.signal.inner.borrow_mut();
        if !inner.changed.is_empty() || this.signal.newest_waiter.get() != this.id {
            if inner.waker.as_ref().is_some_and(|(id, _)| *id == this.id) {
                inner.waker = None;
            }
            return Poll::Ready(());
        }
        match &mut inner.waker {
            Some((id, w)) if *id == this.id => {
                if !w.will_wake(cx.waker()) {
                    w.clone_from(cx.waker());
                }
            }
            slot => *slot = Some((this.id, cx.waker().clone())),
        }
        Poll::Pending
    }
}

impl Drop for Changed<'_> {
    fn drop(&mut self) {
        let mut inner = self.signal.inner.borrow_mut();
        if inner.waker.as_ref().is_some_and(|(id, _)| *id == self.id) {
            inner.waker = None;
        }
    }
}

/// A log's subscribers: the signals (and their slots) to flag when it
/// changes. See the module doc.
#[derive(Debug, Default)]
pub struct Subscribers {
    list: RefCell<Vec<(Weak<ChangeSignal>, u32)>>,
}

impl Subscribers {
    /// Flags every live subscriber's slot; drops the dead ones.
    pub fn notify(&self) {
        let mut list = self.list.borrow_mut();
        // Flagging wakes tasks but runs none: no re-entry while borrowed.
        list.retain(|(signal, slot)| match signal.upgrade() {
            Some(signal) => {
                signal.flag(*slot);
                true
            }
            None => false,
        });
    }

    /// Adds `(signal, slot)` unless it is there already.
    pub fn subscribe(&self, signal: &Rc<ChangeSignal>, slot: u32) {
        let mut list = self.list.borrow_mut();
        list.retain(|(s, _)| s.strong_count() > 0);
        let weak = Rc::downgrade(signal);
        if !list
            .iter()
            .any(|(s, n)| *n == slot && Weak::ptr_eq(s, &weak))
        {
            list.push((weak, slot));
        }
    }

    /// Removes `(signal, slot)` if it is there.
    pub fn unsubscribe(&self, signal: &Rc<ChangeSignal>, slot: u32) {
        let weak = Rc::downgrade(signal);
        self.list
            .borrow_mut()
            .retain(|(s, n)| s.strong_count() > 0 && !(*n == slot && Weak::ptr_eq(s, &weak)));
    }

    /// Entries held (live or not yet pruned).
    pub fn len(&self) -> usize {
        self.list.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[test]
    fn flags_are_deduplicated_and_taken_in_order() {
        let s = ChangeSignal::new();
        let subs = Subscribers::default();
        subs.subscribe(&s, 70);
        subs.subscribe(&s, 70);
        assert_eq!(subs.len(), 1, "subscribing twice is once");
        s.flag(3);
        subs.notify();
        subs.notify();
        s.flag(3);
        let mut out = Vec::new();
        s.take_into(&mut out);
        assert_eq!(out, vec![3, 70]);
        assert!(!s.any());
        subs.notify();
        out.clear();
        s.take_into(&mut out);
        assert_eq!(out, vec![70], "flagged again after being taken");
        subs.unsubscribe(&s, 70);
        subs.notify();
        assert!(!s.any() && subs.is_empty());
    }

    #[test]
    fn dropped_signals_are_pruned() {
        let subs = Subscribers::default();
        for slot in 0..1000 {
            let s = ChangeSignal::new();
            subs.subscribe(&s, slot);
        }
        assert!(subs.len() <= 1, "each subscribe prunes the dead");
        subs.notify();
        assert!(subs.is_empty());
    }

    #[test]
    fn one_waker_per_waiter_and_the_newest_waits() {
        let s = ChangeSignal::new();
        let mut a = Box::pin(s.changed());
        for _ in 0..100 {
            assert!((&mut a).now_or_never().is_none());
        }
        assert_eq!(s.wakers(), 1);
        drop(a);
        assert_eq!(s.wakers(), 0, "a dropped waiter leaves no waker");
        let mut a = Box::pin(s.changed());
        assert!((&mut a).now_or_never().is_none());
        let mut b = Box::pin(s.changed());
        assert_eq!((&mut a).now_or_never(), Some(()), "superseded");
        assert!((&mut b).now_or_never().is_none());
        s.flag(1);
        assert_eq!(s.wakers(), 0, "flagging takes the waker");
        assert_eq!((&mut b).now_or_never(), Some(()));
    }
}
