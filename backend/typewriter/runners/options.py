"""What every runtime is opened with (runners/lite/start.py, runners/xla/start.py's open_runner)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from ..config import WeightFormat

Progress = Callable[[str], None]
Encode = Callable[[str], list[int]]  # the tokenizer's, passed in: runners never see it
Compile = Literal["all", "start", "lazy"]  # XLA: every program before serving, a few, or each on first use


@dataclass(frozen=True)
class RunnerOptions:
    weights: WeightFormat
    max_context: int  # K/V cache positions a slot holds (at most the model's own context)
    slots: int | None = None  # None: what this machine carries (int8-lite measures it), or XLA's fixed count
    program_cache: str | None = None  # int8-lite's folder of made programs (None: made each time)
    compile: Compile = "all"
