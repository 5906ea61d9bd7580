#!/usr/bin/env bash
# Batched decoding figures (issue 26, CPU): `swiftlet bench --streams` on a full-size container,
# every batch size against one stream in the same process.
#
#   bench/streams_figures.sh CONTAINER [TRACE] [OUT]
#
# CONTAINER  a full-size synthetic container (swiftlet-repack --synthetic qwen3.5-35b-a3b)
# TRACE      optional: a routing trace of a real model to replay (swiftlet perplexity MODEL --file
#            TEXT --chunks 24 --trace-experts TRACE); each stream replays its own region of it
# OUT        where the results go (default: build/streams-figures)
#
# Environment: THREADS (default 2), STREAMS (batch sizes, default 1,2,4), DECODE (steps per batch
# size, default 32).
#
# Writes OUT/memory.txt (all experts in memory: --cache all --warm), OUT/disk.txt (the default
# cache, random routing, next-layer prediction off and on) and OUT/disk-trace.txt (the same with
# TRACE). The page cache is dropped before each disk-bound run when this runs as root (expert
# reads use O_DIRECT and miss it anyway; the dense weights are mapped and would stay warm).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $# -lt 1 ]]; then
  sed -n '2,19p' "$0" >&2
  exit 2
fi
container=$1 trace=${2:-} out=${3:-build/streams-figures}
threads=${THREADS:-2} streams=${STREAMS:-1,2,4} decode=${DECODE:-32}
bin=build/bin/swiftlet
[[ -x $bin ]] || { echo "build first: ninja -C build swiftlet-cli" >&2; exit 1; }
[[ -f $container/manifest.json ]] || { echo "'$container' is not a .qpack container" >&2; exit 1; }
[[ -z $trace || -f $trace ]] || { echo "no trace '$trace'" >&2; exit 1; }
mkdir -p "$out"

drop_caches() {
  sync
  if echo 3 2>/dev/null > /proc/sys/vm/drop_caches; then
    echo "(page cache dropped)"
  else
    echo "(page cache not dropped: needs root)"
  fi
}

common=(--streams "$streams" --threads "$threads" --decode "$decode" --io-modes uring --disk-seconds 2)

echo "== all experts in memory"
"$bin" bench "$container" "${common[@]}" --cache all --warm --predict off | tee "$out/memory.txt"

echo "== default cache, random routing"
drop_caches | tee "$out/disk.txt"
"$bin" bench "$container" "${common[@]}" --predict off,1 | tee -a "$out/disk.txt"

if [[ -n $trace ]]; then
  echo "== default cache, routing replayed from $trace"
  drop_caches | tee "$out/disk-trace.txt"
  "$bin" bench "$container" "${common[@]}" --predict off --routing-trace "$trace" | tee -a "$out/disk-trace.txt"
fi
