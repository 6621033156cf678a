"""The WebSocket chat server (protocol v1): app, per-connection sessions, metrics and the serve command."""

from .app import create_app

__all__ = ["create_app"]
