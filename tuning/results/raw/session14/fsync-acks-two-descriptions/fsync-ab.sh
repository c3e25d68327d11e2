#!/usr/bin/env bash
# usage: fsync-ab.sh OUTDIR PAIRS -- latency-100b-10k with --fsync-acks, old (fjord-base) vs new (fjord-sync2), alternating; fio fdatasync before each pair
set -uo pipefail
out=$1; pairs=$2; mkdir -p $out
fio_p() {
  d=$(mktemp -d /work/tmp-fio.XXXX)
  fio --name=fdatasync --directory="$d" --rw=write --bs=4k --size=64m --direct=1 --ioengine=psync \
    --fdatasync=1 --runtime=10 --time_based --output-format=json 2>/dev/null | python3 -c '
import json, sys
t = sys.stdin.read(); j = json.loads(t[t.find("{"):])["jobs"][0]["sync"]["lat_ns"]["percentile"]
print("fio fdatasync p50 %.3f p99 %.3f p99.9 %.3f ms" % tuple(j[k] / 1e6 for k in ("50.000000", "99.000000", "99.900000")))'
  rm -rf $d
}
run() {
  bin=$1; label=$2
  W=$(mktemp -d /work/tmp-lat.XXXX)
  taskset -c 1 $bin bench -w /work/main/workloads/latency-100b-10k.toml --duration 20s --warmup 5s --client-cores 1 \
    --bootstrap 127.0.0.1:19692 --label $label --output $out \
    --broker-cmd "taskset -c 0 $bin serve --data-dir $W/data --port 19692 --listen 127.0.0.1 --cores 1 --no-pin --fsync-acks ${FLAGS:-}" > $out/$label.txt 2>&1
  echo "$label: $(grep -E '^publish latency' $out/$label.txt)"
  rm -rf $W
}
for i in $(seq $pairs); do
  echo "pair $i: $(fio_p)"
  if [ $((i % 2)) = 1 ]; then run /tmp/s14/fjord-base old$i; run /tmp/s14/fjord-sync2 new$i
  else run /tmp/s14/fjord-sync2 new$i; run /tmp/s14/fjord-base old$i; fi
done
echo ALLDONE
