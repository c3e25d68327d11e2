#!/usr/bin/env bash
# usage: lat.sh BIN OUTDIR LABEL [extra bench flags]  -- one latency run, fresh broker
set -euo pipefail
bin=$1; out=$2; label=$3; shift 3; mkdir -p $out; work=$(mktemp -d /work/tmp-lat.XXXX)
$bin bench --workload /work/main/workloads/latency-100b-10k.toml --bootstrap 127.0.0.1:19092 --label $label --client-cores 1 --duration 20s --warmup 5s --output $out \
  --broker-cmd "taskset -c 0 $bin serve --data-dir $work/data --port 19092 --listen 127.0.0.1 --cores 1 --no-pin $FJORD_FLAGS" "$@" > $out/$label.txt 2>&1 || true
rm -rf $work
echo "$label $(grep '^publish latency' $out/$label.txt) | $(grep -o 'e2e.*' $out/$label.txt | head -0) $(grep '^end-to-end' $out/$label.txt | grep -o 'p99 [0-9.]*')"
