"""Open an int8-lite runner for a model: its programs from the cache when the cache holds this file's, else made
from the weights (rounded by GPTQ on the calibration text) and saved for the next start; its slots sized by the
step times measured on this machine (kept beside the cached programs, so a warm start measures nothing, unless
they were measured while other processes kept the machine busy). q4-blocks makes no programs: it packs the file's
blocks, once, and maps them from its own cache entry at later starts (blocks_cache.py)."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ...architecture.model_config import ModelConfig
from ...config import WeightFormat
from ...engine.capacity import MOST_SLOTS, PROBE_ROWS, Probe, Sizing, StepModel, size_slots, typical_position
from ...errors import ModelFormatError
from ...weights.source import Source, weight_reader
from ..options import Encode, Progress, RunnerOptions
from . import blocks_cache
from .blocks import BlockModel
from .calibration import text as calibration_text
from .kernel import TILE as KERNEL_TILE
from .kernel import Kernel
from .kernel import load as load_kernel
from .machine import OthersBusy, available_memory, cpu_signature
from .program_cache import ProgramCache, cache_key
from .programs import ProgramSet, make_programs
from .runner import FORMATS, LiteRunner, report_progress

log = logging.getLogger("typewriter.lite")
# Longer chunks cost no less a token, and each program keeps buffers for the most rows it ran
# (docs/measurements/2026-12-03-int8-lite.md).
MAX_CHUNK = 64
CAPACITY = "capacity.json"  # in a format's cache entry: the step times measured on this machine
PROBE_VERSION = 3  # how they were measured: a kept measurement of another version is measured again
# Starts that measure the step times while other processes keep the machine busy; past them the fastest stands: a
# machine always that busy (a poller, a neighbour) would otherwise measure again at every start, for seconds.
MOST_PROBES = 3


def open_runner(source: Source, cfg: ModelConfig, encode: Encode, options: RunnerOptions,
                progress: Progress = lambda _: None) -> LiteRunner:
    """int8-lite's one way in. `encode` spells the calibration text in the model's own tokens; the slots are sized
    for this machine unless `options.slots` sets them. A model directory (not one file) is never cached."""
    weight_format = options.weights
    if not weight_format.lite:
        raise ValueError(f"int8-lite runs {' and '.join(f.value for f in FORMATS)}, not {weight_format.value!r}")
    if cfg.family != "llama":
        raise ModelFormatError(f"the {weight_format.value} weight format runs Llama-family models; {cfg.name} is "
                               f"{cfg.family}: use --weights fp32 or auto")
    path, program_cache = source.path, options.program_cache
    # a first start's `cc` runs beside the tokenizer's making; a later one only maps the library
    pool = ThreadPoolExecutor(1, thread_name_prefix="typewriter-kernel")
    building = pool.submit(load_kernel, program_cache)
    pool.shutdown(wait=False)
    slots = options.slots or MOST_SLOTS  # sized down below
    cache = ProgramCache(program_cache if path.is_file() else None)
    layout = blocks_cache.LAYOUT if weight_format is WeightFormat.Q4_BLOCKS else ""
    key = cache_key(path, cfg, weight_format.value, layout) if cache.root else "uncached"
    if weight_format is WeightFormat.Q4_BLOCKS:
        runner, kept = _blocks_runner(source, cfg, encode, slots, options, progress, cache, key, building.result())
    else:
        runner = _programs_runner(source, cfg, encode, slots, options, progress, cache, key, building)
        assert runner.programs is not None
        kept = runner.programs.set.folder if cache.root is not None else None
    if options.slots is not None:
        runner.sizing = Sizing(options.slots, "set")
        known = fit_step_model(runner, kept, measure_now=False)
        runner.step_model = known.model if known is not None else None
        return runner
    progress(f"{weight_format.value}: sizing the slots by step time")
    probe = fit_step_model(runner, kept, progress=progress)
    assert probe is not None
    runner.step_model = probe.model
    kv_bytes = cfg.n_layers * 2 * cfg.n_kv_heads * cfg.head_dim * 2  # float16 keys and values a token
    runner.sizing = sizing = size_slots(probe, runner.max_len, kv_bytes, available_memory())
    runner.reset_cache(sizing.most or sizing.slots)  # the engine opens `slots` of them; the rest stay untouched
    progress(f"{weight_format.value}: {sizing.summary()}")
    return runner


def _programs_runner(source: Source, cfg: ModelConfig, encode: Encode, slots: int, options: RunnerOptions,
                     progress: Progress, cache: ProgramCache, key: str, building: Future[Kernel | None]) -> LiteRunner:
    """int8-lite's programs from the cache, else made (and saved)."""
    weight_format = options.weights
    if programs := cache.load(key, cfg.n_layers):
        progress(f"int8-lite: programs from {cache.root}")
        try:
            return _runner(cfg, slots, options, progress, programs, building.result())
        except (ValueError, RuntimeError) as e:  # LiteRT refused a cached flatbuffer: make them again
            log.warning("the cached int8-lite programs in %s did not load (%s); making them again", cache.root, e)
            progress("int8-lite: the cached programs did not load; making them again")
            cache.discard(key)
    with cache.making(key) as folder:
        made = make_programs(cfg, weight_reader(source)[1], folder, lambda i, n: report_progress(progress, i, n),
                             calibration_ids(encode), two_pass=weight_format is WeightFormat.INT8_LITE,
                             kernel=building.result())
        programs = cache.save(key, made, source.path, weight_format.value)
        return _runner(cfg, slots, options, progress, programs, building.result())


def _runner(cfg: ModelConfig, slots: int, options: RunnerOptions, progress: Progress,
            programs: ProgramSet | None, kernel: Kernel | None, blocks: BlockModel | None = None) -> LiteRunner:
    max_context = min(options.max_context, cfg.max_position)
    return LiteRunner(cfg, None, slots=slots, max_len=max_context, max_chunk=min(MAX_CHUNK, max_context),
                      progress=progress, programs=programs, kernel=kernel, weight_format=options.weights,
                      blocks=blocks)


def _blocks_runner(source: Source, cfg: ModelConfig, encode: Encode, slots: int, options: RunnerOptions,
                   progress: Progress, cache: ProgramCache, key: str,
                   kernel: Kernel | None) -> tuple[LiteRunner, Path | None]:
    """q4-blocks: the file's blocks mapped from the cache, else packed (and saved, once the tokenizer is known to
    be made: a model that cannot be served keeps nothing); with the entry kept, if any."""
    if kernel is None or cfg.head_dim % KERNEL_TILE:
        raise ModelFormatError(f"--weights q4-blocks runs in int8-lite's C kernel, which cannot run {cfg.name} here "
                               "(see the warning above, or its heads are not a multiple of "
                               f"{KERNEL_TILE} channels): use --weights int8-lite")
    weights = weight_reader(source)[1]
    t0 = time.perf_counter()
    blocks, packed = None, None
    if (mapped := blocks_cache.load(cache, key)) is not None:
        packed = mapped.matrices
        try:
            # damage the check finds (at the kernel's first read) is packed again then, and kept again
            blocks = BlockModel(cfg, weights, kernel, packed, check=mapped.check,
                                repacked=lambda again: blocks_cache.save(cache, key, again, source.path))
            progress(f"q4-blocks: blocks from {cache.root}")
            kept = cache.entry(key)
        except ValueError as e:  # a manifest that names other shapes than the model's
            log.warning("the q4-blocks cache entry for %s does not fit the model (%s); packing the blocks again",
                        source.path.name, e)
            cache.discard(key)
            packed = None
    if blocks is None:
        progress("q4-blocks: packing the file's blocks")
        blocks = BlockModel(cfg, weights, kernel, progress=lambda i, n: _report_packing(progress, i, n))
        encode("")  # waits for the tokenizer: its refusal ends the load here
        kept = blocks_cache.save(cache, key, blocks, source.path)
    log.info("q4-blocks: %.0f MB of blocks %s in %.1fs", blocks.nbytes / 1e6,
             "packed" if packed is None else "mapped", time.perf_counter() - t0)
    return _runner(cfg, slots, options, progress, None, kernel, blocks), kept


def _report_packing(progress: Progress, done: int, total: int) -> None:
    if done % max(1, total // 5) == 0 or done == total:
        progress(f"q4-blocks: layer {done}/{total} packed")


def calibration_ids(encode: Encode) -> list[int]:
    return encode(calibration_text())


def fit_step_model(runner: LiteRunner, folder: Path | None, rounds: int = 6, measure_now: bool = True,
                   progress: Progress = lambda _: None) -> Probe | None:
    """Read from `folder` (a cache entry) when measured there on a CPU like this one, else probed now (the caller's
    `reset_cache` drops the writes) and kept there; None when not kept and not `measure_now`. A kept probe taken
    under load is taken again, and the faster of the two kept (the machine's noise only adds), so a busy first
    start is not a machine's figure for good; after MOST_PROBES starts, busy each, the fastest stands."""
    known = folder / CAPACITY if folder is not None else None
    cpu = cpu_signature()
    before, probes = _read(known, cpu) if known is not None else (None, 0)
    if not measure_now or (before is not None and (not before.under_load or probes >= MOST_PROBES)):
        return before
    if before is not None:
        log.info("the kept step times were measured while other processes took %.0f%% of the CPU time; measuring "
                 "again", 100 * (before.others or 0.0))
        progress(f"{runner.weight_format.value}: the kept step times were measured under load; measuring again")
    probe = _probe(runner, rounds)
    if before is not None and probe.under_load and _slower(probe, before, runner.max_len):
        probe = before
    if known is not None:
        try:
            known.write_text(json.dumps({"cpu": cpu, "probe": PROBE_VERSION, "model": dataclasses.asdict(probe.model),
                                         "others": probe.others, "probes": probes + 1}))
        except OSError:
            pass  # measured again at the next start
    return probe


def _read(known: Path, cpu: str) -> tuple[Probe | None, int]:
    """The kept probe, and how many starts have measured it (0: none kept)."""
    if not known.is_file():
        return None, 0
    try:
        saved = json.loads(known.read_text())
        if saved["cpu"] == cpu and saved.get("probe") == PROBE_VERSION:
            others = saved["others"]
            return (Probe(StepModel(**saved["model"]), None if others is None else float(others)),
                    int(saved.get("probes", 1)))
    except (OSError, ValueError, KeyError, TypeError):
        pass  # measured again, and written over
    return None, 0


def _slower(probe: Probe, than: Probe, max_len: int) -> bool:
    position = typical_position(max_len)
    return probe.model.step_s(PROBE_ROWS, position) > than.model.step_s(PROBE_ROWS, position)


def _probe(runner: LiteRunner, rounds: int) -> Probe:
    busy = OthersBusy()

    def measure(probes: Sequence[tuple[int, int]]) -> list[float]:
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
    return Probe(model, busy.share())
