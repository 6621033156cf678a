#!/bin/sh
# Drafts on and off, ours and llama.cpp's, on the three models (bench/drafts.py): run.sh [ROUNDS]
set -e
here=$(dirname "$0")
OUT=${OUT:-$here}
. "$here/../2026-12-06-zen4/models.sh"
for pair in "135m $embedded" "0.5b $qwen05" "1.5b $qwen15"; do
  name=${pair%% *}
  uptime
  $py bench/drafts.py --model "${pair#* }" --rounds "${1:-3}" --json "$out/drafts-$name.json" 2>&1 | grep -v "^\[" \
    > "$out/drafts-$name.txt"
  tail -24 "$out/drafts-$name.txt"
done
