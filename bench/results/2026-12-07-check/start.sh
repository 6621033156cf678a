#!/bin/sh
# Start and memory against llama-server (bench/start.py, polling every 10 ms), q4-blocks, the 135M three times and
# the 0.5B and 1.5B once: OUT=bench/results/2026-12-07-check sh bench/results/2026-12-07-check/start.sh
set -e
. "$(dirname "$0")/../2026-12-06-zen4/models.sh"
for pair in "135m-1 $embedded" "135m-2 $embedded" "135m-3 $embedded" "0.5b-1 $qwen05" "1.5b-1 $qwen15"; do
  uptime
  $py bench/start.py --model "${pair#* }" --weights q4-blocks --warm-repeats 5 \
    --json "$out/start-${pair%% *}.json" 2>&1 | grep -v '^\[' | tail -14
done
