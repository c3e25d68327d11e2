#!/usr/bin/env bash
# usage: prof0.sh OUTDIR LABEL -- latency-100b-10k; perf samples CPU 0 at 5 kHz with call graphs for 6 s mid-run (perf itself on CPU 1)
set -uo pipefail
out=$1; label=$2; mkdir -p $out
bin=/tmp/s14/fjord-1748fd6
W=$(mktemp -d /work/tmp-prof.XXXX)
taskset -c 1 $bin bench -w /work/main/workloads/latency-100b-10k.toml --duration 20s --warmup 5s --client-cores 1 \
  --bootstrap 127.0.0.1:19692 --label $label --output $out \
  --broker-cmd "taskset -c 0 $bin serve --data-dir $W/data --port 19692 --listen 127.0.0.1 --cores 1 --no-pin ${FLAGS:-}" > $out/$label.txt 2>&1 &
b=$!
sleep 10
taskset -c 1 perf record -e cpu-clock -F 5000 -C 0 -g -m 64M -o $out/$label-perf.data -- sleep 6 > /dev/null 2>&1
wait $b
grep -E "^publish latency" $out/$label.txt
rm -rf $W
