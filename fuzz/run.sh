#!/usr/bin/env bash
# Runs fjord's fuzz targets one after another, each for the same time, on one
# core at the lowest priority, and prints one summary line per target.
#
#   fuzz/run.sh SECONDS [TARGET...]     (all targets when none is named)
#
# Corpora grow in fuzz/corpus/<target>/ (seeded by fuzz/seeds.py when
# empty), crashes land in fuzz/artifacts/<target>/, libFuzzer's log in
# fuzz/logs/<target>/fuzz-0.log. Needs the nightly toolchain and cargo-fuzz
# (`cargo install cargo-fuzz`). See fuzz/README.md.
set -euo pipefail

cd "$(dirname "$0")"
FUZZ_DIR=$(pwd)
SECONDS_PER_TARGET=${1:?usage: fuzz/run.sh SECONDS [TARGET...]}
shift
ALL_TARGETS=(request_frame produce_decode fetch_encode segment_recovery index_files
  checkpoint producer_snapshot metadata_log group_records txn_records)
if [ "$#" -gt 0 ]; then TARGETS=("$@"); else TARGETS=("${ALL_TARGETS[@]}"); fi

# Longest input per target, in bytes: room for a few batches or records,
# small enough that one execution stays well under a millisecond or two.
declare -A MAX_LEN_BYTES=(
  [request_frame]=8192 [produce_decode]=16384 [fetch_encode]=4096
  [segment_recovery]=32768 [index_files]=4096 [checkpoint]=4096
  [producer_snapshot]=4096 [metadata_log]=4096 [group_records]=2048
  [txn_records]=2048)
RSS_LIMIT_MB=2048

# librdkafka's configure links test programs against the zlib that cc-rs
# built with the sanitizer flags it inherits from RUSTFLAGS; without the
# sanitizer runtime on those links every configure check fails.
export LDFLAGS="-fsanitize=address"

if [ ! -d corpus ]; then python3 seeds.py; fi
for t in "${TARGETS[@]}"; do
  mkdir -p "corpus/$t" "artifacts/$t" "logs/$t"
  (
    cd "logs/$t"
    rm -f fuzz-0.log
    nice -n 19 cargo +nightly fuzz run --fuzz-dir "$FUZZ_DIR" "$t" "$FUZZ_DIR/corpus/$t" -- \
      -jobs=1 -workers=1 -max_total_time="$SECONDS_PER_TARGET" \
      -rss_limit_mb="$RSS_LIMIT_MB" -max_len="${MAX_LEN_BYTES[$t]}" \
      -artifact_prefix="$FUZZ_DIR/artifacts/$t/" >run.log 2>&1 || true
  )
  log="logs/$t/fuzz-0.log"
  files=$(find "corpus/$t" -type f | wc -l)
  bytes=$(find "corpus/$t" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
  crashes=$(find "artifacts/$t" -type f | wc -l)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  done_line=$(grep -E '^Done [0-9]+ runs' "$log" | tail -1 || true)
  echo "$t: corpus $files files / $bytes bytes; artifacts $crashes; last: $last; $done_line"
done
