//! Errors about the records of a produce request or a stored batch.
//!
//! Each variant says which Kafka error code the produce handler answers
//! with, following Kafka 4.x: `ProduceRequest.validateRecords` (run by
//! `KafkaApis.handleProduceRequest`; any `ApiException` becomes that
//! partition's error), then `UnifiedLog.analyzeAndValidateRecords` and
//! `LogValidator.validateBatch`. The mapping itself lives in the handler's
//! error module; this doc is its specification:
//!
//! | variant | Kafka exception | code |
//! |---|---|---|
//! | `NoBatch` | InvalidRecordException ("must have at least one record batch") | INVALID_RECORD (87) |
//! | `CorruptSize` | CorruptRecordException (size below the v0 overhead, or below the v2 header) | CORRUPT_MESSAGE (2) |
//! | `InvalidMagic` | CorruptRecordException ("Invalid magic found in record") | CORRUPT_MESSAGE (2) |
//! | `WrongMagic` | InvalidRecordException ("only allowed to contain record batches with magic version 2") | INVALID_RECORD (87) |
//! | `ZstdBeforeV7` | UnsupportedCompressionTypeException | UNSUPPORTED_COMPRESSION_TYPE (76) |
//! | `MoreThanOneBatch` | InvalidRecordException ("exactly one record batch per partition") | INVALID_RECORD (87) |
//! | `BaseOffsetNotZero` | InvalidRecordException ("The baseOffset ... should be 0") | INVALID_RECORD (87) |
//! | `TooLarge` | RecordTooLargeException | MESSAGE_TOO_LARGE (10) |
//! | `CrcMismatch` | CorruptRecordException ("Record is corrupt (stored crc = ...)") | CORRUPT_MESSAGE (2) |
//! | `InvalidOffsetRange`, `InvalidCount`, `InconsistentCount` | InvalidRecordException (LogValidator) | INVALID_RECORD (87) |
//! | `ControlFromClient` | InvalidRecordException ("Clients are not allowed to write control records") | INVALID_RECORD (87) |
//! | `InvalidSequence` | InvalidRecordException ("Invalid sequence number") | INVALID_RECORD (87) |
//! | `UnknownCompression` | IllegalArgumentException from `CompressionType.forId` | UNKNOWN_SERVER_ERROR (-1) |
//! | `Malformed`, `Decompress` (only when the broker must open the batch, e.g. recompression) | InvalidRecordException / KafkaException | INVALID_RECORD (87) / CORRUPT_MESSAGE (2) |
//!
//! Kafka checks these in the order above (validateRecords before the acks
//! check, the rest after it); the handler keeps that order.

/// Why records were rejected or could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordsError {
    /// No complete batch: null or empty records, or the first batch is cut
    /// short (Kafka's batch iterator then yields nothing).
    #[error("no complete record batch ({available} bytes)")]
    NoBatch { available: usize },
    /// The size field is below what any batch can have.
    #[error("corrupt batch size {0}")]
    CorruptSize(i32),
    /// A magic byte outside 0..=2.
    #[error("invalid magic {0}")]
    InvalidMagic(i8),
    /// Magic 0 or 1: a valid but pre-v2 message set.
    #[error("magic {0} is not allowed, only magic 2")]
    WrongMagic(i8),
    /// zstd needs Produce v7 or newer.
    #[error("zstd compression needs produce v7+, got v{version}")]
    ZstdBeforeV7 { version: i16 },
    /// More than one batch for a partition.
    #[error("more than one record batch")]
    MoreThanOneBatch,
    /// A client batch must arrive with baseOffset 0.
    #[error("baseOffset must be 0, got {0}")]
    BaseOffsetNotZero(i64),
    /// The batch exceeds the topic's `max.message.bytes`.
    #[error("batch of {size} bytes exceeds max.message.bytes {max_bytes}")]
    TooLarge { size: usize, max_bytes: usize },
    /// The stored CRC does not match the bytes.
    #[error("crc mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    CrcMismatch { stored: u32, computed: u32 },
    /// `lastOffsetDelta` is negative.
    #[error("invalid offset range, lastOffsetDelta {0}")]
    InvalidOffsetRange(i32),
    /// `recordsCount` is zero or negative.
    #[error("invalid record count {0}")]
    InvalidCount(i32),
    /// `recordsCount` differs from `lastOffsetDelta + 1`.
    #[error("record count {count} does not match offset range {from_offsets}")]
    InconsistentCount { count: i32, from_offsets: i64 },
    /// A client sent a control batch.
    #[error("clients may not write control batches")]
    ControlFromClient,
    /// A batch with a producer id must carry a sequence.
    #[error("invalid base sequence {0} for an idempotent batch")]
    InvalidSequence(i32),
    /// Attributes name a codec Kafka does not define.
    #[error("unknown compression codec {0}")]
    UnknownCompression(i16),
    /// A record inside the batch does not parse.
    #[error("malformed record: {0}")]
    Malformed(&'static str),
    /// Decompression failed.
    #[error("{codec} decompression failed: {reason}")]
    Decompress { codec: &'static str, reason: String },
    /// The decompressed records exceed the decompression limit.
    #[error("decompressed records exceed {limit_bytes} bytes")]
    DecompressedTooLarge { limit_bytes: usize },
}
