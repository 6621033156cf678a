"""How a model's matrices are held and run (`--weights`), and what every runtime is opened with."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Progress = Callable[[str], None]
Encode = Callable[[str], list[int]]  # text to the model's token ids (the tokenizer's encode; runners never see it)
Compile = Literal["all", "start", "lazy"]  # XLA: every program before serving, a few, or each on first use


class WeightFormat(enum.StrEnum):
    AUTO = "auto"  # int8-lite for the Llama family, which is all it runs; fp32 for the others
    FP32 = "fp32"  # XLA: the file's weights exactly
    INT8 = "int8"  # XLA: int8 x int8 after a rotation (runners/xla/quantized.py)
    # LiteRT programs (runners/lite/): int8 weights rounded by GPTQ, the rows that need it at 16 bits; -fast keeps
    # every row at 8 bits, faster batched steps for a larger KL from fp32
    # (docs/measurements/2026-12-04-int8-lite-gptq-16-bit-rows.md)
    INT8_LITE = "int8-lite"
    INT8_LITE_FAST = "int8-lite-fast"

    @property
    def lite(self) -> bool:
        """Run by int8-lite's programs on LiteRT (else by XLA)."""
        return self in (WeightFormat.INT8_LITE, WeightFormat.INT8_LITE_FAST)

    def resolved(self, family: str) -> WeightFormat:
        """AUTO made concrete for a model `family`; any other format as it is."""
        if self is not WeightFormat.AUTO:
            return self
        return WeightFormat.INT8_LITE if family == "llama" else WeightFormat.FP32


@dataclass(frozen=True)
class RunnerOptions:
    """What a runtime is opened with, besides the model: its format, its slots and context, and its caches."""

    weights: WeightFormat
    max_context: int  # K/V cache positions a slot holds (at most the model's own context)
    slots: int | None = None  # None: what this machine carries (int8-lite measures it), or XLA's fixed count
    program_cache: str | None = None  # int8-lite: the folder its made programs are kept in (None: made each time)
    compile: Compile = "all"  # XLA: when its programs compile (runners/xla/start.py)
