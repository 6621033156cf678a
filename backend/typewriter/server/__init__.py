"""The chat server: one engine behind three doors (socket/, openai/, grpc/)."""

from .app import create_app

__all__ = ["create_app"]
