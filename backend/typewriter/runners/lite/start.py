"""Open an int8-lite runner for a model: its programs from the cache when the cache holds this file's, else made
from the weights (rounded by GPTQ on the calibration text) and saved for the next start."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from ...engine.capacity import PROBE_ROWS, StepModel
from ...architecture.model_config import ModelConfig
from .calibration import text as calibration_text
from .kernel import load as load_kernel
from .program_cache import ProgramCache, cache_key
from .programs import make_programs
from .runner import FORMAT, FORMATS, LiteRunner, report_progress

log = logging.getLogger("typewriter.lite")
# The longest prefill chunk: 256 tokens cost about as much a token as 64, but each of the programs keeps buffers
# for the most rows it ran (docs/measurements/2026-12-03-int8-lite.md).
MAX_CHUNK = 64
Progress = Callable[[str], None]
CAPACITY = "capacity.json"  # beside a cache entry's programs: the step times measured on this machine
PROBE_VERSION = 2  # how they were measured: a kept measurement of another version is measured again


def build(cfg: ModelConfig, weights: Mapping[str, np.ndarray] | None, slots: int, max_context: int,
          weight_format: str = FORMAT, progress: Progress = lambda _: None, programs=None,
          kernel_cache: str | None = None, calibration: list[int] | None = None) -> LiteRunner:
    """A runner from `weights`, or from `programs` made before (then `weights` may be None). Its attention kernel
    is built into `kernel_cache` (None: a temporary folder); `calibration`: the token ids it rounds its weights
    by (calibration_ids; None: to nearest)."""
    max_context = min(max_context, cfg.max_position)
    return LiteRunner(cfg, weights, slots=slots, max_len=max_context, max_chunk=min(MAX_CHUNK, max_context),
                      progress=progress, programs=programs, kernel=load_kernel(kernel_cache),
                      calibration=calibration, weight_format=weight_format)


def calibration_ids(encode: Callable[[str], list[int]]) -> list[int]:
    """int8-lite's calibration text (calibration.py) in the model's own tokens."""
    return encode(calibration_text())


def open_runner(path: Path, cfg: ModelConfig, weights: Callable[[], Mapping[str, np.ndarray]],
                encode: Callable[[str], list[int]], slots: int, max_context: int, weight_format: str,
                program_cache: str | None, progress: Progress = lambda _: None) -> LiteRunner:
    """The runner for the model at `path`: `weights()` (the canonical tensors, best read lazily: the programs are
    made a layer at a time) and `encode` (text to the model's tokens) are called only when its programs must be
    made. `program_cache`: the folder the programs are kept in (None: made every time, in a temporary folder);
    a model directory (not one file) is never cached."""
    if weight_format not in FORMATS:
        raise ValueError(f"int8-lite runs {' and '.join(FORMATS)}, not {weight_format!r}")
    cache = ProgramCache(program_cache if path.is_file() else None)
    key = cache_key(path, cfg, weight_format) if cache.root else "uncached"
    if programs := cache.load(key, cfg.n_layers):
        progress(f"int8-lite: programs from {program_cache}")
        try:
            return build(cfg, None, slots, max_context, weight_format, progress, programs, program_cache)
        except (ValueError, RuntimeError) as e:  # LiteRT refused a cached flatbuffer: make them again
            log.warning("the cached int8-lite programs in %s did not load (%s); making them again", program_cache, e)
            progress("int8-lite: the cached programs did not load; making them again")
            cache.discard(key)
    with cache.making(key) as folder:
        made = make_programs(cfg, weights(), folder, lambda i, n: report_progress(progress, i, n),
                             calibration_ids(encode), two_pass=weight_format == FORMAT,
                             kernel=load_kernel(program_cache))
        programs = cache.save(key, made, path, weight_format)
        return build(cfg, None, slots, max_context, weight_format, progress, programs, program_cache)


def fit_step_model(runner: LiteRunner, folder: Path | None, rounds: int = 6, measure_now: bool = True
                   ) -> StepModel | None:
    """The runner's decode-only step time as engine/capacity.py models it: read from `folder` (a cache entry) when
    it was measured there on a CPU like this one, else measured now with probe steps (their K/V writes are
    dropped by the caller's `reset_cache`) and kept there; None when not kept and not `measure_now`."""
    known = folder / CAPACITY if folder is not None else None
    cpu = _cpu_signature()
    if known is not None and known.is_file():
        try:
            saved = json.loads(known.read_text())
            if saved["cpu"] == cpu and saved.get("probe") == PROBE_VERSION:
                return StepModel(**saved["model"])
        except (OSError, ValueError, KeyError, TypeError):
            pass  # measured again, and written over
    if not measure_now:
        return None

    def measure(probes: list[tuple[int, int]]) -> list[float]:
        times: list[list[float]] = [[] for _ in probes]
        for _ in range(rounds):  # in turns, so a moment of noise touches every probe or few of one
            for i, (rows, position) in enumerate(probes):
                slots, tokens, positions = list(range(rows)), [1] * rows, [position] * rows
                runner.step(slots, tokens, positions)  # untimed: a new row count resizes the programs' buffers
                t0 = time.perf_counter()
                runner.step(slots, tokens, positions)
                times[i].append(time.perf_counter() - t0)
        return [min(t) for t in times]  # the machine's noise only adds

    model = StepModel.fit(measure, runner.max_len, rows=max(2, min(PROBE_ROWS, runner.slots)))
    if known is not None:
        try:
            known.write_text(json.dumps({"cpu": cpu, "probe": PROBE_VERSION, "model": dataclasses.asdict(model)}))
        except OSError:
            pass  # measured again at the next start
    return model


def _cpu_signature() -> str:
    """What the step times depend on besides the model: the CPU's name, its flags and how many it has."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        info = ""
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "")
    flags = next((line for line in info.splitlines() if line.startswith("flags")), "")
    return f"{name}|{os.cpu_count()}|{hashlib.sha256(flags.encode()).hexdigest()[:12]}"
