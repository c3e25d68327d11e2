//! Direct (O_DIRECT) writes of the logs: each one a blocking `pwrite` on one
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

/// One write for a thread: `len` bytes at `addr` to `fd` at `pos`.
struct Job {
    fd: i32,
    addr: usize,
    len: usize,
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
        let r = pwrite_all(job.fd, job.addr, job.len, job.pos);
        // The writer may have given up on this write (see `write`).
        let _ = job.done.send(r);
    }
}

/// Writes `buf` at `pos` of the O_DIRECT file `file` on one of the shard's
/// direct-write threads; returns the bytes written. The buffer is dropped
/// (back to its arena) once no thread uses it.
///
/// If the future is dropped while the write is queued or running (the
/// writer of a failed log leaving early, or the executor shutting down),
/// the file and the buffer are leaked for good, descriptor included: the
/// thread may still be writing to the one and reading the other. The
/// buffer's arena (the shard's staging memory) then stays mapped for good
/// too, as the buffer holds it.
pub(crate) async fn write(file: Rc<DmaFile>, buf: IoBuf, pos: u64) -> std::io::Result<usize> {
    /// Keeps `file` and `buf` alive, and leaks them if dropped early.
    struct Pinned(Option<(Rc<DmaFile>, IoBuf)>);
    impl Drop for Pinned {
        fn drop(&mut self) {
            if let Some(held) = self.0.take() {
                std::mem::forget(held);
            }
        }
    }
    let (fd, addr, len) = (file.as_raw_fd(), buf.as_ptr() as usize, buf.len());
    let mut pinned = Pinned(Some((file, buf)));
    let (done, result) = oneshot::channel();
    let job = Job {
        fd,
        addr,
        len,
        pos,
        done,
    };
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

/// `pwrite` of all `len` bytes at `addr` to `fd` at `pos`.
fn pwrite_all(fd: i32, addr: usize, len: usize, pos: u64) -> std::io::Result<()> {
    let mut done = 0usize;
    while done < len {
        // SAFETY: `write` keeps the buffer `[addr, addr + len)` and the
        // descriptor alive and unchanged until this returns.
        let n = unsafe {
            libc::pwrite(
                fd,
                (addr + done) as *const libc::c_void,
                len - done,
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
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::iobuf::IoArena;
    use glommio::io::OpenOptions;

    /// Writes land where asked and read back; a misaligned direct write
    /// fails with an error (EINVAL), not a panic; several writes in flight
    /// at once all complete.
    #[test]
    fn writes_complete_and_errors_come_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let p = path.clone();
        let ex = crate::runtime::executor_builder(0, None, crate::runtime::IO_MEMORY_TEST_BYTES)
            .spawn(move || async move {
                let arena = IoArena::new();
                let f = Rc::new(
                    OpenOptions::new()
                        .read(true)
                        .write(true)
                        .create(true)
                        .dma_open(&p)
                        .await
                        .unwrap(),
                );
                let writes = (0..8u8).map(|i| {
                    let mut buf = arena.alloc(4096);
                    buf.as_bytes_mut().fill(i + 1);
                    write(f.clone(), buf, i as u64 * 4096)
                });
                for r in futures::future::join_all(writes).await {
                    assert_eq!(r.unwrap(), 4096);
                }
                let buf = arena.alloc(4096);
                let e = write(f.clone(), buf, 100).await.unwrap_err();
                assert_eq!(e.raw_os_error(), None, "wrapped with its position");
                assert!(e.to_string().contains("at 100"), "{e}");
                f.close_rc().await.unwrap();
            })
            .unwrap();
        ex.join().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len(), 8 * 4096);
        for (i, page) in bytes.chunks(4096).enumerate() {
            assert!(page.iter().all(|&b| b == i as u8 + 1), "page {i}");
        }
    }
}
