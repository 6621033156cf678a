#!/bin/sh
# bench/classroom.py at the defaults (q4-blocks here) on the 1.5B, classes of 4 and 8 (STUDENTS), no peer: class-1.5b.sh ROUND
set -e
out=bench/results/2026-12-06-zen4
py=${PYTHON:-.venv/bin/python}
uptime
$py bench/classroom.py --students ${STUDENTS:-4,8} --peer-layouts none \
  --model "$HOME/.cache/typewriter/models/qwen2.5-coder-1.5b-instruct.gguf" \
  --json "$out/class-1.5b-${1:-1}.json" 2>&1 | grep -v '^\[' | tail -8
