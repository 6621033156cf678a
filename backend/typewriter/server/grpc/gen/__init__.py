"""Stubs generated from proto/typewriter/v1/chat.proto by scripts/gen-grpc.sh: do not edit, regenerate."""
