#!/bin/bash
# Round 5: produce_pipeline, end-of-session main with metrics recording on
# and off, and the old side: off, on, old, old, on, off, off, old, on.
set -u
out=/tmp/benchrun/out5; mkdir -p $out
pp() {
  local label=$1 bin=$2 args=$3 n=$4 d=/tmp/benchrun/pp5
  rm -rf $d; mkdir -p $d/data; cd $d
  echo "== produce_pipeline $label $n $(date -u +%T)" >> $out/runs.log
  FJORD_BENCH_DIR=$d/data FJORD_BENCH_ROUNDS=4 FJORD_BENCH_BROKER=$bin FJORD_BENCH_BROKER_ARGS="$args" /tmp/benchbin/new/produce_pipeline-3f692f04e506cfeb --bench > $out/produce_pipeline-$label-$n.txt 2>&1
}
N=/tmp/benchbin/new2/fjord; O=/tmp/benchbin/old/fjord
pp off $N "--metrics-recording false" 1; pp on $N "" 1; pp old $O "" 1
pp old $O "" 2; pp on $N "" 2; pp off $N "--metrics-recording false" 2
pp off $N "--metrics-recording false" 3; pp old $O "" 3; pp on $N "" 3
echo "== done $(date -u +%T)" >> $out/runs.log
