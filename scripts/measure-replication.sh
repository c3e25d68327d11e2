#!/usr/bin/env bash
# Measures what replication costs and how fast a partition fails over, on a
# 3-node fjord cluster (scripts/cluster.sh) and a 3-node stock Kafka cluster
# (scripts/kafka-cluster.sh) in one session, alternating: round 1 fjord,
# round 1 Kafka, round 2 fjord, ... (tuning/results/replication.md).
#
# usage: scripts/measure-replication.sh OUTDIR
#
# Each round starts the cluster fresh, then:
#  1. picks a partition leader: the node after the metadata quorum's leader,
#     so a kill measures a partition's failover, not the quorum's;
#  2. creates two topics of one partition with kafka-topics: rf1
#     (replication factor 1, placed by the cluster) and rf3 (replication
#     factor 3, min.insync.replicas=2, an explicit assignment led by that
#     node);
#  3. runs `fjord bench` (librdkafka, acks=all) on each topic, rf1 and rf3
#     alternating, for two workloads: latency (100 B at LATENCY_RATE msg/s,
#     linger 0, one consumer: publish and end-to-end latency) and saturate
#     (1 KiB, saturating, acks=all: throughput);
#  4. runs the failover probe (Kafka's Java producer, acks=all, one send at a
#     time; interop/java FailoverProbe) on rf3, SIGKILLs the leader's node
#     after its warm-up, and takes the failover time as the end of the
#     longest gap between acknowledgements after the kill minus the kill's
#     time (kill to the first successful produce on the new leader);
#  5. stops the cluster.
# Nothing is pinned: three nodes and the clients share the machine's cores,
# the same for both systems. fjord's nodes run one shard each (--no-pin).
#
# Environment: ROUNDS (3), LATENCY_RATE (5000), SYSTEMS ("fjord kafka"),
# PARTS (which of the steps 3-4 to run: "latency saturate failover", the
# default; "perftest" adds Kafka's kafka-producer-perf-test, the Java
# producer, acks=all, linger 0, 100 B at LATENCY_RATE msg/s for 30 s, on
# rf1 and rf3: perftest-SYSTEM-TOPIC-roundN.txt and perftest.md),
# FJORD_FLAGS (added to every fjord node, e.g. --fsync-acks), KAFKA_HEAP.
#
# OUTDIR gets the bench JSON results, console.log, commands.txt,
# versions.txt, failover.tsv (round, system, quorum leader, killed node,
# failover ms, acknowledged sends), probe-*.out.gz (the probe's
# acknowledgement times: one line per acknowledged send, epoch ms and
# offset), summary.md (bench-summary.py) and failover.md.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${1:?usage: scripts/measure-replication.sh OUTDIR}
mkdir -p "$out"
out=$(realpath "$out")
rounds=${ROUNDS:-3}
rate=${LATENCY_RATE:-5000}
systems=${SYSTEMS:-fjord kafka}
parts=" ${PARTS:-latency saturate failover} "
fjord=$(realpath target/release/fjord)
[ -x "$fjord" ] || { echo "measure-replication: cargo build --release first" >&2; exit 1; }
java_cp="$root/target/interop-java/classes:$root/target/interop-java/lib/*"
[ -d target/interop-java/classes ] || mvn -q -B -f interop/java/pom.xml package
scripts/kafka-peer.sh resolve >/dev/null

log() { echo "$*" | tee -a "$out/console.log"; }

{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(uname -n), $(uname -sr), $(nproc) CPUs, $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -n1)"
  echo "fjord: $($fjord --version), commit $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (with uncommitted changes)')"
  echo "kafka: Apache Kafka $(scripts/kafka-peer.sh version), $(java -version 2>&1 | head -n1)"
  echo "settings: ROUNDS=$rounds LATENCY_RATE=$rate SYSTEMS='$systems' PARTS='${parts# }' FJORD_FLAGS='${FJORD_FLAGS:-}' KAFKA_HEAP=${KAFKA_HEAP:-1g}"
} | tee "$out/versions.txt"
: >"$out/commands.txt"
[[ $parts != *" failover "* || -f "$out/failover.tsv" ]] || echo -e "round\tsystem\tquorum_leader\tkilled_node\tfailover_ms\tacked_sends" >"$out/failover.tsv"

# Node ids and broker ids: fjord's nodes 0-2, one shard each (broker id =
# node * 1000); Kafka's nodes 1-3 (broker id = node id).
nodes_of() { case $1 in fjord) echo 0 1 2 ;; kafka) echo 1 2 3 ;; esac; }
broker_of() { case $1 in fjord) echo $(($2 * 1000)) ;; kafka) echo "$2" ;; esac; }
bootstrap_of() {
  case $1 in
    fjord) echo 127.0.0.1:19200,127.0.0.1:19201,127.0.0.1:19202 ;;
    kafka) scripts/kafka-cluster.sh bootstrap ;;
  esac
}
start_cluster() {
  case $1 in
    fjord) FJORD_BIN=$fjord FJORD_FLAGS="--no-pin ${FJORD_FLAGS:-}" scripts/cluster.sh start --fresh ;;
    kafka) scripts/kafka-cluster.sh start --fresh ;;
  esac
}
stop_cluster() {
  case $1 in
    fjord) scripts/cluster.sh stop ;;
    kafka) scripts/kafka-cluster.sh stop ;;
  esac
}
node_pid() {
  case $1 in
    fjord) cat "target/cluster/node-$2.pid" ;;
    kafka) scripts/kafka-cluster.sh pid "$2" ;;
  esac
}
# The node that leads the metadata quorum now.
quorum_leader() {
  case $1 in
    fjord)
      # The last "leads the metadata quorum" line of any node's log.
      local f
      for f in target/cluster/node-*.log; do
        sed 's/\x1b\[[0-9;]*m//g' "$f" | grep 'this node leads the metadata quorum' |
          sed -n 's/^\([^ ]*\) .*node=\([0-9]*\).*/\1 \2/p' || true
      done | sort | tail -n1 | cut -d' ' -f2
      ;;
    kafka)
      scripts/kafka-cli kafka-metadata-quorum --bootstrap-server "$(bootstrap_of kafka)" describe --status |
        sed -n 's/^LeaderId:[[:space:]]*//p'
      ;;
  esac
}

bench() {
  local system=$1 name=$2 topic=$3
  shift 3
  local cmd=("$fjord" bench --name "$name" --label "$system" --output "$out"
    --bootstrap "$(bootstrap_of "$system")" --topic "$topic" "$@")
  printf '%q ' "${cmd[@]}" >>"$out/commands.txt"
  echo >>"$out/commands.txt"
  log "== $name on $system ($topic)"
  "${cmd[@]}" >>"$out/console.log" 2>&1 || log "run failed: $system $name"
}

for r in $(seq "$rounds"); do
  for system in $systems; do
    log "==== round $r/$rounds: $system ($(date -u +%T))"
    start_cluster "$system" >>"$out/console.log" 2>&1
    ql=$(quorum_leader "$system")
    read -r -a nodes <<<"$(nodes_of "$system")"
    # The partition leader: the node after the quorum's leader.
    for i in 0 1 2; do [ "${nodes[$i]}" = "$ql" ] && break; done
    lead=${nodes[$(((i + 1) % 3))]}
    f1=${nodes[$(((i + 2) % 3))]}
    f2=${nodes[$i]}
    assign="$(broker_of "$system" "$lead"):$(broker_of "$system" "$f1"):$(broker_of "$system" "$f2")"
    log "quorum leader node $ql; partition leader node $lead (assignment $assign)"
    bs=$(bootstrap_of "$system")
    # rf1 is placed by the cluster (all nodes share one machine, so which
    # node holds it does not matter; fjord places a topic of one replica on
    # the quorum leader's node and refuses an explicit assignment of one
    # replica elsewhere, docs/replication.md §3.2).
    for t in rf1 rf3; do
      if [ $t = rf1 ]; then
        spec=(--partitions 1 --replication-factor 1)
      else
        spec=(--replica-assignment "$assign" --config min.insync.replicas=2)
      fi
      scripts/kafka-cli kafka-topics --bootstrap-server "$bs" --create --topic "$t" \
        "${spec[@]}" >>"$out/console.log" 2>&1
      echo "kafka-topics --create --topic $t ${spec[*]}" >>"$out/commands.txt"
    done
    # Alternate the order of rf1 and rf3 from round to round.
    order="rf1 rf3"
    [ $((r % 2)) = 0 ] && order="rf3 rf1"
    if [[ $parts == *" latency "* ]]; then
      for t in $order; do
        bench "$system" "latency-$t" "$t" --workload workloads/latency-100b-10k.toml \
          --rate "$rate" --duration 30s --warmup 10s
      done
    fi
    if [[ $parts == *" saturate "* ]]; then
      for t in $order; do
        bench "$system" "saturate-$t" "$t" --workload workloads/saturate-1kb.toml
      done
    fi
    if [[ $parts == *" perftest "* ]]; then
      for t in $order; do
        pt=(scripts/kafka-cli kafka-producer-perf-test --topic "$t" --num-records $((rate * 30))
          --record-size 100 --throughput "$rate" --producer-props "bootstrap.servers=$bs" acks=all linger.ms=0)
        printf '%q ' "${pt[@]}" >>"$out/commands.txt"
        echo >>"$out/commands.txt"
        log "== perftest-$t on $system"
        "${pt[@]}" >"$out/perftest-$system-$t-round$r.txt" 2>&1 || log "perftest failed: $system $t"
        tail -n 1 "$out/perftest-$system-$t-round$r.txt" >>"$out/console.log"
      done
    fi
    if [[ $parts != *" failover "* ]]; then
      stop_cluster "$system" >>"$out/console.log" 2>&1
      continue
    fi
    # Failover.
    probe_out="$out/probe-$system-round$r.out"
    leader_file=$(mktemp -u)
    probe=(java -cp "$java_cp" fjord.interop.Main failover-probe --bootstrap "$bs" --topic rf3
      --out "$probe_out" --leader-file "$leader_file" --duration-ms 40000 --warmup-ms 5000)
    printf '%q ' "${probe[@]}" >>"$out/commands.txt"
    echo >>"$out/commands.txt"
    "${probe[@]}" >>"$out/console.log" 2>&1 &
    probe_pid=$!
    while [ ! -s "$leader_file" ]; do
      kill -0 "$probe_pid" 2>/dev/null || { log "probe ended before naming the leader"; break; }
      sleep 0.05
    done
    killed=-
    kill_ms=0
    if [ -s "$leader_file" ]; then
      leader_broker=$(cat "$leader_file")
      case $system in fjord) killed=$((leader_broker / 1000)) ;; kafka) killed=$leader_broker ;; esac
      pid=$(node_pid "$system" "$killed")
      kill_ms=$(date +%s%3N)
      kill -KILL "$pid"
      log "killed node $killed (pid $pid) at $kill_ms"
    fi
    wait "$probe_pid" || log "probe failed"
    rm -f "$leader_file"
    # The end of the longest gap between acknowledgements that ends after
    # the kill, minus the kill's time.
    fo=$(awk -v k="$kill_ms" 'NR > 1 && $1 > k { g = $1 - p; if (g > mg) { mg = g; e = $1 } } { p = $1 }
      END { if (e) print e - k; else print "-" }' "$probe_out" 2>/dev/null || echo -)
    sends=$(wc -l <"$probe_out" 2>/dev/null || echo 0)
    echo -e "$r\t$system\t$ql\t$killed\t$fo\t$sends" >>"$out/failover.tsv"
    log "failover: $fo ms ($sends acknowledged sends)"
    gzip -9f "$probe_out"
    stop_cluster "$system" >>"$out/console.log" 2>&1
  done
done

python3 scripts/lib/bench-summary.py "$out" $systems >"$out/summary.md" || true
[[ $parts == *" perftest "* ]] && python3 - "$out" >"$out/perftest.md" <<'EOF'
import glob, os, re, statistics, sys
cols = ["avg latency", "50th", "99th", "99.9th"]
runs = {}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "perftest-*-round*.txt"))):
    system, topic = os.path.basename(path).split("-")[1:3]
    last = open(path).read().strip().splitlines()[-1]
    v = {"avg latency": float(re.search(r"([0-9.]+) ms avg latency", last).group(1))}
    for c in cols[1:]:
        v[c] = float(re.search(r"([0-9.]+) ms " + re.escape(c), last).group(1))
    runs.setdefault(topic, {}).setdefault(system, []).append(v)
print("kafka-producer-perf-test, ms, min / median / max over the runs.\n")
for topic in sorted(runs):
    print(f"### {topic}\n")
    print("| system | runs | " + " | ".join(cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    for system, vs in runs[topic].items():
        cells = []
        for c in cols:
            x = sorted(r[c] for r in vs)
            cells.append(f"{x[0]:g} / {statistics.median(x):g} / {x[-1]:g}")
        print(f"| {system} | {len(vs)} | " + " | ".join(cells) + " |")
    print()
EOF
[[ $parts == *" failover "* ]] && python3 - "$out/failover.tsv" >"$out/failover.md" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
print("| system | runs | failover ms (min / median / max) |")
print("|---|---|---|")
for system in dict.fromkeys(r["system"] for r in rows):
    v = sorted(int(r["failover_ms"]) for r in rows if r["system"] == system and r["failover_ms"].isdigit())
    cell = f"{v[0]} / {statistics.median(v):.0f} / {v[-1]}" if v else "-"
    print(f"| {system} | {len(v)} | {cell} |")
EOF
cat "$out/summary.md"
[ ! -f "$out/perftest.md" ] || cat "$out/perftest.md"
[ ! -f "$out/failover.md" ] || cat "$out/failover.md"
