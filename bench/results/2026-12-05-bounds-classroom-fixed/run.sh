#!/usr/bin/env bash
# Issue 38's "no loss from the bounds", again after the shared-prefix fix: the classroom (16 students) and the constrained
# classroom (a quarter) against the server before the bounds (7aa0331, $OLD) and this tree ($NEW), alternating, each at
# 16 fixed slots; this tree's bench client for both.
set -u
PY=${PY:-/tmp/fresh3/.venv/bin/python}
OUT=${OUT:-/work/artifacts/bounds-fixed}
OLD=${OLD:-/work/wt-old}  # a worktree of 7aa0331
NEW=${NEW:-$(git rev-parse --show-toplevel)}  # this tree
mkdir -p $OUT
common=(TYPEWRITER_MAX_CONNECTIONS_PER_CLIENT=100000 TYPEWRITER_CHATS_PER_MINUTE=100000 TYPEWRITER_REQUEST_TIMEOUT_S=none
        TYPEWRITER_QUEUE_TIMEOUT_S=none TYPEWRITER_CLIENT_SYSTEM_PROMPT=replace)
serve() {  # name tree port extra-env...
  local name=$1 tree=$2 port=$3; shift 3
  env "${common[@]}" "$@" TYPEWRITER_LITE_CACHE=/tmp/lite-bounds-$name PYTHONPATH=$tree/backend \
    $PY -m typewriter serve --host 127.0.0.1 --port $port --max-queue 64 --max-context 2048 --max-active 16 \
    > $OUT/server-$name-$port.log 2>&1 &
  echo $!
}
wait_ready() { for i in $(seq 300); do curl -sf http://127.0.0.1:$1/readyz >/dev/null && return 0; sleep 1; done; return 1; }
for round in 1 2; do
  for name in old new; do
    if [ $name = old ]; then tree=$OLD; extra=(); else tree=$NEW; extra=(TYPEWRITER_API_SYSTEM_PROMPT=replace); fi
    port=$((18000 + round * 10 + ${#name}))
    pid=$(serve $name $tree $port "${extra[@]}")
    wait_ready $port || { echo "$name did not start"; cat $OUT/server-$name-$port.log | tail; kill $pid; continue; }
    for f in 0 0.25; do
      (cd $NEW && PYTHONPATH=backend $PY bench/classroom.py --students 16 --constrained $f --ours ws://127.0.0.1:$port/ws \
        --peer-layouts none --json $OUT/$name-$f-round$round.json > $OUT/$name-$f-round$round.log 2>&1)
      echo "round $round $name constrained $f: $(grep -E '^ +16 ' $OUT/$name-$f-round$round.log | head -1)"
    done
    kill -INT $pid; sleep 3; kill $pid 2>/dev/null
  done
done
