#!/usr/bin/env bash
# Run workloads against fjord and a peer broker (Tansu) in one session,
# alternating brokers, and build one report.
#
# usage: scripts/compare.sh OUTDIR WORKLOAD.toml... [-- extra fjord bench flags]
#
# Placement on a 2-core machine: each broker is confined to CPU 0 (taskset),
# the bench's threads and librdkafka's to CPU 1 (--client-cores 1). fjord runs
# one shard (--cores 1 --no-pin, placed by taskset). Each run starts a fresh
# broker (--broker-cmd) so CPU seconds and peak RSS are per run.
#
# Environment: TANSU (path of the tansu 0.6 binary, default: tansu on PATH),
# FJORD_PORT (19092), TANSU_PORT (29092), BROKER_CPU (0), CLIENT_CPU (1),
# FJORD_FLAGS (extra `fjord serve` flags, e.g. --fsync-acks), REPEAT (1).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/compare.sh OUTDIR WORKLOAD.toml... [-- bench flags]}
shift
workloads=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do workloads+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
target=${CARGO_TARGET_DIR:-target}
fjord="$target/release/fjord"
tansu=${TANSU:-tansu}
fport=${FJORD_PORT:-19092}
tport=${TANSU_PORT:-29092}
bcpu=${BROKER_CPU:-0}
ccpu=${CLIENT_CPU:-1}
repeat=${REPEAT:-1}
mkdir -p "$out"
data=$(mktemp -d)
trap 'rm -rf "$data"' EXIT
for r in $(seq "$repeat"); do
  for w in "${workloads[@]}"; do
    rm -rf "$data/fjord"
    "$fjord" bench --workload "$w" --label fjord --output "$out" --client-cores "$ccpu" \
      --bootstrap "127.0.0.1:$fport" \
      --broker-cmd "taskset -c $bcpu $fjord serve --data-dir $data/fjord --port $fport --listen 127.0.0.1 --cores 1 --no-pin ${FJORD_FLAGS:-}" \
      "$@" 2>&1 | tee -a "$out/console.log" || echo "run failed: fjord $w" | tee -a "$out/console.log"
    "$fjord" bench --workload "$w" --label tansu --output "$out" --client-cores "$ccpu" \
      --bootstrap "127.0.0.1:$tport" \
      --broker-cmd "taskset -c $bcpu $tansu broker --listener-url tcp://127.0.0.1:$tport --advertised-listener-url tcp://127.0.0.1:$tport --storage-engine memory://tansu/" \
      "$@" 2>&1 | tee -a "$out/console.log" || echo "run failed: tansu $w" | tee -a "$out/console.log"
  done
done
