//! One segment of a partition log: `<base>.log` plus its indexes.
//!
//! A `Segment` holds what the log needs to find batches without reading the
//! file: its logical size (bytes of whole batches, which can be less than the
//! file size while space is preallocated), the next offset after its last
//! batch, its in-memory `.index`/`.timeindex`, and lazily opened handles: a
//! `DmaFile` for direct reads, also handed out in `FileRange`s for fetches
//! (`net::file_range`), and, under `--catch-up-reads sendfile`, a buffered
//! `std::fs::File` handed out with them for sendfile (`net::sendfile`). Writing is done by the partition's writer (see
//! `writer.rs`); this file only has the synchronous recovery scan and the
//! asynchronous batch walker used by reads.
//!
//! Owned by the shard that owns the partition; !Send.

use super::ahead::{ReadAhead, READ_AHEAD_MAX_BYTES, READ_AHEAD_MIN_BYTES, READ_AHEAD_READS};
use super::index::{OffsetIndex, TimeIndex};
use super::LogError;
use crate::record::batch::{self, BatchHeader, BATCH_HEADER_BYTES, LOG_OVERHEAD_BYTES};
use glommio::io::DmaFile;
use std::cell::{Cell, RefCell};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// Window of a recovery scan read: 1 MiB.
pub const RECOVERY_READ_WINDOW_BYTES: usize = 1 << 20;
/// Window of a direct read while walking batches: 64 KiB (the largest
/// window of a walk that reads only headers).
pub const READ_SCAN_WINDOW_BYTES: usize = 64 << 10;
/// The first window of a walk that reads only headers, and its window again
/// after a batch larger than the window was skipped over: a batch header
/// read costs little more than this (on the session-12 machine's virtio
/// disk a 4 KiB direct read takes ~0.06 ms, a 64 KiB one ~0.12 ms).
/// Windows double while the walk keeps running off their end.
pub const READ_HEADER_WINDOW_MIN_BYTES: usize = 4 << 10;

pub fn log_file_name(base: i64) -> String {
    format!("{base:020}.log")
}

pub(crate) struct Segment {
    pub base_offset: i64,
    pub log_path: PathBuf,
    pub index_path: PathBuf,
    pub time_index_path: PathBuf,
    /// Bytes of whole batches appended (staged) so far.
    pub size: Cell<u64>,
    /// Bytes known to be written to the file (reads never go past this).
    pub written_len: Cell<u64>,
    /// Offset after the last batch (= base offset when empty).
    pub next_offset: Cell<i64>,
    pub index: RefCell<OffsetIndex>,
    pub time_index: RefCell<TimeIndex>,
    pub bytes_since_index: Cell<u64>,
    /// Largest batch max-timestamp so far and the last offset of that batch.
    pub max_ts: Cell<Option<(i64, i64)>>,
    /// Wall-clock ms when the segment was created or recovered (segment.ms).
    pub created_ms: i64,
    /// True once the segment is no longer written (truncated, synced, indexes on disk).
    pub sealed: Cell<bool>,
    pub dma: RefCell<Option<Rc<DmaFile>>>,
    /// The buffered descriptor of `--catch-up-reads sendfile` ranges.
    pub read_file: RefCell<Option<Rc<std::fs::File>>>,
    /// Where the last read of whole batches from the file ended: the offset
    /// after them and its position (`log::ahead`).
    pub read_cursor: Cell<Option<(i64, u64)>>,
    /// What follows the last sequential read, read ahead (`log::ahead`).
    pub ahead: RefCell<Option<Rc<ReadAhead>>>,
}

/// A segment's indexes as they are built batch by batch, apart from the
/// segment (`Send`: the cleaner builds them on its own thread).
#[derive(Debug, Default)]
pub struct SegmentIndexes {
    pub index: OffsetIndex,
    pub time_index: TimeIndex,
    pub bytes_since_index: u64,
    /// Largest batch max-timestamp so far and the last offset of that batch.
    pub max_ts: Option<(i64, i64)>,
}

impl SegmentIndexes {
    /// Indexes a batch of `len` bytes at `position` of the segment based at
    /// `base`, as Kafka's `LogSegment.append` does.
    pub fn on_append(
        &mut self,
        base: i64,
        position: u64,
        h: &BatchHeader,
        len: u64,
        index_interval_bytes: u32,
    ) {
        index_batch(
            IndexState {
                index: &mut self.index,
                time_index: &mut self.time_index,
                bytes_since_index: &mut self.bytes_since_index,
                max_ts: &mut self.max_ts,
            },
            base,
            position,
            h,
            len,
            index_interval_bytes,
        );
    }

    /// The final time-index entry of a segment that is no longer written
    /// (Kafka's `onBecomeInactiveSegment`).
    pub fn final_time_entry(&mut self, base: i64) {
        if let Some((ts, off)) = self.max_ts {
            self.time_index.maybe_push(ts, (off - base) as u32);
        }
    }
}

/// The indexing state a batch updates, borrowed from a [`SegmentIndexes`]
/// or from a live [`Segment`]'s cells.
struct IndexState<'a> {
    index: &'a mut OffsetIndex,
    time_index: &'a mut TimeIndex,
    bytes_since_index: &'a mut u64,
    max_ts: &'a mut Option<(i64, i64)>,
}

/// Kafka's indexing rule for one appended batch (`LogSegment.append`): an
/// offset-index entry (and a time-index entry for the largest timestamp so
/// far) once more than `index_interval_bytes` were appended since the last.
fn index_batch(
    s: IndexState,
    base: i64,
    position: u64,
    h: &BatchHeader,
    len: u64,
    index_interval_bytes: u32,
) {
    let last = h.last_offset();
    let rel = (last - base) as u32;
    match *s.max_ts {
        Some((ts, _)) if ts >= h.max_timestamp => {}
        _ => *s.max_ts = Some((h.max_timestamp, last)),
    }
    if *s.bytes_since_index > index_interval_bytes as u64 {
        s.index.push(rel, position as u32);
        if let Some((ts, off)) = *s.max_ts {
            s.time_index.maybe_push(ts, (off - base) as u32);
        }
        *s.bytes_since_index = 0;
    }
    *s.bytes_since_index += len;
}

/// How a recovery scan of one segment ended.
#[derive(Debug)]
pub(crate) struct ScanOutcome {
    pub valid_len: u64,
    pub file_len: u64,
    /// Why the scan stopped before the end of the file, if it did.
    pub stop_reason: Option<String>,
    /// The bytes after `valid_len` are all zero (preallocated space).
    pub tail_is_zeros: bool,
    /// The bytes from `valid_len` to the next page boundary are zero (or
    /// `valid_len` is page aligned): what the writer leaves after the last
    /// batch it wrote, so what follows is space not yet written in this
    /// segment (preallocated zeros or the old bytes of a recycled file).
    pub tail_is_padding: bool,
}

impl Segment {
    pub fn new(dir: &Path, base_offset: i64, now_ms: i64) -> Segment {
        let stem = format!("{base_offset:020}");
        Segment {
            base_offset,
            log_path: dir.join(format!("{stem}.log")),
            index_path: dir.join(format!("{stem}.index")),
            time_index_path: dir.join(format!("{stem}.timeindex")),
            size: Cell::new(0),
            written_len: Cell::new(0),
            next_offset: Cell::new(base_offset),
            index: RefCell::new(OffsetIndex::default()),
            time_index: RefCell::new(TimeIndex::default()),
            bytes_since_index: Cell::new(0),
            max_ts: Cell::new(None),
            created_ms: now_ms,
            sealed: Cell::new(false),
            dma: RefCell::new(None),
            read_file: RefCell::new(None),
            read_cursor: Cell::new(None),
            ahead: RefCell::new(None),
        }
    }

    /// Records a batch of `len` bytes at `position` in the indexes, exactly
    /// as Kafka's `LogSegment.append` does.
    pub fn on_append(&self, position: u64, h: &BatchHeader, len: u64, index_interval_bytes: u32) {
        let mut bytes_since_index = self.bytes_since_index.get();
        let mut max_ts = self.max_ts.get();
        index_batch(
            IndexState {
                index: &mut self.index.borrow_mut(),
                time_index: &mut self.time_index.borrow_mut(),
                bytes_since_index: &mut bytes_since_index,
                max_ts: &mut max_ts,
            },
            self.base_offset,
            position,
            h,
            len,
            index_interval_bytes,
        );
        self.bytes_since_index.set(bytes_since_index);
        self.max_ts.set(max_ts);
        self.size.set(position + len);
        self.next_offset.set(h.last_offset() + 1);
    }

    /// A sealed segment over a file the cleaner wrote (`log::compact`):
    /// its indexes as the cleaner built them, `size` bytes of batches, and
    /// `next_offset` where the next segment begins.
    pub fn cleaned(
        dir: &Path,
        base_offset: i64,
        built: SegmentIndexes,
        size: u64,
        next_offset: i64,
        now_ms: i64,
    ) -> Segment {
        let seg = Segment::new(dir, base_offset, now_ms);
        *seg.index.borrow_mut() = built.index;
        *seg.time_index.borrow_mut() = built.time_index;
        seg.max_ts.set(built.max_ts);
        seg.size.set(size);
        seg.written_len.set(size);
        seg.next_offset.set(next_offset);
        seg
    }

    /// Adds the final time-index entry of a segment that stops being active
    /// (Kafka's `onBecomeInactiveSegment`).
    pub fn final_time_entry(&self) {
        if let Some((ts, off)) = self.max_ts.get() {
            self.time_index
                .borrow_mut()
                .maybe_push(ts, (off - self.base_offset) as u32);
        }
    }

    pub fn reset_indexes(&self) {
        *self.index.borrow_mut() = OffsetIndex::default();
        *self.time_index.borrow_mut() = TimeIndex::default();
        self.bytes_since_index.set(0);
        self.max_ts.set(None);
        self.size.set(0);
        self.next_offset.set(self.base_offset);
    }

    /// Scans the `.log` from the start with ordinary reads, validating every
    /// batch (length, magic, CRC, offsets increasing from `min_base_offset`),
    /// and rebuilds the indexes. Stops at the first invalid batch.
    pub fn recover_scan(
        &self,
        min_base_offset: i64,
        index_interval_bytes: u32,
    ) -> Result<ScanOutcome, LogError> {
        self.reset_indexes();
        let file = std::fs::File::open(&self.log_path)?;
        let file_len = file.metadata()?.len();
        let mut expected = min_base_offset.max(self.base_offset);
        let mut pos: u64 = 0;
        let mut buf: Vec<u8> = Vec::new();
        let mut buf_at: u64 = 0;
        let mut stop_reason = None;
        while pos < file_len {
            // Make sure the buffer holds at least the batch at `pos`.
            let in_buf = |need: u64, buf: &Vec<u8>, buf_at: u64| {
                pos >= buf_at && pos + need <= buf_at + buf.len() as u64
            };
            if !in_buf(LOG_OVERHEAD_BYTES as u64 + 5, &buf, buf_at) {
                let n = (RECOVERY_READ_WINDOW_BYTES as u64).min(file_len - pos) as usize;
                buf.resize(n, 0);
                file.read_exact_at(&mut buf, pos)?;
                buf_at = pos;
            }
            let rel = (pos - buf_at) as usize;
            let h = match BatchHeader::parse(&buf[rel..]) {
                Ok(h) => h,
                Err(batch::BatchError::Truncated { .. }) if file_len - pos < 61 => {
                    stop_reason = Some(format!("torn batch header ({} bytes)", file_len - pos));
                    break;
                }
                Err(batch::BatchError::Truncated { .. }) => {
                    // Header straddles the window: re-read from here.
                    let n = (RECOVERY_READ_WINDOW_BYTES as u64).min(file_len - pos) as usize;
                    buf.resize(n, 0);
                    file.read_exact_at(&mut buf, pos)?;
                    buf_at = pos;
                    continue;
                }
                Err(e) => {
                    stop_reason = Some(e.to_string());
                    break;
                }
            };
            let size = h.total_size() as u64;
            if pos + size > file_len {
                stop_reason = Some(format!(
                    "torn batch: needs {size} bytes, {} left in file",
                    file_len - pos
                ));
                break;
            }
            if !in_buf(size, &buf, buf_at) {
                let n = (RECOVERY_READ_WINDOW_BYTES as u64)
                    .max(size)
                    .min(file_len - pos) as usize;
                buf.resize(n, 0);
                file.read_exact_at(&mut buf, pos)?;
                buf_at = pos;
            }
            let rel = (pos - buf_at) as usize;
            let bytes = &buf[rel..rel + size as usize];
            if let Err(e) = batch::validate(bytes) {
                stop_reason = Some(e.to_string());
                break;
            }
            if h.base_offset < expected {
                stop_reason = Some(format!(
                    "offset went backwards: batch base {} < expected {expected}",
                    h.base_offset
                ));
                break;
            }
            if h.last_offset() - self.base_offset > i32::MAX as i64 {
                stop_reason = Some("offset beyond the segment's relative range".into());
                break;
            }
            self.on_append(pos, &h, size, index_interval_bytes);
            expected = h.last_offset() + 1;
            pos += size;
        }
        self.written_len.set(pos);
        let tail_is_zeros = stop_reason.is_none() || all_zero_from(&file, pos, file_len)?;
        let page_end = (pos.div_ceil(super::PAGE_BYTES) * super::PAGE_BYTES).min(file_len);
        let tail_is_padding = tail_is_zeros || all_zero_from(&file, pos, page_end)?;
        Ok(ScanOutcome {
            valid_len: pos,
            file_len,
            stop_reason,
            tail_is_zeros,
            tail_is_padding,
        })
    }

    /// Loads `.index` and `.timeindex` of a sealed segment; `false` if
    /// either is missing or fails its sanity checks (then scan instead).
    pub fn load_indexes(&self, next_offset: i64) -> Result<bool, LogError> {
        let size = std::fs::metadata(&self.log_path)?.len();
        let (Ok(ib), Ok(tb)) = (
            std::fs::read(&self.index_path),
            std::fs::read(&self.time_index_path),
        ) else {
            return Ok(false);
        };
        let (Some(oi), Some(ti)) = (OffsetIndex::decode(&ib, size), TimeIndex::decode(&tb)) else {
            return Ok(false);
        };
        let rel_limit = (next_offset - self.base_offset) as u32;
        if oi
            .entries
            .last()
            .is_some_and(|e| e.relative_offset >= rel_limit)
            || ti
                .entries
                .last()
                .is_some_and(|e| e.relative_offset >= rel_limit)
        {
            return Ok(false);
        }
        let Some(last_t) = ti.last() else {
            return Ok(size == 0);
        };
        self.max_ts.set(Some((
            last_t.timestamp_ms,
            self.base_offset + last_t.relative_offset as i64,
        )));
        *self.index.borrow_mut() = oi;
        *self.time_index.borrow_mut() = ti;
        self.size.set(size);
        self.written_len.set(size);
        self.next_offset.set(next_offset);
        self.sealed.set(true);
        Ok(true)
    }

    /// After [`Self::load_indexes`] of the active segment at a clean
    /// start: walks the batch headers from the last offset-index entry to
    /// the end of the file and says whether they end exactly there, with
    /// the last batch ending just before `end`. A check that the loaded
    /// state describes the file (a recovery point from a stale checkpoint
    /// would not), at the cost of reading at most `index.interval.bytes`
    /// and one batch; CRCs were verified when the batches were appended.
    pub fn tail_ends_at(&self, end: i64) -> Result<bool, LogError> {
        let file = std::fs::File::open(&self.log_path)?;
        let file_len = file.metadata()?.len();
        let (mut pos, mut next) = match self.index.borrow().entries.last() {
            Some(e) => (u64::from(e.position), None),
            None => (0, Some(self.base_offset)),
        };
        let mut header = [0u8; BATCH_HEADER_BYTES];
        while pos < file_len {
            if file_len - pos < BATCH_HEADER_BYTES as u64 {
                return Ok(false);
            }
            file.read_exact_at(&mut header, pos)?;
            let Ok(h) = BatchHeader::parse(&header) else {
                return Ok(false);
            };
            pos += h.total_size() as u64;
            next = Some(h.last_offset() + 1);
        }
        Ok(pos == file_len && next == Some(end))
    }

    /// Writes `.index` and `.timeindex` (exact size, synced).
    pub fn write_indexes(&self) -> std::io::Result<()> {
        write_index_files(&self.encoded_indexes())
    }

    /// `.index` and `.timeindex` as `write_indexes` writes them, for
    /// `write_index_files` on a thread that may block (a shard must not
    /// wait for the file creation and the fdatasyncs: milliseconds at
    /// every roll).
    pub fn encoded_indexes(&self) -> [(PathBuf, Vec<u8>); 2] {
        [
            (self.index_path.clone(), self.index.borrow().encode()),
            (
                self.time_index_path.clone(),
                self.time_index.borrow().encode(),
            ),
        ]
    }

    /// The buffered descriptor handed out with sendfile ranges, opened on
    /// first use and shared by every reader (so its count of holders tells
    /// whether a fetch still sends from the file, as with `dma`).
    pub fn read_file(&self) -> Result<Rc<std::fs::File>, LogError> {
        if let Some(f) = &*self.read_file.borrow() {
            return Ok(f.clone());
        }
        let f = Rc::new(std::fs::File::open(&self.log_path)?);
        *self.read_file.borrow_mut() = Some(f.clone());
        Ok(f)
    }

    pub async fn dma(&self) -> Result<Rc<DmaFile>, LogError> {
        if let Some(f) = &*self.dma.borrow() {
            return Ok(f.clone());
        }
        let f = Rc::new(
            DmaFile::open(&self.log_path)
                .await
                .map_err(|e| LogError::Io(e.into()))?,
        );
        // Another read may have opened it meanwhile: keep one descriptor,
        // so the count of its holders tells whether a fetch still reads the
        // file (`recycle_or_remove`).
        let mut slot = self.dma.borrow_mut();
        Ok(slot.get_or_insert(f).clone())
    }

    /// After a sequential read that ended at `end`, reads what the next
    /// ones will want ahead (`log::ahead`): as many bytes as
    /// `READ_AHEAD_READS` reads like it could take (`max_bytes`), and a
    /// header window more, of what is written now. The read-ahead that
    /// reaches `end` moves on; any other is replaced.
    pub fn read_ahead(&self, file: Rc<DmaFile>, end: u64, max_bytes: u64) {
        let want = READ_AHEAD_READS * max_bytes.clamp(READ_AHEAD_MIN_BYTES, READ_AHEAD_MAX_BYTES)
            + READ_HEADER_WINDOW_MIN_BYTES as u64;
        let until = (end + want).min(self.written_len.get());
        let current = self.ahead.borrow().clone();
        match current {
            Some(ahead) if ahead.reaches(end) => ahead.advance(end, until),
            _ => {
                // The old one goes first, so its budget is free for the new one.
                self.ahead.borrow_mut().take();
                if until > end {
                    *self.ahead.borrow_mut() = ReadAhead::start(file, end, until).map(Rc::new);
                }
            }
        }
    }

    /// `n` bytes of the file from `pos` for a walk: from the read-ahead if it
    /// holds at least `at_least` of them (then perhaps fewer than `n`), else
    /// with a direct read.
    async fn read_window(
        &self,
        dma: &DmaFile,
        pos: u64,
        n: usize,
        at_least: usize,
    ) -> Result<glommio::io::ReadResult, LogError> {
        let ahead = self.ahead.borrow().clone();
        if let Some(ahead) = ahead {
            if let Some(r) = ahead.bytes_at(pos, n as u64).await {
                if r.len() >= at_least {
                    return Ok(r);
                }
            }
        }
        dma.read_at(pos, n)
            .await
            .map_err(|e| LogError::Io(e.into()))
    }

    /// Walks whole batches in `[start, end)` of the written file with direct
    /// reads. With `need_bytes` false only headers are read (a batch larger
    /// than the window is skipped over). `f(position, header, bytes)` returns
    /// false to stop; `bytes` is empty when `need_bytes` is false. In a
    /// segment still being written the walk ends before a batch that runs
    /// past `end` (it is not all written yet); in a sealed one that batch is
    /// corrupt.
    pub async fn walk(
        &self,
        start: u64,
        end: u64,
        need_bytes: bool,
        f: &mut dyn FnMut(u64, &BatchHeader, &[u8]) -> bool,
    ) -> Result<(), LogError> {
        let dma = self.dma().await?;
        let mut pos = start;
        let mut win: Option<(u64, glommio::io::ReadResult)> = None;
        let mut window = if need_bytes {
            READ_SCAN_WINDOW_BYTES
        } else {
            READ_HEADER_WINDOW_MIN_BYTES
        } as u64;
        while pos < end {
            let need = |n: u64, w: &Option<(u64, glommio::io::ReadResult)>| match w {
                Some((at, r)) => pos >= *at && pos + n <= *at + r.len() as u64,
                None => false,
            };
            if !need(batch::BATCH_HEADER_BYTES as u64, &win) {
                if end - pos < batch::BATCH_HEADER_BYTES as u64 && !self.sealed.get() {
                    break; // a batch whose header is not all written yet
                }
                if let (false, Some((at, r))) = (need_bytes, &win) {
                    window = if pos > *at + r.len() as u64 {
                        READ_HEADER_WINDOW_MIN_BYTES as u64
                    } else {
                        (window * 2).min(READ_SCAN_WINDOW_BYTES as u64)
                    };
                }
                let n = window.min(end - pos) as usize;
                let r = self
                    .read_window(&dma, pos, n, batch::BATCH_HEADER_BYTES)
                    .await?;
                win = Some((pos, r));
            }
            let h = {
                let Some((at, r)) = &win else { break };
                let rel = (pos - at) as usize;
                BatchHeader::parse(&r[rel..]).map_err(|e| {
                    LogError::Corrupt(format!("{}: position {pos}: {e}", self.log_path.display()))
                })?
            };
            let size = h.total_size() as u64;
            if pos + size > end && !self.sealed.get() {
                // The active segment's written bytes can end inside a batch
                // (a write of full chunks completed before the rest of it):
                // that batch is not written yet.
                break;
            }
            if pos + size > end {
                return Err(LogError::Corrupt(format!(
                    "{}: batch at {pos} runs past {end}",
                    self.log_path.display()
                )));
            }
            let keep_going = if need_bytes {
                if !need(size, &win) {
                    let n = (READ_SCAN_WINDOW_BYTES as u64).max(size).min(end - pos) as usize;
                    let r = self.read_window(&dma, pos, n, size as usize).await?;
                    win = Some((pos, r));
                }
                let Some((at, r)) = &win else { break };
                let rel = (pos - at) as usize;
                f(pos, &h, &r[rel..rel + size as usize])
            } else {
                f(pos, &h, &[])
            };
            if !keep_going {
                break;
            }
            pos += size;
        }
        Ok(())
    }
}

fn all_zero_from(file: &std::fs::File, from: u64, to: u64) -> std::io::Result<bool> {
    let mut f = file.try_clone()?;
    use std::io::Seek;
    f.seek(std::io::SeekFrom::Start(from))?;
    let mut rest = f.take(to - from);
    let mut buf = vec![0u8; RECOVERY_READ_WINDOW_BYTES];
    loop {
        let n = rest.read(&mut buf)?;
        if n == 0 {
            return Ok(true);
        }
        if buf[..n].iter().any(|&b| b != 0) {
            return Ok(false);
        }
    }
}

/// Writes each file (exact size, synced); blocks.
pub fn write_index_files(files: &[(PathBuf, Vec<u8>)]) -> std::io::Result<()> {
    files
        .iter()
        .try_for_each(|(path, bytes)| write_synced(path, bytes))
}

fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path)?;
    f.write_all(bytes)?;
    f.sync_data()
}
