//! `fjord dump-log FILE...`: prints segments, indexes and transaction
//! indexes in the format of Kafka's `kafka-dump-log.sh`
//! (`DumpLogSegments`), so the two tools' outputs can be diffed.
//!
//! - `.log`: "Log starting offset", then one line per batch (baseOffset ...
//!   isvalid); `--deep-iteration` adds one `| offset: ...` line per record,
//!   `--print-data-log` (implies deep iteration) adds key and payload;
//!   control records show `endTxnMarker` and `coordinatorEpoch`.
//! - `.index`: `offset: O position: P`; `.timeindex`: `timestamp: T offset: O`;
//!   `.txnindex`: one line per aborted transaction.
//! - `--verify-index-only`: checks each `.index`/`.timeindex` entry against
//!   the `.log` beside it and prints only mismatches.
//!
//! - `--offsets-decoder` (implies deep iteration): each record of a
//!   `__consumer_offsets` segment is printed decoded as group or offset
//!   data. The decoding belongs to the group coordinator, above `log` in
//!   the layering, so the caller supplies it as [`DumpLogArgs::record_formatter`].
//!
//! A plain synchronous tool: no executor, ordinary file reads.

use crate::log::index::{OffsetIndex, TimeIndex};
use crate::log::records;
use crate::record::batch::{self, BatchHeader, BatchIter, TimestampType};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Bytes per `.txnindex` entry: version i16, producerId, firstOffset,
/// lastOffset, lastStableOffset (i64 each).
pub const TXN_INDEX_ENTRY_BYTES: usize = 34;
const RECORD_INDENT: &str = "|";

/// Formats one record's key and value (e.g. as `__consumer_offsets` data).
pub type RecordFormatter = fn(Option<&[u8]>, Option<&[u8]>) -> String;

/// Arguments of `fjord dump-log`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct DumpLogArgs {
    /// Segment (.log), index (.index), time-index (.timeindex) or txn-index (.txnindex) files.
    #[arg(long = "files", num_args = 1.., value_delimiter = ',')]
    pub files_flag: Vec<PathBuf>,
    /// The same files, positionally.
    pub files: Vec<PathBuf>,
    /// Print every record of every batch, not just batch headers.
    #[arg(long)]
    pub deep_iteration: bool,
    /// Print record keys and payloads (implies --deep-iteration).
    #[arg(long)]
    pub print_data_log: bool,
    /// Only check index entries against the log; print mismatches.
    #[arg(long)]
    pub verify_index_only: bool,
    /// Decode records as __consumer_offsets group and offset data (implies --deep-iteration).
    #[arg(long)]
    pub offsets_decoder: bool,
    /// The decoder `--offsets-decoder` uses; set by the caller (the binary
    /// passes the group coordinator's). Without one the flag prints raw data.
    #[arg(skip)]
    pub record_formatter: Option<RecordFormatter>,
    /// Decode records as __transaction_state data (implies --deep-iteration).
    #[arg(long)]
    pub transaction_log_decoder: bool,
    /// The decoder `--transaction-log-decoder` uses; set by the caller (the
    /// binary passes the transaction coordinator's).
    #[arg(skip)]
    pub txn_record_formatter: Option<RecordFormatter>,
}

pub fn run(args: DumpLogArgs) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    dump(&args, &mut out)
}

/// Writes the dump of every file in `args` to `out`.
pub fn dump(args: &DumpLogArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let files: Vec<&PathBuf> = args.files_flag.iter().chain(args.files.iter()).collect();
    if files.is_empty() {
        anyhow::bail!("no files given");
    }
    for f in files {
        writeln!(out, "Dumping {}", f.display())?;
        let name = f.to_string_lossy();
        if name.ends_with(".log") {
            let formatter = if args.offsets_decoder {
                args.record_formatter
            } else if args.transaction_log_decoder {
                args.txn_record_formatter
            } else {
                None
            };
            let decoded = args.offsets_decoder || args.transaction_log_decoder;
            dump_log(
                f,
                args.deep_iteration || args.print_data_log || decoded,
                args.print_data_log || decoded,
                formatter,
                out,
            )?;
        } else if name.ends_with(".index") {
            dump_index(f, args.verify_index_only, out)?;
        } else if name.ends_with(".timeindex") {
            dump_time_index(f, args.verify_index_only, out)?;
        } else if name.ends_with(".txnindex") {
            dump_txn_index(f, out)?;
        } else {
            writeln!(out, "Ignoring unknown file {}", f.display())?;
        }
    }
    Ok(())
}

fn base_offset_of(path: &Path) -> i64 {
    path.file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn java_optional_long(v: Option<i64>) -> String {
    match v {
        Some(v) => format!("OptionalLong[{v}]"),
        None => "OptionalLong.empty".into(),
    }
}

fn timestamp_type_name(h: &BatchHeader) -> &'static str {
    match h.timestamp_type() {
        TimestampType::CreateTime => "CreateTime",
        TimestampType::LogAppendTime => "LogAppendTime",
    }
}

/// The batch line of kafka-dump-log for the batch at `position`.
pub fn batch_line(h: &BatchHeader, position: u64, valid: bool) -> String {
    let delete_horizon = h.has_delete_horizon().then_some(h.base_timestamp);
    format!(
        "baseOffset: {} lastOffset: {} count: {} baseSequence: {} lastSequence: {} producerId: {} \
         producerEpoch: {} partitionLeaderEpoch: {} isTransactional: {} isControl: {} \
         deleteHorizonMs: {} position: {} {}: {} size: {} magic: {} compresscodec: {} crc: {} isvalid: {}",
        h.base_offset,
        h.last_offset(),
        h.records_count,
        h.base_sequence,
        h.last_sequence(),
        h.producer_id,
        h.producer_epoch,
        h.partition_leader_epoch,
        h.is_transactional(),
        h.is_control(),
        java_optional_long(delete_horizon),
        position,
        timestamp_type_name(h),
        h.max_timestamp,
        h.total_size(),
        h.magic,
        h.compression().map(|c| c.name()).unwrap_or("unknown"),
        h.crc,
        valid
    )
}

fn record_sequence(h: &BatchHeader, offset: i64) -> i64 {
    if h.base_sequence < 0 {
        return -1;
    }
    let s = h.base_sequence as i64 + (offset - h.base_offset);
    if s > i32::MAX as i64 {
        s - i32::MAX as i64 - 1
    } else {
        s
    }
}

fn dump_log(
    path: &Path,
    deep: bool,
    print_data: bool,
    formatter: Option<RecordFormatter>,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    writeln!(out, "Log starting offset: {}", base_offset_of(path))?;
    let bytes = std::fs::read(path)?;
    let mut it = BatchIter::new(&bytes);
    for (pos, h) in it.by_ref() {
        let raw = &bytes[pos..pos + h.total_size()];
        let valid = batch::validate(raw).is_ok();
        writeln!(out, "{}", batch_line(&h, pos as u64, valid))?;
        if !deep {
            continue;
        }
        match records::decode_records(raw) {
            Ok(recs) => {
                for r in recs {
                    let key_size = r.key.as_ref().map(|k| k.len() as i64).unwrap_or(-1);
                    let value_size = r.value.as_ref().map(|v| v.len() as i64).unwrap_or(-1);
                    let header_keys: Vec<String> = r
                        .headers
                        .iter()
                        .map(|(k, _)| String::from_utf8_lossy(k).into_owned())
                        .collect();
                    write!(
                        out,
                        "{RECORD_INDENT} offset: {} {}: {} keySize: {key_size} valueSize: {value_size} \
                         sequence: {} headerKeys: [{}]",
                        r.offset,
                        timestamp_type_name(&h),
                        r.timestamp,
                        record_sequence(&h, r.offset),
                        header_keys.join(",")
                    )?;
                    if h.is_control() {
                        write!(out, "{}", control_text(&r))?;
                    } else if let Some(format) = formatter {
                        write!(out, " {}", format(r.key.as_deref(), r.value.as_deref()))?;
                    } else if print_data {
                        let mut prefix = " ";
                        if let Some(k) = &r.key {
                            write!(out, "{prefix}key: {}", String::from_utf8_lossy(k))?;
                            prefix = " ";
                        }
                        if let Some(v) = &r.value {
                            write!(out, "{prefix}payload: {}", String::from_utf8_lossy(v))?;
                        }
                    }
                    writeln!(out)?;
                }
            }
            Err(e) => writeln!(out, "{RECORD_INDENT} could not decode records: {e}")?,
        }
    }
    let trailing = bytes.len() - it.position();
    if trailing > 0 {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default();
        writeln!(out, "Found {trailing} invalid bytes at the end of {name}")?;
    }
    Ok(())
}

/// ` endTxnMarker: COMMIT coordinatorEpoch: 5` for COMMIT/ABORT markers.
fn control_text(r: &records::Record) -> String {
    let ty = r
        .key
        .as_ref()
        .filter(|k| k.len() >= 4)
        .map(|k| i16::from_be_bytes([k[2], k[3]]));
    match ty {
        Some(t @ (0 | 1)) => {
            let epoch = r
                .value
                .as_ref()
                .filter(|v| v.len() >= 6)
                .map(|v| i32::from_be_bytes([v[2], v[3], v[4], v[5]]))
                .unwrap_or(-1);
            let name = if t == 0 { "ABORT" } else { "COMMIT" };
            format!(" endTxnMarker: {name} coordinatorEpoch: {epoch}")
        }
        Some(t) => format!(" controlType: UNKNOWN({t})"),
        None => " controlType: UNKNOWN(-1)".into(),
    }
}

/// Batches of the `.log` beside an index file: (position, header).
fn sibling_log_batches(path: &Path) -> anyhow::Result<Vec<(usize, BatchHeader)>> {
    let log = path.with_extension("log");
    let bytes = std::fs::read(&log)?;
    Ok(BatchIter::new(&bytes).collect())
}

fn dump_index(path: &Path, verify_only: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let base = base_offset_of(path);
    let bytes = std::fs::read(path)?;
    let idx = OffsetIndex::decode(&bytes, u64::MAX)
        .ok_or_else(|| anyhow::anyhow!("{} is not a valid offset index", path.display()))?;
    let batches = if verify_only {
        sibling_log_batches(path)?
    } else {
        Vec::new()
    };
    for e in &idx.entries {
        // Long arithmetic as Kafka's tool does: a file name near i64::MAX
        // wraps instead of aborting the dump.
        let offset = base.wrapping_add(e.relative_offset as i64);
        if verify_only {
            match batches.iter().find(|(p, _)| *p as u32 == e.position) {
                Some((_, h)) if h.last_offset() == offset => {}
                Some((_, h)) => writeln!(
                    out,
                    "Index offset {offset} does not match the last offset {} of the batch at position {}",
                    h.last_offset(),
                    e.position
                )?,
                None => writeln!(out, "Index position {} is not a batch boundary (offset {offset})", e.position)?,
            }
        } else {
            writeln!(out, "offset: {offset} position: {}", e.position)?;
        }
    }
    Ok(())
}

fn dump_time_index(path: &Path, verify_only: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let base = base_offset_of(path);
    let bytes = std::fs::read(path)?;
    let idx = TimeIndex::decode(&bytes)
        .ok_or_else(|| anyhow::anyhow!("{} is not a valid time index", path.display()))?;
    let batches = if verify_only {
        sibling_log_batches(path)?
    } else {
        Vec::new()
    };
    for e in &idx.entries {
        // Long arithmetic as Kafka's tool does: a file name near i64::MAX
        // wraps instead of aborting the dump.
        let offset = base.wrapping_add(e.relative_offset as i64);
        if verify_only {
            match batches.iter().find(|(_, h)| h.last_offset() >= offset) {
                Some((_, h)) if h.last_offset() == offset => {
                    let max_so_far = batches
                        .iter()
                        .take_while(|(_, b)| b.last_offset() <= offset)
                        .map(|(_, b)| b.max_timestamp)
                        .max()
                        .unwrap_or(i64::MIN);
                    if max_so_far != e.timestamp_ms {
                        writeln!(
                            out,
                            "Index timestamp: {}, log timestamp: {max_so_far}",
                            e.timestamp_ms
                        )?;
                    }
                }
                Some((_, h)) => writeln!(
                    out,
                    "Indexed offset: {offset}, found log offset: {}",
                    h.last_offset()
                )?,
                None => writeln!(out, "Indexed offset: {offset}, found log offset: -1")?,
            }
        } else {
            writeln!(out, "timestamp: {} offset: {offset}", e.timestamp_ms)?;
        }
    }
    Ok(())
}

fn dump_txn_index(path: &Path, out: &mut dyn Write) -> anyhow::Result<()> {
    let bytes = std::fs::read(path)?;
    for c in bytes.chunks_exact(TXN_INDEX_ENTRY_BYTES) {
        let i64_at = |at: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&c[at..at + 8]);
            i64::from_be_bytes(a)
        };
        writeln!(
            out,
            "version: {} producerId: {} firstOffset: {} lastOffset: {} lastStableOffset: {}",
            i16::from_be_bytes([c[0], c[1]]),
            i64_at(2),
            i64_at(10),
            i64_at(18),
            i64_at(26)
        )?;
    }
    if bytes.len() % TXN_INDEX_ENTRY_BYTES != 0 {
        writeln!(
            out,
            "Found {} invalid bytes at the end",
            bytes.len() % TXN_INDEX_ENTRY_BYTES
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_of_a_segment_named_near_i64_max_dumps() {
        // Found by the `index_files` fuzz target: the base offset of the
        // file name plus an entry's relative offset overflowed.
        let d = tempfile::tempdir().unwrap();
        let stem = d.path().join(format!("{:020}", i64::MAX));
        let entry = [0u8, 0, 0, 15, 0, 0, 0, 0];
        let time_entry = [0u8, 0, 0, 0, 0, 0, 0, 16, 0, 0, 0, 15];
        std::fs::write(stem.with_extension("index"), entry).unwrap();
        std::fs::write(stem.with_extension("timeindex"), time_entry).unwrap();
        let args = DumpLogArgs {
            files: vec![
                stem.with_extension("index"),
                stem.with_extension("timeindex"),
            ],
            ..DumpLogArgs::default()
        };
        let mut out = Vec::new();
        dump(&args, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let wrapped = i64::MAX.wrapping_add(15);
        assert!(
            text.contains(&format!("offset: {wrapped} position: 0")),
            "{text}"
        );
        assert!(
            text.contains(&format!("timestamp: 16 offset: {wrapped}")),
            "{text}"
        );
    }
}
