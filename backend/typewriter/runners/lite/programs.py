"""int8-lite's programs: made from the weights (layers.py), and kept on disk so that a restart skips reading the
weights, folding them and writing the programs, most of a load (docs/measurements/2026-12-03-int8-lite.md).

A cache entry is a folder named by `cache_key`: the model file's path, size and modification time, the model's
config and FORMAT_VERSION, so a changed file or a changed program layout is a miss, never a stale program. An entry
is written to a temporary folder and renamed into place, so a reader sees a whole entry or none, and two servers
starting together both succeed. An unreadable or partial entry is a miss (logged), never an error. Saving an
entry removes the same file's older ones and those of model files that are gone.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...models.model_config import ModelConfig
from ...models.rotation import quantize_int8
from . import gptq
from .calibration import Calibration
from .calibration import text as calibration_text
from .layers import RotationFolder, first_program, layer_program, logits_program

log = logging.getLogger("typewriter.lite")
# Bump when what layers.py, flatbuffer.py or gptq.py write changes: every older entry becomes a miss (GPTQ's
# settings and the calibration text are in the key too).
FORMAT_VERSION = 3  # 2: GPTQ rounding; 3: rows to 16 bits
STALE_STAGING_S = 3600  # a staging folder this old belongs to no save still running


@dataclass
class ProgramSet:
    """One model's int8-lite programs as flatbuffers, and its rotated embeddings: what the runner loads and the
    cache keeps."""

    first: bytes  # flatbuffer: x~ -> qkv of layer 0
    layers: list[bytes]  # one flatbuffer per layer
    logits: bytes
    embeddings: np.ndarray  # [v, d] float16, rotated


def make_programs(cfg: ModelConfig, weights: dict[str, np.ndarray],
                  progress: Callable[[int, int], None] = lambda done, total: None,
                  calibration: list[int] | None = None, two_pass: bool = True) -> ProgramSet:
    """Fold the weights a layer at a time into the programs; `progress(done, total)` after each program.
    `calibration`: the token ids of calibration.text(), to round the matrices by GPTQ (gptq.py) on them; None
    rounds each weight to its nearest step (KL from fp32 about twice as large:
    docs/measurements/2026-12-04-int8-lite-gptq-16-bit-rows.md).
    `two_pass`: q/k/v, o and down take their rows to 16 bits (layers.py; int8-lite), else 8 (int8-lite-fast)."""
    total = cfg.n_layers + 2
    progress(0, total)
    folder = RotationFolder(cfg, weights)
    embeddings = folder.embeddings()
    text = Calibration(cfg, embeddings, calibration) if calibration else None

    def rounded(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A matrix that reads the normed stream (qkv, the logits), rounded."""
        return gptq.quantize(w, text.stream_moment()) if text else quantize_int8(w)

    layer = folder.layer(0)
    layer["qkv"] = rounded(layer["qkv"])
    first = first_program(cfg, layer, two_pass)
    layers = []
    for i in range(cfg.n_layers):
        if text:
            text.run_layer(layer, folder.down_block, gptq.quantize)
        else:
            for kind in ("o", "gate", "up", "down"):
                layer[kind] = quantize_int8(layer[kind])
        following = folder.layer(i + 1) if i + 1 < cfg.n_layers else None
        if following:
            following["qkv"] = rounded(following["qkv"])
        layers.append(layer_program(cfg, layer, following, folder.down_block, two_pass))
        layer = following
        progress(i + 1, total)
    logits = logits_program(cfg, rounded(folder.output()))
    progress(total, total)
    return ProgramSet(first, layers, logits, embeddings)


def cache_key(model_file: Path, cfg: ModelConfig, weight_format: str) -> str:
    stat = model_file.stat()
    rounding = [gptq.DAMP, gptq.GROUP, hashlib.sha256(calibration_text().encode()).hexdigest()]
    identity = [FORMAT_VERSION, weight_format, str(model_file.resolve()), stat.st_size, stat.st_mtime_ns,
                dataclasses.asdict(cfg), rounding]
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]


class ProgramCache:
    """Program sets by cache key under `root` (None: no cache, every load is a miss and nothing is saved)."""

    def __init__(self, root: str | os.PathLike | None):
        self.root = Path(root) if root else None

    def load(self, key: str, n_layers: int) -> ProgramSet | None:
        if self.root is None or not (entry := self.root / key).is_dir():
            return None
        try:
            return ProgramSet((entry / "first.tflite").read_bytes(),
                            [(entry / f"layer{i}.tflite").read_bytes() for i in range(n_layers)],
                            (entry / "logits.tflite").read_bytes(), np.load(entry / "embeddings.npy"))
        except (OSError, ValueError) as e:
            log.warning("the int8-lite program cache %s is unreadable (%s); making the programs again", entry, e)
            return None

    def discard(self, key: str) -> None:
        """Remove an entry that turned out unusable."""
        if self.root is not None:
            shutil.rmtree(self.root / key, ignore_errors=True)

    def save(self, key: str, programs: ProgramSet, model_file: Path, weight_format: str) -> None:
        """Best effort: a cache that cannot be written is logged and skipped. Entries made before for the same model
        file and format (the file changed since, or the program layout did) and those whose model file is gone are
        removed, as each holds a model's programs (docs/configuration.md, "Caches")."""
        if self.root is None or (self.root / key).is_dir():
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=self.root))
            try:
                (staging / "source.json").write_text(json.dumps({"model_file": str(model_file.resolve()),
                                                                 "format": weight_format}))
                (staging / "first.tflite").write_bytes(programs.first)
                for i, layer in enumerate(programs.layers):
                    (staging / f"layer{i}.tflite").write_bytes(layer)
                (staging / "logits.tflite").write_bytes(programs.logits)
                np.save(staging / "embeddings.npy", programs.embeddings)
                staging.rename(self.root / key)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
        except OSError as e:
            if not (self.root / key).is_dir():  # another process saving the same entry first is no failure
                log.warning("could not save the int8-lite programs to %s (%s); the next start makes them again",
                            self.root, e)
            return
        self._remove_older(key, model_file, weight_format)

    def _remove_older(self, key: str, model_file: Path, weight_format: str) -> None:
        for entry in self.root.iterdir():
            if entry.name.startswith(".") and _age_s(entry) > STALE_STAGING_S:  # a save that was killed midway
                shutil.rmtree(entry, ignore_errors=True)
            if entry.name == key or entry.name.startswith("."):
                continue
            try:
                written = json.loads((entry / "source.json").read_text())
                source, made_as = written["model_file"], written.get("format", weight_format)  # older: no format
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue  # not ours to judge
            if source == str(model_file.resolve()) and made_as == weight_format:
                log.info("removing the int8-lite programs %s, made before %s changed", entry, model_file.name)
                shutil.rmtree(entry, ignore_errors=True)
            elif not Path(source).exists():
                log.info("removing the int8-lite programs %s: their model file %s is gone", entry, source)
                shutil.rmtree(entry, ignore_errors=True)


def _age_s(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return 0.0
