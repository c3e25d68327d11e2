//! Criterion bench of a fetch session's bookkeeping for one incremental
//! fetch of a 500-partition session (10 topics of 50), as
//! `handlers::fetch` does it around the reads: begin (epoch check), apply
//! the request's changes (two new positions), walk the session in reading
//! order, then record what was answered (the "news" check) and move the
//! partitions that returned records to the end. Reads, I/O and encoding
//! are not in it. What it guards: this costs O(changed partitions) hashing
//! plus a plain walk of the session, not a string-keyed look-up per
//! partition (`tuning/results/fetch-sessions.md`).
//!
//! Run: `cargo bench --bench fetch_sessions`.

use criterion::{criterion_group, criterion_main, Criterion};
use fjord::shard::fetch_sessions::{FetchSessionCache, SessionPartition, SessionTopic};
use std::hint::black_box;

const TOPICS: u32 = 10;
const PER_TOPIC: i32 = 50;

fn topic_name(t: u32) -> String {
    format!("bench-topic-{t}")
}

fn session(cache: &mut FetchSessionCache) -> i32 {
    let topics = (0..TOPICS)
        .map(|t| SessionTopic {
            name: topic_name(t),
            id: [0; 16],
        })
        .collect();
    let partitions = (0..TOPICS)
        .flat_map(|t| (0..PER_TOPIC).map(move |p| SessionPartition::new(t, p, 0, 1 << 20, -1)))
        .collect();
    cache.create(topics, partitions, false, 0).expect("a slot")
}

fn incremental_fetch(c: &mut Criterion) {
    let mut cache = FetchSessionCache::new(10, 1_000_000);
    let id = session(&mut cache);
    let changed = topic_name(3);
    let mut epoch = 1;
    let mut offset = 0i64;
    c.bench_function("fetch_session_incremental_500_partitions_2_changed", |b| {
        b.iter(|| {
            offset += 1;
            cache
                .begin_incremental(id, epoch, false, 0)
                .expect("the session");
            epoch += 1;
            cache
                .update(id, |s| {
                    s.upsert(&changed, &[0; 16], 7, offset, 1 << 20, -1);
                    s.upsert(&changed, &[0; 16], 8, offset, 1 << 20, -1);
                })
                .expect("within bounds");
            let s = cache.get_mut(id).expect("the session");
            let mut read = Vec::with_capacity(s.len());
            s.for_each_partition(|slot, topic, p| {
                black_box(topic);
                read.push((slot, p.fetch_offset));
            });
            let mut news = 0;
            for &(slot, fetch_offset) in &read {
                let p = s.slot_mut(slot).expect("still there");
                // Two partitions return records: their high watermark moves.
                let had_records = p.partition == 7 || p.partition == 8;
                let hw = if had_records { fetch_offset + 1 } else { 0 };
                news += usize::from(had_records || p.high_watermark != hw);
                p.remember(hw, hw, 0);
                p.had_records = had_records;
            }
            s.reorder();
            black_box(news)
        })
    });
}

criterion_group!(benches, incremental_fetch);
criterion_main!(benches);
