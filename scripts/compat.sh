#!/usr/bin/env bash
# Drives a fjord broker with two independent Kafka clients, kafka-python (PyPI)
# and kafkajs (npm), so that compatibility is checked beyond librdkafka (which
# the test suite uses). Prints each probe's findings; a probe that fails exits
# non-zero. A manual check, not part of `cargo test`: it installs packages.
#
# usage: scripts/compat.sh [HOST:PORT]
#   With no address it starts `fjord serve --cores 2` on port 19092 in a
#   temporary data directory (build first: cargo build --release).
# Environment: KAFKA_PYTHON (pip spec, default kafka-python==3.0.12),
# KAFKAJS (npm spec, default kafkajs@2).
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
broker=
cleanup() { [ -n "$broker" ] && kill "$broker" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
addr=${1:-}
if [ -z "$addr" ]; then
  fjord=${CARGO_TARGET_DIR:-target}/release/fjord
  [ -x "$fjord" ] || { echo "build first: cargo build --release" >&2; exit 1; }
  "$fjord" serve --data-dir "$work/data" --port 19092 --listen 127.0.0.1 --cores 2 --no-pin >"$work/broker.log" 2>&1 &
  broker=$!
  for _ in $(seq 100); do grep -q "fjord: ready" "$work/broker.log" && break; sleep 0.1; done
  addr=127.0.0.1:19092
fi
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q "${KAFKA_PYTHON:-kafka-python==3.0.12}" lz4 zstandard python-snappy cramjam
echo "== kafka-python"
"$work/venv/bin/python" scripts/compat/kafka_python_probe.py "$addr"
(cd "$work" && npm init -y >/dev/null && npm install -s "${KAFKAJS:-kafkajs@2}" >/dev/null)
echo "== kafkajs"
KAFKAJS_NO_PARTITIONER_WARNING=1 NODE_PATH="$work/node_modules" node scripts/compat/kafkajs_probe.js "$addr"
