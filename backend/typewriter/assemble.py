"""Put the parts together: a model's files -> its config, tokenizer and runner -> a running engine.

Which runner: int8-lite (runners/lite/) for a Llama-family model at `--weights auto`, XLA (runners/xla/) for
every other family and format. Each runtime owns its own cache and warm-up; this module only picks one, hands it
what it asks for, and starts the engine.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .engine.capacity import MOST_SLOTS, Sizing, StepModel, size_slots, typical_position
from .engine.engine import Engine
from .architecture.model_config import ModelConfig
from .runners.heap import return_freed_memory
from .text.tokenizer import Tokenizer
from .weights import load_weights, resolve_model_path
from .weights.gguf_file import GGUFFile
from .weights.source import open_source, read_config, weight_reader

Progress = Callable[[str], None]
XLA_SLOTS = 8  # XLA compiles a program per batch size: a fixed count keeps the compiling bounded
log = logging.getLogger("typewriter.assemble")
LITE_FORMATS = ("int8-lite", "int8-lite-fast")  # runners/lite/runner.py's FORMATS, without importing LiteRT


@dataclass
class LoadTimes:
    load_s: float
    compile_s: float


def resolve_format(cfg: ModelConfig, weight_format: str) -> str:
    """"auto": int8-lite where it runs (Llama-family models), fp32 elsewhere; any other format as it is."""
    if weight_format != "auto":
        return weight_format
    return "int8-lite" if cfg.family == "llama" else "fp32"


def read_model(path: Path, weight_progress=None) -> tuple[ModelConfig, dict, Tokenizer]:
    """The config, canonical weights and tokenizer of a resolved model path; a GGUF file is parsed once, for the
    weights and the tokenizer."""
    source, _ = open_source(path)
    cfg, weights = load_weights(source, weight_progress)
    return cfg, weights, _tokenizer(path, source)


def _tokenizer(path: Path, source) -> Tokenizer:
    return Tokenizer.from_gguf(path, source.fields) if isinstance(source, GGUFFile) else Tokenizer.load(path)


def calibration_ids(tokenizer: Tokenizer) -> list[int]:
    """int8-lite's calibration text in the model's own tokens."""
    from .runners.lite.start import calibration_ids

    return calibration_ids(tokenizer.encode)


def build_runner(cfg: ModelConfig, weights, slots: int, max_context: int, weight_format: str | None = None,
                 progress: Progress = lambda _: None, programs=None, kernel_cache: str | None = None,
                 calibration: list[int] | None = None):
    """The runner of `weight_format` (one of config.WEIGHT_FORMATS; None for Settings' default) over `weights`,
    nothing compiled yet. int8-lite's own arguments: `programs` made before (then `weights` may be None), the
    folder its attention kernel is built into, and the token ids it rounds its weights by."""
    from .config import Settings

    weight_format = resolve_format(cfg, weight_format or Settings.weights)
    if weight_format in LITE_FORMATS:
        from .runners.lite import start as lite

        return lite.build(cfg, weights, slots, max_context, weight_format, progress, programs, kernel_cache,
                          calibration)
    from .runners.xla import start as xla

    return xla.build(cfg, weights, slots, max_context, weight_format, progress)


def load_engine(settings, progress: Progress = lambda _: None) -> tuple[Engine, Tokenizer]:
    """Load the model named by `settings.model_path` (None: the embedded one) and start its engine thread,
    ready once its first programs are compiled (the others follow in the background)."""
    from .config import lite_cache_dir

    engine, tokenizer, _ = load(settings.model_path, slots=settings.max_active, max_context=settings.max_context,
                                max_queue=settings.max_queue, prefill_budget=settings.prefill_budget,
                                progress=progress, compile="start", queue_timeout_s=settings.queue_timeout_s,
                                weight_format=settings.weights, program_cache=lite_cache_dir())
    return engine, tokenizer


def load(
    model_path: str | Path | None,
    *,
    slots: int | None,
    max_context: int,
    max_queue: int,
    prefill_budget: int,
    progress: Progress = lambda _: None,
    compile: str = "all",
    queue_timeout_s: float | None = None,
    weight_format: str | None = None,
    program_cache: str | None = None,
) -> tuple[Engine, Tokenizer, LoadTimes]:
    """Load a model and start its engine: `slots` streams decoded together (None: as many as this machine carries
    under the capacity bar, measured for int8-lite (engine/capacity.py), XLA_SLOTS for XLA's programs, compiled
    per batch size), `max_context` tokens of KV cache each,
    `max_queue` requests that may wait for a slot, `prefill_budget` prompt tokens per step beside decoding, matrices in
    `weight_format` (None: Settings'), int8-lite's programs kept in the folder `program_cache` (None: made every
    time; config.lite_cache_dir is the commands' default). `compile` (XLA's programs): "all" before this returns,
    "start" a few before and the rest in the background, "lazy" each on first use (runners/xla/start.py). No other
    defaults: the server's come from Settings, and each command says why its own fit."""
    from .config import Settings

    t0 = time.perf_counter()
    path = resolve_model_path(model_path)
    progress(f"loading {path}")

    def weight_progress(done: int, total: int) -> None:
        if done == total or done % max(1, total // 10) == 0:
            progress(f"weights {done}/{total}")

    source, _ = open_source(path)  # parsed once, for the config, the weights and the tokenizer
    tokenizer = _tokenizer(path, source)
    cfg = read_config(source)
    weight_format = resolve_format(cfg, weight_format or Settings.weights)
    if weight_format in LITE_FORMATS:
        from .runners.lite.start import open_runner

        runner = open_runner(path, cfg, lambda: weight_reader(source)[1], tokenizer.encode, slots or MOST_SLOTS,
                             max_context, weight_format, program_cache, progress)
        sizing, step_model = _size_lite(runner, slots, program_cache, progress)
    else:
        from .runners.xla import start as xla

        cfg, weights = load_weights(source, weight_progress)
        runner = xla.build(cfg, weights, slots or XLA_SLOTS, max_context, weight_format, progress)
        sizing, step_model = Sizing(runner.slots, "set" if slots else "XLA's default"), None
        del weights
    return_freed_memory()
    load_s = time.perf_counter() - t0
    progress(f"loaded {path.name} in {load_s:.1f}s")  # the file: its general.name is no stable id
    t1 = time.perf_counter()
    if runner.compiler is not None:
        xla.warm_up(runner, compile, progress)
    position = typical_position(runner.max_len)
    engine = Engine(runner, tokenizer, max_queue=max_queue, prefill_budget=prefill_budget, model_name=cfg.name,
                    queue_timeout_s=queue_timeout_s,
                    decode_prior=None if step_model is None else lambda rows: step_model.step_s(rows, position))
    engine.sizing = sizing
    log.info("%d slots (%s)", sizing.slots, sizing.sized_by)
    return engine.start(), tokenizer, LoadTimes(load_s, time.perf_counter() - t1)


def _size_lite(runner, slots: int | None, program_cache: str | None, progress: Progress
               ) -> tuple[Sizing, StepModel | None]:
    """The slot count: `slots` as given, else sized from the runner's measured step times (kept beside its cached
    programs, so a warm start measures nothing) and the memory available; and the step times (with `slots` given,
    only those already kept). The probe's K/V writes are dropped."""
    from .runners.lite.start import fit_step_model

    folder = runner.programs.folder
    cached = program_cache is not None and folder.parent == Path(program_cache)
    if slots is not None:
        return Sizing(slots, "set"), fit_step_model(runner, folder if cached else None, measure_now=False)
    progress("int8-lite: sizing the slots by step time")
    model = fit_step_model(runner, folder if cached else None)
    cfg = runner.cfg
    kv_bytes = cfg.n_layers * 2 * cfg.n_kv_heads * cfg.head_dim * 2  # float16 keys and values a token
    sizing = size_slots(model, runner.max_len, kv_bytes, _available_memory())
    runner.reset_cache(sizing.slots)
    progress(f"int8-lite: {sizing.slots} slots ({sizing.sized_by}: a decode step of {sizing.step_ms:.0f} ms)")
    return sizing, model


def _available_memory() -> int | None:
    """MemAvailable from /proc/meminfo, in bytes; None where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def export(model_path: str | Path | None, out: Path, max_context: int, progress: Progress = lambda _: None) -> Path:
    """`typewriter export`: the model as a TensorFlow SavedModel in the new folder `out`."""
    from .runners.xla.export import check_out, write_saved_model

    check_out(out)
    path = resolve_model_path(model_path)
    progress(f"loading {path}")
    cfg, weights, tokenizer = read_model(path)
    return write_saved_model(cfg, weights, tokenizer, path, out, max_context, progress)
