#!/bin/sh
# bench/classroom.py at the defaults (q4-blocks on this machine) against llama-server, one slot per student: a class
# of 32 on the 135M and of 16 on the 0.5B: class-peer.sh ROUND
set -e
out=bench/results/2026-12-06-zen4
py=${PYTHON:-.venv/bin/python}
round=${1:-1}
embedded=$($py -c "from typewriter.weights.source import embedded_model_path; print(embedded_model_path())")
uptime
$py bench/classroom.py --students 32 --model "$embedded" --json "$out/class-peer-135m-32-$round.json" 2>&1 |
  grep -v '^\[' | tail -6
uptime
$py bench/classroom.py --students 16 --model "$HOME/.cache/typewriter/models/qwen2.5-coder-0.5b-instruct.gguf" \
  --json "$out/class-peer-0.5b-16-$round.json" 2>&1 | grep -v '^\[' | tail -6
