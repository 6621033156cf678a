#!/bin/bash
# The cached start, before (BEFORE: a worktree of cabb1e1, with its own cache BEFORE_CACHE, as the two trees' q4-blocks
# entries are keyed apart and each save removes the other's) and after (AFTER: this commit), alternating, 3 rounds a
# model; READY is /readyz answering 200, polled every 20 ms by the cached-start study's timeline.py. PYTHON: the
# venv's python.
timeline=$(cd "$(dirname "$0")/../2026-12-05-cached-start" && pwd)/timeline.py
after_cache=${TYPEWRITER_LITE_CACHE:-$HOME/.cache/typewriter/lite}
for m in "" ~/.cache/typewriter/models/qwen2.5-coder-0.5b-instruct.gguf \
    ~/.cache/typewriter/models/qwen2.5-coder-1.5b-instruct.gguf; do
  (cd "$BEFORE" && TYPEWRITER_LITE_CACHE="$BEFORE_CACHE" PYTHONPATH=backend "$PYTHON" "$timeline" $m >/dev/null 2>&1)
  for i in 1 2 3; do
    for tree in before after; do
      if [ $tree = before ]; then dir=$BEFORE; cache=$BEFORE_CACHE; else dir=$AFTER; cache=$after_cache; fi
      r=$(cd "$dir" && TYPEWRITER_LITE_CACHE="$cache" PYTHONPATH=backend "$PYTHON" "$timeline" $m 2>&1 |
        grep -E "READY|ready:" | awk '{print $1}' | tr '\n' ' ')
      echo "$(basename ${m:-135m}) $tree run$i ready-logged,READY=$r load=$(cut -d' ' -f1 /proc/loadavg)"
    done
  done
done
