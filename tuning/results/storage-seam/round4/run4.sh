#!/bin/bash
# Round 4: the write_direct future as direct::write's own (Either), against
# the old side, both orders: log_append old,new,new,old,old,new; then
# produce_pipeline new,old,old,new.
set -u
out=/tmp/benchrun/out4; mkdir -p $out
la() {
  local side=$1 n=$2 d=/tmp/benchrun/la4-$1
  rm -rf $d; mkdir -p $d/data; cd $d
  echo "== log_append $side $n $(date -u +%T)" >> $out/runs.log
  FJORD_BENCH_DIR=$d/data /tmp/benchbin/$side/log_append-f3c41ee81c2dc688 --bench fjord > $out/log_append-$side-$n.txt 2>&1
}
pp() {
  local side=$1 n=$2 d=/tmp/benchrun/pp4-$1
  rm -rf $d; mkdir -p $d/data; cd $d
  echo "== produce_pipeline $side $n $(date -u +%T)" >> $out/runs.log
  FJORD_BENCH_DIR=$d/data FJORD_BENCH_ROUNDS=4 FJORD_BENCH_BROKER=/tmp/benchbin/$side/fjord /tmp/benchbin/new/produce_pipeline-3f692f04e506cfeb --bench > $out/produce_pipeline-$side-$n.txt 2>&1
}
la old 1; la new2 1; la new2 2; la old 2; la old 3; la new2 3
pp new2 1; pp old 1; pp old 2; pp new2 2
echo "== done $(date -u +%T)" >> $out/runs.log
