//! Callgrind driver (before): the session bookkeeping of ITERS incremental
//! fetches of a 500-partition session, 5 changed, as benches/fetch_sessions.rs.
use fjord::shard::fetch_sessions::{FetchSessionCache, SessionPartition, SessionTopic};
use std::hint::black_box;

fn topic_name(t: u32) -> String { format!("bench-topic-{t}") }

fn main() {
    let iters: u64 = std::env::args().nth(1).map_or(1000, |s| s.parse().unwrap());
    let mut cache = FetchSessionCache::new(10, 1_000_000);
    let topics = (0..10).map(|t| SessionTopic { name: topic_name(t), id: [0; 16] }).collect();
    let partitions = (0..10u32)
        .flat_map(|t| (0..50).map(move |p| SessionPartition::new(t, p, 0, 1 << 20, -1)))
        .collect();
    let id = cache.create(topics, partitions, false, 0).unwrap();
    let changed = topic_name(3);
    let mut epoch = 1;
    let mut offset = 0i64;
    let mut total = 0usize;
    for _ in 0..iters {
        offset += 1;
        cache.begin_incremental(id, epoch, false, 0).unwrap();
        epoch += 1;
        cache.update(id, |s| {
            for p in 7..12 {
                s.upsert(&changed, &[0; 16], p, offset, 1 << 20, -1);
            }
        }).unwrap();
        let s = cache.get_mut(id).unwrap();
        let mut read = Vec::with_capacity(s.len());
        s.for_each_partition(|slot, topic, p| { black_box(topic); read.push((slot, p.fetch_offset)); });
        let mut news = 0;
        for &(slot, fetch_offset) in &read {
            let p = s.slot_mut(slot).unwrap();
            let had_records = p.topic == 3 && (7..12).contains(&p.partition);
            let hw = if had_records { fetch_offset + 1 } else { 0 };
            news += usize::from(had_records || p.high_watermark != hw);
            p.remember(hw, hw, 0);
            p.had_records = had_records;
        }
        s.reorder();
        total += black_box(news);
    }
    println!("{total}");
}
