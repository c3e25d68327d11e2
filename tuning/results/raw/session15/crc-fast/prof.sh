#!/usr/bin/env bash
# Flat profile of the broker during saturate-1kb. usage: prof.sh OUT [BINARY]
set -u
out=$1; fj=${2:-/work/main/target/release/fjord}
mkdir -p $out; d=$(mktemp -d)
taskset -c 0 $fj serve --data-dir $d --port 19092 --listen 127.0.0.1 --cores 1 --no-pin > $out/broker.log 2>&1 &
b=$!
sleep 1
cd /work/main
$fj bench --workload workloads/saturate-1kb.toml --label fjord --output $out --client-cores 1 --duration 20s --warmup 3s --bootstrap 127.0.0.1:19092 --broker-pid $b > $out/bench.log 2>&1 &
bench=$!
sleep 8
perf record -e cpu-clock -F 1999 -g -p $b -o $out/perf.data -- sleep 8 2>/dev/null >/dev/null
wait $bench
kill $b; wait $b 2>/dev/null
rm -rf $d
perf report -i $out/perf.data --no-children --sort sym --stdio 2>/dev/null | grep -E "^ +[0-9]" | head -50 > $out/flat.txt
grep -E "records sent|^broker" $out/bench.log
