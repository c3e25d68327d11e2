#!/usr/bin/env bash
# usage: damon-ab.sh OUTDIR PAIRS -- latency-100b-10k with DAMON on vs off (kdamonds/0/state), alternating; restores 'on'
set -uo pipefail
out=$1; pairs=$2; mkdir -p $out
st=/sys/kernel/mm/damon/admin/kdamonds/0/state
bin=/tmp/s14/fjord-1748fd6
run() {
  label=$1
  W=$(mktemp -d /work/tmp-lat.XXXX)
  taskset -c 1 $bin bench -w /work/main/workloads/latency-100b-10k.toml --duration 20s --warmup 5s --client-cores 1 \
    --bootstrap 127.0.0.1:19692 --label $label --output $out \
    --broker-cmd "taskset -c 0 $bin serve --data-dir $W/data --port 19692 --listen 127.0.0.1 --cores 1 --no-pin" > $out/$label.txt 2>&1
  echo "$label: $(grep -E '^publish latency' $out/$label.txt)"
  echo "$label: $(grep -E '^end-to-end' $out/$label.txt)"
  rm -rf $W
}
trap 'echo on > $st' EXIT
for i in $(seq $pairs); do
  if [ $((i % 2)) = 1 ]; then echo on > $st; run on$i; echo off > $st; run off$i
  else echo off > $st; run off$i; echo on > $st; run on$i; fi
done
echo on > $st
echo ALLDONE
