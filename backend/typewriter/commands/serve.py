"""`typewriter serve`: the options people change most, read into `Settings` (an option wins over its TYPEWRITER_*
variable, and what neither gives is the Settings default); server/main.py runs the server."""

from __future__ import annotations

import argparse

from ..config import ENV_PREFIX, LOG_LEVELS, Settings
from .args import add_model_arguments, setting_default


def add_arguments(parser: argparse.ArgumentParser) -> None:
    def default(name: str) -> str:
        return f"default {setting_default(name)}; {ENV_PREFIX}{name.upper()}"

    parser.add_argument("--host", help=f"address to listen on ({default('host')})")
    parser.add_argument("--port", type=int, help=f"port to listen on, 0 picks a free one ({default('port')})")
    parser.add_argument("--grpc-port", type=int, metavar="PORT",
                        help=f"also serve gRPC (typewriter.v1.Chat) on this port, 0 picks a free one (default off; "
                             f"{ENV_PREFIX}GRPC_PORT)")
    add_model_arguments(parser, from_settings=True)
    parser.add_argument("--max-active", type=int, metavar="N",
                        help=f"streams decoded together (default: as many as this machine carries under the "
                             f"capacity bar, measured at start; {ENV_PREFIX}MAX_ACTIVE)")
    parser.add_argument("--max-queue", type=int, metavar="N",
                        help=f"chats that may wait for a slot ({default('max_queue')})")
    parser.add_argument("--log-level", choices=LOG_LEVELS, help=f"({default('log_level')})")


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Raises ConfigError, naming the variable or option, for a value Settings refuses."""
    return Settings.from_env(host=args.host, port=args.port, grpc_port=args.grpc_port, model_path=args.model, max_active=args.max_active,
                             max_queue=args.max_queue, max_context=args.max_context, weights=args.weights,
                             log_level=args.log_level)


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)  # before uvicorn, Starlette and TensorFlow are imported
    from ..server.main import serve

    return serve(settings)
