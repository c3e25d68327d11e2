#!/usr/bin/env bash
# usage: lat.sh OUTDIR LABEL [serve flags] -- one latency-100b-10k run against fjord-1748fd6
set -uo pipefail
out=$1; label=$2; shift 2; mkdir -p $out
bin=${BIN:-/tmp/s14/fjord-1748fd6}
W=$(mktemp -d /work/tmp-lat.XXXX)
taskset -c 1 $bin bench -w /work/main/workloads/latency-100b-10k.toml --duration 20s --warmup 5s --client-cores 1 \
  --bootstrap 127.0.0.1:19692 --label $label --output $out \
  --broker-cmd "taskset -c 0 $bin serve --data-dir $W/data --port 19692 --listen 127.0.0.1 --cores 1 --no-pin $*" > $out/$label.txt 2>&1
echo "$label: $(grep -E '^publish latency' $out/$label.txt)"
rm -rf $W
