#!/bin/sh
# bench/classroom.py at the defaults, q4-blocks then int8-lite, no peer: a class of 32 on the 135M and of 16 on the
# 0.5B: class.sh ROUND
set -e
. "$(dirname "$0")/models.sh"
round=${1:-1}
for weights in q4-blocks int8-lite; do
  uptime
  TYPEWRITER_WEIGHTS=$weights $py bench/classroom.py --students 32 --peer-layouts none --model "$embedded" \
    --json "$out/class-135m-32-$weights-$round.json" 2>&1 | grep -v '^\[' | tail -4
  uptime
  TYPEWRITER_WEIGHTS=$weights $py bench/classroom.py --students 16 --peer-layouts none --model "$qwen05" \
    --json "$out/class-0.5b-16-$weights-$round.json" 2>&1 | grep -v '^\[' | tail -4
done
