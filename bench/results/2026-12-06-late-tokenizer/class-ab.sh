#!/bin/bash
# class-ab.sh SET: bench/classroom.py's class of 16 on the 0.5B, no peer, alternating BEFORE (a worktree of 6fbf976,
# its cache BEFORE_CACHE) and this tree, three rounds, into class-ab/classSET-{before,after}-N.json. Set 1: the BPE
# and llguidance warmed one after another once the engine was idle 0.5 s; set 2: each part waiting for a quiet server
# (no chat coming either); set 3: the BPE and the prompts after 0.1 s quiet.
here=$(cd "$(dirname "$0")" && pwd)
tree=$(cd "$here/../../.." && pwd)
qwen05="$HOME/.cache/typewriter/models/qwen2.5-coder-0.5b-instruct.gguf"
for i in 1 2 3; do
  (cd "$BEFORE" && TYPEWRITER_LITE_CACHE="$BEFORE_CACHE" PYTHONPATH="$BEFORE/backend" "$PYTHON" bench/classroom.py \
    --students 16 --peer-layouts none --model "$qwen05" --json "$here/class-ab/class$1-before-$i.json" >/dev/null 2>&1)
  (cd "$tree" && "$PYTHON" bench/classroom.py --students 16 --peer-layouts none --model "$qwen05" \
    --json "$here/class-ab/class$1-after-$i.json" >/dev/null 2>&1)
done
