#!/usr/bin/env bash
# What metrics cost: the same workloads against fjord with recording off
# (`--metrics-recording false`, the baseline) and on (the default, with the
# endpoint scraped every SCRAPE_INTERVAL seconds during the run, as a
# Prometheus server would), alternating off, on, off, on... REPEAT times,
# each run on a fresh broker. Placement as scripts/ab.sh: the broker on
# BROKER_CPU (one shard), the bench's client threads on CLIENT_CPU.
#
# usage: scripts/metrics-cost.sh OUTDIR WORKLOAD.toml...
# Environment: REPEAT (3), FJORD_PORT (19092), METRICS_PORT (19644),
# SCRAPE_INTERVAL (5), BROKER_CPU (0), CLIENT_CPU (1), BENCH_FLAGS (extra
# `fjord bench` flags, e.g. "--duration 30s --warmup 5s").
#
# OUTDIR gets the bench JSON results (off/, on/), console.log, commands.txt
# and summary.md (min / median / max of broker CPU s/GB, throughput and
# publish p99 per workload and side).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/metrics-cost.sh OUTDIR WORKLOAD.toml...}; shift
target=${CARGO_TARGET_DIR:-target}
fjord=$(realpath "$target/release/fjord")
port=${FJORD_PORT:-19092}
mport=${METRICS_PORT:-19644}
interval=${SCRAPE_INTERVAL:-5}
mkdir -p "$out/off" "$out/on"
out=$(realpath "$out")
data=$(mktemp -d -p "$target")
scraper=
trap 'rm -rf "$data"; [ -n "$scraper" ] && kill "$scraper" 2>/dev/null || true' EXIT
{
  echo "commit: $(git rev-parse HEAD)$(git diff --quiet || echo ' (dirty)')"
  echo "host: $(uname -srm), $(nproc) cpus, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
  echo "date: $(date -u +%FT%TZ)"
} > "$out/commands.txt"
for r in $(seq "${REPEAT:-3}"); do
  for w in "$@"; do
    for side in off on; do
      rm -rf "$data/fjord"
      rec=false; [ $side = on ] && rec=true
      broker="taskset -c ${BROKER_CPU:-0} $fjord serve --data-dir $data/fjord --port $port --listen 127.0.0.1 --cores 1 --no-pin --metrics-listen 127.0.0.1:$mport --metrics-recording $rec"
      if [ $side = on ]; then
        ( while sleep "$interval"; do curl -s -o /dev/null "http://127.0.0.1:$mport/metrics" || true; done ) &
        scraper=$!
      fi
      cmd=("$fjord" bench --workload "$w" --label "$side" --name "$(basename "$w" .toml)-$r"
        --output "$out/$side" --client-cores "${CLIENT_CPU:-1}" --bootstrap "127.0.0.1:$port"
        --broker-cmd "$broker")
      # shellcheck disable=SC2206
      cmd+=(${BENCH_FLAGS:-})
      printf '%q ' "${cmd[@]}" >> "$out/commands.txt"; echo >> "$out/commands.txt"
      "${cmd[@]}" | grep -v '^\[' | tee -a "$out/console.log"
      if [ -n "$scraper" ]; then kill "$scraper" 2>/dev/null || true; wait "$scraper" 2>/dev/null || true; scraper=; fi
    done
  done
done
python3 - "$out" > "$out/summary.md" <<'PY'
import json, glob, statistics, sys, collections
out = sys.argv[1]
rows = collections.defaultdict(lambda: collections.defaultdict(list))
for side in ("off", "on"):
    for f in sorted(glob.glob(f"{out}/{side}/*.json")):
        r = json.load(open(f))
        w = r.get("workload") or f
        w = w.rsplit("-", 1)[0] if w[-1].isdigit() else w
        rows[w][side].append(r)
def mmm(xs, d):
    return " / ".join(f"{x:.{d}f}" for x in (min(xs), statistics.median(xs), max(xs)))
print("| workload | recording | runs | broker CPU s/GB | MB/s | publish p99 ms | end-to-end p99 ms |")
print("|---|---|---|---|---|---|---|")
for w, sides in sorted(rows.items()):
    for side in ("off", "on"):
        rs = sides[side]
        if not rs:
            continue
        cpu = [r.get("broker", {}).get("cpuSecondsPerGB") or 0 for r in rs]
        mb = [r["totals"]["publishMBps"] for r in rs]
        p99 = [r["aggregatedPublishLatency99pct"] for r in rs]
        e2e = [r.get("aggregatedEndToEndLatency99pct") or 0 for r in rs]
        print(f"| {w} | {side} | {len(rs)} | {mmm(cpu, 3)} | {mmm(mb, 1)} | {mmm(p99, 3)} | {mmm(e2e, 3)} |")
print("\n(min / median / max of the runs)")
PY
cat "$out/summary.md"
