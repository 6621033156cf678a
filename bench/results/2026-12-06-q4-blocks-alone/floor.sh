#!/bin/sh
# One student after the tile change: bench/bandwidth.py on the 135M and the 0.5B, one run each.
set -e
out=bench/results/2026-12-06-q4-blocks-alone
py=${PYTHON:-.venv/bin/python}
uptime
$py bench/bandwidth.py --model "$($py -c "from typewriter.weights.source import embedded_model_path; print(embedded_model_path())")" --measure --formats int8-lite,q4-blocks --json $out/floor-135m.json 2>&1 | grep -v "^\[" | tail -12
uptime
$py bench/bandwidth.py --model "$HOME/.cache/typewriter/models/qwen2.5-coder-0.5b-instruct.gguf" --measure \
  --formats int8-lite,q4-blocks --json $out/floor-0.5b.json 2>&1 | grep -v "^\[" | tail -12
uptime
