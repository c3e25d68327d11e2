//! Direct (O_DIRECT) writes of the logs: each one a blocking `pwritev` on one
//! of a few threads the shard keeps for them, not an io_uring write.
//!
//! Why: on Linux up to at least 6.18, an asynchronous direct write (io_uring
//! or Linux AIO) on ext4 or XFS completes through the `dio` workqueue, in
//! `iomap_dio_complete_work` on a kworker bound to the CPU that took the
//! device's interrupt. That holds for every write, overwrites of written
//! blocks included: io_uring's caller-side completion of direct writes
//! (`IOCB_DIO_CALLER_COMP`) was switched off again in 6.6, and inline
//! completion of pure overwrites came only after 6.18. A benchmark client
//! busy on the interrupt's CPU starved that kworker for 30 s, and every
//! acks=all produce waited with it (tuning/results/write-completion-stall.md).
//! A synchronous direct write completes in the thread that issued it, extent
//! conversion and size update included; the interrupt only wakes that thread.
//!
//! The threads (`DIRECT_WRITE_THREADS` per shard) start at the shard's first
//! direct write, from the shard's own thread, so they inherit its CPU
//! affinity: a pinned shard's writes complete on its CPU. They run nothing
//! but these writes. glommio's blocking pool is no place for them: a fetch's
//! sendfile there can wait up to 30 s for a slow consumer's socket, and
//! writes queued behind it would stall every produce of the shard. They exit
//! when the shard's thread does (its thread-local sender goes).
//!
//! Reads stay on io_uring: iomap always completes direct reads inline.
//!
//! A write takes several buffers (`pwritev`): the writer hands over the
//! staging chunks that follow on one another in the file as one write, so
//! the device gets one request and the VM one doorbell for them, not one per
//! chunk (a 1 MiB batch is staged in six or seven chunks).

use super::iobuf::IoBuf;
use futures::channel::oneshot;
use glommio::io::DmaFile;
use std::cell::RefCell;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::{mpsc, Arc, Mutex};

/// Direct-write threads per shard: writes of one shard that can be at the
/// device at once (more wait in their queue).
pub const DIRECT_WRITE_THREADS: usize = 4;

/// One write for a thread: the `(address, length)` pieces in `iov`, one
/// after another, to `fd` from `pos`. (Addresses as integers: a job crosses
/// threads, and `libc::iovec` holds a raw pointer, which is not `Send`.)
struct Job {
    fd: i32,
    iov: Vec<(usize, usize)>,
    pos: u64,
    done: oneshot::Sender<std::io::Result<()>>,
}

thread_local! {
    /// The queue of this shard's direct-write threads, once started.
    static QUEUE: RefCell<Option<mpsc::Sender<Job>>> = const { RefCell::new(None) };
}

/// The queue of the calling shard's threads, starting them on first use.
fn queue() -> std::io::Result<mpsc::Sender<Job>> {
    QUEUE.with(|q| {
        let mut q = q.borrow_mut();
        if let Some(tx) = &*q {
            return Ok(tx.clone());
        }
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let shard = std::thread::current().name().unwrap_or("fjord").to_string();
        let mut started = 0;
        let mut error = None;
        for i in 0..DIRECT_WRITE_THREADS {
            let rx = rx.clone();
            match std::thread::Builder::new()
                .name(format!("{shard}-dw{i}"))
                .spawn(move || run(&rx))
            {
                Ok(_) => started += 1,
                Err(e) => error = Some(e),
            }
        }
        if started == 0 {
            return Err(error.unwrap_or_else(|| std::io::Error::other("no direct-write thread")));
        }
        *q = Some(tx.clone());
        Ok(tx)
    })
}

/// A direct-write thread: takes jobs until the shard's sender is gone.
fn run(rx: &Mutex<mpsc::Receiver<Job>>) {
    loop {
        let job = match rx.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        let Ok(job) = job else { return };
        let r = pwritev_all(job.fd, &job.iov, job.pos);
        // The writer may have given up on this write (see `write`).
        let _ = job.done.send(r);
    }
}

/// Writes `bufs`, one after another, at `pos` of the O_DIRECT file `file`
/// with one `pwritev` on one of the shard's direct-write threads; returns
/// the bytes written. The buffers are dropped (back to their arena) once no
/// thread uses them.
///
/// If the future is dropped while the write is queued or running (the
/// writer of a failed log leaving early, or the executor shutting down),
/// the file and the buffers are leaked for good, descriptor included: the
/// thread may still be writing to the one and reading the others. The
/// buffers' arena (the shard's staging memory) then stays mapped for good
/// too, as the buffers hold it.
pub(crate) async fn write(file: Rc<DmaFile>, bufs: Vec<IoBuf>, pos: u64) -> std::io::Result<usize> {
    /// Keeps `file` and `bufs` alive, and leaks them if dropped early.
    struct Pinned(Option<(Rc<DmaFile>, Vec<IoBuf>)>);
    impl Drop for Pinned {
        fn drop(&mut self) {
            if let Some(held) = self.0.take() {
                std::mem::forget(held);
            }
        }
    }
    let fd = file.as_raw_fd();
    let iov: Vec<(usize, usize)> = bufs
        .iter()
        .map(|b| (b.as_ptr() as usize, b.len()))
        .collect();
    let len = iov.iter().map(|&(_, n)| n).sum();
    let mut pinned = Pinned(Some((file, bufs)));
    let (done, result) = oneshot::channel();
    let job = Job { fd, iov, pos, done };
    // A job that was not queued, or that a thread dropped without an
    // answer, is no longer used by any thread.
    let r = match queue().and_then(|q| {
        q.send(job)
            .map_err(|_| std::io::Error::other("the direct-write threads have exited"))
    }) {
        Ok(()) => result.await.unwrap_or_else(|_| {
            Err(std::io::Error::other(
                "a direct-write thread exited before answering",
            ))
        }),
        Err(e) => Err(e),
    };
    // Nothing uses the file and buffer any more: free them.
    drop(pinned.0.take());
    r.map(|()| len)
}

/// `pwritev` of every piece of `iov` to `fd` from `pos`, continuing after
/// short writes.
pub(super) fn pwritev_all(fd: i32, iov: &[(usize, usize)], pos: u64) -> std::io::Result<()> {
    let len: usize = iov.iter().map(|&(_, n)| n).sum();
    let mut done = 0usize;
    let mut rest: Vec<libc::iovec> = iov
        .iter()
        .map(|&(addr, n)| libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: n,
        })
        .collect();
    let mut first = 0usize;
    while done < len {
        let pieces = &rest[first..];
        // SAFETY: `write` keeps every buffer in `iov` and the descriptor
        // alive and unchanged until this returns; `pieces` are parts of them.
        let n = unsafe {
            libc::pwritev(
                fd,
                pieces.as_ptr(),
                pieces.len().min(IOV_MAX) as libc::c_int,
                (pos + done as u64) as libc::off_t,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(std::io::Error::new(
                e.kind(),
                format!("direct write of {len} bytes at {pos}: {e}"),
            ));
        }
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::WriteZero,
                format!("short direct write: {done} of {len} bytes at {pos}"),
            ));
        }
        done += n as usize;
        first = skip_written(&mut rest, first, n as usize);
    }
    Ok(())
}

/// After a write of `n` bytes from `pieces[first..]`: the index of the
/// first piece not written whole, that piece trimmed to its unwritten part.
fn skip_written(pieces: &mut [libc::iovec], mut first: usize, mut n: usize) -> usize {
    while n > 0 && first < pieces.len() {
        let piece = &mut pieces[first];
        if n < piece.iov_len {
            piece.iov_base = (piece.iov_base as usize + n) as *mut libc::c_void;
            piece.iov_len -= n;
            return first;
        }
        n -= piece.iov_len;
        first += 1;
    }
    first
}

/// Pieces one `pwritev` takes at most (Linux's `UIO_MAXIOV`).
const IOV_MAX: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::iobuf::IoArena;
    use glommio::io::OpenOptions;
    use std::future::Future;

    /// Runs `body` on a glommio executor with an arena and a new O_DIRECT
    /// file, closes the file, and returns what the file then holds.
    fn on_new_file<F, Fut>(body: F) -> Vec<u8>
    where
        F: FnOnce(Rc<IoArena>, Rc<DmaFile>) -> Fut + Send + 'static,
        Fut: Future<Output = ()>,
    {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let p = path.clone();
        crate::runtime::run_test_executor(move || async move {
            let f = Rc::new(
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .dma_open(&p)
                    .await
                    .unwrap(),
            );
            body(IoArena::new(), f.clone()).await;
            f.close_rc().await.unwrap();
        });
        std::fs::read(&path).unwrap()
    }

    /// Writes land where asked and read back; a misaligned direct write
    /// fails with an error (EINVAL), not a panic; several writes in flight
    /// at once all complete.
    #[test]
    fn writes_complete_and_errors_come_back() {
        let bytes = on_new_file(|arena, f| async move {
            let writes = (0..8u8).map(|i| {
                let mut buf = arena.alloc(4096);
                buf.as_bytes_mut().fill(i + 1);
                write(f.clone(), vec![buf], i as u64 * 4096)
            });
            for r in futures::future::join_all(writes).await {
                assert_eq!(r.unwrap(), 4096);
            }
            let buf = arena.alloc(4096);
            let e = write(f.clone(), vec![buf], 100).await.unwrap_err();
            assert_eq!(e.raw_os_error(), None, "wrapped with its position");
            assert!(e.to_string().contains("at 100"), "{e}");
        });
        assert_eq!(bytes.len(), 8 * 4096);
        for (i, page) in bytes.chunks(4096).enumerate() {
            assert!(page.iter().all(|&b| b == i as u8 + 1), "page {i}");
        }
    }

    /// Several buffers of different sizes land one after another, as one
    /// write, and the returned length counts them all.
    #[test]
    fn buffers_of_one_write_land_in_order() {
        const SIZES: [usize; 4] = [8192, 4096, 16384, 4096];
        let bytes = on_new_file(|arena, f| async move {
            let bufs = SIZES
                .iter()
                .enumerate()
                .map(|(i, &n)| {
                    let mut buf = arena.alloc(n);
                    buf.as_bytes_mut().fill(i as u8 + 1);
                    buf
                })
                .collect();
            assert_eq!(write(f, bufs, 4096).await.unwrap(), 32768);
        });
        let mut expect = vec![0u8; 4096];
        for (i, n) in SIZES.iter().enumerate() {
            expect.extend(std::iter::repeat_n(i as u8 + 1, *n));
        }
        assert_eq!(bytes, expect);
    }

    /// After a short write the next `pwritev` starts at the first unwritten
    /// byte: whole pieces are skipped, a partly written one is trimmed.
    #[test]
    fn short_writes_continue_where_they_stopped() {
        let piece = |base: usize, len: usize| libc::iovec {
            iov_base: base as *mut libc::c_void,
            iov_len: len,
        };
        let view = |p: &[libc::iovec]| -> Vec<(usize, usize)> {
            p.iter().map(|v| (v.iov_base as usize, v.iov_len)).collect()
        };
        let mut pieces = [piece(0x1000, 100), piece(0x2000, 50), piece(0x3000, 10)];
        assert_eq!(skip_written(&mut pieces, 0, 0), 0);
        assert_eq!(skip_written(&mut pieces, 0, 30), 0);
        assert_eq!(view(&pieces)[0], (0x1000 + 30, 70));
        assert_eq!(skip_written(&mut pieces, 0, 70), 1);
        assert_eq!(skip_written(&mut pieces, 1, 55), 2);
        assert_eq!(view(&pieces)[2], (0x3000 + 5, 5));
        assert_eq!(skip_written(&mut pieces, 2, 5), 3);
    }
}
