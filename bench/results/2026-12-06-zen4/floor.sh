#!/bin/sh
# One student on the three models, int8-lite and q4-blocks against llama.cpp (bench/bandwidth.py --measure):
# floor.sh ROUND
set -e
out=bench/results/2026-12-06-zen4
py=${PYTHON:-.venv/bin/python}
round=${1:-1}
models="$HOME/.cache/typewriter/models"
embedded=$($py -c "from typewriter.weights.source import embedded_model_path; print(embedded_model_path())")
for pair in "135m $embedded" "0.5b $models/qwen2.5-coder-0.5b-instruct.gguf" "1.5b $models/qwen2.5-coder-1.5b-instruct.gguf"; do
  name=${pair%% *}
  uptime
  $py bench/bandwidth.py --model "${pair#* }" --measure --formats int8-lite,q4-blocks \
    --json "$out/floor-$name-$round.json" 2>&1 | grep -v "^\[" | tail -6
done
