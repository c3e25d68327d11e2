#!/usr/bin/env bash
# Run workloads against fjord and its peers (stock Apache Kafka, Tansu) in
# one session, alternating brokers, and summarise the results.
#
# usage: scripts/compare.sh OUTDIR WORKLOAD.toml... [-- extra fjord bench flags]
#
# For each repeat and each workload the brokers run one after another,
# fjord first, then each peer of PEERS (fjord, kafka, fjord, kafka, ...), so
# drift of a shared machine hits all of them. Every run starts a fresh
# broker with an empty data directory through `fjord bench --broker-cmd`,
# so its CPU seconds and peak RSS are per run. Placement on a 2-core
# machine: each broker is confined to BROKER_CPU (taskset; fjord runs one
# shard, --cores 1 --no-pin, placed by taskset), the bench's threads and
# librdkafka's to CLIENT_CPU (--client-cores).
#
# Kafka runs in the foreground through `scripts/kafka-peer.sh run` (one
# KRaft broker+controller node, formatted fresh per run, JVM options as
# kafka-server-start.sh's). Resolve its jars once first:
# `scripts/kafka-peer.sh resolve` (Maven).
#
# Environment:
#   PEERS          brokers besides fjord: any of kafka, tansu (default: kafka)
#   REPEAT         rounds over all workloads and brokers (default 3)
#   FJORD_FLAGS    extra `fjord serve` flags, e.g. --fsync-acks
#   KAFKA_FLUSH    default | every-message (log.flush.interval.messages=1,
#                  to pair with FJORD_FLAGS=--fsync-acks) (default: default)
#   KAFKA_HEAP     Kafka's -Xms/-Xmx (default 1g, as kafka-server-start.sh)
#   KAFKA_CONF     extra Kafka server properties, space-separated KEY=VALUE
#   TANSU          path of the tansu 0.6 binary (default: tansu on PATH)
#   FJORD_PORT (19092), KAFKA_PORT (39092; its controller on +1),
#   TANSU_PORT (29092), BROKER_CPU (0), CLIENT_CPU (1)
#   BROKER_START_TIMEOUT  how long a broker may take to listen (default
#                  120s: a JVM's format step and start on a busy 2-core VM)
#   DATA_ROOT      where the per-run data directories go (default: a fresh
#                  directory under target/; not tmpfs: fjord needs O_DIRECT)
#
# OUTDIR gets: the bench JSON results and broker logs, console.log,
# commands.txt (every bench and broker command line, exactly as run, and
# Kafka's JVM command line), kafka-server-<workload>-round<N>.properties,
# versions.txt (fjord commit, Kafka and Tansu versions, host), summary.md
# (min / median / max per workload and broker) and report-<workload>/
# (`fjord report`, fjord as the baseline).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
usage="usage: scripts/compare.sh OUTDIR WORKLOAD.toml... [-- bench flags]"
out=${1:?$usage}
shift
workloads=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do workloads+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
[ ${#workloads[@]} -gt 0 ] || { echo "$usage" >&2; exit 2; }
for w in "${workloads[@]}"; do
  [ -f "$w" ] || { echo "compare: no workload file $w" >&2; exit 2; }
done
target=${CARGO_TARGET_DIR:-target}
fjord=$(realpath "$target/release/fjord")
[ -x "$fjord" ] || { echo "compare: build fjord first: cargo build --release" >&2; exit 1; }
peers=${PEERS-kafka}
repeat=${REPEAT:-3}
fport=${FJORD_PORT:-19092}
kport=${KAFKA_PORT:-39092}
tport=${TANSU_PORT:-29092}
bcpu=${BROKER_CPU:-0}
ccpu=${CLIENT_CPU:-1}
kflush=${KAFKA_FLUSH:-default}
kheap=${KAFKA_HEAP:-1g}
start_timeout=${BROKER_START_TIMEOUT:-120s}
tansu=${TANSU:-tansu}
for p in $peers; do
  case $p in
    kafka | tansu) ;;
    *) echo "compare: unknown peer '$p' in PEERS (kafka, tansu)" >&2; exit 2 ;;
  esac
done
case $kflush in default | every-message) ;; *) echo "compare: KAFKA_FLUSH is default or every-message" >&2; exit 2 ;; esac

mkdir -p "$out"
out=$(realpath "$out")
data_root=${DATA_ROOT:-$target/compare-data}
mkdir -p "$data_root"
data=$(mktemp -d "$(realpath "$data_root")/run.XXXXXX")
trap 'rm -rf "$data"' EXIT

# The broker command of each label; fjord bench runs it under `sh -c exec`.
broker_cmd() {
  case $1 in
    fjord)
      echo "taskset -c $bcpu $fjord serve --data-dir $data/fjord --port $fport --listen 127.0.0.1 --cores 1 --no-pin ${FJORD_FLAGS:-}"
      ;;
    kafka)
      local conf='' kv
      for kv in ${KAFKA_CONF:-}; do conf+=" --conf $kv"; done
      echo "$root/scripts/kafka-peer.sh run --fresh --data-dir $data/kafka --port $kport --cpus $bcpu --flush $kflush --heap $kheap$conf"
      ;;
    tansu)
      echo "taskset -c $bcpu $tansu broker --listener-url tcp://127.0.0.1:$tport --advertised-listener-url tcp://127.0.0.1:$tport --storage-engine memory://tansu/"
      ;;
  esac
}
port_of() {
  case $1 in fjord) echo "$fport" ;; kafka) echo "$kport" ;; tansu) echo "$tport" ;; esac
}

{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(uname -n), $(uname -sr), $(nproc) CPUs, $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -n1)"
  echo "fjord: $($fjord --version 2>/dev/null || echo '?'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  for p in $peers; do
    case $p in
      kafka) echo "kafka: Apache Kafka $(scripts/kafka-peer.sh version), $(${JAVA:-java} -version 2>&1 | head -n1)" ;;
      tansu) echo "tansu: $($tansu --version 2>/dev/null || echo "? ($tansu)")" ;;
    esac
  done
  echo "settings: PEERS='$peers' REPEAT=$repeat FJORD_FLAGS='${FJORD_FLAGS:-}' KAFKA_FLUSH=$kflush KAFKA_HEAP=$kheap KAFKA_CONF='${KAFKA_CONF:-}' BROKER_CPU=$bcpu CLIENT_CPU=$ccpu"
  echo "workloads: ${workloads[*]}"
  echo "extra bench flags: $*"
} | tee "$out/versions.txt"
: >"$out/commands.txt"

labels=(fjord)
for p in $peers; do labels+=("$p"); done
for r in $(seq "$repeat"); do
  for w in "${workloads[@]}"; do
    for label in "${labels[@]}"; do
      rm -rf "${data:?}/$label"
      cmd=$(broker_cmd "$label")
      bench=("$fjord" bench --workload "$w" --name "$(basename "$w" .toml)" --label "$label"
        --output "$out" --client-cores "$ccpu"
        --bootstrap "127.0.0.1:$(port_of "$label")" --broker-cmd "$cmd"
        --broker-start-timeout "$start_timeout" "$@")
      {
        echo "# round $r, $w, $label"
        printf '%q ' "${bench[@]}"
        echo
      } >>"$out/commands.txt"
      echo "== round $r/$repeat: $w on $label" | tee -a "$out/console.log"
      "${bench[@]}" 2>&1 | tee -a "$out/console.log" ||
        echo "run failed: $label $w (round $r)" | tee -a "$out/console.log"
      if [ "$label" = kafka ]; then
        # The JVM's command line (kafka-peer.sh prints it) and the broker's
        # properties, as this run used them.
        name=$(basename "$w" .toml)
        grep '^kafka-peer: command: ' "$out/broker-$name-kafka.log" | tail -n1 |
          sed 's/^kafka-peer: command: /#   the JVM: /' >>"$out/commands.txt" || true
        cp "$data/kafka/server.properties" "$out/kafka-server-$name-round$r.properties" 2>/dev/null || true
      fi
    done
  done
done

python3 scripts/lib/bench-summary.py "$out" "${labels[@]}" >"$out/summary.md" ||
  echo "compare: no summary (no results?)" | tee -a "$out/console.log"
for w in "${workloads[@]}"; do
  name=$(basename "$w" .toml)
  results=()
  for label in "${labels[@]}"; do
    for f in "$out/$name-$label-"*.json; do [ -f "$f" ] && results+=("$f"); done
  done
  [ ${#results[@]} -gt 0 ] || continue
  "$fjord" report "${results[@]}" --output "$out/report-$name" >>"$out/console.log" 2>&1 ||
    echo "compare: fjord report failed for $name" | tee -a "$out/console.log"
done
echo "compare: results in $out (summary.md, versions.txt, commands.txt, report-*/)"
