//! A shard's answer to a scrape: its [`ShardSample`], built on the shard
//! from its own probes (`crate::metrics`) and state (partitions, groups,
//! transactions, glommio's executor), and sent back over the mesh.
//!
//! Building it reads every partition this shard leads, so it costs time
//! proportional to them; it runs once per scrape (Prometheus' default is
//! every 15 s), never per request.

use super::ShardCtx;
use crate::group::state::GroupState;
use crate::metrics::{
    self, ApiSample, CommittedSample, ErrorCounts, ErrorSample, IoSample, LogSample,
    PartitionSample, ShardSample,
};
use crate::txn::state::TxnState;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

thread_local! {
    /// Seconds from the shard's start to its first image applied.
    static RECOVERY_SECONDS: Cell<f64> = const { Cell::new(0.0) };
    /// glommio's statistics of this shard, summed over scrapes.
    static RUNTIME: RefCell<RuntimeTotals> = RefCell::new(RuntimeTotals::default());
}

/// glommio's executor, task-queue and I/O statistics of this shard since
/// it started. glommio hands them out as deltas — `executor_stats`,
/// `all_task_queue_stats` and `io_stats` each take the values and reset
/// them (`std::mem::take`) — so exporting what one call returns as a
/// counter would make every scrape look like a counter reset; the scrape
/// adds each delta here instead. Nothing else in fjord reads these stats,
/// so no delta is lost to another reader.
#[derive(Default)]
struct RuntimeTotals {
    tasks_executed: u64,
    scheduler_runs: u64,
    /// Run time by task queue label (`shares_N`: queues of equal shares
    /// are one series).
    queue_runtime_seconds: BTreeMap<String, f64>,
    io: IoSample,
}

impl RuntimeTotals {
    fn add_glommio_stats(&mut self) {
        let ex = glommio::executor();
        let stats = ex.executor_stats();
        self.tasks_executed += stats.tasks_executed();
        self.scheduler_runs += stats.scheduler_runs();
        for q in ex.all_task_queue_stats(Vec::new()) {
            *self
                .queue_runtime_seconds
                .entry(format!("shares_{}", q.current_shares()))
                .or_default() += q.runtime().as_secs_f64();
        }
        let rings = ex.io_stats().all_rings();
        let io = &mut self.io;
        io.files_opened += rings.files_opened();
        io.files_closed += rings.files_closed();
        let add = |(ops, bytes): (u64, u64), to: &mut (u64, u64)| {
            to.0 += ops;
            to.1 += bytes;
        };
        add(rings.file_reads(), &mut io.direct_reads);
        add(rings.file_buffered_reads(), &mut io.buffered_reads);
        add(rings.file_deduped_reads(), &mut io.deduped_reads);
        add(rings.file_writes(), &mut io.direct_writes);
        add(rings.file_buffered_writes(), &mut io.buffered_writes);
    }
}

/// Records how long this shard took to open and recover its partitions.
pub fn set_recovery_seconds(seconds: f64) {
    RECOVERY_SECONDS.set(seconds);
}

impl ShardCtx {
    /// Whether this shard has applied its first metadata image (its logs
    /// are open and recovered).
    pub fn serving(&self) -> bool {
        self.first_image.borrow().is_none()
    }

    /// This shard's values for a scrape.
    pub fn metrics_sample(&self) -> ShardSample {
        let mut s = ShardSample {
            shard: self.shard,
            ready: self.serving(),
            coordinators_loaded: !self.groups.any_loading(),
            inflight_requests: self.inflight_requests() as u64,
            cpu_seconds: metrics::thread_cpu_seconds(),
            io_memory_bytes: self.config.io_memory_bytes.unwrap_or(0) as u64,
            producer_ids_left: self.producer_ids.remaining().max(0) as u64,
            ..ShardSample::default()
        };
        metrics::with_requests(|r| {
            for (key, a) in r.apis.iter().enumerate().take(metrics::API_KEYS_MAX - 1) {
                if a.requests.get() == 0 {
                    continue;
                }
                s.apis.push(ApiSample {
                    api_key: key as i16,
                    requests: a.requests.get(),
                    closed: a.closed.get(),
                    bytes_in: a.bytes_in.get(),
                    bytes_out: a.bytes_out.get(),
                    total: a.total.sample(),
                    queue: a.queue.sample(),
                    local: a.local.sample(),
                    remote: a.remote.sample(),
                    send: a.send.sample(),
                });
            }
            for (key, e) in r.errors.iter().enumerate().take(metrics::API_KEYS_MAX - 1) {
                for (slot, n) in e.codes.iter().enumerate() {
                    if n.get() > 0 {
                        s.errors.push(ErrorSample {
                            api_key: key as i16,
                            code: ErrorCounts::code_of_slot(slot),
                            count: n.get(),
                        });
                    }
                }
            }
            s.connections_accepted = r.connections_accepted.get();
            s.connections_closed = r.connections_closed.get();
            s.connections_refused = r.connections_refused.get();
            s.connections_open = s.connections_accepted.saturating_sub(s.connections_closed);
        });
        let cache = self.logs.cache();
        s.log = metrics::with_log(|l| LogSample {
            appends: l.appends.get(),
            append_bytes: l.append_bytes.get(),
            fsyncs: l.fsyncs.get(),
            fsync: l.fsync.sample(),
            fsync_batch_appends: l.fsync_batch_appends.sample(),
            cache_hits: l.cache_hits.get(),
            cache_hit_bytes: l.cache_hit_bytes.get(),
            cache_misses: l.cache_misses.get(),
            cache_used_bytes: cache.used_bytes() as u64,
            cache_capacity_bytes: cache.capacity_bytes() as u64,
            catch_up_read_bytes: l.catch_up_read_bytes.get(),
            cleanings: l.cleanings.get(),
            cleaner_read_bytes: l.cleaner_read_bytes.get(),
            cleaner_written_bytes: l.cleaner_written_bytes.get(),
            cleaner_seconds: l.cleaner_micros.get() as f64 / 1e6,
            cleaner_last_dirty_ratio: l.cleaner_last_dirty_ppm.get() as f64 / 1e6,
            unwritten_bytes: self.logs.unwritten_bytes(),
            recovery_seconds: RECOVERY_SECONDS.get(),
        });
        for p in self.partitions() {
            s.partitions.push(PartitionSample {
                topic: p.tp.topic.clone(),
                partition: p.tp.partition.0,
                log_start: p.log.log_start_offset().0,
                high_watermark: p.log.high_watermark().0,
                last_stable: p.last_stable_offset(),
                log_end: p.log.log_end_offset().0,
                size_bytes: p.log.size_bytes(),
                segments: p.log.segment_count() as u64,
            });
        }
        let (by_state, members, committed) = self.groups.metrics_view();
        // Every live state, 0 included (as Kafka's NumGroups{State} gauges),
        // so a state's series does not vanish when its last group leaves it.
        s.groups_by_state = [
            GroupState::Empty,
            GroupState::PreparingRebalance,
            GroupState::CompletingRebalance,
            GroupState::Stable,
        ]
        .into_iter()
        .map(|st| {
            let n = by_state
                .iter()
                .filter(|(g, _)| *g == st)
                .map(|(_, n)| n)
                .sum();
            (st.name(), n)
        })
        .collect();
        s.group_members = members;
        s.committed = committed
            .into_iter()
            .map(|(group, topic, partition, offset)| CommittedSample {
                group,
                topic,
                partition,
                offset,
            })
            .collect();
        let txns = self.txn.all();
        s.transactional_ids = txns.len() as u64;
        s.open_transactions = txns
            .iter()
            .filter(|t| {
                matches!(
                    t.state,
                    TxnState::Ongoing | TxnState::PrepareCommit | TxnState::PrepareAbort
                )
            })
            .count() as u64;
        metrics::with_coordinators(|c| {
            s.rebalances = c.rebalances.get();
            s.markers = c.markers.get();
            s.fenced_producers = c.fenced_producers.get();
            s.txn_committed = c.txn_committed.sample();
            s.txn_aborted = c.txn_aborted.sample();
            s.producer_id_blocks = c.producer_id_blocks.get();
        });
        RUNTIME.with_borrow_mut(|totals| {
            totals.add_glommio_stats();
            s.executor_tasks = totals.tasks_executed;
            s.executor_scheduler_runs = totals.scheduler_runs;
            s.task_queue_runtime_seconds = totals
                .queue_runtime_seconds
                .iter()
                .map(|(q, secs)| (q.clone(), *secs))
                .collect();
            s.io = totals.io.clone();
        });
        s
    }

    /// Every shard's sample, gathered over the mesh (this shard's
    /// directly), each waited for until `deadline`: a shard that does not
    /// answer in time is left out, and the caller sees which.
    pub async fn gather_samples(
        self: &std::rc::Rc<Self>,
        deadline: std::time::Instant,
    ) -> Vec<Result<ShardSample, super::router::CallError>> {
        let calls = (0..self.cores()).map(|shard| {
            self.router.invoke(
                shard,
                deadline,
                (),
                |()| async { self.metrics_sample() },
                |(), reply| super::messages::ShardMessage::Sample { reply },
            )
        });
        futures::future::join_all(calls).await
    }
}
