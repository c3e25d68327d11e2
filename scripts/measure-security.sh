#!/usr/bin/env bash
# What security costs the data path (issue 28): `fjord bench` on the latency
# workload (workloads/latency-100b-10k.toml) and the saturating one
# (workloads/saturate-1kb.toml) against fjord set up three ways, alternating
# set-ups within each round, ROUNDS rounds:
#
#   plaintext       a PLAINTEXT listener, no authorizer
#   sasl_ssl        a SASL_SSL listener (TLS with a throw-away CA made here
#                   with the openssl CLI; SCRAM-SHA-256 user `bench`)
#   sasl_ssl_acls   the same with `--authorizer standard` and only Kafka's
#                   minimal ACLs for the bench user (what `kafka-acls
#                   --producer --consumer` grants: WRITE, DESCRIBE, CREATE
#                   and READ on the PREFIXED topic `bench-`, READ on the
#                   PREFIXED group `fjord-bench-`)
#
# sasl_plaintext and sasl_plaintext_acls are the same without TLS (SETUPS=...).
# Every run starts a fresh broker (`--broker-cmd`, so its CPU seconds and
# peak RSS are recorded) on a copy of its set-up's data directory, which
# holds the SCRAM user (`fjord scram add`) and the ACLs (created once with
# Kafka's `kafka-acls` while ANONYMOUS on the PLAINTEXT listener was a super
# user; the measured broker has no super user). Every client of the bench,
# including the admin client that creates the topic, gets the security
# settings through `--client-config`.
#
# Raw results (one JSON per run, console.log, the set-up logs) go to OUTDIR
# (default tuning/results/security/<UTC time>); summary.md there has min /
# median / max of acknowledged throughput, publish p99 and the rest per
# workload and set-up (scripts/lib/bench-summary.py), also printed.
#
# usage: scripts/measure-security.sh [OUTDIR]
# Environment: ROUNDS (3), SETUPS ("plaintext sasl_ssl sasl_ssl_acls"),
#   WORKLOADS ("latency-100b-10k saturate-1kb"), MECHANISM (SCRAM-SHA-256 or
#   PLAIN), DURATION / WARMUP (override the workloads', e.g. 2s for a smoke
#   run), FJORD_BIN (default target/release/fjord, built first with
#   `cargo build --release --features tools`), FJORD_PORT (29392: PLAINTEXT
#   on it, the SASL listener on it + 10), BROKER_CPU (0), CLIENT_CPU (1).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-tuning/results/security/$(date -u +%Y%m%dT%H%M%SZ)}
rounds=${ROUNDS:-3}
setups=${SETUPS:-plaintext sasl_ssl sasl_ssl_acls}
workloads=${WORKLOADS:-latency-100b-10k saturate-1kb}
mechanism=${MECHANISM:-SCRAM-SHA-256}
port=${FJORD_PORT:-29392}
sasl_port=$((port + 10))
user=bench
password=bench-secret-$RANDOM$RANDOM
if [ -z "${FJORD_BIN:-}" ]; then
    cargo build --release --features tools
    FJORD_BIN=${CARGO_TARGET_DIR:-target}/release/fjord
fi
bin=$FJORD_BIN
mkdir -p "$out"
work=$(mktemp -d)
setup_pid=
cleanup() {
    if [ -n "$setup_pid" ]; then kill -TERM "$setup_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

case $mechanism in
SCRAM-SHA-256 | SCRAM-SHA-512 | PLAIN) ;;
*) echo "MECHANISM must be SCRAM-SHA-256, SCRAM-SHA-512 or PLAIN" >&2; exit 2 ;;
esac
# PLAIN users live in the same salted credential store as SCRAM ones.
store_mechanism=$mechanism
[ "$mechanism" = PLAIN ] && store_mechanism=SCRAM-SHA-256

# A CA and a server certificate for 127.0.0.1 and localhost (ECDSA P-256,
# PKCS#8 keys), valid two days: nothing here outlives the script.
pki=$work/pki
make_pki() {
    mkdir -p "$pki"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
        -subj /CN=fjord-bench-ca -keyout "$pki/ca.key" -out "$pki/ca.pem" 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=localhost \
        -keyout "$pki/server.key" -out "$pki/server.csr" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' > "$pki/ext"
    openssl x509 -req -in "$pki/server.csr" -CA "$pki/ca.pem" -CAkey "$pki/ca.key" \
        -CAcreateserial -days 2 -extfile "$pki/ext" -out "$pki/server.pem" 2>/dev/null
}

# The `fjord serve` flags of set-up $1 (after --data-dir).
serve_flags() {
    local f="--port $port --listen 127.0.0.1 --cores 1 --no-pin --metrics-listen none"
    case $1 in
    sasl_ssl*)
        f="$f --listener SASL_SSL://127.0.0.1:$sasl_port --sasl-enabled-mechanisms $mechanism"
        f="$f --tls-cert $pki/server.pem --tls-key $pki/server.key" ;;
    sasl_plaintext*)
        f="$f --listener SASL_PLAINTEXT://127.0.0.1:$sasl_port --sasl-enabled-mechanisms $mechanism" ;;
    esac
    case $1 in *_acls) f="$f --authorizer standard" ;; esac
    echo "$f"
}

# `fjord bench` flags of set-up $1: the bootstrap and every client's security.
bench_flags() {
    case $1 in
    plaintext) echo "--bootstrap 127.0.0.1:$port" ;;
    sasl_*)
        local proto=SASL_PLAINTEXT
        case $1 in sasl_ssl*) proto=SASL_SSL ;; esac
        echo "--bootstrap 127.0.0.1:$sasl_port --client-config security.protocol=$proto" \
            "--client-config sasl.mechanisms=$mechanism --client-config sasl.username=$user" \
            "--client-config sasl.password=$password"
        [ $proto = SASL_SSL ] && echo "--client-config ssl.ca.location=$pki/ca.pem"
        ;;
    esac
}

# The data directory every run of set-up $1 starts from.
prepare() {
    local s=$1 dir=$work/template-$1
    mkdir -p "$dir"
    case $s in sasl_*)
        "$bin" scram add --data-dir "$dir" --user "$user" --mechanism "$store_mechanism" \
            --password "$password" > "$out/setup-$s.log" 2>&1 ;;
    esac
    case $s in *_acls)
        # shellcheck disable=SC2046
        "$bin" serve --data-dir "$dir" $(serve_flags "$s") --super-users User:ANONYMOUS \
            > "$work/setup-serve.log" 2>&1 &
        setup_pid=$!
        until grep -q '^fjord: ready' "$work/setup-serve.log" 2>/dev/null; do
            kill -0 "$setup_pid" 2>/dev/null || { cat "$work/setup-serve.log" >&2; exit 1; }
            sleep 0.1
        done
        scripts/kafka-cli kafka-acls --bootstrap-server "127.0.0.1:$port" --add \
            --allow-principal "User:$user" --producer --consumer \
            --resource-pattern-type prefixed --topic bench- --group fjord-bench- \
            >> "$out/setup-$s.log" 2>&1
        scripts/kafka-cli kafka-acls --bootstrap-server "127.0.0.1:$port" --list \
            >> "$out/setup-$s.log" 2>&1
        kill -TERM "$setup_pid"
        wait "$setup_pid" 2>/dev/null || true
        setup_pid=
        ;;
    esac
}

case " $setups " in *" sasl_ssl"*) make_pki ;; esac
for s in $setups; do
    prepare "$s"
done
{
    echo "# $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) $(nproc) cores; $bin;"
    echo "# rounds=$rounds setups=[$setups] workloads=[$workloads] mechanism=$mechanism" \
        "duration=${DURATION:-workload's} warmup=${WARMUP:-workload's}"
} | tee "$out/console.log"
overrides=()
[ -n "${DURATION:-}" ] && overrides+=(--duration "$DURATION")
[ -n "${WARMUP:-}" ] && overrides+=(--warmup "$WARMUP")
for r in $(seq "$rounds"); do
    for w in $workloads; do
        for s in $setups; do
            data=$work/run
            rm -rf "$data"
            cp -a "$work/template-$s" "$data"
            echo "== round $r $w $s" | tee -a "$out/console.log"
            # shellcheck disable=SC2046
            "$bin" bench --workload "workloads/$w.toml" --label "$s" --name "$w" \
                --output "$out" --client-cores "${CLIENT_CPU:-1}" "${overrides[@]}" \
                $(bench_flags "$s") \
                --broker-cmd "taskset -c ${BROKER_CPU:-0} $bin serve --data-dir $data $(serve_flags "$s")" \
                2>&1 | grep -v '^\[' | tee -a "$out/console.log"
        done
    done
done
rm -rf "$work/run"
# shellcheck disable=SC2086
python3 scripts/lib/bench-summary.py "$out" $setups | tee "$out/summary.md"
