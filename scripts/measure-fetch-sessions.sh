#!/usr/bin/env bash
# Broker CPU with and without incremental fetch sessions (KIP-227): Kafka's
# Java consumer (kafka-consumer-perf-test) reads a topic of PARTITIONS
# partitions while kafka-producer-perf-test writes RATE messages/s of 100 B
# spread over them, for SECS seconds. fjord (one shard, so every fetch
# names every partition) runs with the default 1000 session slots, then
# with 0 (`--max-incremental-fetch-session-cache-slots 0`: every fetch a
# full one), alternating, ROUNDS times each. Per run: the broker's CPU
# seconds (utime+stime from /proc) over the producer's run, the Fetch
# requests it answered (metrics endpoint), CPU µs per fetch and CPU µs per
# message produced (RATE x SECS messages; every run's consumer reads them all,
# the last column says how many it read).
#
# Usage: scripts/measure-fetch-sessions.sh [BIN]   (default target/release/fjord)
# Env: ROUNDS (3), PARTITIONS (500), RATE (5000), SECS (30).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/fjord}
rounds=${ROUNDS:-3} partitions=${PARTITIONS:-500} rate=${RATE:-5000} secs=${SECS:-30}
port=29192 mport=29644
tick=$(getconf CLK_TCK)
cpu() { awk -v t="$tick" '{printf "%.3f", ($14 + $15) / t}' "/proc/$1/stat"; }
fetches() {
    curl -s "http://127.0.0.1:$mport/metrics" |
        awk '/^fjord_requests_total\{.*api="Fetch"/ {s += $NF} END {printf "%d", s}'
}
echo "# $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) $(nproc) cores; $bin;" \
    "partitions=$partitions rate=$rate msg/s secs=$secs rounds=$rounds"
echo "slots cpu_s fetches cpu_us_per_fetch consumed cpu_us_per_msg"
for round in $(seq 1 "$rounds"); do
    for slots in 1000 0; do
        dir=$(mktemp -d)
        "$bin" serve --data-dir "$dir" --port $port --listen 127.0.0.1 --no-pin --cores 1 \
            --metrics-listen 127.0.0.1:$mport \
            --max-incremental-fetch-session-cache-slots "$slots" > "$dir/out.log" 2>&1 &
        pid=$!
        until grep -q '^fjord: ready' "$dir/out.log" 2>/dev/null; do sleep 0.05; done
        scripts/kafka-cli kafka-topics --bootstrap-server 127.0.0.1:$port --create \
            --topic sessions --partitions "$partitions" > /dev/null
        total=$((rate * secs))
        scripts/kafka-cli kafka-consumer-perf-test --bootstrap-server 127.0.0.1:$port \
            --topic sessions --num-records "$total" --timeout $(( (secs + 60) * 1000 )) \
            --group "sessions-$round-$slots" --hide-header > "$dir/consumer.log" 2>&1 &
        consumer=$!
        sleep 8 # the consumer's JVM starts and joins before the measured window
        c0=$(cpu $pid) f0=$(fetches)
        scripts/kafka-cli kafka-producer-perf-test --topic sessions --num-records "$total" \
            --record-size 100 --throughput "$rate" \
            --producer-props bootstrap.servers=127.0.0.1:$port linger.ms=5 > "$dir/producer.log" 2>&1
        c1=$(cpu $pid) f1=$(fetches)
        wait $consumer || true
        consumed=$(awk -F, 'NF > 5 {print $5}' "$dir/consumer.log" | tail -1 | tr -d ' ')
        awk -v s="$slots" -v c="$(echo "$c1 - $c0" | bc)" -v f="$((f1 - f0))" -v n="$consumed" \
            -v m="$total" \
            'BEGIN {printf "%s %.3f %d %.1f %s %.2f\n", s, c, f, (f > 0 ? c * 1e6 / f : 0), n, c * 1e6 / m}'
        kill -TERM $pid; wait $pid 2>/dev/null || true
        rm -rf "$dir"
    done
done
