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
//!
//! The layout is for the incremental fetch's hot path, which must cost in
//! proportion to what changed, not to the session's size (a consumer of
//! 500 partitions sends a few changes per fetch; `tuning/results/
//! fetch-sessions.md` measured string-keyed maps costing more than the
//! full fetches sessions replace):
//! - a session's partitions live in slots with stable numbers, and the
//!   reading order is a `Vec` of slot numbers: reading the session walks
//!   the vector, the "news" check after reading goes to each partition's
//!   slot directly, and moving the partitions that returned records to the
//!   end is a stable partition of the vector, all without hashing;
//! - the topics are a small table; a partition names its topic by its
//!   index there, and the index from (topic, partition) to slot, used only
//!   for the partitions a request names or forgets, hashes two integers;
//!   topic names are hashed once per topic a request names;
//! - each slot carries the partition's handle as last resolved, valid while
//!   the shard's image and partition set are unchanged ([`Resolved`]), so
//!   reading does not look partitions up by name either.

use crate::partition::Partition;
use std::collections::HashMap;
use std::rc::Weak;

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

/// A topic of a session: by topic id for sessions opened with topic ids
/// (Fetch v13+; the name is then empty), else by name (the id is then all
/// zeros).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SessionTopic {
    pub name: String,
    pub id: [u8; 16],
}

/// A partition's handle as the handler last resolved it, and the `stamp`
/// (the shard's image version and partition-set version) it was resolved
/// under: while the stamp is current, the handle is what a look-up by name
/// would find. Weak, so that a session of a deleted topic does not keep its
/// log open.
#[derive(Clone, Debug)]
pub struct Resolved {
    pub partition: Weak<Partition>,
    pub stamp: (u64, u64),
}

/// What the session remembers of a partition: what the client asked last,
/// and what the broker last told it.
#[derive(Clone, Debug)]
pub struct SessionPartition {
    /// Its topic: an index into the session's topics ([`FetchSession::topic`]).
    pub topic: u32,
    pub partition: i32,
    pub fetch_offset: i64,
    pub partition_max_bytes: i32,
    /// The client's `current_leader_epoch` (checked on every read).
    pub current_leader_epoch: i32,
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    pub log_start_offset: i64,
    /// The last read of it returned records: the next reads it last.
    pub had_records: bool,
    /// The handle the last read used, if it resolved to one.
    pub resolved: Option<Resolved>,
    /// False once forgotten (the slot is then free for reuse).
    live: bool,
}

impl SessionPartition {
    /// A partition the client just added: the broker has told it nothing
    /// (Kafka's INVALID_HIGH_WATERMARK etc.), so the next response
    /// includes it.
    pub fn new(
        topic: u32,
        partition: i32,
        fetch_offset: i64,
        partition_max_bytes: i32,
        current_leader_epoch: i32,
    ) -> SessionPartition {
        SessionPartition {
            topic,
            partition,
            fetch_offset,
            partition_max_bytes,
            current_leader_epoch,
            high_watermark: -1,
            last_stable_offset: -1,
            log_start_offset: -1,
            had_records: false,
            resolved: None,
            live: true,
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

/// A topic of a session and how many of its partitions the session holds.
#[derive(Debug)]
struct TopicEntry {
    topic: SessionTopic,
    partitions: usize,
}

/// One session. See the module doc for the layout.
#[derive(Debug)]
pub struct FetchSession {
    pub id: i32,
    /// The epoch the next incremental fetch must carry.
    pub epoch: i32,
    pub uses_topic_ids: bool,
    pub last_used_ms: i64,
    /// Changed by every incremental fetch that begins (and unique across
    /// the cache's sessions): a request that awaited after reading the
    /// session uses its slot numbers again only if it is unchanged.
    pub generation: u64,
    topics: Vec<TopicEntry>,
    /// Topic index by name (sessions by name) or by id (sessions by id).
    topic_names: HashMap<String, u32>,
    topic_ids: HashMap<[u8; 16], u32>,
    /// Topic entries with no partitions left, reused for the next topic.
    free_topics: Vec<u32>,
    slots: Vec<SessionPartition>,
    /// Slot by (topic index, partition), for live slots.
    index: HashMap<(u32, i32), u32>,
    /// Live slots in reading order (and, until [`Self::settle`], slots
    /// forgotten since).
    order: Vec<u32>,
    /// Slots free for reuse, and slots forgotten but maybe still in `order`.
    free_slots: Vec<u32>,
    forgotten: Vec<u32>,
    len: usize,
}

impl FetchSession {
    fn new(
        id: i32,
        uses_topic_ids: bool,
        topics: Vec<SessionTopic>,
        partitions: Vec<SessionPartition>,
        now_ms: i64,
        generation: u64,
    ) -> FetchSession {
        let mut s = FetchSession {
            id,
            epoch: next_epoch(INITIAL_EPOCH),
            uses_topic_ids,
            last_used_ms: now_ms,
            generation,
            topics: Vec::with_capacity(topics.len()),
            topic_names: HashMap::new(),
            topic_ids: HashMap::new(),
            free_topics: Vec::new(),
            slots: Vec::with_capacity(partitions.len()),
            index: HashMap::with_capacity(partitions.len()),
            order: Vec::with_capacity(partitions.len()),
            free_slots: Vec::new(),
            forgotten: Vec::new(),
            len: 0,
        };
        for (i, topic) in topics.into_iter().enumerate() {
            s.map_topic(&topic, i as u32);
            s.topics.push(TopicEntry {
                topic,
                partitions: 0,
            });
        }
        for p in partitions {
            debug_assert!((p.topic as usize) < s.topics.len());
            let slot = s.slots.len() as u32;
            let fresh = s.index.insert((p.topic, p.partition), slot).is_none();
            debug_assert!(fresh, "no partition twice");
            s.topics[p.topic as usize].partitions += 1;
            s.slots.push(p);
            s.order.push(slot);
            s.len += 1;
        }
        s
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Topic `index` (a [`SessionPartition::topic`]).
    pub fn topic(&self, index: u32) -> &SessionTopic {
        &self.topics[index as usize].topic
    }

    /// How many topic indices there are (some may have no partitions).
    pub fn topic_slots(&self) -> usize {
        self.topics.len()
    }

    /// The partitions in reading order, with their slot numbers.
    pub fn partitions(&self) -> impl Iterator<Item = (u32, &SessionPartition)> {
        self.order.iter().filter_map(|&slot| {
            let p = &self.slots[slot as usize];
            p.live.then_some((slot, p))
        })
    }

    /// Calls `f` with each partition in reading order, its slot number and
    /// its topic (the read of an incremental fetch: no look-up, no hashing).
    pub fn for_each_partition(
        &mut self,
        mut f: impl FnMut(u32, &SessionTopic, &mut SessionPartition),
    ) {
        for &slot in &self.order {
            let p = &mut self.slots[slot as usize];
            if p.live {
                f(slot, &self.topics[p.topic as usize].topic, p);
            }
        }
    }

    /// Drops every cached partition handle (see
    /// [`FetchSessionCache::drop_partition_handles`]).
    fn drop_partition_handles(&mut self) {
        for p in &mut self.slots {
            p.resolved = None;
        }
    }

    /// The partition in `slot`, if that slot holds one.
    pub fn slot_mut(&mut self, slot: u32) -> Option<&mut SessionPartition> {
        self.slots.get_mut(slot as usize).filter(|p| p.live)
    }

    fn topic_index(&self, name: &str, id: &[u8; 16]) -> Option<u32> {
        if self.uses_topic_ids {
            self.topic_ids.get(id).copied()
        } else {
            self.topic_names.get(name).copied()
        }
    }

    fn map_topic(&mut self, topic: &SessionTopic, index: u32) {
        if self.uses_topic_ids {
            self.topic_ids.insert(topic.id, index);
        } else {
            self.topic_names.insert(topic.name.clone(), index);
        }
    }

    /// The index of the topic a request names (by `id` in sessions by id,
    /// else by `name`), added if new.
    fn topic_index_or_add(&mut self, name: &str, id: &[u8; 16]) -> u32 {
        if let Some(i) = self.topic_index(name, id) {
            return i;
        }
        let topic = if self.uses_topic_ids {
            SessionTopic {
                name: String::new(),
                id: *id,
            }
        } else {
            SessionTopic {
                name: name.to_string(),
                id: [0; 16],
            }
        };
        let entry = TopicEntry {
            topic: topic.clone(),
            partitions: 0,
        };
        let index = match self.free_topics.pop() {
            Some(i) => {
                self.topics[i as usize] = entry;
                i
            }
            None => {
                self.topics.push(entry);
                (self.topics.len() - 1) as u32
            }
        };
        self.map_topic(&topic, index);
        index
    }

    /// Adds a partition (of the topic named `name`, or with id `id` in a
    /// session by id) or updates its fetch position, limit and the client's
    /// leader epoch.
    pub fn upsert(
        &mut self,
        name: &str,
        id: &[u8; 16],
        partition: i32,
        fetch_offset: i64,
        partition_max_bytes: i32,
        current_leader_epoch: i32,
    ) {
        let topic = self.topic_index_or_add(name, id);
        if let Some(&slot) = self.index.get(&(topic, partition)) {
            let p = &mut self.slots[slot as usize];
            p.fetch_offset = fetch_offset;
            p.partition_max_bytes = partition_max_bytes;
            p.current_leader_epoch = current_leader_epoch;
            return;
        }
        let p = SessionPartition::new(
            topic,
            partition,
            fetch_offset,
            partition_max_bytes,
            current_leader_epoch,
        );
        let slot = match self.free_slots.pop() {
            Some(slot) => {
                self.slots[slot as usize] = p;
                slot
            }
            None => {
                self.slots.push(p);
                (self.slots.len() - 1) as u32
            }
        };
        self.index.insert((topic, partition), slot);
        self.order.push(slot);
        self.topics[topic as usize].partitions += 1;
        self.len += 1;
    }

    /// Drops a partition the client forgot (a no-op if the session does not
    /// hold it). Its slot leaves the reading order at [`Self::settle`].
    pub fn forget(&mut self, name: &str, id: &[u8; 16], partition: i32) {
        let Some(topic) = self.topic_index(name, id) else {
            return;
        };
        let Some(slot) = self.index.remove(&(topic, partition)) else {
            return;
        };
        let p = &mut self.slots[slot as usize];
        p.live = false;
        p.resolved = None;
        self.forgotten.push(slot);
        self.len -= 1;
        let t = &mut self.topics[topic as usize];
        t.partitions -= 1;
        if t.partitions == 0 {
            if self.uses_topic_ids {
                self.topic_ids.remove(&t.topic.id);
            } else {
                self.topic_names.remove(&t.topic.name);
            }
            t.topic.name = String::new();
            self.free_topics.push(topic);
        }
    }

    /// Takes forgotten slots out of the reading order and frees them (one
    /// pass over the order, only after forgets).
    pub fn settle(&mut self) {
        if self.forgotten.is_empty() {
            return;
        }
        let slots = &self.slots;
        self.order.retain(|&slot| slots[slot as usize].live);
        self.free_slots.append(&mut self.forgotten);
        debug_assert_eq!(self.order.len(), self.len);
    }

    /// Puts the partitions whose last read returned records
    /// ([`SessionPartition::had_records`]) after the others, keeping each
    /// group's order, as Kafka does so that a busy partition cannot take
    /// the response's bytes from the others on every fetch.
    pub fn reorder(&mut self) {
        self.settle();
        let slots = &self.slots;
        let Some(first) = self
            .order
            .iter()
            .position(|&slot| slots[slot as usize].had_records)
        else {
            return;
        };
        let mut moved = Vec::new();
        let mut kept = first;
        for i in first..self.order.len() {
            let slot = self.order[i];
            if slots[slot as usize].had_records {
                moved.push(slot);
            } else {
                self.order[kept] = slot;
                kept += 1;
            }
        }
        self.order.truncate(kept);
        self.order.extend(moved);
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
    /// The next [`FetchSession::generation`].
    next_generation: u64,
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
            next_generation: 1,
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

    fn generation(&mut self) -> u64 {
        let g = self.next_generation;
        self.next_generation += 1;
        g
    }

    /// Drops the partition handles of every session, for when partitions
    /// leave the shard: a `Weak` handle frees the partition but not its
    /// allocation, and an idle session would otherwise keep that of every
    /// deleted partition it held. Sessions re-resolve on their next fetch.
    pub fn drop_partition_handles(&mut self) {
        for s in self.sessions.values_mut() {
            s.drop_partition_handles();
        }
    }

    /// Closes session `id` (if it exists).
    pub fn remove(&mut self, id: i32) -> Option<FetchSession> {
        let s = self.sessions.remove(&id)?;
        self.partitions_total -= s.len();
        Some(s)
    }

    /// Session `id` for an incremental fetch at `epoch` (v13+:
    /// `uses_topic_ids`): checked, its epoch bumped, its use time set and a
    /// new generation given, ready for the request's changes
    /// ([`Self::update`]).
    pub fn begin_incremental(
        &mut self,
        id: i32,
        epoch: i32,
        uses_topic_ids: bool,
        now_ms: i64,
    ) -> Result<&mut FetchSession, SessionError> {
        let generation = self.generation();
        let s = self.sessions.get_mut(&id).ok_or(SessionError::NotFound)?;
        if s.epoch != epoch {
            return Err(SessionError::InvalidEpoch);
        }
        if s.uses_topic_ids != uses_topic_ids {
            return Err(SessionError::TopicIdMismatch);
        }
        s.epoch = next_epoch(s.epoch);
        s.last_used_ms = now_ms;
        s.generation = generation;
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
        s.settle();
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

    /// Opens a session of `partitions` (in reading order, each naming its
    /// topic by index in `topics`, none twice) if there is a slot, or one
    /// can be evicted for it (see the module doc); returns its id, or None
    /// (the fetch then goes on without a session, id 0).
    pub fn create(
        &mut self,
        topics: Vec<SessionTopic>,
        partitions: Vec<SessionPartition>,
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
        let generation = self.generation();
        let session = FetchSession::new(id, uses_topic_ids, topics, partitions, now_ms, generation);
        self.partitions_total += session.len();
        self.sessions.insert(id, session);
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

    const NO_ID: [u8; 16] = [0; 16];

    fn topic(name: &str) -> SessionTopic {
        SessionTopic {
            name: name.into(),
            id: NO_ID,
        }
    }

    /// Session contents: partitions 0..n of topic "t".
    fn parts(n: i32) -> (Vec<SessionTopic>, Vec<SessionPartition>) {
        let partitions = (0..n)
            .map(|p| SessionPartition::new(0, p, 0, 1024, -1))
            .collect();
        (vec![topic("t")], partitions)
    }

    fn create(c: &mut FetchSessionCache, n: i32, now_ms: i64) -> Option<i32> {
        let (topics, partitions) = parts(n);
        c.create(topics, partitions, false, now_ms)
    }

    /// (topic name, partition) in reading order.
    fn order(s: &FetchSession) -> Vec<(String, i32)> {
        s.partitions()
            .map(|(_, p)| (s.topic(p.topic).name.clone(), p.partition))
            .collect()
    }

    #[test]
    fn epochs_are_checked_and_bumped() {
        let mut c = FetchSessionCache::new(10, 100);
        let id = create(&mut c, 2, 0).unwrap();
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
        let s = c.begin_incremental(id, 1, false, 0).unwrap();
        let generation = s.generation;
        assert_eq!(s.epoch, 2);
        assert_eq!(
            c.begin_incremental(id, 1, false, 0).err(),
            Some(SessionError::InvalidEpoch),
            "an epoch is used once"
        );
        let s = c.begin_incremental(id, 2, false, 0).unwrap();
        assert_ne!(
            s.generation, generation,
            "each incremental fetch changes it"
        );
        assert_eq!(next_epoch(i32::MAX), 1);
    }

    #[test]
    fn a_full_cache_evicts_stale_then_smaller_sessions() {
        let mut c = FetchSessionCache::new(2, 100);
        let a = create(&mut c, 3, 0).unwrap();
        let b = create(&mut c, 1, 10).unwrap();
        // Not larger than the smallest, nothing stale: no session.
        assert_eq!(create(&mut c, 1, 20), None);
        // Larger than the smallest: it evicts b.
        let d = create(&mut c, 2, 30).unwrap();
        assert!(c.get_mut(b).is_none() && c.get_mut(a).is_some());
        // Once a is unused for the eviction time, even a small one takes
        // its slot.
        let e = create(&mut c, 1, FETCH_SESSION_EVICTION_MS + 1).unwrap();
        assert!(c.get_mut(a).is_none() && c.get_mut(d).is_some() && c.get_mut(e).is_some());
        assert_eq!(c.len(), 2);
        assert_eq!(c.partitions_total(), 3);
    }

    #[test]
    fn the_partition_bound_holds_over_updates() {
        let mut c = FetchSessionCache::new(10, 5);
        assert_eq!(create(&mut c, 6, 0), None);
        let id = create(&mut c, 4, 0).unwrap();
        assert_eq!(c.update(id, |s| s.upsert("t", &NO_ID, 9, 0, 1, -1)), Ok(()));
        assert_eq!(c.partitions_total(), 5);
        // Updating a partition it holds does not grow it.
        assert_eq!(c.update(id, |s| s.upsert("t", &NO_ID, 9, 7, 1, -1)), Ok(()));
        assert_eq!(c.partitions_total(), 5);
        assert_eq!(
            c.update(id, |s| s.upsert("t", &NO_ID, 10, 0, 1, -1)),
            Err(SessionError::NotFound)
        );
        assert_eq!(c.partitions_total(), 0);
        assert!(c.is_empty());
    }

    #[test]
    fn responded_partitions_move_to_the_end() {
        let mut c = FetchSessionCache::new(10, 100);
        let id = create(&mut c, 4, 0).unwrap();
        c.update(id, |s| {
            s.forget("t", &NO_ID, 2);
            s.forget("t", &NO_ID, 42);
            s.forget("unknown", &NO_ID, 0);
            s.upsert("t", &NO_ID, 7, 5, 1, -1);
        })
        .unwrap();
        let s = c.get_mut(id).unwrap();
        let slot_of = |s: &FetchSession, partition: i32| {
            s.partitions()
                .find(|(_, p)| p.partition == partition)
                .map(|(slot, _)| slot)
                .unwrap()
        };
        for partition in [0, 3] {
            let slot = slot_of(s, partition);
            s.slot_mut(slot).unwrap().had_records = true;
        }
        s.reorder();
        let order: Vec<i32> = s.partitions().map(|(_, p)| p.partition).collect();
        assert_eq!(order, vec![1, 7, 0, 3]);
        // Reads that return nothing leave the order as it is.
        for p in s.slots.iter_mut() {
            p.had_records = false;
        }
        s.reorder();
        let order: Vec<i32> = s.partitions().map(|(_, p)| p.partition).collect();
        assert_eq!(order, vec![1, 7, 0, 3]);
        assert_eq!(c.partitions_total(), 4);
    }

    #[test]
    fn forgotten_slots_and_topics_are_reused_not_leaked() {
        let mut c = FetchSessionCache::new(10, 100);
        let id = create(&mut c, 2, 0).unwrap();
        // A client that keeps replacing one topic by another: the session's
        // tables stay the size of what it holds.
        for round in 0..50 {
            let old = if round == 0 {
                "t".to_string()
            } else {
                format!("u{}", round - 1)
            };
            let new = format!("u{round}");
            c.update(id, |s| {
                s.upsert(&new, &NO_ID, 0, 0, 1, -1);
                s.upsert(&new, &NO_ID, 1, 0, 1, -1);
                s.forget(&old, &NO_ID, 0);
                s.forget(&old, &NO_ID, 1);
            })
            .unwrap();
        }
        let s = c.get_mut(id).unwrap();
        assert_eq!(
            order(s),
            vec![("u49".to_string(), 0), ("u49".to_string(), 1)]
        );
        assert!(s.slots.len() <= 4 && s.topic_slots() <= 2, "{s:?}");
        assert_eq!(c.partitions_total(), 2);
        // A partition named and forgotten in one request is forgotten, as
        // in Kafka (changes first, then forgets).
        c.update(id, |s| {
            s.upsert("v", &NO_ID, 0, 0, 1, -1);
            s.forget("v", &NO_ID, 0);
        })
        .unwrap();
        assert_eq!(c.get_mut(id).unwrap().len(), 2);
        assert_eq!(c.partitions_total(), 2);
    }

    #[test]
    fn partition_handles_can_be_dropped_in_every_session() {
        let mut c = FetchSessionCache::new(10, 100);
        let ids: Vec<i32> = (0..2).map(|_| create(&mut c, 3, 0).unwrap()).collect();
        for &id in &ids {
            let s = c.get_mut(id).unwrap();
            s.for_each_partition(|_, _, p| {
                p.resolved = Some(Resolved {
                    partition: Weak::new(),
                    stamp: (1, 1),
                })
            });
        }
        c.drop_partition_handles();
        for &id in &ids {
            let s = c.get_mut(id).unwrap();
            assert!(s.partitions().all(|(_, p)| p.resolved.is_none()));
            assert_eq!(s.len(), 3, "only the handles go");
        }
    }

    #[test]
    fn sessions_by_id_key_topics_by_id() {
        let mut c = FetchSessionCache::new(10, 100);
        let a = [1; 16];
        let topics = vec![SessionTopic {
            name: String::new(),
            id: a,
        }];
        let id = c
            .create(topics, vec![SessionPartition::new(0, 0, 0, 1, -1)], true, 0)
            .unwrap();
        c.update(id, |s| {
            // The name is not part of the key of a session by id.
            s.upsert("ignored", &a, 0, 9, 1, -1);
            s.upsert("", &[2; 16], 0, 0, 1, -1);
        })
        .unwrap();
        let s = c.get_mut(id).unwrap();
        let got: Vec<([u8; 16], i32, i64)> = s
            .partitions()
            .map(|(_, p)| (s.topic(p.topic).id, p.partition, p.fetch_offset))
            .collect();
        assert_eq!(got, vec![(a, 0, 9), ([2; 16], 0, 0)]);
    }
}
