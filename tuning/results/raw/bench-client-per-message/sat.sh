#!/usr/bin/env bash
# usage: sat.sh BIN OUTDIR LABEL [extra bench flags]  -- one saturate run, fresh broker
set -euo pipefail
bin=$1; out=$2; label=$3; shift 3; mkdir -p $out; work=$(mktemp -d /work/tmp-sat.XXXX)
$bin bench --workload /work/main/workloads/saturate-1kb.toml --bootstrap 127.0.0.1:19092 --label $label --client-cores 1 --duration 15s --warmup 3s --output $out \
  --broker-cmd "taskset -c 0 $bin serve --data-dir $work/data --port 19092 --listen 127.0.0.1 --cores 1 --no-pin" "$@" > $out/$label.txt 2>&1 || true
rm -rf $work
echo "$label $(grep -o 'records/sec ([0-9.]* MB/sec)' $out/$label.txt) $(grep -o 'broker: .*' $out/$label.txt)"
