#!/usr/bin/env bash
# The rest of issue 23's benchmark campaign, as it was run on 2026-12-02:
# every directory below is one scripts/compare.sh or scripts/perf-test.sh
# invocation, fjord and stock Kafka alternating, 3 pairs each.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
out=tuning/results/fjord-vs-kafka/2026-12-02-campaign
w=workloads
step() { echo "=== $(date -u +%T) $*" | tee -a "$out/campaign.log"; }

step latency, 60 s warm-up, default flush both sides
REPEAT=3 PEERS=kafka scripts/compare.sh $out/latency-warm60 $w/latency-100b-10k-warm60.toml
step fsync-acks against log.flush.interval.messages=1
REPEAT=3 PEERS=kafka FJORD_FLAGS=--fsync-acks KAFKA_FLUSH=every-message \
  scripts/compare.sh $out/fsync $w/latency-100b-10k-warm60.toml $w/saturate-1kb.toml
step saturating variants: 1 and 16 partitions, idempotent, 100 ms transactions
REPEAT=3 PEERS=kafka scripts/compare.sh $out/saturate-variants \
  $w/saturate-1kb.toml $w/saturate-1kb-16p.toml $w/saturate-1kb-idempotent.toml $w/saturate-1kb-txn100.toml
step backlog drain, fjord direct catch-up reads
REPEAT=3 PEERS=kafka FJORD_FLAGS="--catch-up-reads direct" scripts/compare.sh $out/backlog-direct $w/backlog-drain-1kb.toml
step backlog drain, fjord sendfile catch-up reads
REPEAT=3 PEERS=kafka FJORD_FLAGS="--catch-up-reads sendfile" scripts/compare.sh $out/backlog-sendfile $w/backlog-drain-1kb.toml
pt() { local d=$1; shift; step "perf-test $d"; env RECORDS=5000000 WARMUP_RECORDS=1000000 PAIRS=3 "$@" scripts/perf-test.sh "$out/perf-test-$d"; }
pt plain
pt no-idempotence IDEMPOTENCE=false
pt 16p PARTITIONS=16
step "perf-test txn100"
RECORDS=5000000 WARMUP_RECORDS=1000000 PAIRS=3 scripts/perf-test.sh $out/perf-test-txn100 -- --transaction-duration-ms 100
pt fsync FJORD_FLAGS=--fsync-acks KAFKA_FLUSH=every-message
step done
