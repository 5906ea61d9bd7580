#!/usr/bin/env bash
# Routing traces of the trained model for choosing the expert cache's policy and checking it on
# traces it was not tuned on (docs/routing-trace.md, "Cache policy"), and the cache simulator on
# each of them at the sizes of the table there.
#
#   bench/cache_policy_traces.sh [OUT]          (default build/cache-policy)
#
# Writes OUT/<name>.trace for five traces of models/toy.qpack and OUT/<name>.txt, OUT/<name>.csv
# (swiftlet cachesim: the engine's policy lfu, lfu-global, lru, per-layer pools and Belady):
#   tuned on:   chat-dict-a  20 dictionary questions, one chat, decoded (--predict-next 1)
#               text-test    the test split's slice in tests/data/trained/test_slice.txt (perplexity)
#   checked on: chat-dict-b  20 other dictionary questions
#               chat-bible   20 questions about Bible verses
#               text-gpl     the GPL version 3 (/usr/share/common-licenses/GPL-3), text the model did
#                            not train on (perplexity)
# Each takes seconds on two cores; the traces are deterministic (greedy decoding, fixed texts).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/cache-policy}
bin=build/bin/swiftlet
model=models/toy.qpack
[[ -x $bin ]] || { echo "build first: ninja -C build swiftlet" >&2; exit 1; }
mkdir -p "$out"
sizes=3.125,6.25,10,20

chat_trace() {  # name, questions...
  local name=$1
  shift
  nice "$bin" chat "$model" -q -n 96 --greedy --predict-next 1 --trace-experts "$out/$name.trace" "$@" \
    > "$out/$name.answers.txt"
}
text_trace() {  # name, text file
  nice "$bin" perplexity "$model" --file "$2" --ctx 512 --trace-experts "$out/$1.trace" > "$out/$1.perplexity.txt"
}

dict=()
for w in heteronym accept sculling inactivate porkfish irritably crow goggle isopodous keel rectify \
         harbour lantern meadow quarrel ransom saddle tavern thimble valley; do
  dict+=("What does the word \"$w\" mean?")
done
chat_trace chat-dict-a "${dict[@]}"
dict=()
for w in wander yeoman zeal anchor bramble candle dagger ember falcon garland hammock ivory jasmine \
         kettle ledger marrow nectar orchard pebble quiver; do
  dict+=("What does the word \"$w\" mean?")
done
chat_trace chat-dict-b "${dict[@]}"
verses=()
for v in "Genesis 1:3" "Exodus 20:13" "Psalms 23:1" "Proverbs 3:5" "Isaiah 40:31" "Matthew 5:9" \
         "John 3:16" "Romans 8:28" "Ruth 1:16" "Job 1:21" "Ecclesiastes 3:1" "Micah 6:8" \
         "Luke 2:14" "Mark 12:31" "Acts 2:4" "James 1:17" "Daniel 6:22" "Jonah 1:17" "Hebrews 11:1" \
         "Revelation 21:4"; do
  verses+=("What does $v say?")
done
chat_trace chat-bible "${verses[@]}"
text_trace text-test tests/data/trained/test_slice.txt
text_trace text-gpl /usr/share/common-licenses/GPL-3

for t in chat-dict-a text-test chat-dict-b chat-bible text-gpl; do
  echo "== $t"
  nice "$bin" cachesim "$out/$t.trace" --sizes $sizes | tee "$out/$t.txt"
  nice "$bin" cachesim "$out/$t.trace" --sizes $sizes --csv > "$out/$t.csv"
done
