#!/bin/sh
# bench/classroom.py at the defaults (q4-blocks), no peer, a class of 16 on the 0.5B after Q6_K was held at 6 bits
# (its 12 Q6_K down projections): class-0.5b.sh ROUND; OUT: a later study's folder
set -e
OUT=${OUT:-bench/results/2026-12-06-q6-start}
. "$(dirname "$0")/../2026-12-06-zen4/models.sh"
uptime
$py bench/classroom.py --students 16 --peer-layouts none --model "$qwen05" \
  --json "$out/class-0.5b-16-${1:-1}.json" 2>&1 | grep -v '^\[' | tail -4
