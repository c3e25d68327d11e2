#!/usr/bin/env bash
# Placement experiment: saturate-1kb against fjord and Tansu, split (broker CPU0 / client CPU1)
# and shared (both float over CPUs 0-1), alternating. usage: place.sh OUT REPS
set -u
out=$1; reps=${2:-2}
cd /work/main
fj=target/release/fjord; ta=/work/peer/tansu
mkdir -p $out
for r in $(seq $reps); do
 for place in split shared; do
  if [ $place = split ]; then bt="taskset -c 0"; cc="--client-cores 1"; else bt="taskset -c 0-1"; cc=""; fi
  d=$(mktemp -d)
  $fj bench --workload workloads/saturate-1kb.toml --label fjord-$place --output $out/$place $cc --duration 20s --warmup 5s \
    --bootstrap 127.0.0.1:19092 --broker-cmd "$bt $fj serve --data-dir $d/fjord --port 19092 --listen 127.0.0.1 --cores 1 --no-pin" 2>&1 | grep -E "records sent|^broker" | sed "s/^/$r fjord $place: /" | tee -a $out/summary.txt
  rm -rf $d
  $fj bench --workload workloads/saturate-1kb.toml --label tansu-$place --output $out/$place $cc --duration 20s --warmup 5s \
    --bootstrap 127.0.0.1:29092 --broker-cmd "$bt $ta broker --listener-url tcp://127.0.0.1:29092 --advertised-listener-url tcp://127.0.0.1:29092 --storage-engine memory://tansu/" 2>&1 | grep -E "records sent|^broker" | sed "s/^/$r tansu $place: /" | tee -a $out/summary.txt
 done
done
