#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (the classroom benchmark's peer) from the sources vendored in the
# llama-cpp-python sdist on PyPI. Only for benchmarks, never a dependency. The build is cached outside the repo
# (default ~/.cache/typewriter/llama.cpp-VERSION) so a second run does not rebuild; prints the binary's path.
# A second call while a build runs waits for it (a lock file beside the cache) instead of building over it.
#
# Portable flags: GGML_NATIVE off and AMX off (the default native build crashed in ggml's AMX kernels on an
# Intel machine of this kind); each x86 extension is turned on only where /proc/cpuinfo lists it, and AVX-VNNI
# only where `avx_vnni` is listed (Zen 4 has AVX-512 VNNI but not AVX-VNNI; the flag builds an illegal
# instruction there).
#
# The same build serves llama-cpp-python (the single-stream and quality benchmarks' peer): its Python sources are
# the sdist's, its one dependency goes to $CACHE/pydeps, and LLAMA_CPP_LIB_PATH points it at this build's
# libllama (bench/llama_cpp_peer.py sets that up), so nothing is compiled twice.
set -euo pipefail
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${TYPEWRITER_BENCH_CACHE:-$HOME/.cache/typewriter}/llama.cpp-$VERSION"
BIN="$CACHE/build/bin/llama-server"
QUANTIZE="$CACHE/build/bin/llama-quantize"  # built beside it: scripts/make-synthetic-model.py quantizes with it
flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() { [[ " $flags " == *" $1 "* ]] && echo ON || echo OFF; }
options=(-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
  -DGGML_AVX="$(has avx)" -DGGML_AVX2="$(has avx2)" -DGGML_FMA="$(has fma)" -DGGML_F16C="$(has f16c)" \
  -DGGML_BMI2="$(has bmi2)" -DGGML_AVX512="$(has avx512f)" -DGGML_AVX512_VNNI="$(has avx512_vnni)" \
  -DGGML_AVX512_BF16="$(has avx512_bf16)" -DGGML_AVX_VNNI="$(has avx_vnni)" \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON)
# a cache built on another kind of machine (other CPU extensions) is rebuilt, not run into an illegal instruction
built_for() { [ -f "$CACHE/build/options" ] && [ "$(cat "$CACHE/build/options")" == "${options[*]}" ]; }
python_deps() {  # llama-cpp-python's own import needs diskcache; pip may only reach the package registry
  [ -d "$CACHE/pydeps/diskcache" ] || python3 -m pip install --quiet --target "$CACHE/pydeps" diskcache >&2
}
if [ -x "$BIN" ] && [ -x "$QUANTIZE" ] && built_for; then python_deps; echo "$BIN"; exit 0; fi
mkdir -p "$CACHE"
exec 9>"$CACHE.lock"
flock 9
if [ -x "$BIN" ] && [ -x "$QUANTIZE" ] && built_for; then python_deps; echo "$BIN"; exit 0; fi  # built by whoever held the lock
cd "$CACHE"
if [ ! -d src ]; then  # unpacked to src.tmp first, so an interrupted unpack is not taken for the sources
  python3 -m pip download --quiet --no-deps --no-binary :all: -d sdist "llama-cpp-python==$VERSION" >&2
  rm -rf src.tmp && mkdir src.tmp
  tar -xzf sdist/llama_cpp_python-"$VERSION".tar.gz -C src.tmp --strip-components=1
  mv src.tmp src
fi
if ! built_for; then rm -rf build; fi  # a build for these options is only completed (llama-quantize added)
cmake -S src/vendor/llama.cpp -B build "${options[@]}" >&2
cmake --build build --target llama-server llama-quantize -j "$(nproc)" >&2
echo "${options[*]}" > build/options
python_deps
echo "$BIN"
