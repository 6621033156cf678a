"""What the engine asks of a runner: the one contract both runtimes keep (runners/xla/, runners/lite/).

A runner owns the model's weights and every slot's K/V cache, and is called on the engine thread only. Each step
the engine hands it the decode rows and prompt chunks the scheduler chose (`step`), after copying any cached
prefix a newcomer reuses from another slot (`copy_slot`). How the runtime computes them (one call per chunk, or
every row in one pass over the weights) is its own business.

Abilities that only one runtime has are attributes, never found by `getattr`: `compiler` is the runtime's
`Compiler` where its programs compile while it serves (XLA), and None where there is nothing to compile
(int8-lite, whose programs are made at load). Each runtime is opened one way (`open_runner` in its start.py), which
owns its caching, its slot sizing and its warm-up.
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
    wants_logits: bool = True  # it ends its prompt: its last token's logits give the first answer token

    @property
    def length(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class StepFault:
    """A call inside a step that failed: `what` it was, which chunks (indices) and whether the decode rows it
    concerned. The engine ends exactly those requests with `error`; the rest of the step stands."""

    what: str
    error: BaseException
    chunks: tuple[int, ...] = ()
    decode: bool = False


@dataclass
class StepOutput:
    decoded: np.ndarray  # [rows, vocab]: the decode rows' logits, in the order given
    prefilled: list[np.ndarray | None]  # per chunk: logits [vocab] after its last token, None if not wanted
    faults: list[StepFault] = field(default_factory=list)


class CallByCall(Protocol):
    """A runner whose calls are separate: a prompt chunk's (`extend`) and the decode rows' (`decode`)."""

    @property
    def vocab_size(self) -> int: ...

    def extend(self, slot: int, start: int, token_ids: Sequence[int]) -> np.ndarray:
        """Write `token_ids` into `slot` at positions start..; the logits [vocab] after the last of them."""
        ...

    def decode(self, slots: Sequence[int], tokens: Sequence[int], positions: Sequence[int]) -> np.ndarray:
        """One decode step of `slots`, each feeding its token at its position: logits [rows, vocab]."""
        ...


def step_call_by_call(runner: CallByCall, slots: Sequence[int], tokens: Sequence[int], positions: Sequence[int],
                      chunks: Sequence[PrefillChunk]) -> StepOutput:
    """`Runner.step` for a runner whose calls are separate (`extend` a chunk, `decode` the rows): each chunk in
    its own call, then the decode rows in one. A call that fails is reported as a fault of the requests it
    concerns, and the others' results stand."""
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
    """A runtime whose programs compile in the background while it serves (the XLA runner's)."""

    warm_up_s: float  # spent compiling before serving

    def can_run(self, kind: str, n: int, length: int) -> bool:
        """Whether n decode rows ("decode") or prompt tokens ("prefill") reaching `length` positions run now
        without waiting for a compile; if not, the program they need compiles next."""

    def prepare_answer(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """Start compiling what one answer of this size will need (for a caller that serves one at a time)."""

    def status(self) -> dict[str, Any]:
        """{"compiled": n, "total": m, "compiling": [labels]}: the programs built so far."""


class Runner(Protocol):
    @property
    def slots(self) -> int:
        """Streams decoded together, each with its own K/V cache."""

    @property
    def max_len(self) -> int:
        """Positions each slot's cache holds: the context of one conversation."""

    @property
    def max_chunk(self) -> int:
        """The most prompt tokens one chunk may carry."""

    @property
    def vocab_size(self) -> int: ...

    compiler: Compiler | None
    sizing: Sizing  # how its slot count was chosen, for /readyz and the log
    step_model: StepModel | None  # its decode steps' seconds as measured before serving (int8-lite), else None

    def step(self, slots: Sequence[int], tokens: Sequence[int], positions: Sequence[int],
             chunks: Sequence[PrefillChunk] = ()) -> StepOutput:
        """One engine step: a decode row per `slots[i]` feeding `tokens[i]` at `positions[i]`, and every prompt
        chunk. One chunk per slot, and no slot both decodes and prefills. Raises if the whole step failed."""

    def copy_slot(self, source: int, target: int) -> None:
        """Slot `target`'s cache becomes a copy of slot `source`'s (a prefix they share)."""

    def describe(self) -> dict[str, Any]:
        """What /readyz and the log say of this runtime: its name, weight format and programs."""

    def close(self) -> None:
        """Stop any background work (compiling); the runner is not called again."""
