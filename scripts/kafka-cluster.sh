#!/usr/bin/env bash
# Starts or stops a 3-node stock Apache Kafka cluster on loopback, the peer
# of scripts/cluster.sh's 3-node fjord cluster (tuning/results/replication.md):
# nodes 1, 2, 3, each broker and controller of one static KRaft quorum
# (controller.quorum.voters), clients on ports 39201, 39202, 39203,
# controllers on 39301-39303, data in target/kafka-cluster/node-N/
# (scripts/kafka-peer.sh's layout: logs/server.log, kraft/, ...).
# Internal topics get replication factor 3 and min ISR 2, as Kafka's
# defaults on three nodes.
#
# usage: scripts/kafka-cluster.sh start [--fresh]  starts the nodes not running,
#                                                  all at once (a node is ready
#                                                  only once a quorum is up)
#        scripts/kafka-cluster.sh stop             SIGTERM to every node (controlled shutdown)
#        scripts/kafka-cluster.sh kill N           SIGKILL to node N
#        scripts/kafka-cluster.sh pid N            node N's pid, if it runs
#        scripts/kafka-cluster.sh status
#
# KAFKA_HEAP sets each node's heap (default 1g, as kafka-server-start.sh);
# KAFKA_CONF adds server properties to every node (space-separated
# KEY=VALUE).
set -euo pipefail

cd "$(dirname "$0")/.."
DIR=target/kafka-cluster
NODES=(1 2 3)
CLIENT_BASE=39200
CONTROLLER_BASE=39300

voters() {
    local q=()
    for n in "${NODES[@]}"; do
        q+=("$n@127.0.0.1:$((CONTROLLER_BASE + n))")
    done
    (IFS=,; echo "${q[*]}")
}

peer() {
    scripts/kafka-peer.sh "$1" --data-dir "$DIR/node-$2"
}

node_pid() {
    local f="$DIR/node-$1/kafka-peer.pid"
    [[ -f "$f" ]] && kill -0 "$(cat "$f")" 2>/dev/null && cat "$f"
}

start() {
    local fresh=()
    if [[ "${1:-}" == "--fresh" ]]; then
        stop
        fresh=(--fresh)
    fi
    mkdir -p "$DIR"
    local cluster_id_file="$DIR/cluster-id"
    if [[ ${#fresh[@]} -gt 0 || ! -s "$cluster_id_file" ]]; then
        # 16 random bytes, URL-safe base64 without padding, no leading '-'.
        local id
        while :; do
            id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')
            [[ $id == -* ]] || break
        done
        echo "$id" >"$cluster_id_file"
    fi
    local conf=() kv
    for kv in ${KAFKA_CONF:-}; do conf+=(--conf "$kv"); done
    local pids=() n
    for n in "${NODES[@]}"; do
        if node_pid "$n" >/dev/null; then
            echo "node $n already runs (pid $(node_pid "$n"))"
            continue
        fi
        scripts/kafka-peer.sh start "${fresh[@]}" --data-dir "$DIR/node-$n" \
            --node-id "$n" --voters "$(voters)" --cluster-id "$(cat "$cluster_id_file")" \
            --port $((CLIENT_BASE + n)) --controller-port $((CONTROLLER_BASE + n)) \
            --heap "${KAFKA_HEAP:-1g}" --ready-timeout-s 180 "${conf[@]}" \
            >"$DIR/node-$n.start.log" 2>&1 &
        pids+=($!)
    done
    local failed=0 p
    for p in "${pids[@]}"; do wait "$p" || failed=1; done
    for n in "${NODES[@]}"; do
        echo "node $n: $(tail -n 1 "$DIR/node-$n.start.log" 2>/dev/null)"
    done
    [[ $failed == 0 ]] || { echo "kafka-cluster: a node did not start; see $DIR/node-N.start.log" >&2; exit 1; }
    echo "bootstrap: $(bootstrap)"
}

bootstrap() {
    local b=() n
    for n in "${NODES[@]}"; do b+=("127.0.0.1:$((CLIENT_BASE + n))"); done
    (IFS=,; echo "${b[*]}")
}

stop() {
    local n
    for n in "${NODES[@]}"; do
        [[ -d "$DIR/node-$n" ]] && peer stop "$n" &
    done
    wait
}

case "${1:-}" in
    start) start "${2:-}" ;;
    stop) stop ;;
    kill)
        n=${2:?usage: kafka-cluster.sh kill N}
        pid=$(node_pid "$n") || { echo "node $n does not run" >&2; exit 1; }
        kill -KILL "$pid"
        echo "node $n (pid $pid) killed"
        ;;
    pid) node_pid "${2:?usage: kafka-cluster.sh pid N}" ;;
    status)
        for n in "${NODES[@]}"; do peer status "$n" || true; done
        ;;
    bootstrap) bootstrap ;;
    *)
        sed -n '/^# usage:/,/^# KAFKA_HEAP/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
        exit 2
        ;;
esac
