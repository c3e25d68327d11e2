//! What the leader of a replicated partition knows of its followers, and
//! the rules Kafka's leader applies with it (`Partition.scala`'s follower
//! fetch state, `maybeIncrementLeaderHW`, `getOutOfSyncReplicas`,
//! `canAddReplicaToIsr`, `checkEnoughReplicasReachOffset`; KIP-966 for the
//! high watermark under `min.insync.replicas`). `docs/replication.md`
//! §4.1 is the design this serves.
//!
//! Pure state: times and offsets come in as arguments, so the rules are
//! tested here exactly and the deterministic simulation can drive them.
//! The shard that leads the partition owns one [`LeaderState`]; every
//! follower Fetch calls [`LeaderState::record_fetch`], and after it (and
//! after each local append) the leader asks for the new high watermark.
//!
//! - **Caught up** (Kafka's `isCaughtUp`): a follower is caught up when
//!   its log end equals the leader's, or it was caught up within
//!   `replica.lag.time.max.ms`. It was caught up at a fetch that asked for
//!   the leader's log end as it was at that fetch, or, at a fetch that
//!   asked for at least what the leader's end was at its *previous* fetch,
//!   as of that previous fetch. So a follower that keeps up under steady
//!   writes (always one fetch behind) stays caught up.
//! - **High watermark**: the smallest log end among the leader and every
//!   follower of the *maximal* ISR (the committed ISR plus the members an
//!   AlterPartition in flight would add; a member it would remove still
//!   counts until the removal is committed) and every caught-up follower
//!   (so the HW never runs away from a follower about to be added). With fewer than `min.insync.replicas` in the ISR it does not
//!   advance at all (KIP-966): what is below it is then on at least
//!   `min.insync.replicas` replicas, which is what makes the eligible
//!   leader replicas safe to elect. It never moves back.
//! - **acks=all**: refused before the append when the ISR is below
//!   `min.insync.replicas` (NOT_ENOUGH_REPLICAS); answered once the HW
//!   passes the batch, with NOT_ENOUGH_REPLICAS_AFTER_APPEND if the ISR
//!   shrank below the minimum meanwhile.
//! - **Low watermark** (Kafka's `lowWatermarkIfLeader`): the smallest log
//!   start of the leader and every follower of a live broker, as their
//!   fetches report it; DeleteRecords is answered once it passes the
//!   requested offset (every live replica deleted the records).
//! - **ISR changes** are only proposed here ([`LeaderState::shrink_candidates`],
//!   [`LeaderState::expand_candidates`]); the controller commits them
//!   (AlterPartition) and the new ISR comes back through the metadata
//!   image ([`LeaderState::set_isr`]). One change is in flight at a time.
//!   A follower is proposed only when its last fetch named its node's
//!   current broker epoch, or none (-1, as Kafka allows; KIP-903, Kafka's
//!   `isReplicaIsrEligible`), and
//!   the proposal carries each member's epoch for the controller to check
//!   ([`LeaderState::broker_epochs`]).

use std::collections::BTreeMap;

/// Kafka's `replica.lag.time.max.ms` default.
pub const REPLICA_LAG_TIME_MAX_MS: i64 = crate::config::REPLICA_LAG_TIME_MAX_MS_DEFAULT as i64;

/// One follower, as the leader saw it at its last fetch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FollowerState {
    /// The follower's log end: the offset its last fetch asked for.
    pub log_end: i64,
    pub log_start: i64,
    /// The leader's log end when that fetch arrived.
    pub leader_end_at_last_fetch: i64,
    pub last_fetch_ms: i64,
    /// When it was last known to have the leader's whole log.
    pub last_caught_up_ms: i64,
    /// The follower's broker epoch at that fetch (registration), -1 none.
    pub broker_epoch: i64,
}

impl FollowerState {
    fn new() -> FollowerState {
        FollowerState {
            log_end: -1,
            log_start: -1,
            leader_end_at_last_fetch: -1,
            last_fetch_ms: -1,
            last_caught_up_ms: -1,
            broker_epoch: -1,
        }
    }

    /// Kafka's `isCaughtUp`.
    pub fn caught_up(&self, leader_end: i64, now_ms: i64, lag_max_ms: i64) -> bool {
        self.log_end == leader_end
            || (self.last_caught_up_ms >= 0 && now_ms - self.last_caught_up_ms <= lag_max_ms)
    }
}

/// What a follower's fetch was refused for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FetchRecordError {
    /// Not an assigned replica: Kafka's leader answers UNKNOWN_LEADER_EPOCH
    /// when the fetch names a current leader epoch (the replica may be new
    /// in metadata the leader has not seen), else NOT_LEADER_OR_FOLLOWER
    /// (`Partition.followerReplicaOrThrow`).
    #[error("replica {0} is not assigned this partition")]
    NotAssigned(i32),
}

/// An acks=all produce's fate, checked when the HW moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcksAll {
    /// Not yet on enough replicas.
    Waiting,
    /// Below the HW and the ISR is at least the minimum.
    Done,
    /// Below the HW, but the ISR shrank under the minimum meanwhile
    /// (NOT_ENOUGH_REPLICAS_AFTER_APPEND).
    DoneUnderMinIsr,
}

/// The leader's view of one partition's replicas.
#[derive(Clone, Debug)]
pub struct LeaderState {
    /// This broker (the leader).
    leader: i32,
    /// Every follower assigned the partition (not the leader), with what
    /// its last fetch said.
    followers: BTreeMap<i32, FollowerState>,
    /// The committed ISR (the leader included).
    isr: Vec<i32>,
    /// The ISR an AlterPartition in flight proposes, if any.
    proposed: Option<Vec<i32>>,
    /// Where the leader's current epoch starts: a follower joins the ISR
    /// only once it holds the whole of the previous epochs.
    epoch_start_offset: i64,
    high_watermark: i64,
    min_isr: usize,
    lag_max_ms: i64,
}

impl LeaderState {
    /// The state of a leader that just took over: `replicas` is the
    /// assignment (the leader among them), `isr` the committed ISR, and
    /// `high_watermark` what the leader's log had (a new leader's HW may be
    /// behind the old one's; it catches up as followers fetch). The ISR's
    /// followers count as caught up as of `now_ms`, as Kafka resets them
    /// when leadership changes: they get `replica.lag.time.max.ms` to fetch.
    pub fn new(
        leader: i32,
        replicas: &[i32],
        isr: &[i32],
        epoch_start_offset: i64,
        high_watermark: i64,
        min_isr: usize,
        now_ms: i64,
    ) -> LeaderState {
        LeaderState {
            leader,
            followers: replicas
                .iter()
                .filter(|&&r| r != leader)
                .map(|&r| {
                    let mut s = FollowerState::new();
                    if isr.contains(&r) {
                        s.last_caught_up_ms = now_ms;
                    }
                    (r, s)
                })
                .collect(),
            isr: isr.to_vec(),
            proposed: None,
            epoch_start_offset,
            high_watermark,
            min_isr: min_isr.max(1),
            lag_max_ms: REPLICA_LAG_TIME_MAX_MS,
        }
    }

    pub fn with_lag_max_ms(mut self, ms: i64) -> Self {
        self.lag_max_ms = ms;
        self
    }

    pub fn high_watermark(&self) -> i64 {
        self.high_watermark
    }

    pub fn isr(&self) -> &[i32] {
        &self.isr
    }

    /// The ISR an AlterPartition in flight proposes, if any.
    pub fn proposed(&self) -> Option<&[i32]> {
        self.proposed.as_deref()
    }

    pub fn follower(&self, id: i32) -> Option<&FollowerState> {
        self.followers.get(&id)
    }

    /// A follower fetched at `fetch_offset` (its log end) when the leader's
    /// log ended at `leader_end` (Kafka's `updateFetchStateOrThrow`).
    pub fn record_fetch(
        &mut self,
        follower: i32,
        fetch_offset: i64,
        log_start: i64,
        leader_end: i64,
        now_ms: i64,
        broker_epoch: i64,
    ) -> Result<(), FetchRecordError> {
        let s = self
            .followers
            .get_mut(&follower)
            .ok_or(FetchRecordError::NotAssigned(follower))?;
        if fetch_offset >= leader_end {
            s.last_caught_up_ms = s.last_caught_up_ms.max(now_ms);
        } else if s.leader_end_at_last_fetch >= 0 && fetch_offset >= s.leader_end_at_last_fetch {
            s.last_caught_up_ms = s.last_caught_up_ms.max(s.last_fetch_ms);
        }
        s.log_end = fetch_offset;
        s.log_start = log_start;
        s.leader_end_at_last_fetch = leader_end;
        s.last_fetch_ms = now_ms;
        s.broker_epoch = broker_epoch;
        Ok(())
    }

    /// The committed ISR plus what an AlterPartition in flight adds.
    fn maximal_isr(&self) -> Vec<i32> {
        let mut m = self.isr.clone();
        if let Some(p) = &self.proposed {
            for r in p {
                if !m.contains(r) {
                    m.push(*r);
                }
            }
        }
        m
    }

    /// Moves the high watermark as far as the rules allow with the
    /// leader's log ending at `leader_end`; returns it (never lower than
    /// before).
    pub fn advance_high_watermark(&mut self, leader_end: i64, now_ms: i64) -> i64 {
        if self.isr.len() < self.min_isr {
            return self.high_watermark;
        }
        let maximal = self.maximal_isr();
        let mut hw = leader_end;
        for (&id, s) in &self.followers {
            // Kafka also leaves out fenced or shutting-down brokers here
            // (`isReplicaIsrEligible`); that needs broker registration.
            let counts = maximal.contains(&id) || s.caught_up(leader_end, now_ms, self.lag_max_ms);
            if counts {
                hw = hw.min(s.log_end.max(0));
            }
        }
        if hw > self.high_watermark {
            self.high_watermark = hw;
        }
        self.high_watermark
    }

    /// Kafka's `lowWatermarkIfLeader`: the smallest log start among the
    /// leader's (`leader_log_start`) and every follower's whose broker is
    /// `live` (registered and unfenced), each as its last fetch reported
    /// it. A live follower that has not fetched since this state was made
    /// counts as -1 (not known), as Kafka resets its replicas' states on a
    /// leader change. DeleteRecords is answered once this passes its
    /// offset.
    pub fn low_watermark(&self, leader_log_start: i64, live: impl Fn(i32) -> bool) -> i64 {
        self.followers
            .iter()
            .filter(|(id, _)| live(**id))
            .map(|(_, s)| s.log_start)
            .fold(leader_log_start, i64::min)
    }

    /// Whether a follower holds the whole of the previous epochs, which
    /// joining the ISR takes (Kafka's `isFollowerInSync`, with the HW).
    fn may_join(&self, s: &FollowerState) -> bool {
        s.log_end >= self.epoch_start_offset
    }

    /// Whether an acks=all produce may be appended now.
    pub fn enough_replicas_for_acks_all(&self) -> bool {
        self.isr.len() >= self.min_isr
    }

    /// The fate of an acks=all produce whose last offset is `last_offset`.
    pub fn acks_all(&self, last_offset: i64) -> AcksAll {
        if self.high_watermark <= last_offset {
            AcksAll::Waiting
        } else if self.maximal_isr().len() >= self.min_isr {
            AcksAll::Done
        } else {
            AcksAll::DoneUnderMinIsr
        }
    }

    /// ISR members (not the leader) no longer caught up: the ISR to
    /// propose without them, if any (and none is in flight).
    pub fn shrink_candidates(&self, leader_end: i64, now_ms: i64) -> Option<Vec<i32>> {
        if self.proposed.is_some() {
            return None;
        }
        let out: Vec<i32> = self
            .isr
            .iter()
            .copied()
            .filter(|&r| r != self.leader)
            .filter(|r| {
                self.followers
                    .get(r)
                    .is_none_or(|s| !s.caught_up(leader_end, now_ms, self.lag_max_ms))
            })
            .collect();
        if out.is_empty() {
            return None;
        }
        Some(
            self.isr
                .iter()
                .copied()
                .filter(|r| !out.contains(r))
                .collect(),
        )
    }

    /// Followers outside the ISR that hold everything up to the HW and the
    /// whole of the previous epochs, and whose last fetch came from their
    /// node's current process: the ISR to propose with them, if any (and
    /// none is in flight). `live_epoch` is the image's broker epoch of a
    /// broker whose node is registered and not fenced (None otherwise);
    /// a follower's last fetch must have named that epoch (Kafka's
    /// `isReplicaIsrEligible`, KIP-903). A fetch of an older process of
    /// the node (one in flight when it restarted) does not make it
    /// eligible: its log may have lost what that fetch reported; it is
    /// proposed at the first fetch of the current process. A fetch that
    /// names no epoch (-1: a node from before broker epochs, or a process
    /// not registered yet) is taken, as Kafka takes it, so that a rolling
    /// upgrade keeps the older nodes in the ISRs; the controller checks
    /// -1 no further either.
    pub fn expand_candidates(&self, live_epoch: impl Fn(i32) -> Option<i64>) -> Option<Vec<i32>> {
        if self.proposed.is_some() {
            return None;
        }
        let add: Vec<i32> = self
            .followers
            .iter()
            .filter(|(id, s)| {
                !self.isr.contains(id)
                    && s.log_end >= self.high_watermark
                    && self.may_join(s)
                    && live_epoch(**id).is_some_and(|e| s.broker_epoch == -1 || s.broker_epoch == e)
            })
            .map(|(&id, _)| id)
            .collect();
        if add.is_empty() {
            return None;
        }
        let mut isr = self.isr.clone();
        isr.extend(add);
        Some(isr)
    }

    /// The broker epoch of each member of `isr`, as Kafka's AlterPartition
    /// v3 sends them (`NewIsrWithEpochs`): a follower's from its last
    /// fetch (-1 before any), the leader's `own`.
    pub fn broker_epochs(&self, isr: &[i32], own: i64) -> Vec<(i32, i64)> {
        isr.iter()
            .map(|&r| {
                let epoch = if r == self.leader {
                    own
                } else {
                    self.followers.get(&r).map_or(-1, |s| s.broker_epoch)
                };
                (r, epoch)
            })
            .collect()
    }

    /// An AlterPartition proposing `isr` was sent.
    pub fn propose(&mut self, isr: Vec<i32>) {
        self.proposed = Some(isr);
    }

    /// The committed ISR from the metadata (an AlterPartition answered, or
    /// someone else's change): any proposal in flight is settled.
    pub fn set_isr(&mut self, isr: &[i32]) {
        // A member the ISR lost (the controller fenced its broker, or a
        // shrink this leader proposed) holds the HW back as a caught-up
        // replica only once it fetches again: Kafka leaves fenced brokers
        // out (`isReplicaIsrEligible`), and a dead follower, caught up
        // when it died, would otherwise stall acks=all for
        // `replica.lag.time.max.ms`. A live one's next fetch counts again.
        for (id, f) in self.followers.iter_mut() {
            if self.isr.contains(id) && !isr.contains(id) {
                f.last_caught_up_ms = -1;
            }
        }
        self.isr = isr.to_vec();
        self.proposed = None;
    }

    /// The assignment changed under the same leadership (a reassignment,
    /// `docs/replication.md` §4.5): new followers start with no fetch
    /// (outside the ISR until they catch up), removed ones are forgotten,
    /// the others keep their positions; `min_isr` is the effective
    /// minimum for the new replica count.
    pub fn set_replicas(&mut self, replicas: &[i32], min_isr: usize) {
        self.followers.retain(|id, _| replicas.contains(id));
        for &r in replicas {
            if r != self.leader {
                self.followers.entry(r).or_insert_with(FollowerState::new);
            }
        }
        self.min_isr = min_isr.max(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAG: i64 = REPLICA_LAG_TIME_MAX_MS;

    /// Every follower's broker epoch in the image (each node registered
    /// once, unfenced).
    const EPOCH: i64 = 7;

    fn current(_: i32) -> Option<i64> {
        Some(EPOCH)
    }

    /// Leader 1, followers 2 and 3, all in the ISR, min ISR 2, HW 0.
    fn three() -> LeaderState {
        LeaderState::new(1, &[1, 2, 3], &[1, 2, 3], 0, 0, 2, 0)
    }

    #[test]
    fn the_high_watermark_is_the_smallest_log_end_of_the_isr() {
        let mut s = three();
        s.record_fetch(2, 10, 0, 10, 1, EPOCH).unwrap();
        s.record_fetch(3, 7, 0, 10, 1, EPOCH).unwrap();
        assert_eq!(s.advance_high_watermark(10, 1), 7);
        // It never moves back, even if a fetch says less.
        s.record_fetch(3, 5, 0, 10, 2, EPOCH).unwrap();
        assert_eq!(s.advance_high_watermark(10, 2), 7);
        s.record_fetch(3, 10, 0, 10, 3, EPOCH).unwrap();
        assert_eq!(s.advance_high_watermark(12, 3), 10);
    }

    /// A reassignment adds replica 4 and removes 3 under the same
    /// leadership: 4 is a follower outside the ISR until it holds the HW,
    /// then proposed; 3's fetches are refused; 2 keeps its position.
    #[test]
    fn new_replicas_follow_and_removed_ones_are_forgotten() {
        let mut s = three();
        s.record_fetch(2, 10, 0, 10, 1, EPOCH).unwrap();
        s.record_fetch(3, 10, 0, 10, 1, EPOCH).unwrap();
        assert_eq!(s.advance_high_watermark(10, 1), 10);
        s.set_replicas(&[1, 2, 4], 2);
        s.set_isr(&[1, 2]);
        assert!(s.record_fetch(3, 10, 0, 10, 2, -1).is_err());
        assert_eq!(s.follower(2).unwrap().log_end, 10);
        s.record_fetch(4, 3, 0, 10, 2, EPOCH).unwrap();
        assert_eq!(s.expand_candidates(current), None);
        s.record_fetch(4, 10, 0, 10, 3, EPOCH).unwrap();
        assert_eq!(s.expand_candidates(current), Some(vec![1, 2, 4]));
    }

    #[test]
    fn a_follower_one_fetch_behind_under_steady_writes_stays_caught_up() {
        let mut s = three().with_lag_max_ms(100);
        // Each fetch asks for the leader's end as of the previous fetch.
        let mut leader_end = 10;
        s.record_fetch(2, 10, 0, leader_end, 0, EPOCH).unwrap();
        for t in 1..50 {
            let asked = leader_end;
            leader_end += 5;
            s.record_fetch(2, asked, 0, leader_end, t * 60, EPOCH)
                .unwrap();
            assert!(s.follower(2).unwrap().caught_up(leader_end, t * 60, 100));
        }
        // One that stops fetching falls out after the lag.
        let last = 49 * 60;
        assert!(!s
            .follower(2)
            .unwrap()
            .caught_up(leader_end, last + 200, 100));
    }

    #[test]
    fn an_isr_member_that_lags_is_proposed_for_removal_and_counts_until_committed() {
        let mut s = three();
        s.record_fetch(2, 10, 0, 10, 0, EPOCH).unwrap();
        s.record_fetch(3, 4, 0, 10, 0, EPOCH).unwrap();
        assert_eq!(s.shrink_candidates(10, LAG), None, "within the lag");
        let shrunk = s.shrink_candidates(10, LAG + 1).expect("3 lags");
        assert_eq!(shrunk, vec![1, 2]);
        s.propose(shrunk.clone());
        // Until the controller commits it, 3 still holds the HW back.
        assert_eq!(s.advance_high_watermark(10, LAG + 1), 4);
        s.set_isr(&shrunk);
        assert_eq!(s.advance_high_watermark(10, LAG + 2), 10);
    }

    /// A follower caught up when its broker was fenced (the controller
    /// took it out of the ISR) no longer holds the HW back: the leader's
    /// later writes are acknowledged by the ISR left; once it fetches
    /// again it counts as any caught-up replica.
    #[test]
    fn a_member_taken_out_of_the_isr_stops_holding_the_high_watermark() {
        let mut s = three();
        s.record_fetch(2, 10, 0, 10, 0, EPOCH).unwrap();
        s.record_fetch(3, 10, 0, 10, 0, EPOCH).unwrap();
        assert_eq!(s.advance_high_watermark(10, 0), 10);
        s.set_isr(&[1, 2]);
        s.record_fetch(2, 15, 0, 15, 1, EPOCH).unwrap();
        assert_eq!(s.advance_high_watermark(15, 1), 15, "3 does not count");
        s.record_fetch(3, 15, 0, 20, 2, EPOCH).unwrap();
        s.record_fetch(2, 18, 0, 20, 2, EPOCH).unwrap();
        assert_eq!(
            s.advance_high_watermark(20, 2),
            15,
            "3 caught up again counts"
        );
    }

    #[test]
    fn below_min_isr_the_high_watermark_stands_still_and_acks_all_is_refused() {
        let mut s = LeaderState::new(1, &[1, 2, 3], &[1], 0, 5, 2, 0);
        assert!(!s.enough_replicas_for_acks_all());
        s.record_fetch(2, 9, 0, 9, 0, EPOCH).unwrap();
        assert_eq!(s.advance_high_watermark(9, 0), 5, "KIP-966");
        // 2 caught up to the HW: it may join.
        assert_eq!(s.expand_candidates(current), Some(vec![1, 2]));
        s.propose(vec![1, 2]);
        s.set_isr(&[1, 2]);
        assert!(s.enough_replicas_for_acks_all());
        assert_eq!(s.advance_high_watermark(9, 0), 9);
        assert_eq!(s.acks_all(8), AcksAll::Done);
        assert_eq!(s.acks_all(9), AcksAll::Waiting);
        // The ISR shrinks under the minimum after an append: answered, but
        // NOT_ENOUGH_REPLICAS_AFTER_APPEND.
        s.set_isr(&[1]);
        assert_eq!(s.acks_all(8), AcksAll::DoneUnderMinIsr);
    }

    #[test]
    fn a_caught_up_follower_about_to_join_holds_the_high_watermark() {
        let mut s = LeaderState::new(1, &[1, 2, 3], &[1, 2], 0, 0, 1, 0);
        s.record_fetch(2, 10, 0, 10, 0, EPOCH).unwrap();
        s.record_fetch(3, 6, 0, 10, 0, EPOCH).unwrap();
        // 3 was caught up at its previous fetch (none yet): not caught up,
        // so the HW goes by the ISR alone.
        assert_eq!(s.advance_high_watermark(10, LAG + 1), 10);
        let mut s = LeaderState::new(1, &[1, 2, 3], &[1, 2], 0, 0, 1, 0);
        s.record_fetch(2, 10, 0, 10, 0, EPOCH).unwrap();
        s.record_fetch(3, 10, 0, 10, 0, EPOCH).unwrap();
        s.record_fetch(3, 10, 0, 12, 1, EPOCH).unwrap();
        // 3 is caught up (within the lag) and may join: the HW waits for it.
        s.record_fetch(2, 12, 0, 12, 1, EPOCH).unwrap();
        assert_eq!(s.advance_high_watermark(12, 1), 10);
    }

    #[test]
    fn a_follower_joins_only_once_it_holds_the_previous_epochs() {
        // The leader's epoch started at 20; the HW is 15 (behind it).
        let mut s = LeaderState::new(1, &[1, 2], &[1], 20, 15, 1, 0);
        s.record_fetch(2, 16, 0, 25, 0, EPOCH).unwrap();
        assert_eq!(s.expand_candidates(current), None);
        s.record_fetch(2, 20, 0, 25, 1, EPOCH).unwrap();
        assert_eq!(s.expand_candidates(current), Some(vec![1, 2]));
    }

    /// KIP-903: a caught-up follower joins only on a fetch that names its
    /// node's current broker epoch or none. One whose last fetch came from
    /// an older process of its node (stale epoch), or whose node is fenced
    /// or not registered, is not proposed; a fetch with the current epoch
    /// makes it eligible, and so does one naming none (-1, a node from
    /// before broker epochs, as Kafka lets it); the proposal carries each
    /// member's epoch.
    #[test]
    fn a_follower_joins_only_with_its_current_broker_epoch() {
        let mut s = LeaderState::new(1, &[1, 2], &[1], 0, 10, 1, 0);
        let image = |id: i32| (id == 2).then_some(EPOCH);
        s.record_fetch(2, 10, 0, 10, 0, EPOCH - 1).unwrap();
        assert!(s.follower(2).unwrap().caught_up(10, 0, LAG));
        assert_eq!(s.expand_candidates(image), None, "a stale epoch");
        s.record_fetch(2, 10, 0, 10, 1, -1).unwrap();
        assert_eq!(
            s.expand_candidates(image),
            Some(vec![1, 2]),
            "no epoch named"
        );
        assert_eq!(
            s.expand_candidates(|_| None),
            None,
            "no epoch named, fenced"
        );
        s.record_fetch(2, 10, 0, 10, 2, EPOCH).unwrap();
        assert_eq!(s.expand_candidates(|_| None), None, "fenced");
        assert_eq!(s.expand_candidates(image), Some(vec![1, 2]));
        assert_eq!(s.broker_epochs(&[1, 2], 3), vec![(1, 3), (2, EPOCH)]);
    }

    /// The low watermark is the least log start of the leader and every
    /// follower of a live broker, one not yet fetched counting as unknown
    /// (-1); a dead follower's does not hold it back.
    #[test]
    fn the_low_watermark_is_the_least_log_start_of_the_live_replicas() {
        let mut s = three();
        let all = |_: i32| true;
        assert_eq!(s.low_watermark(5, all), -1, "no follower fetched yet");
        s.record_fetch(2, 10, 5, 10, 1, EPOCH).unwrap();
        assert_eq!(s.low_watermark(5, all), -1, "3 has not fetched");
        s.record_fetch(3, 10, 3, 10, 1, EPOCH).unwrap();
        assert_eq!(s.low_watermark(5, all), 3);
        assert_eq!(s.low_watermark(2, all), 2, "the leader's counts too");
        s.record_fetch(3, 10, 7, 10, 2, EPOCH).unwrap();
        assert_eq!(s.low_watermark(8, all), 5, "2 still at 5");
        assert_eq!(s.low_watermark(8, |r| r != 2), 7, "2 is not live");
        assert_eq!(s.low_watermark(8, |r| r == 1), 8, "the leader alone");
    }

    #[test]
    fn an_unassigned_replica_is_refused() {
        let mut s = three();
        assert_eq!(
            s.record_fetch(9, 0, 0, 10, 0, EPOCH),
            Err(FetchRecordError::NotAssigned(9))
        );
    }
}
