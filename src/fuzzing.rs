//! Entry points for the cargo-fuzz targets in `fuzz/` (see `fuzz/README.md`).
//!
//! Each function takes the fuzzer's bytes (or a value the target built from
//! them), runs one decoder or on-disk parser the way the broker runs it, and
//! asserts what must hold for every input: no panic, allocations bounded by
//! the input, and, where an encoder exists, that decoding what was encoded
//! gives the value back. A failed assertion or a panic is a finding. The
//! functions are thin on purpose: they live inside the crate so that the
//! parsers keep their own visibility, and every check here names the
//! property, so that a crash report says which one broke.
//!
//! Some formats guard their bytes with a checksum (batch CRCs, snapshot and
//! metadata-log CRCs). A fuzzer rarely guesses a CRC, so those entry points
//! read a flag byte first that tells them to recompute the checksums of the
//! input before parsing it; without the flag the bytes are parsed as given.
//!
//! Parsers of files get a scratch directory of their own process
//! (`/dev/shm` when present, so that the fuzzer's file writes stay in
//! memory); every file is removed again before the entry point returns.
//! Nothing here is used by the broker.

use crate::group::records as group_records;
use crate::group::state::CommittedOffset;
use crate::log::checkpoint;
use crate::log::dump::{self, DumpLogArgs};
use crate::log::index::{OffsetIndex, TimeIndex, OFFSET_INDEX_ENTRY_BYTES, TIME_INDEX_ENTRY_BYTES};
use crate::log::records as log_records;
use crate::log::segment::Segment;
use crate::metadata::{store as metadata_store, MetadataImage, MetadataRecord};
use crate::producer::snapshot;
use crate::producer::txn_index::{self, AbortedTxn};
use crate::producer::{ProducerEntry, ProducerStateTable};
use crate::protocol::fetch::{
    encode_fetch_response, FetchResponse, FETCH_MAX_VERSION, FETCH_MIN_VERSION,
};
use crate::protocol::frame::{declared_frame_len, frame_len, FRAME_PREFIX_BYTES};
use crate::protocol::produce::{
    decode_produce_request, single_batch_for_version, validate_for_append, PRODUCE_MAX_VERSION,
    PRODUCE_MIN_VERSION,
};
use crate::protocol::{parse_request_header, supported, RequestHeader, SOCKET_REQUEST_MAX_BYTES};
use crate::record::batch::{self, BatchHeader, BATCH_HEADER_BYTES, LOG_OVERHEAD_BYTES, MAGIC_V2};
use crate::record::compression::decompress;
use crate::record::records::{decode_batch, decode_records};
use crate::record::{recompress, Compression, RecordsChunk};
use crate::txn::log as txn_log;
use crate::txn::{TxnMetadata, TxnState};
use crate::types::TopicPartition;
use bytes::{Bytes, BytesMut};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Bound on decompressed records in these entry points: 1 MiB. The broker
/// allows 100 MiB ([`crate::record::compression::DECOMPRESSED_RECORDS_MAX_BYTES`]);
/// a smaller bound keeps one execution fast while still proving the bound
/// is enforced, and inputs that decompress within it are then also run
/// through the broker's own (100 MiB) paths.
pub const FUZZ_DECOMPRESSED_MAX_BYTES: usize = 1 << 20;
/// `max.message.bytes` the produce checks run with: Kafka's default, 1 MiB + 12.
const MAX_MESSAGE_BYTES_DEFAULT: usize = 1_048_588;
/// Producers remembered per partition in the producer-state checks.
const PRODUCERS_MAX: usize = 16;
/// The five codecs, in id order.
const CODECS: [Compression; 5] = [
    Compression::None,
    Compression::Gzip,
    Compression::Snappy,
    Compression::Lz4,
    Compression::Zstd,
];
/// Flag bit: recompute checksums before parsing.
const FLAG_FIX_CHECKSUMS: u8 = 0x01;
/// [`producer_snapshot`]: the header names the older format (version 2).
const FLAG_OLDER_FORMAT: u8 = 0x02;

/// The scratch directory of this process, created on first use.
fn scratch_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = Path::new("/dev/shm");
        let base = if base.is_dir() {
            base.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!("fjord-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch directory for fuzzing");
        dir
    })
}

/// Removes every file in the scratch directory (sub-directories included).
fn clear_scratch() {
    let dir = scratch_dir();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            let _ = if p.is_dir() {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
        }
    }
}

fn write_file(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).expect("write a scratch file");
}

/// Recomputes the CRC of every complete v2 batch in `buf`, front to back,
/// stopping where no complete batch starts.
fn fix_batch_crcs(buf: &mut [u8]) {
    let mut pos = 0usize;
    while buf.len() - pos >= BATCH_HEADER_BYTES {
        let rest = &mut buf[pos..];
        let len = i32::from_be_bytes([rest[8], rest[9], rest[10], rest[11]]);
        let Ok(len) = usize::try_from(len) else { break };
        let total = len + LOG_OVERHEAD_BYTES;
        if total < BATCH_HEADER_BYTES || total > rest.len() || rest[16] as i8 != MAGIC_V2 {
            break;
        }
        let crc = batch::compute_crc(&rest[..total]);
        rest[17..21].copy_from_slice(&crc.to_be_bytes());
        pos += total;
    }
}

// ---------------------------------------------------------------------------
// Requests.

/// A request as the connection reads it: an optional 4-byte length prefix
/// (first byte of `data`, bit 0), the request header, then the body decoded
/// for its api key and version as the handlers decode it.
///
/// Checks: the frame helpers agree with each other; the header parser
/// consumes at least the fixed 8 bytes and never more than the frame; no
/// body decoder panics.
pub fn request_frame(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let frame: &[u8] = if flags & 1 == 1 {
        let declared = declared_frame_len(rest, SOCKET_REQUEST_MAX_BYTES);
        let complete = frame_len(rest, SOCKET_REQUEST_MAX_BYTES);
        match declared {
            Err(e) => {
                assert_eq!(
                    complete,
                    Err(e),
                    "frame_len and declared_frame_len disagree"
                );
                return;
            }
            Ok(None) => {
                assert!(rest.len() < FRAME_PREFIX_BYTES);
                assert_eq!(complete, Ok(None));
                return;
            }
            Ok(Some(len)) => {
                assert!(len <= SOCKET_REQUEST_MAX_BYTES);
                match rest.get(FRAME_PREFIX_BYTES..FRAME_PREFIX_BYTES + len) {
                    Some(body) => {
                        assert_eq!(complete, Ok(Some(len)));
                        body
                    }
                    None => {
                        assert_eq!(complete, Ok(None), "a partial frame is not complete");
                        return;
                    }
                }
            }
        }
    } else {
        rest
    };
    let mut buf = BytesMut::from(frame);
    let Ok(header) = parse_request_header(&mut buf) else {
        return;
    };
    assert!(
        buf.len() + 8 <= frame.len(),
        "the header is at least 8 bytes and within the frame"
    );
    request_body(&header, buf);
}

/// Decodes a request body as `handlers::dispatch` would route it: Produce
/// with fjord's decoder, the versions newer than kafka-protocol's schemas
/// with fjord's hand codecs (`protocol::hand_versions`,
/// `protocol::hand_versions_more`), every other supported api with
/// kafka-protocol's request type through `handlers::decode`. ApiVersions'
/// handler reads only a v5 body; older ones are decoded here all the same,
/// as clients send them.
fn request_body(header: &RequestHeader, mut body: BytesMut) {
    use crate::handlers::decode;
    use kafka_protocol::messages::*;
    let Ok(key) = ApiKey::try_from(header.api_key) else {
        return;
    };
    if !supported(header.api_key, header.api_version) {
        return;
    }
    macro_rules! kp {
        ($t:ty) => {{
            let _ = decode::<$t>(header, &mut body);
        }};
    }
    use crate::protocol::hand_versions::*;
    use crate::protocol::hand_versions_more::*;
    let v = header.api_version;
    match key {
        ApiKey::Produce => produce_request_body(body, header.api_version),
        // The versions newer than the crate's schemas, decoded by hand.
        ApiKey::OffsetCommit if v >= OFFSET_COMMIT_TOPIC_ID_VERSION => {
            kp!(OffsetCommitRequestV10)
        }
        ApiKey::OffsetFetch if v >= OFFSET_FETCH_TOPIC_ID_VERSION => kp!(OffsetFetchRequestV10),
        ApiKey::WriteTxnMarkers if v >= WRITE_TXN_MARKERS_TV_VERSION => {
            kp!(WriteTxnMarkersRequestV2)
        }
        ApiKey::DescribeLogDirs if v >= DESCRIBE_LOG_DIRS_CORDONED_VERSION => {
            kp!(DescribeLogDirsRequestV5)
        }
        ApiKey::ListOffsets if v >= LIST_OFFSETS_PENDING_UPLOAD_VERSION => {
            kp!(ListOffsetsRequestV11)
        }
        ApiKey::ApiVersions if v >= API_VERSIONS_REBOOTSTRAP_VERSION => {
            kp!(ApiVersionsRequestV5)
        }
        ApiKey::TxnOffsetCommit if v >= TXN_OFFSET_COMMIT_TOPIC_ID_VERSION => {
            kp!(TxnOffsetCommitRequestV6)
        }
        ApiKey::DeleteGroups if v >= DELETE_GROUPS_MESSAGE_VERSION => {
            kp!(DeleteGroupsRequestV3)
        }
        ApiKey::Fetch => kp!(FetchRequest),
        ApiKey::ListOffsets => kp!(ListOffsetsRequest),
        ApiKey::Metadata => kp!(MetadataRequest),
        ApiKey::ApiVersions => kp!(ApiVersionsRequest),
        ApiKey::CreateTopics => kp!(CreateTopicsRequest),
        ApiKey::DeleteTopics => kp!(DeleteTopicsRequest),
        ApiKey::InitProducerId => kp!(InitProducerIdRequest),
        ApiKey::DescribeConfigs => kp!(DescribeConfigsRequest),
        ApiKey::AlterConfigs => kp!(AlterConfigsRequest),
        ApiKey::DescribeLogDirs => kp!(DescribeLogDirsRequest),
        ApiKey::DeleteRecords => kp!(DeleteRecordsRequest),
        ApiKey::CreatePartitions => kp!(CreatePartitionsRequest),
        ApiKey::IncrementalAlterConfigs => kp!(IncrementalAlterConfigsRequest),
        ApiKey::DescribeCluster => kp!(DescribeClusterRequest),
        ApiKey::AddPartitionsToTxn => kp!(AddPartitionsToTxnRequest),
        ApiKey::AddOffsetsToTxn => kp!(AddOffsetsToTxnRequest),
        ApiKey::EndTxn => kp!(EndTxnRequest),
        ApiKey::WriteTxnMarkers => kp!(WriteTxnMarkersRequest),
        ApiKey::DescribeTransactions => kp!(DescribeTransactionsRequest),
        ApiKey::ListTransactions => kp!(ListTransactionsRequest),
        ApiKey::DescribeProducers => kp!(DescribeProducersRequest),
        ApiKey::FindCoordinator => kp!(FindCoordinatorRequest),
        ApiKey::JoinGroup => kp!(JoinGroupRequest),
        ApiKey::SyncGroup => kp!(SyncGroupRequest),
        ApiKey::Heartbeat => kp!(HeartbeatRequest),
        ApiKey::LeaveGroup => kp!(LeaveGroupRequest),
        ApiKey::OffsetCommit => kp!(OffsetCommitRequest),
        ApiKey::OffsetFetch => kp!(OffsetFetchRequest),
        ApiKey::ListGroups => kp!(ListGroupsRequest),
        ApiKey::DescribeGroups => kp!(DescribeGroupsRequest),
        ApiKey::DeleteGroups => kp!(DeleteGroupsRequest),
        ApiKey::OffsetDelete => kp!(OffsetDeleteRequest),
        ApiKey::TxnOffsetCommit => kp!(TxnOffsetCommitRequest),
        _ => {}
    }
}

/// fjord's Produce decoder on a body, then the per-partition record checks
/// on every partition it yields.
fn produce_request_body(body: BytesMut, version: i16) {
    let len = body.len();
    let Ok(req) = decode_produce_request(body, version) else {
        return;
    };
    let mut records_bytes = 0usize;
    for topic in req.topics {
        for p in topic.partitions {
            if let Some(records) = p.records {
                records_bytes += records.len();
                produce_records(records, version, false);
            }
        }
    }
    assert!(records_bytes <= len, "records are slices of the body");
}

/// Produce decoding and record-batch validation. `data[0]` picks the
/// Produce version (3-13), `data[1]` the flags: bit 0 recomputes batch
/// CRCs, bit 1 decodes `data[2..]` as a whole Produce request body, else as
/// one partition's records field.
pub fn produce_decode(data: &[u8]) {
    let [v, flags, rest @ ..] = data else {
        return;
    };
    let span = (PRODUCE_MAX_VERSION - PRODUCE_MIN_VERSION + 1) as u8;
    let version = PRODUCE_MIN_VERSION + (v % span) as i16;
    let fix = flags & FLAG_FIX_CHECKSUMS != 0;
    if flags & 0x02 != 0 {
        let len = rest.len();
        let Ok(req) = decode_produce_request(BytesMut::from(rest), version) else {
            return;
        };
        let mut records_bytes = 0usize;
        for topic in req.topics {
            for p in topic.partitions {
                if let Some(records) = p.records {
                    records_bytes += records.len();
                    produce_records(records, version, fix);
                }
            }
        }
        assert!(records_bytes <= len, "records are slices of the body");
    } else {
        produce_records(BytesMut::from(rest), version, fix);
    }
}

/// The produce handler's steps 2 and 5 on one partition's records
/// (exactly one batch, then baseOffset/size/CRC/codec/count checks), the
/// producer-state check, and a bounded look inside the batch: its records
/// section decompressed with every codec, its records decoded, and, when
/// they decode, the broker's own decoders and recompression compared.
fn produce_records(mut records: BytesMut, version: i16, fix_crc: bool) {
    let Ok(header) = single_batch_for_version(&records, version) else {
        return;
    };
    assert_eq!(header.magic, MAGIC_V2);
    assert!(header.total_size() >= BATCH_HEADER_BYTES);
    assert!(
        header.total_size() <= records.len(),
        "single_batch accepts only a complete batch"
    );
    records.truncate(header.total_size());
    if fix_crc {
        fix_batch_crcs(&mut records);
    }
    let header = BatchHeader::parse(&records).expect("the header parsed before");
    let appendable = validate_for_append(&records, &header, MAX_MESSAGE_BYTES_DEFAULT).is_ok();
    if appendable {
        let validated = batch::validate(&records).expect("an appendable batch is valid");
        assert_eq!(validated, header);
        let mut producers = ProducerStateTable::new(PRODUCERS_MAX);
        let _ = producers.check(&header);
        producers.record(&header, 0, 0);
        let _ = producers.check(&header);
    }
    let body = &records[BATCH_HEADER_BYTES..];
    for codec in CODECS {
        if let Ok(raw) = decompress(codec, body, FUZZ_DECOMPRESSED_MAX_BYTES) {
            assert!(raw.len() <= FUZZ_DECOMPRESSED_MAX_BYTES, "{codec:?} bound");
        }
    }
    let Ok(codec) = header.compression() else {
        return;
    };
    let Ok(raw) = decompress(codec, body, FUZZ_DECOMPRESSED_MAX_BYTES) else {
        return;
    };
    // Within the small bound, the broker's 100 MiB paths are safe to run.
    let ours = decode_records(&Bytes::from(raw), header.records_count);
    let full = decode_batch(&records).map(|(_, r)| r);
    assert_eq!(full, ours, "decode_batch and decode_records disagree");
    let Ok(ours) = ours else { return };
    assert_eq!(ours.len(), header.records_count as usize);
    // The dump-log / ListOffsets decoder reads what the strict one accepts.
    let loose = log_records::decode_records(&records).expect("log decoder accepts a valid batch");
    assert_eq!(loose.len(), ours.len());
    for (a, b) in loose.iter().zip(&ours) {
        assert_eq!(a.key.as_deref(), b.key.as_deref());
        assert_eq!(a.value.as_deref(), b.value.as_deref());
        assert_eq!(a.offset, b.offset(&header));
        assert_eq!(a.headers.len(), b.headers.len());
    }
    let _ = log_records::first_record_at_or_after(&records, header.base_timestamp);
    // The handler recompresses only batches that passed step 5 (recompress
    // does not check the CRC it is handed).
    if !appendable {
        return;
    }
    for target in CODECS {
        let out = recompress(&records, target).expect("recompressing a decodable batch");
        let h = batch::validate(&out).expect("a recompressed batch is valid");
        assert_eq!(h.records_count, header.records_count);
        let (_, again) = decode_batch(&out).expect("a recompressed batch decodes");
        assert_eq!(
            again, ours,
            "recompression to {target:?} changed the records"
        );
    }
}

// ---------------------------------------------------------------------------
// Fetch responses.

/// Encodes `resp` at `version` (mapped into 4-16) and decodes the bytes with
/// kafka-protocol's FetchResponse: every field the version carries must come
/// back, the records bytes unchanged, and the length reported must be the
/// length written. The records must be `RecordsChunk::Memory`.
pub fn fetch_encode(resp: FetchResponse, version: i16) {
    use kafka_protocol::messages::FetchResponse as KpFetch;
    use kafka_protocol::protocol::Decodable;
    let span = FETCH_MAX_VERSION - FETCH_MIN_VERSION + 1;
    let version = FETCH_MIN_VERSION + version.rem_euclid(span);
    let expected = resp.clone();
    let (parts, total) = encode_fetch_response(resp, version);
    let mut flat = Vec::with_capacity(total);
    for part in &parts {
        match part {
            RecordsChunk::Memory(b) => flat.extend_from_slice(b),
            _ => panic!("only memory chunks go in"),
        }
    }
    assert_eq!(flat.len(), total, "reported length");
    let mut bytes = Bytes::from(flat);
    let got = KpFetch::decode(&mut bytes, version).expect("kafka-protocol decodes our response");
    assert!(
        bytes.is_empty(),
        "{} bytes left after the response",
        bytes.len()
    );
    assert_eq!(got.throttle_time_ms, expected.throttle_time_ms);
    if version >= 7 {
        assert_eq!(got.error_code, expected.error_code);
        assert_eq!(got.session_id, expected.session_id);
    }
    assert_eq!(got.responses.len(), expected.topics.len());
    for (g, e) in got.responses.iter().zip(&expected.topics) {
        if version >= 13 {
            assert_eq!(g.topic_id.as_bytes(), &e.topic_id);
        } else {
            assert_eq!(g.topic.0.as_str(), e.name);
        }
        assert_eq!(g.partitions.len(), e.partitions.len());
        for (gp, ep) in g.partitions.iter().zip(&e.partitions) {
            assert_eq!(gp.partition_index, ep.index);
            assert_eq!(gp.error_code, ep.error_code);
            assert_eq!(gp.high_watermark, ep.high_watermark);
            assert_eq!(gp.last_stable_offset, ep.last_stable_offset);
            if version >= 5 {
                assert_eq!(gp.log_start_offset, ep.log_start_offset);
            }
            let aborted = gp.aborted_transactions.as_ref().map(|v| {
                v.iter()
                    .map(|a| (a.producer_id.0, a.first_offset))
                    .collect::<Vec<_>>()
            });
            assert_eq!(aborted, ep.aborted_transactions);
            if version >= 11 {
                assert_eq!(gp.preferred_read_replica.0, ep.preferred_read_replica);
            }
            let mut records = Vec::new();
            for c in &ep.records {
                if let RecordsChunk::Memory(b) = c {
                    records.extend_from_slice(b);
                }
            }
            assert_eq!(gp.records.as_deref(), Some(&records[..]), "records bytes");
            if version >= 12 {
                let leader = ep.current_leader.unwrap_or((-1, -1));
                assert_eq!(
                    (
                        gp.current_leader.leader_id.0,
                        gp.current_leader.leader_epoch
                    ),
                    leader
                );
            }
        }
    }
    if version >= 16 {
        assert_eq!(got.node_endpoints.len(), expected.node_endpoints.len());
        for (g, e) in got.node_endpoints.iter().zip(&expected.node_endpoints) {
            assert_eq!(g.node_id.0, e.node_id);
            assert_eq!(g.host.as_str(), e.host);
            assert_eq!(g.port, e.port);
            assert_eq!(g.rack.as_deref(), e.rack.as_deref());
        }
    }
}

// ---------------------------------------------------------------------------
// Segments and indexes.

/// Reads a little-endian u64 from the front of `data`, if it has 8 bytes.
fn take_u64(data: &[u8]) -> Option<(u64, &[u8])> {
    let (head, rest) = data.split_first_chunk::<8>()?;
    Some((u64::from_le_bytes(*head), rest))
}

/// The recovery scan of a segment file. `data[0]` holds the flags (bit 0:
/// recompute batch CRCs; bits 1-3: the index interval, 0-7 KiB; bits 4-5:
/// which dump-log decoder to run), then the segment's base offset (8 bytes,
/// made non-negative), the scan's minimum base offset (8 bytes, ditto), then
/// the file's bytes.
///
/// Checks: the valid prefix is within the file, a clean scan covers all of
/// it, the rebuilt indexes keep their invariants and round-trip through
/// their file format, and scanning the valid prefix alone gives the same
/// result with no stop reason. Then the valid batches replay into the
/// producer table, their records decode with the dump/ListOffsets decoder,
/// and `dump-log` prints the file.
pub fn segment_recovery(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let Some((base, rest)) = take_u64(rest) else {
        return;
    };
    let Some((min_base, rest)) = take_u64(rest) else {
        return;
    };
    let base = (base >> 1) as i64;
    let min_base = (min_base >> 1) as i64;
    let index_interval_bytes = u32::from((flags >> 1) & 0x07) * 1024;
    let mut bytes = rest.to_vec();
    if flags & FLAG_FIX_CHECKSUMS != 0 {
        fix_batch_crcs(&mut bytes);
    }
    let dir = scratch_dir();
    clear_scratch();
    let seg = Segment::new(dir, base, 0);
    write_file(&seg.log_path, &bytes);
    let first = seg
        .recover_scan(min_base, index_interval_bytes)
        .expect("scan of a readable file");
    assert_eq!(first.file_len, bytes.len() as u64);
    assert!(
        first.valid_len <= first.file_len,
        "valid prefix within the file"
    );
    if first.stop_reason.is_none() {
        assert_eq!(first.valid_len, first.file_len, "a clean scan reads all");
    }
    assert!(!first.tail_is_zeros || first.tail_is_padding);
    let valid_len = first.valid_len as usize;
    let next_offset = seg.next_offset.get();
    assert!(next_offset >= base);
    assert_eq!(seg.size.get(), first.valid_len);
    let index = seg.index.borrow().entries.clone();
    let time_index = seg.time_index.borrow().entries.clone();
    check_offset_index(&index, first.valid_len);
    check_time_index(&time_index);
    let [(_, ib), (_, tb)] = seg.encoded_indexes();
    let oi = OffsetIndex::decode(&ib, first.valid_len.max(1)).expect("our .index decodes");
    // A decoder stops at an all-zero entry after the first (preallocated
    // space), so an entry (0, 0) past the first cannot come back; the scan
    // never writes one, as offsets and positions strictly increase.
    assert_eq!(oi.entries, index, ".index round trip");
    let ti = TimeIndex::decode(&tb).expect("our .timeindex decodes");
    if time_index
        .first()
        .is_some_and(|e| e.timestamp_ms == 0 && e.relative_offset == 0)
    {
        assert!(ti.entries.is_empty());
    } else {
        assert_eq!(ti.entries, time_index, ".timeindex round trip");
    }

    // The valid prefix alone scans the same, and cleanly.
    let seg2 = Segment::new(dir, base, 0);
    write_file(&seg2.log_path, &bytes[..valid_len]);
    let second = seg2
        .recover_scan(min_base, index_interval_bytes)
        .expect("scan of a readable file");
    assert_eq!(second.valid_len, first.valid_len, "re-scan of the prefix");
    assert!(second.stop_reason.is_none(), "{:?}", second.stop_reason);
    assert_eq!(seg2.next_offset.get(), next_offset);
    assert_eq!(seg2.index.borrow().entries, index);
    assert_eq!(seg2.time_index.borrow().entries, time_index);

    // Replay and record decoding, as the log and ListOffsets do.
    let prefix = &bytes[..valid_len];
    let mut producers = ProducerStateTable::new(PRODUCERS_MAX);
    let mut batches = 0usize;
    for (pos, h) in batch::BatchIter::new(prefix) {
        batches += 1;
        let raw = &prefix[pos..pos + h.total_size()];
        batch::validate(raw).expect("every batch of the valid prefix is valid");
        producers.record(&h, h.base_offset, 0);
        if let Ok(records) = log_records::decode_records(raw) {
            assert!(records.len() <= raw.len(), "a record takes a byte or more");
        }
        let _ = log_records::first_record_at_or_after(raw, h.max_timestamp);
    }
    if valid_len > 0 {
        assert!(batches > 0);
    }

    // dump-log over the whole file, with one of its decoders.
    let mut args = DumpLogArgs {
        files: vec![seg.log_path.clone()],
        deep_iteration: true,
        print_data_log: flags & 0x10 != 0,
        ..DumpLogArgs::default()
    };
    if flags & 0x20 != 0 {
        if flags & 0x10 != 0 {
            args.offsets_decoder = true;
            args.record_formatter = Some(group_records::describe);
        } else {
            args.transaction_log_decoder = true;
            args.txn_record_formatter = Some(txn_log::describe);
        }
    }
    let mut out = Vec::new();
    dump::dump(&args, &mut out).expect("dump-log of a readable file");
    clear_scratch();
}

fn check_offset_index(entries: &[crate::log::index::OffsetEntry], log_len: u64) {
    for w in entries.windows(2) {
        assert!(
            w[0].relative_offset < w[1].relative_offset,
            "offsets increase"
        );
        assert!(w[0].position < w[1].position, "positions increase");
    }
    for e in entries {
        assert!(
            u64::from(e.position) < log_len.max(1),
            "position within the log"
        );
        assert!(e.relative_offset <= i32::MAX as u32);
    }
}

fn check_time_index(entries: &[crate::log::index::TimeEntry]) {
    for w in entries.windows(2) {
        assert!(w[0].timestamp_ms < w[1].timestamp_ms, "timestamps increase");
        assert!(w[0].relative_offset <= w[1].relative_offset);
    }
}

/// `.index`, `.timeindex` and `.txnindex` parsing and lookups. `data`: the
/// log size (8 bytes), the length of the `.index` part (2 bytes), that
/// part, then the `.timeindex` part; the `.txnindex` is the whole input.
///
/// Checks: what decodes keeps the invariants, encodes back to the bytes it
/// came from, and answers every lookup as a linear search would; pushes
/// keep the invariants; dump-log reads all three (with and without
/// `--verify-index-only` against a `.log` of the same bytes).
pub fn index_files(data: &[u8]) {
    let Some((log_size, rest)) = take_u64(data) else {
        return;
    };
    let Some((split, rest)) = rest.split_first_chunk::<2>() else {
        return;
    };
    let split = (u16::from_le_bytes(*split) as usize).min(rest.len());
    let (ib, tb) = rest.split_at(split);
    let probes: Vec<u64> = data
        .chunks_exact(4)
        .take(8)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u64)
        .collect();

    if let Some(idx) = OffsetIndex::decode(ib, log_size) {
        check_offset_index(&idx.entries, log_size);
        let enc = idx.encode();
        assert_eq!(enc.len(), idx.entries.len() * OFFSET_INDEX_ENTRY_BYTES);
        assert_eq!(&enc[..], &ib[..enc.len()], "encode gives the decoded bytes");
        assert!(ib[enc.len()..].len() % OFFSET_INDEX_ENTRY_BYTES == 0);
        let again = OffsetIndex::decode(&enc, log_size).expect("re-decode");
        assert_eq!(again.entries, idx.entries);
        for &p in &probes {
            let rel = p as u32;
            let naive = idx
                .entries
                .iter()
                .rev()
                .find(|e| e.relative_offset <= rel)
                .map_or(0, |e| e.position);
            assert_eq!(idx.lookup(rel), naive, "lookup({rel})");
            let (after, at_most, upper) = (p / 3, p, p.rotate_left(7) & 0xffff_ffff);
            let naive = idx
                .entries
                .iter()
                .rev()
                .find(|e| u64::from(e.position) <= at_most && u64::from(e.relative_offset) < upper)
                .map(|e| u64::from(e.position))
                .filter(|&pos| pos > after);
            assert_eq!(idx.last_position_within(after, at_most, upper), naive);
            let mut t = idx.clone();
            t.truncate_to_position(rel);
            assert!(t.entries.iter().all(|e| e.position < rel));
            check_offset_index(&t.entries, log_size);
        }
    }
    let mut pushed = OffsetIndex::default();
    for c in ib.chunks_exact(OFFSET_INDEX_ENTRY_BYTES) {
        let rel = u32::from_be_bytes([c[0], c[1], c[2], c[3]]) & 0x7fff_ffff;
        let pos = u32::from_be_bytes([c[4], c[5], c[6], c[7]]);
        pushed.push(rel, pos);
    }
    check_offset_index(&pushed.entries, u64::MAX);

    if let Some(idx) = TimeIndex::decode(tb) {
        check_time_index(&idx.entries);
        let enc = idx.encode();
        assert_eq!(enc.len(), idx.entries.len() * TIME_INDEX_ENTRY_BYTES);
        assert_eq!(&enc[..], &tb[..enc.len()], "encode gives the decoded bytes");
        let again = TimeIndex::decode(&enc).expect("re-decode");
        assert_eq!(again.entries, idx.entries);
        assert_eq!(idx.last(), idx.entries.last().copied());
        for &p in &probes {
            let ts = p as i64 - (1 << 31);
            let naive = idx
                .entries
                .iter()
                .rev()
                .find(|e| e.timestamp_ms <= ts)
                .map_or(0, |e| e.relative_offset);
            assert_eq!(idx.lookup(ts), naive, "lookup({ts})");
        }
    }
    let mut pushed = TimeIndex::default();
    for c in tb.chunks_exact(TIME_INDEX_ENTRY_BYTES) {
        let mut t = [0u8; 8];
        t.copy_from_slice(&c[..8]);
        pushed.maybe_push(
            i64::from_be_bytes(t),
            u32::from_be_bytes([c[8], c[9], c[10], c[11]]),
        );
    }
    check_time_index(&pushed.entries);

    // `.txnindex` entries.
    for c in data.chunks(txn_index::ENTRY_BYTES) {
        if let Some(e) = AbortedTxn::decode(c) {
            assert_eq!(c.len(), txn_index::ENTRY_BYTES);
            assert_eq!(AbortedTxn::decode(&e.encode()), Some(e));
            assert_eq!(&e.encode()[..], c, "encode gives the decoded bytes");
        }
    }

    // dump-log reads the files as a person would hand them over.
    let dir = scratch_dir();
    clear_scratch();
    let stem = dir.join(format!("{:020}", log_size >> 1));
    let files = ["log", "index", "timeindex", "txnindex"].map(|ext| stem.with_extension(ext));
    write_file(&files[0], tb);
    write_file(&files[1], ib);
    write_file(&files[2], tb);
    write_file(&files[3], data);
    for verify_index_only in [false, true] {
        let args = DumpLogArgs {
            files: files[1..].to_vec(),
            verify_index_only,
            ..DumpLogArgs::default()
        };
        let mut out = Vec::new();
        // An index that fails its checks is an error, not a panic.
        let _ = dump::dump(&args, &mut out);
    }
    assert_eq!(txn_index::load_dir(dir).len(), txn_load_count(data));
    clear_scratch();
}

fn txn_load_count(data: &[u8]) -> usize {
    data.chunks_exact(txn_index::ENTRY_BYTES)
        .filter(|c| AbortedTxn::decode(c).is_some())
        .count()
}

// ---------------------------------------------------------------------------
// Checkpoints, snapshots, the metadata log.

/// A checkpoint file's text (`data` as UTF-8, lossily): decoding never
/// panics, and what decodes re-encodes to text that decodes the same; the
/// file read back through `read_all` keeps the smallest offset per
/// partition.
pub fn checkpoint(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let Some(entries) = checkpoint::decode(&text) else {
        return;
    };
    let again = checkpoint::decode(&checkpoint::encode(&entries)).expect("re-decode");
    assert_eq!(again, entries, "decode(encode(decode(x)))");
    let dir = scratch_dir();
    clear_scratch();
    let path = checkpoint::shard_file(dir, checkpoint::RECOVERY_POINT_CHECKPOINT, 0);
    write_file(&path, text.as_bytes());
    let read = checkpoint::read_all(dir, checkpoint::RECOVERY_POINT_CHECKPOINT);
    let mut expected: HashMap<TopicPartition, i64> = HashMap::new();
    for (tp, off) in entries {
        let e = expected.entry(tp).or_insert(off);
        *e = (*e).min(off);
    }
    assert_eq!(read, expected);
    clear_scratch();
}

/// decode(encode(x)) == x for checkpoint entries whose topics are valid
/// Kafka topic names (the only ones a checkpoint holds).
pub fn checkpoint_round_trip(entries: &[(TopicPartition, i64)]) {
    if entries
        .iter()
        .any(|(tp, _)| crate::metadata::validate_topic_name(&tp.topic).is_err())
    {
        return;
    }
    let text = checkpoint::encode(entries);
    assert_eq!(checkpoint::decode(&text).as_deref(), Some(entries));
}

/// A producer snapshot file. `data[0]` holds the flags: bit 0 wraps
/// `data[1..]` as the payload of a header with the right magic, version,
/// CRC and length, so the rkyv archive validation is reached; bit 1 makes
/// that header's version 2 (the older format still read) instead of the
/// current one. What views re-encodes to a snapshot whose entries are the
/// same.
pub fn producer_snapshot(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let bytes = if flags & FLAG_FIX_CHECKSUMS != 0 {
        let mut b = Vec::with_capacity(16 + rest.len());
        b.extend_from_slice(b"FJPS");
        let version = if flags & FLAG_OLDER_FORMAT != 0 {
            snapshot::FORMAT_VERSION_2
        } else {
            snapshot::FORMAT_VERSION
        };
        b.extend_from_slice(&version.to_le_bytes());
        b.extend_from_slice(&[0, 0]);
        b.extend_from_slice(&crc32c::crc32c(rest).to_le_bytes());
        b.extend_from_slice(&(rest.len() as u32).to_le_bytes());
        b.extend_from_slice(rest);
        b
    } else {
        rest.to_vec()
    };
    let mut aligned = rkyv::util::AlignedVec::<16>::with_capacity(bytes.len());
    aligned.extend_from_slice(&bytes);
    let Ok(view) = snapshot::view(&aligned) else {
        return;
    };
    let offset = view.offset();
    let entries = snapshot::entries(view);
    snapshot_round_trip(offset, &entries);
    let mut table = ProducerStateTable::new(PRODUCERS_MAX.max(entries.len()));
    for (pid, e) in entries {
        table.insert(pid, e);
    }
    assert!(table.len() <= PRODUCERS_MAX.max(table.len()));
    let _ = table.first_unstable_offset();
}

/// encode → view → entries gives `entries` back (an open transaction's
/// negative first offset is "none", as the format stores -1 for it).
pub fn snapshot_round_trip(offset: i64, entries: &[(i64, ProducerEntry)]) {
    let bytes = snapshot::encode(offset, entries.iter().map(|(p, e)| (p, e))).expect("encode");
    let mut aligned = rkyv::util::AlignedVec::<16>::with_capacity(bytes.len());
    aligned.extend_from_slice(&bytes);
    let view = snapshot::view(&aligned).expect("our snapshot views");
    assert_eq!(view.offset(), offset);
    let back = snapshot::entries(view);
    let expected: Vec<(i64, ProducerEntry)> = entries
        .iter()
        .map(|(p, e)| {
            let mut e = e.clone();
            e.current_txn_first_offset = e.current_txn_first_offset.filter(|o| *o >= 0);
            (*p, e)
        })
        .collect();
    assert_eq!(back, expected);
}

/// The old (pre-Raft) metadata log, still read by the migration
/// (`metadata::store::load_legacy`). `data[0]` holds the flags: bit 0 rewrites every line
/// of `data[1..]` as `<crc32c> <line>` so that the JSON is reached. Checks:
/// a corrupt line before others is refused (InvalidData) and the file left
/// alone; otherwise loading keeps the intact lines and cuts a torn last
/// line, a second
/// load finds the same records and cuts nothing, each record re-encodes to
/// a line that decodes to it, and replaying them builds an image.
pub fn metadata_log(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let bytes = if flags & FLAG_FIX_CHECKSUMS != 0 {
        let mut out = Vec::with_capacity(rest.len() + 16);
        let mut lines = rest.split(|&b| b == b'\n').peekable();
        while let Some(line) = lines.next() {
            out.extend_from_slice(format!("{:08x} ", crc32c::crc32c(line)).as_bytes());
            out.extend_from_slice(line);
            if lines.peek().is_some() {
                out.push(b'\n');
            }
        }
        out
    } else {
        rest.to_vec()
    };
    let dir = scratch_dir();
    clear_scratch();
    let path = metadata_store::legacy_path(dir);
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("metadata dir");
    write_file(&path, &bytes);
    let records = match metadata_store::load_legacy(dir) {
        Ok(records) => records,
        Err(e) => {
            // A corrupt line before others: refused, the file left as it was.
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
            assert_eq!(std::fs::read(&path).expect("still there"), bytes);
            clear_scratch();
            return;
        }
    };
    let kept = std::fs::metadata(&path).expect("still there").len() as usize;
    assert!(kept <= bytes.len());
    assert!(
        kept == 0 || bytes[kept - 1] == b'\n',
        "cut after a whole line"
    );
    assert_eq!(
        bytes[..kept].iter().filter(|&&b| b == b'\n').count(),
        records.len(),
        "one record a line"
    );
    let again = metadata_store::load_legacy(dir).expect("second load");
    assert_eq!(again, records);
    assert_eq!(
        std::fs::metadata(&path).expect("still there").len() as usize,
        kept
    );
    let mut image = MetadataImage::default();
    for r in &records {
        metadata_record_round_trip(r);
        image = image.apply(r);
    }
    assert_eq!(image.version, records.len() as u64);
    clear_scratch();
}

/// decode_line(encode_line(r)) == r.
pub fn metadata_record_round_trip(record: &MetadataRecord) {
    let line = metadata_store::encode_line(record).expect("encode");
    let text = line.strip_suffix('\n').expect("a line ends with a newline");
    assert!(!text.contains('\n'), "one line");
    assert_eq!(
        metadata_store::decode_line(text.as_bytes()).as_ref(),
        Ok(record)
    );
}

// ---------------------------------------------------------------------------
// __consumer_offsets and __transaction_state records.

/// Splits `data` into a key (length in the first 2 bytes) and a value.
fn key_value(data: &[u8]) -> Option<(&[u8], &[u8])> {
    let (len, rest) = data.split_first_chunk::<2>()?;
    let len = (u16::from_le_bytes(*len) as usize).min(rest.len());
    Some(rest.split_at(len))
}

/// `__consumer_offsets` keys and values: every parser on arbitrary bytes,
/// `describe` (dump-log's `--offsets-decoder`), and decode(encode(decode(x)))
/// == decode(x) for everything that decodes.
pub fn group_records(data: &[u8]) {
    let Some((key, value)) = key_value(data) else {
        return;
    };
    let _ = group_records::describe(Some(key), Some(value));
    let _ = group_records::describe(Some(key), None);
    let _ = group_records::describe(None, Some(value));
    if let Ok(k) = group_records::parse_key(key) {
        let enc = match &k {
            group_records::RecordKey::OffsetCommit {
                group,
                topic,
                partition,
            } => group_records::offset_commit_key(group, topic, *partition),
            group_records::RecordKey::GroupMetadata { group } => {
                group_records::group_metadata_key(group)
            }
        }
        .expect("a decoded key re-encodes");
        assert_eq!(group_records::parse_key(&enc), Ok(k));
    }
    if let Ok(o) = group_records::parse_offset_commit_value(value) {
        offset_commit_round_trip(&o);
    }
    if let Ok(g) = group_records::parse_group_metadata_value(value) {
        let enc = group_records::group_metadata_value(&g).expect("a decoded value re-encodes");
        assert_eq!(group_records::parse_group_metadata_value(&enc), Ok(g));
    }
    // KIP-848 consumer-group records: replaying any value (or a
    // tombstone) of any consumer key is an error or a change, never a
    // panic.
    if let Ok(k) = crate::group::consumer_records::parse_key(key) {
        let image = MetadataImage::default();
        let mut c = crate::group::consumer::ConsumerGroup::new();
        let _ = crate::group::consumer_records::apply(&mut c, &k, Some(value), &image, 0);
        let _ = crate::group::consumer_records::apply(&mut c, &k, None, &image, 0);
        crate::group::consumer_records::finish_replay(&mut c, 0);
    }
}

/// An OffsetCommitValue decodes to what was encoded (the v1 record written
/// for an expiring commit has no leader epoch: it reads back as -1).
/// Metadata longer than a classic string holds is refused by the encoder.
pub fn offset_commit_round_trip(o: &CommittedOffset) {
    let enc = group_records::offset_commit_value(o);
    if o.metadata.len() > i16::MAX as usize {
        assert!(enc.is_err(), "a string longer than i16::MAX is refused");
        return;
    }
    let mut expected = o.clone();
    if expected.expire_timestamp_ms.is_some() {
        expected.leader_epoch = -1;
    }
    let enc = enc.expect("encodes");
    assert_eq!(group_records::parse_offset_commit_value(&enc), Ok(expected));
}

/// A GroupMetadataValue decodes to what was encoded, up to what the format
/// keeps: each member's subscription for the group's protocol only, and no
/// in-memory state (parked requests, heartbeats). Strings longer than a
/// classic string holds are refused by the encoder.
pub fn group_metadata_round_trip(v: &group_records::GroupMetadataValue) {
    let long = |s: &str| s.len() > i16::MAX as usize;
    if long(&v.protocol_type)
        || v.protocol_name.as_deref().is_some_and(long)
        || v.leader.as_deref().is_some_and(long)
        || v.members.iter().any(|m| {
            long(&m.member_id)
                || m.group_instance_id.as_deref().is_some_and(long)
                || long(&m.client_id)
                || long(&m.client_host)
        })
    {
        assert!(
            group_records::group_metadata_value(v).is_err(),
            "a string longer than i16::MAX is refused"
        );
        return;
    }
    let mut expected = v.clone();
    for m in &mut expected.members {
        let subscription = v
            .protocol_name
            .as_deref()
            .and_then(|p| m.protocols.iter().find(|(n, _)| n == p))
            .map(|(_, b)| b.clone())
            .unwrap_or_default();
        m.protocols = v
            .protocol_name
            .clone()
            .map(|p| vec![(p, subscription)])
            .unwrap_or_default();
        m.awaiting_join = false;
        m.awaiting_sync = false;
        m.last_heartbeat_ms = 0;
    }
    let enc = group_records::group_metadata_value(v).expect("encodes");
    assert_eq!(
        group_records::parse_group_metadata_value(&enc),
        Ok(expected)
    );
}

/// `__transaction_state` keys and values: the parsers on arbitrary bytes,
/// `describe` (dump-log's `--transaction-log-decoder`), and
/// decode(encode(decode(x))) == decode(x) for what decodes (an Empty
/// transaction is written without partitions, as Kafka writes it).
pub fn txn_records(data: &[u8]) {
    let Some((key, value)) = key_value(data) else {
        return;
    };
    let _ = txn_log::describe(Some(key), Some(value));
    let _ = txn_log::describe(Some(key), None);
    if let Ok(id) = txn_log::decode_key(key) {
        let key = txn_log::try_encode_key(&id).expect("a decoded id re-encodes");
        assert_eq!(txn_log::decode_key(&key), Ok(id));
    }
    if let Ok(m) = txn_log::decode_value("fuzz", value) {
        txn_metadata_round_trip(&m);
    }
}

/// A TransactionLogValue decodes to what was encoded.
pub fn txn_metadata_round_trip(m: &TxnMetadata) {
    let mut expected = m.clone();
    if m.state == TxnState::Empty {
        expected.partitions.clear();
    }
    expected.next_producer_id = m.next_producer_id.filter(|p| *p >= 0);
    expected.pending = false;
    let enc = txn_log::encode_value(m);
    let got = txn_log::decode_value(&m.transactional_id, &enc);
    assert_eq!(got, Ok(expected));
}

/// A transactional id key decodes to the id encoded; an id longer than a
/// classic string holds is refused.
pub fn txn_key_round_trip(id: &str) {
    let key = txn_log::try_encode_key(id);
    if id.len() > txn_log::TRANSACTIONAL_ID_BYTES_MAX {
        assert!(key.is_err(), "an id longer than i16::MAX is refused");
        return;
    }
    let key = key.expect("an id that fits encodes");
    assert_eq!(txn_log::decode_key(&key).as_deref(), Ok(id));
}
