//! Records of `__transaction_state`, in Kafka's format, so the log is the
//! coordinator's state and `fjord dump-log --transaction-log-decoder` (like
//! Kafka's tool) can show it.
//!
//! Key: version i16 = 0, then `TransactionLogKey` { transactional_id: string }.
//! Value: version i16 = 1 (flexible), then `TransactionLogValue`
//! { producer_id i64, producer_epoch i16, transaction_timeout_ms i32,
//! transaction_status i8, transaction_partitions: compact nullable array of
//! { topic: compact string, partition_ids: compact array of i32, tags },
//! last_update_ms i64, start_ms i64, tags (0: previous producer id,
//! 1: next producer id, 2: client transaction version) }. A null value (a
//! tombstone) removes the transactional id.
//!
//! The key's id has an i16 length: an id longer than
//! [`TRANSACTIONAL_ID_BYTES_MAX`] cannot be written ([`try_encode_key`]
//! refuses it; InitProducerId refuses it before that).

use super::{TxnMetadata, TxnState};
use crate::protocol::wire::{put_empty_tagged_fields, put_string, put_uvarint, Reader};
use crate::types::TopicPartition;
use bytes::{BufMut, BytesMut};
use std::collections::{BTreeMap, BTreeSet};

const KEY_VERSION: i16 = 0;
/// Longest transactional id (in bytes) a key can hold: its length is i16.
pub const TRANSACTIONAL_ID_BYTES_MAX: usize = i16::MAX as usize;
const VALUE_VERSION: i16 = 1;
const TAG_NEXT_PRODUCER_ID: u32 = 1;
const TAG_CLIENT_TRANSACTION_VERSION: u32 = 2;

/// The key of `transactional_id`, which must fit (at most
/// [`TRANSACTIONAL_ID_BYTES_MAX`] bytes): a longer one is a programmer
/// error. Ids from the network go through [`try_encode_key`].
pub fn encode_key(transactional_id: &str) -> BytesMut {
    match try_encode_key(transactional_id) {
        Ok(key) => key,
        Err(e) => panic!("{e}"),
    }
}

/// The key of `transactional_id`, or an error if the id is too long for it.
pub fn try_encode_key(transactional_id: &str) -> Result<BytesMut, TxnLogError> {
    let len = i16::try_from(transactional_id.len()).map_err(|_| {
        TxnLogError(format!(
            "transactional id of {} bytes is longer than {TRANSACTIONAL_ID_BYTES_MAX}",
            transactional_id.len()
        ))
    })?;
    let mut out = BytesMut::with_capacity(4 + transactional_id.len());
    out.put_i16(KEY_VERSION);
    out.put_i16(len);
    out.put_slice(transactional_id.as_bytes());
    Ok(out)
}

/// Whether a key of `version` is a transaction record. Kafka skips other
/// keys when it loads the log (a left-over of an aborted upgrade) and fails
/// the load on a transaction record that does not decode.
pub fn is_known_key_version(version: i16) -> bool {
    version == KEY_VERSION
}

pub fn encode_value(m: &TxnMetadata) -> BytesMut {
    let mut out = BytesMut::with_capacity(64);
    out.put_i16(VALUE_VERSION);
    out.put_i64(m.producer_id);
    out.put_i16(m.producer_epoch);
    out.put_i32(m.timeout_ms);
    out.put_i8(m.state as i8);
    if m.state == TxnState::Empty {
        put_uvarint(&mut out, 0); // null
    } else {
        let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
        for tp in &m.partitions {
            by_topic.entry(&tp.topic).or_default().push(tp.partition.0);
        }
        put_uvarint(&mut out, by_topic.len() as u32 + 1);
        for (topic, ids) in by_topic {
            put_string(&mut out, topic, true);
            put_uvarint(&mut out, ids.len() as u32 + 1);
            for id in ids {
                out.put_i32(id);
            }
            put_empty_tagged_fields(&mut out);
        }
    }
    out.put_i64(m.last_update_ms);
    out.put_i64(m.start_ms);
    let tags = m.next_producer_id.is_some() as u32 + (m.client_txn_version != 0) as u32;
    if tags == 0 {
        put_empty_tagged_fields(&mut out);
    } else {
        put_uvarint(&mut out, tags);
        if let Some(pid) = m.next_producer_id {
            put_uvarint(&mut out, TAG_NEXT_PRODUCER_ID);
            put_uvarint(&mut out, 8);
            out.put_i64(pid);
        }
        if m.client_txn_version != 0 {
            put_uvarint(&mut out, TAG_CLIENT_TRANSACTION_VERSION);
            put_uvarint(&mut out, 2);
            out.put_i16(m.client_txn_version);
        }
    }
    out
}

/// Why a `__transaction_state` record did not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad transaction log record: {0}")]
pub struct TxnLogError(pub String);

fn err(e: impl std::fmt::Display) -> TxnLogError {
    TxnLogError(e.to_string())
}

pub fn decode_key(key: &[u8]) -> Result<String, TxnLogError> {
    let mut r = Reader::new(key);
    let version = r.i16("key_version").map_err(err)?;
    if version != KEY_VERSION {
        return Err(TxnLogError(format!("unknown key version {version}")));
    }
    r.nullable_string(false, "transactional_id")
        .map_err(err)?
        .map(str::to_owned)
        .ok_or_else(|| TxnLogError("null transactional id".into()))
}

pub fn decode_value(transactional_id: &str, value: &[u8]) -> Result<TxnMetadata, TxnLogError> {
    let mut r = Reader::new(value);
    let version = r.i16("value_version").map_err(err)?;
    if !(0..=1).contains(&version) {
        return Err(TxnLogError(format!("unknown value version {version}")));
    }
    let flexible = version >= 1;
    let producer_id = r.i64("producer_id").map_err(err)?;
    let producer_epoch = r.i16("producer_epoch").map_err(err)?;
    let timeout_ms = r.i32("timeout_ms").map_err(err)?;
    let status = r.i8("status").map_err(err)?;
    let state =
        TxnState::from_id(status).ok_or_else(|| TxnLogError(format!("unknown state {status}")))?;
    let mut partitions = BTreeSet::new();
    let topics = r.array_len(flexible, 2, "partitions").map_err(err)?;
    for _ in 0..topics.unwrap_or(0) {
        let topic = r
            .nullable_string(flexible, "topic")
            .map_err(err)?
            .unwrap_or_default()
            .to_owned();
        let n = r
            .array_len(flexible, 4, "partition_ids")
            .map_err(err)?
            .unwrap_or(0);
        for _ in 0..n {
            let p = r.i32("partition_id").map_err(err)?;
            partitions.insert(TopicPartition::new(topic.clone(), p));
        }
        if flexible {
            r.skip_tagged_fields("partition_tags").map_err(err)?;
        }
    }
    let last_update_ms = r.i64("last_update_ms").map_err(err)?;
    let start_ms = r.i64("start_ms").map_err(err)?;
    let mut client_txn_version = 0;
    let mut next_producer_id = None;
    if flexible {
        let count = r.uvarint("tag_count").map_err(err)?;
        for _ in 0..count {
            let tag = r.uvarint("tag").map_err(err)?;
            let size = r.uvarint("tag_size").map_err(err)? as usize;
            let bytes = r.take(size, "tag_value").map_err(err)?;
            if tag == TAG_CLIENT_TRANSACTION_VERSION && bytes.len() == 2 {
                client_txn_version = i16::from_be_bytes([bytes[0], bytes[1]]);
            }
            if tag == TAG_NEXT_PRODUCER_ID && bytes.len() == 8 {
                let mut a = [0u8; 8];
                a.copy_from_slice(bytes);
                next_producer_id = Some(i64::from_be_bytes(a)).filter(|p| *p >= 0);
            }
        }
    }
    Ok(TxnMetadata {
        transactional_id: transactional_id.to_owned(),
        producer_id,
        producer_epoch,
        timeout_ms,
        state,
        partitions,
        start_ms,
        last_update_ms,
        client_txn_version,
        next_producer_id,
        pending: false,
    })
}

/// One `__transaction_state` record as `fjord dump-log
/// --transaction-log-decoder` prints it, in the spirit of Kafka's
/// TransactionLogMessageFormatter.
pub fn describe(key: Option<&[u8]>, value: Option<&[u8]>) -> String {
    let Some(key) = key else {
        return "key: null payload: null".to_string();
    };
    let id = match decode_key(key) {
        Ok(id) => id,
        Err(e) => return format!("key: <{e}> payload: <not decoded>"),
    };
    let payload = match value.map(|v| decode_value(&id, v)) {
        None => "<DELETE>".to_string(),
        Some(Err(e)) => format!("<{e}>"),
        Some(Ok(m)) => {
            let partitions: Vec<String> = m.partitions.iter().map(|tp| tp.to_string()).collect();
            format!(
                "{{\"producerId\":{},\"producerEpoch\":{},\"transactionTimeoutMs\":{},\"transactionStatus\":\"{}\",\"transactionPartitions\":[{}],\"transactionLastUpdateTimestampMs\":{},\"transactionStartTimestampMs\":{},\"clientTransactionVersion\":{}}}",
                m.producer_id,
                m.producer_epoch,
                m.timeout_ms,
                m.state.name(),
                partitions.iter().map(|p| format!("\"{p}\"")).collect::<Vec<_>>().join(","),
                m.last_update_ms,
                m.start_ms,
                m.client_txn_version
            )
        }
    };
    format!("key: {{\"transactionalId\":\"{id}\"}} payload: {payload}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut m = TxnMetadata::new("tx-1", 7, 60_000, 1000);
        m.producer_epoch = 3;
        m.state = TxnState::Ongoing;
        m.partitions.insert(TopicPartition::new("a", 1));
        m.partitions.insert(TopicPartition::new("a", 0));
        m.partitions.insert(TopicPartition::new("b", 4));
        m.client_txn_version = 2;
        m.next_producer_id = Some(1234);
        let key = encode_key("tx-1");
        assert_eq!(decode_key(&key).unwrap(), "tx-1");
        let back = decode_value("tx-1", &encode_value(&m)).unwrap();
        assert_eq!(back, m);

        let line = describe(Some(&key), Some(&encode_value(&m)));
        assert!(line.contains("\"transactionalId\":\"tx-1\""), "{line}");
        assert!(line.contains("\"transactionStatus\":\"Ongoing\""), "{line}");
        assert!(line.contains("\"a-0\",\"a-1\",\"b-4\""), "{line}");
        assert!(describe(Some(&key), None).ends_with("<DELETE>"));

        m.state = TxnState::Empty;
        m.partitions.clear();
        m.client_txn_version = 0;
        m.next_producer_id = None;
        assert_eq!(decode_value("tx-1", &encode_value(&m)).unwrap(), m);
    }

    #[test]
    fn ids_longer_than_an_i16_length_are_refused() {
        let fits = "t".repeat(TRANSACTIONAL_ID_BYTES_MAX);
        assert_eq!(decode_key(&try_encode_key(&fits).unwrap()).unwrap(), fits);
        assert!(try_encode_key(&"t".repeat(TRANSACTIONAL_ID_BYTES_MAX + 1)).is_err());
        assert!(is_known_key_version(0) && !is_known_key_version(1));
    }
}
