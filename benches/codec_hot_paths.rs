//! Criterion benches of the codec hot paths: batch validation + CRC (the
//! append path's only per-byte work), Produce request decoding and Fetch
//! response encoding (both zero-copy, so their cost should not grow with
//! the record bytes).
//!
//! Run: `cargo bench --bench codec_hot_paths`.

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use fjord::protocol::fetch::{
    encode_fetch_response, FetchPartitionResponse, FetchResponse, FetchTopicResponse,
};
use fjord::protocol::produce::{decode_produce_request, single_batch, validate_for_append};
use fjord::record::{batch, BatchBuilder, Compression, RecordsChunk};
use std::hint::black_box;

/// A batch of roughly `bytes` bytes made of 100-byte values.
fn batch_of(bytes: usize) -> BytesMut {
    let mut b = BatchBuilder::new(Compression::None);
    let value = vec![b'x'; 100];
    let mut i = 0;
    while b.is_empty() || b.clone().build().len() < bytes {
        b = b.record(
            Some(format!("k{i}").as_bytes()),
            Some(&value),
            &[],
            1_700_000_000_000 + i,
        );
        i += 1;
    }
    b.build()
}

/// A ProduceRequest v9 body with `partitions` partitions of one batch each.
fn produce_body(partitions: i32, batch: &[u8]) -> BytesMut {
    use kafka_protocol::messages::produce_request::{
        PartitionProduceData, ProduceRequest, TopicProduceData,
    };
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::protocol::{Encodable, StrBytes};
    let req = ProduceRequest::default()
        .with_acks(1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_static_str("bench-topic")))
            .with_partition_data(
                (0..partitions)
                    .map(|i| {
                        PartitionProduceData::default()
                            .with_index(i)
                            .with_records(Some(Bytes::copy_from_slice(batch)))
                    })
                    .collect(),
            )]);
    let mut out = BytesMut::new();
    req.encode(&mut out, 9).expect("encodable");
    out
}

fn fetch_response(partitions: i32, chunk: &Bytes) -> FetchResponse {
    FetchResponse {
        throttle_time_ms: 0,
        error_code: 0,
        session_id: 0,
        topics: vec![FetchTopicResponse {
            name: "bench-topic".into(),
            topic_id: [1; 16],
            partitions: (0..partitions)
                .map(|i| FetchPartitionResponse {
                    index: i,
                    error_code: 0,
                    high_watermark: 1_000_000,
                    last_stable_offset: 1_000_000,
                    log_start_offset: 0,
                    aborted_transactions: None,
                    preferred_read_replica: -1,
                    records: vec![RecordsChunk::Memory(chunk.clone())],
                    current_leader: None,
                    diverging_epoch: None,
                })
                .collect(),
        }],
        node_endpoints: vec![],
    }
}

fn bench_validate(c: &mut Criterion) {
    let mut g = c.benchmark_group("batch_validate_crc");
    for size in [1024usize, 16 * 1024] {
        let b = batch_of(size);
        g.throughput(Throughput::Bytes(b.len() as u64));
        g.bench_function(format!("{}KiB", size / 1024), |bench| {
            bench.iter(|| {
                let h = single_batch(black_box(&b)).expect("one batch");
                validate_for_append(black_box(&b), &h, 1 << 20).expect("valid");
                black_box(h)
            })
        });
        g.bench_function(format!("{}KiB_crc_only", size / 1024), |bench| {
            bench.iter(|| black_box(batch::compute_crc(black_box(&b))))
        });
    }
    g.finish();
}

fn bench_produce_decode(c: &mut Criterion) {
    let mut g = c.benchmark_group("produce_request_decode");
    for (partitions, size) in [(1, 1024usize), (16, 16 * 1024)] {
        let body = produce_body(partitions, &batch_of(size));
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_function(format!("{partitions}x{}KiB", size / 1024), |bench| {
            bench.iter_batched(
                || body.clone(),
                |b| black_box(decode_produce_request(b, 9).expect("decodes")),
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

fn bench_fetch_encode(c: &mut Criterion) {
    let mut g = c.benchmark_group("fetch_response_encode");
    let chunk = batch_of(16 * 1024).freeze();
    for partitions in [1, 16] {
        let resp = fetch_response(partitions, &chunk);
        for version in [11i16, 16] {
            g.bench_function(format!("{partitions}p_v{version}"), |bench| {
                bench.iter_batched(
                    || resp.clone(),
                    |r| black_box(encode_fetch_response(r, version)),
                    BatchSize::SmallInput,
                )
            });
        }
    }
    g.finish();
}

/// The per-batch work idempotence adds to the append path: the producer
/// state check before the append and the record after it (`check` +
/// `record`), for a plain batch (producerId -1: both return at once) and an
/// idempotent one continuing its producer's sequence, with 1 and with 1,000
/// producers tracked on the partition. Everything else on the path is the
/// same for both batches, so this difference, set against the broker's CPU
/// per batch (`tuning/results/idempotence-cost.md`), is idempotence's cost.
fn bench_producer_state(c: &mut Criterion) {
    use fjord::producer::ProducerStateTable;
    let mut g = c.benchmark_group("producer_state_check_and_record");
    let header_of = |pid: i64, seq: i32| {
        let b = BatchBuilder::new(Compression::None)
            .producer(pid, 0, seq)
            .record(None, Some(b"v"), &[], 1_700_000_000_000)
            .build();
        batch::BatchHeader::parse(&b).expect("a batch header")
    };
    let plain = header_of(-1, -1);
    g.bench_function("plain", |bench| {
        let mut table = ProducerStateTable::new(1_000);
        bench.iter(|| {
            let v = table.check(black_box(&plain));
            table.record(black_box(&plain), 0, 0);
            black_box(v)
        })
    });
    for producers in [1i64, 1_000] {
        g.bench_function(format!("idempotent_{producers}_producers"), |bench| {
            let mut table = ProducerStateTable::new(1_000);
            for pid in 0..producers {
                table.record(&header_of(pid, 0), pid, 0);
            }
            // The producer that sends: its sequence goes on from 0.
            let mut h = header_of(producers / 2, 0);
            let mut offset = producers;
            bench.iter(|| {
                h.base_sequence = h.base_sequence.wrapping_add(1) & i32::MAX;
                let v = table.check(black_box(&h));
                table.record(black_box(&h), offset, 0);
                offset += 1;
                black_box(v)
            })
        });
    }
    g.finish();
}

criterion_group!(
    benches,
    bench_validate,
    bench_produce_decode,
    bench_fetch_encode,
    bench_producer_state
);
criterion_main!(benches);
