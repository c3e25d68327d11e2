#!/bin/bash
# Alternating old/new runs of benches/log_append and benches/produce_pipeline.
set -u
out=/tmp/benchrun/out; mkdir -p $out
for round in 1 2 3; do
  for side in old new; do
    d=/tmp/benchrun/la-$side; mkdir -p $d/data; cd $d
    echo "== log_append $side round $round $(date -u +%T)" >> $out/runs.log
    FJORD_BENCH_DIR=$d/data /tmp/benchbin/$side/log_append-f3c41ee81c2dc688 --bench fjord > $out/log_append-$side-$round.txt 2>&1
  done
done
for round in 1 2 3; do
  for side in old new; do
    d=/tmp/benchrun/pp-$side; mkdir -p $d/data; cd $d
    echo "== produce_pipeline $side round $round $(date -u +%T)" >> $out/runs.log
    FJORD_BENCH_DIR=$d/data FJORD_BENCH_ROUNDS=4 FJORD_BENCH_BROKER=/tmp/benchbin/$side/fjord /tmp/benchbin/new/produce_pipeline-3f692f04e506cfeb --bench > $out/produce_pipeline-$side-$round.txt 2>&1
  done
done
echo "== done $(date -u +%T)" >> $out/runs.log
