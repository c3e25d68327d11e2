//! The log's storage seam: every write of a segment file's data and every
//! fdatasync of one goes through the three functions here ([`write_direct`],
//! [`write_buffered`], [`fdatasync`]), at the point where the writer has
//! already chosen its next I/O step (`write_step`) and the syncer its next
//! group commit.
//!
//! Production: each function is the call it stands for (a `pwritev` on the
//! shard's direct-write threads, a buffered `pwrite`, glommio's
//! fdatasync), and nothing else. The simulated disk (`sim`) is compiled
//! only into the crate's unit-test build (`cfg(test)`), where each function
//! first checks a thread-local flag for an installed simulated disk; every
//! other build (the broker, the benches, the integration tests' broker)
//! has no such check, so the seam is static and costs production nothing
//! (`tuning/results/storage-seam.md` measured the flag's version against
//! this one and against the code before the seam). Why not a type
//! parameter: it would have to be carried by `PartitionLog`, `Partition`,
//! `LogManager` and the shard that holds them, to choose between one real
//! implementation and one that only tests use. The simulation that drives
//! it (`partition::simulation`) is a unit test of the crate for the same
//! reason.
//!
//! Tests: a test thread may install a `sim::SimDisk`
//! (`sim::simulate`); from then on the log's data writes and fdatasyncs
//! on that thread go to it. Shards are threads, so a simulated disk on one
//! test thread changes no other. The simulated disk sits on the real
//! files, so recovery, reads and `dump-log` see what a real disk would
//! show, and keeps for each file what a power loss would leave of it: its
//! bytes as of its last fdatasync, and every write since. From one seed it
//! - fails a write or an fdatasync (EIO), as a failing device does; the
//!   writes a failed fdatasync should have covered never become durable,
//!   even when a later fdatasync of the file succeeds (Linux marks pages
//!   clean after a write-back error, and the next fdatasync has nothing to
//!   write);
//! - completes writes and fdatasyncs in another order than they were
//!   issued: each completes after a seeded number of executor yields, so
//!   writes in flight together land in any order, and a crash (the
//!   executor dropped) leaves those not yet completed unwritten;
//! - at a power loss (`sim::SimDisk::power_loss`), keeps, drops or tears at
//!   a random byte each write since its file's last fdatasync.
//!
//! What the simulation takes as durable at once: files the log writes with
//! `std::fs` and fsyncs right away (indexes, checkpoints, producer
//! snapshots, `.txnindex`, `partition.metadata`), file creation, renames and
//! removals (the log fsyncs its directory after each; the simulated disk has
//! no directory model), fallocate and ftruncate (space, not data: a
//! truncation's new length becomes durable with the fdatasync after it).
//!
//! Determinism: the operations and every fault decision follow from the
//! seed and the order of calls. The order of calls is glommio's
//! scheduling of the log's tasks, which also waits on real io_uring
//! completions (opening files, truncation, reads), so two runs of a seed
//! can interleave differently; a failing seed reproduces in most runs, not
//! in all.

use super::direct;
use super::iobuf::IoBuf;
use super::partition::io_err;
use super::LogError;
use glommio::io::DmaFile;
use std::rc::Rc;

#[cfg(test)]
pub mod sim;

/// Writes `bufs`, one after another, at `pos` of the O_DIRECT segment file
/// `file` (`direct::write`); returns the bytes written.
#[cfg(not(test))]
pub(super) fn write_direct(
    file: Rc<DmaFile>,
    bufs: Vec<IoBuf>,
    pos: u64,
) -> impl std::future::Future<Output = std::io::Result<usize>> {
    direct::write(file, bufs, pos)
}

/// [`write_direct`] in the unit-test build: on the simulated disk when one
/// is installed (its state boxed apart, so the real write's future stays
/// as it is).
#[cfg(test)]
pub(super) fn write_direct(
    file: Rc<DmaFile>,
    bufs: Vec<IoBuf>,
    pos: u64,
) -> impl std::future::Future<Output = std::io::Result<usize>> {
    use futures::future::Either;
    if sim::active() {
        Either::Right(Box::pin(sim::write_direct(file, bufs, pos)))
    } else {
        Either::Left(direct::write(file, bufs, pos))
    }
}

/// Writes `bytes` at `pos` of a segment file through the page cache.
pub(super) fn write_buffered(file: &std::fs::File, bytes: &[u8], pos: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    #[cfg(test)]
    if sim::active() {
        return sim::write_buffered(file, bytes, pos);
    }
    file.write_all_at(bytes, pos)
}

/// fdatasyncs a segment file.
pub(super) async fn fdatasync(file: &DmaFile) -> Result<(), LogError> {
    #[cfg(test)]
    if sim::active() {
        return sim::fdatasync(file).await;
    }
    file.fdatasync().await.map_err(io_err)
}
