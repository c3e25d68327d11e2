#!/usr/bin/env bash
# usage: drain.sh BIN OUTDIR LABEL [extra bench flags] -- backlog-drain-1kb with 2 s status lines, /proc/stat sampled every 2 s
set -uo pipefail
bin=$1; out=$2; label=$3; shift 3; mkdir -p $out
W=$(mktemp -d /work/tmp-drain.XXXX)
( while true; do echo "$(date +%s.%N) $(head -1 /proc/stat)"; sleep 2; done ) > $out/$label-cpu-stat.txt &
sp=$!
$bin bench --workload /work/main/workloads/backlog-drain-1kb.toml --status-interval-secs ${STATUS_SECS:-2} --bootstrap 127.0.0.1:19092 --label $label --client-cores 1 --output $out \
  --broker-cmd "taskset -c 0 $bin serve --data-dir $W/data --port 19092 --listen 127.0.0.1 --cores 1 --no-pin $FJORD_FLAGS" "$@" > $out/$label.txt 2>&1
kill $sp; rm -rf $W
