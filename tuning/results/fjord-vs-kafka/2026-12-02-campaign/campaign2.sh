#!/usr/bin/env bash
# Second part of the 2026-12-02 campaign (after the bench's ListOffsets retry fix).
set -uo pipefail
cd "$(dirname "$0")/../../../.."
out=tuning/results/fjord-vs-kafka/2026-12-02-campaign
w=workloads
step() { echo "=== $(date -u +%T) $*" | tee -a "$out/campaign.log"; }
# (Run first at 17:17; the script then stopped at a quoting error in the
# next line, since fixed, and the rest ran with SKIP_16P=1 at 17:32.)
if [ -z "${SKIP_16P:-}" ]; then
  step saturating 16 partitions again, the bench retrying ListOffsets
  REPEAT=3 PEERS=kafka scripts/compare.sh $out/saturate-16p $w/saturate-1kb-16p.toml
fi
step fjord alone, saturating, this binary against the first one of campaign.sh
REPEAT=3 PEERS= scripts/compare.sh $out/saturate-1kb-new-binary $w/saturate-1kb.toml
step fjord alone, saturating, an 8 MiB tail cache
REPEAT=3 PEERS= FJORD_FLAGS="--tail-cache-bytes 8388608" scripts/compare.sh $out/tail-cache-8mib $w/saturate-1kb.toml
step fsync-acks at 2,000 msg/s
REPEAT=3 PEERS=kafka FJORD_FLAGS=--fsync-acks KAFKA_FLUSH=every-message scripts/compare.sh $out/fsync-2k $w/latency-100b-2k-warm60.toml
step done
