#!/bin/sh
# bench/classroom.py at the defaults, q4-blocks then int8-lite, alternating: class.sh OUT_DIR
set -e
out=${1:-bench/results/2026-12-06-q4-blocks-alone}
py=${PYTHON:-.venv/bin/python}
for round in 1 2; do
  for weights in q4-blocks int8-lite; do
    uptime
    TYPEWRITER_WEIGHTS=$weights $py bench/classroom.py --students 16,32 --peer-layouts none \
      --json "$out/class-135m-$weights-$round.json" 2>&1 | grep -v '^\[' | tail -8
  done
done
for weights in q4-blocks int8-lite; do
  uptime
  TYPEWRITER_WEIGHTS=$weights $py bench/classroom.py --students 16 --peer-layouts none \
    --model "$HOME/.cache/typewriter/models/qwen2.5-coder-0.5b-instruct.gguf" \
    --json "$out/class-0.5b-$weights.json" 2>&1 | grep -v '^\[' | tail -8
done
