#!/usr/bin/env bash
# Runs stock Apache Kafka (the version interop/kafka-peer/pom.xml names) as a
# reference peer for fjord: ONE combined broker+controller KRaft node on
# 127.0.0.1, from jars Maven resolved into target/kafka-peer/lib.
#
# usage: scripts/kafka-peer.sh start  [OPTIONS]
#        scripts/kafka-peer.sh run    [OPTIONS]   (in the foreground)
#        scripts/kafka-peer.sh stop   [--data-dir DIR]
#        scripts/kafka-peer.sh status [--data-dir DIR]
#        scripts/kafka-peer.sh resolve   (only fetch the jars: what CI runs once)
#        scripts/kafka-peer.sh version   (e.g. "4.4.0 (commit 1156b2752aaa28ea)")
#
# start and run options:
#   --port P              PLAINTEXT listener (default 19092; not 9092, which is
#                         fjord's default, so both can run side by side)
#   --controller-port P   CONTROLLER listener (default: port + 1)
#   --data-dir DIR        default target/kafka-peer/data; holds server.properties,
#                         kraft/ (log.dirs), logs/ (server.log, stdout.log, gc.log),
#                         kafka-peer.pid and peer.env
#   --cpus LIST           run java under `taskset -c LIST`
#   --flush MODE          default | every-message (log.flush.interval.messages=1,
#                         the setting Redpanda's published comparisons forced on Kafka)
#   --heap SIZE           -Xmx and -Xms (default 1g, as kafka-server-start.sh)
#   --fresh               delete the data directory first
#   --conf KEY=VALUE      extra server property (repeatable; overrides the
#                         generated ones, since the last occurrence wins)
#   --ready-timeout-s N   how long to wait for the broker to answer (default 60)
#   --node-id N           node.id (default 1)
#   --voters LIST         a node of a static KRaft quorum: controller.quorum.voters,
#                         e.g. 1@127.0.0.1:39301,2@127.0.0.1:39302,3@127.0.0.1:39303
#                         (every node is broker and controller; internal topics get
#                         replication factor min(3, voters), as Kafka's defaults);
#                         without it the node is a standalone quorum of one
#   --cluster-id ID       the cluster id to format with (every node of a cluster
#                         needs the same; default: a random one)
#
# `start` returns once the broker accepted a TCP connection and answered an
# ApiVersions + Metadata round trip (kafka-broker-api-versions), printing
# `kafka-peer: ready`. A running peer on the same data directory, or a busy
# port, makes `start` fail with exit status 1. `status` exits 0 when the peer
# runs and 1 when it does not.
#
# `run` does what `start` does up to the JVM (checks, --fresh, the KRaft
# format step, server.properties) and then execs the JVM in the foreground,
# under `taskset -c LIST` with --cpus: the script's process becomes the
# broker (same pid), its output goes to the caller's stdout and stderr, and
# it ends when the broker does (SIGTERM: controlled shutdown). This is the
# form `fjord bench --broker-cmd` needs to measure the broker's CPU seconds
# and peak RSS (scripts/compare.sh). It does not wait for readiness; the
# caller polls the port. Environment: KAFKA_PEER_JVM_OPTS (extra JVM
# options), JAVA, MVN.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
# shellcheck source=lib/kafka-classpath.sh
. "$(dirname "$0")/lib/kafka-classpath.sh"

KAFKA_PEER_PORT_DEFAULT=19092
KAFKA_PEER_HEAP_DEFAULT=1g
KAFKA_PEER_NODE_ID_DEFAULT=1
KAFKA_PEER_READY_TIMEOUT_S_DEFAULT=60
# One kafka-broker-api-versions attempt; a JVM start alone takes ~1.5 s here.
KAFKA_PEER_PROBE_TIMEOUT_S=20
KAFKA_PEER_POLL_INTERVAL_S=0.2
# A single node's controlled shutdown takes a few seconds; after this it is
# killed.
KAFKA_PEER_STOP_TIMEOUT_S=30
KAFKA_PEER_KILL_TIMEOUT_S=10
KAFKA_PEER_FORMAT_TIMEOUT_S=60
KAFKA_PEER_LOG_TAIL_LINES=40

die() {
  echo "kafka-peer: $*" >&2
  exit 1
}

usage() {
  sed -n '/^# usage:/,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

[ $# -ge 1 ] || usage
cmd=$1
shift
case $cmd in
  start | run | stop | status | resolve | version) ;;
  -h | --help | help) usage ;;
  *) echo "kafka-peer: unknown command '$cmd'" >&2; usage ;;
esac

port=$KAFKA_PEER_PORT_DEFAULT
controller_port=
data_dir=$KAFKA_PEER_HOME/data
cpus=
flush=default
heap=$KAFKA_PEER_HEAP_DEFAULT
fresh=false
ready_timeout_s=$KAFKA_PEER_READY_TIMEOUT_S_DEFAULT
node_id=$KAFKA_PEER_NODE_ID_DEFAULT
voters=
cluster_id_arg=
extra_conf=()
while [ $# -gt 0 ]; do
  opt=$1
  case $opt in
    --fresh) fresh=true; shift; continue ;;
    -h | --help) usage ;;
  esac
  [ $# -ge 2 ] || die "$opt needs a value"
  val=$2
  shift 2
  case $opt in
    --port) port=$val ;;
    --controller-port) controller_port=$val ;;
    --data-dir) data_dir=$val ;;
    --cpus) cpus=$val ;;
    --flush) flush=$val ;;
    --heap) heap=$val ;;
    --conf) [[ $val == ?*=* ]] || die "--conf wants KEY=VALUE, got '$val'"; extra_conf+=("$val") ;;
    --ready-timeout-s) ready_timeout_s=$val ;;
    --node-id) node_id=$val ;;
    --voters) voters=$val ;;
    --cluster-id) cluster_id_arg=$val ;;
    *) die "unknown option '$opt'" ;;
  esac
done
controller_port=${controller_port:-$((port + 1))}
for n in "$port" "$controller_port" "$ready_timeout_s" "$node_id"; do
  [[ $n =~ ^[0-9]+$ ]] || die "not a number: '$n'"
done
[ "$port" != "$controller_port" ] || die "--port and --controller-port must differ"
case $flush in default | every-message) ;; *) die "--flush is default or every-message, not '$flush'" ;; esac
[[ $heap =~ ^[0-9]+[kKmMgG]?$ ]] || die "--heap wants a JVM size such as 1g, not '$heap'"
data_dir=$(realpath -m "$data_dir")
if [ -n "$voters" ]; then
  [[ $voters =~ ^[0-9]+@[^,@]+:[0-9]+(,[0-9]+@[^,@]+:[0-9]+)*$ ]] ||
    die "--voters wants ID@HOST:PORT[,...], got '$voters'"
  [[ ,$voters, == *",$node_id@"* ]] || die "--voters does not list --node-id $node_id"
fi
# Replication factor of the internal topics: one per voter, at most 3.
internal_rf=1
if [ -n "$voters" ]; then
  internal_rf=$(tr ',' '\n' <<<"$voters" | wc -l)
  [ "$internal_rf" -le 3 ] || internal_rf=3
fi
internal_min_isr=$((internal_rf < 2 ? 1 : 2))

pid_file=$data_dir/kafka-peer.pid
env_file=$data_dir/peer.env
props_file=$data_dir/server.properties
log_dir=$data_dir/logs
kraft_dir=$data_dir/kraft
# Marks a directory as made by this script, so that --fresh may empty it.
marker_file=$data_dir/.kafka-peer-data

# Prints the pid of the peer running on this data directory, if any. A pid
# counts only while it is a live kafka.Kafka started with this directory's
# server.properties, so a stale pid file (a reboot, a reused pid) is ignored.
running_pid() {
  [ -f "$pid_file" ] || return 1
  local pid
  pid=$(cat "$pid_file")
  [[ $pid =~ ^[0-9]+$ ]] && [ -r "/proc/$pid/cmdline" ] || return 1
  local cmdline
  cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
  [[ $cmdline == *" kafka.Kafka $props_file"* ]] || return 1
  echo "$pid"
}

port_in_use() {
  if command -v ss >/dev/null; then
    [ -n "$(ss -Hltn "sport = :$1")" ]
  else
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
  fi
}

tcp_accepts() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

env_value() {
  [ -f "$env_file" ] && sed -n "s/^$1=//p" "$env_file" | tail -n1
}

# server.log is appended to across runs; the lines it had before this start
# are skipped, so that a failure shows only this run's log.
server_log_lines_before=0
print_log_tail() {
  if [ -s "$log_dir/stdout.log" ]; then
    echo "---- last $KAFKA_PEER_LOG_TAIL_LINES lines of $log_dir/stdout.log" >&2
    tail -n "$KAFKA_PEER_LOG_TAIL_LINES" "$log_dir/stdout.log" >&2
  fi
  if [ -s "$log_dir/server.log" ]; then
    echo "---- last $KAFKA_PEER_LOG_TAIL_LINES lines of $log_dir/server.log (this run)" >&2
    tail -n "+$((server_log_lines_before + 1))" "$log_dir/server.log" | tail -n "$KAFKA_PEER_LOG_TAIL_LINES" >&2
  fi
}

# SIGTERM, a bounded wait, then SIGKILL and another bounded wait.
stop_pid() {
  local pid=$1 deadline
  kill -TERM "$pid" 2>/dev/null || return 0
  deadline=$((SECONDS + KAFKA_PEER_STOP_TIMEOUT_S))
  while [ "$SECONDS" -lt "$deadline" ]; do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep "$KAFKA_PEER_POLL_INTERVAL_S"
  done
  echo "kafka-peer: pid $pid still alive after ${KAFKA_PEER_STOP_TIMEOUT_S}s, sending SIGKILL" >&2
  kill -KILL "$pid" 2>/dev/null || return 0
  deadline=$((SECONDS + KAFKA_PEER_KILL_TIMEOUT_S))
  while [ "$SECONDS" -lt "$deadline" ]; do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep "$KAFKA_PEER_POLL_INTERVAL_S"
  done
  die "pid $pid survived SIGKILL for ${KAFKA_PEER_KILL_TIMEOUT_S}s"
}

do_status() {
  local pid
  if pid=$(running_pid); then
    echo "kafka-peer: running pid $pid port $(env_value port) controller-port $(env_value controller_port)" \
      "version $(env_value version) cpus $(env_value cpus) flush $(env_value flush)" \
      "heap $(env_value heap) data-dir $data_dir"
  else
    echo "kafka-peer: not running (data-dir $data_dir)"
    return 1
  fi
}

do_stop() {
  local pid
  if ! pid=$(running_pid); then
    rm -f "$pid_file"
    echo "kafka-peer: not running (data-dir $data_dir)"
    return 0
  fi
  local started=$SECONDS
  stop_pid "$pid"
  rm -f "$pid_file"
  echo "kafka-peer: stopped pid $pid in $((SECONDS - started)) s"
}

# A Kafka cluster id is 16 random bytes in URL-safe base64 without padding;
# Kafka's own generator avoids a leading '-' so that the id can be passed on
# a command line.
random_cluster_id() {
  local id
  while :; do
    id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')
    [[ $id == -* ]] || break
  done
  echo "$id"
}

write_server_properties() {
  {
    echo "# Written by scripts/kafka-peer.sh; regenerated on every start."
    echo "process.roles=broker,controller"
    echo "node.id=$node_id"
    if [ -n "$voters" ]; then
      echo "controller.quorum.voters=$voters"
    else
      echo "controller.quorum.bootstrap.servers=127.0.0.1:$controller_port"
    fi
    echo "listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller_port"
    echo "advertised.listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller_port"
    echo "controller.listener.names=CONTROLLER"
    echo "inter.broker.listener.name=PLAINTEXT"
    echo "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
    echo "log.dirs=$kraft_dir"
    echo "# Internal topics: one replica per voter, at most 3 (Kafka's defaults on 3+ nodes)."
    echo "num.partitions=1"
    echo "default.replication.factor=1"
    echo "offsets.topic.replication.factor=$internal_rf"
    echo "transaction.state.log.replication.factor=$internal_rf"
    echo "transaction.state.log.min.isr=$internal_min_isr"
    echo "share.coordinator.state.topic.replication.factor=$internal_rf"
    echo "share.coordinator.state.topic.min.isr=$internal_min_isr"
    echo "group.initial.rebalance.delay.ms=0"
    echo "auto.create.topics.enable=true"
    if [ "$flush" = every-message ]; then
      echo "# --flush every-message: fsync after every message."
      echo "log.flush.interval.messages=1"
    fi
    if [ ${#extra_conf[@]} -gt 0 ]; then
      echo "# --conf"
      printf '%s\n' "${extra_conf[@]}"
    fi
  } >"$props_file"
}

# Everything `start` and `run` share: checks, --fresh, the format step,
# server.properties and peer.env. Leaves the broker's command line in
# `broker_command` and the version in `version`.
prepare_node() {
  local pid
  if pid=$(running_pid); then
    die "already running: pid $pid port $(env_value port) (data-dir $data_dir); stop it first"
  fi
  local p
  for p in "$port" "$controller_port"; do
    if port_in_use "$p"; then
      die "port $p on 127.0.0.1 is already in use; pick another with --port/--controller-port"
    fi
  done
  if [ -n "$cpus" ]; then
    command -v taskset >/dev/null || die "--cpus needs taskset (util-linux)"
    taskset -c "$cpus" true || die "taskset rejects --cpus '$cpus'"
  fi
  if $fresh && [ -d "$data_dir" ]; then
    # Refuse to wipe a directory this script did not create.
    if [ -n "$(ls -A "$data_dir")" ] && [ ! -f "$marker_file" ]; then
      die "--fresh: $data_dir is not empty and has no $(basename "$marker_file"); not deleting it"
    fi
    find "$data_dir" -mindepth 1 -maxdepth 1 ! -name "$(basename "$marker_file")" -exec rm -rf {} +
  fi
  mkdir -p "$data_dir"
  touch "$marker_file"
  mkdir -p "$log_dir" "$kraft_dir"

  kafka_resolve
  local classpath
  version=$(kafka_version)
  classpath=$(cat "$KAFKA_CLASSPATH_FILE")
  echo "kafka-peer: Apache Kafka $version"

  # A dynamic quorum records the controller's endpoint at format time, so a
  # formatted directory only works with the controller port it was made for.
  if [ -f "$kraft_dir/meta.properties" ]; then
    local formatted_port
    formatted_port=$(env_value controller_port)
    if [ -n "$formatted_port" ] && [ "$formatted_port" != "$controller_port" ]; then
      die "$data_dir was formatted for controller port $formatted_port, not $controller_port; use --fresh"
    fi
  fi
  write_server_properties
  local cluster_id
  if [ -f "$kraft_dir/meta.properties" ]; then
    cluster_id=$(sed -n 's/^cluster.id=//p' "$kraft_dir/meta.properties")
  else
    cluster_id=${cluster_id_arg:-$(random_cluster_id)}
    local -a quorum_flag=(--standalone)
    local quorum_kind="standalone controller"
    if [ -n "$voters" ]; then
      # A static quorum (controller.quorum.voters): nothing to name at format time.
      quorum_flag=()
      quorum_kind="static quorum $voters"
    fi
    echo "kafka-peer: formatting $kraft_dir (cluster id $cluster_id, $quorum_kind)"
    timeout "$KAFKA_PEER_FORMAT_TIMEOUT_S" "$JAVA" -Xmx256m \
      "-Dlog4j2.configurationFile=$KAFKA_LOG4J_TOOLS" -cp "$classpath" \
      kafka.tools.StorageTool format --config "$props_file" --cluster-id "$cluster_id" "${quorum_flag[@]}" \
      >"$log_dir/format.log" 2>&1 || { cat "$log_dir/format.log" >&2; die "kafka-storage format failed"; }
  fi

  # JVM options as Kafka's kafka-server-start.sh and kafka-run-class.sh set
  # them, so the peer runs the way a stock installation does.
  local -a jvm=(
    "-Xmx$heap" "-Xms$heap"
    -server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35
    -XX:+ExplicitGCInvokesConcurrent -Djava.awt.headless=true
    "-Xlog:gc*:file=$log_dir/gc.log:time,tags:filecount=10,filesize=100M"
    "-Dkafka.logs.dir=$log_dir" "-Dlog4j2.configurationFile=$KAFKA_LOG4J_BROKER"
  )
  # KAFKA_PEER_JVM_OPTS is split on purpose: it holds several JVM options.
  # shellcheck disable=SC2206
  jvm+=(${KAFKA_PEER_JVM_OPTS:-})
  broker_command=()
  [ -z "$cpus" ] || broker_command+=(taskset -c "$cpus")
  broker_command+=("$JAVA" "${jvm[@]}" -cp "$classpath" kafka.Kafka "$props_file")
  echo "kafka-peer: command: ${broker_command[*]}"

  {
    echo "port=$port"
    echo "controller_port=$controller_port"
    echo "version=$version"
    echo "cluster_id=$cluster_id"
    echo "cpus=${cpus:-all}"
    echo "flush=$flush"
    echo "heap=$heap"
  } >"$env_file"
}

version=
broker_command=()

# `run`: the JVM replaces this script, in the foreground. The pid file
# names this process, which stays the broker's pid across the exec, so
# `status` and `stop` work on it as on a started peer.
do_run() {
  prepare_node
  echo "$$" >"$pid_file"
  exec "${broker_command[@]}"
}

do_start() {
  prepare_node
  local pid
  if [ -f "$log_dir/server.log" ]; then
    server_log_lines_before=$(wc -l <"$log_dir/server.log")
  fi
  local started_ms
  started_ms=$(date +%s%3N)
  # nohup and taskset both exec, so $! is the java process itself.
  nohup "${broker_command[@]}" >"$log_dir/stdout.log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$pid_file"

  local deadline=$((SECONDS + ready_timeout_s)) accepted_ms='' probe_out
  while :; do
    if ! kill -0 "$pid" 2>/dev/null; then
      rm -f "$pid_file"
      print_log_tail
      die "the broker (pid $pid) exited during start-up"
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      print_log_tail
      echo "kafka-peer: not ready within ${ready_timeout_s}s; stopping pid $pid" >&2
      stop_pid "$pid"
      rm -f "$pid_file"
      exit 1
    fi
    if [ -z "$accepted_ms" ]; then
      if tcp_accepts "$port"; then
        accepted_ms=$(date +%s%3N)
      else
        sleep "$KAFKA_PEER_POLL_INTERVAL_S"
        continue
      fi
    fi
    # kafka-broker-api-versions bootstraps with Metadata and then sends
    # ApiVersions to every broker it learnt of, so its ApiVersions line
    # proves both round trips.
    if probe_out=$(timeout "$KAFKA_PEER_PROBE_TIMEOUT_S" "$KAFKA_REPO_ROOT/scripts/kafka-cli" \
      kafka-broker-api-versions --bootstrap-server "127.0.0.1:$port" 2>&1) &&
      grep -q 'ApiVersions(18)' <<<"$probe_out"; then
      break
    fi
    sleep "$KAFKA_PEER_POLL_INTERVAL_S"
  done
  local ready_ms
  ready_ms=$(date +%s%3N)
  local logged
  logged=$(tail -n "+$((server_log_lines_before + 1))" "$log_dir/server.log" 2>/dev/null |
    sed -n 's/.*\(Kafka version: [^ ]*\).*/\1/p' | tail -n1)
  echo "kafka-peer: broker log says: ${logged:-no 'Kafka version' line}"
  echo "kafka-peer: first TCP accept after $((accepted_ms - started_ms)) ms," \
    "ApiVersions+Metadata answered after $((ready_ms - started_ms)) ms"
  echo "kafka-peer: ready pid $pid bootstrap 127.0.0.1:$port (logs in $log_dir)"
}

case $cmd in
  start) do_start ;;
  run) do_run ;;
  stop) do_stop ;;
  status) do_status ;;
  resolve)
    kafka_resolve
    echo "kafka-peer: Apache Kafka $(kafka_version) in $KAFKA_PEER_HOME/lib"
    ;;
  version) kafka_version ;;
esac
