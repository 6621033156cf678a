#!/bin/sh
# ab-engine.sh BASE NEW [ROUNDS] [MODEL]: one student through the Engine (the q6 study's engine_step.py: one slot,
# 256 greedy tokens, three runs, the runner's step against the whole token's wall time) with the whole package as at
# commit BASE, then as at NEW, alternating, ROUNDS times. Each tree is a temporary git worktree.
set -e
py=${PYTHON:-.venv/bin/python}
trees=$(mktemp -d)
trap 'git worktree remove --force "$trees/a"; git worktree remove --force "$trees/b"; rm -rf "$trees"' EXIT
git worktree add -f "$trees/a" "$1" >/dev/null 2>&1
git worktree add -f "$trees/b" "$2" >/dev/null 2>&1
for round in $(seq "${3:-3}"); do
  for tree in a b; do
    printf '%s %s\n' "$([ $tree = a ] && echo "$1" || echo "$2")" "$(cut -d' ' -f1 /proc/loadavg)"
    PYTHONPATH="$trees/$tree/backend" $py bench/results/2026-12-06-q6-start/engine_step.py $4 2>/dev/null | tail -3
  done
done
