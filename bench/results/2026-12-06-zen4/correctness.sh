#!/bin/sh
# bench/correctness.py through our server at its defaults (q4-blocks here), paired with 2026-12-05's llama-server
# answers on the same problems (--against): correctness.sh
set -e
. "$(dirname "$0")/models.sh"
uptime
$py bench/correctness.py --model "$qwen05" --limit 40 --servers ours \
  --against bench/results/2026-12-05-correctness-qwen-0.5b-paired.json --json $out/correctness-qwen-0.5b.json 2>&1 |
  grep -v '^\[' | tail -8
uptime
$py bench/correctness.py --limit 200 --servers ours --against bench/results/2026-12-05-correctness-smollm2-paired.json \
  --json $out/correctness-smollm2.json 2>&1 | grep -v '^\[' | tail -8
uptime
$py bench/correctness.py --model "$qwen15" --limit 40 --servers ours \
  --against bench/results/2026-12-05-correctness-qwen-1.5b-paired.json --json $out/correctness-qwen-1.5b.json 2>&1 |
  grep -v '^\[' | tail -8
