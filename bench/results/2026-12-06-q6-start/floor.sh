#!/bin/sh
# One student on the three models, q4-blocks and int8-lite against llama.cpp (bench/bandwidth.py --measure), after
# Q6_K was held at 6 bits: floor.sh ROUND
set -e
. "$(dirname "$0")/../2026-12-06-zen4/models.sh"
here=bench/results/2026-12-06-q6-start
round=${1:-1}
for pair in "135m $embedded" "0.5b $qwen05" "1.5b $qwen15"; do
  uptime
  $py bench/bandwidth.py --model "${pair#* }" --measure --formats int8-lite,q4-blocks \
    --json "$here/floor-${pair%% *}-$round.json" 2>&1 | grep -v "^\[" | tail -6
done
