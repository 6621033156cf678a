#!/bin/sh
# bench/classroom.py at the defaults, drafts on (the default) and off, no peer: a class of 32 on the 135M and of 16
# on the 0.5B, and one of 2 on each (where steps draft): class.sh ROUND
set -e
here=$(dirname "$0")
OUT=${OUT:-$here}
. "$here/../2026-12-06-zen4/models.sh"
round=${1:-1}
for pair in "32 135m $embedded" "16 0.5b $qwen05" "2 135m $embedded" "2 0.5b $qwen05"; do
  students=${pair%% *}; rest=${pair#* }; name=${rest%% *}; model=${rest#* }
  for drafts in 5 0; do
    uptime
    TYPEWRITER_DRAFT_TOKENS=$drafts $py bench/classroom.py --students "$students" --peer-layouts none \
      --model "$model" --json "$out/class-$name-$students-drafts$drafts-$round.json" 2>&1 | grep -v '^\[' | tail -3
  done
done
