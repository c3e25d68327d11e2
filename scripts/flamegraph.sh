#!/usr/bin/env bash
# Profile `fjord serve` while `fjord bench` runs a workload, and write
# flamegraphs/<workload>-<commit>.svg.
#
# usage: scripts/flamegraph.sh WORKLOAD.toml [extra fjord bench flags...]
#   e.g. scripts/flamegraph.sh workloads/latency-100b-10k.toml --duration 15s
#
# Needs: perf (software event cpu-clock only: works in VMs/containers without
# hardware counters) and inferno (`cargo install inferno`). Uses the release
# binary (built with debug line info by the release profile) and DWARF call
# graphs, because release Rust code has no frame pointers.
#
# Environment: PORT (default 19092), PERF_FREQ_HZ (default 499),
# PROFILE_SECS (default 10), BROKER_FLAGS (default "--cores 1 --no-pin"),
# CLIENT_CORES (default: unset = no pinning).
set -euo pipefail
cd "$(dirname "$0")/.."
workload=${1:?usage: scripts/flamegraph.sh WORKLOAD.toml [bench flags...]}
shift
name=$(basename "$workload" .toml)
commit=$(git rev-parse --short HEAD)
port=${PORT:-19092}
freq=${PERF_FREQ_HZ:-499}
secs=${PROFILE_SECS:-10}
broker_flags=${BROKER_FLAGS:-"--cores 1 --no-pin"}
target=${CARGO_TARGET_DIR:-target}
fjord="$target/release/fjord"
[ -x "$fjord" ] || { echo "build first: cargo build --release" >&2; exit 1; }
command -v perf >/dev/null || { echo "perf is not installed" >&2; exit 1; }
command -v inferno-flamegraph >/dev/null || { echo "cargo install inferno" >&2; exit 1; }

work=$(mktemp -d)
cleanup() { [ -n "${broker:-}" ] && kill "$broker" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

# shellcheck disable=SC2086
"$fjord" serve --data-dir "$work/data" --port "$port" --listen 127.0.0.1 $broker_flags >"$work/broker.log" 2>&1 &
broker=$!
for _ in $(seq 100); do grep -q "fjord: ready" "$work/broker.log" && break; sleep 0.1; done
grep -q "fjord: ready" "$work/broker.log" || { cat "$work/broker.log" >&2; exit 1; }

cores=()
[ -n "${CLIENT_CORES:-}" ] && cores=(--client-cores "$CLIENT_CORES")
"$fjord" bench --workload "$workload" --bootstrap "127.0.0.1:$port" --label fjord \
    --broker-pid "$broker" "${cores[@]}" "$@" &
bench=$!
# Profile the middle of the run: after the bench's warm-up.
sleep "${PROFILE_DELAY_SECS:-3}"
perf record -e cpu-clock -F "$freq" --call-graph dwarf,16384 -p "$broker" -o "$work/perf.data" -- sleep "$secs" 2>"$work/perf.log"
wait "$bench"
mkdir -p flamegraphs
out="flamegraphs/$name-$commit.svg"
perf script -i "$work/perf.data" 2>/dev/null | inferno-collapse-perf | \
    inferno-flamegraph --title "fjord serve: $name @ $commit (perf -e cpu-clock -F $freq, $secs s)" >"$out"
echo "wrote $out"
