//! The group-commit syncer: a log's fdatasyncs, and the background syncs of
//! the segments a page-cache log seals.
//!
//! Syncer task (group commit): fdatasyncs the file last written and moves
//! `durable` to the `written` offset it saw before the call, so one
//! fdatasync serves every append staged before it. Up to
//! `SYNCS_IN_FLIGHT_MAX` run at once: appends that arrive while one runs
//! get the next at once instead of waiting for it to end. Invariant that
//! makes one file enough: a segment is sealed (truncated + fdatasync'ed)
//! before the writer touches the next one. A page-cache log is the
//! exception: its sealed segment may still hold dirty pages (up to
//! `WRITEBACK_KICK_BYTES` not yet started, and whatever write-back has not
//! finished), so its fdatasync runs in a task of its own while the writer
//! goes on to the next segment, whose appends need not wait for it;
//! `durable` and the recovery point move past it only when it and the
//! seals before it are done, and the syncer waits for them before its own
//! fdatasync.
//!
//! Write-back errors: Linux reports a failed write-back once to each open
//! file description (errseq: the first fdatasync through a description
//! after the error gets it, later ones on that description do not). Two
//! fdatasyncs running at once on one description could therefore split it:
//! the one that returns success may be the one whose pages failed, and it
//! would move `durable` (the HW under `--fsync-acks`) past lost data. So no
//! two fdatasyncs ever share a description: seals and `close` sync on the
//! write descriptor, and each fdatasync of the syncer runs on a description
//! of its own (`SyncFiles`: `SYNCS_IN_FLIGHT_MAX` read-only `open`s of the
//! segment file, taken and given back). They are opened together with the
//! write descriptor, before anything is written through it, so the error
//! of any write-back of the file's data comes after every description's
//! cursor and each of them reports it, whichever fdatasync's completion is
//! handled first. (Opened later, one could miss an error another
//! description had reported but whose failure the log had not yet seen.)
//! Once one has reported it, the log has failed and `durable` stays where
//! it is.
//!
//! What this module owns: the [`Syncer`] (what is wanted synced, the
//! fdatasyncs running, the descriptions of the file last written) and the
//! [`Seals`] of a page-cache log still syncing. Both live on the log's
//! shard; the syncer task and each fdatasync's task hold an
//! `Rc<PartitionLog>`.

use super::partition::{io_err, PartitionLog};
use super::segment::Segment;
use super::storage;
use super::watch::OffsetWatch;
use super::{now_ms, LogError, SYNCS_IN_FLIGHT_MAX};
use glommio::io::DmaFile;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::path::Path;
use std::rc::Rc;

/// The open file descriptions of one segment file that the group-commit
/// syncer fdatasyncs, one for each of its fdatasyncs that may run at once
/// on that file; no other code syncs on them (see the module doc, write-back
/// errors). Opened with the segment's write descriptor, before anything is
/// written to the file through it, so every write-back error of the
/// file's data is still unseen by them when it happens. Read-only: nothing
/// is ever written through them.
pub(super) struct SyncFiles {
    /// Descriptions no fdatasync is running on.
    idle: RefCell<Vec<Rc<DmaFile>>>,
}

impl SyncFiles {
    pub(super) async fn open(path: &Path) -> Result<Rc<SyncFiles>, LogError> {
        let mut idle = Vec::with_capacity(SYNCS_IN_FLIGHT_MAX);
        for _ in 0..SYNCS_IN_FLIGHT_MAX {
            // A new open(2) each: a description of its own, never a dup.
            idle.push(Rc::new(DmaFile::open(path).await.map_err(io_err)?));
        }
        Ok(Rc::new(SyncFiles {
            idle: RefCell::new(idle),
        }))
    }

    /// A description no fdatasync runs on. The syncer runs fewer than
    /// `SYNCS_IN_FLIGHT_MAX` fdatasyncs when it asks, so one is idle.
    fn take(&self) -> Option<Rc<DmaFile>> {
        self.idle.borrow_mut().pop()
    }

    fn give_back(&self, f: Rc<DmaFile>) {
        self.idle.borrow_mut().push(f);
    }
}

/// The group-commit syncer's state.
pub(super) struct Syncer {
    /// Everything before this offset is wanted durable.
    wanted: Cell<i64>,
    running: Cell<bool>,
    /// The highest `written` offset an fdatasync has been started for.
    started_to: Cell<i64>,
    /// The syncer's fdatasyncs still running, and the most that ever ran
    /// at once.
    in_flight: Cell<usize>,
    in_flight_peak: Cell<usize>,
    /// Counts what the syncer waits for while it has nothing to start: a
    /// higher `wanted`, or one of its fdatasyncs ending.
    events: OffsetWatch,
    /// The syncer's descriptions of the file last written.
    last_written: RefCell<Rc<SyncFiles>>,
    /// fdatasyncs done since open, and when the last one ended.
    fsyncs: Cell<u64>,
    last_flush_ms: Cell<i64>,
}

impl Syncer {
    /// A syncer of a log whose every offset before `log_end` is durable and
    /// whose last file written is the one of `last_written`.
    pub(super) fn new(log_end: i64, last_written: Rc<SyncFiles>, now_ms: i64) -> Syncer {
        Syncer {
            wanted: Cell::new(log_end),
            running: Cell::new(false),
            started_to: Cell::new(log_end),
            in_flight: Cell::new(0),
            in_flight_peak: Cell::new(0),
            events: OffsetWatch::new(0),
            last_written: RefCell::new(last_written),
            fsyncs: Cell::new(0),
            last_flush_ms: Cell::new(now_ms),
        }
    }

    /// The file of `files` is the last one written.
    pub(super) fn set_last_written(&self, files: Rc<SyncFiles>) {
        *self.last_written.borrow_mut() = files;
    }

    /// Wants everything up to `offset` durable.
    fn want(&self, offset: i64) {
        if offset + 1 > self.wanted.get() {
            self.wanted.set(offset + 1);
            self.event();
        }
    }

    /// Something the syncer may wait for happened.
    fn event(&self) {
        self.events.advance(self.events.get() + 1);
    }

    /// Its fdatasyncs still running.
    pub(super) fn in_flight(&self) -> usize {
        self.in_flight.get()
    }

    pub(super) fn fsyncs(&self) -> u64 {
        self.fsyncs.get()
    }

    pub(super) fn in_flight_peak(&self) -> usize {
        self.in_flight_peak.get()
    }

    pub(super) fn last_flush_ms(&self) -> i64 {
        self.last_flush_ms.get()
    }

    /// The syncer task runs.
    pub(super) fn running(&self) -> bool {
        self.running.get()
    }

    /// The log was truncated to end at `end` (nothing in flight): nothing
    /// past it is wanted or being synced.
    pub(super) fn truncate_to(&self, end: i64, last_written: Rc<SyncFiles>) {
        self.wanted.set(self.wanted.get().min(end));
        self.started_to.set(self.started_to.get().min(end));
        *self.last_written.borrow_mut() = last_written;
    }

    /// Wakes the syncer's waits (the log failed).
    pub(super) fn wake_all(&self) {
        self.events.wake_all();
    }

    /// The log closed: the syncer's waits end.
    pub(super) fn close(&self) {
        self.events.close();
    }
}

/// A sealed segment being fdatasynced in the background (page-cache logs).
struct SealSync {
    /// Numbers the background seals of a log from 1, in seal order.
    seq: i64,
    base: i64,
    /// Its next offset: `durable` moves here once it (and every segment
    /// sealed before it) is synced.
    end: i64,
    done: bool,
}

/// The sealed segments of a page-cache log whose background fdatasync has
/// not yet counted.
pub(super) struct Seals {
    /// Oldest first.
    sealing: RefCell<VecDeque<SealSync>>,
    /// `seq` of the last background seal started, and of the last one whose
    /// fdatasync (and every earlier one's) is done.
    started: Cell<i64>,
    synced: OffsetWatch,
}

impl Seals {
    pub(super) fn new() -> Seals {
        Seals {
            sealing: RefCell::new(VecDeque::new()),
            started: Cell::new(0),
            synced: OffsetWatch::new(0),
        }
    }

    /// A background seal of the segment `[base, end)` starts; its `seq`.
    fn start(&self, base: i64, end: i64) -> i64 {
        let seq = self.started.get() + 1;
        self.started.set(seq);
        self.sealing.borrow_mut().push_back(SealSync {
            seq,
            base,
            end,
            done: false,
        });
        seq
    }

    /// Background seal `seq` is synced. Returns the last seal now synced
    /// with every one before it, and its segment's end, if that moved.
    fn finish(&self, seq: i64) -> Option<(i64, i64)> {
        let mut sealing = self.sealing.borrow_mut();
        if let Some(s) = sealing.iter_mut().find(|s| s.seq == seq) {
            s.done = true;
        }
        let mut synced = None;
        while sealing.front().is_some_and(|s| s.done) {
            synced = sealing.pop_front().map(|s| (s.seq, s.end));
        }
        synced
    }

    /// Base offset of the oldest sealed segment still syncing.
    pub(super) fn oldest_base(&self) -> Option<i64> {
        self.sealing.borrow().front().map(|s| s.base)
    }

    /// A background seal is still syncing (or not yet counted).
    pub(super) fn running(&self) -> bool {
        !self.sealing.borrow().is_empty()
    }

    /// Every background seal started is synced.
    fn all_synced(&self) -> bool {
        self.synced.get() >= self.started.get()
    }

    /// Wakes the waits for seals (the log failed).
    pub(super) fn wake_all(&self) {
        self.synced.wake_all();
    }

    /// The log closed: the waits for seals end.
    pub(super) fn close(&self) {
        self.synced.close();
    }
}

impl PartitionLog {
    /// Wants everything up to `offset` durable, starting the syncer if it
    /// does not run and that is not durable yet.
    pub(super) fn request_sync(&self, offset: i64) {
        self.syncer.want(offset);
        if self.syncer.running.get() || self.durable.get() >= self.syncer.wanted.get() {
            return;
        }
        let Some(me) = self.self_weak.upgrade() else {
            return;
        };
        self.syncer.running.set(true);
        glommio::spawn_local(async move { me.syncer_loop().await }).detach();
    }

    /// Starts fdatasyncs until everything wanted is covered by one, at most
    /// `SYNCS_IN_FLIGHT_MAX` at a time, each on a description of its own
    /// (`SyncFiles`), and ends when they are done. An append that arrives
    /// while an fdatasync runs gets one of its own at once, instead of
    /// waiting for that one to end first.
    async fn syncer_loop(self: Rc<Self>) {
        loop {
            if self.health.failed() {
                break;
            }
            let s = &self.syncer;
            let want = s.wanted.get();
            let covered = self.durable.get().max(s.started_to.get()) >= want;
            if covered || s.in_flight.get() >= SYNCS_IN_FLIGHT_MAX {
                if covered && s.in_flight.get() == 0 {
                    break;
                }
                let seen = s.events.get();
                if !s.events.wait_above(seen, || self.health.failed()).await {
                    break;
                }
                continue;
            }
            if !self.ready_to_sync(want).await {
                break;
            }
            self.start_sync();
        }
        self.syncer.running.set(false);
    }

    /// Resolves once an fdatasync for `want` can start: `written` has
    /// reached it and no sealed segment is still syncing (false if the log
    /// failed first).
    async fn ready_to_sync(&self, want: i64) -> bool {
        if self.written.get() < want {
            let ok = self
                .written
                .wait_above(want - 1, || self.health.failed())
                .await;
            if !ok {
                return false;
            }
        }
        // The one file synced below is the last one written: segments
        // sealed before it must have been synced on their own first.
        if !self.sealed_synced().await {
            return false;
        }
        // `written` is in the last file written; every segment before
        // it must be synced on its own (nothing awaited since the check).
        debug_assert!(self.seals.all_synced());
        true
    }

    /// Starts an fdatasync of the last file written, in a task of its own,
    /// for the `written` offset now.
    fn start_sync(self: &Rc<Self>) {
        let s = &self.syncer;
        let w = self.written.get();
        let files = s.last_written.borrow().clone();
        s.started_to.set(w);
        let running = s.in_flight.get() + 1;
        s.in_flight.set(running);
        s.in_flight_peak.set(s.in_flight_peak.get().max(running));
        let me = self.clone();
        glommio::spawn_local(async move {
            me.sync_once(&files, w).await;
            me.syncer.in_flight.set(me.syncer.in_flight.get() - 1);
            me.syncer.event();
        })
        .detach();
    }

    /// One fdatasync of the syncer on a description of `files` no other
    /// fdatasync runs on; moves `durable` to `w`, the `written` offset seen
    /// before it started. fdatasyncs that run at once can end in any order:
    /// each covers everything written before it started (the kernel's
    /// fdatasync also waits for write-back an earlier one began), and
    /// `durable` only rises.
    async fn sync_once(&self, files: &SyncFiles, w: i64) {
        let Some(file) = files.take() else {
            // The syncer starts fewer fdatasyncs than a file has
            // descriptions: a bug. Failing beats sharing a description.
            debug_assert!(false, "no idle sync description");
            return self.fail(&"no idle sync description");
        };
        let started = crate::clock::monotonic();
        let r = storage::fdatasync(&file).await;
        let took = crate::clock::monotonic().saturating_duration_since(started);
        files.give_back(file);
        if let Err(e) = r {
            return self.fail(&e);
        }
        // A seal's or another sync's failure stops the log; nothing moves
        // `durable` after that.
        if self.health.failed() {
            return;
        }
        self.syncer.fsyncs.set(self.syncer.fsyncs.get() + 1);
        crate::metrics::record_fsync(took, (w - self.durable.get()).max(0) as u64);
        self.syncer.last_flush_ms.set(now_ms());
        self.durable.advance(w);
        self.changes.notify();
    }

    /// fdatasyncs a sealed segment's file in a task of its own; `durable`
    /// (and the recovery point) move past it only when it and every segment
    /// sealed before it are synced.
    pub(super) fn sync_sealed_in_background(&self, file: Rc<DmaFile>, seg: &Rc<Segment>) {
        let seq = self.seals.start(seg.base_offset, seg.next_offset.get());
        let Some(me) = self.self_weak.upgrade() else {
            return;
        };
        glommio::spawn_local(async move {
            if let Err(e) = storage::fdatasync(&file).await {
                me.fail(&e);
                // Over: no longer running (`io_running`, which `wait_idle`
                // and a deletion wait on), and nothing moves `durable`.
                me.seals.finish(seq);
                return;
            }
            // Another fdatasync (the syncer's, on a description of its own)
            // may have found a failure first: nothing moves `durable` then.
            if me.health.failed() {
                me.seals.finish(seq);
                return;
            }
            if let Some((seq, end)) = me.seals.finish(seq) {
                me.durable.advance(end);
                me.changes.notify();
                me.seals.synced.advance(seq);
            }
        })
        .detach();
    }

    /// Resolves when no sealed segment is still syncing in the background
    /// (false if the log failed first), counting the seals that start while
    /// it waits: the syncer reads `written` right after, and that may already
    /// be in a segment after one sealed meanwhile (a page-cache log's writer
    /// does not wait for its seals). It waits on the seals' own count, not on
    /// `durable`: a direct seal after a mode switch can move `durable` past
    /// one still syncing.
    pub(super) async fn sealed_synced(&self) -> bool {
        loop {
            let last = self.seals.started.get();
            if self.seals.synced.get() >= last {
                return true;
            }
            let ok = self
                .seals
                .synced
                .wait_above(last - 1, || self.health.failed())
                .await;
            if !ok {
                return false;
            }
        }
    }
}
