#!/usr/bin/env bash
# Every throughput/latency target of issues 4, 6 and 7 measured in one go,
# one run after the other (never in parallel: the machine is shared).
#
# usage: scripts/targets.sh OUTDIR
# Environment: TANSU (peer broker binary; skipped if unset), REPEAT (3),
# DURATION (10s), WARMUP (3s), FAST=1 (shorter runs, REPEAT=2).
# Writes OUTDIR/summary.md plus each run's JSON and console output.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/targets.sh OUTDIR}
mkdir -p "$out"
repeat=${REPEAT:-3}
dur=${DURATION:-10s}
warm=${WARMUP:-3s}
target=${CARGO_TARGET_DIR:-target}
fjord="$target/release/fjord"
[ -x "$fjord" ] || { echo "build first: cargo build --release" >&2; exit 1; }
sum="$out/summary.md"
{
  echo "# targets run: $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD)"
  echo "machine: $(nproc) CPUs, $(uname -r), load average $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$sum"

section() { echo -e "\n## $1\n" | tee -a "$sum"; }

section "Idempotence cost (issue 4): 16 partitions, then 1 partition"
REPEAT=$repeat scripts/ab.sh "$out/idem16" workloads/saturate-1kb.toml \
  "--idempotence false" "--idempotence true" --partitions 16 --duration "$dur" --warmup "$warm" \
  | grep -E '^\||^median' | tee -a "$sum"
REPEAT=$repeat scripts/ab.sh "$out/idem1" workloads/saturate-1kb.toml \
  "--idempotence false" "--idempotence true" --duration "$dur" --warmup "$warm" \
  | grep -E '^\||^median' | tee -a "$sum"

section "Transactions cost (issue 6): 100 ms transactions vs plain, 1 partition"
REPEAT=$repeat scripts/ab.sh "$out/txn" workloads/saturate-1kb.toml \
  "--idempotence false" "--idempotence true --transaction-duration-ms 100" \
  --duration "$dur" --warmup "$warm" | grep -E '^\||^median' | tee -a "$sum"

section "Latency at 10,000 msg/s, 100 B (issue 7): default and --fsync-acks"
for flags in "" "--fsync-acks"; do
  for r in $(seq 2); do
    d=$(mktemp -d)
    taskset -c 1 "$fjord" bench -w workloads/latency-100b-10k.toml --duration "$dur" --warmup "$warm" \
      --client-cores 1 --bootstrap 127.0.0.1:19692 --label "fjord${flags:+-fsync-acks}" \
      --output "$out/latency" \
      --broker-cmd "taskset -c 0 $fjord serve --data-dir $d --port 19692 --listen 127.0.0.1 --cores 1 --no-pin $flags" \
      2>&1 | grep -E "^(publish|end-to-end|broker)" | sed "s/^/fjord ${flags:-default} run $r: /" | tee -a "$sum"
    rm -rf "$d"
  done
done
if command -v fio >/dev/null; then
  d=$(mktemp -d)
  echo "fdatasync after a 4 KiB O_DIRECT write (fio, 15 s, same file system as mktemp):" | tee -a "$sum"
  fio --name=fdatasync --directory="$d" --rw=write --bs=4k --size=64m --direct=1 --ioengine=psync \
    --fdatasync=1 --runtime=15 --time_based --output-format=json 2>/dev/null | python3 -c '
import json, sys
t = sys.stdin.read()  # fio may print notes before its JSON
j = json.loads(t[t.find("{"):])["jobs"][0]["sync"]["lat_ns"]["percentile"]
print("  fdatasync p50 %.3f ms, p99 %.3f ms, p99.9 %.3f ms" % tuple(j[k] / 1e6 for k in ("50.000000", "99.000000", "99.900000")))' | tee -a "$sum"
  rm -rf "$d"
fi

section "Backlog drain (issue 7): 50,000 msg/s of 1 KiB, consumer 12 s late"
d=$(mktemp -d)
"$fjord" bench -w workloads/backlog-drain-1kb.toml --duration 30s --warmup 2s --consumer-delay 12s \
  --client-cores 1 --status-interval-secs 2 --bootstrap 127.0.0.1:19792 --output "$out/drain" \
  --broker-cmd "taskset -c 0 $fjord serve --data-dir $d --port 19792 --listen 127.0.0.1 --cores 1 --no-pin" 2>&1 \
  | tr '\r' '\n' | grep '^\[' | cut -c1-60 | tee "$out/drain.txt" | awk '{print "  " $0}' | tee -a "$sum"
rm -rf "$d"
if command -v iperf3 >/dev/null; then
  iperf3 -s -1 -p 5299 -B 127.0.0.1 >/dev/null 2>&1 &
  sleep 0.5
  echo "loopback limit (iperf3, 1 stream, 5 s):" | tee -a "$sum"
  taskset -c 1 iperf3 -c 127.0.0.1 -p 5299 -t 5 -J | python3 -c '
import json, sys
print("  %.0f MB/s" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 8e6))' | tee -a "$sum"
fi

if [ -n "${TANSU:-}" ]; then
  section "fjord vs Tansu (issue 7): latency and saturating 1 KiB produce"
  REPEAT=2 TANSU=$TANSU scripts/compare.sh "$out/compare" workloads/latency-100b-10k.toml \
    workloads/saturate-1kb.toml -- --duration "$dur" --warmup "$warm" \
    | grep -E "records sent|^broker:|starting broker" | sed 's/^/  /' | tee -a "$sum"
fi
echo "done: $sum"
