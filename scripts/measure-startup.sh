#!/usr/bin/env bash
# Start-up time of `fjord serve` (exec to `fjord: ready`, the moment it
# sends systemd READY=1): on an empty data dir, then on one filled with
# SIZE_GB (GiB) of 1 KiB messages (4 partitions, written by `fjord bench`
# in rounds until the data dir holds that much),
# after a clean stop (SIGTERM) and after a kill -9.
#
# Usage: scripts/measure-startup.sh SERVER_BIN TOOLS_BIN DATA_ROOT SIZE_GB
#   SERVER_BIN  the broker measured (e.g. the packaged server build)
#   TOOLS_BIN   a build with the `tools` feature, for `fjord bench`
#   DATA_ROOT   scratch directory (SIZE_GB must fit; it is deleted first)
set -euo pipefail
server=$1 tools=$2 root=$3 size_gb=$4
port=29092
# 1 KiB messages per second offered while filling (what a debug build's
# bench client sustained on the 2-vCPU VM; raise it with a release build).
rate=${RATE:-45000}
# REUSE=1 keeps a data dir filled by an earlier run and only measures.
if [ "${REUSE:-0}" != 1 ]; then rm -rf "$root"; fi
mkdir -p "$root"

# Starts the broker on $1 (data dir), prints ms from exec to `fjord: ready`;
# the broker keeps running (pid in $root/pid).
start() {
    local data=$1 t0 line
    # A log left by the previous start holds its `fjord: ready`: remove it
    # first, or the wait below could end before this broker wrote a byte.
    rm -f "$root/out.fifo.log"
    t0=$(date +%s%N)
    "$server" serve --data-dir "$data" --port $port --listen 127.0.0.1 --no-pin \
        > "$root/out.fifo.log" 2> "$root/err.log" &
    echo $! > "$root/pid"
    until grep -q '^fjord: ready' "$root/out.fifo.log" 2>/dev/null; do sleep 0.005; done
    echo $(( ($(date +%s%N) - t0) / 1000000 ))
}
# The broker was started in a command substitution, so it is not this
# shell's child: poll until it is gone.
gone() {
    local pid; pid=$(cat "$root/pid")
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
}
stop() { kill -TERM "$(cat "$root/pid")"; gone; }
# DROP_CACHES=1 (root): empty the page cache before the measured starts on
# the full data dir, so they read from the disk as after a reboot.
cold() { if [ "${DROP_CACHES:-0}" = 1 ]; then sync; echo 3 > /proc/sys/vm/drop_caches; fi; }
kill9() { kill -KILL "$(cat "$root/pid")"; gone; }

rm -rf "$root/empty"
echo "empty data dir: $(start "$root/empty") ms"; stop
echo "empty data dir, second start (clean stop before): $(start "$root/empty") ms"; stop

start "$root/full" > /dev/null
# Fill in rounds until the data dir holds SIZE_GB: a loaded machine may
# not sustain RATE, and a short fill would measure a smaller log.
want=$(( size_gb * 1024 * 1024 * 1024 ))
while [ "$(du -sb "$root/full" | cut -f1)" -lt "$want" ]; do
    have=$(du -sb "$root/full" | cut -f1)
    secs=$(( (want - have) / 1024 / rate + 1 ))
    "$tools" bench --bootstrap 127.0.0.1:$port --topic fill --partitions 4 \
        --message-size 1024 --rate $rate --duration "${secs}s" --warmup 0s \
        --producers 1 --consumers 0 --acks 1 --linger-ms 5 --batch-size 1048576 \
        --status-interval-secs 10 >> "$root/bench.log" 2>&1 || true
done
stop
echo "data dir: $(du -sh "$root/full" | cut -f1) ($(du -sb "$root/full" | cut -f1) bytes)"
cold
echo "after a clean stop: $(start "$root/full") ms"; stop
echo "after a clean stop, again (page cache warm): $(start "$root/full") ms"
kill9
cold
echo "after kill -9: $(start "$root/full") ms"; stop
sed 's/\x1b\[[0-9;]*m//g' "$root/err.log" | grep 'logs recovered' | sed 's/^.*INFO //; s/^/last start: /'
