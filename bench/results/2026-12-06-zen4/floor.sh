#!/bin/sh
# One student on the three models, int8-lite and q4-blocks against llama.cpp (bench/bandwidth.py --measure):
# floor.sh ROUND
set -e
. "$(dirname "$0")/models.sh"
round=${1:-1}
for pair in "135m $embedded" "0.5b $qwen05" "1.5b $qwen15"; do
  name=${pair%% *}
  uptime
  $py bench/bandwidth.py --model "${pair#* }" --measure --formats int8-lite,q4-blocks \
    --json "$out/floor-$name-$round.json" 2>&1 | grep -v "^\[" | tail -6
done
