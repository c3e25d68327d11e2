//! Incremental fetch sessions (KIP-227): the shard's cache of them.
//!
//! A consumer fetching hundreds of partitions from one broker would resend
//! the whole list on every Fetch, and get every partition back even when
//! nothing changed. With a session, the broker remembers the partitions
//! (and what it last told the client about each), the client sends only
//! what changed (new fetch offsets, partitions added or `forgotten`), and
//! the response names only partitions with news: records, a moved high
//! watermark, last stable offset or log start, or an error.
//!
//! The protocol, as Kafka's `FetchManager.newContext` reads a request's
//! `(session_id, session_epoch)`:
//! - `(0, -1)`: a full fetch without a session (what fjord did before).
//! - `(id, -1)`: closes session `id`, then a full fetch without a session.
//! - `(id, 0)`: closes session `id` if given, then a full fetch that opens
//!   a new session if the cache has a slot (or can evict one); the
//!   response carries its id, or 0 when none was opened.
//! - `(id, epoch > 0)`: an incremental fetch of session `id`, whose epoch
//!   must be `epoch` (it is bumped by every incremental fetch). Unknown id:
//!   FETCH_SESSION_ID_NOT_FOUND; other epoch: INVALID_FETCH_SESSION_EPOCH;
//!   a session opened with topic ids asked without them or the reverse:
//!   FETCH_SESSION_TOPIC_ID_ERROR. The client then starts over with a full
//!   fetch.
//!
//! Limits (Kafka's): at most [`FETCH_SESSION_CACHE_SLOTS`] sessions per
//! shard (`max.incremental.fetch.session.cache.slots`; each shard is its
//! own broker). When full, a new session may evict one unused for
//! [`FETCH_SESSION_EVICTION_MS`] (`min.incremental.fetch.session.eviction.ms`)
//! or else the session with the fewest partitions if the new one has more
//! (Kafka's `FetchSessionCache.tryEvict` for consumers). fjord adds a bound
//! Kafka lacks: [`FETCH_SESSION_PARTITIONS_MAX`] partitions in all the
//! sessions of a shard, so that the cache's memory is bounded however
//! clients grow their sessions; a session that would cross it is not
//! opened, or, grown by an incremental fetch, is closed
//! (FETCH_SESSION_ID_NOT_FOUND, and the client starts over).
//!
//! Pure state: time comes in as arguments, the handler (`handlers::fetch`)
//! does the reading. Owned by its shard (in `ShardCtx`), used from one
//! request at a time (no borrow is held across an await).

use std::collections::HashMap;

/// Kafka's `max.incremental.fetch.session.cache.slots` default: sessions
/// one shard keeps (`serve --max-incremental-fetch-session-cache-slots`;
/// 0 turns sessions off).
pub const FETCH_SESSION_CACHE_SLOTS: usize = crate::config::FETCH_SESSION_CACHE_SLOTS_DEFAULT;
/// Kafka's `min.incremental.fetch.session.eviction.ms` default: a session
/// unused this long may be evicted for a new one.
pub const FETCH_SESSION_EVICTION_MS: i64 = 120_000;
/// Partitions all the sessions of one shard may hold together (fjord's
/// bound on the cache's memory; each costs about a hundred bytes).
pub const FETCH_SESSION_PARTITIONS_MAX: usize = 1_000_000;

/// Kafka's FINAL_EPOCH and INITIAL_EPOCH of a fetch session.
pub const FINAL_EPOCH: i32 = -1;
pub const INITIAL_EPOCH: i32 = 0;

/// A partition of a session: by topic id for sessions opened with topic
/// ids (Fetch v13+), else by topic name (the id is then all zeros).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SessionKey {
    pub topic_id: [u8; 16],
    pub topic: String,
    pub partition: i32,
}

/// What the session remembers of a partition: what the client asked last,
/// and what the broker last told it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionPartition {
    pub fetch_offset: i64,
    pub partition_max_bytes: i32,
    /// The client's `current_leader_epoch` (checked on every read).
    pub current_leader_epoch: i32,
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    pub log_start_offset: i64,
}

impl SessionPartition {
    /// A partition the client just added: the broker has told it nothing
    /// (Kafka's INVALID_HIGH_WATERMARK etc.), so the next response
    /// includes it.
    pub fn new(
        fetch_offset: i64,
        partition_max_bytes: i32,
        current_leader_epoch: i32,
    ) -> SessionPartition {
        SessionPartition {
            fetch_offset,
            partition_max_bytes,
            current_leader_epoch,
            high_watermark: -1,
            last_stable_offset: -1,
            log_start_offset: -1,
        }
    }

    /// Records what a response told the client.
    pub fn remember(
        &mut self,
        high_watermark: i64,
        last_stable_offset: i64,
        log_start_offset: i64,
    ) {
        self.high_watermark = high_watermark;
        self.last_stable_offset = last_stable_offset;
        self.log_start_offset = log_start_offset;
    }
}

/// One session.
#[derive(Debug)]
pub struct FetchSession {
    pub id: i32,
    /// The epoch the next incremental fetch must carry.
    pub epoch: i32,
    pub uses_topic_ids: bool,
    partitions: HashMap<SessionKey, SessionPartition>,
    /// The partitions in the order they are read; a key removed from
    /// `partitions` may linger here until the next [`Self::reorder`].
    order: Vec<SessionKey>,
    pub last_used_ms: i64,
}

impl FetchSession {
    pub fn len(&self) -> usize {
        self.partitions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.partitions.is_empty()
    }

    /// The partitions in reading order.
    pub fn partitions(&self) -> impl Iterator<Item = (&SessionKey, &SessionPartition)> {
        self.order
            .iter()
            .filter_map(|k| self.partitions.get_key_value(k))
    }

    pub fn get_mut(&mut self, key: &SessionKey) -> Option<&mut SessionPartition> {
        self.partitions.get_mut(key)
    }

    /// Adds a partition or updates its fetch position, limit and the
    /// client's leader epoch.
    pub fn upsert(
        &mut self,
        key: SessionKey,
        fetch_offset: i64,
        partition_max_bytes: i32,
        current_leader_epoch: i32,
    ) {
        match self.partitions.get_mut(&key) {
            Some(p) => {
                p.fetch_offset = fetch_offset;
                p.partition_max_bytes = partition_max_bytes;
                p.current_leader_epoch = current_leader_epoch;
            }
            None => {
                self.order.push(key.clone());
                self.partitions.insert(
                    key,
                    SessionPartition::new(fetch_offset, partition_max_bytes, current_leader_epoch),
                );
            }
        }
    }

    /// Drops a partition the client forgot.
    pub fn forget(&mut self, key: &SessionKey) {
        self.partitions.remove(key);
    }

    /// Puts `responded` (partitions just returned with records) after the
    /// others, keeping each group's order, as Kafka does so that a busy
    /// partition cannot take the response's bytes from the others on every
    /// fetch; drops forgotten keys.
    pub fn reorder(&mut self, responded: &std::collections::HashSet<SessionKey>) {
        let partitions = &self.partitions;
        let (mut quiet, moved): (Vec<SessionKey>, Vec<SessionKey>) = self
            .order
            .drain(..)
            .filter(|k| partitions.contains_key(k))
            .partition(|k| !responded.contains(k));
        quiet.extend(moved);
        self.order = quiet;
        debug_assert_eq!(self.order.len(), self.partitions.len());
    }
}

/// Why an incremental fetch found no usable session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionError {
    /// FETCH_SESSION_ID_NOT_FOUND.
    NotFound,
    /// INVALID_FETCH_SESSION_EPOCH.
    InvalidEpoch,
    /// FETCH_SESSION_TOPIC_ID_ERROR.
    TopicIdMismatch,
}

/// The sessions of one shard. See the module doc.
#[derive(Debug)]
pub struct FetchSessionCache {
    sessions: HashMap<i32, FetchSession>,
    /// Partitions in all sessions.
    partitions_total: usize,
    slots: usize,
    partitions_max: usize,
}

impl Default for FetchSessionCache {
    fn default() -> Self {
        FetchSessionCache::new(FETCH_SESSION_CACHE_SLOTS, FETCH_SESSION_PARTITIONS_MAX)
    }
}

impl FetchSessionCache {
    pub fn new(slots: usize, partitions_max: usize) -> FetchSessionCache {
        FetchSessionCache {
            sessions: HashMap::new(),
            partitions_total: 0,
            slots,
            partitions_max,
        }
    }

    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    pub fn partitions_total(&self) -> usize {
        self.partitions_total
    }

    /// Closes session `id` (if it exists).
    pub fn remove(&mut self, id: i32) -> Option<FetchSession> {
        let s = self.sessions.remove(&id)?;
        self.partitions_total -= s.len();
        Some(s)
    }

    /// Session `id` for an incremental fetch at `epoch` (v13+:
    /// `uses_topic_ids`): checked, its epoch bumped and its use time set,
    /// ready for the request's changes ([`Self::update`]).
    pub fn begin_incremental(
        &mut self,
        id: i32,
        epoch: i32,
        uses_topic_ids: bool,
        now_ms: i64,
    ) -> Result<&mut FetchSession, SessionError> {
        let s = self.sessions.get_mut(&id).ok_or(SessionError::NotFound)?;
        if s.epoch != epoch {
            return Err(SessionError::InvalidEpoch);
        }
        if s.uses_topic_ids != uses_topic_ids {
            return Err(SessionError::TopicIdMismatch);
        }
        s.epoch = next_epoch(s.epoch);
        s.last_used_ms = now_ms;
        Ok(s)
    }

    /// Applies `change` to session `id` and accounts its new size; Err
    /// (and the session is closed) when the shard's partition bound would
    /// be crossed.
    pub fn update(
        &mut self,
        id: i32,
        change: impl FnOnce(&mut FetchSession),
    ) -> Result<(), SessionError> {
        let s = self.sessions.get_mut(&id).ok_or(SessionError::NotFound)?;
        let before = s.len();
        change(s);
        let after = s.len();
        let total = self.partitions_total - before + after;
        if total > self.partitions_max {
            tracing::warn!(
                session = id,
                partitions = after,
                limit = self.partitions_max,
                "a fetch session grew past the shard's fetch-session partitions; closing it"
            );
            self.partitions_total -= before;
            self.sessions.remove(&id);
            return Err(SessionError::NotFound);
        }
        self.partitions_total = total;
        Ok(())
    }

    pub fn get_mut(&mut self, id: i32) -> Option<&mut FetchSession> {
        self.sessions.get_mut(&id)
    }

    /// Opens a session of `partitions` (in reading order) if there is a
    /// slot, or one can be evicted for it (see the module doc); returns its
    /// id, or None (the fetch then goes on without a session, id 0).
    pub fn create(
        &mut self,
        partitions: Vec<(SessionKey, SessionPartition)>,
        uses_topic_ids: bool,
        now_ms: i64,
    ) -> Option<i32> {
        let size = partitions.len();
        if size > self.partitions_max {
            return None;
        }
        while self.sessions.len() >= self.slots
            || self.partitions_total + size > self.partitions_max
        {
            let victim = self.eviction_candidate(size, now_ms)?;
            self.remove(victim);
        }
        let id = self.new_id();
        let order = partitions.iter().map(|(k, _)| k.clone()).collect();
        let partitions: HashMap<_, _> = partitions.into_iter().collect();
        debug_assert_eq!(partitions.len(), size, "no partition twice");
        self.partitions_total += partitions.len();
        self.sessions.insert(
            id,
            FetchSession {
                id,
                epoch: next_epoch(INITIAL_EPOCH),
                uses_topic_ids,
                partitions,
                order,
                last_used_ms: now_ms,
            },
        );
        Some(id)
    }

    /// The session a new one of `size` partitions may evict: the least
    /// recently used if unused for [`FETCH_SESSION_EVICTION_MS`], else the
    /// smallest (the oldest of equals) if it is smaller than `size`.
    fn eviction_candidate(&self, size: usize, now_ms: i64) -> Option<i32> {
        let stale = self
            .sessions
            .values()
            .min_by_key(|s| (s.last_used_ms, s.id))
            .filter(|s| s.last_used_ms + FETCH_SESSION_EVICTION_MS < now_ms);
        if let Some(s) = stale {
            return Some(s.id);
        }
        self.sessions
            .values()
            .min_by_key(|s| (s.len(), s.last_used_ms, s.id))
            .filter(|s| s.len() < size)
            .map(|s| s.id)
    }

    /// A random positive id not in use (Kafka's ids are random too, so that
    /// one client cannot guess another's session).
    fn new_id(&self) -> i32 {
        loop {
            let id = rand::random::<i32>() & i32::MAX;
            if id != 0 && !self.sessions.contains_key(&id) {
                return id;
            }
        }
    }
}

/// Kafka's `FetchMetadata.nextEpoch`: epochs wrap from `i32::MAX` to 1.
pub fn next_epoch(epoch: i32) -> i32 {
    if epoch == i32::MAX {
        1
    } else {
        epoch + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn key(p: i32) -> SessionKey {
        SessionKey {
            topic_id: [0; 16],
            topic: "t".into(),
            partition: p,
        }
    }

    fn parts(n: i32) -> Vec<(SessionKey, SessionPartition)> {
        (0..n)
            .map(|p| (key(p), SessionPartition::new(0, 1024, -1)))
            .collect()
    }

    #[test]
    fn epochs_are_checked_and_bumped() {
        let mut c = FetchSessionCache::new(10, 100);
        let id = c.create(parts(2), false, 0).unwrap();
        assert!(id > 0);
        assert_eq!(
            c.begin_incremental(id + 1, 1, false, 0).err(),
            Some(SessionError::NotFound)
        );
        assert_eq!(
            c.begin_incremental(id, 2, false, 0).err(),
            Some(SessionError::InvalidEpoch)
        );
        assert_eq!(
            c.begin_incremental(id, 1, true, 0).err(),
            Some(SessionError::TopicIdMismatch)
        );
        assert_eq!(c.begin_incremental(id, 1, false, 0).unwrap().epoch, 2);
        assert_eq!(
            c.begin_incremental(id, 1, false, 0).err(),
            Some(SessionError::InvalidEpoch),
            "an epoch is used once"
        );
        assert_eq!(next_epoch(i32::MAX), 1);
    }

    #[test]
    fn a_full_cache_evicts_stale_then_smaller_sessions() {
        let mut c = FetchSessionCache::new(2, 100);
        let a = c.create(parts(3), false, 0).unwrap();
        let b = c.create(parts(1), false, 10).unwrap();
        // Not larger than the smallest, nothing stale: no session.
        assert_eq!(c.create(parts(1), false, 20), None);
        // Larger than the smallest: it evicts b.
        let d = c.create(parts(2), false, 30).unwrap();
        assert!(c.get_mut(b).is_none() && c.get_mut(a).is_some());
        // Once a is unused for the eviction time, even a small one takes
        // its slot.
        let e = c
            .create(parts(1), false, FETCH_SESSION_EVICTION_MS + 1)
            .unwrap();
        assert!(c.get_mut(a).is_none() && c.get_mut(d).is_some() && c.get_mut(e).is_some());
        assert_eq!(c.len(), 2);
        assert_eq!(c.partitions_total(), 3);
    }

    #[test]
    fn the_partition_bound_holds_over_updates() {
        let mut c = FetchSessionCache::new(10, 5);
        assert_eq!(c.create(parts(6), false, 0), None);
        let id = c.create(parts(4), false, 0).unwrap();
        assert_eq!(c.update(id, |s| s.upsert(key(9), 0, 1, -1)), Ok(()));
        assert_eq!(c.partitions_total(), 5);
        assert_eq!(
            c.update(id, |s| s.upsert(key(10), 0, 1, -1)),
            Err(SessionError::NotFound)
        );
        assert_eq!(c.partitions_total(), 0);
        assert!(c.is_empty());
    }

    #[test]
    fn responded_partitions_move_to_the_end() {
        let mut c = FetchSessionCache::new(10, 100);
        let id = c.create(parts(4), false, 0).unwrap();
        c.update(id, |s| {
            s.forget(&key(2));
            s.upsert(key(7), 5, 1, -1);
        })
        .unwrap();
        let s = c.get_mut(id).unwrap();
        s.reorder(&HashSet::from([key(0)]));
        let order: Vec<i32> = s.partitions().map(|(k, _)| k.partition).collect();
        assert_eq!(order, vec![1, 3, 7, 0]);
        assert_eq!(c.partitions_total(), 4);
    }
}
