#!/usr/bin/env bash
# The quality cost of GGUF types, and of re-quantising them into a container, on the trained model:
# models/toy.qpack written as an F32 GGUF (swiftlet_write_gguf), quantised by llama.cpp's
# llama-quantize into each type, converted with swiftlet-repack --from-gguf at --bits 16 (the
# file's own weights, dequantised), 8 and 4, and scored with swiftlet perplexity on the test slice:
# perplexity, and KL divergence / top-1 agreement (--compare-logits) of each GGUF against the
# container it was written from, and of each re-quantisation against its GGUF.
#
#   bench/gguf_quality.sh LLAMA_QUANTIZE [OUT]      (LLAMA_QUANTIZE: a llama-quantize binary)
# The trained model's rows are 128 values wide, so llama-quantize stores the K and IQ4_XS types'
# matrices in its fallbacks (Q5_0, Q5_1, Q8_0, IQ4_NL, ...): the "matrices" column says which.
# Environment: TYPES (default "Q8_0 Q6_K Q5_K_M Q4_K_M Q4_1 Q4_0"), BIN (default build/bin; a build
# with the tests, for swiftlet_write_gguf),
# BACKEND (default reference: the scalar fp32 path, so that only the weights differ; ~20 min).
set -euo pipefail
cd "$(dirname "$0")/.."
quantize=$1 out=${2:-build/gguf-quality}
bin=${BIN:-build/bin}
backend=${BACKEND:-reference}
TYPES=${TYPES:-"Q8_0 Q6_K Q5_K_M Q4_K_M Q4_1 Q4_0"}
text=tests/data/trained/test_slice.txt
mkdir -p "$out"
# MODEL [--save-logits F | --compare-logits F]: "ppl | KL, top-1" (the second part "-" without a comparison)
score() {
  "$bin/swiftlet" perplexity "$1" --file "$text" --ctx 512 --backend "$backend" --json "${@:2}" 2>/dev/null | python3 -c '
import json, sys
j = json.load(sys.stdin)
c = j.get("compare")
kl = "%.5f, %.1f%%" % (c["kl_mean"], 100 * c["top1_agreement"]) if c else "-"
print("%.3f | %s" % (j["ppl"], kl))'
}
"$bin/swiftlet_write_gguf" models/toy.qpack "$out/toy-F32.gguf" --tokenizer
base=$(score models/toy.qpack --save-logits "$out/container.lp")
echo "| GGUF | matrices | --bits 16: ppl | KL, top-1 vs the container | --bits 8: ppl | KL, top-1 vs the GGUF | --bits 4: ppl | KL, top-1 vs the GGUF |" > "$out/table.md"
echo "|---|---|---|---|---|---|---|---|" >> "$out/table.md"
echo "| (the container) | | ${base%% |*} | | | | | |" >> "$out/table.md"
for t in F32 $TYPES; do
  g="$out/toy-$t.gguf"
  mats=F32
  if [ "$t" != F32 ]; then
    "$quantize" "$out/toy-F32.gguf" "$g" "$t" >"$out/quantize-$t.log" 2>&1
    mats=$(grep -oE "converting to [a-z0-9_]+" "$out/quantize-$t.log" | sort | uniq -c | sort -rn |
      awk '{printf "%s%s %s", n++ ? ", " : "", $1, toupper($4)}')
  fi
  row="| $t | $mats"
  for bits in 16 8 4; do
    "$bin/swiftlet-repack" --from-gguf "$g" --bits $bits --output "$out/m.qpack" --force --quiet >/dev/null
    if [ $bits = 16 ]; then
      row="$row | $(score "$out/m.qpack" --compare-logits "$out/container.lp")"
      score "$out/m.qpack" --save-logits "$out/gguf.lp" >/dev/null
    else
      row="$row | $(score "$out/m.qpack" --compare-logits "$out/gguf.lp")"
    fi
  done
  echo "$row |" >> "$out/table.md"
  [ "$t" = F32 ] || rm -f "$g"
done
rm -rf "$out/m.qpack" "$out/"*.lp "$out/toy-F32.gguf"
cat "$out/table.md"
