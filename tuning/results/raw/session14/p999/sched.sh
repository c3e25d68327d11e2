#!/usr/bin/env bash
# usage: sched.sh OUTDIR LABEL -- latency-100b-10k against fjord on CPU 0, perf sched on both CPUs for 8 s mid-run
set -uo pipefail
out=$1; label=$2; mkdir -p $out
bin=/tmp/s14/fjord-1748fd6
W=$(mktemp -d /work/tmp-sched.XXXX)
taskset -c 1 $bin bench -w /work/main/workloads/latency-100b-10k.toml --duration 20s --warmup 5s --client-cores 1 \
  --bootstrap 127.0.0.1:19692 --label $label --output $out \
  --broker-cmd "taskset -c 0 $bin serve --data-dir $W/data --port 19692 --listen 127.0.0.1 --cores 1 --no-pin ${FLAGS:-}" > $out/$label.txt 2>&1 &
b=$!
sleep 10
perf sched record -a -o $W/sched.data -- sleep 8 > /dev/null 2>&1
wait $b
perf sched timehist -i $W/sched.data -C 0 2>/dev/null > $W/th0.txt
perf sched timehist -i $W/sched.data -C 1 2>/dev/null > $W/th1.txt
# runs over 0.5 ms of anything on each CPU: time cpu task wait sch-delay run(ms)
for c in 0 1; do
  awk 'NR>3 && $NF+0 > 0.5 {print}' $W/th$c.txt > $out/$label-cpu$c-runs-over-0.5ms.txt
done
grep -E "^publish latency|^publish delay|^end-to-end" $out/$label.txt
rm -rf $W
