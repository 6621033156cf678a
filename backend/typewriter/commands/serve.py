"""`typewriter serve`: the options people change most, read into `Settings` over the TYPEWRITER_* variables; a
refused value is named as the user gave it (`--port` or `TYPEWRITER_PORT`). server/main.py runs the server.
"""

from __future__ import annotations

import argparse
import gc

from ..config import EMBEDDED_MODEL_ID, ENV_PREFIX, LOG_LEVELS, ConfigError, Settings
from .args import add_model_arguments, setting_default

# The Settings field each option sets; its argparse dest is the option's name (--model's is `model`).
OPTIONS = {"host": "--host", "port": "--port", "grpc_port": "--grpc-port", "model_path": "--model",
           "model_id": "--model-id", "max_context": "--max-context", "weights": "--weights",
           "max_active": "--max-active", "max_queue": "--max-queue", "log_level": "--log-level",
           "classes": "--classes"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    def default(name: str) -> str:
        return f"default {setting_default(name)}; {ENV_PREFIX}{name.upper()}"

    parser.add_argument("--host", help=f"address to listen on ({default('host')})")
    parser.add_argument("--port", type=int, help=f"port to listen on, 0 picks a free one ({default('port')})")
    parser.add_argument("--grpc-port", type=int, metavar="PORT",
                        help=f"also serve gRPC (typewriter.v1.Chat) on this port, 0 picks a free one (default off; "
                             f"{ENV_PREFIX}GRPC_PORT)")
    add_model_arguments(parser, from_settings=True)
    parser.add_argument("--model-id", metavar="ID",
                        help="the model's name to clients: /v1/models, responses, /readyz, the page and the log "
                             f"(default: {EMBEDDED_MODEL_ID} for the embedded model, else the file's name without "
                             f".gguf or the folder's name, spaces made -; {ENV_PREFIX}MODEL_ID)")
    parser.add_argument("--max-active", type=int, metavar="N",
                        help=f"streams decoded together (default: as many as this machine carries under the "
                             f"capacity bar, measured at start; {ENV_PREFIX}MAX_ACTIVE)")
    parser.add_argument("--max-queue", type=int, metavar="N",
                        help=f"chats that may wait for a slot ({default('max_queue')})")
    parser.add_argument("--log-level", choices=LOG_LEVELS, help=f"({default('log_level')})")
    parser.add_argument("--classes", metavar="PATH",
                        help="a TOML file of classes: names, API keys, join codes, weights, tutors and limits "
                             f"(docs/configuration.md; default: one class for everyone; {ENV_PREFIX}CLASSES)")
    parser.epilog = ("exit codes: 0 after a drain (SIGTERM, Ctrl-C), 1 the model failed to load or the engine "
                     "failed, 2 a bad option or setting, 4 the port (or the gRPC port) cannot be bound")


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Raises ConfigError, naming the option the user typed, or the variable, for a value Settings refuses."""
    given = {field: getattr(args, option[2:].replace("-", "_")) for field, option in OPTIONS.items()}
    try:
        return Settings.from_env(**given)
    except ConfigError as e:
        if e.setting in OPTIONS and given[e.setting] is not None:
            raise e.given_as(OPTIONS[e.setting]) from None
        raise


def run(args: argparse.Namespace) -> int:
    from ..weights import resolve_model_path

    settings = settings_from_args(args)  # before uvicorn, Starlette and TensorFlow are imported
    resolve_model_path(settings.model.model_path)  # a path that is not there, or not a model's: exit 2, not 1 after binding
    # No cyclic collection while the server's modules import and the model loads: the objects they make live as long
    # as the process, and three generations' passes over them were a tenth of a cached start
    # (docs/measurements/2026-12-06-late-tokenizer.md). The server turns the collector back on once ready.
    gc.disable()
    try:
        from ..server.classes import load_classes
        from ..server.main import serve

        classes = load_classes(settings)  # a mistake in the file: exit 2, naming its line, before anything loads
        return serve(settings, classes=classes, collector_held=True)
    finally:
        gc.enable()
