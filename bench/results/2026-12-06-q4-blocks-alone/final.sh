#!/bin/sh
# After the kernel's six-row tiles: the steps, the 135M's start again (the first run was on a busy moment), and the
# classes with q4-blocks again (its kept step times removed first, so it sizes itself with this kernel).
set -e
out=bench/results/2026-12-06-q4-blocks-alone
py=${PYTHON:-.venv/bin/python}
q05="$HOME/.cache/typewriter/models/qwen2.5-coder-0.5b-instruct.gguf"
uptime
$py bench/blocks_step.py --rows 1,2,4,8,16,32,64 --steps 10 --rounds 3 --json $out/step-135m.json 2>&1 | grep -v '^\['
uptime
$py bench/blocks_step.py --model "$q05" --rows 1,4,16,32,64 --steps 8 --rounds 3 --json $out/step-0.5b.json 2>&1 | grep -v '^\['
for weights in q4-blocks int8-lite; do
  uptime
  TYPEWRITER_WEIGHTS=$weights $py bench/start.py --warm-repeats 3 --json "$out/start-embedded-$weights-2.json" 2>&1 | grep -v '^\[' | tail -8
done
uptime
TYPEWRITER_WEIGHTS=q4-blocks $py bench/classroom.py --students 16,32 --peer-layouts none --json "$out/class-135m-q4-blocks-3.json" 2>&1 | grep -v '^\[' | tail -6
uptime
TYPEWRITER_WEIGHTS=q4-blocks $py bench/classroom.py --students 8,16 --peer-layouts none --model "$q05" --json "$out/class-0.5b-q4-blocks-2.json" 2>&1 | grep -v '^\[' | tail -6
uptime
