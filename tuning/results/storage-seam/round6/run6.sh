#!/bin/bash
# Round 6: log_append, three sides, four runs each, in a rotating order so
# that every side runs first, second and third of a triple:
#   old     3a42e0c (main before the seam)
#   new2    main d3cfe72's sources (the seam, with its thread-local check)
#   head    main 77a47f2: the seams compiled only into the unit-test build,
#           so production's storage functions are the calls they stand for
#   (noseam: d3cfe72's sources with the three functions reduced by hand to
#   those calls, when head's build is not ready: THIRD=noseam)
set -u
t=${THIRD:-head}
out=/tmp/benchrun/out6; mkdir -p $out
la() {
  local side=$1 n=$2 d=/tmp/benchrun/la6-$1
  rm -rf $d; mkdir -p $d/data; cd $d
  echo "== log_append $side $n $(date -u +%T)" >> $out/runs.log
  FJORD_BENCH_DIR=$d/data /tmp/benchbin/$side/log_append-f3c41ee81c2dc688 --bench fjord > $out/log_append-$side-$n.txt 2>&1
}
la old 1; la new2 1; la $t 1
la new2 2; la $t 2;    la old 2
la $t 3;   la old 3;   la new2 3
la old 4;  la $t 4;    la new2 4
echo "== done $(date -u +%T)" >> $out/runs.log
