#!/usr/bin/env bash
# Kafka's own producer benchmark, kafka-producer-perf-test, against a fresh
# fjord and a fresh stock Kafka, alternating, with the same options, and a
# Markdown table of the results (min / median / max over the runs).
#
# usage: scripts/perf-test.sh OUTDIR [-- extra kafka-producer-perf-test args]
#
# Each run: start the broker on BROKER_CPU with an empty data directory,
# create the topic (kafka-topics, retried until the broker answers), read
# the broker's CPU time from /proc/PID/stat, run the tool on CLIENT_CPU
# (scripts/kafka-cli, i.e. Kafka's jars; `taskset` covers its JVM), read the
# CPU time again and the peak RSS (VmHWM, since the broker started) from
# /proc/PID/status, stop the broker (SIGTERM, then SIGKILL after 30 s).
# Brokers alternate run by run: fjord, kafka, fjord, kafka, ...
#
# Environment:
#   PAIRS        rounds over BROKERS (default 3)
#   BROKERS      default "fjord kafka"
#   RECORDS      --num-records (default 1000000)
#   WARMUP_RECORDS  --warmup-records: the first N records are left out of
#                the steady-state summary the tool then prints, which is the
#                one the table takes (default 0: no warm-up; JIT and page
#                cache warm-up of a fresh JVM broker then count)
#   RECORD_SIZE  --record-size in bytes (default 1024)
#   THROUGHPUT   --throughput in records/s, -1 = as fast as it goes (default -1)
#   ACKS         acks (default all)
#   IDEMPOTENCE  enable.idempotence (default true, the Java client's default;
#                needs ACKS=all)
#   PARTITIONS   partitions of the topic (default 1)
#   PRODUCER_PROPS  more producer properties, space-separated KEY=VALUE
#                (e.g. "linger.ms=5 batch.size=1048576")
#   FJORD_FLAGS  extra `fjord serve` flags (e.g. --fsync-acks)
#   KAFKA_FLUSH  default | every-message (pairs with FJORD_FLAGS=--fsync-acks)
#   KAFKA_HEAP   Kafka's -Xms/-Xmx (default 1g)
#   FJORD_PORT (19092), KAFKA_PORT (39092; controller on +1),
#   BROKER_CPU (0), CLIENT_CPU (1), KAFKA_CLI_HEAP (the tool's heap, 512m)
#   DATA_ROOT    where per-run data directories go (default target/perf-test-data)
#
# OUTDIR gets: results.md (the table, and every run's summary line),
# runs.tsv (one line per run), <broker>-<round>.txt (the tool's output),
# <broker>-<round>-broker.log, commands.txt (every command line as run, and
# Kafka's JVM command line), kafka-server-<round>.properties and versions.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${1:?usage: scripts/perf-test.sh OUTDIR [-- extra kafka-producer-perf-test args]}
shift
[ "${1:-}" = "--" ] && shift
target=${CARGO_TARGET_DIR:-target}
fjord=$(realpath "$target/release/fjord")
[ -x "$fjord" ] || { echo "perf-test: build fjord first: cargo build --release" >&2; exit 1; }
pairs=${PAIRS:-3}
brokers=${BROKERS:-fjord kafka}
records=${RECORDS:-1000000}
warmup_records=${WARMUP_RECORDS:-0}
record_size=${RECORD_SIZE:-1024}
throughput=${THROUGHPUT:--1}
acks=${ACKS:-all}
idempotence=${IDEMPOTENCE:-true}
partitions=${PARTITIONS:-1}
fport=${FJORD_PORT:-19092}
kport=${KAFKA_PORT:-39092}
bcpu=${BROKER_CPU:-0}
ccpu=${CLIENT_CPU:-1}
kflush=${KAFKA_FLUSH:-default}
kheap=${KAFKA_HEAP:-1g}
topic=perf-test
# Bounds: the broker's first TCP accept, the topic's creation, its stop.
ACCEPT_TIMEOUT_S=60
CREATE_ATTEMPTS=10
STOP_TIMEOUT_S=30
for b in $brokers; do
  case $b in fjord | kafka) ;; *) echo "perf-test: unknown broker '$b' (fjord, kafka)" >&2; exit 2 ;; esac
done
case $kflush in default | every-message) ;; *) echo "perf-test: KAFKA_FLUSH is default or every-message" >&2; exit 2 ;; esac

mkdir -p "$out"
out=$(realpath "$out")
data_root=${DATA_ROOT:-$target/perf-test-data}
mkdir -p "$data_root"
data=$(mktemp -d "$(realpath "$data_root")/run.XXXXXX")
broker_pid=
cleanup() {
  [ -z "$broker_pid" ] || stop_broker
  rm -rf "$data"
}
trap cleanup EXIT

port_of() {
  case $1 in fjord) echo "$fport" ;; kafka) echo "$kport" ;; esac
}

broker_argv() {
  case $1 in
    fjord)
      # shellcheck disable=SC2206 # FJORD_FLAGS holds several flags.
      argv=(taskset -c "$bcpu" "$fjord" serve --data-dir "$data/fjord" --port "$fport"
        --listen 127.0.0.1 --cores 1 --no-pin ${FJORD_FLAGS:-})
      ;;
    kafka)
      argv=("$root/scripts/kafka-peer.sh" run --fresh --data-dir "$data/kafka" --port "$kport"
        --cpus "$bcpu" --flush "$kflush" --heap "$kheap")
      ;;
  esac
}

tcp_accepts() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# User + system CPU seconds of a process, from /proc/PID/stat.
cpu_seconds() {
  local stat rest
  stat=$(cat "/proc/$1/stat")
  rest=${stat##*) }
  # shellcheck disable=SC2086 # split into fields on purpose
  set -- $rest
  # After the command name: state is field 1, utime 12, stime 13.
  echo "${12} ${13} $(getconf CLK_TCK)" | awk '{ printf "%.2f", ($1 + $2) / $3 }'
}

peak_rss_mib() {
  awk '/^VmHWM:/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status"
}

stop_broker() {
  local pid=$broker_pid deadline
  broker_pid=
  kill -TERM "$pid" 2>/dev/null || return 0
  deadline=$((SECONDS + STOP_TIMEOUT_S))
  while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "perf-test: broker pid $pid still alive after ${STOP_TIMEOUT_S}s, SIGKILL" >&2
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
}

perf_argv() {
  local bootstrap=$1
  # shellcheck disable=SC2206 # PRODUCER_PROPS holds several properties.
  local -a props=(acks="$acks" enable.idempotence="$idempotence" ${PRODUCER_PROPS:-})
  argv=(taskset -c "$ccpu" "$root/scripts/kafka-cli" kafka-producer-perf-test
    --bootstrap-server "$bootstrap" --topic "$topic"
    --num-records "$records" --record-size "$record_size" --throughput "$throughput"
    --warmup-records "$warmup_records" --command-property "${props[@]}" "${extra[@]}")
}
extra=("$@")

{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(uname -n), $(uname -sr), $(nproc) CPUs, $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -n1)"
  echo "fjord: $($fjord --version 2>/dev/null || echo '?'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "kafka (broker and kafka-producer-perf-test): Apache Kafka $(scripts/kafka-peer.sh version), $(${JAVA:-java} -version 2>&1 | head -n1)"
  echo "settings: BROKERS='$brokers' PAIRS=$pairs RECORDS=$records WARMUP_RECORDS=$warmup_records RECORD_SIZE=$record_size THROUGHPUT=$throughput ACKS=$acks IDEMPOTENCE=$idempotence PARTITIONS=$partitions PRODUCER_PROPS='${PRODUCER_PROPS:-}' FJORD_FLAGS='${FJORD_FLAGS:-}' KAFKA_FLUSH=$kflush KAFKA_HEAP=$kheap BROKER_CPU=$bcpu CLIENT_CPU=$ccpu"
  echo "extra tool args: ${extra[*]}"
} | tee "$out/versions.txt"
: >"$out/commands.txt"
printf 'broker\tround\trecords\trecords_per_s\tmb_per_s\tavg_ms\tmax_ms\tp50_ms\tp95_ms\tp99_ms\tp999_ms\tbroker_cpu_s\tbroker_peak_rss_mib\n' >"$out/runs.tsv"

for r in $(seq "$pairs"); do
  for b in $brokers; do
    port=$(port_of "$b")
    if tcp_accepts "$port"; then
      echo "perf-test: 127.0.0.1:$port already accepts connections; stop that broker first" >&2
      exit 1
    fi
    rm -rf "${data:?}/$b"
    mkdir -p "$data"
    log="$out/$b-$r-broker.log"
    broker_argv "$b"
    {
      echo "# round $r, $b: broker"
      printf '%q ' "${argv[@]}"
      echo
    } >>"$out/commands.txt"
    echo "== round $r/$pairs: $b"
    # taskset and kafka-peer.sh run both exec, so $! is the broker itself.
    "${argv[@]}" >"$log" 2>&1 </dev/null &
    broker_pid=$!
    deadline=$((SECONDS + ACCEPT_TIMEOUT_S))
    until tcp_accepts "$port"; do
      kill -0 "$broker_pid" 2>/dev/null || { tail -n 40 "$log" >&2; echo "perf-test: $b exited at start" >&2; exit 1; }
      [ "$SECONDS" -lt "$deadline" ] || { echo "perf-test: $b did not listen within ${ACCEPT_TIMEOUT_S}s" >&2; exit 1; }
      sleep 0.2
    done
    created=false
    for _ in $(seq "$CREATE_ATTEMPTS"); do
      if taskset -c "$ccpu" scripts/kafka-cli kafka-topics --bootstrap-server "127.0.0.1:$port" \
        --create --topic "$topic" --partitions "$partitions" --replication-factor 1 >>"$log" 2>&1; then
        created=true
        break
      fi
      sleep 1
    done
    $created || { echo "perf-test: could not create $topic on $b (see $log)" >&2; exit 1; }
    perf_argv "127.0.0.1:$port"
    {
      echo "# round $r, $b: client"
      printf '%q ' "${argv[@]}"
      echo
    } >>"$out/commands.txt"
    cpu0=$(cpu_seconds "$broker_pid")
    "${argv[@]}" 2>&1 | tee "$out/$b-$r.txt" || echo "perf-test: the tool failed ($b, round $r)" >&2
    cpu1=$(cpu_seconds "$broker_pid")
    rss=$(peak_rss_mib "$broker_pid")
    stop_broker
    if [ "$b" = kafka ]; then
      grep '^kafka-peer: command: ' "$log" | tail -n1 |
        sed 's/^kafka-peer: command: /#   the JVM: /' >>"$out/commands.txt" || true
      cp "$data/kafka/server.properties" "$out/kafka-server-$r.properties" 2>/dev/null || true
    fi
    cpu=$(awk -v a="$cpu0" -v b="$cpu1" 'BEGIN { printf "%.2f", b - a }')
    # The tool's last line: "N records sent, R records/sec (M MB/sec), A ms avg
    # latency, X ms max latency, P ms 50th, P ms 95th, P ms 99th, P ms 99.9th."
    # With --warmup-records a "N steady state records sent, ..." line follows;
    # the last line is the one taken.
    summary=$(grep 'records sent' "$out/$b-$r.txt" | tail -n1 | sed 's/ steady state / /' || true)
    fields=$(sed -E 's/^([0-9]+) records sent, ([0-9.]+) records\/sec \(([0-9.]+) MB\/sec\), ([0-9.]+) ms avg latency, ([0-9.]+) ms max latency, ([0-9.]+) ms 50th, ([0-9.]+) ms 95th, ([0-9.]+) ms 99th, ([0-9.]+) ms 99\.9th\.?$/\1\t\2\t\3\t\4\t\5\t\6\t\7\t\8\t\9/' <<<"$summary")
    if [ -z "$summary" ] || [ "$fields" = "$summary" ]; then
      echo "perf-test: no summary line from the tool ($b, round $r)" >&2
      fields=$(printf -- '-\t-\t-\t-\t-\t-\t-\t-\t-')
    fi
    printf '%s\t%s\t%s\t%s\t%s\n' "$b" "$r" "$fields" "$cpu" "$rss" >>"$out/runs.tsv"
    echo "perf-test: $b round $r: broker CPU ${cpu} s during the test, peak RSS ${rss} MiB"
  done
done

python3 - "$out" "$record_size" "$records" $brokers >"$out/results.md" <<'EOF'
import csv, statistics, sys

out, record_size, total_records, order = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
with open(f"{out}/runs.tsv") as f:
    runs = list(csv.DictReader(f, delimiter="\t"))
with open(f"{out}/versions.txt") as f:
    versions = f.read().strip()


def num(v):
    try:
        return float(v)
    except ValueError:
        return None


def cpu_per_gb(r):
    cpu = num(r["broker_cpu_s"])
    if cpu is None or total_records == 0:
        return None
    return cpu / (total_records * record_size / 1e9)


cols = [
    ("records/s", lambda r: num(r["records_per_s"]), "{:,.0f}"),
    ("MB/s", lambda r: num(r["mb_per_s"]), "{:.2f}"),
    ("avg ms", lambda r: num(r["avg_ms"]), "{:.2f}"),
    ("p50 ms", lambda r: num(r["p50_ms"]), "{:.0f}"),
    ("p95 ms", lambda r: num(r["p95_ms"]), "{:.0f}"),
    ("p99 ms", lambda r: num(r["p99_ms"]), "{:.0f}"),
    ("p99.9 ms", lambda r: num(r["p999_ms"]), "{:.0f}"),
    ("max ms", lambda r: num(r["max_ms"]), "{:.0f}"),
    ("broker CPU s", lambda r: num(r["broker_cpu_s"]), "{:.2f}"),
    ("broker CPU s/GB", cpu_per_gb, "{:.3f}"),
    ("broker peak RSS MiB", lambda r: num(r["broker_peak_rss_mib"]), "{:.0f}"),
]


def cell(values, fmt):
    values = sorted(v for v in values if v is not None)
    if not values:
        return "–"
    return " / ".join(fmt.format(v) for v in (values[0], statistics.median(values), values[-1]))


print("# kafka-producer-perf-test: fjord and Kafka\n")
print("```\n" + versions + "\n```\n")
print("Cells are min / median / max over the runs. Figures are from the tool's")
print("last summary line (the steady-state one when WARMUP_RECORDS is set);")
print("latencies are send to acknowledgement, per record. Broker CPU is the")
print("user + system seconds of the broker process while the tool ran, and per")
print("GB of all the records it sent (warm-up records included); peak RSS is")
print("the broker's VmHWM since it started.\n")
print("| broker | runs | " + " | ".join(c[0] for c in cols) + " |")
print("|---|---|" + "---|" * len(cols))
labels = [b for b in order if any(r["broker"] == b for r in runs)]
for b in labels:
    rs = [r for r in runs if r["broker"] == b]
    print(f"| {b} | {len(rs)} | " + " | ".join(cell([g(r) for r in rs], fmt) for _, g, fmt in cols) + " |")
print("\n## Runs\n")
print("| broker | round | tool's summary line | broker CPU s | broker peak RSS MiB |")
print("|---|---|---|---|---|")
for r in runs:
    try:
        with open(f"{out}/{r['broker']}-{r['round']}.txt") as f:
            line = [l.strip() for l in f if "records sent" in l][-1]
    except (OSError, IndexError):
        line = "(no summary line)"
    print(f"| {r['broker']} | {r['round']} | {line} | {r['broker_cpu_s']} | {r['broker_peak_rss_mib']} |")
EOF
echo "perf-test: table in $out/results.md"
cat "$out/results.md"
