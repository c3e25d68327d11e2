//! Criterion bench of a fetch session's bookkeeping for one incremental
//! fetch of a 500-partition session (10 topics of 50) of which 5 changed,
//! as `handlers::fetch` does it around the reads: the 5 partitions' logs
//! flag their slots (what `log::changes` does when their high watermark
//! moves), the fetch begins (epoch check), applies the request's changes
//! (the 5 new positions), picks the slots to read, records what was
//! answered (the "news" check) and settles the session (active slots,
//! reading order). Reads, I/O and encoding are not in it. What it guards:
//! this costs O(changed partitions), not a walk of the whole session
//! (`tuning/results/fetch-sessions.md`).
//!
//! Run: `cargo bench --bench fetch_sessions`.

use criterion::{criterion_group, criterion_main, Criterion};
use fjord::shard::fetch_sessions::{
    FetchPosition, FetchSessionCache, SessionPartition, SessionTopic,
};
use std::hint::black_box;

const TOPICS: u32 = 10;
const PER_TOPIC: i32 = 50;
/// The partitions of topic 3 that get records before every fetch.
const CHANGED: std::ops::Range<i32> = 7..12;
const STAMP: (u64, u64) = (1, 1);

/// A consumer's position at `fetch_offset` (1 MiB, no epochs).
fn position(fetch_offset: i64) -> FetchPosition {
    FetchPosition {
        fetch_offset,
        partition_max_bytes: 1 << 20,
        current_leader_epoch: -1,
        last_fetched_epoch: -1,
        log_start_offset: -1,
    }
}

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
        .flat_map(|t| {
            (0..PER_TOPIC).map(move |p| {
                let mut s = SessionPartition::new(t, p, position(0));
                s.quiet = true;
                s
            })
        })
        .collect();
    cache
        .create(topics, partitions, false, 0, Some((STAMP, false)))
        .expect("a slot")
}

fn incremental_fetch(c: &mut Criterion) {
    let mut cache = FetchSessionCache::new(10, 1_000_000);
    let id = session(&mut cache);
    let changed = topic_name(3);
    let changed_slots: Vec<u32> = {
        let s = cache.get_mut(id).expect("the session");
        s.partitions()
            .filter(|(_, p)| p.topic == 3 && CHANGED.contains(&p.partition))
            .map(|(slot, _)| slot)
            .collect()
    };
    let mut epoch = 1;
    let mut offset = 0i64;
    let mut slots = Vec::new();
    c.bench_function("fetch_session_incremental_500_partitions_5_changed", |b| {
        b.iter(|| {
            offset += 1;
            let s = cache.get_mut(id).expect("the session");
            for &slot in &changed_slots {
                s.signal.flag(slot);
            }
            cache
                .begin_incremental(id, epoch, false, 0)
                .expect("the session");
            epoch += 1;
            cache
                .update(id, |s| {
                    for p in CHANGED {
                        s.upsert(&changed, &[0; 16], p, position(offset));
                    }
                })
                .expect("within bounds");
            let s = cache.get_mut(id).expect("the session");
            slots.clear();
            s.slots_to_read(STAMP, false, &mut slots);
            let mut news = 0;
            for &slot in &slots {
                let p = s.slot_mut(slot).expect("still there");
                let had_records = p.topic == 3 && CHANGED.contains(&p.partition);
                let hw = if had_records { offset + 1 } else { 0 };
                news += usize::from(had_records || p.high_watermark != hw);
                p.remember(hw, hw, 0);
                p.had_records = had_records;
                p.quiet = !had_records;
            }
            s.settle_read(slots.iter().copied(), STAMP, false);
            black_box(news)
        })
    });
}

criterion_group!(benches, incremental_fetch);
criterion_main!(benches);
