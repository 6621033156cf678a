"""The `int8-lite` runner: one TensorFlow Lite interpreter per layer (int8 matmuls, XNNPACK), attention and the
K/V cache on the host between them (attention.py).

It answers the engine as runner.ModelRunner does (`extend`, `decode`, `copy_slot` and the compile-status calls),
and also takes a whole engine step in one call (`step`: the decode rows and the prompt chunks go through each
layer's program together, so a step reads the weights once however many prompts it prefills). It has nothing to
compile: the programs are written and loaded in seconds at start, and each call resizes them
to its own rows (a few milliseconds, only when the row count changes), so no call pays for padding rows or waits
for a program. The calls run on the engine thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import numpy as np

from ...models.model_config import ModelConfig
from .attention import HostCache
from .kernel import TILE as KERNEL_TILE
from .kernel import Kernel
from .kernel import load as load_kernel
from .programs import Programs, make_programs

log = logging.getLogger("typewriter.lite")
FORMAT = "int8-lite"
# int8-lite-fast: every row at 8 bits, faster batched steps for a larger KL from fp32
# (docs/measurements/2026-12-04-int8-lite-gptq-16-bit-rows.md).
FAST = "int8-lite-fast"
FORMATS = (FORMAT, FAST)


class _Program:
    """One interpreter and its inputs and outputs, resized to `rows` when a call has another count."""

    def __init__(self, content: bytes, threads: int):
        from ..quiet_import import lite_interpreter

        self.it = lite_interpreter(content, threads)
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


class LiteRunner:
    one_pass = True  # the engine hands it a whole step at once (`step`)

    def __init__(self, cfg: ModelConfig, weights: dict[str, np.ndarray] | None, slots: int, max_len: int,
                 max_chunk: int, threads: int = 2, progress: Callable[[str], None] = lambda _: None,
                 programs: Programs | None = None, kernel: Kernel | None | str = "auto",
                 calibration: list[int] | None = None, weight_format: str = FORMAT):
        """From the model's `weights`, or from `programs` made before (programs.py's cache). `kernel`: the
        attention kernel (kernel.py), "auto" for one built in a temporary folder, None for numpy's attention.
        `calibration`: token ids to round the weights by (programs.make_programs; None: to nearest).
        `weight_format`: FORMAT or FAST (which rows go to 16 bits, layers.py); with `programs`, what they were
        made as."""
        if cfg.family != "llama":
            raise ValueError(f"the {weight_format} weight format runs Llama-family models; {cfg.name} is {cfg.family}")
        if weight_format not in FORMATS:
            raise ValueError(f"LiteRunner runs {' and '.join(FORMATS)}, not {weight_format!r}")
        t0 = time.perf_counter()
        self.weight_format = weight_format
        self.cfg, self._max_chunk = cfg, max_chunk
        # The flatbuffers, for a cache to keep (`programs()` is the compile interface, empty here).
        self.flatbuffers = programs or make_programs(cfg, weights, lambda i, n: _report(progress, i, n), calibration,
                                                       two_pass=weight_format == FORMAT)
        self.embeddings = self.flatbuffers.embeddings  # [v, d] float16, rows already rotated
        self.first = _Program(self.flatbuffers.first, threads)
        self.layers = [_Program(layer, threads) for layer in self.flatbuffers.layers]
        self.logits = _Program(self.flatbuffers.logits, threads)
        if kernel == "auto":
            kernel = load_kernel(None)
        if kernel and cfg.head_dim % KERNEL_TILE:
            log.warning("int8-lite's attention kernel takes heads of a multiple of %d channels, %s has %d: "
                        "attention runs in numpy", KERNEL_TILE, cfg.name, cfg.head_dim)
            kernel = None
        self.cache = HostCache(cfg, slots, max_len, kernel, threads)
        self.on_demand: Callable[[str], None] | None = None  # nothing is ever compiled on demand
        log.info("%s programs ready in %.1fs", weight_format, time.perf_counter() - t0)

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

    # ---- what ModelRunner compiles: here everything is ready once the runner exists ----

    def programs(self) -> list:
        return []

    def first_programs(self) -> list:
        return []

    def compile_all(self, keys: Sequence, progress=None, threads: int = 2) -> None:
        pass

    def warmup(self, progress=None, threads: int = 2) -> None:
        pass

    def compile_in_background(self, progress=None, keys=None) -> None:
        pass

    def compile_for_answer(self, prompt_tokens: int, max_new_tokens: int) -> None:
        pass

    def compile_status(self) -> dict:
        return {"compiled": 0, "total": 0, "compiling": []}

    def can_run(self, kind: str, n: int, length: int) -> bool:
        return True

    def close(self) -> None:
        pass

    # ---- calls ----

    def _forward(self, token_ids: Sequence[int], attend: Callable[[int, np.ndarray], np.ndarray]) -> np.ndarray:
        """The residual stream [n, d] after every layer, for tokens whose attention `attend(layer, qkv)` gives."""
        x = self.embeddings[np.asarray(token_ids, np.int64)].astype(np.float32)  # [n, d]
        (qkv,) = self.first(x)
        for i, layer in enumerate(self.layers):
            out = layer(x, attend(i, qkv))
            x, qkv = out[0], (out[1] if len(out) > 1 else None)
        return x

    def step(self, slots: Sequence[int], tokens: Sequence[int], positions: Sequence[int],
             chunks: Sequence[tuple[int, int, Sequence[int]]] = (),
             logits_for: Sequence[bool] | None = None) -> tuple[np.ndarray, list[np.ndarray | None]]:
        """One engine step in one pass of the programs, so the weights are read once for all of it: a decode row
        per `slots[i]` (feeding `tokens[i]` at `positions[i]`) and every prompt chunk (slot, start, token_ids),
        each written at positions start.. after its slot's cached ones. -> (decode logits [n, v], each chunk's
        logits [v] after its last token, or None for a chunk whose `logits_for` is False: one that does not end
        its prompt needs none, and its row would cost the logits program a row and, as the count changes, a
        resize). One chunk per slot, and no slot both decodes and prefills."""
        n = len(slots)
        slots, positions = np.asarray(slots, np.int64), np.asarray(positions, np.int64)
        if n and positions.max() >= self.max_len:
            raise ValueError(f"position {positions.max()} is past the cache's {self.max_len}")
        spans, end = [], n
        for slot, start, ids in chunks:
            self._check_chunk(start, len(ids))
            spans.append((slot, start, end, end + len(ids)))
            end += len(ids)

        if self.cache.kernel:  # every row in one call a layer, its slots and positions made once
            rows = self.cache.rows(np.concatenate([slots, *(np.full(b - a, slot) for slot, _, a, b in spans)]),
                                   np.concatenate([positions, *(np.arange(start, start + b - a)
                                                                for _, start, a, b in spans)]))

            def attend(layer: int, qkv: np.ndarray) -> np.ndarray:
                return self.cache.attend(layer, qkv, rows)
        else:
            def attend(layer: int, qkv: np.ndarray) -> np.ndarray:
                parts = [self.cache.decode(layer, qkv[:n], slots, positions)] if n else []
                parts += [self.cache.extend(layer, qkv[a:b], slot, start) for slot, start, a, b in spans]
                return parts[0] if len(parts) == 1 else np.concatenate(parts)

        x = self._forward([*tokens, *(t for _, _, ids in chunks for t in ids)], attend)
        wanted = [i for i in range(len(spans)) if logits_for is None or logits_for[i]]
        rows = [*range(n), *(spans[i][3] - 1 for i in wanted)]
        logits = self.logits(x[rows])[0] if rows else np.zeros((0, self.vocab_size), np.float32)
        prefilled: list[np.ndarray | None] = [None] * len(spans)
        for k, i in enumerate(wanted):
            prefilled[i] = logits[n + k]
        return logits[:n], prefilled

    def extend(self, slot: int, start: int, token_ids: Sequence[int], all_logits: bool = False) -> np.ndarray:
        """Write `token_ids` into `slot` at positions start.., after the cached positions 0..start-1; returns the
        logits [v] after the last of them (with all_logits, [n, v] after each)."""
        if not all_logits:
            return self.step([], [], [], [(slot, start, token_ids)])[1][0]
        self._check_chunk(start, len(token_ids))
        return self.logits(self._forward(token_ids, lambda i, qkv: self.cache.extend(i, qkv, slot, start)))[0]

    def decode(self, slots: Sequence[int], tokens: Sequence[int], positions: Sequence[int]) -> np.ndarray:
        """One decode step for the sequences in `slots`, each feeding its token at its position -> logits [n, v]."""
        return self.step(slots, tokens, positions)[0]

    def _check_chunk(self, start: int, n: int) -> None:
        if start + n > self.max_len:
            raise ValueError(f"positions {start}..{start + n - 1} run past the cache's {self.max_len}")

    def copy_slot(self, source: int, target: int) -> None:
        """Slot `target`'s cache becomes a copy of slot `source`'s (for a prefix they share)."""
        self.cache.copy_slot(source, target)


def _report(progress: Callable[[str], None], done: int, total: int) -> None:
    if done == 0:
        progress(f"{FORMAT}: rotating the weights")
    elif done % max(1, total // 5) == 0 or done == total:
        progress(f"{FORMAT}: program {done}/{total}")
