#!/bin/bash
# Round 3: log_append with the order reversed (new first in each pair).
set -u
out=/tmp/benchrun/out3; mkdir -p $out
for round in 1 2; do
  for side in new old; do
    d=/tmp/benchrun/la3-$side; rm -rf $d; mkdir -p $d/data; cd $d
    echo "== log_append $side round $round $(date -u +%T)" >> $out/runs.log
    FJORD_BENCH_DIR=$d/data /tmp/benchbin/$side/log_append-f3c41ee81c2dc688 --bench fjord > $out/log_append-$side-$round.txt 2>&1
  done
done
echo "== done $(date -u +%T)" >> $out/runs.log
