//! Callgrind driver (after): the session bookkeeping of ITERS incremental
//! fetches of a 500-partition session, 5 changed, as benches/fetch_sessions.rs.
use fjord::shard::fetch_sessions::{FetchSessionCache, SessionPartition, SessionTopic};
use std::hint::black_box;

const CHANGED: std::ops::Range<i32> = 7..12;
const STAMP: (u64, u64) = (1, 1);

fn topic_name(t: u32) -> String { format!("bench-topic-{t}") }

fn main() {
    let iters: u64 = std::env::args().nth(1).map_or(1000, |s| s.parse().unwrap());
    let mut cache = FetchSessionCache::new(10, 1_000_000);
    let topics = (0..10).map(|t| SessionTopic { name: topic_name(t), id: [0; 16] }).collect();
    let partitions = (0..10u32)
        .flat_map(|t| (0..50).map(move |p| { let mut s = SessionPartition::new(t, p, 0, 1 << 20, -1); s.quiet = true; s }))
        .collect();
    let id = cache.create(topics, partitions, false, 0, Some((STAMP, false))).unwrap();
    let changed = topic_name(3);
    let changed_slots: Vec<u32> = cache.get_mut(id).unwrap().partitions()
        .filter(|(_, p)| p.topic == 3 && CHANGED.contains(&p.partition)).map(|(s, _)| s).collect();
    let mut epoch = 1;
    let mut offset = 0i64;
    let mut total = 0usize;
    let mut slots = Vec::new();
    for _ in 0..iters {
        offset += 1;
        let s = cache.get_mut(id).unwrap();
        for &slot in &changed_slots { s.signal.flag(slot); }
        cache.begin_incremental(id, epoch, false, 0).unwrap();
        epoch += 1;
        cache.update(id, |s| { for p in CHANGED { s.upsert(&changed, &[0; 16], p, offset, 1 << 20, -1); } }).unwrap();
        let s = cache.get_mut(id).unwrap();
        slots.clear();
        s.slots_to_read(STAMP, false, &mut slots);
        let mut news = 0;
        for &slot in &slots {
            let p = s.slot_mut(slot).unwrap();
            let had_records = p.topic == 3 && CHANGED.contains(&p.partition);
            let hw = if had_records { offset + 1 } else { 0 };
            news += usize::from(had_records || p.high_watermark != hw);
            p.remember(hw, hw, 0);
            p.had_records = had_records;
            p.quiet = !had_records;
        }
        s.settle_read(slots.iter().copied(), STAMP, false);
        total += black_box(news);
    }
    println!("{total}");
}
