#!/bin/sh
# Start and memory against llama-server (bench/start.py, each run from an empty cache, then 3 cached starts), q4-blocks
# then int8-lite, on the three models: start.sh ROUND
set -e
out=bench/results/2026-12-06-zen4
py=${PYTHON:-.venv/bin/python}
round=${1:-1}
models="$HOME/.cache/typewriter/models"
embedded=$($py -c "from typewriter.weights.source import embedded_model_path; print(embedded_model_path())")
for pair in "135m $embedded" "0.5b $models/qwen2.5-coder-0.5b-instruct.gguf" "1.5b $models/qwen2.5-coder-1.5b-instruct.gguf"; do
  for weights in q4-blocks int8-lite; do
    uptime
    $py bench/start.py --model "${pair#* }" --weights $weights --warm-repeats 3 \
      --json "$out/start-${pair%% *}-$weights-$round.json" 2>&1 | grep -v '^\[' | tail -12
  done
done
