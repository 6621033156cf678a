"""`typewriter export --out DIR`: write the model as a TensorFlow SavedModel (runners/xla/export.py says what is in it)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..progress import StderrProgress
from .args import add_model_arguments, check_model_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, type=Path, metavar="DIR",
                        help="a new (or empty) folder for the SavedModel")
    add_model_arguments(parser, weights=False)  # a SavedModel holds the file's weights; --weights applies on load


def run(args: argparse.Namespace) -> int:
    from ..assemble import export
    from ..runners.xla.export import check_out

    check_model_arguments(args)  # bad values fail before the model loads
    check_out(args.out)
    started = time.perf_counter()
    out = export(args.model, args.out, args.max_context, StderrProgress("export"))
    print(f"{out} (in {time.perf_counter() - started:.1f} s); serve it with: typewriter serve --model {out}")
    return 0
