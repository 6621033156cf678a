"""What the engine asks of a runner: the one contract both runtimes keep (runners/xla/, runners/lite/).

A runner owns the weights and every slot's K/V cache and is called on the engine thread only. Abilities only one
runtime has are attributes, never found by `getattr`: `compiler` is None where nothing compiles while serving.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .capacity import Sizing, StepModel


@dataclass(frozen=True)
class PrefillChunk:
    """Prompt tokens written into `slot` at positions start.., after its cached positions 0..start-1."""

    slot: int
    start: int
    token_ids: Sequence[int]
    wants_logits: bool = True  # it ends its prompt: its last logits give the first answer token
    # it checks a draft (engine/drafting.py): the answer's last token and the tokens guessed to follow it, whose
    # logits [n, vocab] after each token it wants
    every_logits: bool = False

    @property
    def length(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class StepFault:
    """A failed call inside a step; the engine ends exactly the requests it concerned and the rest stands."""

    what: str
    error: BaseException
    chunks: tuple[int, ...] = ()
    decode: bool = False


@dataclass
class StepOutput:
    decoded: np.ndarray  # [rows, vocab]: the decode rows' logits, in the order given
    prefilled: list[np.ndarray | None]  # per chunk: logits [vocab] after its last token, None if not wanted;
    # [n, vocab] after each of its tokens where it wants every_logits
    faults: list[StepFault] = field(default_factory=list)


class CallByCall(Protocol):
    @property
    def vocab_size(self) -> int: ...

    def extend(self, slot: int, start: int, token_ids: Sequence[int]) -> np.ndarray:
        ...  # logits [vocab] after the last token

    def decode(self, slots: Sequence[int], tokens: Sequence[int], positions: Sequence[int]) -> np.ndarray:
        ...  # logits [rows, vocab]


def step_call_by_call(runner: CallByCall, slots: Sequence[int], tokens: Sequence[int], positions: Sequence[int],
                      chunks: Sequence[PrefillChunk]) -> StepOutput:
    """`Runner.step` as a call per chunk, then one for the decode rows; a failed call faults its requests only.
    A call gives the logits after a chunk's last token only, so no chunk may check a draft."""
    if any(chunk.every_logits for chunk in chunks):
        raise ValueError("a runner called chunk by chunk checks no drafts (its checks_drafts is False)")
    faults: list[StepFault] = []
    prefilled: list[np.ndarray | None] = []
    for i, chunk in enumerate(chunks):
        try:
            logits = runner.extend(chunk.slot, chunk.start, chunk.token_ids)
        except Exception as e:
            faults.append(StepFault("a prefill chunk", e, chunks=(i,)))
            logits = None
        prefilled.append(logits if chunk.wants_logits else None)
    decoded = np.zeros((0, runner.vocab_size), np.float32)
    if len(slots):
        try:
            decoded = runner.decode(slots, tokens, positions)
        except Exception as e:
            faults.append(StepFault("a decode step", e, decode=True))
    return StepOutput(decoded, prefilled, faults)


class Compiler(Protocol):
    warm_up_s: float

    def can_run(self, kind: str, n: int, length: int) -> bool:
        """`kind` "decode" or "prefill"; if not compiled yet, the program they need compiles next."""

    def prepare_answer(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """For a caller that serves one answer at a time."""

    def status(self) -> dict[str, Any]:
        """{"compiled": n, "total": m, "compiling": [labels]}: the programs built so far."""


class Runner(Protocol):
    @property
    def slots(self) -> int:
        """Streams decoded together, each with its own K/V cache."""

    @property
    def max_len(self) -> int:
        """Positions each slot's cache holds."""

    @property
    def max_chunk(self) -> int:
        """Most prompt tokens in one chunk."""

    @property
    def vocab_size(self) -> int: ...

    compiler: Compiler | None
    # The engine checks drafts on it (engine/drafting.py): a row's logits are the same bits whatever rows share its
    # step, so a draft checked in one chunk gives the answer decoding alone gives, and a step of a few rows costs
    # little more than a step of one.
    checks_drafts: bool
    sizing: Sizing
    step_model: StepModel | None  # decode steps measured before serving (int8-lite), else None

    def step(self, slots: Sequence[int], tokens: Sequence[int], positions: Sequence[int],
             chunks: Sequence[PrefillChunk] = ()) -> StepOutput:
        """One chunk per slot, and no slot both decodes and prefills. Raises only if the whole step failed."""

    def copy_slot(self, source: int, target: int) -> None:
        """`target`'s cache becomes a copy of `source`'s."""

    def describe(self) -> dict[str, Any]:
        """Its name, weight format and programs, for /readyz and the log."""

    def close(self) -> None:
        """Stop any background compiling; the runner is not called again."""
