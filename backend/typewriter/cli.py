"""The `typewriter` command: generate, chat, bench, loadtest, serve, export and models, each a module in commands/
with `add_arguments(parser)` and `run(args)`. Building the parser imports no TensorFlow, so `--help` and bad
options answer at once.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Protocol

from .commands import bench, chat, export, generate, loadtest, models, serve
from .config import ConfigError, xla_cache_dir
from .errors import TypewriterError
from .runners.xla.tf_env import prepare_environment, release_stderr


class Command(Protocol):
    """A subcommand: one module of commands/."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


COMMANDS: dict[str, tuple[Command, str]] = {
    "generate": (generate, "stream one answer to stdout"),
    "chat": (chat, "interactive multi-turn chat; Ctrl-C stops an answer, Ctrl-D leaves"),
    "bench": (bench, "measure load, compile, time to first token and decode speed of the engine in-process"),
    "loadtest": (loadtest, "drive a running server (its socket or its OpenAI API) with concurrent chats and measure it"),
    "serve": (serve, "serve the page, the socket, the OpenAI API and (with --grpc-port) gRPC"),
    "export": (export, "write the model as a TensorFlow SavedModel (prefill and decode-step signatures)"),
    "models": (models, "list the model formats, families and tokenizers --model accepts"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="typewriter", description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help) in COMMANDS.items():
        module.add_arguments(sub.add_parser(name, help=help, description=help))
    return parser


def main(argv: list[str] | None = None) -> int:
    prepare_environment(xla_cache_dir())
    args = build_parser().parse_args(argv)
    module, _ = COMMANDS[args.command]
    try:
        return module.run(args)
    except (TypewriterError, ConfigError) as e:  # a named error or a bad setting: a sentence, no traceback
        code = f"{e.code}: " if isinstance(e, TypewriterError) else ""
        print(f"typewriter: error: {code}{e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def run() -> None:
    """main(), then end the process without Python's shutdown: finalizing the interpreter while TensorFlow compiles
    on a background thread aborts it, turning a finished answer into exit code 134 and losing the last output."""
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    release_stderr()
    os._exit(code)
