#!/usr/bin/env bash
# latency-100b-10k three times by default and three times with --fsync-acks
# (fio's fdatasync before each of those), broker on CPU 0, client on CPU 1,
# with the host's steal over each run. usage: lat.sh OUT
set -u
out=$1; mkdir -p $out; cd "$(git rev-parse --show-toplevel)"
fj=target/release/fjord
steal() { grep "^cpu " /proc/stat; }
pct() { python3 -c "a='$1'.split()[1:];b='$2'.split()[1:];d=[int(y)-int(x) for x,y in zip(a,b)];print(round(100*d[7]/sum(d),1))"; }
for flags in "" "--fsync-acks"; do for r in 1 2 3; do
  if [ -n "$flags" ]; then
    d=$(mktemp -d -p /work)
    fio --name=fdatasync --directory=$d --rw=write --bs=4k --size=64m --direct=1 --ioengine=psync --fdatasync=1 --runtime=10 --time_based --output-format=json 2>/dev/null | python3 -c '
import json, sys
t = sys.stdin.read(); j = json.loads(t[t.find("{"):])["jobs"][0]["sync"]["lat_ns"]["percentile"]
print("fio fdatasync p50 %.3f p99 %.3f p99.9 %.3f ms" % tuple(j[k] / 1e6 for k in ("50.000000", "99.000000", "99.900000")))' | tee -a $out/summary.txt
    rm -rf $d
  fi
  d=$(mktemp -d -p /work); s0=$(steal)
  $fj bench -w workloads/latency-100b-10k.toml --duration 20s --warmup 5s --client-cores 1 --bootstrap 127.0.0.1:19692 \
    --label "fjord${flags:+-fsync-acks}" --output $out --broker-cmd "taskset -c 0 $fj serve --data-dir $d --port 19692 --listen 127.0.0.1 --cores 1 --no-pin $flags" \
    > $out/run.log 2>&1
  s1=$(steal)
  grep -E "^(publish|end-to-end)" $out/run.log | sed "s/^/${flags:-default} run $r: /" | tee -a $out/summary.txt
  echo "${flags:-default} run $r: steal $(pct "$s0" "$s1") %" | tee -a $out/summary.txt
  rm -rf $d
done; done
