#!/bin/sh
# ab.sh BASE NEW [ROUNDS] [MODEL]: step.py with blocks.c as at commit BASE, then as at NEW, alternating, ROUNDS times
# (each source is packed once, then mapped from the cache). Leaves blocks.c as at HEAD.
set -e
py=${PYTHON:-.venv/bin/python}
src=backend/typewriter/runners/lite/blocks.c
here=$(dirname "$0")
for round in $(seq "${3:-3}"); do
  for rev in "$1" "$2"; do
    git show "$rev:$src" > "$src"
    printf '%s ' "$rev"
    PYTHONPATH=backend $py "$here/step.py" $4 2>/dev/null | tail -1
  done
done
git checkout -- "$src"
