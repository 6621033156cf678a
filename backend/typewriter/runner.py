"""Compiled entry points of the model, one XLA program per shape bucket, built once and memoised.

Prefill runs one sequence at a time, its prompt padded to a length bucket. A decode step runs the slots
0..b-1 at once (b a batch bucket) and attends over the first kv_len cached positions (a length bucket), so
a short conversation never pays for the whole cache. Everything here runs on the engine thread.
"""

from __future__ import annotations

import bisect
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

from .model import Transformer


def power_of_two_buckets(low: int, high: int) -> tuple[int, ...]:
    """low, 2*low, ... up to and always including high."""
    out, n = [], low
    while n < high:
        out.append(n)
        n *= 2
    return tuple(out + [high])


class ModelRunner:
    def __init__(
        self,
        model: Transformer,
        prefill_buckets: Sequence[int],
        batch_buckets: Sequence[int],
        kv_buckets: Sequence[int],
    ):
        max_len, slots = model.cache.max_len, model.cache.slots
        if max(prefill_buckets) > max_len or max(kv_buckets) != max_len or max(batch_buckets) != slots:
            raise ValueError("buckets must end at the cache's length and slot count")
        self.model = model
        self.prefill_buckets = tuple(sorted(prefill_buckets))
        self.batch_buckets = tuple(sorted(batch_buckets))
        self.kv_buckets = tuple(sorted(kv_buckets))
        self._prefill: dict[int, tf.types.experimental.GenericFunction] = {}
        self._decode: dict[tuple[int, int], tf.types.experimental.GenericFunction] = {}

    @property
    def slots(self) -> int:
        return self.model.cache.slots

    @property
    def max_len(self) -> int:
        return self.model.cache.max_len

    @property
    def vocab_size(self) -> int:
        return self.model.cfg.vocab_size

    @property
    def max_prompt(self) -> int:
        return self.prefill_buckets[-1]

    # ---- compiled functions ----

    def prefill_fn(self, t: int):
        if t not in self._prefill:
            self._prefill[t] = tf.function(
                self.model.prefill,
                input_signature=[tf.TensorSpec([1, t], tf.int32), tf.TensorSpec([], tf.int32),
                                 tf.TensorSpec([], tf.int32)],
                jit_compile=True,
                reduce_retracing=False,
            )
        return self._prefill[t]

    def decode_fn(self, b: int, kv_len: int):
        key = (b, kv_len)
        if key not in self._decode:
            model = self.model

            def decode_step(tokens, positions):
                return model.decode(tokens, positions, kv_len)

            self._decode[key] = tf.function(
                decode_step,
                input_signature=[tf.TensorSpec([b], tf.int32), tf.TensorSpec([b], tf.int32)],
                jit_compile=True,
            )
        return self._decode[key]

    def tracing_counts(self) -> dict[str, int]:
        counts = {f"prefill/{t}": f.experimental_get_tracing_count() for t, f in self._prefill.items()}
        counts |= {f"decode/{b}x{s}": f.experimental_get_tracing_count() for (b, s), f in self._decode.items()}
        return counts

    # ---- calls ----

    def prefill(self, slot: int, prompt_ids: Sequence[int]) -> np.ndarray:
        """Write a fresh sequence into `slot`; returns the logits [v] of its next token."""
        n = len(prompt_ids)
        t = bucket(self.prefill_buckets, n)
        tokens = np.zeros([1, t], np.int32)
        tokens[0, :n] = prompt_ids
        return self.prefill_fn(t)(tokens, np.int32(n), np.int32(slot)).numpy()[0]

    def decode(self, tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """tokens, positions [n] for slots 0..n-1 (idle slots: any token at position 0) -> logits [n, v]."""
        n = len(tokens)
        b = bucket(self.batch_buckets, n)
        kv_len = bucket(self.kv_buckets, int(positions.max()) + 1)
        tok = np.zeros([b], np.int32)
        pos = np.zeros([b], np.int32)
        tok[:n], pos[:n] = tokens, positions
        return self.decode_fn(b, kv_len)(tok, pos).numpy()[:n]

    def warmup(self, progress: Callable[[int, int, str], None] | None = None, threads: int = 2) -> None:
        """Compile every bucket now, so no request ever waits for XLA. XLA compiles outside the GIL, so
        `threads` programs build at once; the tf.function objects are made here, on the calling thread."""
        work = [(f"prefill {t}", self.prefill_fn(t), (np.zeros([1, t], np.int32), np.int32(1), np.int32(0)))
                for t in self.prefill_buckets]
        work += [(f"decode batch {b} x cache {s}", self.decode_fn(b, s),
                  (np.zeros([b], np.int32), np.zeros([b], np.int32)))
                 for b in self.batch_buckets for s in self.kv_buckets]

        def build(item) -> str:
            label, fn, args = item
            fn(*args).numpy()
            return label

        with ThreadPoolExecutor(max(1, threads), thread_name_prefix="typewriter-compile") as pool:
            for done, label in enumerate(pool.map(build, work), start=1):
                if progress:
                    progress(done, len(work), label)


def bucket(buckets: Sequence[int], n: int) -> int:
    i = bisect.bisect_left(buckets, n)
    if i == len(buckets):
        raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]}")
    return buckets[i]
