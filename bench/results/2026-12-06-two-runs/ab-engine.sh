#!/bin/sh
# ab-engine.sh OLD.c NEW.c [ROUNDS] [MODEL]: one student through the Engine (engine_step.py: one slot, 256 greedy
# tokens, three runs a round) with blocks.c as OLD.c, then NEW.c, alternating. Leaves blocks.c as NEW.c.
set -e
py=${PYTHON:-.venv/bin/python}
src=backend/typewriter/runners/lite/blocks.c
for round in $(seq "${3:-3}"); do
  for c in "$1" "$2"; do
    cp "$c" "$src"
    PYTHONPATH=backend $py -c "import sys; sys.argv[1:] = [a for a in ['$4'] if a]; exec(open('$(dirname "$0")/engine_step.py').read())" >/dev/null 2>&1 || true
    echo "$(basename "$c") load $(cut -d' ' -f1 /proc/loadavg)"
    PYTHONPATH=backend $py "$(dirname "$0")/engine_step.py" $4 2>/dev/null | tail -3
  done
done
