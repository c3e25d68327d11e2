#!/usr/bin/env bash
# usage: count.sh BIN  -- counts pwrite syscalls and block requests during saturate
bin=$1; work=$(mktemp -d /work/tmp-cnt.XXXX)
taskset -c 0 $bin serve --data-dir $work/data --port 19092 --listen 127.0.0.1 --cores 1 --no-pin > $work/broker.log 2>&1 &
broker=$!
for _ in $(seq 100); do grep -q "fjord: ready" $work/broker.log && break; sleep 0.1; done
$bin bench --workload workloads/saturate-1kb.toml --bootstrap 127.0.0.1:19092 --label fjord --broker-pid $broker --client-cores 1 --duration 12s --warmup 3s --output $work/bench > $work/bench.txt 2>&1 &
bench=$!
sleep 5
perf stat -e syscalls:sys_enter_pwrite64,syscalls:sys_enter_pwritev,block:block_rq_issue,syscalls:sys_enter_io_uring_enter,syscalls:sys_enter_futex -a -- sleep 5 2>&1 | grep -E "syscalls|block|elapsed"
wait $bench
grep "records sent" $work/bench.txt; grep "broker:" $work/bench.txt
kill $broker; wait $broker 2>/dev/null
rm -rf $work
