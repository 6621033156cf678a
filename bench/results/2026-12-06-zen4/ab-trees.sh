#!/bin/sh
# ab-trees.sh BASE NEW [ROUNDS] [MODEL]: the prefetch study's step.py (q4-blocks' step on 1 row and on 16) with the
# whole package as at commit BASE, then as at NEW, alternating, ROUNDS times. Unlike that study's ab.sh (blocks.c
# alone), it takes both trees whole: Q5 changed blocks.py's packing too. Each tree is a temporary git worktree.
# SCRIPT: another script to run instead (its last TAIL lines printed, default 1).
set -e
py=${PYTHON:-.venv/bin/python}
script=${SCRIPT:-bench/results/2026-12-06-prefetch/step.py}
trees=$(mktemp -d)
trap 'git worktree remove --force "$trees/a"; git worktree remove --force "$trees/b"; rm -rf "$trees"' EXIT
git worktree add -f "$trees/a" "$1" >/dev/null 2>&1
git worktree add -f "$trees/b" "$2" >/dev/null 2>&1
for round in $(seq "${3:-3}"); do
  for tree in a b; do
    printf '%s ' "$([ $tree = a ] && echo "$1" || echo "$2")"
    PYTHONPATH="$trees/$tree/backend" $py "$script" $4 2>/dev/null | tail -"${TAIL:-1}"
  done
done
