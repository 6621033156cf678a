#!/bin/bash
# The cached start, before (BASE: a worktree of 96af984) and after (MAIN: this commit), alternating; READY is
# /readyz answering 200, polled every 20 ms by timeline.py. PYTHON: a fresh clone's .venv/bin/python.
HERE=$(cd "$(dirname "$0")" && pwd)
for m in "" ~/.cache/typewriter/models/qwen2.5-coder-0.5b-instruct.gguf ~/.cache/typewriter/models/qwen2.5-coder-1.5b-instruct.gguf; do
  for i in 1 2 3; do
    for tree in "$BASE" "$MAIN"; do
      r=$(cd "$tree" && PYTHONPATH=backend "$PYTHON" "$HERE/timeline.py" $m 2>&1 | grep READY | awk '{print $1}')
      echo "$(basename ${m:-135m}) $tree run$i ready=$r load=$(cut -d' ' -f1 /proc/loadavg)"
    done
  done
done
