#!/bin/sh
# ab-trees.sh BASE NEW [ROUNDS] [MODEL]: the prefetch study's step.py (q4-blocks' step on 1 row and on 16) with the
# whole package as at commit BASE, then as at NEW, alternating, ROUNDS times. Unlike that study's ab.sh (blocks.c
# alone), it takes both trees whole: Q5 changed blocks.py's packing too. Each tree is a temporary git worktree.
set -e
py=${PYTHON:-.venv/bin/python}
trees=$(mktemp -d)
trap 'git worktree remove --force "$trees/a"; git worktree remove --force "$trees/b"; rm -rf "$trees"' EXIT
git worktree add -f "$trees/a" "$1" >/dev/null 2>&1
git worktree add -f "$trees/b" "$2" >/dev/null 2>&1
for round in $(seq "${3:-3}"); do
  for tree in a b; do
    printf '%s ' "$([ $tree = a ] && echo "$1" || echo "$2")"
    PYTHONPATH="$trees/$tree/backend" $py bench/results/2026-12-06-prefetch/step.py $4 2>/dev/null | tail -1
  done
done
