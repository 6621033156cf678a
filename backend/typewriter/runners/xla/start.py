"""Open the XLA runner for a model: its weights read whole, the TensorFlow decoder built, and its programs compiled
every one before serving ("all": benchmarks, tests), a few before and the rest in the background ("start": the
server), or each on first use ("lazy": the CLI)."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ...architecture.model_config import ModelConfig
from ...config import WeightFormat
from ...engine.capacity import Sizing
from ...weights.source import Source, load_weights
from ..options import Compile, Encode, Progress, RunnerOptions
from .tf_env import import_tensorflow

if TYPE_CHECKING:
    from .compiler import ProgramCompiler
    from .model import Transformer
    from .runner import XlaRunner

# XLA compiles a program per batch size: a fixed count keeps compiling bounded.
SLOTS = 8
CHUNK_BUCKETS = (16, 64, 256)  # prompt tokens per prefill call, padded up to one of these
log = logging.getLogger("typewriter.xla")


def batch_buckets(slots: int) -> tuple[int, ...]:
    """1, 2, 4, then every 4 up to the slot count, so a step never computes more than 3 idle rows."""
    return tuple(sorted({b for b in (1, 2, 4, *range(8, slots + 1, 4)) if b < slots} | {slots}))


def build_model(cfg: ModelConfig, weights: dict[str, np.ndarray], slots: int, max_len: int, max_chunk: int = 1,
                kv_buckets: Sequence[int] | None = None,
                weight_format: WeightFormat = WeightFormat.FP32) -> Transformer:
    """The decoder of `cfg.family`'s block: gpt2.py's, or model.py's Llama block (llama, phi3)."""
    from .gpt2 import GPT2Transformer
    from .model import Transformer

    model_class = GPT2Transformer if cfg.family == "gpt2" else Transformer
    return model_class(cfg, weights, slots, max_len, max_chunk, kv_buckets, weight_format)


def open_runner(source: Source, cfg: ModelConfig, encode: Encode, options: RunnerOptions,
                progress: Progress = lambda _: None) -> XlaRunner:
    """XLA's one way in. `encode` is unused: nothing here is rounded by text."""

    def weight_progress(done: int, total: int) -> None:
        if done == total or done % max(1, total // 10) == 0:
            progress(f"weights {done}/{total}")

    cfg, weights = load_weights(source, weight_progress)
    runner = build(cfg, weights, options.slots or SLOTS, options.max_context, options.weights, progress)
    del weights
    runner.sizing = Sizing(runner.slots, "set" if options.slots else "XLA's default")
    warm_up(runner, options.compile, progress)
    return runner


def build(cfg: ModelConfig, weights: dict[str, np.ndarray], slots: int, max_context: int,
          weight_format: WeightFormat, progress: Progress = lambda _: None) -> XlaRunner:
    """Nothing compiled yet. Buckets trade compile time (a program each) against padding waste."""
    if "tensorflow" not in sys.modules:
        progress("starting TensorFlow")  # a wait of seconds: say what it is
    import_tensorflow()
    from .compiler import power_of_two_buckets
    from .runner import XlaRunner

    max_context = min(max_context, cfg.max_position)
    chunks = tuple(c for c in CHUNK_BUCKETS if c < max_context) or (max_context,)
    model = build_model(cfg, weights, slots=slots, max_len=max_context, max_chunk=chunks[-1],
                        kv_buckets=power_of_two_buckets(min(256, max_context), max_context),
                        weight_format=weight_format)
    return XlaRunner(model, chunk_buckets=chunks, batch_buckets=batch_buckets(slots))


def warm_up(runner: XlaRunner, compile: Compile, progress: Progress = lambda _: None) -> None:
    compiler, t0 = runner.compiler, time.perf_counter()
    try:
        _compile(compiler, compile, t0, progress)
    finally:
        compiler.warm_up_s = time.perf_counter() - t0


def _compile(compiler: ProgramCompiler, compile: Compile, t0: float, progress: Progress) -> None:
    total = len(compiler.programs())
    if compile == "all":
        compiler.warmup(lambda i, n, label: progress(f"compiled {i}/{n}: {label}"))
        progress(f"compiled every program in {time.perf_counter() - t0:.1f}s")
    elif compile == "start":
        first = compiler.first_programs()
        compiler.compile_all(first, lambda i, n, label: progress(f"compiled {i}/{total}: {label}"))
        progress(f"compiled {len(first)} programs in {time.perf_counter() - t0:.1f}s; the rest follow in the "
                 "background")
        compiler.compile_in_background(lambda i, n, label: log.info("compiled %d/%d in the background: %s", i, n,
                                                                     label))
    else:
        compiler.on_demand = lambda name: progress(f"compiling {name} (first use)")
