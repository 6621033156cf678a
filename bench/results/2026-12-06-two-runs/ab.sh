#!/bin/sh
# ab.sh OLD.c NEW.c [ROUNDS] [MODEL]: q4-blocks' step on 1 row and on 16 at position 150 (the prefetch study's
# step.py, median ms) with blocks.c as OLD.c, then as NEW.c, alternating, ROUNDS times (each is packed once into
# the cache, then mapped). Leaves blocks.c as NEW.c.
set -e
py=${PYTHON:-.venv/bin/python}
src=backend/typewriter/runners/lite/blocks.c
for round in $(seq "${3:-3}"); do
  for c in "$1" "$2"; do
    cp "$c" "$src"
    printf '%s %s ' "$(basename "$c")" "$(cut -d' ' -f1 /proc/loadavg)"
    PYTHONPATH=backend $py bench/results/2026-12-06-prefetch/step.py $4 2>/dev/null | tail -1
  done
done
