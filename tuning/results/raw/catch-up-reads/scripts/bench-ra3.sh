#!/usr/bin/env bash
# fetch timing and long backlog drains, new3 (b8ce9d3) vs ra3 (read-ahead)
cd /tmp/s12
out=/tmp/s12/fetchtime-ra3.txt; : > $out
for v in new3 ra3; do
  for round in 1 2; do
    bash mkbacklog.sh /tmp/s12/fjord-$v /work/tmp-rep 19093
    echo "$v round $round: $(taskset -c 1 python3 fetchtime.py 19093 rep 0 300)" >> $out
    pkill -f "fjord-$v serve"; sleep 1; rm -rf /work/tmp-rep /work/tmp-rep.log
  done
done
rm -rf /tmp/s12/drain6
for i in 1 2 3; do
  for v in new3 ra3; do
    FJORD_FLAGS="" STATUS_SECS=1 bash /tmp/s11/drain.sh /tmp/s12/fjord-$v /tmp/s12/drain6 $v-$i --consumer-delay 60s --duration 75s
  done
done
echo ALLDONE
