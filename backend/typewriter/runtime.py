"""Put the parts together: weights -> model -> compiled runner -> engine, with progress for every long wait."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .engine import Engine
from .model_config import ModelConfig
from .tokenizer import Tokenizer
from .weights import load_weights, resolve_model_path
from .weights.gguf_file import GGUFFile
from .weights.load import open_source

Progress = Callable[[str], None]


@dataclass
class LoadTimes:
    load_s: float
    compile_s: float


def build_runner(cfg: ModelConfig, weights, slots: int, max_context: int):
    """Buckets trade compile time (each is one XLA program, ~4 s here) against padding waste: prompts pad to
    64/128/256/1024/max (a tutoring chat's first prompt is about 90 tokens), attention reads 256/512/1024/...
    cached positions, and a decode step runs 1, 4 or all slots (weights dominate a step's cost, so a few extra
    rows cost little)."""
    from .quiet_import import import_tensorflow

    import_tensorflow()
    from .model import Transformer
    from .runner import ModelRunner, power_of_two_buckets

    max_context = min(max_context, cfg.max_position)
    model = Transformer(cfg, weights, slots=slots, max_len=max_context)
    prefill = sorted({n for n in (64, 128, *power_of_two_buckets(256, max_context)[::2]) if n < max_context}
                     | {max_context})
    return ModelRunner(
        model,
        prefill_buckets=prefill,
        batch_buckets=sorted({1, min(4, slots), slots}),
        kv_buckets=power_of_two_buckets(min(256, max_context), max_context),
    )


def load_engine(settings, progress: Progress = lambda _: None, warmup: bool = True) -> tuple[Engine, Tokenizer]:
    """Load the model named by `settings.model_path` (None: the embedded one) and start its engine thread."""
    engine, tokenizer, _ = load(settings.model_path, slots=settings.max_active, max_context=settings.max_context,
                                max_queue=settings.max_queue, progress=progress, warmup=warmup)
    return engine, tokenizer


def load(
    model_path: str | Path | None,
    *,
    slots: int,
    max_context: int,
    max_queue: int,
    progress: Progress = lambda _: None,
    warmup: bool = True,
) -> tuple[Engine, Tokenizer, LoadTimes]:
    """Load a model and start its engine: `slots` streams decoded together, `max_context` tokens of KV cache each,
    `max_queue` requests that may wait for a slot. No defaults: the server's come from Settings, and each command
    says why its own fit."""
    t0 = time.perf_counter()
    path = resolve_model_path(model_path)
    progress(f"loading {path}")

    def weight_progress(done: int, total: int) -> None:
        if done == total or done % max(1, total // 10) == 0:
            progress(f"weights {done}/{total}")

    source, _ = open_source(path)  # a GGUF file is parsed once, for the weights and the tokenizer
    cfg, weights = load_weights(source, weight_progress)
    tokenizer = Tokenizer.from_gguf(path, source.reader) if isinstance(source, GGUFFile) else Tokenizer.load(path)
    runner = build_runner(cfg, weights, slots, max_context)
    del weights
    load_s = time.perf_counter() - t0
    progress(f"loaded {cfg.name} in {load_s:.1f}s")
    t1 = time.perf_counter()
    if warmup:
        runner.warmup(lambda i, n, label: progress(f"compiled {i}/{n}: {label}"))
    compile_s = time.perf_counter() - t1
    if warmup:
        progress(f"compiled every step in {compile_s:.1f}s")
    engine = Engine(runner, tokenizer, max_queue=max_queue, model_name=cfg.name).start()
    return engine, tokenizer, LoadTimes(load_s, compile_s)
