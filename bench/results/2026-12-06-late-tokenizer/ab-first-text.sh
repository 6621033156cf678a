#!/bin/bash
# ab-first-text.sh MODEL ROUNDS: first_text.py's ready and first text, alternating three trees: BEFORE (a worktree of
# 6fbf976, its own cache BEFORE_CACHE), MID (a worktree of 68db4c5: the late tokenizer and the imports, without the
# collector held) and this tree. PYTHON: the venv's python.
here=$(cd "$(dirname "$0")" && pwd)
for i in $(seq 1 $2); do
  echo "before $("$PYTHON" "$here/first_text.py" "$1" 1 "$BEFORE" "$BEFORE_CACHE")"
  echo "mid    $("$PYTHON" "$here/first_text.py" "$1" 1 "$MID")"
  echo "after  $("$PYTHON" "$here/first_text.py" "$1" 1 "$(cd "$here/../../.." && pwd)")"
done
