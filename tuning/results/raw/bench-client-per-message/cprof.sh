#!/usr/bin/env bash
# usage: cprof.sh BIN OUTDIR  -- profile the bench client during saturate-1kb
set -euo pipefail
bin=$1; out=$2; mkdir -p $out; work=$(mktemp -d /work/tmp-cprof.XXXX)
taskset -c 0 $bin serve --data-dir $work/data --port 19092 --listen 127.0.0.1 --cores 1 --no-pin > $work/broker.log 2>&1 &
broker=$!
for _ in $(seq 100); do grep -q "fjord: ready" $work/broker.log && break; sleep 0.1; done
$bin bench --workload /work/main/workloads/saturate-1kb.toml --bootstrap 127.0.0.1:19092 --label fjord --broker-pid $broker --client-cores 1 --duration 15s --warmup 3s --output $out/bench > $out/bench.txt 2>&1 &
bench=$!
sleep 5
perf record -e cpu-clock -F 999 --call-graph dwarf,16384 -p $bench -o $work/perf.data -- sleep 6 2>$out/perf.log
wait $bench
perf script -i $work/perf.data 2>/dev/null | inferno-collapse-perf > $out/folded.txt
kill $broker; wait $broker 2>/dev/null || true
rm -rf $work
grep "records sent" $out/bench.txt
