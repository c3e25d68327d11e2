//! The simulated disk of the unit-test build (`cfg(test)`): what it models
//! is in the parent module's doc (`log::storage`). The log reaches it only
//! through `log::storage`'s three functions, which check [`active`] first.

use crate::log::direct;
use crate::log::iobuf::IoBuf;
use crate::log::LogError;
use glommio::io::DmaFile;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::rc::Rc;

thread_local! {
    /// A simulated disk is installed on this thread.
    static ACTIVE: Cell<bool> = const { Cell::new(false) };
    static SIMULATED: RefCell<Option<SimDisk>> = const { RefCell::new(None) };
}

/// A simulated disk is installed on this thread.
pub(super) fn active() -> bool {
    ACTIVE.get()
}

/// `log::storage::write_direct` on the simulated disk.
pub(super) async fn write_direct(
    file: Rc<DmaFile>,
    bufs: Vec<IoBuf>,
    pos: u64,
) -> std::io::Result<usize> {
    let (fail, yields) = with_disk(|d| d.next_completion(d.faults.write_error_per_10k));
    yield_times(yields).await;
    if !ACTIVE.get() {
        // The test took the disk back while this write was in flight: the
        // life ended (a crash), and the write never completes.
        return std::future::pending().await;
    }
    let fd = file.as_raw_fd();
    if fail {
        with_disk(|d| d.stats.failed_writes += 1);
        return Err(eio("simulated write error"));
    }
    with_disk(|d| d.touch(fd))?;
    let iov: Vec<(usize, usize)> = bufs
        .iter()
        .map(|b| (b.as_ptr() as usize, b.len()))
        .collect();
    // Completes here, synchronously: the simulated device's time is the
    // yields above.
    direct::pwritev_all(fd, &iov, pos)?;
    let bytes: Vec<u8> = bufs
        .iter()
        .flat_map(|b| b.as_bytes().iter().copied())
        .collect();
    let len = bytes.len();
    with_disk(|d| d.written(fd, pos, bytes));
    Ok(len)
}

/// `log::storage::write_buffered` on the simulated disk.
pub(super) fn write_buffered(file: &std::fs::File, bytes: &[u8], pos: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let fd = file.as_raw_fd();
    let (fail, _) = with_disk(|d| d.next_completion(d.faults.write_error_per_10k));
    if fail {
        with_disk(|d| d.stats.failed_writes += 1);
        return Err(eio("simulated write error"));
    }
    with_disk(|d| d.touch(fd))?;
    file.write_all_at(bytes, pos)?;
    with_disk(|d| d.written(fd, pos, bytes.to_vec()));
    Ok(())
}

/// `log::storage::fdatasync` on the simulated disk.
pub(super) async fn fdatasync(file: &DmaFile) -> Result<(), LogError> {
    let fd = file.as_raw_fd();
    // What the fdatasync covers is decided when it starts: the writes
    // completed by then (a real one may cover more; never less).
    let (fail, yields) = with_disk(|d| d.next_completion(d.faults.sync_error_per_10k));
    let synced = with_disk(|d| d.sync(fd, fail));
    yield_times(yields).await;
    if !ACTIVE.get() {
        // The life ended meanwhile (see `write_direct`).
        return std::future::pending().await;
    }
    synced?;
    if fail {
        return Err(LogError::Io(eio("simulated fdatasync error")));
    }
    Ok(())
}

/// Installs `disk` as this thread's storage for the log's data writes and
/// fdatasyncs, until [`take_simulated`].
pub fn simulate(disk: SimDisk) {
    SIMULATED.with(|s| *s.borrow_mut() = Some(disk));
    ACTIVE.set(true);
}

/// Uninstalls this thread's simulated disk and hands it back.
pub fn take_simulated() -> Option<SimDisk> {
    ACTIVE.set(false);
    SIMULATED.with(|s| s.borrow_mut().take())
}

/// What this thread's simulated disk has done so far (`None`: none is
/// installed).
pub fn simulated_stats() -> Option<SimStats> {
    SIMULATED.with(|s| s.borrow().as_ref().map(|d| d.stats))
}

/// `f` on this thread's simulated disk, installed (the callers checked
/// `ACTIVE`). Never held across an await.
fn with_disk<T>(f: impl FnOnce(&mut SimDisk) -> T) -> T {
    SIMULATED.with(|s| {
        let mut s = s.borrow_mut();
        let disk = s
            .as_mut()
            .expect("ACTIVE is set only with a simulated disk");
        f(disk)
    })
}

async fn yield_times(n: u32) {
    for _ in 0..n {
        futures_lite::future::yield_now().await;
    }
}

fn eio(what: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::Error::from_raw_os_error(libc::EIO).kind(),
        format!("{what} (EIO)"),
    )
}

/// Faults a [`SimDisk`] injects, as chances per 10,000 operations.
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    /// A data write fails with EIO (nothing of it is written).
    pub write_error_per_10k: u32,
    /// An fdatasync fails with EIO (the writes it covered are lost).
    pub sync_error_per_10k: u32,
    /// Each write and fdatasync completes after 0 to this many executor
    /// yields (0: in the order issued).
    pub completion_yields_max: u32,
}

/// What a [`SimDisk`] did, for a test to check that its faults happened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    pub writes: u64,
    pub syncs: u64,
    pub failed_writes: u64,
    pub failed_syncs: u64,
    pub power_losses: u64,
    /// At power losses: writes since their file's last fdatasync that
    /// survived whole, were lost, or were torn.
    pub writes_kept: u64,
    pub writes_dropped: u64,
    pub writes_torn: u64,
    /// Shadowed files found changed outside the seam (module doc of
    /// [`Shadow`]): taken as durable as they were found.
    pub foreign_changes: u64,
}

/// A simulated disk over real files (module doc). `Send`: a test carries it
/// from one executor thread (a life of the broker) to the next.
pub struct SimDisk {
    rng: u64,
    faults: Faults,
    /// By inode: what a power loss would leave of each file written since
    /// the last power loss or [`SimDisk::settle`].
    files: HashMap<u64, Shadow>,
    stats: SimStats,
}

/// One file as a power loss would leave it.
///
/// The log changes some files without this seam: a truncation cuts a
/// segment (`set_len`) and fsyncs it on the blocking thread, segments are
/// deleted and created, checkpoints replaced by renames; and a deleted
/// file's inode is soon reused by a new file. Each of these fsyncs what it
/// did before it returns. So a shadow also holds what the file should
/// hold after the seam's writes (`expected`); a file found different from
/// it (before a write, at an fdatasync, at a power loss) was changed
/// outside the seam, durably, after the seam last saw it: the shadow
/// starts again from what the file holds (and a power loss leaves such a
/// file as it is). Without this, a power loss replayed a truncated
/// segment's old bytes, or wrote a deleted segment's bytes over the file
/// that reused its inode.
struct Shadow {
    /// The file's bytes as of its last successful fdatasync (or when the
    /// simulation first saw it: everything on disk then is durable).
    durable: Vec<u8>,
    /// Writes since then, in completion order: position and bytes.
    pending: Vec<(u64, Vec<u8>)>,
    /// Writes a failed fdatasync should have covered: never durable.
    lost: Vec<(u64, usize)>,
    /// The file's bytes as the seam's writes left them.
    expected: Vec<u8>,
}

impl Shadow {
    /// A file whose bytes now are all durable.
    fn durable(bytes: Vec<u8>) -> Shadow {
        Shadow {
            expected: bytes.clone(),
            durable: bytes,
            pending: Vec::new(),
            lost: Vec::new(),
        }
    }
}

impl SimDisk {
    pub fn new(seed: u64, faults: Faults) -> SimDisk {
        SimDisk {
            rng: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            faults,
            files: HashMap::new(),
            stats: SimStats::default(),
        }
    }

    pub fn stats(&self) -> SimStats {
        self.stats
    }

    /// Changes the faults injected from now on.
    pub fn set_faults(&mut self, faults: Faults) {
        self.faults = faults;
    }

    /// xorshift64*: the same sequence everywhere.
    fn next(&mut self) -> u64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    /// Whether the next operation fails (at `error_per_10k`), and after how
    /// many yields it completes.
    fn next_completion(&mut self, error_per_10k: u32) -> (bool, u32) {
        let fail = self.below(10_000) < u64::from(error_per_10k);
        let yields = self.below(u64::from(self.faults.completion_yields_max) + 1) as u32;
        (fail, yields)
    }

    /// Before a write to the file of `fd`: starts shadowing it (its bytes
    /// now are durable), or starts again if it was changed outside the
    /// seam ([`Shadow`]).
    fn touch(&mut self, fd: i32) -> std::io::Result<()> {
        let ino = inode(fd)?;
        let now = read_fd(fd)?;
        match self.files.entry(ino) {
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(Shadow::durable(now));
            }
            std::collections::hash_map::Entry::Occupied(mut e) => {
                if !unchanged(&e.get().expected, &now) {
                    self.stats.foreign_changes += 1;
                    e.insert(Shadow::durable(now));
                }
            }
        }
        Ok(())
    }

    /// Records a completed write (after [`Self::touch`]).
    fn written(&mut self, fd: i32, pos: u64, bytes: Vec<u8>) {
        self.stats.writes += 1;
        if let Ok(ino) = inode(fd) {
            if let Some(s) = self.files.get_mut(&ino) {
                overlay(&mut s.expected, pos as usize, &bytes);
                s.pending.push((pos, bytes));
            }
        }
    }

    /// An fdatasync of the file of `fd` starts: it makes the writes
    /// completed so far durable, or, failing, loses them for good.
    fn sync(&mut self, fd: i32, fail: bool) -> Result<(), LogError> {
        self.stats.syncs += 1;
        if fail {
            self.stats.failed_syncs += 1;
        }
        let ino = inode(fd).map_err(LogError::Io)?;
        let Some(s) = self.files.get_mut(&ino) else {
            // Nothing written through the seam since it was last durable.
            return Ok(());
        };
        let mut now = read_fd(fd).map_err(LogError::Io)?;
        if !unchanged(&s.expected, &now) {
            // Changed (and made durable) outside the seam since its last
            // write here.
            self.stats.foreign_changes += 1;
            *s = Shadow::durable(now);
            return Ok(());
        }
        if fail {
            let lost: Vec<(u64, usize)> = s.pending.drain(..).map(|(p, b)| (p, b.len())).collect();
            s.lost.extend(lost);
            return Ok(());
        }
        // Pages whose write-back failed stay as they were on the device...
        for &(pos, len) in &s.lost {
            overlay_from(&mut now, &s.durable, pos as usize, len);
        }
        // ...unless written again since.
        for (pos, bytes) in &s.pending {
            overlay(&mut now, *pos as usize, bytes);
        }
        s.durable = now;
        s.pending.clear();
        Ok(())
    }

    /// Everything on disk now is durable (after a kill -9 the page cache
    /// survives; the test treats it as written back before the next power
    /// loss).
    pub fn settle(&mut self) {
        self.files.clear();
    }

    /// [`Self::settle`] for the files under `root` only (one node of
    /// several sharing this thread's disk, `shard::cluster_sim`, killed).
    pub fn settle_under(&mut self, root: &Path) -> std::io::Result<()> {
        let mut paths = HashMap::new();
        inodes_under(root, &mut paths)?;
        self.files.retain(|ino, _| !paths.contains_key(ino));
        Ok(())
    }

    /// A power loss: every file under `root` written since it was last
    /// durable is rewritten to what the device would hold: its durable
    /// bytes, and of each write since (in completion order) all of it,
    /// none of it, or a prefix torn at a random byte. Run with no log open
    /// (between two lives).
    pub fn power_loss(&mut self, root: &Path) -> std::io::Result<()> {
        let files: Vec<(u64, Shadow)> = self.files.drain().collect();
        self.lose_power(root, files)
    }

    /// A power loss of the files under `root` only (one node of several
    /// sharing this thread's disk, `shard::cluster_sim`), as
    /// [`Self::power_loss`] leaves them; every other file keeps what was
    /// written to it, and what a later power loss of its own would leave.
    /// Run with no log under `root` open.
    pub fn power_loss_under(&mut self, root: &Path) -> std::io::Result<()> {
        let mut paths = HashMap::new();
        inodes_under(root, &mut paths)?;
        let mut under = Vec::new();
        for (ino, shadow) in std::mem::take(&mut self.files) {
            if paths.contains_key(&ino) {
                under.push((ino, shadow));
            } else {
                self.files.insert(ino, shadow);
            }
        }
        self.lose_power(root, under)
    }

    /// Rewrites each of `files` under `root` to what a power loss leaves.
    fn lose_power(&mut self, root: &Path, mut files: Vec<(u64, Shadow)>) -> std::io::Result<()> {
        self.stats.power_losses += 1;
        let mut paths = HashMap::new();
        inodes_under(root, &mut paths)?;
        // HashMap order is not the seed's: go by inode.
        files.sort_by_key(|(ino, _)| *ino);
        for (ino, s) in files {
            // A file removed since (retention) has nothing to restore.
            let Some(path) = paths.get(&ino) else {
                continue;
            };
            if !unchanged(&s.expected, &std::fs::read(path)?) {
                // Changed outside the seam, durably, since ([`Shadow`]).
                self.stats.foreign_changes += 1;
                continue;
            }
            let mut image = s.durable;
            for (pos, bytes) in &s.pending {
                let keep = match self.below(3) {
                    0 => {
                        self.stats.writes_kept += 1;
                        bytes.len()
                    }
                    1 => {
                        self.stats.writes_dropped += 1;
                        0
                    }
                    _ => {
                        self.stats.writes_torn += 1;
                        self.below(bytes.len() as u64) as usize
                    }
                };
                overlay(&mut image, *pos as usize, &bytes[..keep]);
            }
            std::fs::write(path, &image)?;
        }
        Ok(())
    }
}

/// Whether a file holding `now` is as the seam's writes left it
/// (`expected`), but for zeros past their end: the writer fallocates ahead
/// of its writes, and a power loss that loses the new size leaves what
/// the image's rebuild pads with zeros anyway.
fn unchanged(expected: &[u8], now: &[u8]) -> bool {
    now.len() >= expected.len()
        && now[..expected.len()] == *expected
        && now[expected.len()..].iter().all(|&b| b == 0)
}

/// Copies `bytes` into `image` at `pos`, growing it as needed.
fn overlay(image: &mut Vec<u8>, pos: usize, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    let end = pos + bytes.len();
    if image.len() < end {
        image.resize(end, 0);
    }
    image[pos..end].copy_from_slice(bytes);
}

/// Puts `[pos, pos + len)` of `image` back to what `old` held there (zeros
/// past its end).
fn overlay_from(image: &mut [u8], old: &[u8], pos: usize, len: usize) {
    let end = (pos + len).min(image.len());
    for (i, b) in image.iter_mut().enumerate().take(end).skip(pos) {
        *b = old.get(i).copied().unwrap_or(0);
    }
}

/// The inode of the file open as `fd`.
fn inode(fd: i32) -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    Ok(std::fs::metadata(format!("/proc/self/fd/{fd}"))?.ino())
}

/// Every byte of the file open as `fd` (a new buffered description, so an
/// O_DIRECT one's alignment rules do not apply).
fn read_fd(fd: i32) -> std::io::Result<Vec<u8>> {
    std::fs::read(format!("/proc/self/fd/{fd}"))
}

/// Inode → path of every regular file under `dir`.
fn inodes_under(dir: &Path, out: &mut HashMap<u64, std::path::PathBuf>) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    for ent in std::fs::read_dir(dir)? {
        let ent = ent?;
        let meta = std::fs::symlink_metadata(ent.path())?;
        if meta.is_dir() {
            inodes_under(&ent.path(), out)?;
        } else if meta.is_file() {
            out.insert(meta.ino(), ent.path());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `f.log` holding `content` in a new directory, open for writing, and
    /// a simulated disk seeded with `seed`.
    fn file_with(
        content: &[u8],
        seed: u64,
    ) -> (
        tempfile::TempDir,
        std::path::PathBuf,
        std::fs::File,
        SimDisk,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.log");
        std::fs::write(&path, content).unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        (dir, path, f, SimDisk::new(seed, Faults::default()))
    }

    /// Writes `bytes` at `pos` of `f` as `write_buffered` does: shadowed
    /// first, then written, then recorded.
    fn write(d: &mut SimDisk, f: &std::fs::File, pos: u64, bytes: &[u8]) {
        use std::os::unix::fs::FileExt;
        d.touch(f.as_raw_fd()).unwrap();
        f.write_all_at(bytes, pos).unwrap();
        d.written(f.as_raw_fd(), pos, bytes.to_vec());
    }

    #[test]
    fn a_power_loss_keeps_the_durable_bytes_and_some_of_each_later_write() {
        let (dir, path, f, mut d) = file_with(b"", 7);
        write(&mut d, &f, 0, b"aaaa");
        d.sync(f.as_raw_fd(), false).unwrap();
        write(&mut d, &f, 4, b"bbbbbbbb");
        d.power_loss(dir.path()).unwrap();
        let after = std::fs::read(&path).unwrap();
        assert_eq!(&after[..4], b"aaaa", "synced bytes survive");
        assert!(after[4..].iter().all(|&b| b == b'b'), "{after:?}");
        let s = d.stats();
        assert_eq!(s.writes_kept + s.writes_dropped + s.writes_torn, 1);
    }

    /// A truncation cuts and fsyncs a segment outside the seam: a power
    /// loss keeps the cut, and replays neither the cut bytes nor the
    /// writes before it; a write after it is shadowed from the cut file.
    #[test]
    fn a_file_changed_outside_the_seam_keeps_that_change_at_a_power_loss() {
        let (dir, path, f, mut d) = file_with(b"", 7);
        let fd = f.as_raw_fd();
        write(&mut d, &f, 0, b"aaaa");
        d.sync(fd, false).unwrap();
        write(&mut d, &f, 4, b"bbbb");
        // The truncation, outside the seam.
        f.set_len(2).unwrap();
        f.sync_all().unwrap();
        d.power_loss(dir.path()).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"aa");
        assert_eq!(d.stats().foreign_changes, 1);
        // Cut, then written through the seam, then the power lost: the
        // cut stays, the new write may be lost, the old bytes never come
        // back.
        d.touch(fd).unwrap();
        f.set_len(1).unwrap();
        f.sync_all().unwrap();
        write(&mut d, &f, 1, b"cc");
        d.power_loss(dir.path()).unwrap();
        let after = std::fs::read(&path).unwrap();
        assert_eq!(after[0], b'a');
        assert!(
            after.len() <= 3 && after[1..].iter().all(|&b| b == b'c'),
            "{after:?}"
        );
        assert_eq!(d.stats().foreign_changes, 2);
    }

    /// A log that fails while a sealed segment's background fdatasync is
    /// in flight is idle once that fdatasync ends: the seal no longer
    /// counts as running, else `wait_idle` (which deleting a partition and
    /// the cluster simulation's kill await) never resolves.
    #[test]
    fn a_log_that_fails_during_a_background_seal_becomes_idle() {
        use futures::future::Either;
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().to_path_buf();
        crate::runtime::run_test_executor(move || async move {
            crate::runtime::probe_dma(&data).await.unwrap();
            // Every fdatasync completes after up to 100,000 yields: the
            // seal is still in flight when the log fails.
            let faults = Faults {
                completion_yields_max: 100_000,
                ..Faults::default()
            };
            simulate(SimDisk::new(3, faults));
            let mgr = crate::log::LogManager::new_for_shard(
                data.clone(),
                crate::log::TailCache::new(1 << 20),
                0,
            );
            let tp = crate::types::TopicPartition::new("seal", 0);
            let config = crate::log::LogConfig {
                segment_bytes: 4096,
                preallocate_bytes: 64 * 1024,
                ..crate::log::LogConfig::default()
            };
            let log = mgr.open(&tp, config).await.unwrap();
            let batch = |v: &str| {
                crate::record::BatchBuilder::new(crate::record::Compression::None)
                    .record(None, Some(v.as_bytes()), &[], 1_700_000_000_000)
                    .build()
            };
            let first = log.append(batch("a")).unwrap();
            log.wait_acked(first.last_offset, false).await.unwrap();
            log.roll();
            let _ = log.append(batch("b")).unwrap();
            let mut sealing = false;
            for _ in 0..1_000_000 {
                if log.seals.running() {
                    sealing = true;
                    break;
                }
                futures_lite::future::yield_now().await;
            }
            assert!(sealing, "the first segment's seal is in flight");
            let idle = futures::future::select(
                Box::pin(log.simulate_kill()),
                Box::pin(glommio::timer::sleep(std::time::Duration::from_secs(20))),
            )
            .await;
            let _ = take_simulated();
            assert!(
                matches!(idle, Either::Left(_)),
                "the failed log stays busy with its seal"
            );
        });
    }

    #[test]
    fn writes_a_failed_fdatasync_covered_stay_lost_after_a_later_one() {
        let (dir, path, f, mut d) = file_with(b"old!", 1);
        let fd = f.as_raw_fd();
        write(&mut d, &f, 0, b"new!");
        d.sync(fd, true).unwrap();
        write(&mut d, &f, 4, b"more");
        d.sync(fd, false).unwrap();
        d.power_loss(dir.path()).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"old!more");
    }
}
