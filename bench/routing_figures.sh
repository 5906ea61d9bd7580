#!/usr/bin/env bash
# Real routing at full size (issue 20, "Real routing"): a trained model's expert choices drive
# the cache simulator and a full-size synthetic container, next to the container's own random
# routing, in one run.
#
#   bench/routing_figures.sh MODEL TRACE CONTAINER [OUT]
#
# MODEL      the trained .qpack (e.g. models/toy.qpack): answers 40 dictionary questions (chat)
#            to record a decode trace with its next-layer guesses (--predict-next 1)
# TRACE      the model's trace of the test text, written by
#            swiftlet perplexity MODEL --file test.txt --chunks 24 --trace-experts TRACE
# CONTAINER  a full-size synthetic container (swiftlet-repack --synthetic qwen3.5-35b-a3b or
#            qwen3-next-80b-a3b)
# OUT        where the results go (default: build/routing-figures)
#
# Environment: BUDGET (--ram-budget of the second cache setting; default 2.6G, use 3G for the
# 80B shape), DECODE (decoded tokens per configuration, default 48), QUESTIONS (a file of user
# turns for the decode trace; default: 40 questions built in below).
#
# Writes OUT/cachesim.txt and OUT/hits.csv (hit rate against cache size, TRACE),
# OUT/decode_cachesim.txt (the same and the next-layer prediction figures for the decode trace),
# OUT/hits.png when matplotlib is there, and OUT/bench.txt: decode tok/s, MB read per token and
# hit rate at the default cache and at BUDGET, for random routing, TRACE, and the decode trace
# (with and without replaying its guesses). Everything runs niced: the container runs are
# disk-bound and take a few minutes each.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $# -lt 3 ]]; then
  sed -n '2,19p' "$0" >&2
  exit 2
fi
model=$1 trace=$2 container=$3 out=${4:-build/routing-figures}
budget=${BUDGET:-2.6G} decode=${DECODE:-48}
bin=build/bin/swiftlet
[[ -x $bin ]] || { echo "build first: scripts/build.sh" >&2; exit 1; }
[[ -f $trace ]] || { echo "no trace '$trace': make it with swiftlet perplexity MODEL --file test.txt --chunks 24 --trace-experts $trace" >&2; exit 1; }
[[ -f $container/manifest.json ]] || { echo "'$container' is not a .qpack container" >&2; exit 1; }
mkdir -p "$out"
sizes=3.125,6.25,10,15,20,30,40,60  # 3.125%: one token's experts (top-8 of 256)

echo "== cache simulator on $trace"
nice "$bin" cachesim "$trace" --sizes $sizes | tee "$out/cachesim.txt"
nice "$bin" cachesim "$trace" --sizes $sizes --csv > "$out/hits.csv"
if /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  tools/plot_cachesim.py "$out/hits.csv" "$out/hits.png"
fi

echo "== decode trace of $model (chat, --predict-next 1)"
questions=()
if [[ -n ${QUESTIONS:-} ]]; then
  mapfile -t questions < "$QUESTIONS"
else
  for w in heteronym accept sculling inactivate porkfish irritably crow goggle isopodous keel rectify \
           harbour lantern meadow quarrel ransom saddle tavern thimble valley wander yeoman zeal anchor \
           bramble candle dagger ember falcon garland hammock ivory jasmine kettle ledger marrow nectar \
           orchard pebble quiver; do
    questions+=("What does the word \"$w\" mean?")
  done
fi
nice "$bin" chat "$model" -q -n 128 --temperature 0.7 --seed 1 --predict-next 1 \
  --trace-experts "$out/decode.trace" "${questions[@]}" > "$out/decode_answers.txt"
nice "$bin" cachesim "$out/decode.trace" --sizes $sizes | tee "$out/decode_cachesim.txt"

echo "== $container: random routing, $trace, and the decode trace"
run_bench() {  # label, extra arguments
  echo "-- $1"
  nice "$bin" bench "$container" --cache default,budget:$budget --io-modes uring --prompt-tokens 16 \
    --decode "$decode" "${@:2}"
}
{
  run_bench "random routing (the container's own router)" --predict off
  run_bench "replayed: $trace" --predict off --routing-trace "$trace"
  run_bench "replayed: the decode trace, with and without its next-layer guesses" --predict off,1 \
    --routing-trace "$out/decode.trace"
} 2>&1 | tee "$out/bench.txt"
