#!/usr/bin/env bash
# A/B throughput cost: the same workload against fjord with flags A and flags
# B, alternating A, B, A, B... REPEAT times (fresh broker per run), then a
# min/median/max summary of acknowledged throughput and broker CPU s/GB.
#
# usage: scripts/ab.sh OUTDIR WORKLOAD.toml "FLAGS A" "FLAGS B" [bench flags...]
#   e.g. scripts/ab.sh /tmp/idem workloads/saturate-1kb.toml \
#          "--idempotence false" "--idempotence true"
# Environment: REPEAT (3), FJORD_PORT (19092), BROKER_CPU (0), CLIENT_CPU (1),
# FJORD_FLAGS (extra `fjord serve` flags), BROKER_A / BROKER_B (the broker
# binary of each side, default this build's: to compare two builds, e.g.
#   BROKER_A=/tmp/fjord-old BROKER_B=target/release/fjord scripts/ab.sh OUT W "" "").
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage}; w=${2:?usage}; a=${3?usage}; b=${4?usage}; shift 4
target=${CARGO_TARGET_DIR:-target}
fjord="$target/release/fjord"
port=${FJORD_PORT:-19092}
mkdir -p "$out/a" "$out/b"
data=$(mktemp -d)
trap 'rm -rf "$data"' EXIT
for r in $(seq "${REPEAT:-3}"); do
  for side in a b; do
    flags=$a; broker=${BROKER_A:-$fjord}
    [ $side = b ] && { flags=$b; broker=${BROKER_B:-$fjord}; }
    rm -rf "$data/fjord"
    # shellcheck disable=SC2086
    "$fjord" bench --workload "$w" --label "$side" --name "$(basename "$w" .toml)-$r" --output "$out/$side" \
      --client-cores "${CLIENT_CPU:-1}" --bootstrap "127.0.0.1:$port" \
      --broker-cmd "taskset -c ${BROKER_CPU:-0} $broker serve --data-dir $data/fjord --port $port --listen 127.0.0.1 --cores 1 --no-pin ${FJORD_FLAGS:-}" \
      $flags "$@" | grep -v '^\[' | tee -a "$out/console.log"
  done
done
python3 - "$out" "$a" "$b" <<'PY'
import json, glob, statistics, sys
out, fa, fb = sys.argv[1:4]
def load(side):
    rs = [json.load(open(f)) for f in sorted(glob.glob(f"{out}/{side}/*.json"))]
    mb = [r["totals"]["publishMBps"] for r in rs]
    cpu = [r.get("broker", {}).get("cpuSecondsPerGB") or 0 for r in rs]
    p99 = [r["aggregatedPublishLatency99pct"] for r in rs]
    return mb, cpu, p99
rows = []
for side, flags in (("a", fa), ("b", fb)):
    mb, cpu, p99 = load(side)
    rows.append((side, flags, mb, cpu, p99))
print("| side | flags | runs | MB/s min / median / max | broker CPU s/GB min / median / max | publish p99 ms median |")
print("|---|---|---|---|---|---|")
for side, flags, mb, cpu, p99 in rows:
    f = lambda xs, d=1: " / ".join(f"{x:.{d}f}" for x in (min(xs), statistics.median(xs), max(xs)))
    print(f"| {side} | `{flags}` | {len(mb)} | {f(mb)} | {f(cpu, 3)} | {statistics.median(p99):.2f} |")
ma, mb_ = statistics.median(rows[0][2]), statistics.median(rows[1][2])
print(f"\nmedian throughput of b relative to a: {mb_ / ma:.4f} (cost {100 * (1 - mb_ / ma):.2f} %)")
PY
