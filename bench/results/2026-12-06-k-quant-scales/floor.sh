#!/bin/sh
# One student on the two models with K-quant matrices, q4-blocks against llama.cpp (bench/bandwidth.py --measure),
# after Q4K and Q6K: floor.sh ROUND [MODELS], MODELS a list of 0.5b and 1.5b (default both)
set -e
. "$(dirname "$0")/../2026-12-06-zen4/models.sh"
out=bench/results/2026-12-06-k-quant-scales
round=${1:-1}
for name in ${2:-0.5b 1.5b}; do
  model=$([ "$name" = 0.5b ] && echo "$qwen05" || echo "$qwen15")
  uptime
  $py bench/bandwidth.py --model "$model" --measure --formats q4-blocks --json "$out/floor-$name-$round.json" 2>&1 \
    | grep -v "^\[" | tail -5
done
