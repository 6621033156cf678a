#!/bin/sh
# One student with the prefetch: bench/bandwidth.py --measure on the 135M and the 0.5B: floor.sh ROUND
set -e
out=bench/results/2026-12-06-prefetch
py=${PYTHON:-.venv/bin/python}
round=${1:-1}
uptime
$py bench/bandwidth.py --model "$($py -c "from typewriter.weights.source import embedded_model_path; print(embedded_model_path())")" --measure --formats int8-lite,q4-blocks --json $out/floor-135m-$round.json 2>&1 | grep -v "^\[" | tail -6
uptime
$py bench/bandwidth.py --model "$HOME/.cache/typewriter/models/qwen2.5-coder-0.5b-instruct.gguf" --measure \
  --formats int8-lite,q4-blocks --json $out/floor-0.5b-$round.json 2>&1 | grep -v "^\[" | tail -6
uptime
