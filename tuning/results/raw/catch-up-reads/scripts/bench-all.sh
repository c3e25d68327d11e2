#!/usr/bin/env bash
# session-12 catch-up read measurements, in order: drain A/B x3, raw fetch timing per build, loopback send cost
cd /tmp/s12
rm -rf /tmp/s12/drain3; VARIANTS="base new3" bash ab-drain.sh /tmp/s12/drain3 3
: > /tmp/s12/fetchtime.txt
for v in base new new3; do
  for round in 1 2; do
    bash mkbacklog.sh /tmp/s12/fjord-$v /work/tmp-rep 19093
    echo "$v round $round: $(taskset -c 1 python3 fetchtime.py 19093 rep 0 300)" >> /tmp/s12/fetchtime.txt
    pkill -f "fjord-$v serve"; sleep 1; rm -rf /work/tmp-rep /work/tmp-rep.log
  done
done
bash lrc-run.sh > /tmp/s12/lrc.txt 2>&1
echo ALLDONE
