#!/bin/sh
# bench/classroom.py at the defaults (q4-blocks on this machine) against llama-server, one slot per student: a class
# of 32 on the 135M and of 16 on the 0.5B: class-peer.sh ROUND
set -e
. "$(dirname "$0")/models.sh"
round=${1:-1}
uptime
$py bench/classroom.py --students 32 --model "$embedded" --json "$out/class-peer-135m-32-$round.json" 2>&1 |
  grep -v '^\[' | tail -6
uptime
$py bench/classroom.py --students 16 --model "$qwen05" \
  --json "$out/class-peer-0.5b-16-$round.json" 2>&1 | grep -v '^\[' | tail -6
