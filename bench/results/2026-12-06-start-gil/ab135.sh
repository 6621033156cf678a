#!/bin/bash
# ab.sh's comparison on the 135M alone, ROUNDS rounds (default 8): its margin is within the three rounds' spread.
timeline=$(cd "$(dirname "$0")/../2026-12-05-cached-start" && pwd)/timeline.py
after_cache=${TYPEWRITER_LITE_CACHE:-$HOME/.cache/typewriter/lite}
for i in $(seq 1 ${ROUNDS:-8}); do
  for tree in before after; do
    if [ $tree = before ]; then dir=$BEFORE; cache=$BEFORE_CACHE; else dir=$AFTER; cache=$after_cache; fi
    r=$(cd "$dir" && TYPEWRITER_LITE_CACHE="$cache" PYTHONPATH=backend "$PYTHON" "$timeline" 2>&1 |
      grep -E "READY|ready:|Started server|loading: loading" | awk '{print $1}' | tr '\n' ' ')
    echo "135m $tree run$i started,loading,ready-logged,READY=$r load=$(cut -d' ' -f1 /proc/loadavg)"
  done
done
