#!/bin/sh
# bench/classroom.py at the defaults (q4-blocks here) on the 1.5B, classes of 4 and 8 (STUDENTS), no peer: class-1.5b.sh ROUND
set -e
. "$(dirname "$0")/models.sh"
uptime
$py bench/classroom.py --students ${STUDENTS:-4,8} --peer-layouts none --model "$qwen15" \
  --json "$out/class-1.5b-${1:-1}.json" 2>&1 | grep -v '^\[' | tail -8
