"""The `int8-lite` runner: one TensorFlow Lite interpreter per layer (int8 matmuls, XNNPACK), attention and the
K/V cache on the host between them (attention.py). Each engine step is one pass of the programs, so the weights are
read once however many prompts it prefills; each call resizes them to its own rows, so none pays for padding.

As `q4-blocks` there are no programs: every step runs the file's own blocks in blocks.c, every layer in one call,
whatever its rows, so the model is held once, in about the file's bytes. Its batched steps kept up with the
programs' on the embedded model and cost a row more on larger ones (docs/measurements/2026-12-06-q4-blocks-alone.md).
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal

import numpy as np

from ...architecture.model_config import ModelConfig
from ...config import WeightFormat
from ...engine.capacity import Sizing, StepModel
from ...engine.runner import PrefillChunk, Runner, StepOutput
from ...heap import release_mapped
from .attention import HostCache
from .blocks import BlockModel
from .interpreter import lite_interpreter
from .kernel import TILE as KERNEL_TILE
from .kernel import Kernel
from .kernel import load as load_kernel
from .programs import ProgramSet, make_programs

log = logging.getLogger("typewriter.lite")
FORMATS = tuple(f for f in WeightFormat if f.lite)


class _Interpreter:
    def __init__(self, program: Path, threads: int):
        self.it = lite_interpreter(program, threads)
        # at once, not once every program is open: the files' pages and XNNPACK's packed copies of the weights
        # were all resident together, the start's peak (docs/measurements/2026-12-05-cached-start.md)
        release_mapped(program)
        self.inputs = [d["index"] for d in self.it.get_input_details()]
        self.widths = [int(d["shape"][1]) for d in self.it.get_input_details()]
        self.outputs = [d["index"] for d in self.it.get_output_details()]
        self.rows = int(self.it.get_input_details()[0]["shape"][0])  # allocated at these rows already

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        rows = inputs[0].shape[0]
        if rows != self.rows:
            for index, width in zip(self.inputs, self.widths):
                self.it.resize_tensor_input(index, [rows, width])
            self.it.allocate_tensors()
            self.rows = rows
        for index, x in zip(self.inputs, inputs):
            self.it.set_tensor(index, np.ascontiguousarray(x, np.float32))
        self.it.invoke()
        return [self.it.get_tensor(index) for index in self.outputs]


class _Programs:
    """int8-lite's interpreters, a layer each, and the rotated embedding rows they read."""

    def __init__(self, programs: ProgramSet, threads: int):
        self.set = programs
        checked = programs.checked  # each file's digest, where the cache still works them out beside this
        self.first = _Interpreter(checked(programs.first), threads)
        self.layers = [_Interpreter(checked(programs.layer(i)), threads) for i in range(programs.n_layers)]
        self.logits = _Interpreter(checked(programs.logits), threads)
        self.embeddings = programs.embeddings()  # [v, d] float16, rows already rotated, mapped; checked last
        release_mapped(programs.folder)

    def forward(self, token_ids: Sequence[int], attend: Callable[[int, np.ndarray], np.ndarray]) -> np.ndarray:
        """The residual stream [n, d] after every layer, for tokens whose attention `attend(layer, qkv)` gives."""
        x = self.embeddings[np.asarray(token_ids, np.int64)].astype(np.float32)  # [n, d]
        (qkv,) = self.first(x)
        for i, layer in enumerate(self.layers):
            out = layer(x, attend(i, qkv))
            x = out[0]
            if len(out) > 1:  # the next layer's qkv (the last layer gives x alone)
                qkv = out[1]
        return x


class LiteRunner(Runner):
    compiler = None  # nothing compiles while it serves

    def __init__(self, cfg: ModelConfig, weights: Mapping[str, np.ndarray] | None, slots: int, max_len: int,
                 max_chunk: int, threads: int = 2, progress: Callable[[str], None] = lambda _: None,
                 programs: ProgramSet | None = None, kernel: Kernel | Literal["auto"] | None = "auto",
                 calibration: list[int] | None = None,
                 weight_format: WeightFormat = WeightFormat.INT8_LITE, blocks: BlockModel | None = None):
        """From `weights` (programs made in a temporary folder) or from `programs` made before, as `weight_format`.
        `kernel` "auto": one built in a temporary folder; None: numpy's attention. q4-blocks: `blocks` packed before,
        else from `weights`; no programs."""
        weight_format = WeightFormat(weight_format)
        if cfg.family != "llama":
            raise ValueError(f"the {weight_format} weight format runs Llama-family models; {cfg.name} is {cfg.family}")
        if weight_format not in FORMATS:
            raise ValueError(f"LiteRunner runs {' and '.join(f.value for f in FORMATS)}, not {weight_format.value!r}")
        t0 = time.perf_counter()
        self.weight_format = weight_format
        self.cfg, self._max_chunk = cfg, max_chunk
        if kernel == "auto":
            kernel = load_kernel(None)
        if weight_format is WeightFormat.Q4_BLOCKS:
            if not kernel or cfg.head_dim % KERNEL_TILE:
                raise ValueError(f"q4-blocks runs in the C kernel, which {cfg.name} cannot use here (no kernel built, "
                                 f"or heads of {cfg.head_dim} channels, not a multiple of {KERNEL_TILE})")
            if blocks is None:
                if weights is None:
                    raise ValueError("q4-blocks packs the model's weights: none given")
                blocks = BlockModel(cfg, weights, kernel)
        self.blocks = blocks if weight_format is WeightFormat.Q4_BLOCKS else None
        self.programs: _Programs | None = None
        if self.blocks is None:
            with contextlib.ExitStack() as made_here:
                if programs is None:  # made in a folder that is gone once its files are mapped
                    if weights is None:
                        raise ValueError("LiteRunner is made from the model's weights or from its programs: neither "
                                         "given")
                    folder = Path(made_here.enter_context(tempfile.TemporaryDirectory(prefix="typewriter-lite-")))
                    programs = make_programs(cfg, weights, folder, lambda i, n: report_progress(progress, i, n),
                                             calibration, two_pass=weight_format is not WeightFormat.INT8_LITE_FAST,
                                             kernel=kernel)
                self.programs = _Programs(programs, threads)
        if kernel and cfg.head_dim % KERNEL_TILE:
            log.warning("int8-lite's attention kernel takes heads of a multiple of %d channels, %s has %d: "
                        "attention runs in numpy", KERNEL_TILE, cfg.name, cfg.head_dim)
            kernel = None
        self.cache = HostCache(cfg, slots, max_len, kernel, threads)
        if self.blocks is not None:
            self.blocks.bind(self.cache)
        self.sizing = Sizing(slots, "set")  # start.py sizes it for this machine
        self.step_model: StepModel | None = None
        # blocks.c works each row alone, in the same order whatever rows share its step (tests/runners/lite/
        # test_runner_drafts.py). int8-lite's rows are exact alone too, but its programs allocate their tensors again
        # at each change of rows, which a draft's step makes (docs/measurements/2026-12-06-drafts.md).
        self.checks_drafts = self.blocks is not None
        log.info("%s ready in %.1fs", weight_format, time.perf_counter() - t0)

    @property
    def slots(self) -> int:
        return self.cache.slots

    @property
    def max_len(self) -> int:
        return self.cache.max_len

    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    @property
    def max_chunk(self) -> int:
        return self._max_chunk

    def reset_cache(self, slots: int) -> None:
        """Before serving: drops the capacity probe's writes."""
        cache = self.cache
        self.cache = HostCache(self.cfg, slots, cache.max_len, cache.kernel, cache.threads)
        if self.blocks is not None:
            self.blocks.bind(self.cache)

    def describe(self) -> dict[str, object]:
        attention = "kernel" if self.cache.kernel else "numpy"
        made = len(self.programs.layers) + 2 if self.programs is not None else 0  # q4-blocks makes none
        described: dict[str, object] = {"name": "int8-lite", "weights": self.weight_format.value,
                                         "attention": attention, "programs": {"made_at_load": made}}
        if self.blocks is not None:
            described["blocks"] = {"avx512_vnni": self.blocks.kernel.wide, "bytes": self.blocks.nbytes}
        return described

    def _blocks_forward(self, token_ids: Sequence[int], slots: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """The residual stream [n, d] after every layer, by blocks.c, its K/V written into the cache."""
        assert self.blocks is not None
        rows = self.cache.rows(slots, positions)
        x = self.blocks.embed(token_ids)
        self.blocks.forward(x, rows.slots_at, rows.positions_at, rows.count, self.cache.threads)
        return x

    def close(self) -> None:
        pass  # nothing runs in the background

    def step(self, slots: Sequence[int], tokens: Sequence[int], positions: Sequence[int],
             chunks: Sequence[PrefillChunk] = ()) -> StepOutput:
        """A chunk that does not end its prompt costs the logits program no row. A failure fails the whole step."""
        n = len(slots)
        # Python's max: an array's, the first array operation after the last step's kernel, cost several times more
        # (docs/measurements/2026-12-06-per-token-python.md)
        if n and (last := max(positions)) >= self.max_len:
            raise ValueError(f"position {last} is past the cache's {self.max_len}")
        decode_slots, decode_positions = np.asarray(slots, np.int64), np.asarray(positions, np.int64)
        spans, end = [], n
        for chunk in chunks:
            self._check_chunk(chunk.start, len(chunk.token_ids))
            spans.append((chunk.slot, chunk.start, end, end + len(chunk.token_ids)))
            end += len(chunk.token_ids)

        ids = [*tokens, *(t for chunk in chunks for t in chunk.token_ids)]
        if self.cache.kernel:  # every row in one call a layer, its slots and positions made once
            all_slots, all_positions = decode_slots, decode_positions
            if spans:
                all_slots = np.concatenate([decode_slots, *(np.full(b - a, slot) for slot, _, a, b in spans)])
                all_positions = np.concatenate([decode_positions, *(np.arange(start, start + b - a)
                                                                    for _, start, a, b in spans)])
            if self.blocks is not None:  # q4-blocks (which needs the kernel): every row by blocks.c
                return self._output(self._blocks_forward(ids, all_slots, all_positions), n, spans, chunks)
            rows = self.cache.rows(all_slots, all_positions)

            def attend(layer: int, qkv: np.ndarray) -> np.ndarray:
                return self.cache.attend(layer, qkv, rows)
        else:
            def attend(layer: int, qkv: np.ndarray) -> np.ndarray:
                parts = [self.cache.decode(layer, qkv[:n], decode_slots, decode_positions)] if n else []
                parts += [self.cache.extend(layer, qkv[a:b], slot, start) for slot, start, a, b in spans]
                return parts[0] if len(parts) == 1 else np.concatenate(parts)

        return self._output(self._program_set.forward(ids, attend), n, spans, chunks)

    @property
    def _program_set(self) -> _Programs:
        assert self.programs is not None, "q4-blocks runs no programs"
        return self.programs

    def _output(self, x: np.ndarray, n: int, spans: Sequence[tuple[int, int, int, int]],
                chunks: Sequence[PrefillChunk]) -> StepOutput:
        """The logits of a step's decode rows and of the chunks that want them, from its residual stream x."""
        logit_rows, wanted = list(range(n)), []
        for i, (chunk, (_, _, a, b)) in enumerate(zip(chunks, spans)):
            if chunk.wants_logits or chunk.every_logits:
                first = a if chunk.every_logits else b - 1
                wanted.append((i, len(logit_rows), len(logit_rows) + b - first, chunk.every_logits))
                logit_rows += range(first, b)
        logits = self._logits(x[logit_rows]) if logit_rows else np.zeros((0, self.vocab_size), np.float32)
        prefilled: list[np.ndarray | None] = [None] * len(spans)
        for i, a, b, every in wanted:
            prefilled[i] = logits[a:b] if every else logits[a]
        return StepOutput(logits[:n], prefilled)

    def extend(self, slot: int, start: int, token_ids: Sequence[int], all_logits: bool = False) -> np.ndarray:
        """Logits [v] after the last token; with all_logits, [n, v] after each."""
        if not all_logits:
            logits = self.step([], [], [], [PrefillChunk(slot, start, token_ids)]).prefilled[0]
            assert logits is not None
            return logits
        self._check_chunk(start, len(token_ids))
        if self.blocks is not None:
            positions = np.arange(start, start + len(token_ids))
            return self._logits(self._blocks_forward(token_ids, np.full(len(token_ids), slot), positions))
        return self._logits(self._program_set.forward(token_ids,
                                                      lambda i, qkv: self.cache.extend(i, qkv, slot, start)))

    def _logits(self, x: np.ndarray) -> np.ndarray:
        """[n, v] from the residual stream [n, d]: blocks.c's own (plain) stream, or the programs' rotated one."""
        if self.blocks is not None:
            return self.blocks.logits(x, self.cache.threads)
        logits: np.ndarray = self._program_set.logits(x)[0]
        return logits

    def decode(self, slots: Sequence[int], tokens: Sequence[int], positions: Sequence[int]) -> np.ndarray:
        return self.step(slots, tokens, positions).decoded

    def _check_chunk(self, start: int, n: int) -> None:
        if start + n > self.max_len:
            raise ValueError(f"positions {start}..{start + n - 1} run past the cache's {self.max_len}")

    def copy_slot(self, source: int, target: int) -> None:
        self.cache.copy_slot(source, target)


def report_progress(progress: Callable[[str], None], done: int, total: int) -> None:
    if done == 0:
        progress("int8-lite: rotating the weights")
    elif done % max(1, total // 5) == 0 or done == total:
        progress(f"int8-lite: program {done}/{total}")
