//! The one clock: wall-clock milliseconds (record timestamps, retention,
//! expirations, the times Kafka's protocol carries) and a monotonic instant
//! (deadlines and timeouts). Every module reads time here, never from
//! `SystemTime` or `Instant` directly, so a test can run a shard's logic on
//! a clock it drives.
//!
//! In the crate's unit-test build (`cfg(test)`, where the seeded
//! simulation `partition::simulation` runs), a thread may switch to a
//! simulated clock (`simulate`): from then on both readings on that thread
//! advance only by `advance`, until `real` switches back. Shards are
//! threads, so one simulated shard does not move another's time. Every
//! other build has no simulated clock and reads the system's directly.

#[cfg(test)]
use std::cell::Cell;
#[cfg(test)]
use std::time::Duration;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

#[cfg(test)]
#[derive(Clone, Copy)]
struct Simulated {
    /// Wall-clock milliseconds at [`simulate`].
    wall_ms: i64,
    /// The monotonic instant that stands for the start of the simulation.
    base: Instant,
    /// Time advanced since then.
    elapsed: Duration,
}

#[cfg(test)]
thread_local! {
    static SIMULATED: Cell<Option<Simulated>> = const { Cell::new(None) };
}

/// Milliseconds since the Unix epoch (0 if the system clock is before it).
pub fn now_ms() -> i64 {
    #[cfg(test)]
    if let Some(s) = SIMULATED.get() {
        return s.wall_ms.saturating_add(s.elapsed.as_millis() as i64);
    }
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A monotonic instant, for deadlines.
pub fn monotonic() -> Instant {
    #[cfg(test)]
    if let Some(s) = SIMULATED.get() {
        return s.base + s.elapsed;
    }
    Instant::now()
}

/// Switches this thread to a simulated clock that reads `wall_ms` now and
/// moves only when [`advance`]d.
#[cfg(test)]
pub fn simulate(wall_ms: i64) {
    SIMULATED.set(Some(Simulated {
        wall_ms,
        base: Instant::now(),
        elapsed: Duration::ZERO,
    }));
}

/// Moves this thread's simulated clock forward by `by` (no-op on the real
/// clock).
#[cfg(test)]
pub fn advance(by: Duration) {
    if let Some(mut s) = SIMULATED.get() {
        s.elapsed += by;
        SIMULATED.set(Some(s));
    }
}

/// Back to the real clock on this thread.
#[cfg(test)]
pub fn real() {
    SIMULATED.set(None);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_simulated_clock_moves_only_when_advanced() {
        simulate(1_000);
        let start = monotonic();
        assert_eq!(now_ms(), 1_000);
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(now_ms(), 1_000);
        assert_eq!(monotonic(), start);
        advance(Duration::from_millis(250));
        assert_eq!(now_ms(), 1_250);
        assert_eq!(monotonic() - start, Duration::from_millis(250));
        real();
        assert!(now_ms() > 1_600_000_000_000);
    }

    #[test]
    fn another_thread_keeps_the_real_clock() {
        simulate(7);
        let other = std::thread::spawn(now_ms).join().unwrap();
        assert!(other > 1_600_000_000_000);
        assert_eq!(now_ms(), 7);
        real();
    }
}
