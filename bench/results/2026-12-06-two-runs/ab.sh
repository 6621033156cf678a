#!/bin/sh
# ab.sh OLD.c NEW.c [ROUNDS] [MODEL]: SCRIPT (default the prefetch study's step.py: q4-blocks' step on 1 row and on
# 16 at position 150, median ms) with blocks.c as OLD.c, then as NEW.c, alternating, ROUNDS times (each is packed
# once into the cache, outside what SCRIPT times). SCRIPT=bench/results/2026-12-06-q6-start/engine_step.py: one
# student through the Engine instead (one slot, 256 greedy tokens, three runs). Leaves blocks.c as NEW.c.
set -e
py=${PYTHON:-.venv/bin/python}
script=${SCRIPT:-bench/results/2026-12-06-prefetch/step.py}
src=backend/typewriter/runners/lite/blocks.c
for round in $(seq "${3:-3}"); do
  for c in "$1" "$2"; do
    cp "$c" "$src"
    printf '%s %s\n' "$(basename "$c")" "$(cut -d' ' -f1 /proc/loadavg)"
    PYTHONPATH=backend $py "$script" $4 2>/dev/null | tail -3
  done
done
