"""int8-lite's programs, made from the weights (layers.py) a layer at a time and written as they are made, beside
the rotated embedding rows. The runner maps these files rather than reading them, so only what it touches stays
resident, and program_cache.py keeps the folder for the next start.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ...architecture.model_config import ModelConfig
from ..rotation import quantize_int8
from . import gptq
from .calibration import Calibration
from .layers import RotationFolder, first_program, layer_program, logits_program

if TYPE_CHECKING:
    from .kernel import Kernel

EMBEDDINGS = "embeddings.npy"


def _unchecked(path: Path) -> Path:
    return path


@dataclass(frozen=True)
class ProgramSet:
    folder: Path
    n_layers: int
    # What a reader calls before opening one of `files()`: the program cache's check of that file's digest
    # (program_cache.Digests), which may still be running when the set is handed over; raises ValueError on a
    # mismatch.
    checked: Callable[[Path], Path] = field(default=_unchecked, compare=False, repr=False)

    @property
    def first(self) -> Path:
        return self.folder / "first.tflite"  # x~ -> qkv of layer 0

    def layer(self, i: int) -> Path:
        return self.folder / f"layer{i}.tflite"

    @property
    def logits(self) -> Path:
        return self.folder / "logits.tflite"

    def files(self) -> list[Path]:
        """In the order the runner opens them, so that a check running ahead of it is met in that order."""
        return [self.first, *(self.layer(i) for i in range(self.n_layers)), self.logits, self.folder / EMBEDDINGS]

    def embeddings(self) -> np.ndarray:
        """The rotated embedding rows [v, d] float16, mapped read-only: a step reads only its tokens' rows."""
        rows: np.ndarray = np.load(self.checked(self.folder / EMBEDDINGS), mmap_mode="r")
        return rows


def make_programs(cfg: ModelConfig, weights: Mapping[str, np.ndarray], folder: Path,
                  progress: Callable[[int, int], None] = lambda done, total: None,
                  calibration: list[int] | None = None, two_pass: bool = True,
                  kernel: Kernel | None = None) -> ProgramSet:
    """`weights` may be a WeightReader: each tensor is read once, when its layer is folded. `calibration`:
    calibration.text()'s ids, to round by GPTQ; None rounds to nearest, further from fp32
    (docs/measurements/2026-12-04-int8-lite-gptq-16-bit-rows.md). `two_pass` False: int8-lite-fast."""
    programs = ProgramSet(Path(folder), cfg.n_layers)
    gptq_round = functools.partial(gptq.quantize, kernel=kernel)
    total = cfg.n_layers + 2
    progress(0, total)
    rotations = RotationFolder(cfg, weights)
    embeddings = rotations.embeddings()
    text = Calibration(cfg, embeddings, calibration) if calibration else None
    np.save(programs.folder / EMBEDDINGS, embeddings)
    del embeddings

    def rounder() -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]:
        """Rounds a matrix that reads the normed stream as it is now (qkv, the logits)."""
        if text is None:
            return quantize_int8
        moment = text.stream_moment()
        return lambda w: gptq_round(w, moment)

    layer = rotations.layer(0)
    layer["qkv"] = rounder()(layer["qkv"])
    programs.first.write_bytes(first_program(cfg, layer, two_pass))
    for i in range(cfg.n_layers):
        if text:
            text.run_layer(layer, rotations.down_block, gptq_round)
        else:
            for kind in ("o", "gate", "up", "down"):
                layer[kind] = quantize_int8(layer[kind])
        following = rotations.layer(i + 1) if i + 1 < cfg.n_layers else None
        if following is not None:
            following["qkv"] = rounder()(following["qkv"])
        programs.layer(i).write_bytes(layer_program(cfg, layer, following, rotations.down_block, two_pass))
        if following is not None:
            layer = following
        progress(i + 1, total)
    programs.logits.write_bytes(logits_program(cfg, _by_columns(cfg, rotations, rounder()), two_pass))
    progress(total, total)
    return programs


def _by_columns(cfg: ModelConfig, rotations: RotationFolder,
                round_: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Columns round independently, so rounding a slice at a time gives the whole matrix's result."""
    q, scale = np.empty((cfg.dim, cfg.vocab_size), np.int8), np.empty(cfg.vocab_size, np.float32)
    for start, stop, columns in rotations.output():
        q[:, start:stop], scale[start:stop] = round_(columns)
    return q, scale
