#!/bin/sh
# bench/start.py for each model, q4-blocks (alone) then int8-lite, in one run: start.sh OUT_DIR
set -e
out=${1:-bench/results/2026-12-06-q4-blocks-alone}
models="embedded:
0.5b:$HOME/.cache/typewriter/models/qwen2.5-coder-0.5b-instruct.gguf
1.5b:$HOME/.cache/typewriter/models/qwen2.5-coder-1.5b-instruct.gguf"
echo "$models" | while IFS=: read -r name file; do
  for weights in q4-blocks int8-lite; do
    uptime
    TYPEWRITER_WEIGHTS=$weights ${PYTHON:-.venv/bin/python} bench/start.py --warm-repeats 3 ${file:+--model "$file"} \
      --json "$out/start-$name-$weights.json" 2>&1 | grep -v '^\[' | tail -30
  done
done
