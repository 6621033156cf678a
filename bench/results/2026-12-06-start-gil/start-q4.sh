#!/bin/sh
# start.sh's rows for q4-blocks alone (the default here), for the rounds past the third: start-q4.sh ROUND
set -e
OUT=${OUT:-bench/results/2026-12-06-start-gil}
. "$(dirname "$0")/../2026-12-06-zen4/models.sh"
round=${1:-4}
for pair in "135m $embedded" "0.5b $qwen05" "1.5b $qwen15"; do
  uptime
  $py bench/start.py --model "${pair#* }" --weights q4-blocks --warm-repeats 3 \
    --json "$out/start-${pair%% *}-q4-blocks-$round.json" 2>&1 | grep -v '^\[' | tail -8
done
