#!/bin/sh
# KL from fp32 of q4-blocks with Q6_K held at 6 bits, on the two models that have Q6_K matrices (llama.cpp's KL on
# the same files is in 2026-12-05-one-student-floor-intel.md; its arithmetic does not depend on the machine).
set -e
OUT=bench/results/2026-12-06-q6-start
. "$(dirname "$0")/../2026-12-06-zen4/models.sh"
for pair in "0.5b $qwen05" "1.5b $qwen15"; do
  uptime
  $py bench/quality.py --model "${pair#* }" --formats fp32,q4-blocks --no-peer --json "$out/quality-${pair%% *}.json" \
    2>&1 | grep -v "^\[" | tail -4
done
