#!/bin/sh
# bench/classroom.py, a class of 16 on the 0.5B, q4-blocks then int8-lite, alternating: class.sh ROUND
set -e
out=bench/results/2026-12-06-prefetch
py=${PYTHON:-.venv/bin/python}
round=${1:-1}
for weights in q4-blocks int8-lite; do
  uptime
  TYPEWRITER_WEIGHTS=$weights $py bench/classroom.py --students 16 --peer-layouts none \
    --model "$HOME/.cache/typewriter/models/qwen2.5-coder-0.5b-instruct.gguf" \
    --json "$out/class-0.5b-$weights-$round.json" 2>&1 | grep -v '^\[' | tail -8
done
