#!/usr/bin/env bash
# Regenerate the Python stubs of proto/typewriter/v1/chat.proto with grpcio-tools (a test dependency): messages
# (chat_pb2.py, its .pyi) and the service (chat_pb2_grpc.py), flat in backend/typewriter/server/grpc/gen/ or in
# the folder given as $1. The stubs are checked in, so running the server needs no protoc; tests/server/grpc/test_service.py
# runs this script into a temporary folder and fails if the checked-in files differ from what it writes.
#
# protoc names the messages' module by the proto's path (typewriter.v1.chat_pb2), which inside our package would
# be the wrong `typewriter`; the service module's import of it is rewritten to a relative one.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-$ROOT/backend/typewriter/server/grpc/gen}"
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
"$PYTHON" -m grpc_tools.protoc -I "$ROOT/proto" --python_out="$TMP" --pyi_out="$TMP" --grpc_python_out="$TMP" \
  "$ROOT/proto/typewriter/v1/chat.proto"
mkdir -p "$OUT"
GEN="$TMP/typewriter/v1"
sed 's/^from typewriter\.v1 import chat_pb2 as /from . import chat_pb2 as /' "$GEN/chat_pb2_grpc.py" > "$OUT/chat_pb2_grpc.py"
cp "$GEN/chat_pb2.py" "$GEN/chat_pb2.pyi" "$OUT/"
grep -q '^from \. import chat_pb2 as ' "$OUT/chat_pb2_grpc.py" || { echo "gen-grpc.sh: protoc's import line changed" >&2; exit 1; }
