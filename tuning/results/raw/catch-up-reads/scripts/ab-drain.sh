#!/usr/bin/env bash
# alternating base/new backlog-drain runs; usage: ab-drain.sh OUT N
out=$1; n=$2
for i in $(seq 1 $n); do
  for v in ${VARIANTS:-base new}; do
    FJORD_FLAGS="" STATUS_SECS=1 bash /tmp/s11/drain.sh /tmp/s12/fjord-$v $out $v-$i
  done
done
echo DONE
