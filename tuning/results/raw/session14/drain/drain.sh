#!/usr/bin/env bash
# usage: drain.sh BIN OUTDIR LABEL [extra bench flags]: backlog-drain-1kb, 1 s status lines
set -uo pipefail
bin=$1; out=$2; label=$3; shift 3; mkdir -p $out
W=$(mktemp -d /work/tmp-drain.XXXX)
$bin bench --workload /work/main/workloads/backlog-drain-1kb.toml --status-interval-secs 1 --bootstrap 127.0.0.1:19092 --label $label --client-cores 1 --output $out \
  --broker-cmd "taskset -c 0 $bin serve --data-dir $W/data --port 19092 --listen 127.0.0.1 --cores 1 --no-pin ${FJORD_FLAGS:-}" "$@" > $out/$label.txt 2>&1
rm -rf $W
