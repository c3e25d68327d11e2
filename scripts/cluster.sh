#!/usr/bin/env bash
# Starts or stops a 3-node fjord cluster on loopback, for trying the
# metadata quorum and replicated topics out (docs/replication.md): nodes 0,
# 1, 2, one shard each, clients on ports 19200, 19201, 19202, controllers
# on 19300-19302, metrics on 19400-19402, data in target/cluster/node-N/
# (stderr appended to target/cluster/node-N.log).
#
# usage: scripts/cluster.sh start [--fresh]  starts the nodes not running
#                                            (--fresh: stops all, deletes the data)
#        scripts/cluster.sh stop             SIGTERM to every node: a clean stop
#        scripts/cluster.sh kill N           SIGKILL to node N, to try a crash
#        scripts/cluster.sh status
#
# FJORD_BIN picks the binary (default target/release/fjord if built, else
# target/debug/fjord); FJORD_FLAGS adds flags to every node's `fjord serve`
# (e.g. FJORD_FLAGS=--fsync-acks). What works and what does not yet:
# README, "Several nodes"; what each durability setting guarantees:
# docs/durability.md.
set -euo pipefail

cd "$(dirname "$0")/.."
DIR=target/cluster
NODES=(0 1 2)
CLIENT_BASE=19200
CONTROLLER_BASE=19300
METRICS_BASE=19400

bin() {
    if [[ -n "${FJORD_BIN:-}" ]]; then
        echo "$FJORD_BIN"
    elif [[ -x target/release/fjord ]]; then
        echo target/release/fjord
    else
        echo target/debug/fjord
    fi
}

quorum() {
    local q=()
    for n in "${NODES[@]}"; do
        q+=("$n@127.0.0.1:$((CONTROLLER_BASE + n))")
    done
    (IFS=,; echo "${q[*]}")
}

running() {
    [[ -f "$DIR/node-$1.pid" ]] && kill -0 "$(cat "$DIR/node-$1.pid")" 2>/dev/null
}

start() {
    local b
    b=$(bin)
    [[ -x "$b" ]] || { echo "no fjord binary at $b (cargo build first)" >&2; exit 1; }
    if [[ "${1:-}" == "--fresh" ]]; then
        stop
        rm -rf "$DIR"
    fi
    mkdir -p "$DIR"
    for n in "${NODES[@]}"; do
        if running "$n"; then
            echo "node $n already runs (pid $(cat "$DIR/node-$n.pid"))"
            continue
        fi
        # FJORD_FLAGS is split on purpose: it holds several flags.
        # shellcheck disable=SC2086
        "$b" serve --node-id "$n" --cores 1 \
            --port $((CLIENT_BASE + n)) \
            --data-dir "$DIR/node-$n" \
            --controller-quorum "$(quorum)" \
            --metrics-listen "127.0.0.1:$((METRICS_BASE + n))" \
            ${FJORD_FLAGS:-} \
            >>"$DIR/node-$n.log" 2>&1 &
        echo $! >"$DIR/node-$n.pid"
        echo "node $n: pid $!, clients 127.0.0.1:$((CLIENT_BASE + n)), controller 127.0.0.1:$((CONTROLLER_BASE + n)), log $DIR/node-$n.log"
    done
    wait_registered
    echo "any node takes metadata writes (forwarded to the quorum's leader) and bootstraps clients;"
    echo "the leader: grep 'leads the metadata quorum' $DIR/node-*.log (the last such line)"
}

# Waits (at most 60 s) until Metadata lists every node's broker, so that a
# topic of replication factor 3 can be created: until the nodes have
# registered with the quorum's leader, CreateTopics answers
# INVALID_REPLICATION_FACTOR. Asks with kcat when it is installed.
wait_registered() {
    local bootstrap n
    bootstrap=$(for n in "${NODES[@]}"; do printf '127.0.0.1:%s,' $((CLIENT_BASE + n)); done)
    if ! command -v kcat >/dev/null; then
        echo "(no kcat to check with: the nodes register with the quorum within a few seconds)"
        return
    fi
    for _ in $(seq 120); do
        if kcat -b "${bootstrap%,}" -L -m 2 2>/dev/null | grep -q "^ ${#NODES[@]} brokers:"; then
            echo "all ${#NODES[@]} nodes registered"
            return
        fi
        sleep 0.5
    done
    echo "not every node registered within 60 s: see $DIR/node-*.log" >&2
    exit 1
}

stop() {
    for n in "${NODES[@]}"; do
        if running "$n"; then
            local pid
            pid=$(cat "$DIR/node-$n.pid")
            kill "$pid"
            for _ in $(seq 100); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.1
            done
            echo "node $n stopped"
        fi
        rm -f "$DIR/node-$n.pid"
    done
}

kill9() {
    local n=${1:-}
    [[ " ${NODES[*]} " == *" $n "* ]] || { echo "usage: scripts/cluster.sh kill N (N in ${NODES[*]})" >&2; exit 2; }
    if running "$n"; then
        kill -9 "$(cat "$DIR/node-$n.pid")"
        echo "node $n killed (SIGKILL); scripts/cluster.sh start restarts it"
    else
        echo "node $n is not running"
    fi
    rm -f "$DIR/node-$n.pid"
}

status() {
    for n in "${NODES[@]}"; do
        if running "$n"; then
            echo "node $n: running (pid $(cat "$DIR/node-$n.pid"))"
        else
            echo "node $n: stopped"
        fi
    done
}

case "${1:-}" in
    start) shift; start "$@" ;;
    stop) stop ;;
    kill) shift; kill9 "$@" ;;
    status) status ;;
    *) sed -n '2,21p' "$0"; exit 2 ;;
esac
