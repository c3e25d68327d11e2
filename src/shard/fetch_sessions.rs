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
//! 500 partitions sees a few of them change between two fetches;
//! `tuning/results/fetch-sessions.md` measured an incremental fetch that
//! visits every partition costing about as much as the full fetch it
//! replaces):
//! - a session's partitions live in slots with stable numbers. Each
//!   resolved partition's log flags the session's slot in the session's
//!   [`ChangeSignal`] whenever its high watermark, last stable offset, log
//!   start or health changes (`log::changes`); a request's new positions
//!   flag their slots too. A partition with nothing to read
//!   (its fetch offset at the HW, or the LSO under read_committed), no
//!   error and no change since the session's last response is *quiet*: its
//!   answer would be empty, and Kafka leaves it out of an incremental
//!   response, so it is not read at all. An incremental fetch reads only
//!   the flagged slots and the *active* ones (not quiet at the last
//!   response: data left to read, an error): O(partitions that changed);
//! - the reading order is a rank per slot: a partition that returned
//!   records gets the next rank (Kafka moves it to the end, so that a busy
//!   partition cannot take the response's bytes from the others on every
//!   fetch), and the few slots a fetch reads are sorted by rank;
//! - a parked fetch waits on the session's one signal, not on each
//!   partition: one waker per parked fetch;
//! - the topics are a small table; a partition names its topic by its
//!   index there, and the index from (topic, partition) to slot, used only
//!   for the partitions a request names or forgets, hashes two integers;
//!   topic names are hashed once per topic a request names;
//! - each slot carries the partition's handle as last resolved, valid while
//!   the shard's image and partition set are unchanged ([`Resolved`]), so
//!   reading does not look partitions up by name either. When they change,
//!   or the isolation level does, the next incremental fetch reads every
//!   partition once (as before this design) and re-subscribes them.

use crate::log::changes::ChangeSignal;
use crate::partition::Partition;
use std::collections::HashMap;
use std::rc::{Rc, Weak};

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

/// What a fetch asks of one partition: where to read, how much, and the
/// epochs the fetcher knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FetchPosition {
    pub fetch_offset: i64,
    pub partition_max_bytes: i32,
    /// The client's `current_leader_epoch` (checked on every read).
    pub current_leader_epoch: i32,
    /// The epoch of the last batch the fetcher holds (v12+, -1 when not
    /// sent): checked against this log's epochs for a diverging log
    /// (KIP-320).
    pub last_fetched_epoch: i32,
    /// The fetcher's own log start (a follower's; -1 for consumers).
    pub log_start_offset: i64,
}

/// What the session remembers of a partition: what the client asked last,
/// and what the broker last told it.
#[derive(Clone, Debug)]
pub struct SessionPartition {
    /// Its topic: an index into the session's topics ([`FetchSession::topic`]).
    pub topic: u32,
    pub partition: i32,
    pub pos: FetchPosition,
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    pub log_start_offset: i64,
    /// The last read of it returned records: the next reads it last.
    pub had_records: bool,
    /// Nothing to read, no error, and everything reported: it needs no
    /// read until its log flags it (module doc). Set by the handler.
    pub quiet: bool,
    /// The handle the last read used, if it resolved to one (and whose log
    /// then holds the session's subscription for this slot).
    pub resolved: Option<Resolved>,
    /// Reading order: lower first.
    rank: u64,
    /// The generation of the request that last chose it for reading.
    chosen: u64,
    /// False once forgotten (the slot is then free for reuse).
    live: bool,
}

impl SessionPartition {
    /// A partition the client just added: the broker has told it nothing
    /// (Kafka's INVALID_HIGH_WATERMARK etc.), so the next response
    /// includes it.
    pub fn new(topic: u32, partition: i32, pos: FetchPosition) -> SessionPartition {
        SessionPartition {
            topic,
            partition,
            pos,
            high_watermark: -1,
            last_stable_offset: -1,
            log_start_offset: -1,
            had_records: false,
            quiet: false,
            resolved: None,
            rank: 0,
            chosen: 0,
            live: true,
        }
    }

    /// The partition its last read used, if still there.
    pub fn handle(&self) -> Option<Rc<Partition>> {
        self.resolved.as_ref().and_then(|r| r.partition.upgrade())
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
    /// Slots free for reuse.
    free_slots: Vec<u32>,
    len: usize,
    /// Flagged by the partitions' logs and by the request's new positions
    /// (module doc); a parked fetch of the session waits on it.
    pub signal: Rc<ChangeSignal>,
    /// Slots that were not quiet at the last response (maybe some freed
    /// since): read by every incremental fetch.
    active: Vec<u32>,
    /// The next rank ([`SessionPartition::rank`]).
    next_rank: u64,
    /// The partitions stamp and isolation (read_committed) the quiet flags
    /// were judged under; None: the next fetch reads every partition.
    judged_under: Option<((u64, u64), bool)>,
}

impl FetchSession {
    fn new(
        id: i32,
        uses_topic_ids: bool,
        topics: Vec<SessionTopic>,
        partitions: Vec<SessionPartition>,
        now_ms: i64,
        generation: u64,
        judged_under: Option<((u64, u64), bool)>,
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
            free_slots: Vec::new(),
            len: 0,
            signal: ChangeSignal::new(),
            active: Vec::new(),
            next_rank: 0,
            judged_under,
        };
        for (i, topic) in topics.into_iter().enumerate() {
            s.map_topic(&topic, i as u32);
            s.topics.push(TopicEntry {
                topic,
                partitions: 0,
            });
        }
        for mut p in partitions {
            debug_assert!((p.topic as usize) < s.topics.len());
            let slot = s.slots.len() as u32;
            let fresh = s.index.insert((p.topic, p.partition), slot).is_none();
            debug_assert!(fresh, "no partition twice");
            s.topics[p.topic as usize].partitions += 1;
            if let Some(partition) = p.handle() {
                partition.log.subscribe(&s.signal, slot);
            }
            if !p.quiet {
                s.active.push(slot);
            }
            p.rank = s.rank();
            s.slots.push(p);
            s.len += 1;
        }
        s
    }

    fn rank(&mut self) -> u64 {
        let r = self.next_rank;
        self.next_rank += 1;
        r
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

    /// The partitions in reading order, with their slot numbers (a sort of
    /// the whole session: for tests and diagnostics, not for fetches).
    pub fn partitions(&self) -> impl Iterator<Item = (u32, &SessionPartition)> {
        let mut live: Vec<(u32, &SessionPartition)> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, p)| p.live)
            .map(|(slot, p)| (slot as u32, p))
            .collect();
        live.sort_by_key(|(_, p)| p.rank);
        live.into_iter()
    }

    /// The slots an incremental fetch (of generation [`Self::generation`],
    /// resolving under `stamp`, reading with `read_committed`) must read, in
    /// reading order, into `out`: the active ones and those flagged since
    /// the last response; every partition when the quiet flags were judged
    /// under another stamp or isolation (module doc).
    pub fn slots_to_read(&mut self, stamp: (u64, u64), read_committed: bool, out: &mut Vec<u32>) {
        let generation = self.generation;
        if self.judged_under != Some((stamp, read_committed)) {
            // The flags are moot: every partition is read.
            let mut flagged = Vec::new();
            self.signal.take_into(&mut flagged);
            for (slot, p) in self.slots.iter_mut().enumerate() {
                if p.live {
                    p.chosen = generation;
                    out.push(slot as u32);
                }
            }
        } else {
            let first = out.len();
            for i in 0..self.active.len() {
                let slot = self.active[i];
                if self.choose(slot) {
                    out.push(slot);
                }
            }
            let flagged_from = out.len();
            self.signal.take_into(out);
            let mut kept = flagged_from;
            for i in flagged_from..out.len() {
                if self.choose(out[i]) {
                    out[kept] = out[i];
                    kept += 1;
                }
            }
            out.truncate(kept);
            let slots = &self.slots;
            out[first..].sort_unstable_by_key(|&slot| slots[slot as usize].rank);
            return;
        }
        let slots = &self.slots;
        out.sort_unstable_by_key(|&slot| slots[slot as usize].rank);
    }

    /// Slots flagged since [`Self::slots_to_read`] (or the last call) that
    /// this fetch does not read yet, into `out` (not sorted): what a parked
    /// fetch adds when its signal fires.
    pub fn take_flagged(&mut self, out: &mut Vec<u32>) {
        let from = out.len();
        self.signal.take_into(out);
        let mut kept = from;
        for i in from..out.len() {
            if self.choose(out[i]) {
                out[kept] = out[i];
                kept += 1;
            }
        }
        out.truncate(kept);
    }

    /// Whether `slot` is live and not yet chosen by this generation (then
    /// it is, now).
    fn choose(&mut self, slot: u32) -> bool {
        let generation = self.generation;
        match self.slots.get_mut(slot as usize) {
            Some(p) if p.live && p.chosen != generation => {
                p.chosen = generation;
                true
            }
            _ => false,
        }
    }

    /// The reading rank of `slot` (stale for a slot not live).
    pub fn rank_of(&self, slot: u32) -> u64 {
        self.slots.get(slot as usize).map_or(u64::MAX, |p| p.rank)
    }

    /// Records the outcome of an incremental fetch that read `read` (all
    /// the slots [`Self::slots_to_read`] and [`Self::take_flagged`] chose,
    /// in reading order) after the handler set each one's `quiet` and
    /// `had_records`: those not quiet stay active, those with records are
    /// read last from now on, and the flags count as judged under `stamp`
    /// and `read_committed`.
    pub fn settle_read(
        &mut self,
        read: impl Iterator<Item = u32>,
        stamp: (u64, u64),
        read_committed: bool,
    ) {
        self.active.clear();
        for slot in read {
            let Some(p) = self.slots.get(slot as usize).filter(|p| p.live) else {
                continue;
            };
            let (quiet, had_records) = (p.quiet, p.had_records);
            if !quiet {
                self.active.push(slot);
            }
            if had_records {
                let rank = self.rank();
                self.slots[slot as usize].rank = rank;
            }
        }
        self.judged_under = Some((stamp, read_committed));
    }

    /// Drops every cached partition handle (see
    /// [`FetchSessionCache::drop_partition_handles`]); the next fetch reads
    /// (and re-subscribes) every partition.
    fn drop_partition_handles(&mut self) {
        for p in &mut self.slots {
            p.resolved = None;
        }
        self.judged_under = None;
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
    /// epochs.
    pub fn upsert(&mut self, name: &str, id: &[u8; 16], partition: i32, pos: FetchPosition) {
        let topic = self.topic_index_or_add(name, id);
        if let Some(&slot) = self.index.get(&(topic, partition)) {
            self.slots[slot as usize].pos = pos;
            // A new position is read by this fetch.
            self.signal.flag(slot);
            return;
        }
        let mut p = SessionPartition::new(topic, partition, pos);
        p.rank = self.rank();
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
        self.topics[topic as usize].partitions += 1;
        self.len += 1;
        self.signal.flag(slot);
    }

    /// Drops a partition the client forgot (a no-op if the session does not
    /// hold it) and its subscription; its slot is free for reuse.
    pub fn forget(&mut self, name: &str, id: &[u8; 16], partition: i32) {
        let Some(topic) = self.topic_index(name, id) else {
            return;
        };
        let Some(slot) = self.index.remove(&(topic, partition)) else {
            return;
        };
        let p = &mut self.slots[slot as usize];
        p.live = false;
        if let Some(partition) = p.handle() {
            partition.log.unsubscribe(&self.signal, slot);
        }
        p.resolved = None;
        self.free_slots.push(slot);
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
    ///
    /// `judged_under`: the partitions stamp and isolation under which the
    /// handler judged the partitions' `quiet` flags (None: the first
    /// incremental fetch reads them all).
    pub fn create(
        &mut self,
        topics: Vec<SessionTopic>,
        partitions: Vec<SessionPartition>,
        uses_topic_ids: bool,
        now_ms: i64,
        judged_under: Option<((u64, u64), bool)>,
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
        let session = FetchSession::new(
            id,
            uses_topic_ids,
            topics,
            partitions,
            now_ms,
            generation,
            judged_under,
        );
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
    const STAMP: (u64, u64) = (1, 1);

    /// A position at `fetch_offset` with `max` bytes and no epochs.
    fn pos(fetch_offset: i64, max: i32) -> FetchPosition {
        FetchPosition {
            fetch_offset,
            partition_max_bytes: max,
            current_leader_epoch: -1,
            last_fetched_epoch: -1,
            log_start_offset: -1,
        }
    }

    fn topic(name: &str) -> SessionTopic {
        SessionTopic {
            name: name.into(),
            id: NO_ID,
        }
    }

    /// Session contents: partitions 0..n of topic "t".
    fn parts(n: i32) -> (Vec<SessionTopic>, Vec<SessionPartition>) {
        let partitions = (0..n)
            .map(|p| SessionPartition::new(0, p, pos(0, 1024)))
            .collect();
        (vec![topic("t")], partitions)
    }

    fn create(c: &mut FetchSessionCache, n: i32, now_ms: i64) -> Option<i32> {
        let (topics, partitions) = parts(n);
        c.create(topics, partitions, false, now_ms, Some((STAMP, false)))
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
        assert_eq!(
            c.update(id, |s| s.upsert("t", &NO_ID, 9, pos(0, 1))),
            Ok(())
        );
        assert_eq!(c.partitions_total(), 5);
        // Updating a partition it holds does not grow it.
        assert_eq!(
            c.update(id, |s| s.upsert("t", &NO_ID, 9, pos(7, 1))),
            Ok(())
        );
        assert_eq!(c.partitions_total(), 5);
        assert_eq!(
            c.update(id, |s| s.upsert("t", &NO_ID, 10, pos(0, 1))),
            Err(SessionError::NotFound)
        );
        assert_eq!(c.partitions_total(), 0);
        assert!(c.is_empty());
    }

    /// One incremental fetch as the handler does it: begin, the request's
    /// changes, the slots to read; `outcome` says per partition whether it
    /// returned records and is quiet afterwards. Returns the partitions read.
    fn fetch(
        c: &mut FetchSessionCache,
        id: i32,
        change: impl FnOnce(&mut FetchSession),
        outcome: impl Fn(i32) -> (bool, bool),
    ) -> Vec<i32> {
        let epoch = c.get_mut(id).unwrap().epoch;
        c.begin_incremental(id, epoch, false, 0).unwrap();
        c.update(id, change).unwrap();
        let s = c.get_mut(id).unwrap();
        let mut slots = Vec::new();
        s.slots_to_read(STAMP, false, &mut slots);
        let mut read = Vec::new();
        for &slot in &slots {
            let p = s.slot_mut(slot).unwrap();
            (p.had_records, p.quiet) = outcome(p.partition);
            read.push(p.partition);
        }
        s.settle_read(slots.into_iter(), STAMP, false);
        read
    }

    #[test]
    fn a_fetch_reads_only_active_flagged_and_named_partitions() {
        let mut c = FetchSessionCache::new(10, 100);
        let (topics, mut partitions) = parts(6);
        // Opened with 1 and 4 not quiet (data left to read).
        for p in &mut partitions {
            p.quiet = p.partition != 1 && p.partition != 4;
        }
        let id = c
            .create(topics, partitions, false, 0, Some((STAMP, false)))
            .unwrap();
        let all_quiet = |_| (false, true);
        assert_eq!(fetch(&mut c, id, |_| {}, all_quiet), vec![1, 4]);
        assert_eq!(fetch(&mut c, id, |_| {}, all_quiet), Vec::<i32>::new());
        // A log flags 3 (what `log::changes` does), the request names 5.
        let slot_of = |c: &mut FetchSessionCache, partition: i32| {
            let s = c.get_mut(id).unwrap();
            s.partitions()
                .find(|(_, p)| p.partition == partition)
                .unwrap()
                .0
        };
        let three = slot_of(&mut c, 3);
        c.get_mut(id).unwrap().signal.flag(three);
        let read = fetch(
            &mut c,
            id,
            |s| s.upsert("t", &NO_ID, 5, pos(9, 1)),
            |p| (p == 3, p != 3),
        );
        assert_eq!(read, vec![3, 5]);
        // 3 returned records: still active, and read last from now on.
        assert_eq!(fetch(&mut c, id, |_| {}, all_quiet), vec![3]);
        let order: Vec<i32> = c
            .get_mut(id)
            .unwrap()
            .partitions()
            .map(|(_, p)| p.partition)
            .collect();
        assert_eq!(order, vec![0, 1, 2, 4, 5, 3]);
        // Another stamp (a metadata change) or isolation: everything once.
        let epoch = c.get_mut(id).unwrap().epoch;
        c.begin_incremental(id, epoch, false, 0).unwrap();
        let s = c.get_mut(id).unwrap();
        let mut slots = Vec::new();
        s.slots_to_read((STAMP.0 + 1, STAMP.1), false, &mut slots);
        assert_eq!(slots.len(), 6);
        let mut more = Vec::new();
        s.signal.flag(slots[0]);
        s.take_flagged(&mut more);
        assert!(more.is_empty(), "a slot is read once per fetch");
    }

    #[test]
    fn forgotten_partitions_are_not_read() {
        let mut c = FetchSessionCache::new(10, 100);
        let id = create(&mut c, 4, 0).unwrap();
        let read = fetch(
            &mut c,
            id,
            |s| {
                s.upsert("t", &NO_ID, 2, pos(5, 1));
                s.forget("t", &NO_ID, 2);
                s.forget("t", &NO_ID, 42);
                s.forget("unknown", &NO_ID, 0);
                s.upsert("t", &NO_ID, 7, pos(5, 1));
            },
            |_| (false, true),
        );
        assert_eq!(
            read,
            vec![0, 1, 3, 7],
            "new sessions' partitions are active"
        );
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
                s.upsert(&new, &NO_ID, 0, pos(0, 1));
                s.upsert(&new, &NO_ID, 1, pos(0, 1));
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
            s.upsert("v", &NO_ID, 0, pos(0, 1));
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
            let slots: Vec<u32> = s.partitions().map(|(slot, _)| slot).collect();
            for slot in slots {
                s.slot_mut(slot).unwrap().resolved = Some(Resolved {
                    partition: Weak::new(),
                    stamp: (1, 1),
                });
            }
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
            .create(
                topics,
                vec![SessionPartition::new(0, 0, pos(0, 1))],
                true,
                0,
                None,
            )
            .unwrap();
        c.update(id, |s| {
            // The name is not part of the key of a session by id.
            s.upsert("ignored", &a, 0, pos(9, 1));
            s.upsert("", &[2; 16], 0, pos(0, 1));
        })
        .unwrap();
        let s = c.get_mut(id).unwrap();
        let got: Vec<([u8; 16], i32, i64)> = s
            .partitions()
            .map(|(_, p)| (s.topic(p.topic).id, p.partition, p.pos.fetch_offset))
            .collect();
        assert_eq!(got, vec![(a, 0, 9), ([2; 16], 0, 0)]);
    }
}
