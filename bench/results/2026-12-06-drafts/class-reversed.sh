#!/bin/sh
# The 135M's class of 32 with drafts off first, then on (class.sh runs them on first): class-reversed.sh ROUND
set -e
here=$(dirname "$0")
OUT=${OUT:-$here}
. "$here/../2026-12-06-zen4/models.sh"
round=${1:-1}
for drafts in 0 5; do
  uptime
  TYPEWRITER_DRAFT_TOKENS=$drafts $py bench/classroom.py --students 32 --peer-layouts none --model "$embedded" \
    --json "$out/class-135m-32-drafts$drafts-r$round.json" 2>&1 | grep -v '^\[' | tail -3
done
