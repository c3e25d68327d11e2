//! Sending a range of a segment file to a socket with `sendfile(2)`, from
//! the page cache: `fjord serve --catch-up-reads sendfile`. The default is
//! the direct reads of `file_range`; `config::CATCH_UP_READS_DEFAULT` says
//! why. This was fjord's only path until 4c3531f (as DESIGN.md §4 first had
//! it) and is kept so that it can be measured again: on machines without
//! the first-touch cost that decided it, and beside Kafka, which serves
//! catch-up reads the same way.
//!
//! - sendfile blocks while the kernel reads from the disk, so it runs on
//!   glommio's blocking thread: a prototype showed a sendfile on the
//!   reactor delaying a 1 ms timer by over a second.
//! - The thread works on duplicates of the socket and the file descriptor,
//!   so nothing it uses can be closed, and its number reused, under it if
//!   the connection goes away meanwhile.
//! - A range goes in pieces of at most [`SENDFILE_PIECE_BYTES`], one
//!   blocking job each, so the shard's other blocking work (a roll's index
//!   writes, checkpoints) waits behind one piece at most, not a whole fetch.
//!   Concurrent catch-up fetches on one shard take turns on that one thread.
//! - Sockets glommio accepts are blocking, and a client that stops reading
//!   would hold sendfile for ever. `SO_SNDTIMEO` bounds each wait; a range
//!   that makes no progress for the connection's write-stall limit fails
//!   with `TimedOut` (glommio's own writes keep their timer: io_uring sends
//!   never block in the kernel, so the socket option does not reach them).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

/// Bytes one blocking job sends at most.
pub const SENDFILE_PIECE_BYTES: u64 = 1 << 20;

/// Sends `len` bytes of `file` from `position` to the socket `sock`, giving
/// up when no byte went out for `stall`. The caller keeps `sock` open until
/// this returns.
pub async fn send_range(
    sock: RawFd,
    file: &File,
    position: u64,
    len: usize,
    stall: Duration,
) -> io::Result<()> {
    // SAFETY: the caller's connection keeps `sock` open for this call; the
    // borrow only lives to duplicate it.
    let sock = Arc::new(unsafe { BorrowedFd::borrow_raw(sock) }.try_clone_to_owned()?);
    let file = Arc::new(file.try_clone()?);
    let end = position + len as u64;
    let mut at = position;
    while at < end {
        let n = (end - at).min(SENDFILE_PIECE_BYTES) as usize;
        let (s, f) = (sock.clone(), file.clone());
        glommio::executor()
            .spawn_blocking(move || send_blocking(&s, &f, at, n, stall))
            .await?;
        at += n as u64;
    }
    Ok(())
}

/// Sends `[position, position + len)` of `file` to `sock`, blocking.
fn send_blocking(
    sock: &OwnedFd,
    file: &File,
    position: u64,
    len: usize,
    stall: Duration,
) -> io::Result<()> {
    let sock = sock.as_raw_fd();
    set_send_timeout(sock, stall)?;
    let mut offset = position as libc::off_t;
    let mut left = len;
    let mut progress = crate::clock::monotonic();
    while left > 0 {
        // SAFETY: both descriptors are owned by the caller for the duration
        // of the call; offset is a valid pointer to a local.
        let n = unsafe { libc::sendfile(sock, file.as_raw_fd(), &mut offset, left) };
        if n > 0 {
            left -= n as usize;
            progress = crate::clock::monotonic();
            continue;
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "segment file ended before the requested range",
            ));
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => {}
            // The send timeout passed (or the socket is non-blocking and
            // full): wait for room until `stall` after the last progress.
            Some(libc::EAGAIN) => {
                let waited = progress.elapsed();
                if waited >= stall {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "socket stalled"));
                }
                let mut pfd = libc::pollfd {
                    fd: sock,
                    events: libc::POLLOUT,
                    revents: 0,
                };
                let wait_ms = (stall - waited).as_millis().clamp(1, i32::MAX as u128) as i32;
                // SAFETY: pfd is a valid pollfd for the duration of the call.
                let rc = unsafe { libc::poll(&mut pfd, 1, wait_ms) };
                if rc < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                    return Err(io::Error::last_os_error());
                }
            }
            _ => return Err(err),
        }
    }
    Ok(())
}

/// Sets `SO_SNDTIMEO` of `sock` to `timeout` (at least 1 ms).
fn set_send_timeout(sock: RawFd, timeout: Duration) -> io::Result<()> {
    let timeout = timeout.max(Duration::from_millis(1));
    let tv = libc::timeval {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_usec: timeout.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: tv is a valid timeval for the duration of the call, and its
    // size is passed with it.
    let rc = unsafe {
        libc::setsockopt(
            sock,
            libc::SOL_SOCKET,
            libc::SO_SNDTIMEO,
            (&tv as *const libc::timeval).cast::<libc::c_void>(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};

    /// Ranges over several pieces, starting and ending anywhere, arrive
    /// whole and in order through a real TCP socket; a range past the end
    /// of the file is an error, not a short send.
    #[test]
    fn sends_ranges_with_sendfile() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("segment");
        let data: Vec<u8> = (0..2 * SENDFILE_PIECE_BYTES as usize + 9_000)
            .map(|i| (i % 251) as u8)
            .collect();
        std::fs::write(&path, &data).unwrap();
        let ranges = [(0u64, data.len()), (5_000, data.len() - 5_001), (4096, 1)];
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let expected = data.clone();
        let reader = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut got = Vec::new();
            conn.read_to_end(&mut got).unwrap();
            got
        });
        crate::runtime::run_test_executor(move || async move {
            let sock = TcpStream::connect(addr).unwrap();
            let file = File::open(&path).unwrap();
            let stall = Duration::from_secs(30);
            for (position, len) in ranges {
                send_range(sock.as_raw_fd(), &file, position, len, stall)
                    .await
                    .unwrap();
            }
            let err = send_range(sock.as_raw_fd(), &file, data.len() as u64 - 10, 20, stall)
                .await
                .unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        });
        let got = reader.join().unwrap();
        let mut want = Vec::new();
        for (position, len) in ranges {
            want.extend_from_slice(&expected[position as usize..position as usize + len]);
        }
        // The range past the end sent its first 10 bytes before it failed.
        want.extend_from_slice(&expected[expected.len() - 10..]);
        assert!(got == want, "sent {} bytes, want {}", got.len(), want.len());
    }
}
