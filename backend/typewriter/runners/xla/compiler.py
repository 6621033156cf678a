"""The XLA runner's programs: the decoder's entry points compiled per shape bucket. Compiling every bucket takes
minutes, so a server compiles a few, starts serving and compiles the rest in the background; a call uses the best
program already compiled that can serve it, and waits only when none can. Compiling may run on any thread.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tensorflow as tf

from ...heap import return_freed_memory
from .model import Transformer
from .program_names import stable_names
from .tf_env import quiet_compiles

log = logging.getLogger("typewriter.xla")

# A program: ("prefill", chunk tokens, attention length), ("decode", batch rows, attention length) or the cache
# copy ("copy", 1, max_len).
ProgramKey = tuple[str, int, int]
CompileProgress = Callable[[int, int, str], None]  # (programs compiled, of total, the last one's label)


def power_of_two_buckets(low: int, high: int) -> tuple[int, ...]:
    out, n = [], low
    while n < high:
        out.append(n)
        n *= 2
    return tuple(out + [high])


def label(key: ProgramKey) -> str:
    kind, size, kv_len = key
    if kind == "copy":
        return "cache copy"
    return f"{kind} {'chunk' if kind == 'prefill' else 'batch'} {size} x cache {kv_len}"


def bucket(buckets: Sequence[int], n: int) -> int:
    i = bisect.bisect_left(buckets, n)
    if i == len(buckets):
        raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]}")
    return buckets[i]


class ProgramCompiler:
    """The runner's `Compiler` (engine/runner.py)."""

    _instances = itertools.count()  # names each runner's programs apart (see program_names)

    def __init__(self, model: Transformer, chunk_buckets: Sequence[int], batch_buckets: Sequence[int]):
        if max(chunk_buckets) > model.max_chunk or max(batch_buckets) != model.cache.slots:
            raise ValueError("batch buckets must end at the cache's slot count, chunks within the model's max_chunk")
        self.model = model
        self.chunk_buckets = tuple(sorted(chunk_buckets))
        self.batch_buckets = tuple(sorted(batch_buckets))
        self.kv_buckets = model.cache.bounds
        self._instance = next(ProgramCompiler._instances)
        self._programs = self._order()
        self._fns: dict[ProgramKey, tf.types.experimental.GenericFunction] = {}
        self._ready: set[ProgramKey] = set()
        self._building: set[ProgramKey] = set()
        self._queue: list[ProgramKey] = []  # what the background thread compiles, next first
        self._background = False  # a thread compiles the queue: calls make do with what is compiled meanwhile
        self._thread: threading.Thread | None = None
        self.on_demand: Callable[[str], None] | None = None  # told when a call must compile its own program
        self._closed = False
        self._cond = threading.Condition()  # guards the sets, the queue and _fns
        self.warm_up_s = 0.0

    def programs(self) -> list[ProgramKey]:
        """Most useful first: per attention length, shortest first, the three that serve anything of that length,
        then the other sizes."""
        return list(self._programs)

    def _order(self) -> tuple[ProgramKey, ...]:
        mid = self.chunk_buckets[(len(self.chunk_buckets) - 1) // 2]
        order: list[ProgramKey] = []
        for s in self.kv_buckets:
            order += [("decode", 1, s), ("prefill", mid, s), ("decode", self.model.cache.slots, s)]
            if s == self.kv_buckets[0]:
                order.append(("copy", 1, self.model.cache.max_len))
            order += [("decode", b, s) for b in reversed(self.batch_buckets)]
            order += [("prefill", t, s) for t in self.chunk_buckets]
        return tuple(dict.fromkeys(order))

    def first_programs(self) -> list[ProgramKey]:
        """Before ready. The prefill program alone could serve decode rows too and be ready sooner
        (docs/measurements/2026-12-02-start-up-and-memory.md)."""
        return list(self._programs[:2])

    def extend_fn(self, t: int, kv_len: int) -> tf.types.experimental.GenericFunction:
        return self.fn(("prefill", t, kv_len))

    def decode_fn(self, b: int, kv_len: int) -> tf.types.experimental.GenericFunction:
        return self.fn(("decode", b, kv_len))

    def fn(self, key: ProgramKey) -> tf.types.experimental.GenericFunction:
        with self._cond:
            if key not in self._fns:
                self._fns[key] = self._make(key)
            return self._fns[key]

    def _make(self, key: ProgramKey) -> tf.types.experimental.GenericFunction:
        fn = self._function(key)
        # Each program is its own tf.function, traced once; TensorFlow counts them as one function (one Python
        # code object) traced again and again, and would log a "retracing" warning for every few.
        fn._omit_frequent_tracing_warning = True
        return fn

    def _function(self, key: ProgramKey) -> tf.types.experimental.GenericFunction:
        # autograph=False: the model's branches are on static shapes, and converting its source was most of tracing
        # (docs/measurements/2026-12-02-start-up-and-memory.md).
        kind, size, kv_len = key
        model, i32 = self.model, tf.int32
        if kind == "copy":
            return tf.function(model.cache.copy_slot, jit_compile=True, reduce_retracing=False, autograph=False,
                               input_signature=[tf.TensorSpec([], i32), tf.TensorSpec([], i32)])
        if kind == "prefill":
            def prefill_chunk(tokens: tf.Tensor, start: tf.Tensor, length: tf.Tensor, slot: tf.Tensor) -> tf.Tensor:
                return model.extend(tokens, start, length, slot, kv_len)

            return tf.function(prefill_chunk, jit_compile=True, reduce_retracing=False, autograph=False,
                               input_signature=[tf.TensorSpec([1, size], i32), tf.TensorSpec([], i32),
                                                tf.TensorSpec([], i32), tf.TensorSpec([], i32)])

        def decode_step(tokens: tf.Tensor, positions: tf.Tensor, slots: tf.Tensor) -> tf.Tensor:
            return model.decode(tokens, positions, slots, kv_len)

        return tf.function(decode_step, jit_compile=True, autograph=False,
                           input_signature=[tf.TensorSpec([size], i32)] * 3)

    def _idle_args(self, key: ProgramKey) -> tuple[np.ndarray | np.int32, ...]:
        """Arguments that compile and run a program without touching any slot's cache: slot `slots` and position
        max_len are out of bounds, and XLA drops those writes."""
        kind, size, _ = key
        if kind == "copy":
            return np.int32(0), np.int32(self.model.cache.slots)
        if kind == "prefill":
            return np.zeros([1, size], np.int32), np.int32(0), np.int32(1), np.int32(self.model.cache.slots)
        return (np.zeros([size], np.int32), np.full([size], self.model.cache.max_len, np.int32),
                np.full([size], self.model.cache.slots, np.int32))

    def tracing_counts(self) -> dict[str, int]:
        names = {"prefill": "prefill/{}x{}", "decode": "decode/{}x{}", "copy": "copy"}
        with self._cond:
            fns = dict(self._fns)
        return {names[k[0]].format(*k[1:]): f.experimental_get_tracing_count() for k, f in fns.items()
                if f.experimental_get_tracing_count()}

    def compiled(self, key: ProgramKey) -> bool:
        with self._cond:
            return key in self._ready

    def compile(self, key: ProgramKey) -> None:
        """If another thread is compiling it, wait for that."""
        with self._cond:
            while key in self._building:
                self._cond.wait()
            if key in self._ready:
                return
            self._building.add(key)
        t0, ok = time.perf_counter(), False
        try:
            fn = self.fn(key)
            with quiet_compiles(), stable_names(f"tw{self._instance}_{key[0]}_{key[1]}x{key[2]}"):
                out = fn(*self._idle_args(key))
                if out is not None:  # the cache copy returns nothing
                    out.numpy()
            ok = True
        finally:
            with self._cond:
                self._building.discard(key)
                if ok:
                    self._ready.add(key)
                    if key in self._queue:
                        self._queue.remove(key)
                self._cond.notify_all()
        return_freed_memory()
        log.debug("compiled %s in %.1fs", label(key), time.perf_counter() - t0)

    def compile_all(self, keys: Sequence[ProgramKey], progress: CompileProgress | None = None, threads: int = 2) -> None:
        """Compile `keys` before returning, `threads` at once (XLA compiles outside the GIL)."""
        def build(key: ProgramKey) -> str:
            self.compile(key)
            return label(key)

        with ThreadPoolExecutor(max(1, threads), thread_name_prefix="typewriter-compile") as pool:
            for done, name in enumerate(pool.map(build, keys), start=1):
                if progress:
                    progress(done, len(keys), name)

    def warmup(self, progress: CompileProgress | None = None, threads: int = 2) -> None:
        self.compile_all(self._programs, progress, threads)

    def compile_in_background(self, progress: CompileProgress | None = None,
                              keys: Sequence[ProgramKey] | None = None) -> threading.Thread:
        """One at a time on a daemon thread, in order, except that one a call waits for goes next. Called again, it
        queues more for the same thread."""
        total = len(self._programs)
        with self._cond:
            queued = self._queue + [k for k in (self._programs if keys is None else keys) if k not in self._ready]
            self._queue = list(dict.fromkeys(queued))
            self._background = True
            if self._thread is not None and self._thread.is_alive():
                return self._thread

        def run() -> None:
            while True:
                with self._cond:
                    waiting = [k for k in self._queue if k not in self._building]
                    if self._closed or not waiting:
                        self._background = False
                        return
                    key = waiting[0]
                try:
                    self.compile(key)
                except Exception:  # a call that needs it compiles it itself, and fails there if it must
                    log.exception("compiling %s in the background failed", label(key))
                    with self._cond:
                        if key in self._queue:
                            self._queue.remove(key)
                    continue
                if progress:
                    with self._cond:
                        done = len(self._ready)
                    progress(done, total, label(key))

        with self._cond:
            self._thread = threading.Thread(target=run, name="typewriter-background-compile", daemon=True)
            self._thread.start()
            return self._thread

    def prepare_answer(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """The one-row decode programs for every length the answer may reach, so it never stops for one."""
        longest = bucket(self.kv_buckets, min(self.model.cache.max_len, prompt_tokens + max_new_tokens))
        keys = [("decode", 1, s) for s in self.kv_buckets if s <= longest]
        if not all(self.compiled(k) for k in keys):
            self.compile_in_background(keys=keys)

    def status(self) -> dict[str, int | list[str]]:
        with self._cond:
            return {"compiled": len(self._ready), "total": len(self._programs),
                    "compiling": sorted(label(k) for k in self._building)}

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._queue.clear()

    def choose(self, kind: str, sizes: Sequence[int], n: int, kv_len: int) -> ProgramKey:
        """Its own bucket if compiled; while the background compiles, the compiled one needing the fewest calls, its
        own queued next; else its own, compiled now."""
        exact = (kind, bucket(sizes, n), kv_len)
        with self._cond:
            if exact in self._ready:
                return exact
            served = self._serving(kind, kv_len) if self._background else []
            self._put_first(exact)
            if served:
                return min(served, key=lambda k: (-(-n // k[1]) if k[0] == kind else n, k[2], k[1]))
        self.compile_on_demand(exact)
        return exact

    def _serving(self, kind: str, kv_len: int) -> list[ProgramKey]:
        """Compiled programs that can run `kind` over kv_len positions. Caller holds the lock."""
        served = [k for k in self._ready if k[0] == kind and k[2] >= kv_len]
        if not served and kind == "decode":  # a decode row is a one-token prefill chunk at its position
            served = [k for k in self._ready if k[0] == "prefill" and k[2] >= kv_len]
        return served

    def can_run(self, kind: str, n: int, length: int) -> bool:
        kv_len = bucket(self.kv_buckets, length)
        with self._cond:
            if not self._background or self._serving(kind, kv_len):
                return True
            sizes = self.chunk_buckets if kind == "prefill" else self.batch_buckets
            self._put_first((kind, bucket(sizes, min(n, sizes[-1])), kv_len))
            return False

    def compile_on_demand(self, key: ProgramKey) -> None:
        if self.on_demand and not self.compiled(key):
            self.on_demand(label(key))
        self.compile(key)

    def _put_first(self, key: ProgramKey) -> None:
        """Caller holds the lock."""
        if key in self._queue and self._queue[0] != key:
            self._queue.remove(key)
            self._queue.insert(0, key)
