"""Put the parts together: weights -> model -> compiled runner -> engine, with progress for every long wait."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple

from .config import lite_cache_dir
from .engine.engine import Engine
from .runners.heap import return_freed_memory
from .runners.lite.programs import ProgramCache, cache_key
from .models.model_config import ModelConfig
from .text.tokenizer import Tokenizer
from .weights import load_weights, resolve_model_path
from .weights.gguf_file import GGUFFile
from .weights.load import open_source

Progress = Callable[[str], None]
# When the compiled programs are built: "all" before load returns (benchmarks, tests); "start" a few before,
# the rest in the background while requests are served (the server); "lazy" each when a request first needs it
# (the CLI, which also calls Engine.prepare with each of its requests).
Compile = Literal["all", "start", "lazy"]
log = logging.getLogger("typewriter.runtime")


@dataclass
class LoadTimes:
    load_s: float
    compile_s: float


CHUNK_BUCKETS = (16, 64, 256)  # prompt tokens per prefill call, padded up to one of these
# int8-lite's longest prefill call: 256 tokens cost about as much a token as 64, but each of its programs keeps
# buffers for the most rows it ran (docs/measurements/2026-12-03-int8-lite.md).
LITE_CHUNK = 64


def batch_buckets(slots: int) -> tuple[int, ...]:
    """Decode batch sizes: 1, 2, 4, then every 4 up to the slot count, so a step never computes more than 3 idle
    rows (a step's cost grows with its rows once there are more than a few)."""
    return tuple(sorted({b for b in (1, 2, 4, *range(8, slots + 1, 4)) if b < slots} | {slots}))


def read_model(path: Path, weight_progress=None) -> tuple[ModelConfig, dict, Tokenizer]:
    """The config, canonical weights and tokenizer of a resolved model path; a GGUF file is parsed once, for the
    weights and the tokenizer."""
    source, _ = open_source(path)
    cfg, weights = load_weights(source, weight_progress)
    return cfg, weights, _tokenizer(path, source)


def _tokenizer(path: Path, source) -> Tokenizer:
    return Tokenizer.from_gguf(path, source.fields) if isinstance(source, GGUFFile) else Tokenizer.load(path)


class _LiteEntry(NamedTuple):
    cache: ProgramCache
    key: str
    cfg: ModelConfig
    weight_format: str


def _lite_entry(path: Path, source, weight_format: str | None, program_cache: str | None) -> _LiteEntry | None:
    """Where int8-lite's programs for this model file are kept; None without a cache, for a model directory, or
    for a model that does not run as int8-lite (a bad config too: load_weights names the problem)."""
    from .config import Settings
    from .runners.lite.runner import FORMATS as LITE

    if program_cache is None or not path.is_file():
        return None
    try:
        cfg = source.config()
    except (KeyError, TypeError, ValueError):
        return None
    if (weight_format := resolve_format(cfg, weight_format or Settings.weights)) not in LITE:
        return None
    return _LiteEntry(ProgramCache(program_cache), cache_key(path, cfg, weight_format), cfg, weight_format)


def resolve_format(cfg: ModelConfig, weight_format: str) -> str:
    """"auto": int8-lite where it runs (Llama-family models), fp32 elsewhere; any other format as it is."""
    if weight_format != "auto":
        return weight_format
    return "int8-lite" if cfg.family == "llama" else "fp32"


def calibration_ids(tokenizer: Tokenizer) -> list[int]:
    """int8-lite's calibration text (runners/lite/calibration.py) in the model's own tokens."""
    from .runners.lite.calibration import text

    return tokenizer.encode(text())


def build_runner(cfg: ModelConfig, weights, slots: int, max_context: int, weight_format: str | None = None,
                 progress: Progress = lambda _: None, programs=None, kernel_cache: str | None = None,
                 calibration: list[int] | None = None):
    """`weight_format`: one of config.WEIGHT_FORMATS, None for Settings' default. For XLA's formats, buckets trade
    compile time (each is one XLA program, seconds to compile) against padding waste: prompt chunks pad to
    CHUNK_BUCKETS, attention reads 256/512/1024/... cached positions, and a decode step runs one of
    batch_buckets(slots) rows. int8-lite has no buckets (runners/lite/runner.py), and runs on LiteRT alone: it never
    imports TensorFlow (seconds and hundreds of MB,
    docs/measurements/2026-12-03-int8-lite-one-pass-litert-program-cache.md); `programs` are its programs made before
    (then `weights` may be None), and its attention kernel (runners/lite/kernel.py) is built into `kernel_cache`
    (None: a temporary folder);
    `calibration` is the token ids it rounds its weights by (calibration_ids; None: to nearest)."""
    import sys

    from .config import Settings
    from .runners.lite.runner import FORMATS as LITE
    from .runners.lite.runner import LiteRunner

    max_context = min(max_context, cfg.max_position)
    chunks = tuple(c for c in CHUNK_BUCKETS if c < max_context) or (max_context,)
    weight_format = resolve_format(cfg, weight_format or Settings.weights)
    if weight_format in LITE:
        from .runners.lite.kernel import load as load_kernel

        return LiteRunner(cfg, weights, slots=slots, max_len=max_context, max_chunk=min(LITE_CHUNK, chunks[-1]),
                          progress=progress, programs=programs, kernel=load_kernel(kernel_cache),
                          calibration=calibration, weight_format=weight_format)
    from .runners.quiet_import import import_tensorflow

    if "tensorflow" not in sys.modules:
        progress("starting TensorFlow")  # seconds: say what the wait is
    import_tensorflow()
    from .runners.xla.model import Transformer
    from .runners.xla.runner import ModelRunner, power_of_two_buckets

    model = Transformer(cfg, weights, slots=slots, max_len=max_context, max_chunk=chunks[-1],
                        kv_buckets=power_of_two_buckets(min(256, max_context), max_context),
                        weight_format=weight_format)
    return ModelRunner(model, chunk_buckets=chunks, batch_buckets=batch_buckets(slots))


def load_engine(settings, progress: Progress = lambda _: None) -> tuple[Engine, Tokenizer]:
    """Load the model named by `settings.model_path` (None: the embedded one) and start its engine thread,
    ready once its first programs are compiled (the others follow in the background)."""
    engine, tokenizer, _ = load(settings.model_path, slots=settings.max_active, max_context=settings.max_context,
                                max_queue=settings.max_queue, prefill_budget=settings.prefill_budget,
                                progress=progress, compile="start", queue_timeout_s=settings.queue_timeout_s,
                                weight_format=settings.weights, program_cache=lite_cache_dir())
    return engine, tokenizer


def load(
    model_path: str | Path | None,
    *,
    slots: int,
    max_context: int,
    max_queue: int,
    prefill_budget: int,
    progress: Progress = lambda _: None,
    compile: Compile = "all",
    queue_timeout_s: float | None = None,
    weight_format: str | None = None,
    program_cache: str | None = None,
) -> tuple[Engine, Tokenizer, LoadTimes]:
    """Load a model and start its engine: `slots` streams decoded together, `max_context` tokens of KV cache each,
    `max_queue` requests that may wait for a slot, `prefill_budget` prompt tokens per step beside decoding, matrices in
    `weight_format` (None: Settings'), int8-lite's programs kept in the folder `program_cache` (None: made every
    time; config.lite_cache_dir is the commands' default). No other defaults: the server's come from Settings, and
    each command says why its own fit."""
    t0 = time.perf_counter()
    path = resolve_model_path(model_path)
    progress(f"loading {path}")

    def weight_progress(done: int, total: int) -> None:
        if done == total or done % max(1, total // 10) == 0:
            progress(f"weights {done}/{total}")

    source, _ = open_source(path)  # parsed once, for the cache's key, the weights and the tokenizer
    entry, runner = _lite_entry(path, source, weight_format, program_cache), None
    if entry and (programs := entry.cache.load(entry.key, entry.cfg.n_layers)):
        progress(f"int8-lite: programs from {program_cache}")
        try:
            runner = build_runner(entry.cfg, None, slots, max_context, weight_format, progress, programs,
                                  program_cache)
            cfg, tokenizer = entry.cfg, _tokenizer(path, source)
        except (ValueError, RuntimeError) as e:  # LiteRT refused a cached flatbuffer: make them again
            log.warning("the cached int8-lite programs in %s did not load (%s); making them again", program_cache, e)
            progress("int8-lite: the cached programs did not load; making them again")
            entry.cache.discard(entry.key)
    if runner is None:
        cfg, weights = load_weights(source, weight_progress)
        tokenizer = _tokenizer(path, source)
        runner = build_runner(cfg, weights, slots, max_context, weight_format, progress,
                              kernel_cache=program_cache, calibration=calibration_ids(tokenizer))
        del weights
        if entry:
            entry.cache.save(entry.key, runner.flatbuffers, path, entry.weight_format)
    return_freed_memory()
    load_s = time.perf_counter() - t0
    progress(f"loaded {cfg.name} in {load_s:.1f}s")
    t1 = time.perf_counter()
    if not runner.compile_status()["total"]:
        pass  # int8-lite: its programs were made with the runner, nothing compiles
    elif compile == "all":
        runner.warmup(lambda i, n, label: progress(f"compiled {i}/{n}: {label}"))
        progress(f"compiled every program in {time.perf_counter() - t1:.1f}s")
    elif compile == "start":
        first, total = runner.first_programs(), runner.compile_status()["total"]
        runner.compile_all(first, lambda i, n, label: progress(f"compiled {i}/{total}: {label}"))
        progress(f"compiled {len(first)} programs in {time.perf_counter() - t1:.1f}s; the rest follow in the "
                 "background")
        runner.compile_in_background(lambda i, n, label: log.info("compiled %d/%d in the background: %s", i, n,
                                                                   label))
    else:
        runner.on_demand = lambda name: progress(f"compiling {name} (first use)")
    compile_s = time.perf_counter() - t1
    engine = Engine(runner, tokenizer, max_queue=max_queue, prefill_budget=prefill_budget, model_name=cfg.name,
                    queue_timeout_s=queue_timeout_s).start()
    return engine, tokenizer, LoadTimes(load_s, compile_s)
