#!/usr/bin/env bash
# The SSD streaming table (issue 48) in one command: decode speed against the disk bound that
# `swiftlet bench` measures in the same run, for both full-size shapes, random and replayed
# routing, four cache sizes, with and without next-layer prediction, exact and lossy.
#
#   bench/ssd_figures.sh [DIR] [OUT]
#
# DIR  where the synthetic containers are made or found: q35b.qpack (Qwen3.5-35B-A3B shape, ~20
#      GB) and next80b.qpack (Qwen3-Next-80B-A3B shape, ~45 GB), as bench/streaming_bench.sh names
#      them (default: models/bench)
# OUT  where the results go (default: build/ssd-figures): OUT/<shape>-<routing>.json (swiftlet
#      bench --json), OUT/table.md (one row per setting) and OUT/decode.trace
#
# Environment:
#   SHAPES   which shapes, space-separated (default "35b 80b")
#   DECODE   decoded tokens per setting (default 48); PROMPT prompt tokens (default 16)
#   TRACE    a --trace-experts file to replay (default: OUT/decode.trace, made here: the trained
#            model models/toy.qpack answering 20 dictionary questions with --predict-next 1)
#   LOSSY    lossy --on-miss settings, comma-separated (default skip:0.05,skip:0.1,low-bit:0.2,low-bit);
#            a low-bit setting adds low-bit copies to a container that has none
#   MISS_COPY_BITS  their bits, 2 or 3 (default 2)
# Cache sizes: one token's experts (layers x top-k x one expert's bytes: 0.57 GB at 35B, 0.85 GB
# at 80B), --ram-budget 2.6G (3G at 80B, whose dense part is larger) and 8G, and the default
# sized from this machine. Exact runs at every size with prediction off and one layer ahead; the
# lossy settings at the one-token cache with prediction one layer ahead. Each row says `exact` or
# `lossy (...)`. Every run is disk-bound and niced; the whole table takes an hour or more on
# the 2-core development machine (DECODE=16 for a quick look).
set -euo pipefail
cd "$(dirname "$0")/.."

dir=${1:-models/bench} out=${2:-build/ssd-figures}
shapes=${SHAPES:-35b 80b} decode=${DECODE:-48} prompt=${PROMPT:-16} lossy=${LOSSY:-skip:0.05,skip:0.1,low-bit:0.2,low-bit} copy_bits=${MISS_COPY_BITS:-2}
bin=build/bin
[[ -x $bin/swiftlet && -x $bin/swiftlet-repack ]] || { echo "build first: scripts/build.sh" >&2; exit 1; }
mkdir -p "$dir" "$out"

trace=${TRACE:-$out/decode.trace}
if [[ ! -f $trace ]]; then
  [[ -z ${TRACE:-} ]] || { echo "no trace '$trace'" >&2; exit 1; }
  echo "== the decode trace: models/toy.qpack answering 20 questions (--predict-next 1)"
  questions=()
  for w in keel lantern meadow quarrel ransom saddle tavern thimble valley wander yeoman zeal anchor \
           bramble candle dagger ember falcon garland hammock; do
    questions+=("What does the word \"$w\" mean?")
  done
  nice "$bin/swiftlet" chat models/toy.qpack -q -n 128 --temperature 0.7 --seed 1 --predict-next 1 \
    --trace-experts "$trace.tmp" "${questions[@]}" > /dev/null
  mv "$trace.tmp" "$trace"
fi

for shape in $shapes; do
  case $shape in
    35b) preset=qwen3.5-35b-a3b name=q35b budget=2.6G ;;
    80b) preset=qwen3-next-80b-a3b name=next80b budget=3G ;;
    *) echo "unknown shape '$shape' (35b or 80b)" >&2; exit 2 ;;
  esac
  container=$dir/$name.qpack
  if [[ ! -f $container/manifest.json ]]; then
    echo "== creating $container (synthetic $preset)"
    nice "$bin/swiftlet-repack" --synthetic "$preset" --output "$container"
  fi
  if [[ $lossy == *low-bit* ]] && ! grep -q '"miss_copies/layout.json"' "$container/manifest.json"; then
    echo "== adding $copy_bits-bit copies of the experts to $container"
    nice "$bin/swiftlet-repack" --add-miss-copy "$container" --miss-copy-bits "$copy_bits" -q
  fi
  # One token's experts: layers x top-k x the stride of an expert's blob.
  token=$(python3 - "$container" <<'PY'
import json, sys
c = json.load(open(sys.argv[1] + "/config.json"))
text = c.get("text_config", c)
layout = json.load(open(sys.argv[1] + "/packed_experts/layout.json"))
print(f'{text["num_hidden_layers"] * text["num_experts_per_tok"] * layout["expertStride"] / 1e6:.0f}M')
PY
)
  for routing in random replayed; do
    extra=()
    [[ $routing == replayed ]] && extra=(--routing-trace "$trace")
    json=$out/$shape-$routing.json
    echo "== $shape, $routing routing: exact at $token (one token), budget:$budget, budget:8G, default"
    nice "$bin/swiftlet" bench "$container" --cache "$token,budget:$budget,budget:8G,default" --io-modes uring \
      --predict off,1 --prompt-tokens "$prompt" --decode "$decode" --json "${extra[@]}" > "$json.exact"
    echo "== $shape, $routing routing: $lossy at $token, predict 1"
    nice "$bin/swiftlet" bench "$container" --cache "$token" --io-modes uring --predict 1 --on-miss "$lossy" \
      --prompt-tokens "$prompt" --decode "$decode" --json "${extra[@]}" > "$json.lossy"
    python3 - "$json.exact" "$json.lossy" "$json" <<'PY'
import json, sys
runs = [json.load(open(p)) for p in sys.argv[1:3]]
merged = dict(runs[0])
merged["rows"] = runs[0]["rows"] + runs[1]["rows"]
json.dump(merged, open(sys.argv[3], "w"), indent=1)
PY
    rm -f "$json.exact" "$json.lossy"
  done
done

python3 - "$out" $shapes <<'PY' | tee "$out/table.md"
import json, os, sys
out, shapes = sys.argv[1], sys.argv[2:]
print("| shape | routing | cache | predict | mode | decode tok/s | disk bound tok/s | % of the disk bound "
      "| MB read / token | hit % |")
print("|---|---|---|---|---|---|---|---|---|---|")
for shape in shapes:
    for routing in ("random", "replayed"):
        path = os.path.join(out, f"{shape}-{routing}.json")
        if not os.path.exists(path):
            continue
        for r in json.load(open(path))["rows"]:
            cache = r["cache"]
            if cache == "default":
                cache = f'default ({r["cache_budget"] / 1e9:.2f} GB)'
            looked = r["hits"] + r["misses"]
            print(f'| {shape} | {routing} | {cache} | {r["predict"] or "off"} | {r["mode"]} '
                  f'| {r["decode_tok_s"]:.2f} | {r["disk_bound_tok_s"]:.2f} '
                  f'| {100 * r["decode_tok_s"] / r["disk_bound_tok_s"]:.1f} '
                  f'| {r["bytes_read"] / r["decode_tokens"] / 1e6:.1f} '
                  f'| {100 * r["hits"] / max(looked, 1):.1f} |')
PY
