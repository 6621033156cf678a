"""Put the parts together: a model's files -> its config, tokenizer and runner -> a running engine. The weight
format is resolved for the model's family (`WeightFormat.resolved`), then each runtime is opened its one way
(`open_runner` in runners/lite/start.py or runners/xla/start.py), which owns its cache, slot sizing and warm-up.
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .architecture.model_config import ModelConfig
from .config import Settings, WeightFormat, lite_cache_dir
from .engine.engine import Engine
from .engine.runner import Runner
from .heap import release_mapped, return_freed_memory
from .runners.lite.kernel import blocks_run_wide
from .runners.options import Compile, Progress, RunnerOptions
from .text.tokenizer import Tokenizer
from .weights import load_weights, resolve_model_path
from .weights.gguf_file import GGUFFile
from .weights.source import Source, open_source, read_config


@dataclass(frozen=True)
class Opened:
    runner: Runner
    tokenizer: Tokenizer
    cfg: ModelConfig
    path: Path


@dataclass(frozen=True)
class LoadTimes:
    load_s: float  # from the model's path to a runner ready to serve
    compile_s: float  # of which compiling programs (XLA; int8-lite compiles nothing)


def weights_for(cfg: ModelConfig, weights: WeightFormat | str = WeightFormat.AUTO) -> WeightFormat:
    """`weights` made concrete for the model `cfg` on this machine (`auto`: by runners/lite/kernel.py's
    blocks_run_wide)."""
    return WeightFormat(weights).resolved(cfg.family, blocks_run_wide(cfg.head_dim))


def open_runner(model_path: str | Path | None, options: RunnerOptions,
                progress: Progress = lambda _: None) -> Opened:
    """`model_path` None: the embedded model."""
    path = resolve_model_path(model_path)
    progress(f"loading {path}")
    source, _ = open_source(path)  # parsed once, for the config, the weights and the tokenizer
    cfg = read_config(source)
    options = dataclasses.replace(options, weights=weights_for(cfg, options.weights))
    # The tokenizer is built beside the runner, whose program files' digests run without the GIL meanwhile
    # (docs/measurements/2026-12-05-cached-start.md); a runner that needs it first (to calibrate) waits for it.
    with ThreadPoolExecutor(1, thread_name_prefix="typewriter-tokenizer") as pool:
        building = pool.submit(_tokenizer, path, source)

        def encode(text: str) -> list[int]:
            return building.result().encode(text)

        if options.weights.lite:
            from .runners.lite.start import open_runner as open_lite

            runner: Runner = open_lite(source, cfg, encode, options, progress)
        else:
            from .runners.xla.start import open_runner as open_xla

            runner = open_xla(source, cfg, encode, options, progress)
        tokenizer = building.result()
    return_freed_memory()
    # the model file's pages that making the runner and the tokenizer read (all of it, where the blocks were packed
    # from it): q4-blocks reads the file's embedding rows again, a token's at a time
    # (docs/measurements/2026-12-06-q4-blocks-alone.md)
    release_mapped(path)
    return Opened(runner, tokenizer, cfg, path)


def load(
    model_path: str | Path | None,
    *,
    slots: int | None,
    max_context: int,
    max_queue: int,
    prefill_budget: int,
    progress: Progress = lambda _: None,
    compile: Compile = "all",
    queue_timeout_s: float | None = None,
    weight_format: WeightFormat | str = WeightFormat.AUTO,
    program_cache: str | None = None,
    keep_for_readers_s: float = 0.0,
    draft_tokens: int = 0,
) -> tuple[Engine, Tokenizer, LoadTimes]:
    """`slots` None: as many as this machine carries, or XLA's fixed count; `program_cache` None: int8-lite's
    programs made every time. No other defaults: the server's come from Settings, and each command picks its own."""
    t0 = time.perf_counter()
    options = RunnerOptions(WeightFormat(weight_format), max_context, slots, program_cache, compile)
    opened = open_runner(model_path, options, progress)
    runner = opened.runner
    load_s = time.perf_counter() - t0
    progress(f"loaded {opened.path.name} in {load_s:.1f}s")  # the file: its general.name is no stable id
    engine = Engine(runner, opened.tokenizer, max_queue=max_queue, prefill_budget=prefill_budget,
                    model_name=opened.cfg.name, queue_timeout_s=queue_timeout_s, parameters=opened.cfg.parameters,
                    keep_for_readers_s=keep_for_readers_s, draft_tokens=draft_tokens)
    compile_s = runner.compiler.warm_up_s if runner.compiler is not None else 0.0
    return engine.start(), opened.tokenizer, LoadTimes(load_s, compile_s)


def load_engine(settings: Settings, progress: Progress = lambda _: None) -> tuple[Engine, Tokenizer]:
    """Ready once its first programs are compiled; the others follow in the background."""
    engine, tokenizer, _ = load(settings.model.model_path, slots=settings.engine.max_active, max_context=settings.engine.max_context,
                                max_queue=settings.engine.max_queue, prefill_budget=settings.engine.prefill_budget,
                                progress=progress, compile="start", queue_timeout_s=settings.engine.queue_timeout_s,
                                weight_format=settings.model.weights, program_cache=lite_cache_dir(),
                                keep_for_readers_s=settings.engine.keep_for_readers_s,
                                draft_tokens=settings.engine.draft_tokens)
    return engine, tokenizer


def read_model(path: Path) -> tuple[ModelConfig, dict[str, np.ndarray], Tokenizer]:
    """For `typewriter export` and the benchmarks that compare weights; a GGUF file is parsed once."""
    source, _ = open_source(path)
    cfg, weights = load_weights(source)
    return cfg, weights, _tokenizer(path, source)


def _tokenizer(path: Path, source: Source) -> Tokenizer:
    return Tokenizer.from_gguf(path, source.fields) if isinstance(source, GGUFFile) else Tokenizer.load(path)


def export(model_path: str | Path | None, out: Path, max_context: int, progress: Progress = lambda _: None) -> Path:
    """`typewriter export`: the model as a TensorFlow SavedModel in the new folder `out`."""
    from .runners.xla.export import check_out, write_saved_model

    check_out(out)
    path = resolve_model_path(model_path)
    progress(f"loading {path}")
    cfg, weights, tokenizer = read_model(path)
    return write_saved_model(cfg, weights, tokenizer, path, out, max_context, progress)
