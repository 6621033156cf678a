#!/bin/sh
# ab-engine.sh BASE NEW [ROUNDS] [MODEL]: one student through the Engine (the q6 study's engine_step.py: one slot,
# 256 greedy tokens, three runs, the runner's step against the whole token's wall time) with the whole package as at
# commit BASE, then as at NEW, alternating, ROUNDS times: the Zen 4 study's ab-trees.sh with that script. (The
# results here were printed by an earlier copy of that loop, which also printed the load average before each run.)
SCRIPT=bench/results/2026-12-06-q6-start/engine_step.py TAIL=3 exec sh "$(dirname "$0")/../2026-12-06-zen4/ab-trees.sh" "$@"
