"""`typewriter models`: which model files, families and tokenizers `--model` accepts."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    from ..architecture.families import describe

    print(describe())
    return 0
