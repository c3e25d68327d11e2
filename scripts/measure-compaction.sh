#!/usr/bin/env bash
# The log cleaner's cost to the request latency tail, and its throughput
# (issue 26). ROUNDS times each, alternating: the latency workload
# (workloads/latency-100b-10k.toml: 100 B, 10 000 msg/s, acks=all) runs
# against a one-shard fjord pinned to core 0 while a second `fjord bench`
# writes 1 KB records with random keys to a compacted topic on the same
# shard (BG_RATE msg/s, 1 MiB segments, min.cleanable.dirty.ratio 0.01, so
# the cleaner — a thread of the broker, on core 0 too — cleans all the
# time), with the cleaner on (--log-cleaner-enable true) and off. The
# bench clients run on core 1. Per run: publish p50/p99/p99.9 of the
# latency workload (its JSON result), the broker's CPU seconds, and, with
# the cleaner on, the cleanings' bytes read and seconds from the broker's
# "log cleaned" lines (throughput = bytes read / seconds of cleaning).
#
# Usage: scripts/measure-compaction.sh [BIN]   (default target/release/fjord)
# Env: ROUNDS (3), SECS (30), WARMUP (10), BG_RATE (5000).
# Output: one line per run on stdout; JSON results and broker logs under
# $OUT (default tuning/results/compaction/<date>).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/fjord}
rounds=${ROUNDS:-3} secs=${SECS:-30} warmup=${WARMUP:-10} bg_rate=${BG_RATE:-5000}
out=${OUT:-tuning/results/compaction/$(date -u +%F)}
mkdir -p "$out"
port=29292
tick=$(getconf CLK_TCK)
cpu() { awk -v t="$tick" '{printf "%.3f", ($14 + $15) / t}' "/proc/$1/stat"; }
echo "# $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) $(nproc) cores; $bin;" \
    "secs=$secs warmup=$warmup bg_rate=$bg_rate rounds=$rounds"
echo "run cleaner p50_ms p99_ms p999_ms broker_cpu_s cleanings clean_read_mb clean_s clean_mb_per_s"
for round in $(seq 1 "$rounds"); do
    for cleaner in true false; do
        run="r$round-cleaner-$cleaner"
        dir=$(mktemp -d)
        taskset -c 0 "$bin" serve --data-dir "$dir" --port $port --listen 127.0.0.1 --no-pin \
            --cores 1 --metrics-listen none --log-cleaner-enable "$cleaner" \
            --log-cleaner-backoff-ms 200 > "$dir/out.log" 2> "$dir/err.log" &
        pid=$!
        until grep -q '^fjord: ready' "$dir/out.log" 2>/dev/null; do sleep 0.05; done
        scripts/kafka-cli kafka-topics --bootstrap-server 127.0.0.1:$port --create \
            --topic compacted --partitions 1 --config cleanup.policy=compact \
            --config segment.bytes=1048576 --config min.cleanable.dirty.ratio=0.01 > /dev/null
        taskset -c 1 "$bin" bench --bootstrap 127.0.0.1:$port --topic compacted --partitions 1 \
            --message-size 1000 --rate "$bg_rate" --keys random --acks 1 --linger-ms 5 \
            --producers 1 --consumers 0 --warmup 0s \
            --duration "$((secs + warmup + 15))s" > "$dir/background.log" 2>&1 &
        bg=$!
        sleep 5 # the compacted topic has sealed segments before the measured run
        c0=$(cpu $pid)
        taskset -c 1 "$bin" bench -w workloads/latency-100b-10k.toml --bootstrap 127.0.0.1:$port \
            --duration "${secs}s" --warmup "${warmup}s" --client-cores 1 --label "cleaner-$cleaner" \
            --name "$run" --output "$out" > "$dir/bench.log" 2>&1
        c1=$(cpu $pid)
        kill $bg 2>/dev/null || true
        wait $bg 2>/dev/null || true
        kill -TERM $pid
        wait $pid 2>/dev/null || true
        json=$(ls -t "$out"/*.json | head -1)
        lat=$(python3 - "$json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
print("%.3f %.3f %.3f" % (r["aggregatedPublishLatency50pct"], r["aggregatedPublishLatency99pct"],
                          r["aggregatedPublishLatency999pct"]))
EOF
)
        cleaned=$(sed 's/\x1b\[[0-9;]*m//g' "$dir/err.log" | awk '/log cleaned/ {
            for (i = 1; i <= NF; i++) {
                split($i, kv, "=")
                if (kv[1] == "bytes_read") r += kv[2]
                if (kv[1] == "seconds") s += kv[2]
            }
            n++
        } END { printf "%d %.1f %.2f %.1f", n, r / 1e6, s, (s > 0 ? r / 1e6 / s : 0) }')
        echo "$run $cleaner $lat $(echo "$c1 - $c0" | bc) $cleaned"
        cp "$dir/err.log" "$out/$run-broker.log"
        rm -rf "$dir"
    done
done
