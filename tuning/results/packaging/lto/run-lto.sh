#!/bin/bash
# The package LTO choice (tuning/results/packaging.md): produce_pipeline against
# the fat-LTO server build and the thin-LTO release build of the same sources,
# alternating. /tmp/benchbin/lto-{thin,fat}/fjord were copied there first.
set -u
out=/tmp/benchrun/outlto; mkdir -p $out
pp() {
  local side=$1 n=$2 d=/tmp/benchrun/pplto-$1
  rm -rf $d; mkdir -p $d/data; cd $d
  echo "== produce_pipeline $side $n $(date -u +%T)" >> $out/runs.log
  FJORD_BENCH_DIR=$d/data FJORD_BENCH_ROUNDS=4 FJORD_BENCH_BROKER=/tmp/benchbin/lto-$side/fjord /tmp/benchbin/new/produce_pipeline-3f692f04e506cfeb --bench > $out/produce_pipeline-$side-$n.txt 2>&1
}
pp thin 1; pp fat 1; pp fat 2; pp thin 2; pp thin 3; pp fat 3; pp fat 4; pp thin 4
echo "== done $(date -u +%T)" >> $out/runs.log
