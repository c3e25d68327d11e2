//! glommio set-up shared by every shard: executor builders, the locked-memory
//! budget, and the direct-I/O probe.
//!
//! This module owns no runtime state; it encodes three facts measured with a
//! prototype on the target machines:
//! - glommio pins (mlocks) 3 × `io_memory` per executor, so the number of
//!   shards times that must fit `RLIMIT_MEMLOCK`. We check it before starting
//!   any executor and fail with a message that says how to raise the limit,
//!   or shrink `io_memory` to fit ([`io_memory_for_budget`]).
//! - glommio 0.9 decides whether a block device supports iopoll from the
//!   first `DmaFile` a thread opens on it, by reading its first block. If that
//!   file is new and empty the probe read fails and every later DMA read on
//!   that device fails with EOPNOTSUPP. [`probe_dma`] opens a small non-empty
//!   file first, on each executor, before any log is opened.
//! - Tests must build executors with [`IO_MEMORY_TEST_BYTES`] and unpinned.

use futures::task::AtomicWaker;
use glommio::{LocalExecutorBuilder, Placement};
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

/// `io_memory` for executors built by tests: 1 MiB (3 MiB locked per executor).
pub const IO_MEMORY_TEST_BYTES: usize = 1 << 20;
/// Alias kept for the name used in the design notes.
pub const IO_MEMORY_BYTES_TEST: usize = IO_MEMORY_TEST_BYTES;
/// Default `io_memory` for `serve` when the memlock budget allows it: 8 MiB.
pub const IO_MEMORY_SERVE_MAX_BYTES: usize = 8 << 20;
/// Smallest `io_memory` worth running with; below this glommio falls back to
/// heap buffers for almost every I/O: 256 KiB.
pub const IO_MEMORY_MIN_BYTES: usize = 256 << 10;
/// glommio locks this many times `io_memory` per executor (its rings' buffers).
pub const LOCKED_COPIES_PER_EXECUTOR: usize = 3;
/// Name of the probe file [`probe_dma`] creates in the data directory.
pub const DMA_PROBE_FILE_NAME: &str = ".fjord-dma-probe";
/// Size of the probe file: one 4 KiB block, enough for any logical block size.
pub const DMA_PROBE_FILE_BYTES: usize = 4096;

/// Executor builder for shard `shard`: named `shard-<k>`, with `io_memory`,
/// pinned to `cpu` if given (never pin in tests).
pub fn executor_builder(
    shard: usize,
    cpu: Option<usize>,
    io_memory_bytes: usize,
) -> LocalExecutorBuilder {
    let placement = match cpu {
        Some(c) => Placement::Fixed(c),
        None => Placement::Unbound,
    };
    LocalExecutorBuilder::new(placement)
        .name(&format!("shard-{shard}"))
        .io_memory(io_memory_bytes)
}

/// Runs `f` to completion on a fresh unpinned executor built for tests
/// (`IO_MEMORY_TEST_BYTES`), for unit tests that need glommio's I/O.
#[cfg(test)]
pub(crate) fn run_test_executor<Fut>(f: impl FnOnce() -> Fut + Send + 'static)
where
    Fut: std::future::Future<Output = ()> + 'static,
{
    executor_builder(0, None, IO_MEMORY_TEST_BYTES)
        .spawn(f)
        .expect("a test executor starts")
        .join()
        .expect("the test executor's task completes");
}

/// The current soft RLIMIT_MEMLOCK in bytes (`None` = unlimited).
pub fn memlock_limit_bytes() -> Option<u64> {
    rlimit(libc::RLIMIT_MEMLOCK)
        .filter(|rl| rl.rlim_cur != libc::RLIM_INFINITY)
        .map(|rl| rl.rlim_cur)
}

/// The soft and hard limits of `resource` (`None` if they cannot be read).
fn rlimit(resource: libc::__rlimit_resource_t) -> Option<libc::rlimit> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass and nothing else.
    (unsafe { libc::getrlimit(resource, &mut rl) } == 0).then_some(rl)
}

/// Raises the soft RLIMIT_NOFILE to the hard limit and returns the soft
/// limit now in force (`None` if it could not be read). Every partition
/// holds descriptors: its active segment's write descriptor and the
/// group-commit syncer's `SYNCS_IN_FLIGHT_MAX` descriptions of it, plus one
/// per segment being read, and every connection one; the usual soft
/// default of 1,024 is reached by a few hundred partitions.
pub fn raise_nofile_limit() -> Option<u64> {
    let rl = rlimit(libc::RLIMIT_NOFILE)?;
    if rl.rlim_cur < rl.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: rl.rlim_max,
            rlim_max: rl.rlim_max,
        };
        // SAFETY: setrlimit only reads the struct passed.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return Some(rl.rlim_max);
        }
    }
    Some(rl.rlim_cur)
}

/// Locked bytes `shards` executors need with `io_memory_bytes` each.
pub fn memlock_needed_bytes(shards: usize, io_memory_bytes: usize) -> u64 {
    shards as u64 * LOCKED_COPIES_PER_EXECUTOR as u64 * io_memory_bytes as u64
}

/// Checks RLIMIT_MEMLOCK against `shards × 3 × io_memory`.
pub fn check_memlock(shards: usize, io_memory_bytes: usize) -> Result<(), String> {
    let needed = memlock_needed_bytes(shards, io_memory_bytes);
    match memlock_limit_bytes() {
        None => Ok(()),
        Some(limit) if limit >= needed => Ok(()),
        Some(limit) => Err(format!(
            "RLIMIT_MEMLOCK is {limit} bytes but {shards} shard(s) with io_memory {io_memory_bytes} \
             bytes lock {needed} bytes (glommio locks {LOCKED_COPIES_PER_EXECUTOR} x io_memory per \
             shard). Raise it with `ulimit -l unlimited` (or `ulimit -l {kib}` KiB) in the shell, \
             `LimitMEMLOCK=infinity` in the systemd unit, `--ulimit memlock=-1` for docker, or \
             grant CAP_IPC_LOCK; or run with fewer --cores or a smaller io_memory.",
            kib = needed.div_ceil(1024)
        )),
    }
}

/// The largest `io_memory` (capped at `max`, a multiple of 64 KiB) that fits
/// the memlock budget for `shards`; at least [`IO_MEMORY_MIN_BYTES`] even if
/// that does not fit (then [`check_memlock`] reports the problem).
pub fn io_memory_for_budget(shards: usize, max: usize) -> usize {
    const GRANULE_BYTES: usize = 64 << 10;
    let shards = shards.max(1);
    let fit = match memlock_limit_bytes() {
        None => max,
        Some(limit) => {
            // Keep a quarter of the budget for other locked memory (the
            // allocator, the rest of glommio).
            let usable = limit - limit / 4;
            (usable / (shards as u64 * LOCKED_COPIES_PER_EXECUTOR as u64)) as usize
        }
    };
    let v = fit.min(max) / GRANULE_BYTES * GRANULE_BYTES;
    v.max(IO_MEMORY_MIN_BYTES.min(max))
}

/// Opens a small non-empty probe file in `dir` with `DmaFile` (creating it
/// with ordinary I/O first), so that glommio's iopoll probe reads real data.
/// Call first thing on each executor, before any log file is opened.
pub async fn probe_dma(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(DMA_PROBE_FILE_NAME);
    let len_ok = std::fs::metadata(&path)
        .map(|m| m.len() >= DMA_PROBE_FILE_BYTES as u64)
        .unwrap_or(false);
    if !len_ok {
        std::fs::write(&path, vec![0u8; DMA_PROBE_FILE_BYTES])?;
    }
    let file = glommio::io::DmaFile::open(&path)
        .await
        .map_err(std::io::Error::from)?;
    let read = file
        .read_at_aligned(0, DMA_PROBE_FILE_BYTES)
        .await
        .map_err(std::io::Error::from);
    let _ = file.close().await;
    read.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After the raise, the soft open-file limit is the hard one.
    #[test]
    fn nofile_soft_limit_is_raised_to_the_hard_limit() {
        let soft = raise_nofile_limit().expect("RLIMIT_NOFILE is readable");
        let rl = rlimit(libc::RLIMIT_NOFILE).expect("RLIMIT_NOFILE is readable");
        assert_eq!(rl.rlim_cur, rl.rlim_max);
        assert_eq!(soft, rl.rlim_cur);
    }

    #[test]
    fn budget_fits_check() {
        let io = io_memory_for_budget(2, IO_MEMORY_SERVE_MAX_BYTES);
        assert!(io >= IO_MEMORY_MIN_BYTES.min(IO_MEMORY_SERVE_MAX_BYTES));
        assert!(io <= IO_MEMORY_SERVE_MAX_BYTES);
        if memlock_limit_bytes().is_some_and(|l| l >= 8 << 20) {
            assert!(check_memlock(2, io).is_ok());
        }
    }

    #[test]
    fn over_budget_message_says_how_to_raise() {
        if let Some(limit) = memlock_limit_bytes() {
            let err = check_memlock(1, limit as usize).expect_err("3x limit cannot fit");
            assert!(err.contains("ulimit -l"));
            assert!(err.contains("LimitMEMLOCK=infinity"));
            assert!(err.contains("CAP_IPC_LOCK"));
        }
    }

    #[test]
    fn probe_then_dma_read_of_new_file_works() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let ex = executor_builder(0, None, IO_MEMORY_TEST_BYTES)
            .make()
            .unwrap();
        ex.run(async move {
            probe_dma(&path).await.unwrap();
            let f = glommio::io::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .dma_open(path.join("x"))
                .await
                .unwrap();
            let mut buf = f.alloc_dma_buffer(4096);
            buf.as_bytes_mut().fill(7);
            f.write_at(buf, 0).await.unwrap();
            let r = f.read_at(0, 10).await.unwrap();
            assert_eq!(&r[..], &[7u8; 10]);
            f.close().await.unwrap();
        });
    }
}

/// Polls a future with one waker of its own that forwards to the task's, so
/// that however many wakers the future hands out (one per partition a fetch
/// waits on), the task's glommio reference count grows by one. glommio keeps
/// a task's waker count in an `i16` and panics the shard past `i16::MAX`, so
/// a future that clones its waker once per item of a client's request must
/// be polled through this.
pub struct OneWaker<F> {
    inner: F,
    forward: Arc<ForwardWake>,
}

/// The forwarding waker: it holds the task's waker (one clone) and wakes it.
struct ForwardWake(AtomicWaker);

impl Wake for ForwardWake {
    fn wake(self: Arc<Self>) {
        self.0.wake();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.wake();
    }
}

impl<F: Future + Unpin> OneWaker<F> {
    pub fn new(inner: F) -> Self {
        OneWaker {
            inner,
            forward: Arc::new(ForwardWake(AtomicWaker::new())),
        }
    }
}

impl<F: Future + Unpin> Future for OneWaker<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        this.forward.0.register(cx.waker());
        let waker = Waker::from(this.forward.clone());
        Pin::new(&mut this.inner).poll(&mut Context::from_waker(&waker))
    }
}

/// `fut`'s output, or `None` if `deadline` passes first (`fut` is dropped).
pub async fn within<F: std::future::Future>(
    deadline: std::time::Instant,
    fut: F,
) -> Option<F::Output> {
    use futures::future::{self, Either};
    use futures::FutureExt;
    let mut fut = Box::pin(fut);
    if let Some(out) = (&mut fut).now_or_never() {
        return Some(out);
    }
    let left = deadline.saturating_duration_since(crate::clock::monotonic());
    match future::select(fut, Box::pin(glommio::timer::sleep(left))).await {
        Either::Left((out, _)) => Some(out),
        Either::Right(_) => None,
    }
}

#[cfg(test)]
mod one_waker_tests {
    use super::*;
    use crate::log::watch::OffsetWatch;
    use futures::FutureExt;

    /// More waits than glommio's `i16` waker count allows one task: polled
    /// through `OneWaker` the task holds one waker clone, so it neither
    /// panics nor leaves a waker behind once the timer ends the wait.
    #[test]
    fn many_waits_through_one_waker_do_not_overflow_the_task() {
        run_test_executor(|| async {
            const WAITS: usize = 40_000;
            let watches: Vec<OffsetWatch> = (0..WAITS).map(|_| OffsetWatch::new(0)).collect();
            let mut waits: Vec<futures::future::LocalBoxFuture<'_, ()>> = watches
                .iter()
                .map(|w| w.wait_above(0, || false).map(|_| ()).boxed_local())
                .collect();
            waits.push(glommio::timer::sleep(std::time::Duration::from_millis(20)).boxed_local());
            let (_, index, rest) = OneWaker::new(futures::future::select_all(waits)).await;
            assert_eq!(index, WAITS, "the timer ends the wait");
            drop(rest);
            assert!(watches.iter().all(|w| w.waiters_len() == 0));
        });
    }
}
