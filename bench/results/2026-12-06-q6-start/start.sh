#!/bin/sh
# Start and memory against llama-server (bench/start.py: a start from an empty cache, then 3 cached starts), q4-blocks
# then int8-lite, on the three models, with the chat template rendered without transformers: start.sh ROUND
set -e
. "$(dirname "$0")/../2026-12-06-zen4/models.sh"
here=bench/results/2026-12-06-q6-start
round=${1:-1}
for pair in "135m $embedded" "0.5b $qwen05" "1.5b $qwen15"; do
  for weights in q4-blocks int8-lite; do
    uptime
    $py bench/start.py --model "${pair#* }" --weights $weights --warm-repeats 3 \
      --json "$here/start-${pair%% *}-$weights-$round.json" 2>&1 | grep -v '^\[' | tail -12
  done
done
