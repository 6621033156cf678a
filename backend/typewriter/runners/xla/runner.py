"""The XLA runtime's runner: the decoder's entry points (model.py) run as programs compiled per shape bucket, each
call on the best program compiled so far (compiler.py). A row or chunk attends over only its slot's first kv_len
cached positions, so a short conversation never pays for the whole cache.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...config import WeightFormat
from ...engine.capacity import Sizing, StepModel
from ...engine.runner import CallByCall, PrefillChunk, Runner, StepOutput, step_call_by_call
from .compiler import ProgramCompiler, ProgramKey, bucket
from .model import Transformer


class XlaRunner(Runner, CallByCall):
    def __init__(self, model: Transformer, chunk_buckets: Sequence[int], batch_buckets: Sequence[int]):
        self.model = model
        self.compiler = ProgramCompiler(model, chunk_buckets, batch_buckets)
        self.sizing = Sizing(model.cache.slots, "set")
        self.step_model: StepModel | None = None  # XLA's steps are not measured before serving
        self.checks_drafts = False  # a call per chunk gives its last logits only

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
    def weight_format(self) -> WeightFormat:
        return self.model.weight_format

    @property
    def max_chunk(self) -> int:
        return self.compiler.chunk_buckets[-1]

    def describe(self) -> dict[str, object]:
        return {"name": "xla", "weights": self.weight_format.value, "programs": self.compiler.status()}

    def close(self) -> None:
        self.compiler.close()

    def step(self, slots: Sequence[int], tokens: Sequence[int], positions: Sequence[int],
             chunks: Sequence[PrefillChunk] = ()) -> StepOutput:
        return step_call_by_call(self, slots, tokens, positions, chunks)

    def extend(self, slot: int, start: int, token_ids: Sequence[int]) -> np.ndarray:
        n, compiler = len(token_ids), self.compiler
        key = compiler.choose("prefill", compiler.chunk_buckets, n, bucket(compiler.kv_buckets, start + n))
        return self._extend(key, slot, start, token_ids)

    def _extend(self, key: ProgramKey, slot: int, start: int, token_ids: Sequence[int]) -> np.ndarray:
        fn, t, n = self.compiler.fn(key), key[1], len(token_ids)
        for i in range(0, n, t):  # one call, unless only a smaller chunk is compiled yet
            piece = token_ids[i:i + t]
            tokens = np.zeros([1, t], np.int32)
            tokens[0, :len(piece)] = piece
            logits = fn(tokens, np.int32(start + i), np.int32(len(piece)), np.int32(slot))
        last: np.ndarray = logits.numpy()[0]
        return last

    def copy_slot(self, source: int, target: int) -> None:
        key = ("copy", 1, self.max_len)
        self.compiler.compile_on_demand(key)
        self.compiler.fn(key)(np.int32(source), np.int32(target))

    def decode(self, slots: Sequence[int], tokens: Sequence[int], positions: Sequence[int]) -> np.ndarray:
        """The batch is padded to a bucket with rows of no slot, whose writes the model drops."""
        n, compiler = len(tokens), self.compiler
        key = compiler.choose("decode", compiler.batch_buckets, n,
                              bucket(compiler.kv_buckets, int(max(positions)) + 1))
        if key[0] == "prefill":  # no decode program yet: each row a one-token chunk (its K/V written alike)
            return np.stack([self._extend(key, int(slot), int(pos), [int(token)])
                             for slot, token, pos in zip(slots, tokens, positions)])
        fn, b = compiler.fn(key), key[1]
        out: list[np.ndarray] = []
        for i in range(0, n, b):  # one call, unless only a smaller batch is compiled yet
            rows = slice(i, min(n, i + b))
            m = rows.stop - rows.start
            tok = np.zeros([b], np.int32)
            pos = np.full([b], self.max_len, np.int32)
            slot = np.full([b], self.slots, np.int32)
            tok[:m], pos[:m], slot[:m] = tokens[rows], positions[rows], slots[rows]
            out.append(fn(tok, pos, slot).numpy()[:m])
        return out[0] if len(out) == 1 else np.concatenate(out)
