#!/usr/bin/env bash
# A flat CPU profile of `fjord serve` while Kafka's kafka-producer-perf-test
# (the Java client, its default 16 KiB batches) saturates it: where the
# broker's CPU per GB goes with small produce requests.
#
# usage: scripts/profile-perf-test.sh OUTDIR
#
# fjord on BROKER_CPU (0), the tool on CLIENT_CPU (1), RECORDS (3000000)
# 1 KiB records, acks=all, idempotent; `perf record` (software event
# cpu-clock, so it works in VMs) samples the broker for PROFILE_SECS (10) once
# the tool has run WARMUP_SECS (8). OUTDIR gets profile.txt (`perf report`
# by symbol, self time), tool.txt and commands.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/profile-perf-test.sh OUTDIR}
target=${CARGO_TARGET_DIR:-target}
fjord=$(realpath "$target/release/fjord")
bcpu=${BROKER_CPU:-0}
ccpu=${CLIENT_CPU:-1}
records=${RECORDS:-3000000}
warmup=${WARMUP_SECS:-8}
secs=${PROFILE_SECS:-10}
port=${FJORD_PORT:-19092}
command -v perf >/dev/null || { echo "perf is not installed" >&2; exit 1; }
mkdir -p "$out"
out=$(realpath "$out")
data=$(mktemp -d "$(realpath "$target")/profile.XXXXXX")
broker=(taskset -c "$bcpu" "$fjord" serve --data-dir "$data/fjord" --port "$port" --listen 127.0.0.1 --cores 1 --no-pin)
tool=(taskset -c "$ccpu" scripts/kafka-cli kafka-producer-perf-test --bootstrap-server "127.0.0.1:$port"
  --topic profile --num-records "$records" --record-size 1024 --throughput -1
  --command-property acks=all enable.idempotence=true)
{
  echo "# commit $(git rev-parse --short HEAD), $(date -u +%FT%TZ)"
  printf '%q ' "${broker[@]}"; echo
  printf '%q ' "${tool[@]}"; echo
  echo "perf record -F 999 -p BROKER_PID -o PERF_DATA -- sleep $secs (after ${warmup}s)"
} >"$out/commands.txt"
"${broker[@]}" >"$data/broker.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$data"' EXIT
for _ in $(seq 100); do
  scripts/kafka-cli kafka-topics --bootstrap-server "127.0.0.1:$port" --create --topic profile \
    --partitions 1 --replication-factor 1 >/dev/null 2>&1 && break
  sleep 0.3
done
"${tool[@]}" >"$out/tool.txt" 2>&1 &
tool_pid=$!
sleep "$warmup"
perf record -F 999 -p "$pid" -o "$data/perf.data" -- sleep "$secs" 2>"$data/perf-record.log"
wait "$tool_pid" || true
perf report -i "$data/perf.data" --no-children --sort symbol --stdio 2>/dev/null |
  grep -v '^$' | head -80 >"$out/profile.txt"
echo "profile: $out/profile.txt"
