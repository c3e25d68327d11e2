#!/usr/bin/env bash
# Broker CPU at a fixed offered rate (300k msg/s of 1 KiB), builds A and B alternating, with steal.
set -u
out=$1; reps=${2:-3}; shift 2
cd /work/main; mkdir -p $out
for r in $(seq $reps); do for side in A B; do
  bin=$BIN_A; [ $side = B ] && bin=$BIN_B
  d=$(mktemp -d)
  s0=$(grep "^cpu " /proc/stat)
  target/release/fjord bench --workload workloads/saturate-1kb.toml --rate 300000 --label $side --output $out/$side --client-cores 1 --duration 15s --warmup 3s \
    --bootstrap 127.0.0.1:19092 --broker-cmd "taskset -c 0 $bin serve --data-dir $d --port 19092 --listen 127.0.0.1 --cores 1 --no-pin" > $out/run.log 2>&1
  s1=$(grep "^cpu " /proc/stat)
  steal=$(python3 -c "a='$s0'.split()[1:];b='$s1'.split()[1:];d=[int(y)-int(x) for x,y in zip(a,b)];print(round(100*d[7]/sum(d),1))")
  echo "$r $side $(grep -E 'records sent' $out/run.log | grep -oE '\([0-9.]+ MB/sec\)') $(grep -E '^broker' $out/run.log | grep -oE '[0-9.]+ CPU s \([0-9.]+ s/GB') steal% $steal" | tee -a $out/summary.txt
  rm -rf $d
done; done
