#!/bin/sh
# GSM8K through our server at its defaults (q4-blocks, Q6_K at 6 bits) on the two models with Q6_K matrices, paired
# with 2026-12-05's llama-server answers on the same problems (--against): correctness.sh
set -e
OUT=bench/results/2026-12-06-q6-start
. "$(dirname "$0")/../2026-12-06-zen4/models.sh"
for pair in "0.5b $qwen05" "1.5b $qwen15"; do
  uptime
  $py bench/correctness.py --model "${pair#* }" --limit 40 --servers ours \
    --against "bench/results/2026-12-05-correctness-qwen-${pair%% *}-paired.json" \
    --json "$out/correctness-qwen-${pair%% *}.json" 2>&1 | grep -v '^\[' | tail -8
done
