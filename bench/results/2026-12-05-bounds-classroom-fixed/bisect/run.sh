#!/usr/bin/env bash
# Bisecting issue 38's first-turn TTFT: the classroom (16 students, 16 fixed slots, none constrained) against the
# worktrees given as arguments (one per commit), alternating, ROUNDS rounds; each its own program cache.
set -u
PY=${PY:-/tmp/fresh3/.venv/bin/python}
OUT=${OUT:-artifacts/bisect}
ROUNDS=${ROUNDS:-2}
mkdir -p $OUT
common=(TYPEWRITER_MAX_CONNECTIONS_PER_CLIENT=100000 TYPEWRITER_CHATS_PER_MINUTE=100000 TYPEWRITER_REQUEST_TIMEOUT_S=none
        TYPEWRITER_QUEUE_TIMEOUT_S=none TYPEWRITER_CLIENT_SYSTEM_PROMPT=replace)
wait_ready() { for i in $(seq 300); do curl -sf http://127.0.0.1:$1/readyz >/dev/null && return 0; sleep 1; done; return 1; }
for round in $(seq $ROUNDS); do
  for tree in "$@"; do
    name=$(basename $tree)
    port=$((18100 + round * 10 + RANDOM % 9))
    env "${common[@]}" TYPEWRITER_LITE_CACHE=/tmp/lite-bisect-$name PYTHONPATH=$tree/backend \
      $PY -m typewriter serve --host 127.0.0.1 --port $port --max-queue 64 --max-context 2048 --max-active 16 \
      > $OUT/server-$name-r$round.log 2>&1 &
    pid=$!
    wait_ready $port || { echo "$name did not start"; tail $OUT/server-$name-r$round.log; kill $pid; continue; }
    (cd /work/main && PYTHONPATH=backend $PY bench/classroom.py --students 16 --constrained 0 --ours ws://127.0.0.1:$port/ws \
      --peer-layouts none --json $OUT/$name-r$round.json > $OUT/$name-r$round.log 2>&1)
    echo "round $round $name: $(grep -E '^ +16 ' $OUT/$name-r$round.log | head -1)"
    kill -INT $pid; sleep 3; kill $pid 2>/dev/null; wait $pid 2>/dev/null
  done
done
