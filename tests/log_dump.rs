//! `fjord dump-log` on segments written by the log, checked against the
//! byte values of KAFKA_BEHAVIOUR.md §1-2: two 3-record uncompressed batches
//! appended with acks=1 are stored at baseOffset 0 and 3; the second has
//! partitionLeaderEpoch 0, size 120 and the client's CRC.

mod log_util;

use fjord::log::dump::{dump, DumpLogArgs};
use fjord::log::{LogConfig, LogManager, TailCache};
use fjord::types::TopicPartition;
use log_util::*;

/// A batch built byte by byte: null keys, the given values, attributes and
/// producer fields; returns the bytes and their CRC.
fn hand_batch(
    values: &[&[u8]],
    keys: &[Option<&[u8]>],
    attributes: i16,
    pid: i64,
    epoch: i16,
    base_seq: i32,
    ts: i64,
) -> Vec<u8> {
    let mut recs = Vec::new();
    for (i, v) in values.iter().enumerate() {
        let mut r = vec![0u8]; // attributes
        varint(&mut r, 0); // timestampDelta
        varint(&mut r, i as i64); // offsetDelta
        match keys[i] {
            Some(k) => {
                varint(&mut r, k.len() as i64);
                r.extend_from_slice(k);
            }
            None => varint(&mut r, -1),
        }
        varint(&mut r, v.len() as i64);
        r.extend_from_slice(v);
        varint(&mut r, 0); // headers
        varint(&mut recs, r.len() as i64);
        recs.extend_from_slice(&r);
    }
    let n = values.len() as i32;
    let mut b = Vec::new();
    b.extend_from_slice(&0i64.to_be_bytes());
    b.extend_from_slice(&0i32.to_be_bytes());
    b.extend_from_slice(&(-1i32).to_be_bytes());
    b.push(2);
    b.extend_from_slice(&0u32.to_be_bytes());
    b.extend_from_slice(&attributes.to_be_bytes());
    b.extend_from_slice(&(n - 1).to_be_bytes());
    b.extend_from_slice(&ts.to_be_bytes());
    b.extend_from_slice(&ts.to_be_bytes());
    b.extend_from_slice(&pid.to_be_bytes());
    b.extend_from_slice(&epoch.to_be_bytes());
    b.extend_from_slice(&base_seq.to_be_bytes());
    b.extend_from_slice(&n.to_be_bytes());
    b.extend_from_slice(&recs);
    let len = (b.len() - 12) as i32;
    b[8..12].copy_from_slice(&len.to_be_bytes());
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

fn dump_text(args: DumpLogArgs) -> String {
    let mut out = Vec::new();
    dump(&args, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

#[test]
fn dump_matches_kafka_byte_values_for_known_batches() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    // Values of 13, 13 and 12 bytes make the records section 59 bytes: 120 in all.
    let first = hand_batch(
        &[b"message-one-a", b"message-two-b", b"message-3-cc"],
        &[None, None, None],
        0,
        -1,
        -1,
        -1,
        1_700_000_000_000,
    );
    let second = hand_batch(
        &[b"message-four1", b"message-five2", b"message-6-ff"],
        &[None, None, None],
        0,
        -1,
        -1,
        -1,
        1_700_000_000_100,
    );
    assert_eq!(second.len(), 120);
    let second_crc = u32::from_be_bytes([second[17], second[18], second[19], second[20]]);
    // A transactional batch and its COMMIT marker (control record: key
    // version 0 type 1; value version 0, coordinatorEpoch 5).
    let txn = hand_batch(&[b"c1"], &[Some(b"k")], 0x10, 7, 0, 0, 1_700_000_000_200);
    let marker = hand_batch(
        &[&[0, 0, 0, 0, 0, 5]],
        &[Some(&[0, 0, 0, 1])],
        0x30,
        7,
        1,
        -1,
        1_700_000_000_300,
    );
    let (f, s, t, m) = (first.clone(), second.clone(), txn.clone(), marker.clone());
    run(data.clone(), move || async move {
        let mgr = LogManager::new_for_shard(data, TailCache::new(1 << 20), 0);
        let config = LogConfig {
            index_interval_bytes: 100,
            ..LogConfig::default()
        };
        let log = mgr
            .open(&TopicPartition::new("d", 0), config)
            .await
            .unwrap();
        for b in [f, s, t, m] {
            let info = log.append(bytes::BytesMut::from(&b[..])).unwrap();
            log.wait_written(info.last_offset).await.unwrap();
        }
        mgr.shutdown().await.unwrap();
    });
    let seg = dir.path().join("d-0/00000000000000000000.log");
    let text = dump_text(DumpLogArgs {
        files: vec![seg.clone()],
        ..Default::default()
    });
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], format!("Dumping {}", seg.display()));
    assert_eq!(lines[1], "Log starting offset: 0");
    assert_eq!(
        lines[3],
        format!(
            "baseOffset: 3 lastOffset: 5 count: 3 baseSequence: -1 lastSequence: -1 producerId: -1 \
             producerEpoch: -1 partitionLeaderEpoch: 0 isTransactional: false isControl: false \
             deleteHorizonMs: OptionalLong.empty position: {} CreateTime: 1700000000100 size: 120 \
             magic: 2 compresscodec: none crc: {second_crc} isvalid: true",
            first.len()
        )
    );
    assert!(lines[4].starts_with("baseOffset: 6 lastOffset: 6 count: 1 baseSequence: 0 lastSequence: 0 producerId: 7 producerEpoch: 0 partitionLeaderEpoch: 0 isTransactional: true isControl: false"));
    assert!(lines[5].starts_with("baseOffset: 7 lastOffset: 7 count: 1 baseSequence: -1 lastSequence: -1 producerId: 7 producerEpoch: 1 partitionLeaderEpoch: 0 isTransactional: true isControl: true"));
    assert_eq!(lines.len(), 6);

    let text = dump_text(DumpLogArgs {
        files: vec![seg.clone()],
        print_data_log: true,
        ..Default::default()
    });
    assert!(text.contains("| offset: 4 CreateTime: 1700000000100 keySize: -1 valueSize: 13 sequence: -1 headerKeys: [] payload: message-five2\n"), "{text}");
    assert!(text.contains("| offset: 6 CreateTime: 1700000000200 keySize: 1 valueSize: 2 sequence: 0 headerKeys: [] key: k payload: c1\n"), "{text}");
    assert!(text.contains("| offset: 7 CreateTime: 1700000000300 keySize: 4 valueSize: 6 sequence: -1 headerKeys: [] endTxnMarker: COMMIT coordinatorEpoch: 5\n"), "{text}");

    // Index entries: one per batch after the first (interval 100 bytes).
    let idx = seg.with_extension("index");
    let text = dump_text(DumpLogArgs {
        files: vec![idx.clone()],
        ..Default::default()
    });
    assert!(
        text.contains(&format!("offset: 5 position: {}\n", first.len())),
        "{text}"
    );
    let tidx = seg.with_extension("timeindex");
    let text = dump_text(DumpLogArgs {
        files: vec![tidx.clone()],
        ..Default::default()
    });
    assert!(
        text.contains("timestamp: 1700000000100 offset: 5\n"),
        "{text}"
    );
    let text = dump_text(DumpLogArgs {
        files: vec![idx.clone(), tidx.clone()],
        verify_index_only: true,
        ..Default::default()
    });
    assert_eq!(
        text.lines().count(),
        2,
        "only the Dumping lines, no mismatches: {text}"
    );
    // A wrong entry is reported.
    let mut bad = std::fs::read(&idx).unwrap();
    bad[7] = bad[7].wrapping_add(1);
    std::fs::write(&idx, &bad).unwrap();
    let text = dump_text(DumpLogArgs {
        files: vec![idx],
        verify_index_only: true,
        ..Default::default()
    });
    assert!(text.contains("not a batch boundary"), "{text}");
}
