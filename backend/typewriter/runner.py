"""Compiled entry points of the model, one XLA program per shape bucket, built once and memoised.

A prefill chunk extends one slot's sequence by up to `max_chunk` prompt tokens, padded to a chunk bucket, and
attends over the slot's first kv_len cached positions (a length bucket): a long prompt is prefilled over several
calls, and a prompt whose prefix is already cached starts after it. A decode step runs any b sequences at once
(padded to a batch bucket), each over its own slot's first kv_len cached positions, so a short conversation
never pays for the whole cache. Everything here runs on the engine thread.
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
        chunk_buckets: Sequence[int],
        batch_buckets: Sequence[int],
    ):
        """Attention lengths are the cache's segment ends (`model.cache.bounds`)."""
        if max(chunk_buckets) > model.max_chunk or max(batch_buckets) != model.cache.slots:
            raise ValueError("batch buckets must end at the cache's slot count, chunks within the model's max_chunk")
        self.model = model
        self.chunk_buckets = tuple(sorted(chunk_buckets))
        self.batch_buckets = tuple(sorted(batch_buckets))
        self.kv_buckets = model.cache.bounds
        self._extend: dict[tuple[int, int], tf.types.experimental.GenericFunction] = {}
        self._decode: dict[tuple[int, int], tf.types.experimental.GenericFunction] = {}
        self._copy = tf.function(model.cache.copy_slot, jit_compile=True, reduce_retracing=False,
                                 input_signature=[tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.int32)])

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
    def max_chunk(self) -> int:
        return self.chunk_buckets[-1]

    # ---- compiled functions ----

    def extend_fn(self, t: int, kv_len: int):
        key = (t, kv_len)
        if key not in self._extend:
            model = self.model

            def prefill_chunk(tokens, start, length, slot):
                return model.extend(tokens, start, length, slot, kv_len)

            self._extend[key] = tf.function(
                prefill_chunk,
                input_signature=[tf.TensorSpec([1, t], tf.int32), tf.TensorSpec([], tf.int32),
                                 tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.int32)],
                jit_compile=True,
                reduce_retracing=False,
            )
        return self._extend[key]

    def decode_fn(self, b: int, kv_len: int):
        key = (b, kv_len)
        if key not in self._decode:
            model = self.model

            def decode_step(tokens, positions, slots):
                return model.decode(tokens, positions, slots, kv_len)

            self._decode[key] = tf.function(
                decode_step,
                input_signature=[tf.TensorSpec([b], tf.int32)] * 3,
                jit_compile=True,
            )
        return self._decode[key]

    def tracing_counts(self) -> dict[str, int]:
        counts = {f"prefill/{t}x{s}": f.experimental_get_tracing_count() for (t, s), f in self._extend.items()}
        counts |= {f"decode/{b}x{s}": f.experimental_get_tracing_count() for (b, s), f in self._decode.items()}
        if self._copy.experimental_get_tracing_count():
            counts["copy"] = self._copy.experimental_get_tracing_count()
        return counts

    # ---- calls ----

    def extend(self, slot: int, start: int, token_ids: Sequence[int]) -> np.ndarray:
        """Write `token_ids` (at most max_chunk) into `slot` at positions start.., after the cached positions
        0..start-1; returns the logits [v] after the last of them."""
        n = len(token_ids)
        t = bucket(self.chunk_buckets, n)
        kv_len = bucket(self.kv_buckets, start + n)
        tokens = np.zeros([1, t], np.int32)
        tokens[0, :n] = token_ids
        return self.extend_fn(t, kv_len)(tokens, np.int32(start), np.int32(n), np.int32(slot)).numpy()[0]

    def copy_slot(self, source: int, target: int) -> None:
        """Slot `target`'s cache becomes a copy of slot `source`'s (for a prefix they share)."""
        self._copy(np.int32(source), np.int32(target))

    def decode(self, slots: Sequence[int], tokens: Sequence[int], positions: Sequence[int]) -> np.ndarray:
        """One decode step for the sequences in `slots`, each feeding its token at its position -> logits [n, v].
        The batch is padded to a bucket with rows of no slot, whose writes the model drops."""
        n = len(tokens)
        b = bucket(self.batch_buckets, n)
        kv_len = bucket(self.kv_buckets, int(max(positions)) + 1)
        tok = np.zeros([b], np.int32)
        pos = np.full([b], self.max_len, np.int32)
        slot = np.full([b], self.slots, np.int32)
        tok[:n], pos[:n], slot[:n] = tokens, positions, slots
        return self.decode_fn(b, kv_len)(tok, pos, slot).numpy()[:n]

    def warmup(self, progress: Callable[[int, int, str], None] | None = None, threads: int = 2) -> None:
        """Compile every bucket now, so no request ever waits for XLA. XLA compiles outside the GIL, so
        `threads` programs build at once; the tf.function objects are made here, on the calling thread."""
        work = [(f"prefill chunk {t} x cache {s}", self.extend_fn(t, s),
                 (np.zeros([1, t], np.int32), np.int32(0), np.int32(1), np.int32(0)))
                for t in self.chunk_buckets for s in self.kv_buckets]
        work.append(("cache copy", self._copy, (np.int32(0), np.int32(0))))
        work += [(f"decode batch {b} x cache {s}", self.decode_fn(b, s),
                  (np.zeros([b], np.int32), np.full([b], self.max_len, np.int32), np.full([b], self.slots, np.int32)))
                 for b in self.batch_buckets for s in self.kv_buckets]

        def build(item) -> str:
            label, fn, args = item
            out = fn(*args)
            if out is not None:  # the cache copy returns nothing
                out.numpy()
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
